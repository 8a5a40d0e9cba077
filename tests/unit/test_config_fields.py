"""Config coercion, field by field: every field of every section, by its kind (integer, number, true/false,
string, choice), takes its valid values and its bounds' edges, and refuses a wrong value with a ConfigError
naming the field, the value and what is allowed. The fields are read from the dataclasses, so a new field is
checked without a new test. (tests/e2e/test_config.py covers loading files, overrides and the CLI.)"""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

import pytest

from toolkit import config as config_mod
from toolkit.config import Config, ConfigError
from toolkit.errors import bounded_repr
from toolkit.names import NAME_ALLOWED

# Other fields a value needs to pass the checks between fields (a divisor of n_embd, min_lr <= lr, ...).
COMPANIONS = {
    "optim.lr": {"optim.min_lr": 0.0},
    "optim.min_lr": {"optim.lr": 1.0},
    "engine.zero_stage": {"engine.name": "deepspeed"},
    "engine.launcher": {"engine.name": "deepspeed"},
    "engine.deepspeed_config": {"engine.name": "deepspeed"},
    "engine.deepspeed": {"engine.name": "deepspeed"},
    "engine.fsdp_reshard_after_forward": {"engine.name": "fsdp"},
    "engine.fsdp_offload": {"engine.name": "fsdp"},
    "model.name": {"data.dataset": None},  # None: the dataset the chosen model needs (set below)
    "data.dataset": {"model.name": None},
    "data.asset": {"data.path": ""},
    "model.factory": {"model.name": "custom"},
    "model.loss": {"model.name": "custom", "model.factory": "m:f"},
    "model.code_path": {"model.name": "custom", "model.factory": "m:f"},
    "model.lora.rank": {"model.lora.target_modules": ["qkv"]},
    "engine.tensor_parallel": {"model.n_head": 64, "model.n_embd": 128},  # heads the largest split divides
    "engine.pipeline_parallel": {"model.n_layer": 64, "train.grad_accum_steps": 64},  # a block and a micro-batch each
    "data.record_samples": {"data.sampling": "epochs"},  # numbered samples to record
    "model.hf.source": {"model.name": "hf"},
    "model.hf.architecture": {"model.name": "hf"},
    "data.prompt_field": {"data.completion_field": "completion"},
    "data.completion_field": {"data.prompt_field": "prompt"},
    "train.objective": {"data.path": "pairs.jsonl"},  # dpo reads preference pairs, which no built-in data holds
}
# The fields of model.hf need model.name=hf and something to build (every path under it not listed above).
HF_COMPANIONS = {"model.name": "hf", "model.hf.architecture": "llama", "data.path": "labelled.jsonl"}
SOURCES = {"custom": {"model.factory": "m:f"}, "hf": {"model.hf.architecture": "llama"}}
NEEDS = {"gpt": "pydoc", "digits_mlp": "digits"}


