"""Your DeepSpeed config and a Trainbook config, merged: the one owner of what DeepSpeed is handed.

    data = read_file(path)                 a ds_config.json (or YAML) as a mapping; a file that is neither is refused
    cfg = adopt(cfg, explicit, world)      at config load: the file's values go into the Trainbook fields they mean
                                           (LINKS), its contents into engine.deepspeed
    ds = merged(cfg, world, cuda)          what deepspeed.initialize gets (and the run keeps as deepspeed_config.json)
    check(cfg, world, cuda)                before launch: DeepSpeed's own parser, unknown keys with the nearest valid
                                           name, fp16 and offload only where there is a GPU

For each DeepSpeed key that a Trainbook field also sets (LINKS), as Hugging Face's integration does:
    "auto" in the file       the Trainbook value
    absent from the file     the Trainbook value (Trainbook fills what the file leaves out)
    a value in the file      taken into the Trainbook field (so the loop, its logs and the resume see it), unless
                             that field was set explicitly (in the config file or by --set) to another value: refused,
                             naming both
Every other key goes to DeepSpeed as written. Trainbook's loop sets the learning rate itself at every step (what makes
a resume exact and a time budget's schedule end on time), so a ``scheduler`` section is read into optim.* and not
handed on.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable

from toolkit.errors import UserError, bounded_repr, not_allowed, refused

AUTO = "auto"
FIELD = "engine.deepspeed_config"
MAX_FILE_BYTES = 1 << 20  # a DeepSpeed config is a few KiB; a bigger file is not one
ADAM_EPS = 1e-8  # torch.optim.AdamW's eps, which the torch engine uses: what an "auto" eps means here


class DeepSpeedConfigError(UserError, ValueError):
    """A DeepSpeed config that cannot run with this Trainbook config; the message names the key and the value."""


# --- dotted paths in nested mappings ----------------------------------------------------------------------------

_MISSING = object()


def get_path(data: dict, key: str, default=_MISSING):
    node = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def set_path(data: dict, key: str, value) -> None:
    """``data[a][b][c] = value`` for ``key`` 'a.b.c', creating sections; a value where a section should be is
    refused (the file's sections are checked first, so this only guards our own writes)."""
    *parents, last = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise DeepSpeedConfigError(not_allowed(f"{FIELD}: {part}", node, "a section (a mapping of settings)"))
    node[last] = value


def _config_value(cfg, field: str):
    section, name = field.split(".")
    return getattr(getattr(cfg, section), name)


# --- the values a linked key may hold: strict, as Trainbook's own fields are -------------------------------------


def _whole(value) -> tuple:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("a whole number")
    return (value,)


def _number(value) -> tuple:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise ValueError("a finite number")
    return (float(value),)


def _betas(value) -> tuple:
    if not isinstance(value, list) or len(value) != 2:
        raise ValueError("a list of two numbers [beta1, beta2]")
    return _number(value[0]) + _number(value[1])


# --- the links between the two configs --------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    key: str
    """Dotted path in the DeepSpeed config."""
    fields: tuple[str, ...]
    """The Trainbook fields it stands for."""
    from_ds: Callable[[Any], tuple] = _whole
    """A DeepSpeed value -> the fields' values; raises ValueError (saying what is allowed) for a wrong one."""
    to_ds: Callable[..., Any] = lambda v: v
    """The fields' values -> the DeepSpeed value."""
    section: str = ""
    """Filled only when the file has this section (a scheduler's params without a scheduler mean nothing)."""


LINKS: tuple[Link, ...] = (
    Link("train_micro_batch_size_per_gpu", ("train.batch_size",)),
    Link("gradient_accumulation_steps", ("train.grad_accum_steps",)),
    Link("gradient_clipping", ("optim.grad_clip",), from_ds=_number),
    Link("zero_optimization.stage", ("engine.zero_stage",)),
    Link("optimizer.params.lr", ("optim.lr",), from_ds=_number),
    Link("optimizer.params.betas", ("optim.beta1", "optim.beta2"), from_ds=_betas, to_ds=lambda b1, b2: [b1, b2]),
    Link("optimizer.params.weight_decay", ("optim.weight_decay",), from_ds=_number),
    Link("scheduler.params.warmup_num_steps", ("optim.warmup_steps",), section="scheduler"),
    Link("scheduler.params.warmup_max_lr", ("optim.lr",), from_ds=_number, section="scheduler"),
    Link("scheduler.params.total_num_steps", ("train.max_steps",), section="scheduler"),
)
# DeepSpeed's schedulers as Trainbook's optim.schedule and the LR they end at (WarmupDecayLR decays to 0)
SCHEDULES = {
    "WarmupLR": {"optim.schedule": "constant"},
    "WarmupDecayLR": {"optim.schedule": "linear", "optim.min_lr": 0.0},
    "WarmupCosineLR": {"optim.schedule": "cosine"},
}
# scheduler params whose only meaning here is Trainbook's own: warm up from 0, linearly (DeepSpeed's WarmupLR
# defaults to a log-shaped warmup; Trainbook's is linear, as the README says)
SCHEDULER_FIXED = {"warmup_min_lr": 0, "warmup_type": "linear", "warmup_min_ratio": 0}
PRECISIONS = ("bf16", "fp16")  # DeepSpeed sections that switch a half precision on; fp32 is neither
# The sections Trainbook reads or fills: each must be a mapping when the file has it
SECTIONS = (
    "optimizer",
    "optimizer.params",
    "scheduler",
    "scheduler.params",
    "zero_optimization",
    "fp16",
    "bf16",
    "bfloat16",
    "zero_optimization.offload_optimizer",
    "zero_optimization.offload_param",
)
# Settings that would change what an optimizer step is, which Trainbook's loop and its resume count on
REFUSED = {
    "managed_gradient_accumulation": (
        False,
        "true (DeepSpeed updates once per gradient_accumulation_steps "
        "micro-steps; the loop counts optimizer steps by it)",
    )
}


def _explicit_conflict(key: str, file_value, field: str, value, source: str) -> DeepSpeedConfigError:
    return DeepSpeedConfigError(
        refused(
            f"{FIELD}: {key}",
            f"is {bounded_repr(file_value)} in {source}, but {field} is {bounded_repr(value)} in the Trainbook config",
            f"the same value in both, \"auto\" in the file (to take {field}), or {field} left unset "
            "(to take the file's)",
        )
    )


def read_file(path: str | Path) -> dict:
    """A DeepSpeed config file as a mapping: JSON (what DeepSpeed's examples ship) or YAML, plain data only."""
    from toolkit.fsio import read_regular_file
    from toolkit.plain_data import PlainDataError, read_document

    file = Path(path).expanduser()
    allowed = "a JSON or YAML file of DeepSpeed settings"
    try:
        raw = read_regular_file(file, field=FIELD, error=DeepSpeedConfigError, limit=MAX_FILE_BYTES)
    except OSError as exc:
        raise DeepSpeedConfigError(
            not_allowed(FIELD, str(path), allowed, problem=f"cannot be read ({exc.strerror or exc})")
        ) from None
    except DeepSpeedConfigError as exc:
        if "is over" in str(exc):
            raise DeepSpeedConfigError(
                not_allowed(
                    FIELD, str(path), f"a DeepSpeed config of at most {MAX_FILE_BYTES:,} bytes", problem="is too big"
                )
            ) from None
        raise
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DeepSpeedConfigError(not_allowed(FIELD, str(path), allowed, problem="is not text (UTF-8)")) from None
    kind = "json" if file.suffix.lower() == ".json" else "yaml"
    try:
        data = read_document(text, kind)
    except PlainDataError as exc:
        raise DeepSpeedConfigError(
            not_allowed(FIELD, str(path), "a JSON or YAML mapping of DeepSpeed settings", problem=f"is refused: {exc}")
        ) from None
    if not isinstance(data, dict):
        raise DeepSpeedConfigError(
            not_allowed(
                FIELD,
                str(path),
                "a JSON or YAML mapping of DeepSpeed settings",
                problem=f"holds a {type(data).__name__}, not a mapping",
            )
        )
    return data


def check_shape(ds: dict) -> None:
    """The sections Trainbook reads are mappings, their types strings, and no setting changes what a step is."""
    for key in SECTIONS:
        value = get_path(ds, key, None)
        if value is not None and not isinstance(value, dict):
            raise DeepSpeedConfigError(not_allowed(f"{FIELD}: {key}", value, "a section (a mapping of settings)"))
    for key in ("optimizer.type", "scheduler.type"):
        value = get_path(ds, key, None)
        if value is not None and not isinstance(value, str):
            raise DeepSpeedConfigError(not_allowed(f"{FIELD}: {key}", value, "a name, such as 'AdamW'"))
    for p in (*PRECISIONS, "bfloat16"):
        value = get_path(ds, f"{p}.enabled", None)
        if value is not None and not isinstance(value, bool) and value != AUTO:
            raise DeepSpeedConfigError(not_allowed(f"{FIELD}: {p}.enabled", value, 'true, false or "auto"'))
    for key, (bad, allowed) in REFUSED.items():
        if key in ds and ds[key] == bad:
            raise DeepSpeedConfigError(not_allowed(f"{FIELD}: {key}", ds[key], allowed))


def _file_precision(ds: dict) -> set[str]:
    """The precisions a DeepSpeed config allows: {'bf16'} when bf16 is enabled, {'fp32', 'bf16'} when only fp16
    is disabled, and so on ("auto" or absent says nothing)."""
    allowed = {"fp32", "bf16", "fp16"}
    enabled = [
        p
        for p in PRECISIONS
        if get_path(ds, f"{p}.enabled", None) is True
        or (p == "bf16" and get_path(ds, "bfloat16.enabled", None) is True)
    ]
    if len(enabled) > 1:
        raise DeepSpeedConfigError(
            refused(f"{FIELD}: fp16.enabled", "is true together with bf16.enabled", "one half precision at most")
        )
    if enabled:
        return set(enabled)
    for p in PRECISIONS:
        if get_path(ds, f"{p}.enabled", None) is False or (
            p == "bf16" and get_path(ds, "bfloat16.enabled", None) is False
        ):
            allowed.discard(p)
    return allowed


def adopt(cfg, given: set[str] | None):
    """``cfg`` (from a file or --set: the user's edge, toolkit.config.load) with its DeepSpeed settings taken into
    the Trainbook fields they mean. ``given``: the fields the user set (None: all of them).

    engine.deepspeed, the copy a run keeps, is the source once it exists (a saved config.yaml, an Azure ML job's
    config: the file is never read again, and may be gone); otherwise the file engine.deepspeed_config names is read,
    its contents kept in engine.deepspeed and its path made absolute (a record). Both set, with the file still there
    and no longer what was copied: refused, as the run would not train on what the file says."""
    e = cfg.engine
    if e.deepspeed:
        if e.deepspeed_config and Path(e.deepspeed_config).expanduser().is_file():
            if read_file(e.deepspeed_config) != e.deepspeed:
                raise DeepSpeedConfigError(
                    refused(
                        "engine.deepspeed",
                        f"(a copy of {e.deepspeed_config}) differs from that file now",
                        "one of the two: engine.deepspeed={} to read the file again, or engine.deepspeed_config='' "
                        "to train on the copy",
                    )
                )
        return _adopt_data(cfg, copy.deepcopy(e.deepspeed), given, None, "engine.deepspeed")
    path = Path(e.deepspeed_config).expanduser().absolute()
    cfg = _replace_fields(cfg, {"engine.deepspeed_config": str(path)})
    return _adopt_data(cfg, read_file(path), given, e.nproc, path.name)


def _adopt_data(cfg, ds: dict, given: set[str] | None, world: int | None, source: str):
    """``world``: the processes the file's train_batch_size is worked out over (None: a kept copy, whose batch
    fields are already in; check() holds it against the real world before launch)."""
    check_shape(ds)
    explicitly = (lambda field: True) if given is None else given.__contains__
    changes: dict[str, Any] = {}

    def take(key: str, fields: tuple[str, ...], values: tuple) -> None:
        for field, value in zip(fields, values):
            current = changes.get(field, _config_value(cfg, field))
            if value == current:
                continue
            if explicitly(field) or field in changes:
                raise _explicit_conflict(key, get_path(ds, key, value), field, current, source)
            changes[field] = value

    if "scheduler" in ds:
        _adopt_scheduler(ds["scheduler"], take)
    for link in LINKS:
        value = get_path(ds, link.key, None)
        if value is None or value == AUTO:
            continue
        try:
            values = link.from_ds(value)
        except (TypeError, ValueError, OverflowError) as exc:
            raise DeepSpeedConfigError(
                not_allowed(f"{FIELD}: {link.key}", value, f"{exc} for {', '.join(link.fields)}, or \"auto\"")
            ) from None
        take(link.key, link.fields, values)
    allowed = _file_precision(ds)
    precision = changes.get("engine.precision", cfg.engine.precision)
    if precision not in allowed:
        key = next(
            (f"{p}.enabled" for p in (*PRECISIONS, "bfloat16") if get_path(ds, f"{p}.enabled", None) is not None),
            "bf16.enabled",
        )
        if explicitly("engine.precision"):
            raise _explicit_conflict(key, get_path(ds, key), "engine.precision", precision, source)
        changes["engine.precision"] = "fp32" if "fp32" in allowed else allowed.pop()
    if world is not None:
        _adopt_train_batch_size(_replace_fields(cfg, changes), ds, explicitly, world, source, changes)
    return _replace_fields(cfg, {**changes, "engine.deepspeed": ds})


def _adopt_scheduler(scheduler: dict, take) -> None:
    if scheduler.get("type") not in SCHEDULES:
        raise DeepSpeedConfigError(
            not_allowed(
                f"{FIELD}: scheduler.type",
                scheduler.get("type"),
                ", ".join(SCHEDULES) + " (read into optim.schedule: "
                "Trainbook sets the learning rate at every step itself), or no scheduler section (optim.* decides)",
            )
        )
    implied = SCHEDULES[scheduler["type"]]
    take("scheduler.type", tuple(implied), tuple(implied.values()))
    linked = {link.key.rsplit(".", 1)[1] for link in LINKS if link.section == "scheduler"}
    for name, value in (scheduler.get("params") or {}).items():
        if name in linked or value == AUTO:
            continue
        if name in SCHEDULER_FIXED and value == SCHEDULER_FIXED[name]:
            continue
        allowed = (
            f"{SCHEDULER_FIXED[name]!r} or \"auto\" (Trainbook warms up linearly from 0)"
            if name in SCHEDULER_FIXED
            else "\"auto\": set optim.min_lr / optim.schedule instead"
        )
        raise DeepSpeedConfigError(
            not_allowed(f"{FIELD}: scheduler.params.{name}", value, allowed, problem="has no Trainbook equivalent")
        )


def _adopt_train_batch_size(cfg, ds: dict, explicitly, world: int, source: str, changes: dict) -> None:
    """DeepSpeed's rule: train_batch_size = micro batch x accumulation steps x processes. A file that gives the
    total and leaves one factor open has it worked out; one whose numbers disagree is refused with the sum."""
    total = ds.get("train_batch_size")
    if total is None or total == AUTO:
        return
    if not isinstance(total, int) or isinstance(total, bool) or total < 1:
        raise DeepSpeedConfigError(not_allowed(f"{FIELD}: train_batch_size", total, "a positive integer or \"auto\""))
    micro, accum = cfg.train.batch_size, cfg.train.grad_accum_steps
    micro_given = ds.get("train_micro_batch_size_per_gpu") not in (None, AUTO) or explicitly("train.batch_size")
    accum_given = ds.get("gradient_accumulation_steps") not in (None, AUTO) or explicitly("train.grad_accum_steps")
    if micro * accum * world == total:
        return
    key = f"{FIELD}: train_batch_size"
    if micro_given and not accum_given:
        if total % (micro * world) == 0:
            changes["train.grad_accum_steps"] = total // (micro * world)
            return
        raise DeepSpeedConfigError(
            refused(
                key,
                f"{total} in {source} is not a whole number of micro-batches of {micro} x {world} processes "
                f"({total} / ({micro} x {world}) = {total / (micro * world):.4g})",
                f"a multiple of {micro * world}",
            )
        )
    if accum_given and not micro_given:
        if total % (accum * world) == 0:
            changes["train.batch_size"] = total // (accum * world)
            return
        raise DeepSpeedConfigError(
            refused(
                key,
                f"{total} in {source} does not divide into train.grad_accum_steps={accum} micro-steps x {world} "
                f"processes ({total} / ({accum} x {world}) = {total / (accum * world):.4g})",
                f"a train_batch_size that is a multiple of {accum * world}, or a train.grad_accum_steps that divides "
                f"{total // world if total % world == 0 else total} (the sequences per process)",
            )
        )
    raise _batch_mismatch(total, source, micro, accum, world)


def _batch_mismatch(total: int, source: str, micro: int, accum: int, world: int) -> DeepSpeedConfigError:
    return DeepSpeedConfigError(
        refused(
            f"{FIELD}: train_batch_size",
            f"{total} in {source} is not train_micro_batch_size_per_gpu x "
            f"gradient_accumulation_steps x processes = {micro} x {accum} x {world} = {micro * accum * world}",
            f"{micro * accum * world}, \"auto\", or a train_batch_size with one of the two factors left \"auto\"",
        )
    )


def _replace_fields(cfg, changes: dict):
    """A copy of ``cfg`` with ``{"section.field": value}`` set (dataclasses.replace, one section at a time)."""
    by_section: dict[str, dict] = {}
    for field, value in changes.items():
        section, name = field.split(".")
        by_section.setdefault(section, {})[name] = value
    return dataclasses.replace(
        cfg, **{section: dataclasses.replace(getattr(cfg, section), **values) for section, values in by_section.items()}
    )


# --- what DeepSpeed is handed -------------------------------------------------------------------------------------


def hidden_size(model_cfg) -> int | None:
    """The model's width, which DeepSpeed's "auto" bucket sizes follow (as in Hugging Face's integration)."""
    if model_cfg.name == "gpt":
        return model_cfg.n_embd
    if model_cfg.name == "hf":
        fields = model_cfg.hf.config
        if model_cfg.hf.source:
            config_file = Path(model_cfg.hf.source) / "config.json"
            try:
                fields = json.loads(config_file.read_text())
            except (OSError, ValueError):
                return None
        for name in ("hidden_size", "n_embd", "d_model"):
            if isinstance(fields.get(name), int):
                return fields[name]
    return None


# "auto" values that follow the model's width: Hugging Face's choices (transformers' HfTrainerDeepSpeedConfig)
WIDTH_AUTOS: dict[str, Callable[[int], int | float]] = {
    "zero_optimization.reduce_bucket_size": lambda h: h * h,
    "zero_optimization.stage3_prefetch_bucket_size": lambda h: int(0.9 * h * h),
    "zero_optimization.stage3_param_persistence_threshold": lambda h: 10 * h,
}


def merged(cfg, world: int, cuda: bool) -> dict:
    """The DeepSpeed config a run hands to deepspeed.initialize: the user's file (engine.deepspeed) with "auto"
    resolved and every field it leaves out filled from ``cfg``; ``world`` processes, on GPUs when ``cuda``."""
    ds = copy.deepcopy(cfg.engine.deepspeed)
    check_shape(ds)
    ds.pop("scheduler", None)  # read into optim.* at load; the loop sets the learning rate each step
    if "bfloat16" in ds and "bf16" not in ds:
        ds["bf16"] = ds.pop("bfloat16")  # DeepSpeed's older name for the same section
    for link in LINKS:
        if not link.section:
            # always the Trainbook field's value: the file's own (or "auto") was taken into it, checked and converted
            set_path(ds, link.key, link.to_ds(*(_config_value(cfg, f) for f in link.fields)))
    t = cfg.train
    ds["train_batch_size"] = t.batch_size * t.grad_accum_steps * world  # the DeepSpeed rule
    optimizer = ds["optimizer"]
    optimizer.setdefault("type", "AdamW")  # Trainbook's optimizer, with the file's params where it gives any
    params = optimizer["params"]
    if params.get("eps") == AUTO:
        params["eps"] = ADAM_EPS
    if not cuda:
        # DeepSpeed's fused Adam needs a C++ build on a CPU; torch's AdamW is what the torch engine runs anyway
        params.setdefault("torch_adam", True)
    for p in PRECISIONS:  # engine.precision holds the file's choice (taken at load) or Trainbook's
        set_path(ds, f"{p}.enabled", cfg.engine.precision == p)
    ds.setdefault("steps_per_print", 2**62)  # the loop reports progress itself
    ds.setdefault("wall_clock_breakdown", False)
    width = hidden_size(cfg.model)
    for key, rule in WIDTH_AUTOS.items():
        if get_path(ds, key, None) == AUTO:
            if width is None:
                raise DeepSpeedConfigError(
                    refused(
                        f"{FIELD}: {key}",
                        "is \"auto\", which follows the model's hidden size, and this model does not say it",
                        "a number",
                    )
                )
            set_path(ds, key, rule(width))
    left = [key for key in _paths(ds) if get_path(ds, key) == AUTO]
    if left:
        raise DeepSpeedConfigError(
            refused(
                f"{FIELD}: {left[0]}",
                "is \"auto\", and no Trainbook field sets it",
                "a value (\"auto\" works for: "
                + ", ".join(
                    [link.key for link in LINKS]
                    + list(WIDTH_AUTOS)
                    + ["train_batch_size", "optimizer.params.eps", "fp16.enabled", "bf16.enabled"]
                )
                + ")",
            )
        )
    return ds


def fused_adam_unavailable() -> str | None:
    """Why DeepSpeed's FusedAdam (its default Adam on a GPU) cannot load on this machine, or None when it can: it is a
    CUDA op, either built into the installed package (DS_BUILD_FUSED_ADAM=1) or compiled at first use, which needs
    nvcc. A pip-installed torch brings the CUDA runtime but no compiler, and DeepSpeed from PyPI is an sdist that
    builds without its ops: there its first step fails (MissingCUDAException: CUDA_HOME does not exist)."""
    import os

    from deepspeed.git_version_info import installed_ops
    from torch.utils.cpp_extension import CUDA_HOME

    if installed_ops.get("fused_adam"):
        return None
    if CUDA_HOME and os.access(os.path.join(CUDA_HOME, "bin", "nvcc"), os.X_OK):
        return None
    return (
        f"DeepSpeed was installed without its fused_adam op and there is no nvcc to build it "
        f"(CUDA_HOME: {CUDA_HOME or 'not found'})"
    )


def fall_back_to_torch_adam(ds: dict) -> str | None:
    """On a GPU where FusedAdam cannot load (:func:`fused_adam_unavailable`), have DeepSpeed step with torch's AdamW
    (``optimizer.params.torch_adam``, what it runs on a CPU and what the torch engine runs) instead of failing at the
    first step; returns why, or None when nothing changed: FusedAdam loads, the file chose (``torch_adam`` given),
    another optimizer type, or optimizer offload (whose DeepSpeedCPUAdam is built with the host's C++ compiler)."""
    optimizer = ds.get("optimizer") or {}
    if str(optimizer.get("type", "")).lower() not in ("adam", "adamw"):
        return None
    params = optimizer.setdefault("params", {})
    offload = get_path(ds, "zero_optimization.offload_optimizer.device", "none")
    if "torch_adam" in params or offload not in (None, "none"):
        return None
    why = fused_adam_unavailable()
    if why is not None:
        params["torch_adam"] = True
    return why


def _paths(data: dict, prefix: str = ""):
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _paths(value, path + ".")
        else:
            yield path


# --- checks before launch -------------------------------------------------------------------------------------

OFFLOADS = ("zero_optimization.offload_optimizer.device", "zero_optimization.offload_param.device")


def check(cfg, world: int, cuda: bool) -> dict:
    """The merged config, refused before launch when DeepSpeed's parser refuses it, when it holds a key DeepSpeed
    does not read (with the nearest valid name), or when it asks for fp16 or offload without a GPU. Returns it."""
    ds = merged(cfg, world, cuda)
    parse(ds)  # a misspelt key first: what follows reads the keys as spelt
    total = cfg.engine.deepspeed.get("train_batch_size")
    if total not in (None, AUTO) and total != ds["train_batch_size"]:  # the file's total, held to the real world
        t = cfg.train
        raise _batch_mismatch(total, "the DeepSpeed config", t.batch_size, t.grad_accum_steps, world)
    steps_per_print = ds.get("steps_per_print")
    if isinstance(steps_per_print, bool) or not isinstance(steps_per_print, int) or steps_per_print < 1:
        raise DeepSpeedConfigError(not_allowed(f"{FIELD}: steps_per_print", steps_per_print, "a whole number >= 1"))
    for key in OFFLOADS:
        device = get_path(ds, key, "none")
        if device not in (None, "none") and not cuda:
            raise DeepSpeedConfigError(
                not_allowed(
                    f"{FIELD}: {key}",
                    device,
                    "'none' on a machine without a GPU (or plan the run for a GPU SKU: trainbook azure plan)",
                    problem="moves state out of GPU memory, and this machine has no GPU: the state already lives in "
                    "CPU memory",
                )
            )
        if device == "nvme" and not get_path(ds, key.rsplit(".", 1)[0] + ".nvme_path", None):
            raise DeepSpeedConfigError(
                refused(
                    f"{FIELD}: {key.rsplit('.', 1)[0]}.nvme_path",
                    "is missing while the device is 'nvme'",
                    "a local NVMe folder",
                )
            )
    if (
        get_path(ds, "zero_optimization.offload_param.device", "none") not in (None, "none")
        and get_path(ds, "zero_optimization.stage", 0) != 3
    ):
        raise DeepSpeedConfigError(
            not_allowed(
                f"{FIELD}: zero_optimization.offload_param",
                get_path(ds, "zero_optimization.offload_param"),
                "ZeRO stage 3 (only stage 3 partitions the parameters)",
            )
        )
    # named here only when the user's file asks for fp16; engine.precision=fp16 is refused by its own field's name
    if get_path(cfg.engine.deepspeed, "fp16.enabled", False) is True and not cuda:
        raise DeepSpeedConfigError(
            not_allowed(
                f"{FIELD}: fp16.enabled",
                True,
                "false on a machine without a GPU (bf16 or fp32 here)",
                problem="needs a GPU: fp16 compute and its loss scaling are GPU features",
            )
        )
    return ds


class _Recording(dict):
    """A mapping that remembers which keys were looked up, so that a key DeepSpeed's parser never reads shows as
    unknown (DeepSpeed itself ignores unknown top-level keys; a misspelt one would silently do nothing)."""

    def __init__(self, data):
        super().__init__(data)
        self.read: set = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def keys(self):
        return _RecordingKeys(self)


class _RecordingKeys:
    def __init__(self, owner: _Recording):
        self.owner = owner

    def __contains__(self, key):
        return key in self.owner

    def __iter__(self):
        return iter(dict.keys(self.owner))

    def __len__(self):
        return len(self.owner)


def parse(ds: dict) -> None:
    """DeepSpeed's own config parser over ``ds`` (offline: no process group is needed); its refusals, and keys it
    does not read, become one-line errors naming the key and the nearest valid name."""
    from toolkit.third_party import import_deepspeed

    import_deepspeed()
    import pydantic
    from deepspeed.runtime.config import DeepSpeedConfig

    probe = _Recording(ds)
    # the parser counts this process as the whole world; the batch arithmetic over processes is merged()'s
    probe["train_batch_size"] = ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"]
    try:
        DeepSpeedConfig(probe)
    except pydantic.ValidationError as exc:
        raise DeepSpeedConfigError(_pydantic_message(exc, ds)) from None
    except Exception as exc:  # noqa: BLE001 - DeepSpeed's own DeepSpeedConfigError is no ValueError; any is a refusal
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DeepSpeedConfigError(
            refused(FIELD, f"DeepSpeed's parser refuses the merged config: {detail}", "a config DeepSpeed 0.19 accepts")
        ) from None
    unknown = sorted(set(ds) - probe.read)
    if unknown:
        raise DeepSpeedConfigError(_unknown_key(unknown[0], sorted(probe.read)))


def _unknown_key(key: str, valid: list[str]) -> str:
    near = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"did you mean {near[0]!r}?" if near else "see the DeepSpeed config reference"
    return refused(
        f"{FIELD}: {key}",
        f"is not a key DeepSpeed reads ({hint})",
        "the keys of DeepSpeed's config: " + ", ".join(valid[:12]) + ", ...",
    )


def _pydantic_message(exc, ds: dict) -> str:
    error = exc.errors()[0]
    loc = [str(p) for p in error["loc"]]
    where = _locate(ds, loc) or ".".join(loc)
    if error["type"] == "extra_forbidden":
        valid = _model_fields(exc.title, loc[:-1])
        near = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.6)
        hint = (
            f"did you mean {where.rsplit('.', 1)[0] + '.' if '.' in where else ''}{near[0]}?"
            if near
            else "not a DeepSpeed setting"
        )
        shown = ", ".join(valid[:12]) + (", ..." if len(valid) > 12 else "")
        return refused(
            f"{FIELD}: {where}",
            f"is not a key DeepSpeed reads here ({hint})",
            shown or "see the DeepSpeed config reference",
        )
    return not_allowed(f"{FIELD}: {where}", error.get("input"), error["msg"], problem="is refused by DeepSpeed")


def _locate(ds: dict, loc: list[str], prefix: str = "") -> str | None:
    """The full dotted path in ``ds`` whose tail is ``loc`` (pydantic reports a section's own path only)."""
    if get_path(ds, ".".join(loc), None) is not None:
        return prefix + ".".join(loc)
    for key, value in ds.items():
        if isinstance(value, dict):
            found = _locate(value, loc, f"{prefix}{key}.")
            if found:
                return found
    return None


def _model_fields(title: str, loc: list[str]) -> list[str]:
    """The keys a DeepSpeed config model (pydantic, by class name) accepts at ``loc`` below it."""
    from deepspeed.runtime.config_utils import DeepSpeedConfigModel

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    model = next((c for c in subclasses(DeepSpeedConfigModel) if c.__name__ == title), None)
    for part in loc:
        info = model.model_fields.get(part) if model is not None else None
        nested = getattr(info, "annotation", None) if info is not None else None
        model = nested if isinstance(nested, type) and hasattr(nested, "model_fields") else None
    if model is None:
        return []
    names = []
    for name, info in model.model_fields.items():
        names.append(info.alias or name)
    return sorted(names)
