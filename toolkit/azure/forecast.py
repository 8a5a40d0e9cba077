"""Before you book the cluster: a full run's time, money and failures, forecast from what was measured.

For a model of N parameters trained on D tokens on G GPUs of one Azure size (or on this machine, ``local``):

    FLOPs        F = D x f, with f = 6 N per token (2 forward and 4 backward per weight), plus 12 L d s for the
                 attention scores where the shape is known (layers L, width d, sequence s; PaLM, appendix B)
    throughput   X = G x MFU x peak, the peak the GPU's dense bf16 datasheet figure (toolkit.train.flops)
    training     T = F / X
    failures     k = T x G / (GPU-hours per failure): Llama 3's 419 unexpected interruptions in 54 days on
                 16,384 GPUs by default (toolkit.checkpoint.interval_advisor)
    checkpoints  every t = sqrt(2 C M) - C (Young/Daly), C a checkpoint's cost, M the job's MTBF
    lost         T x C / t to checkpoints, and k x (t / 2 + R) to failures: the work since the last checkpoint,
                 then the restart R
    wall clock   W = T + both; GPU-hours W x G; cost W x nodes x the size's price per node-hour
    memory       model state per GPU at the ZeRO stage (toolkit.resources.zero_stages), and the lowest that fits

Every input carries where it came from (:class:`Sourced`): measured on this machine (a run's MFU, which applied to
another device's peak scales its throughput by the ratio of the peaks), a GPU report of bench/gpu_check.sh, Azure's
published figure for DeepSpeed on its stack, a published default, or the user's own value. Nothing is fetched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from toolkit.azure.errors import AzureError
from toolkit.azure.skus import SKUS, Sku, get_sku
from toolkit.checkpoint.interval_advisor import advise, duration
from toolkit.errors import not_allowed
from toolkit.fsio import read_regular_file
from toolkit.plain_data import loads_json

LOCAL = "local"  # this machine, as a "size": one process, its measured peak


@dataclass(frozen=True)
class Sourced:
    """A number and where it came from."""

    value: float
    source: str


# Azure's figure for DeepSpeed on its stack, as the Azure ML guide to large-scale deep learning gives it: a
# 175B-parameter model at batch 16 per GPU and sequence 1024 on 1,024 A100s reached about 157 TFLOPs per GPU, of
# the A100's 312 dense bf16 TFLOPs.
AZURE_A100_TFLOPS = 157.0
AZURE_PUBLISHED_MFU = Sourced(
    AZURE_A100_TFLOPS / 312.0,
    "Azure's published figure for DeepSpeed on its stack (the Azure ML guide to large-scale deep learning): about "
    "157 TFLOPs per A100 (of 312) at 175B parameters, batch 16 per GPU, sequence 1024, 1,024 GPUs",
)

# Pay-as-you-go Linux list prices in USD per node-hour, East US, as Azure's pricing page showed them when recorded;
# prices change and differ by region and agreement: --price SKU=USD_PER_HOUR replaces any of them.
PRICES_RECORDED = "2024-06"
PRICE_SOURCE = f"Azure's list price (East US, pay-as-you-go Linux, recorded {PRICES_RECORDED}; check yours)"
PRICES_USD_PER_HOUR = {
    "Standard_NC24ads_A100_v4": 3.673,
    "Standard_NC48ads_A100_v4": 7.346,
    "Standard_NC96ads_A100_v4": 14.692,
    "Standard_ND96asr_v4": 27.197,
    "Standard_ND96amsr_A100_v4": 32.770,
    "Standard_NC40ads_H100_v5": 6.980,
    "Standard_NC80adis_H100_v5": 13.960,
    "Standard_ND96isr_H100_v5": 98.320,
}

# A checkpoint's cost when none was measured: the async checkpoint blocks training for its staging copy of the
# model state to host memory (toolkit.checkpoint.checkpointer), at about PCIe 4.0 x16's device-to-host speed.
STAGING_BYTES_PER_S = 25e9
DEFAULT_RESTART = Sourced(600.0, "an assumption: 10 minutes to reschedule the job and load its checkpoint")


def _mtbf_default() -> Sourced:
    from toolkit.checkpoint.interval_advisor import GPU_HOURS_PER_FAILURE

    return Sourced(
        GPU_HOURS_PER_FAILURE,
        "Llama 3's failure rate (Dubey et al. 2024, section 3.3.4: 419 unexpected interruptions in 54 days on "
        "16,384 GPUs)",
    )


@dataclass(frozen=True)
class ModelShape:
    """What the forecast needs of a model: its parameters, and its shape where known (for the attention term)."""

    params: float
    layers: int = 0
    width: int = 0
    sequence: int = 0
    name: str = ""

    def flops_per_token(self) -> Sourced:
        dense = 6 * self.params
        if self.layers and self.width and self.sequence:
            attention = 12 * self.layers * self.width * self.sequence
            return Sourced(
                dense + attention,
                f"6 x {self.params:.4g} parameters + 12 x {self.layers} layers x {self.width} wide x "
                f"{self.sequence} tokens (attention)",
            )
        return Sourced(dense, f"6 x {self.params:.4g} parameters (no shape given: attention left out)")


def shape_of_config(cfg, name: str = "") -> tuple[ModelShape, int, str, int | None]:
    """(the model's shape, sequences per GPU a step, precision, the ZeRO stage it runs: 0 for the torch engine) of
    a config: its parameters counted on the meta device, the shape of the built-in GPT or of a transformers
    config."""
    from toolkit.resources.zero_stages import model_params

    m = cfg.model
    layers, width = (m.n_layer, m.n_embd) if m.name == "gpt" else (0, 0)
    if m.name == "hf":
        hf = m.hf.config or {}
        layers, width = int(hf.get("num_hidden_layers", 0) or 0), int(hf.get("hidden_size", 0) or 0)
    shape = ModelShape(float(model_params(cfg)), layers, width, m.block_size, name=name or f"config {cfg.name}")
    stage = cfg.engine.zero_stage if cfg.engine.name == "deepspeed" else 0  # DDP keeps every state whole
    precision = cfg.engine.precision if cfg.engine.precision != "fp32" else "bf16"
    return shape, cfg.train.batch_size * cfg.train.grad_accum_steps, precision, stage


def forecast_config(cfg, sku: str, nodes: int, tokens: Sourced, mfu: Sourced | None = None) -> ForecastReport:
    """The forecast of a config's run on ``nodes`` of ``sku`` (what the Azure ML plan carries into submit.md)."""
    shape, batch, precision, stage = shape_of_config(cfg)
    return forecast(shape, tokens, [(sku, nodes)], mfu=mfu, precision=precision, zero_stage=stage, batch_per_gpu=batch)


@dataclass
class Forecast:
    """One size at one node count."""

    sku: str
    nodes: int
    gpus: int
    step_s: float | None  # one optimizer step (None: no batch given)
    peak_flops: Sourced
    mfu: Sourced
    tokens_per_s: float
    train_s: float
    checkpoint_cost: Sourced
    checkpoint_every_s: float
    checkpoint_lost_s: float
    interruptions: float
    interruption_lost_s: float
    wall_s: float
    gpu_hours: float
    price_per_node_hour: Sourced
    cost_usd: float
    zero_stage: int | None
    lowest_fitting_stage: int | None  # None: no ZeRO stage fits these GPUs
    memory_gib: float
    gpu_memory_gib: float | None  # None: this machine (no GPU memory to fit)
    fits: bool
    memory_advice: str

    @property
    def days(self) -> float:
        return self.wall_s / 86400

    def to_dict(self) -> dict:
        return {**asdict(self), "days": self.days}


@dataclass
class ForecastReport:
    model: ModelShape
    tokens: Sourced
    flops_per_token: Sourced
    mtbf_gpu_hours: Sourced
    restart: Sourced
    rows: list[Forecast] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "model": asdict(self.model),
            "tokens": asdict(self.tokens),
            "flops_per_token": asdict(self.flops_per_token),
            "mtbf_gpu_hours": asdict(self.mtbf_gpu_hours),
            "restart_s": asdict(self.restart),
            "forecasts": [row.to_dict() for row in self.rows],
        }

    def table(self, html: bool = False) -> str:
        from toolkit.tables import Column, html_table, text_table

        columns = [
            Column("size", "sku"),
            Column("nodes", "nodes", ",", True),
            Column("GPUs", "gpus", ",", True),
            Column("tokens/s/GPU", lambda r: r.tokens_per_s / r.gpus, ",.0f", True),
            Column("step", lambda r: None if r.step_s is None else duration(r.step_s), right=True),
            Column("days", lambda r: r.days, ",.1f", True),
            Column("GPU-hours", "gpu_hours", ",.0f", True),
            Column("cost, USD", "cost_usd", ",.0f", True),
            Column("interruptions", "interruptions", ",.1f", True),
            Column("lost to them, h", lambda r: r.interruption_lost_s / 3600, ",.1f", True),
            Column("checkpoint every", lambda r: duration(r.checkpoint_every_s)),
            Column("ZeRO", lambda r: "-" if r.zero_stage is None else r.zero_stage, right=True),
            Column("state/GPU, GiB", "memory_gib", ",.1f", True),
            Column("fits", lambda r: "yes" if r.fits else "no"),
        ]
        return html_table(self.rows, columns) if html else text_table(self.rows, columns)

    def sources(self) -> list[str]:
        """Each input and where it came from, once."""
        lines = [
            f"model: {self.model.params:.4g} parameters{f' ({self.model.name})' if self.model.name else ''}",
            f"tokens: {self.tokens.value:.4g}, {self.tokens.source}",
            f"FLOPs per token: {self.flops_per_token.value:.4g} = {self.flops_per_token.source}",
            f"failures: one per {self.mtbf_gpu_hours.value:,.0f} GPU-hours, {self.mtbf_gpu_hours.source}",
            f"restart: {duration(self.restart.value)}, {self.restart.source}",
            "scaling: the MFU is held at every node count (what scaling loses must be in the MFU given; "
            "notebook 03b measures it)",
        ]
        for kind in ("peak", "MFU", "price", "checkpoint cost"):
            shared: dict[tuple[str, str], list[str]] = {}
            for row in self.rows:
                sourced = {
                    "peak": row.peak_flops,
                    "MFU": row.mfu,
                    "price": row.price_per_node_hour,
                    "checkpoint cost": row.checkpoint_cost,
                }[kind]
                sizes = shared.setdefault((_shown(kind, sourced.value), sourced.source), [])
                if row.sku not in sizes:
                    sizes.append(row.sku)
            for (value, source), sizes in shared.items():
                lines.append(f"{kind} ({', '.join(sizes)}): {value}, {source}")
        for row in self.rows:
            if not row.fits:
                lines.append(f"{row.sku} x {row.nodes}: {row.memory_advice}")
        return lines

    def text(self) -> str:
        return self.table() + "\n\n" + "\n".join(self.sources())


