"""Config loading and validation: every class of bad input is refused, with the field, value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from toolkit import config as config_mod
from toolkit.config import ConfigError

from conftest import NO_CHECKPOINT, cli


@pytest.mark.parametrize("name", ["tiny", "demo"])
def test_shipped_configs_load_and_round_trip(name):
    cfg = config_mod.load(name)
    assert cfg.name == name
    again = config_mod.from_dict(yaml.safe_load(cfg.to_yaml()))
    assert again == cfg and again.fingerprint() == cfg.fingerprint()


def test_overrides_are_typed_and_applied():
    cfg = config_mod.load("tiny", ["train.max_steps=7", "optim.lr=5e-4", "engine.name=deepspeed",
                                   "engine.zero_stage=2", "profile.enabled=true"])
    assert (cfg.train.max_steps, cfg.optim.lr, cfg.engine.zero_stage, cfg.profile.enabled) == (7, 5e-4, 2, True)
    assert isinstance(cfg.optim.lr, float)


def test_exponent_without_a_dot_reads_as_a_number(tmp_path):
    # YAML 1.1 (PyYAML) reads 3e-3 as a string; a config system that refuses it would surprise everyone.
    assert config_mod.load("tiny", ["optim.lr=3e-3"]).optim.lr == 3e-3
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 2E-3\n  min_lr: 1e-4\n")
    assert (config_mod.load(path).optim.lr, config_mod.load(path).optim.min_lr) == (2e-3, 1e-4)
    with pytest.raises(ConfigError, match=r"train\.max_steps: '1e3' is not allowed; allowed: an integer"):
        config_mod.load("tiny", ["train.max_steps=1e3"])


def test_integer_widens_to_float_but_not_the_other_way():
    assert config_mod.load("tiny", ["optim.lr=1"]).optim.lr == 1.0
    with pytest.raises(ConfigError, match=r"train\.max_steps: 1\.5 is not allowed; allowed: an integer"):
        config_mod.load("tiny", ["train.max_steps=1.5"])


@pytest.mark.parametrize("override, message", [
    ("train.max_stepz=3", r"train\.max_stepz: unknown field; allowed: batch_size, grad_accum_steps, max_steps"),
    ("nosuch.field=3", r"nosuch: unknown field; allowed: name, model, data"),
    ("train.max_steps=abc", r"train\.max_steps: 'abc' is not allowed; allowed: an integer"),
    ("train.max_steps=true", r"train\.max_steps: True is not allowed; allowed: an integer"),
    ("profile.enabled=1", r"profile\.enabled: 1 is not allowed; allowed: true or false"),
    ("optim.lr=.nan", r"optim\.lr: nan is not allowed; allowed: a number"),
    ("train.max_steps=0", r"train\.max_steps: 0 is out of range; allowed: >= 1"),
    ("optim.lr=0", r"optim\.lr: 0\.0 is out of range; allowed: > 0\.0 and <= 1\.0"),
    ("engine.zero_stage=4", r"engine\.zero_stage: 4 is out of range; allowed: >= 0 and <= 3"),
    ("engine.name=jax", r"engine\.name: 'jax' is not allowed; allowed: one of 'torch', 'deepspeed'"),
    ("engine.precision=fp8", r"engine\.precision: 'fp8' is not allowed; allowed: one of 'fp32', 'bf16', 'fp16'"),
    ("model=3", r"model: expected a mapping of fields, got 3"),
    ("train.max_steps.x=1", r"train\.max_steps: is a value, not a section"),
    ("model.n_head=3", r"model\.n_head: 3 does not divide model\.n_embd=32"),
    ("optim.min_lr=0.5", r"optim\.min_lr: 0\.5 is above optim\.lr=0\.003"),
    ("engine.zero_stage=2", r"engine\.zero_stage: 2 needs engine\.name='deepspeed'"),
    ("data.dataset=digits", r"data\.dataset: 'digits' does not fit model\.name='gpt'; allowed: 'pydoc', 'stdlib'"),
    ("engine.launcher=deepspeed", r"engine\.launcher: 'deepspeed' needs engine\.name='deepspeed'"),
    ("nonsense", r"--set 'nonsense': expected section\.field=value"),
    ("train.max_steps=[1", r"--set train\.max_steps: '\[1' is not a readable value"),
])
def test_bad_overrides_are_refused_with_field_value_and_allowed(override, message):
    with pytest.raises(ConfigError, match=message):
        config_mod.load("tiny", [override])


def test_bad_config_files(tmp_path):
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("model:\n  n_layers: 3\n")
    with pytest.raises(ConfigError, match=r"model\.n_layers: unknown field; allowed: name, n_layer"):
        config_mod.load(unknown)
    broken = tmp_path / "broken.yaml"
    broken.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config_mod.load(broken)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ConfigError, match="expected a mapping of sections"):
        config_mod.load(scalar)
    with pytest.raises(ConfigError, match=r"'no-such-config' is neither a file nor a shipped config; shipped: .*demo"):
        config_mod.load("no-such-config")


def test_built_in_configs_are_found_by_name_from_any_folder_and_live_in_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a name must not depend on the current folder (a wheel has no checkout around it)
    assert config_mod.builtin_config_names() == ["demo", "llama", "tiny"]
    for name in ("tiny", "tiny.yaml"):
        path = config_mod.resolve_config_path(name)
        assert path.parent == config_mod.CONFIG_DIR and path.name == "tiny.yaml"
    assert config_mod.CONFIG_DIR.parent == Path(config_mod.__file__).resolve().parent
    (tmp_path / "tiny.yaml").write_text("train:\n  max_steps: 3\n")  # a file in the folder wins over the name
    assert config_mod.load("tiny.yaml").train.max_steps == 3
    with pytest.raises(ConfigError, match=r"^config: 'tinyy' is neither a file nor a shipped config; shipped: demo, llama, tiny "
                                          r"\(built into the package\); allowed: one of these names or a path"):
        config_mod.load("tinyy")


def test_cli_refuses_bad_input_before_anything_starts(tmp_path):
    run_dir = tmp_path / "never"
    proc = cli("train", "tiny", "--run-dir", str(run_dir), "--set", "train.batch_size=-4")
    assert proc.returncode == 2
    assert "error: train.batch_size: -4 is out of range; allowed: >= 1" in proc.stderr
    assert not run_dir.exists(), "a refused config must not leave a half-made run directory"
    proc = cli("train", "tiny", "--run-dir", str(run_dir), "--engine", "tensorflow")
    assert proc.returncode == 2 and "--engine: 'tensorflow' is not allowed; allowed: torch, deepspeed, fsdp" in proc.stderr
    assert not run_dir.exists()


def test_cli_refuses_to_overwrite_a_run(finished_run_copy):
    run = finished_run_copy(*NO_CHECKPOINT)
    before = run.config_path.read_text()
    proc = cli("train", "tiny", "--run-dir", str(run.path), "--set", "train.max_steps=3")
    assert proc.returncode == 2 and "already holds a run" in proc.stderr
    assert run.config_path.read_text() == before
