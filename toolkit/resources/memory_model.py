"""How much memory a run needs: its peak per rank, term by term.


A run's peak per rank (:func:`predict_run`, what ``trainbook estimate --config`` prints and a run's train events
measure as ``peak_memory_mb``) adds what the guide leaves out: activations (the built-in GPT's are counted tensor by
tensor), DeepSpeed's buckets and, on a CPU, the process itself. The arithmetic is spelled out above
:func:`predict_run`. On a GPU it is the guide's model state + activations + DeepSpeed's reduce bucket, checked
on one H200 (tests/gpu, 86M parameters, 1 process, bf16: ZeRO-0 to 3 and ZeRO-2 with its optimizer offloaded
measured 0.90 to 0.99 of the prediction, ZeRO-3 against the one-bucket formula that measurement led to;
bench/results/). On a CPU the guide's rule is wrong in a way worth knowing, and corrected:

1. The measured figure is the peak resident set of the whole process, so a *baseline* comes first: Python, torch,
   deepspeed, gloo, the data and TensorBoard (rank 0), about 320 MiB (torch) and 350 MiB (deepspeed) here, a third
   of the bench model's peak. It is measured, not guessed: the tiny config's peak through ``trainbook train``
   (``trainbook estimate --measure-baseline`` records this machine's; else the reference machine's figures).
2. Partitioning saves less than the copies DeepSpeed makes to partition. At 2 processes the guide says fp32 Adam
   goes 16 -> 12 -> 10 -> 8 bytes a parameter from ZeRO-0 to ZeRO-3; measured on CPU (bench/bench_memory.py, 19M
   parameters, baseline and activations taken out) it goes ~21 -> 26 -> 25 -> 37: ZeRO-1/2 keep the weights in one
   flat buffer, the gradients, a reduce bucket and a flat copy of it for gloo's all-reduce (each as large as the
   model while the model is under DeepSpeed's 5e8-element buckets), and give the optimizer an fp32 master partition
   and a flattened gradient partition; ZeRO-3 keeps every gathered weight live (max_live_parameters is 1e9),
   double-buffers its reduce bucket (overlap_comm), reduce-scatters through a full-size copy on gloo, and the model
   was built whole before it was partitioned. ZeRO-1 to 3 also import torch._inductor (DeepSpeed's optimizer check
   loads its Muon optimizer, which compiles): 43 MiB a process. Partitioning pays once the model outgrows the
   buckets and N is large; at ~20M parameters and 2 processes ZeRO-0 (or torch DDP) is the smallest.
3. Freed memory stays with the process: the training allocator (toolkit.train.allocator) keeps the heap, so a peak
   is a high-water mark. A buffer ZeRO frees that is under its 32 MiB mmap threshold leaves a hole the next,
   differently sized request rarely fits (the weights before flattening, the bucket's flat copy, the partition
   copies): below ~8M parameters those holes are most of ZeRO's excess over ZeRO-0 (glibc's defaults would return
   them: 515 instead of 708 MiB for ZeRO-1 at 7M parameters); above it they are mapped and unmapped whole.
The predictor holds within ``TOLERANCE`` (15%) per rank on this machine: within 5% for fp32 from 0.8M to 19M
parameters at every stage, 10% with torch DDP and accumulation. bf16 on a CPU is modelled from the same structure
(half-size weights, gradients and activations, fp32 master and moments), checked at 3M parameters only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from toolkit.config import ConfigError
from toolkit.errors import MissingPath, bounded_repr, not_allowed, refused
from toolkit.tables import Column, text_table
from toolkit.resources.memory_baseline import baseline_mib
from toolkit.resources.zero_stages import BYTES_PER_PARAM, check_value, estimate, model_params, params_per_rank

# --- a run's peak memory per rank ---------------------------------------------------------------------------------
#
# One rank's peak, in bytes, for Ψ parameters over N processes, AdamW, the built-in GPT with L blocks of width C,
# B sequences of T tokens per micro-step (X = B T C), a vocabulary of V = 256 bytes, and R = min(Ψ, DeepSpeed's
# reduce bucket): a bucket becomes resident only as far as gradients are written into it (5e8 elements by default).
#
#   baseline (CPU)          measured: the tiny config's peak RSS through `trainbook train`, per engine, rank 0 and
#                           the others (0 on a GPU: max_memory_allocated counts tensors only)
#   activations             (16 L + 2 + V / C) X x a        per block: its input, ln1's output, q k v (3), attention's
#                                                           output, the residual, ln2's output, the MLP's hidden before
#                                                           and after its non-linearity (4 + 4); then the last residual,
#                                                           ln_f's output and the log-softmax of the logits (V / C)
#     checkpointing         (L + 16 + 2 + V / C) X x a      each block's input, and one block recomputed in backward
#     (a = 4 bytes in fp32, 2 in bf16; accumulation adds none: micro-batches run one after another)
#
#   CPU, fp32 (h = 2 for DeepSpeed's bf16 weights, gradients and buckets; the master copy and moments stay fp32):
#   torch, 1 process        4 Ψ weights + 4 Ψ gradients + 8 Ψ Adam moments                          = 16 Ψ
#     DDP                   + 4 Ψ all-reduce buckets (DDP copies every gradient into them)           = 20 Ψ
#     bf16 (autocast)       + 2 Ψ: the bf16 copy of each weight, kept for backward
#   DeepSpeed ZeRO-0        16 Ψ + 4 min(Ψ, 5e8): the flat copy its all-reduce works on              = 20 Ψ
#     bf16                  + 4 Ψ fp32 master + 4 Ψ fp32 gradients (DeepSpeed's bf16 optimizer)
#   DeepSpeed ZeRO-1, 2     4 Ψ weights (one flat buffer) + 4 Ψ gradients + 4 R reduce bucket + 4 R flat copy
#                           for the all-reduce + (4 fp32 master + 8 Adam + 4 gradient partition + 4 its flat copy
#                           handed to the optimizer) Ψ / N                                           = 16 Ψ + 20 Ψ / N
#     accumulation          + 4 Ψ / N: the partition of the earlier micro-steps' gradients, kept between them
#   DeepSpeed ZeRO-3        4 Ψ gathered weights + 4 Ψ gradients + 8 R two reduce buckets (overlap_comm) + 4 R
#                           gloo's reduce-scatter copy + 4 Ψ the model as built, before partitioning + (4 weights +
#                           4 master + 8 Adam + 4 gradient partition) Ψ / N                          = 24 Ψ + 20 Ψ / N
#   ZeRO-1 to 3, also       43 MiB: torch._inductor, imported by DeepSpeed's ZeRO optimizer check
#                           + heap holes: each buffer ZeRO frees that is under the allocator's 32 MiB mmap threshold
#                           (4 Ψ weights before flattening, 4 R bucket copy, 4 Ψ / N zeroed gradient partition, 4 Ψ / N
#                           the step's gradient copy) stays in the heap; above it, it is unmapped and costs nothing
#   GPU: the guide's model state (estimate() above) + DeepSpeed's reduce bucket (allocated whole: 5e8 x 2 bytes,
#        one per communication dtype at every stage, ZeRO-3's too) + activations; offloaded optimizer state or
#        parameters live in host memory instead. (The CPU rows' two ZeRO-3 buckets are fitted to CPU measurements.)
#   checkpoints every N steps (async): + the staged copy of what the rank saves (torch: 12 Ψ on rank 0).
#
# e.g. 19.1M parameters, ZeRO-2 x 2, fp32, batch 8 x 128, width 512, 6 blocks: 351 MiB baseline + 26 x 19.1M bytes
# (473 MiB) + 43 MiB import + no heap holes (every buffer over 32 MiB) + 98.5 x 8 x 128 x 512 x 4 bytes (197 MiB)
# = 1,064 MiB on rank 0; measured 1,014 to 1,025.

TOLERANCE = 0.15  # the predictor's stated accuracy per rank (bench/bench_memory.py measures it)
DEVICES = ("cpu", "cuda")
MIB = 2**20
# DeepSpeed's defaults, in elements (deepspeed.runtime.zero.config, deepspeed.runtime.engine)
DS_REDUCE_BUCKET = 500_000_000
DS_ALLREDUCE_BUCKET = 500_000_000  # ZeRO-0's buffered all-reduce (MEMORY_OPT_ALLREDUCE_SIZE)
# RSS that ZeRO-1 to 3 add on top of ZeRO-0's baseline by importing torch._inductor (deepspeed.runtime.zero.utils.
# is_zero_supported_optimizer imports deepspeed's Muon optimizer, which calls torch.compile), measured on the
# reference machine by tracing deepspeed.initialize
ZERO_IMPORT_MIB = 43.0
# RSS that tensor parallelism adds by importing torch.distributed.tensor (DTensor and its sharding rules), measured on
# the reference machine after torch's own import
DTENSOR_IMPORT_MIB = 41.0
# RSS that pipeline parallelism adds by importing torch.distributed.pipelining (which imports DTensor too), measured
# the same way
PIPELINING_IMPORT_MIB = 73.0


@dataclass(frozen=True)
class Term:
    name: str
    bytes: float
    """On each rank (``rank0_only``: on rank 0 alone)."""
    formula: str
    per_param: bool = True
    """Scales with the parameter count (False: activations, a bucket capped at its size, a fixed cost)."""
    rank0_only: bool = False


@dataclass(frozen=True)
class RunPrediction:
    params: int
    device: str
    engine: str
    zero_stage: int
    nproc: int
    precision: str
    baseline_mib: tuple[float, ...]
    baseline_source: str
    terms: tuple[Term, ...]
    notes: tuple[str, ...] = ()
    tensor_parallel: int = 1
    whole_params: int | None = None
    """The model's parameters when ``params`` is one rank's share of them (tensor or pipeline parallelism)."""
    pipeline_parallel: int = 1
    """Stages: every rank is predicted as the first stage's (the embeddings, and the most micro-batches in flight)."""

    @property
    def per_rank_mib(self) -> list[float]:
        """The predicted peak of each rank, MiB, in rank order."""
        everywhere = sum(t.bytes for t in self.terms if not t.rank0_only) / MIB
        rank0 = sum(t.bytes for t in self.terms if t.rank0_only) / MIB
        return [base + everywhere + (rank0 if r == 0 else 0.0) for r, base in enumerate(self.baseline_mib)]

    def describe(self) -> str:
        stage = f" ZeRO-{self.zero_stage}" if self.engine == "deepspeed" else ""
        split = f" (tensor_parallel {self.tensor_parallel})" if self.tensor_parallel > 1 else ""
        split += f" (pipeline_parallel {self.pipeline_parallel})" if self.pipeline_parallel > 1 else ""
        return (
            f"{self.engine}{stage}, {self.nproc} process{'es' if self.nproc > 1 else ''}{split}, {self.precision}, "
            f"on {self.device}"
        )

    def table(self) -> str:
        """Each term with its formula and size, then the peak per rank."""
        base = " / ".join(f"{b:,.0f}" for b in dict.fromkeys(self.baseline_mib))
        terms = [("baseline", base, self.baseline_source)]
        terms += [
            (t.name + (" (rank 0)" if t.rank0_only else ""), f"{t.bytes / MIB:,.1f}", t.formula) for t in self.terms
        ]
        lines = [
            f"predicted peak per rank: {self.describe()}, Ψ = {self.params:,} parameters"
            + (f" per rank (of {self.whole_params:,})" if self.tensor_parallel > 1 else ""),
            text_table(
                terms,
                [
                    Column("term", lambda t: t[0]),
                    Column("MiB", lambda t: t[1], right=True),
                    Column("formula", lambda t: t[2]),
                ],
                indent="  ",
            ),
        ]
        ranks = ", ".join(f"rank {r} {m:,.0f}" for r, m in enumerate(self.per_rank_mib))
        lines.append(f"  peak: {ranks} MiB (stated accuracy ±{TOLERANCE:.0%} per rank)")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def activation_bytes(
    model_cfg,
    batch_size: int,
    bytes_per_element: float = 4,
    tensor_parallel: int = 1,
    stages: int = 1,
    micro_batches: int = 1,
) -> float | None:
    """What autograd keeps from forward for backward at its peak, for the built-in GPT; None for a model without a
    formula here (transformers, custom, digits_mlp). Split over ``tensor_parallel`` ranks, each keeps its heads' and
    its MLP slice's tensors and its share of the logits, and the block inputs and norms whole. In ``stages`` pipeline
    stages, the first (the fullest) keeps its own blocks' tensors for as many micro-batches as the 1F1B schedule has
    in flight there, min(stages, micro_batches), and its output for each; the head is the last stage's."""
    if model_cfg.name != "gpt":
        return None
    from toolkit.train.models.gpt import VOCAB_SIZE

    L, C, T, t = model_cfg.n_layer, model_cfg.n_embd, model_cfg.block_size, tensor_parallel
    # whole: input, ln1 out, residual, ln2 out (4); split: q k v (3), attention out, MLP hidden (4) and activated (4)
    per_block = 4 + 12 / t
    head = 2 + VOCAB_SIZE / C / t  # the last residual, ln_f's output, the log-softmax of the logits (B x T x V / t)
    in_flight = 1
    if stages > 1:
        from toolkit.train.pipeline_parallel import stage_blocks

        L, head, in_flight = len(stage_blocks(L, stages)[0]), 1, min(stages, micro_batches)
    kept = L + per_block if model_cfg.activation_checkpointing else per_block * L
    return in_flight * (kept + head) * batch_size * T * C * bytes_per_element