def _shown(kind: str, value: float) -> str:
    if kind == "peak":
        return f"{value / 1e12:,.0f} TFLOP/s" if value >= 1e12 else f"{value / 1e9:,.0f} GFLOP/s"
    if kind == "MFU":
        return f"{value:.1%}"
    if kind == "price":
        return f"{value:,.2f} USD per node-hour"
    return duration(value)


def node_counts(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4]; anything but whole numbers of 1 or more is refused naming --nodes."""
    counts = []
    for item in str(text).split(","):
        try:
            value = int(item.strip())
        except ValueError:
            value = 0
        if value < 1:
            raise AzureError(
                not_allowed("--nodes", item.strip(), "whole numbers of 1 or more, comma-separated (1,2,4)")
            )
        counts.append(value)
    return counts


def _ratio(ratio: float) -> str:
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def positive(name: str, value, what: str = "a positive number") -> float:
    """``value`` as a float, refused naming ``name`` unless it is a finite number above 0."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, bool) or not (number > 0 and math.isfinite(number)):
        raise AzureError(not_allowed(name, value, what))
    return number


def training_sizes() -> list[Sku]:
    """The sizes a forecast can use: GPUs whose dense bf16 peak the datasheet table holds."""
    return [sku for sku in SKUS.values() if sku.gpus and _gpu_peak(sku) is not None]


