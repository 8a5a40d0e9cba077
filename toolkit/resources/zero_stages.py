"""ZeRO arithmetic: how much model state a GPU holds by ZeRO stage (the guide), and the lowest stage that fits.


The guide's rule: mixed-precision (fp16/bf16) Adam keeps about 20 bytes per parameter of *model state*:

    2  half-precision weights        (what forward and backward read)
    2  half-precision gradients      (what backward writes)
    4  fp32 master weights           (what the optimizer updates)
    4  fp32 Adam momentum
    4  fp32 Adam variance
    4  fp32 gradients                (accumulation / the optimizer's view of the gradient)

(The ZeRO paper counts 16, without the fp32 gradient copy.) Plain fp32 Adam keeps 16: weights, gradients,
momentum and variance, 4 bytes each. ZeRO partitions this state over the N data-parallel GPUs in stages:

    stage 0   nothing partitioned                          20 Ψ
    stage 1   optimizer state (master, m, v, fp32 grads)   4 Ψ + 16 Ψ / N
    stage 2   + half-precision gradients                    2 Ψ + 18 Ψ / N
    stage 3   + half-precision weights                      20 Ψ / N

Activations, communication buckets and fragmentation come on top and depend on batch and sequence length,

A run's whole peak per rank is :mod:`toolkit.resources.memory_model`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from toolkit.config import ConfigError
from toolkit.errors import not_allowed


# Bytes per parameter of each part of the model state: (weights, gradients, optimizer state).
# The optimizer state includes the fp32 master weights and fp32 gradients where the precision keeps them.
BYTES_PER_PARAM: dict[str, tuple[int, int, int]] = {
    "fp16": (2, 2, 16),  # the guide's 20 bytes: 2 + 2 + (4 master + 4 momentum + 4 variance + 4 fp32 grads)
    "bf16": (2, 2, 16),  # same layout as fp16 (bf16 has no loss scaler, same bytes)
    "fp32": (4, 4, 8),  # weights, gradients, momentum + variance; no master copy
}
STAGES = (0, 1, 2, 3)
STATE_SHARE = 0.7  # leave 30% of the GPU for activations, buffers and fragmentation


@dataclass(frozen=True)
class MemoryEstimate:
    params: float
    precision: str
    zero_stage: int
    gpus: int
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    tensor_parallel: int = 1
    """GPUs each layer is split over: each holds 1/t of every matrix, and ZeRO partitions over the gpus / t
    data-parallel replicas."""
    pipeline_parallel: int = 1
    """Pipeline stages: each GPU holds 1/p of the layers, and ZeRO partitions over gpus / (t p) replicas."""

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    @property
    def total_gib(self) -> float:
        return self.total_bytes / 2**30

    def formula(self) -> str:
        """The arithmetic behind the figure, e.g. '2 Ψ + 18 Ψ / 8 = 4.25 bytes x 7e9 params = 27.7 GiB'."""
        w, g, o = BYTES_PER_PARAM[self.precision]
        t = self.tensor_parallel * self.pipeline_parallel  # GPUs that share one copy of the model
        n = self.gpus // t  # ZeRO partitions over the data-parallel replicas
        psi = "Ψ" if t == 1 else f"Ψ/{t}"
        parts = {
            0: f"{w + g + o} {psi}",
            1: f"{w + g} {psi} + {o} {psi} / {n}",
            2: f"{w} {psi} + {g + o} {psi} / {n}",
            3: f"{w + g + o} {psi} / {n}",
        }[self.zero_stage]
        per_param = self.total_bytes / self.params
        size = f"{self.total_gib:,.1f} GiB" if self.total_gib >= 1 else f"{self.total_bytes / 2**20:,.1f} MiB"
        return f"{parts} = {per_param:.3g} bytes x {self.params:.3g} params = {size}"


def check_value(name: str, value, ok: bool, allowed: str) -> None:
    if not ok:
        raise ConfigError(not_allowed(name, value, allowed))


def estimate(
    params: float,
    precision: str = "bf16",
    zero_stage: int = 0,
    gpus: int = 1,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> MemoryEstimate:
    """Model-state memory per GPU for ``params`` parameters trained with Adam; with ``tensor_parallel`` t and
    ``pipeline_parallel`` p, each GPU holds 1/(t p) of the model (the norms and biases a split keeps whole, and a
    stage's share of the embeddings, are left out: a small part of a large model) and ZeRO partitions over
    gpus / (t p) replicas."""
    check_value("params", params, isinstance(params, (int, float)) and params > 0, "a positive number of parameters")
    check_value("precision", precision, precision in BYTES_PER_PARAM, ", ".join(BYTES_PER_PARAM))
    check_value("zero_stage", zero_stage, zero_stage in STAGES, "0, 1, 2 or 3")
    check_value("gpus", gpus, isinstance(gpus, int) and gpus >= 1, "1 or more")
    check_value(
        "tensor_parallel",
        tensor_parallel,
        isinstance(tensor_parallel, int) and tensor_parallel >= 1 and gpus % tensor_parallel == 0,
        f"a divisor of the {gpus} GPUs",
    )
    check_value(
        "pipeline_parallel",
        pipeline_parallel,
        isinstance(pipeline_parallel, int)
        and pipeline_parallel >= 1
        and gpus % (tensor_parallel * pipeline_parallel) == 0,
        f"a divisor of the {gpus // tensor_parallel} GPUs left by tensor_parallel {tensor_parallel}",
    )
    w, g, o = BYTES_PER_PARAM[precision]
    n = gpus // (tensor_parallel * pipeline_parallel)  # data-parallel replicas: what ZeRO partitions over
    shard = {  # the divisor of each part at each stage: 1 = every replica holds all of it
        0: (1, 1, 1),
        1: (1, 1, n),
        2: (1, n, n),
        3: (n, n, n),
    }[zero_stage]
    held = params / (tensor_parallel * pipeline_parallel)
    return MemoryEstimate(
        params,
        precision,
        zero_stage,
        gpus,
        weights_bytes=w * held / shard[0],
        gradients_bytes=g * held / shard[1],
        optimizer_bytes=o * held / shard[2],
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
    )


@dataclass(frozen=True)
class StageAdvice:
    stage: int | None  # None: no stage fits on these GPUs
    estimates: list[MemoryEstimate]
    gpu_memory_gib: float

    def summary(self) -> str:
        budget = STATE_SHARE * self.gpu_memory_gib
        lines = [f"model state must fit in {STATE_SHARE:.0%} of {self.gpu_memory_gib:g} GiB = {budget:.1f} GiB per GPU"]
        for e in self.estimates:
            mark = " <- recommended" if e.zero_stage == self.stage else ""
            lines.append(f"  ZeRO-{e.zero_stage}: {e.formula()}{mark}")
        if self.stage is None:
            stage3 = self.estimates[-1]
            need = math.ceil(stage3.total_bytes * stage3.gpus / 2**30 / budget)  # (per GPU x GPUs: the whole state)
            lines.append(
                f"  no stage fits: ZeRO-3 needs at least {need} GPUs of this size, or offload optimizer "
                "state to CPU/NVMe (ZeRO-Offload / ZeRO-Infinity)"
            )
        return "\n".join(lines)


def recommend_stage(
    params: float,
    gpu_memory_gib: float,
    gpus: int,
    precision: str = "bf16",
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> StageAdvice:
    """The lowest ZeRO stage whose model state fits: lower stages communicate less (stage 3 gathers the
    weights in every forward and backward), so partition only as much as memory requires."""
    check_value(
        "gpu_memory_gib",
        gpu_memory_gib,
        isinstance(gpu_memory_gib, (int, float)) and gpu_memory_gib > 0,
        "a positive number of GiB",
    )
    estimates = [estimate(params, precision, stage, gpus, tensor_parallel, pipeline_parallel) for stage in STAGES]
    fitting = [e.zero_stage for e in estimates if e.total_gib <= STATE_SHARE * gpu_memory_gib]
    return StageAdvice(stage=fitting[0] if fitting else None, estimates=estimates, gpu_memory_gib=gpu_memory_gib)


SUFFIXES = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_count(text: str) -> float:
    """'350M', '7B', '1.3e9', '70b' -> a number of parameters."""
    raw = str(text).strip().replace("_", "").replace(",", "")
    scale = SUFFIXES.get(raw[-1:].lower(), 1.0) if raw else 1.0
    try:
        value = float(raw[:-1] if scale != 1.0 else raw) * scale
    except ValueError:
        value = float("nan")
    if not value > 0:  # also catches nan
        raise ConfigError(not_allowed("params", text, "a positive count such as 350M, 7B or 1.3e9"))
    if scale == 1.0 and value < 1000 and "e" not in raw.lower():  # `estimate 7`: surely 7B, not 7 parameters
        raise ConfigError(
            not_allowed(
                "params",
                text,
                f"a count with its unit: {raw}B for {raw} billion, {raw}M "
                f"for {raw} million (or {raw}e0 for {raw} parameters)",
                problem="has no unit",
            )
        )
    return value


def model_params(cfg) -> int:
    """Parameters of a config's model, counted on the meta device (no memory, any size)."""
    import torch

    from toolkit.train.models import build_model

    with torch.device("meta"):
        model = build_model(cfg.model)
    return sum(p.numel() for p in model.parameters())


def params_per_rank(cfg) -> int:
    """Parameters rank 0 holds. Under engine.pipeline_parallel: the first stage's (the embeddings and its blocks:
    toolkit.train.pipeline_parallel). Under engine.tensor_parallel = N: 1/N of each matrix the split cuts (every
    linear layer's, and the token embedding's: toolkit.train.tensor_parallel's plans), all of the rest (norms, biases
    of the row-parallel layers, position embeddings). Counted on the meta device."""
    import torch
    from torch import nn

    from toolkit.train.models import build_model

    n = cfg.engine.tensor_parallel
    with torch.device("meta"):
        model = build_model(cfg.model)
        if cfg.engine.pipeline_parallel > 1:  # the first stage, split as a whole model would be
            from toolkit.train.pipeline_parallel import GPTStage

            model = GPTStage(model, 0, cfg.engine.pipeline_parallel)
    split = {
        id(module.weight): module.weight.numel()
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) or (isinstance(module, nn.Embedding) and not name.endswith("wpe"))
    }
    total = {id(p): p.numel() for p in model.parameters()}
    return sum(size // n if key in split else size for key, size in total.items())