def _activation_formula(model_cfg, a: float, tensor_parallel: int = 1, stages: int = 1, micro_batches: int = 1) -> str:
    if tensor_parallel > 1:
        per_block, head = "(4 + 12/t)", "2 + V/(C t)"
    else:
        per_block, head = "16", "2 + V/C"
    layers, sizes = "L", f"L={model_cfg.n_layer}"
    if stages > 1:
        from toolkit.train.pipeline_parallel import stage_blocks

        layers, head = "L0", "1"
        sizes = f"L0={len(stage_blocks(model_cfg.n_layer, stages)[0])} (the first stage's blocks)"
    per = (
        f"({layers} + {per_block} + {head})"
        if model_cfg.activation_checkpointing
        else f"({per_block} {layers} + {head})"
    )
    flight = f"min(p, m)={min(stages, micro_batches)} x " if stages > 1 else ""
    sizes += f", C={model_cfg.n_embd}, T={model_cfg.block_size}" + (
        f", t={tensor_parallel}" if tensor_parallel > 1 else ""
    )
    return f"{flight}{per} x B T C x {a:g} B; {sizes}"


def _ds_settings(cfg) -> tuple[int, str | None, str | None]:
    """(reduce bucket in elements, optimizer offload device, parameter offload device) from engine.deepspeed."""
    from toolkit.deepspeed_config import WIDTH_AUTOS, get_path, hidden_size

    ds = cfg.engine.deepspeed or {}
    key = "zero_optimization.reduce_bucket_size"
    bucket = get_path(ds, key, DS_REDUCE_BUCKET)
    if bucket == "auto":
        width = hidden_size(cfg.model)
        bucket = WIDTH_AUTOS[key](width) if width else DS_REDUCE_BUCKET
    offload = [get_path(ds, f"zero_optimization.{k}.device", "none") for k in ("offload_optimizer", "offload_param")]
    return int(bucket), *(d if d not in (None, "none") else None for d in offload)