def _gpu_peak(sku: Sku) -> Sourced | None:
    from toolkit.train.flops import datasheet_peak

    found = datasheet_peak(f"NVIDIA {sku.gpu_model}", "bf16")
    return Sourced(found["flops"], found["reference"]) if found else None


def resolve_sku(name: str) -> Sku | None:
    """The size called ``name`` (None for ``local``); an unknown name is refused listing the nearest ones."""
    if str(name).strip().lower() == LOCAL:
        return None
    try:
        sku = get_sku(name)
    except AzureError:
        import difflib

        names = [s.name for s in training_sizes()]
        near = difflib.get_close_matches(str(name), names, n=3, cutoff=0.3) or names
        raise AzureError(
            not_allowed(
                "--sku", name, ", ".join(near) + f" (or {LOCAL!r}: this machine)", problem="is not a known VM size"
            )
        ) from None
    if _gpu_peak(sku) is None:
        raise AzureError(
            not_allowed(
                "--sku",
                sku.name,
                ", ".join(s.name for s in training_sizes()),
                problem=f"has {f'{sku.gpu_model} GPUs' if sku.gpus else 'no GPU'}, whose dense bf16 peak the datasheet "
                "table does not hold",
            )
        )
    return sku


def mfu_from_run(run_dir: str | Path) -> tuple[Sourced, Sourced]:
    """(MFU, the peak it was measured against) from a finished run's steady state: measured on this machine."""
    from toolkit.events import StatusEvent, TrainEvent, read_events
    from toolkit.rundir import RunDir
    from toolkit.train.metrics import steady_state

    run = RunDir(run_dir)
    speed = steady_state(read_events(run, TrainEvent)) if run.events_path.exists() else None
    running = [e for e in read_events(run, StatusEvent) if e.state == "running" and e.peak_flops] if speed else []
    if speed is None or not running or running[-1].peak_flops is None:
        raise AzureError(not_allowed("--mfu", f"run:{run_dir}", "a run that logged training steps", problem="has none"))
    where = f"measured by run {run.path.name} on this machine ({speed.intervals} steady log intervals)"
    peak = float(running[-1].peak_flops or 0)
    return Sourced(speed.mfu, where), Sourced(peak, f"{running[-1].peak_source} peak of {where}")