def fields(cls=Config, prefix: str = "") -> list[tuple[str, typing.Any, dict]]:
    """(dotted path, annotation, metadata) of every leaf field, nested sections (model.hf, ...) included."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            out += fields(hints[f.name], f"{path}.")
        else:
            out.append((path, hints[f.name], dict(f.metadata)))
    return out


def kind(tp) -> str:
    if typing.get_origin(tp) is Literal:
        return "choice"
    if typing.get_origin(tp) is list:
        return "list"
    return {int: "int", float: "float", bool: "bool", str: "str", dict: "dict"}[tp]


FIELDS = fields()
KINDS = ("int", "float", "bool", "str", "choice", "list", "dict")
BY_KIND = {k: [(path, tp, meta) for path, tp, meta in FIELDS if kind(tp) == k] for k in KINDS}


def build(path: str, value) -> Config:
    """from_dict with one field set (and the companions that field needs)."""
    data: dict = {}
    companions = COMPANIONS.get(path, HF_COMPANIONS if path.startswith("model.hf.") else {})
    settings = {path: value, **companions}
    if path == "model.name":
        settings["data.dataset"] = NEEDS.get(value, "pydoc") if isinstance(value, str) else "pydoc"
        settings.update(SOURCES.get(value, {}) if isinstance(value, str) else {})
    if path == "data.dataset":
        settings["model.name"] = {v: k for k, v in NEEDS.items()}.get(value, "gpt") if isinstance(value, str) else "gpt"
    for dotted, v in settings.items():
        *sections, leaf = dotted.split(".")
        node = data
        for s in sections:
            node = node.setdefault(s, {})
        node[leaf] = v
    return config_mod.from_dict(data)


def read(cfg: Config, path: str):
    for part in path.split("."):
        cfg = getattr(cfg, part)
    return cfg


def refused(path: str, value) -> str:
    with pytest.raises(ConfigError) as caught:
        build(path, value)
    return str(caught.value)


def ids(rows) -> list[str]:
    return [row[0] for row in rows]


def test_every_field_is_of_a_kind_coercion_knows():
    # a field of another kind (a list, an optional) would need its own coercion and messages
    assert sum(len(rows) for rows in BY_KIND.values()) == len(FIELDS) > 40
    assert all(BY_KIND.values())


# --- integers ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, tp, meta", BY_KIND["int"], ids=ids(BY_KIND["int"]))
def test_an_integer_field_takes_its_bounds_and_refuses_past_them(path, tp, meta):
    low = meta["ge"] if meta.get("ge") is not None else 0
    assert read(build(path, int(low)), path) == low
    message = refused(path, int(low) - 1)
    assert message.startswith(f"{path}: {int(low) - 1} is out of range; allowed: >= {meta['ge']}"), message
    if meta.get("le") is not None:
        assert read(build(path, int(meta["le"])), path) == meta["le"]
        assert refused(path, int(meta["le"]) + 1) == (
            f"{path}: {int(meta['le']) + 1} is out of range; allowed: >= {meta['ge']} and <= {meta['le']}")


@pytest.mark.parametrize("path, tp, meta", BY_KIND["int"], ids=ids(BY_KIND["int"]))
@pytest.mark.parametrize("value, shown", [(True, "True"), (2.0, "2.0"), (2.5, "2.5"), ("2", "'2'"), ("1e3", "'1e3'"),
                                          (None, "None"), ([2], "[2]")])
def test_an_integer_field_refuses_anything_but_an_integer(path, tp, meta, value, shown):
    # a bool is an int to Python: `true` must not train for 1 step; 2.0 must not silently become 2
    assert refused(path, value) == f"{path}: {shown} is not allowed; allowed: an integer"


# --- numbers ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path, tp, meta", BY_KIND["float"], ids=ids(BY_KIND["float"]))
def test_a_number_field_takes_its_bounds_and_refuses_past_them(path, tp, meta):
    ge, gt, le = meta.get("ge"), meta.get("gt"), meta.get("le")
    if ge is not None:
        assert read(build(path, ge), path) == ge
        assert refused(path, ge - 0.001).startswith(f"{path}: {ge - 0.001!r} is out of range; allowed: >= {ge}")
    if gt is not None:
        assert refused(path, gt).startswith(f"{path}: {float(gt)!r} is out of range; allowed: > {gt}"), \
            "the bound itself is excluded"
        assert read(build(path, gt + 0.001), path) == gt + 0.001
    if le is not None:
        assert read(build(path, le), path) == le
        message = refused(path, le + 0.001)
        assert message.startswith(f"{path}: {le + 0.001!r} is out of range; allowed: ") and \
            message.endswith(f" and <= {le}"), message


@pytest.mark.parametrize("path, tp, meta", BY_KIND["float"], ids=ids(BY_KIND["float"]))
def test_a_number_field_widens_integers_and_reads_exponents_without_a_dot(path, tp, meta):
    value = read(build(path, 1), path) if (meta.get("le") is None or meta["le"] >= 1) else None
    if value is not None:
        assert value == 1.0 and type(value) is float
    # YAML 1.1 hands '2e-1' over as a string: it is a number (surrounding spaces too)
    assert read(build(path, " 2e-1 "), path) == pytest.approx(0.2)
    assert type(read(build(path, "2E-1"), path)) is float


@pytest.mark.parametrize("path, tp, meta", BY_KIND["float"], ids=ids(BY_KIND["float"]))
@pytest.mark.parametrize("value, shown", [(True, "True"), (float("nan"), "nan"), (float("inf"), "inf"),
                                          (float("-inf"), "-inf"), ("0.5", "'0.5'"), ("fast", "'fast'"),
                                          ("1e", "'1e'"), (None, "None"), ({"a": 1}, "{'a': 1}")])
def test_a_number_field_refuses_anything_but_a_finite_number(path, tp, meta, value, shown):
    assert refused(path, value) == f"{path}: {shown} is not allowed; allowed: a number"


# --- true/false, strings, choices -------------------------------------------------------------------------

@pytest.mark.parametrize("path, tp, meta", BY_KIND["bool"], ids=ids(BY_KIND["bool"]))
def test_a_true_false_field_takes_only_booleans(path, tp, meta):
    assert read(build(path, True), path) is True and read(build(path, False), path) is False
    for value, shown in ((1, "1"), (0, "0"), ("yes", "'yes'"), ("true", "'true'"), (None, "None")):
        assert refused(path, value) == f"{path}: {shown} is not allowed; allowed: true or false"


@pytest.mark.parametrize("path, tp, meta", BY_KIND["str"], ids=ids(BY_KIND["str"]))
def test_a_string_field_refuses_other_types(path, tp, meta):
    for value, shown in ((3, "3"), (1.5, "1.5"), (True, "True"), (None, "None"), (["a"], "['a']")):
        assert refused(path, value) == f"{path}: {shown} is not allowed; allowed: a string"


@pytest.mark.parametrize("path, tp, meta", BY_KIND["choice"], ids=ids(BY_KIND["choice"]))
def test_a_choice_field_takes_each_choice_and_refuses_others_listing_them(path, tp, meta):
    choices = typing.get_args(tp)
    for choice in choices:
        assert read(build(path, choice), path) == choice
    listed = ", ".join(repr(c) for c in choices)
    for value in (choices[0].upper(), choices[0] + " ", "", 0, None, True, list(choices)):
        assert refused(path, value) == f"{path}: {value!r} is not allowed; allowed: one of {listed}"


# --- lists and mappings ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path, tp, meta", BY_KIND["list"], ids=ids(BY_KIND["list"]))
def test_a_list_field_takes_strings_or_a_comma_separated_line(path, tp, meta):
    assert read(build(path, ["q_proj", "v_proj"]), path) == ["q_proj", "v_proj"]
    assert read(build(path, "q_proj, v_proj"), path) == ["q_proj", "v_proj"]  # as --set writes it
    assert read(build(path, []), path) == []
    for value, shown in ((3, "3"), ([1], "[1]"), ([""], "['']"), ({"a": 1}, "{'a': 1}"), (None, "None")):
        assert refused(path, value) == f"{path}: {shown} is not allowed; allowed: a list of strings"


@pytest.mark.parametrize("path, tp, meta", BY_KIND["dict"], ids=ids(BY_KIND["dict"]))
def test_a_mapping_field_takes_plain_values_only(path, tp, meta):
    plain = {"hidden_size": 64, "rope_scaling": None, "act": "silu", "tie": True, "sizes": [1, 2]}
    assert read(build(path, plain), path) == plain
    for value in ([1], "x", {1: 2}, {"a": float("nan")}, {"a": object()}):
        message = refused(path, value)
        assert message.startswith(f"{path}: ") and message.endswith(
            "allowed: a mapping of names to plain values (numbers, strings, true/false, lists)"), message


# --- sections and the run name ----------------------------------------------------------------------------

@pytest.mark.parametrize("section", [f.name for f in dataclasses.fields(Config) if f.name != "name"])
def test_a_section_must_be_a_mapping_and_names_its_fields_when_one_is_unknown(section):
    for value in (3, "x", [1], None):
        assert refused(section, value) == f"{section}: expected a mapping of fields, got {value!r}"
    message = refused(f"{section}.no_such_field", 1)
    assert message.startswith(f"{section}.no_such_field: unknown field; allowed: "), message
    known = [f.name for f in dataclasses.fields(typing.get_type_hints(Config)[section])]
    assert message.endswith(", ".join(known)), "every allowed field, in declaration order"


def test_the_top_level_must_be_a_mapping():
    for value in ([], "tiny", 3):
        with pytest.raises(ConfigError) as caught:
            config_mod.from_dict(value)
        assert str(caught.value) == f"config: expected a mapping of fields, got {value!r}"
    assert config_mod.from_dict(None) == Config() == config_mod.from_dict({})


@pytest.mark.parametrize("name", ["run", "r", "A.b-c_9", "0x", "n" * config_mod.MAX_RUN_NAME])
def test_a_run_name_may_be_a_folder_name(name):
    assert build("name", name).name == name


def test_a_run_name_leaves_room_for_the_folders_timestamp():
    name = "n" * (config_mod.MAX_RUN_NAME + 1)
    assert refused("name", name) == (f"name: {name[:20]!r}... has {len(name)} characters; allowed: at most "
                                     f"{config_mod.MAX_RUN_NAME} (the run folder's name adds a timestamp)")


@pytest.mark.parametrize("name", ["", "../up", "a/b", "-flag", ".hidden", "sp ace", "tab\t", "é", "n" * 256])
def test_a_run_name_that_is_no_plain_folder_name_is_refused(name):
    # the run name becomes a folder: the same rule and message as every other name a user gives
    assert refused("name", name) == f"name: {bounded_repr(name)} is not allowed; allowed: {NAME_ALLOWED}"


def test_data_asset_and_path_exclude_each_other():
    with pytest.raises(ConfigError, match=r"^data\.path: '/x' given together with data\.asset='corpus'; "
                                          r"allowed: one of the two$"):
        config_mod.from_dict({"data": {"asset": "corpus", "path": "/x"}})
    assert config_mod.from_dict({"data": {"asset": "corpus:3"}}).data.asset == "corpus:3"
    message = refused("data.asset", "corpus:v3")
    assert message.startswith("data.asset: ") and "corpus:v3" in message and "allowed" in message, message


@pytest.mark.parametrize("text", ["[]", "''", "0", "false"])
def test_a_config_file_that_is_empty_but_not_a_mapping_is_refused(tmp_path, text):
    # only an empty document means "all defaults"; an empty list or string is a mistake, not a config
    path = tmp_path / "c.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match="expected a mapping of sections at the top level"):
        config_mod.load(path)
    path.write_text("# nothing yet\n")
    assert config_mod.load(path) == Config(name="c")