def _cpu_terms(psi: int, cfg, bucket: int) -> list[Term]:
    e = cfg.engine
    n, stage = e.nproc, e.zero_stage
    terms: list[Term] = []

    def add(name: str, per: float, count: float = psi, divisor: int = 1, why: str = "", rank0: bool = False):
        label = "Ψ" if count == psi else f"{count:,.0f}"
        formula = f"{per:g} B x {label}" + (f" / {divisor}" if divisor > 1 else "") + (f": {why}" if why else "")
        terms.append(Term(name, per * count / divisor, formula, per_param=count == psi, rank0_only=rank0))

    if e.name == "fsdp":
        return _fsdp_terms(psi, cfg)
    if e.name == "torch":  # Ψ is this rank's share under tensor parallelism (predict_run)
        add("weights", 4)
        add("gradients", 4)
        add("Adam moments", 8)
        if n > e.tensor_parallel * e.pipeline_parallel:  # more than one replica
            name, per, why = _gradient_exchange(e)
            add(name, per, why=why)
        if e.precision == "bf16":
            add("autocast weight copies", 2, why="the bf16 copy of each weight, kept for backward")
        if e.pipeline_parallel > 1:
            terms.append(
                Term(
                    "torch.distributed.pipelining, imported",
                    PIPELINING_IMPORT_MIB * MIB,
                    "the stages and their schedule (DTensor with them)",
                    per_param=False,
                )
            )
        elif e.tensor_parallel > 1:
            terms.append(
                Term(
                    "torch.distributed.tensor, imported",
                    DTENSOR_IMPORT_MIB * MIB,
                    "DTensor: the split's tensors",
                    per_param=False,
                )
            )
        return terms
    h = 2 if e.precision == "bf16" else 4  # DeepSpeed's bf16 mode holds the module, its gradients and buckets in bf16
    R = min(psi, bucket)
    if stage == 0:
        add("weights", h)
        add("gradients", h)
        add("Adam moments", 8)
        if h == 2:
            add("fp32 master weights", 4, why="DeepSpeed's bf16 optimizer")
            add("fp32 gradients", 4, why="DeepSpeed's bf16 optimizer accumulates in fp32")
        add("all-reduce flat copy", 4, min(psi, DS_ALLREDUCE_BUCKET), why="the flat buffer ZeRO-0 all-reduces")
        return terms
    if stage in (1, 2):
        add("weights (flat buffer)", h)
        add("gradients", h)
        add("reduce bucket", h, R, why="contiguous gradients, resident as far as they fill it")
        add("all-reduce copy of the bucket", h, R, why="flattened for gloo's all-reduce")
        add("fp32 master partition", 4, divisor=n)
        add("Adam moments partition", 8, divisor=n)
        add("gradient partition", 4, divisor=n)
        add("its flat copy for the step", 4, divisor=n, why="the fp32 gradient the optimizer is handed")
        if cfg.train.grad_accum_steps > 1:
            add("accumulated gradient partition", 4, divisor=n, why="the earlier micro-steps' gradients, kept")
    else:
        add("gathered weights", h, why="all live: stage3_max_live_parameters is 1e9")
        add("gradients", h)
        add("reduce buckets (two)", 2 * h, R, why="double-buffered for overlap_comm")
        add("reduce-scatter copy", h, R, why="gloo reduce-scatters through a full-size copy")
        add("the model as built", 4, why="built whole before DeepSpeed partitions it; the heap keeps the space")
        add("weights partition", h, divisor=n)
        add("fp32 master partition", 4, divisor=n)
        add("Adam moments partition", 8, divisor=n)
        add("gradient partition", 4, divisor=n)
    return terms + _zero_overheads(psi, n, R)