GPU_REPORT_MAX_BYTES = 1 << 20  # bench/gpu_check.sh writes 10 to 20 KB


def mfu_from_gpu_report(path: str | Path) -> Sourced:
    """The MFU of a GPU report's benchmark (bench/gpu_check.sh's gpu_check.json): the compiled run's where there was
    one, else the eager run's, said which."""
    given = f"gpu-report:{path}"
    try:  # a report from elsewhere: a regular file of a report's size (not /dev/zero, not a FIFO), plain JSON
        text = read_regular_file(Path(path), field="--mfu", error=AzureError, limit=GPU_REPORT_MAX_BYTES)
        bench = loads_json(text).get("benchmark")
    except AzureError:
        raise
    except (OSError, ValueError, AttributeError) as exc:
        raise AzureError(
            not_allowed(
                "--mfu", given, "a gpu_check.json that bench/gpu_check.sh wrote", problem=f"cannot be read ({exc})"
            )
        ) from None
    compiled = (bench or {}).get("compiled") if isinstance(bench, dict) else None
    kind, figure = (
        ("compiled", compiled.get("mfu"))
        if isinstance(compiled, dict) and compiled.get("mfu")
        else ("eager", bench.get("mfu") if isinstance(bench, dict) else None)
    )
    if isinstance(figure, bool) or not isinstance(figure, (int, float)) or not 0 < figure <= 1:
        raise AzureError(not_allowed("--mfu", given, "a GPU report whose benchmark has an MFU", problem="has none"))
    model = bench.get("model") if isinstance(bench.get("model"), dict) else {}
    size = model.get("parameters")
    what = f"a {size / 1e6:.0f}M-parameter GPT" if isinstance(size, (int, float)) else "its benchmark model"
    return Sourced(float(figure), f"GPU report {path} ({bench.get('device')}, {what}, {kind})")


