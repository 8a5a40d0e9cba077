"""The recommended ZeRO setting as a runnable Trainbook config (and a ZeRO-Offload ds_config for GPUs when no
stage fits), with the Azure ML VM size and node count to run it on.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.config import ConfigError
from toolkit.errors import not_allowed, refused
from toolkit.resources.zero_stages import STATE_SHARE, StageAdvice, check_value, model_params, recommend_stage

# --- the recommended setting, as a config that runs -------------------------------------------------------------

# Built-in GPT shapes (n_layer, n_embd), GPT-3's where the config's bounds allow: what a bare count is written as
GPT_SHAPES = (
    (4, 128),
    (6, 512),
    (12, 768),
    (24, 1024),
    (24, 1536),
    (24, 2048),
    (32, 2560),
    (32, 4096),
    (40, 5120),
    (48, 6144),
    (64, 7168),
    (64, 8192),
)


def gpt_shape(params: float) -> tuple[int, int, int]:
    """(n_layer, n_embd, n_head) of the built-in GPT shape nearest ``params`` (12 L C^2 parameters in its blocks)."""
    check_value("params", params, isinstance(params, (int, float)) and params > 0, "a positive number of parameters")
    largest = 12 * GPT_SHAPES[-1][0] * GPT_SHAPES[-1][1] ** 2
    if params > 1.5 * largest:
        raise ConfigError(
            not_allowed(
                "params",
                params,
                f"up to {1.5 * largest / 1e9:.0f}B, or --config NAME with your model (model.name=hf or custom)",
                problem="is too large for the built-in gpt (model.n_layer <= 64, n_embd <= 8192)",
            )
        )
    L, C = min(GPT_SHAPES, key=lambda s: abs(math.log(12 * s[0] * s[1] ** 2 / params)))
    return L, C, max(1, C // (64 if C <= 1024 else 128))


@dataclass(frozen=True)
class WrittenConfig:
    path: Path
    deepspeed_config: Path | None
    advice: StageAdvice
    params: int
    stage: int
    offload: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())
    engine: str = "deepspeed"
    """The engine written: deepspeed (a ZeRO stage), or torch for a tensor- or pipeline-parallel split."""

    def summary(self) -> str:
        lines = [
            f"wrote {self.path}: engine.name={self.engine}, engine.zero_stage={self.stage}, engine.nproc="
            f"{self.advice.estimates[0].gpus}, engine.precision={self.advice.estimates[0].precision} "
            f"({self.params:,} parameters)"
        ]
        if self.advice.stage is not None and self.engine == "deepspeed":
            lines.append(
                f"  ZeRO-{self.advice.stage}: the lowest stage whose model state fits in {STATE_SHARE:.0%} of "
                f"{self.advice.gpu_memory_gib:g} GiB per GPU"
            )
        if self.deepspeed_config is not None:
            lines.append(f"  engine.deepspeed_config: {self.deepspeed_config}")
        if self.offload:
            lines.append(
                f"  no stage fits: ZeRO-3 with {' and '.join(self.offload)} offloaded to CPU memory. This "
                "config is for a GPU machine (an Azure ML GPU SKU, see below): a launch on a CPU-only "
                "machine refuses offload"
            )
        lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines)


def _azure_hint(path: Path, gpus: int, gpu_memory_gib: float) -> str:
    """How to run the written config on Azure ML GPUs of that size: a VM size and how many nodes."""
    from toolkit.azure.skus import SKUS

    sizes = [s for s in SKUS.values() if s.gpus and s.gpu_mem_gib == gpu_memory_gib]
    if not sizes:
        return (
            f"on Azure ML: trainbook azure plan {path} --compute gpu-cluster --sku <a size with {gpu_memory_gib:g}"
            f" GiB GPUs> --instance-count <nodes>"
        )
    # the biggest node that the GPU count fills exactly, else the smallest node
    whole = [s for s in sizes if s.gpus <= gpus and gpus % s.gpus == 0]
    sku = max(whole, key=lambda s: (s.gpus, s.infiniband)) if whole else min(sizes, key=lambda s: s.gpus)
    nodes = math.ceil(gpus / sku.gpus)
    return (
        f"on Azure ML: trainbook azure plan {path} --compute gpu-cluster --sku {sku.name} --instance-count "
        f"{nodes}  ({sku.describe()})"
    )


def _write_split(path: Path, cfg, count: int, gpus: int, gpu_memory_gib: float, precision: str) -> WrittenConfig:
    """A base config with engine.tensor_parallel or engine.pipeline_parallel: those run on the torch engine, whose
    data parallelism has no ZeRO, so the setting is the split as given on ``gpus`` GPUs when its model state fits
    (ZeRO-0's row), and a refusal naming the split when it does not."""
    import yaml

    from toolkit import config as config_mod
    from toolkit.fsio import atomic_write_text

    tp, pp = cfg.engine.tensor_parallel, cfg.engine.pipeline_parallel
    advice = recommend_stage(count, gpu_memory_gib, gpus, precision, tp, pp)
    whole = advice.estimates[0]
    if whole.total_gib > STATE_SHARE * gpu_memory_gib:
        raise ConfigError(
            not_allowed(
                "engine.tensor_parallel" if tp > 1 else "engine.pipeline_parallel",
                tp if tp > 1 else pp,
                f"a split whose model state fits {STATE_SHARE:.0%} of {gpu_memory_gib:g} GiB (the torch engine that "
                "runs it has no ZeRO), or none, for DeepSpeed's ZeRO stages",
                problem=f"leaves model state of {whole.formula()} on each GPU",
            )
        )
    data = cfg.to_dict()
    data["engine"].update(name="torch", zero_stage=0, nproc=gpus, precision=precision, launcher="auto")
    config_mod.from_dict(data)  # a field out of range refused before anything is written
    layout = f"tensor_parallel {tp}, pipeline_parallel {pp}, {gpus // (tp * pp)} data-parallel replica(s)"
    header = (
        f"# Written by `trainbook estimate`: the torch engine for {gpus} GPU(s) of {gpu_memory_gib:g} GiB, "
        f"{precision}, {layout}, {count:,} parameters.\n# Model state per GPU: {whole.formula()}\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, header + yaml.safe_dump(data, sort_keys=False))
    try:
        config_mod.load(path)
    except ConfigError:
        path.unlink(missing_ok=True)
        raise
    notes = (f"the split runs on the torch engine (no ZeRO): {layout}", _azure_hint(path, gpus, gpu_memory_gib))
    return WrittenConfig(
        path=path, deepspeed_config=None, advice=advice, params=count, stage=0, offload=(), notes=notes, engine="torch"
    )


def _offload(advice: StageAdvice) -> tuple[str, ...]:
    """What ZeRO-3 must move to host memory when no stage fits: the optimizer state (ZeRO-Offload), and the
    parameters too when the half weights and gradients alone overflow the budget (ZeRO-Infinity)."""
    stage3 = advice.estimates[-1]
    on_gpu = (stage3.weights_bytes + stage3.gradients_bytes) / 2**30
    return ("optimizer",) if on_gpu <= STATE_SHARE * advice.gpu_memory_gib else ("optimizer", "parameters")


def write_recommended_config(
    path,
    *,
    params: float | None = None,
    base=None,
    overrides=(),
    gpus: int = 8,
    gpu_memory_gib: float = 80.0,
    precision: str | None = None,
) -> WrittenConfig:
    """Write the recommended ZeRO setting for ``gpus`` GPUs of ``gpu_memory_gib`` as a Trainbook config that loads
    and runs: ``base`` (a config name or file, with ``overrides``) with its engine section set, or for a bare
    ``params`` count the built-in GPT shaped to about that size. When no stage fits, a ds_config.json with
    ZeRO-Offload is written next to it (for a GPU machine)."""
    import yaml

    from toolkit import config as config_mod
    from toolkit.fsio import atomic_write_text

    path = Path(path)
    if path.is_dir():
        raise ConfigError(not_allowed("--write-config", path, "a .yaml or .yml file", problem="is a folder"))
    check_value("--write-config", path, path.suffix in (".yaml", ".yml"), "a .yaml or .yml file")
    check_value("gpus", gpus, isinstance(gpus, int) and not isinstance(gpus, bool) and gpus >= 1, "1 or more")
    if base is not None and params is not None:
        raise ConfigError(
            not_allowed(
                "params",
                params,
                "no count with a base config: its model is counted",
                problem="is not allowed with a base config",
            )
        )
    notes = []
    if base is not None:
        cfg = config_mod.load(base, list(overrides))
        precision = precision or cfg.engine.precision
    elif params is not None:
        L, C, H = gpt_shape(params)
        cfg = config_mod.load(None, [f"model.n_layer={L}", f"model.n_embd={C}", f"model.n_head={H}"])
        cfg = config_mod.from_dict({**cfg.to_dict(), "name": f"gpt-{L}x{C}"})
        precision = precision or "bf16"
    else:
        raise ConfigError(
            refused(
                "params", "missing", "a parameter count such as 350M, 7B or 1.3e9, or a base config (--config NAME)"
            )
        )
    count = model_params(cfg)
    split = (cfg.engine.tensor_parallel, cfg.engine.pipeline_parallel)
    if split != (1, 1):
        return _write_split(path, cfg, count, gpus, gpu_memory_gib, precision)
    if base is None:
        notes.append(
            f"model: the built-in gpt shaped to {count / 1e9:.3g}B parameters (n_layer={cfg.model.n_layer}, "
            f"n_embd={cfg.model.n_embd}) for the {params:.3g} asked: replace the model section with yours"
        )
    advice = recommend_stage(count, gpu_memory_gib, gpus, precision)
    stage = advice.stage if advice.stage is not None else 3
    offload = () if advice.stage is not None else _offload(advice)

    ds = json.loads(json.dumps(cfg.engine.deepspeed or {}))  # the base's own DeepSpeed settings, kept
    zero = ds.setdefault("zero_optimization", {})
    zero["stage"] = stage
    for part in offload:
        zero["offload_optimizer" if part == "optimizer" else "offload_param"] = {"device": "cpu", "pin_memory": True}
    if ds.get("train_batch_size", "auto") != "auto":
        ds["train_batch_size"] = "auto"  # micro batch x accumulation x the new process count
        notes.append("train_batch_size in the DeepSpeed config set to \"auto\": it follows the new process count")
    data = cfg.to_dict()
    data["engine"].update(
        name="deepspeed",
        zero_stage=stage,
        nproc=gpus,
        precision=precision,
        launcher="auto",
        deepspeed_config="",
        deepspeed={},
    )
    keep_ds = offload or cfg.engine.deepspeed
    if keep_ds:
        data["engine"]["deepspeed"] = ds
    config_mod.from_dict(data)  # a field out of range (engine.nproc > 1024...) refused before anything is written
    ds_path = None
    if keep_ds:
        ds_path = path.with_name(f"{path.stem}.ds_config.json").absolute()
        atomic_write_text(ds_path, json.dumps(ds, indent=1) + "\n")
        data["engine"].update(deepspeed_config=str(ds_path), deepspeed={})
    for_what = (
        f"ZeRO-{stage}"
        + (f" + {' and '.join(offload)} offload" if offload else "")
        + f" for {gpus} GPU{'s' if gpus > 1 else ''} of {gpu_memory_gib:g} GiB, {precision}"
    )
    header = (
        f"# Written by `trainbook estimate`: {for_what}, {count:,} parameters.\n"
        "# Model state per GPU by stage (the guide's rule, 70% of the GPU for model state):\n"
        + "".join(f"#   {line}\n" for line in advice.summary().splitlines()[1:])
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, header + yaml.safe_dump(data, sort_keys=False))
    try:  # what a user's `trainbook train FILE` does first: the DeepSpeed file merged, every field checked
        config_mod.load(path)
    except ConfigError:
        for written in (path, ds_path):
            if written is not None:
                written.unlink(missing_ok=True)
        raise
    notes.append(_azure_hint(path, gpus, gpu_memory_gib))
    return WrittenConfig(
        path=path,
        deepspeed_config=ds_path,
        advice=advice,
        params=count,
        stage=stage,
        offload=offload,
        notes=tuple(notes),
    )