def _zero_overheads(psi: int, n: int, bucket: int) -> list[Term]:
    """What ZeRO-1 to 3 cost on a CPU beyond their buffers: a module import, and the heap's holes."""
    from toolkit.train.allocator import THRESHOLDS

    mmap_below = THRESHOLDS["mmap"][1]
    # Buffers ZeRO allocates and frees (at initialize, and every step). Under the training allocator's mmap threshold
    # they come from the heap, which keeps their space (toolkit.train.allocator) and rarely fits the next, differently
    # sized request into it; above it they are mapped and unmapped whole and leave nothing behind.
    transients = {
        "the weights before flattening": 4 * psi,
        "the bucket's flat copy": 4 * min(psi, bucket),
        "the zeroed gradient partition (initialize)": 4 * psi / n,
        "the step's gradient copy": 4 * psi / n,
    }
    kept = {name: size for name, size in transients.items() if size < mmap_below}
    slack = [
        Term(
            "heap holes",
            sum(kept.values()),
            f"freed buffers under the {mmap_below // MIB} MiB mmap "
            f"threshold: {', '.join(kept) or 'none (all above it)'}",
            per_param=False,
        )
    ]
    return [
        Term(
            "torch._inductor, imported",
            ZERO_IMPORT_MIB * MIB,
            "by DeepSpeed's ZeRO optimizer check (its Muon optimizer compiles); ZeRO-0's baseline does not have it",
            per_param=False,
        )
    ] + slack