def _memory(params: float, precision: str, zero_stage: int | None, gpus: int, gpu_memory_gib: float):
    """(ZeRO stage, its model state per GPU, whether it fits, what would fit when it does not, the lowest stage
    that fits): ``zero_stage`` as given, or None for the lowest stage that fits (toolkit.resources.zero_stages)."""
    from toolkit.resources.zero_stages import STATE_SHARE, estimate, recommend_stage

    if not math.isfinite(gpu_memory_gib):  # this machine: no GPU memory to fit
        return zero_stage or 0, estimate(params, precision, zero_stage or 0, gpus), True, "", 0
    advice = recommend_stage(params, gpu_memory_gib, gpus, precision)
    stage = advice.stage if zero_stage is None else zero_stage
    state = estimate(params, precision, 3 if stage is None else stage, gpus)
    budget = STATE_SHARE * gpu_memory_gib
    if stage is not None and state.total_gib <= budget:
        return stage, state, True, "", advice.stage
    if advice.stage is None:
        return stage, state, False, advice.summary().splitlines()[-1].strip(), None
    too_much = f"ZeRO-{stage} holds {state.total_gib:,.1f} GiB of model state per GPU, over {budget:,.1f} GiB"
    return (
        stage,
        state,
        False,
        f"{too_much} ({STATE_SHARE:.0%} of {gpu_memory_gib:g}); ZeRO-{advice.stage} fits",
        advice.stage,
    )