def _gradient_exchange(e) -> tuple[str, int, str]:
    """What averaging the gradients over data-parallel replicas costs the torch engine: (term, bytes a parameter,
    why)."""
    if e.tensor_parallel > 1 or e.pipeline_parallel > 1:
        return (
            "gradient all-reduce copy",
            4,
            "the rank's gradients laid end to end for one all-reduce over the replicas",
        )
    return "DDP buckets", 4, "DDP copies every gradient into its all-reduce buckets"


def _fsdp_terms(psi: int, cfg) -> list[Term]:
    """FSDP2 (toolkit.train.engines.fsdp_engine): fp32 weights, gradients and Adam moments sharded over the N ranks,
    plus what is gathered whole while it runs: the root's parameters (embeddings, the output layer) for the whole
    step, and two blocks at a time (the one computing and the one prefetched), in the compute dtype, with their
    unsharded gradients before the reduce-scatter. A model without known blocks is gathered whole."""
    e, n = cfg.engine, cfg.engine.nproc
    c = 2 if e.precision == "bf16" else 4
    terms = [
        Term("weights (shard)", 4 * psi / n, f"4 B x Ψ / {n}"),
        Term("gradients (shard)", 4 * psi / n, f"4 B x Ψ / {n}"),
        Term("Adam moments (shard)", 8 * psi / n, f"8 B x Ψ / {n}"),
    ]
    layers = cfg.model.n_layer if cfg.model.name == "gpt" else 0
    if layers:
        from toolkit.train.models.gpt import VOCAB_SIZE

        root = (VOCAB_SIZE + cfg.model.block_size + 2) * cfg.model.n_embd  # wte (tied lm_head), wpe, ln_f
        block = (psi - root) / layers
        gathered, why = root + min(2, layers) * block, "the root and two blocks gathered whole"
    else:
        gathered, why = psi, "no blocks known for this model: gathered whole"
    if n > 1 or c == 2:
        terms.append(Term("gathered parameters", c * gathered, f"{c} B x {gathered:,.0f}: {why}", per_param=False))
        terms.append(
            Term(
                "unsharded gradients",
                c * gathered,
                f"{c} B x {gathered:,.0f}: before the reduce-scatter",
                per_param=False,
            )
        )
    return terms


def _gpu_terms(psi: int, cfg, bucket: int, offload_opt: str | None, offload_param: str | None) -> list[Term]:
    e = cfg.engine
    n, stage = e.nproc, e.zero_stage
    if e.name == "fsdp":
        return _fsdp_terms(psi, cfg)
    if e.name == "torch":  # autocast keeps fp32 weights: the guide's fp32 row, plus the half copies and DDP's buckets
        guide = estimate(psi, "fp32", 0, 1)
        terms = [
            Term("weights", guide.weights_bytes, "4 B x Ψ"),
            Term("gradients", guide.gradients_bytes, "4 B x Ψ"),
            Term("Adam moments", guide.optimizer_bytes, "8 B x Ψ"),
        ]
        if n > e.tensor_parallel * e.pipeline_parallel:
            name, per, why = _gradient_exchange(e)
            terms.append(Term(name, per * psi, f"{per} B x Ψ: {why}"))
        if e.precision != "fp32":
            terms.append(Term("autocast weight copies", 2 * psi, "2 B x Ψ: the half copy of each weight"))
        return terms
    guide = estimate(psi, e.precision, stage, n)
    w, g, o = BYTES_PER_PARAM[e.precision]
    formula = guide.formula().split(" = ")[0]
    terms = [
        Term(
            "weights",
            0.0 if offload_param else guide.weights_bytes,
            f"{w} B x Ψ"
            + (f" / {n}" if stage == 3 else "")
            + (f", offloaded to {offload_param}" if offload_param else ""),
        ),
        Term("gradients", guide.gradients_bytes, f"{g} B x Ψ" + (f" / {n}" if stage >= 2 else "")),
        Term(
            "optimizer state",
            0.0 if offload_opt else guide.optimizer_bytes,
            f"{o} B x Ψ"
            + (f" / {n}" if stage >= 1 else "")
            + (f", offloaded to {offload_opt}" if offload_opt else "")
            + f" (the guide's {formula})",
        ),
    ]
    if stage >= 1:  # one bucket per communication dtype at every stage (ZeRO-3's too: stage3.py's ipg_buckets)
        half = 4 if e.precision == "fp32" else 2
        terms.append(Term("reduce bucket", half * bucket, f"{half} B x {bucket:,}: allocated whole", per_param=False))
    return terms