def forecast(
    model: ModelShape,
    tokens: Sourced,
    targets: list[tuple[str, int]],
    mfu: Sourced | None = None,
    measured_peak: Sourced | None = None,
    precision: str = "bf16",
    zero_stage: int | None = None,
    mtbf_gpu_hours: Sourced | None = None,
    checkpoint_cost: Sourced | None = None,
    restart: Sourced = DEFAULT_RESTART,
    prices: dict[str, Sourced] | None = None,
    batch_per_gpu: int | None = None,
) -> ForecastReport:
    """The forecast of every (size, nodes) in ``targets`` (see the module's docstring). ``mfu`` None: Azure's
    published figure. ``measured_peak``: the peak ``mfu`` was measured against, which the ``local`` size uses.
    ``batch_per_gpu``: sequences of model.sequence tokens each GPU takes a step, for the step time."""
    positive("params", model.params, "a positive number of parameters")
    positive("tokens", tokens.value, "a positive number of tokens")
    mfu = mfu or AZURE_PUBLISHED_MFU
    if not 0 < mfu.value <= 1:
        raise AzureError(not_allowed("--mfu", mfu.value, "a share of the peak above 0 and at most 1"))
    mtbf = mtbf_gpu_hours or _mtbf_default()
    flops_per_token = model.flops_per_token()
    report = ForecastReport(model, tokens, flops_per_token, mtbf, restart)
    for name, nodes in targets:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise AzureError(not_allowed("--nodes", nodes, "whole numbers of 1 or more"))
        sku = resolve_sku(name)
        found: Sourced | None
        if sku is None:  # this machine: one process, the peak the MFU was measured against
            if measured_peak is None:
                raise AzureError(
                    not_allowed("--sku", LOCAL, "a GPU size, or 'local' with --mfu run:RUN_DIR (a run measured here)")
                )
            size, gpus, gpu_memory, found = LOCAL, nodes, math.inf, measured_peak
        else:
            size, gpus, gpu_memory = sku.name, sku.gpus * nodes, float(sku.gpu_mem_gib)
            found = _gpu_peak(sku)
        assert found is not None  # resolve_sku refuses a size without one
        peak, row_mfu = found, mfu
        if sku is not None and measured_peak is not None:  # measured here, applied to a GPU: say what that means
            row_mfu = Sourced(
                mfu.value,
                f"{mfu.source}; applied to this GPU's peak, which scales the measured throughput by the ratio of the "
                f"peaks ({_ratio(peak.value / measured_peak.value)})",
            )
        tokens_per_s = gpus * row_mfu.value * peak.value / flops_per_token.value
        train_s = tokens.value / tokens_per_s

        stage, state, fits, memory_advice, lowest = _memory(model.params, precision, zero_stage, gpus, gpu_memory)
        mtbf_s = mtbf.value * 3600 / gpus
        cost = checkpoint_cost or Sourced(
            state.total_bytes / STAGING_BYTES_PER_S,
            f"estimated: the model state per GPU ({state.total_gib:,.1f} GiB at ZeRO-{state.zero_stage}) staged to "
            f"host memory at {STAGING_BYTES_PER_S / 1e9:.0f} GB/s (PCIe 4.0 x16), what an async checkpoint blocks for",
        )
        checkpoints = advise(cost.value, mtbf_s, restart_s=restart.value)
        checkpoint_lost = train_s * cost.value / checkpoints.interval_s
        interruptions = train_s * gpus / 3600 / mtbf.value
        interruption_lost = interruptions * (checkpoints.interval_s / 2 + restart.value)
        wall = train_s + checkpoint_lost + interruption_lost
        price = (prices or {}).get(size.lower()) or (
            Sourced(PRICES_USD_PER_HOUR[size], PRICE_SOURCE)
            if size in PRICES_USD_PER_HOUR
            else Sourced(0.0, "no price recorded for this size: give one with --price SIZE=USD_PER_HOUR")
        )
        report.rows.append(
            Forecast(
                sku=size,
                nodes=nodes,
                gpus=gpus,
                step_s=batch_per_gpu * model.sequence * gpus / tokens_per_s
                if batch_per_gpu and model.sequence
                else None,
                peak_flops=peak,
                mfu=row_mfu,
                tokens_per_s=tokens_per_s,
                train_s=train_s,
                checkpoint_cost=cost,
                checkpoint_every_s=checkpoints.interval_s,
                checkpoint_lost_s=checkpoint_lost,
                interruptions=interruptions,
                interruption_lost_s=interruption_lost,
                wall_s=wall,
                gpu_hours=wall * gpus / 3600,
                price_per_node_hour=price,
                cost_usd=wall / 3600 * nodes * price.value,
                zero_stage=stage,
                lowest_fitting_stage=lowest,
                memory_gib=state.total_gib,
                gpu_memory_gib=gpu_memory if math.isfinite(gpu_memory) else None,
                fits=fits,
                memory_advice=memory_advice,
            )
        )
    if report.rows and all(row.lowest_fitting_stage is None for row in report.rows):
        raise AzureError(
            not_allowed(
                "--params",
                f"{model.params:.4g}",
                "a model whose state fits one of the sizes and node counts asked for",
                problem="fits none of them at any ZeRO stage: "
                + "; ".join(f"{r.sku} x {r.nodes}: {r.memory_advice}" for r in report.rows),
            )
        )
    return report


CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022: compute-optimal training sees about 20 tokens a parameter


def count(flag: str, value) -> float:
    """A count as people write it (2M, 300B, 1.5e12, or a number), refused naming ``flag``."""
    from toolkit.config import ConfigError
    from toolkit.resources.zero_stages import parse_count

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return positive(flag, value, "a positive count such as 2M, 300B or 1.5e12")
    try:
        return parse_count(str(value))
    except ConfigError:
        raise AzureError(not_allowed(flag, value, "a positive count such as 2M, 300B or 1.5e12")) from None


def token_budget(model: ModelShape, tokens=None) -> Sourced:
    """``tokens`` as given, or Chinchilla's 20 a parameter (said so)."""
    if tokens is not None:
        return Sourced(count("--tokens", tokens), "given")
    return Sourced(
        CHINCHILLA_TOKENS_PER_PARAM * model.params,
        f"Chinchilla's {CHINCHILLA_TOKENS_PER_PARAM} tokens a parameter (Hoffmann et al. 2022)",
    )


def throughput(mfu="azure", tflops: float | None = None, skus: Sequence[str] = ()) -> tuple[Sourced, Sourced | None]:
    """(MFU, the peak it was measured against or None) from ``tflops`` per GPU (sizes of one GPU model), or
    ``mfu``: a share (0.4), 'azure' (Azure's published figure), 'run:RUN_DIR' or 'gpu-report:FILE'."""
    if tflops is not None:
        reached = positive("--tflops", tflops, "TFLOP/s above 0")
        peaks = {peak.value for s in skus if (sku := resolve_sku(s)) is not None and (peak := _gpu_peak(sku))}
        if len(peaks) != 1:
            raise AzureError(
                not_allowed("--tflops", tflops, "sizes of one GPU model (or --mfu, a share of each one's peak)")
            )
        top = peaks.pop()
        if reached * 1e12 > top:
            raise AzureError(not_allowed("--tflops", tflops, f"at most the GPU's peak, {top / 1e12:g} TFLOP/s"))
        return Sourced(reached * 1e12 / top, f"{reached:g} TFLOP/s per GPU, given"), None
    if not isinstance(mfu, str):
        return Sourced(positive("--mfu", mfu, "a share of the peak above 0 and at most 1"), "given"), None
    kind, _, where = mfu.partition(":")
    if kind == "azure" and not where:
        return AZURE_PUBLISHED_MFU, None
    if kind == "run" and where:
        return mfu_from_run(where)
    if kind == "gpu-report" and where:
        return mfu_from_gpu_report(where), None
    try:
        return Sourced(float(mfu), "given"), None
    except ValueError:
        raise AzureError(
            not_allowed("--mfu", mfu, "a share such as 0.4, 'azure', 'run:RUN_DIR' or 'gpu-report:FILE'")
        ) from None


def forecast_sizes(
    model: str | float | ModelShape,
    skus: Sequence[str],
    nodes: Sequence[int] = (1,),
    tokens=None,
    mfu="azure",
    tflops: float | None = None,
    **options,
) -> ForecastReport:
    """The forecast for people (``toolkit.forecast``, ``trainbook forecast``): ``model`` a parameter count ('7B')
    or a ModelShape; every size in ``skus`` at every node count in ``nodes``; ``tokens`` a count or None
    (Chinchilla); ``mfu``/``tflops`` as :func:`throughput` reads them; ``options`` as :func:`forecast` takes them.

        report = forecast_sizes("7B", ["Standard_ND96isr_H100_v5"], nodes=[1, 2, 4], tokens="140B")
        print(report.text())"""
    shape = model if isinstance(model, ModelShape) else ModelShape(count("--params", model), name=f"{model} given")
    achieved, measured_peak = throughput(mfu, tflops, skus)
    targets = [(sku, n) for sku in skus for n in nodes]
    return forecast(shape, token_budget(shape, tokens), targets, mfu=achieved, measured_peak=measured_peak, **options)