def _staging_terms(psi: int, cfg) -> list[Term]:
    """Async checkpoints keep a staged copy of what each rank saves (toolkit.checkpoint.checkpointer)."""
    c, e = cfg.checkpoint, cfg.engine
    if c.mode != "async" or not (c.every_steps or c.every_seconds):
        return []
    n, h = e.nproc, 2 if (e.name == "deepspeed" and e.precision != "fp32") else 4
    if e.name == "fsdp":  # each rank stages its own shards only
        return [Term("checkpoint staging", 12 * psi / n, f"12 B x Ψ / {n}: this rank's weights and Adam moments")]
    if e.name == "torch" or e.zero_stage == 0:
        per = h + 8 + (4 if h == 2 else 0)
        terms = [
            Term(
                "checkpoint staging",
                per * psi,
                "weights + optimizer state, staged for the background write",
                rank0_only=True,
            )
        ]
        if e.tensor_parallel > 1 or e.pipeline_parallel > 1:
            terms.append(
                Term(
                    "gathered whole state",
                    per * psi,
                    "every rank's tensors gathered whole for rank 0 to write",
                    rank0_only=True,
                )
            )
        return terms
    terms = [Term("checkpoint staging", 12 * psi / n, f"12 B x Ψ / {n}: this rank's optimizer partition, staged")]
    if e.zero_stage < 3:
        terms.append(Term("checkpoint staging (weights)", h * psi, f"{h} B x Ψ: the module's weights", rank0_only=True))
    else:
        terms.append(Term("checkpoint staging (weights)", h * psi / n, f"{h} B x Ψ / {n}: this rank's weights"))
    return terms


def _this_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def predict_run(cfg, *, device: str | None = None, params: int | None = None) -> RunPrediction:
    """Each rank's peak memory for the run ``cfg`` (a Config) describes, on ``device`` (default: this machine's):
    the formula above, term by term. ``params``: the parameter count when known (else counted on the meta device)."""
    device = device or _this_device()
    check_value("device", device, device in DEVICES, ", ".join(DEVICES))
    e = cfg.engine
    if device == "cpu" and e.precision == "fp16":
        raise ConfigError(
            not_allowed(
                "engine.precision", "fp16", "fp32 or bf16 (fp16 needs a GPU)", problem="is not allowed on a CPU"
            )
        )
    psi = int(params if params is not None else model_params(cfg))
    # Tensor and pipeline parallelism: each rank holds and updates its share of the parameters (Ψ below), and a
    # checkpoint gathers the whole model on rank 0
    whole_psi, psi = psi, (params_per_rank(cfg) if e.tensor_parallel > 1 or e.pipeline_parallel > 1 else psi)
    bucket, offload_opt, offload_param = _ds_settings(cfg) if e.name == "deepspeed" else (DS_REDUCE_BUCKET, None, None)
    notes = []
    if device == "cpu":
        terms = _cpu_terms(psi, cfg, bucket)
        baseline, source = baseline_mib(e.name, e.nproc)
        if e.precision == "bf16":
            notes.append(
                "bf16 on a CPU: modelled (half-size weights, gradients, activations), checked on a 3M-"
                "parameter model only"
            )
        if offload_opt or offload_param:
            notes.append(
                "offload moves nothing on a CPU (the state is in host memory already); a launch here refuses it"
            )
    else:
        terms = _gpu_terms(psi, cfg, bucket, offload_opt, offload_param)
        baseline, source = (0.0,) * e.nproc, "none: max_memory_allocated counts tensors, not the CUDA context"
        notes.append(
            "GPU figures follow the guide and DeepSpeed's allocation rules; checked on one H200 at 1 process only"
        )
    terms += _staging_terms(whole_psi, cfg)
    a = 4 if e.precision == "fp32" else 2
    layout = (e.tensor_parallel, e.pipeline_parallel, cfg.train.grad_accum_steps)
    act = activation_bytes(cfg.model, cfg.train.batch_size, a, *layout)
    if act is None:
        notes.append(
            f"activations: no formula for model.name={cfg.model.name!r} (only the built-in gpt's): not counted"
        )
    else:
        terms.append(Term("activations", act, _activation_formula(cfg.model, a, *layout), per_param=False))
    if e.name == "fsdp":
        notes.append(
            "FSDP: modelled from its sharding, not yet fitted to measurements; on a CPU a 10.7M-parameter GPT's "
            "measured peaks were 1.4x to 1.5x this at 2 and 4 processes, growing step by step"
        )
    if e.name == "deepspeed" and e.zero_stage >= 1 and e.nproc == 1:
        notes.append("ZeRO on 1 process partitions nothing: ZeRO-0 (or the torch engine) needs less")
    return RunPrediction(
        params=psi,
        whole_params=whole_psi,
        tensor_parallel=e.tensor_parallel,
        pipeline_parallel=e.pipeline_parallel,
        device=device,
        engine=e.name,
        zero_stage=e.zero_stage if e.name == "deepspeed" else 0,
        nproc=e.nproc,
        precision=e.precision,
        baseline_mib=baseline,
        baseline_source=source,
        terms=tuple(terms),
        notes=tuple(notes),
    )


# --- a finished run, measured against its prediction ----------------------------------------------------------------


@dataclass(frozen=True)
class RunComparison:
    run_dir: Path
    prediction: RunPrediction
    measured_mib: list[float]
    step: int

    @property
    def ratios(self) -> list[float]:
        """Measured over predicted, per rank."""
        return [m / p for m, p in zip(self.measured_mib, self.prediction.per_rank_mib)]

    @property
    def within_tolerance(self) -> list[bool]:
        return [abs(r - 1) <= TOLERANCE for r in self.ratios]

    def rows(self) -> list[dict]:
        return [
            {
                "rank": r,
                "predicted MiB": round(p),
                "measured MiB": round(m),
                "measured / predicted": f"{q:.2f}",
                f"within ±{TOLERANCE:.0%}": "yes" if ok else "no",
            }
            for r, (p, m, q, ok) in enumerate(
                zip(self.prediction.per_rank_mib, self.measured_mib, self.ratios, self.within_tolerance)
            )
        ]

    def table(self) -> str:
        within = f"within ±{TOLERANCE:.0%}"
        return f"measured (last train event, step {self.step}) against predicted, per rank:\n" + text_table(
            self.rows(),
            [
                Column("rank", "rank", right=True),
                Column("predicted MiB", "predicted MiB", ",", right=True),
                Column("measured MiB", "measured MiB", ",", right=True),
                Column("ratio", "measured / predicted", right=True),
                Column(within, within),
            ],
            indent="  ",
        )


def _measured_peaks(run, run_dir) -> tuple[list[float], int]:
    from toolkit.events import TrainEvent, read_events

    for event in reversed(read_events(run, TrainEvent)):
        peaks = event.peak_memory_mb
        if (
            isinstance(peaks, list)
            and peaks
            and all(
                isinstance(p, (int, float)) and not isinstance(p, bool) and math.isfinite(p) and p > 0 for p in peaks
            )
        ):
            return [float(p) for p in peaks], event.step
    raise ConfigError(
        refused(
            "run_dir",
            f"{bounded_repr(Path(run_dir))} has no train event with peak_memory_mb yet",
            "a run that has logged at least one step",
        )
    )


def compare_run(run_dir, *, device: str | None = None) -> RunComparison:
    """A run's measured peak per rank (its last train event) next to the prediction for its own config. The run's
    model is never built: its parameter count comes from its events (a copied run directory is data, not code)."""
    from toolkit.events import StatusEvent, read_events
    from toolkit.rundir import RunDir

    path = Path(run_dir)
    if not path.is_dir():
        raise MissingPath(not_allowed("run_dir", path, "a run directory", problem="is not a folder"))
    run = RunDir(path)
    cfg = run.read_config()
    measured, step = _measured_peaks(run, path)
    counts = [e.n_params for e in read_events(run, StatusEvent) if isinstance(e.n_params, int) and e.n_params > 0]
    if not counts:
        raise ConfigError(
            refused(
                "run_dir",
                f"{bounded_repr(path)} records no parameter count (no running status event)",
                "a run that has started",
            )
        )
    prediction = predict_run(cfg, device=device, params=counts[-1])
    return RunComparison(run_dir=path, prediction=prediction, measured_mib=measured[: prediction.nproc], step=step)
