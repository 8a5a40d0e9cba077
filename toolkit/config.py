"""Typed run configuration: nested dataclasses, loaded from YAML, overridden with ``section.field=value``.

Every field carries a one-line docstring (the string under it) and, where a range applies, bounds in its
metadata. ``Literal[...]`` annotations are the allowed choices. Validation happens here, before a run
directory exists, so a typo never costs a half-started run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from toolkit.errors import UserError, bounded_repr, not_allowed, refused
from toolkit.names import check_name, parse_ref


def field_choices(cls, name: str) -> list:
    """The values a ``Literal[...]`` field of a config section allows (the command line shows them as choices)."""
    return list(typing.get_args(typing.get_type_hints(cls)[name]))


class ConfigError(UserError, ValueError):
    """A config value that is unknown, of the wrong type or out of range; the message names the field."""


def bounded(default: Any, *, ge: float | None = None, le: float | None = None, gt: float | None = None):
    """A dataclass field with numeric bounds that :func:`validate` enforces."""
    return field(default=default, metadata={"ge": ge, "le": le, "gt": gt})


@dataclass
class HFModelConfig:
    source: str = ""
    """A folder in save_pretrained layout (config.json + weights), or a hub id where the machine has a network;
    empty: build a new model with random weights from hf.architecture and hf.config."""
    architecture: str = ""
    """transformers model type to build from a config, e.g. 'llama' or 'gpt2' (used when hf.source is empty)."""
    config: dict = field(default_factory=dict)
    """Fields of the architecture's config, e.g. {hidden_size: 128, num_hidden_layers: 4} (with architecture)."""
    task: Literal["causal_lm", "sequence_classification"] = "causal_lm"
    """What the model is trained to do: next-token prediction, or one label per text."""
    num_labels: int = bounded(2, ge=2, le=100000)
    """Classes of a sequence classifier (hf.task=sequence_classification)."""


@dataclass
class LoraConfig:
    rank: int = bounded(0, ge=0, le=4096)
    """LoRA rank r (peft); 0 turns LoRA off and every weight trains."""
    alpha: float = bounded(16.0, gt=0.0)
    """LoRA scaling numerator: the adapter's update is scaled by alpha / rank."""
    dropout: float = bounded(0.0, ge=0.0, le=0.9)
    """Dropout on the adapter's input."""
    target_modules: list[str] = field(default_factory=list)
    """Names (or name suffixes) of the modules that get adapters; empty: peft's default for the architecture."""
    merge_on_export: bool = True
    """export writes the adapter merged into the weights (plain transformers loads it); false: kept separate."""


@dataclass
class ModelConfig:
    name: Literal["gpt", "digits_mlp", "hf", "custom"] = "gpt"
    """Which model: a built-in (gpt, digits_mlp), a Hugging Face transformers model (model.hf) or any nn.Module
    from your code (model.factory)."""
    n_layer: int = bounded(4, ge=1, le=64)
    """Transformer blocks (gpt) or hidden layers (digits_mlp)."""
    n_head: int = bounded(4, ge=1, le=64)
    """Attention heads per block; must divide n_embd."""
    n_embd: int = bounded(128, ge=8, le=8192)
    """Width of the residual stream (gpt) or of the hidden layers (digits_mlp)."""
    block_size: int = bounded(128, ge=8, le=8192)
    """Context length in tokens: the length of every training sequence (bytes for the byte tokenizer)."""
    dropout: float = bounded(0.0, ge=0.0, le=0.9)
    """Dropout probability; 0 is best for short runs on small data."""
    activation: Literal["silu", "gelu", "relu"] = "silu"
    """MLP non-linearity; on CPU exact GELU costs ~5x SiLU's time for the same quality at this size."""
    factory: str = ""
    """model.name=custom: 'package.module:function' or 'path/to/file.py:function', called with no arguments,
    returning the nn.Module to train."""
    loss: str = ""
    """model.name=custom: 'module:function' taking (model, batch) and returning the loss; empty: model(**batch),
    which returns the loss or an object with .loss."""
    code_path: str = ""
    """model.name=custom: a folder put first on sys.path before model.factory and model.loss are imported (relative
    file paths in them are read from it); empty: set at launch to the folder a module path was found in."""
    flops_per_item: float = bounded(0.0, ge=0.0)
    """Training FLOPs per token (or sample) for MFU; 0: the model's own formula, else 6 x parameters (an estimate)."""
    activation_checkpointing: bool = False
    """Recompute each block's activations in backward instead of keeping them from forward: activation memory of
    one block instead of all, for about a third more compute (gpt and hf models, or a module with
    gradient_checkpointing_enable)."""
    init_from: str = ""
    """Start from pretrained weights: a save_pretrained folder, a Trainbook export, or a registered model
    NAME:VERSION; empty: the model's own initialisation."""
    hf: HFModelConfig = field(default_factory=HFModelConfig)
    """A Hugging Face transformers model (model.name=hf)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters (peft): train only small adapter matrices."""


CHAT_SHAPES = ("messages", "sharegpt", "alpaca")  # data.chat: toolkit.data.documents.CHAT_SHAPES reads each


@dataclass
class DataConfig:
    dataset: Literal["pydoc", "stdlib", "digits"] = "pydoc"
    """Built-in corpus: 'pydoc' (CPython's docs), 'stdlib' (the standard library's .py sources, a code corpus)
    or 'digits' (scikit-learn's 8x8 digits)."""
    asset: str = ""
    """Registered data asset, 'name' (latest) or 'name:version'; pinned to a version when the run starts.
    Empty: the built-in dataset named by data.dataset."""
    workspace: str = ""
    """Workspace holding data.asset; empty: $TRAINBOOK_WORKSPACE or ./.trainbook."""
    path: str = ""
    """A file or folder read in place, no catalogue (how an Azure ML job gets its mounted data input); the type
    follows the contents: file uri_file, folder with an MLTable file mltable, other folder uri_folder."""
    tokenizer: str = "auto"
    """How text becomes token ids: 'bytes' (one id per byte), 'model' (the tokenizer in model.hf.source), a
    registered tokenizer 'name[:version]' or a folder holding tokenizer.json; auto: the model's own, else bytes."""
    tokenizer_sha256: str = ""
    """Set at launch: the content hash of the tokenizer data.tokenizer resolved to; the run (its resume and export
    too) refuses any other. Empty: not pinned (bytes need no pin)."""
    text_field: str = "text"
    """JSON Lines data: the field holding each document's text."""
    prompt_field: str = ""
    """JSON Lines instruction data: the prompt's field (with data.completion_field; loss on the completion only)."""
    completion_field: str = ""
    """JSON Lines instruction data: the completion's field (with data.prompt_field)."""
    chat: str = ""
    """JSON Lines conversations, in one of three shapes: 'messages' ({"messages": [{"role", "content"}, ...]}, as
    OpenAI and transformers write them, tool calls included), 'sharegpt' ({"conversations": [{"from", "value"}]}) or
    'alpaca' ({"instruction", "input", "output"}); rendered by the tokenizer's chat template (ChatML when it has
    none), loss on the assistant's tokens. Empty: not chat data."""
    assistant_loss: Literal["all", "last"] = "all"
    """Chat data: the loss counts every assistant turn ('all') or only each conversation's last ('last')."""
    pack: bool = False
    """Instruction and chat data: fill each row with several examples, each attending only to itself (positions
    restart at each), instead of one example a row padded to block_size: fewer wasted tokens, the same losses.
    (Documents are always packed: this changes nothing for them.)"""
    label_field: str = "label"
    """Classification data (JSON Lines or a table): the field or column holding each example's label."""
    val_fraction: float = bounded(0.1, gt=0.0, le=0.5)
    """Share of the corpus held out for validation (the tail of the text, never trained on)."""
    num_workers: int = bounded(0, ge=0, le=64)
    """DataLoader worker processes; 0 builds batches in the training process."""
    prefetch_factor: int = bounded(2, ge=1, le=64)
    """Batches each worker prepares ahead (only with num_workers > 0)."""
    sampling: Literal["random", "epochs"] = "random"
    """How a step's rows are chosen. random: drawn at random from each data-parallel replica's share of the data, a
    function of the step and the replica (a run resumes with the same number of replicas). epochs: every training
    sample once an epoch, in a seeded order, each step taking the next replicas x batch_size x grad_accum_steps
    samples; the position is kept in checkpoints, so a run may resume with another number of replicas (elastic
    training) and no sample is seen twice or skipped across the change. A sample: a window of block_size + 1 tokens
    of documents (side by side, each token predicted once), an example, or a table row. Not with data.pack."""
    record_samples: bool = False
    """data.sampling=epochs: write the numbers of the samples each step trained on, one line a step per replica, to
    RUN_DIR/samples/ (an audit of what was seen, across restarts and changes of world size)."""


@dataclass
class OptimConfig:
    lr: float = bounded(1e-3, gt=0.0, le=1.0)
    """Peak learning rate, reached after warmup."""
    min_lr: float = bounded(1e-4, ge=0.0, le=1.0)
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = bounded(20, ge=0)
    """Linear warmup from 0 to lr over this many steps."""
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    """Decay after warmup: cosine or linear to min_lr at max_steps, or constant."""
    weight_decay: float = bounded(0.1, ge=0.0, le=1.0)
    """AdamW decoupled weight decay (applied to matrices only, not to biases and norms)."""
    beta1: float = bounded(0.9, ge=0.0, le=0.9999)
    """AdamW first-moment decay."""
    beta2: float = bounded(0.95, ge=0.0, le=0.9999)
    """AdamW second-moment decay."""
    grad_clip: float = bounded(1.0, ge=0.0)
    """Clip the global gradient norm to this value; 0 disables clipping."""


@dataclass
class TrainConfig:
    batch_size: int = bounded(32, ge=1, le=65536)
    """Sequences (or samples) per process per micro-step (DeepSpeed's train_micro_batch_size_per_gpu)."""
    grad_accum_steps: int = bounded(1, ge=1, le=4096)
    """Micro-steps per optimizer step: gradients of this many batches add up before one update, so a step sees
    batch_size x grad_accum_steps x processes sequences (e.g. 8 x 4 x 2 = 64) in the memory of one batch."""
    max_steps: int = bounded(200, ge=1)
    """Optimizer steps to run (also the horizon of the cosine schedule)."""
    max_seconds: float = bounded(0.0, ge=0.0)
    """Stop after this much training time even if max_steps is not reached; 0 means no limit."""
    min_steps: int = bounded(0, ge=0)
    """With a time budget (max_seconds): train at least this many steps (never past max_steps), so a slower machine
    takes longer instead of stopping short of where a normal one gets in the budget; 0: no floor."""
    eval_every: int = bounded(100, ge=1)
    """Run validation every this many steps (and always at the last step)."""
    eval_at_start: bool = False
    """Also evaluate before the first step (step 0): the baseline a fine-tune is measured against."""
    eval_batches: int = bounded(8, ge=1)
    """Validation batches per evaluation (split across processes)."""
    log_every: int = bounded(10, ge=1)
    """Write a train event and TensorBoard scalars every this many steps."""
    seed: int = bounded(1337, ge=0)
    """Seed for weights, batch sampling and dropout; a run is reproducible from it."""
    threads: int = bounded(0, ge=0, le=1024)
    """torch intra-op threads per process; 0 means CPU cores divided by the process count."""
    objective: Literal["model", "dpo"] = "model"
    """What training minimizes: 'model', the model's own loss (next-token cross entropy over the tokens that count,
    or a classifier's); 'dpo', Direct Preference Optimization on preference pairs (JSON Lines with "prompt", "chosen"
    and "rejected"; data.chat=messages where the prompt is a list of turns), against a reference that is the model
    with its LoRA adapters switched off, or without LoRA a frozen copy of the starting weights."""
    dpo_beta: float = bounded(0.1, gt=0.0, le=10.0)
    """train.objective=dpo: DPO's beta, how strongly the policy is held to the reference (TRL's default 0.1); the
    loss is -log sigmoid(beta x (the policy's chosen-minus-rejected log-probability - the reference's))."""
    compile: bool = False
    """torch.compile the model, in place (both engines; DeepSpeed's engine.compile()): kernels fused, Python overhead
    gone, after the first steps pay for compiling (a compile event says how long, and names each recompilation).
    Needs a C++ compiler on a CPU, Triton on a GPU. Off by default: on a 2-core CPU it did not pay (make bench)."""


@dataclass
class EngineConfig:
    name: Literal["torch", "deepspeed", "fsdp"] = "torch"
    """Training engine: plain PyTorch (DDP when nproc > 1), DeepSpeed (ZeRO), or PyTorch's own sharding (FSDP2:
    every parameter, gradient and optimizer state split over the processes, each block gathered while it runs;
    checkpoints written shard by shard, never gathered)."""
    nproc: int = bounded(1, ge=1, le=1024)
    """Processes on this machine; more than one goes through a launcher (torchrun or deepspeed)."""
    launcher: Literal["auto", "torchrun", "deepspeed"] = "auto"
    """Multi-process launcher; 'auto' uses the DeepSpeed launcher for the deepspeed engine, torchrun otherwise."""
    tensor_parallel: int = bounded(1, ge=1, le=64)
    """Ranks each layer is split over, Megatron-style (toolkit.train.tensor_parallel; the torch engine, with the
    built-in GPT or a transformers model whose architecture declares a plan, such as Llama): each rank holds 1/N of
    the block weights and computes 1/N of each matmul. It must divide the processes, and the rest are data parallel
    (8 processes at 2: 4 replicas of 2 ranks). 1: off."""
    pipeline_parallel: int = bounded(1, ge=1, le=64)
    """Stages the built-in GPT's blocks are cut into, one a rank (toolkit.train.pipeline_parallel; the torch
    engine): each rank holds its stage's blocks (the first the embeddings too, the last the output layer), and each
    step's train.grad_accum_steps micro-batches flow through the stages in torch's 1F1B schedule, so it needs at
    least as many micro-batches as stages (the pipeline idles (stages - 1) / (micro-batches + stages - 1) of a step).
    With engine.tensor_parallel, each stage is split over its own group too (3-D: the processes a multiple of both).
    It must divide the processes, and the rest are data parallel. 1: off."""
    zero_stage: int = bounded(0, ge=0, le=3)
    """DeepSpeed ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters partitioned."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Compute precision; bf16 uses autocast (torch) or DeepSpeed's bf16 mode with fp32 master weights; fp16 adds
    dynamic loss scaling (skipped steps are logged) and needs a GPU."""
    tf32: bool = True
    """On a GPU, fp32 matmuls and convolutions run on TF32 tensor cores (inputs rounded to 10 mantissa bits, sums
    in fp32): several times faster on Ampere and later, what bf16 runs use for their fp32 parts too. false: full
    fp32 (IEEE) matmuls. No effect on a CPU."""
    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """torch.distributed backend; 'auto' is nccl on GPUs and gloo on CPU."""
    fsdp_reshard_after_forward: bool = True
    """engine.name=fsdp: free each block's gathered parameters after its forward and gather them again for its
    backward (the least memory: ZeRO-3's); false keeps them until the backward (one all-gather a block fewer, the
    memory of whole parameters for the time between)."""
    fsdp_offload: bool = False
    """engine.name=fsdp: keep the sharded parameters, gradients and optimizer state in CPU memory (FSDP2's
    CPUOffloadPolicy), each block copied to the GPU for its turn and the optimizer step run on the CPU: for state
    that does not fit the GPUs, at the cost of the copies."""
    deepspeed_config: str = ""
    """Your DeepSpeed config (a ds_config.json, or YAML), with engine.name=deepspeed: Trainbook's fields fill what
    it leaves out, its "auto" values take this config's, and a value that contradicts one set here is refused."""
    deepspeed: dict = field(default_factory=dict)
    """Set at launch: the contents of engine.deepspeed_config, kept with the run so that its restarts, resumes and
    an Azure ML job never read the file again. Empty: no file."""


@dataclass
class ProfileConfig:
    enabled: bool = False
    """Record a torch.profiler trace (TensorBoard plugin format) and a top-operator table."""
    wait: int = bounded(5, ge=0)
    """Steps to skip before the profiler starts warming up (lets allocators and caches settle)."""
    warmup: int = bounded(2, ge=0)
    """Steps traced but discarded, so profiler start-up cost stays out of the numbers."""
    active: int = bounded(3, ge=1, le=100)
    """Steps recorded in the trace."""


@dataclass
class CheckpointConfig:
    every_steps: int = bounded(0, ge=0)
    """Checkpoint every this many steps; 0 turns step-based checkpoints off."""
    every_seconds: float = bounded(0.0, ge=0.0)
    """Checkpoint when this much training time has passed since the last one; 0 turns it off."""
    keep_last: int = bounded(3, ge=1, le=1000)
    """Valid checkpoints kept on disk; older ones are deleted (never the one LATEST names)."""
    mode: Literal["async", "sync"] = "async"
    """async: stage a copy in memory, persist it in the background; sync: write in place while training waits."""
    stage: Literal["auto", "blocking", "overlap"] = "auto"
    """async staging: blocking copies with every core now, overlap behind the next forward/backward; auto: blocking
    on CPU (a bounded cost: one copy at full memory bandwidth), overlap on a GPU (a DMA the step does not feel)."""
    at_end: bool = True
    """Also checkpoint the final step (what resume, export and deployment start from)."""


@dataclass
class FaultConfig:
    kill_at_step: int = bounded(0, ge=0)
    """Simulate a lost node: SIGKILL every training process after this step (first attempt only); 0 is off."""
    slow_steps_after_checkpoint: int = bounded(0, ge=0)
    """Simulate a checkpoint's slowdown: this many steps after each checkpoint sleep fault.slow_step_ms."""
    slow_step_ms: float = bounded(0.0, ge=0.0)
    """How long each of those steps sleeps (tests check that lost_ms reports it)."""
    slow_write_ms: float = bounded(0.0, ge=0.0)
    """Simulate a slow disk: each checkpoint's write takes this many milliseconds more (tests check that a checkpoint
    due before the previous one is written reports its wait)."""
    nan_at_step: int = bounded(0, ge=0)
    """Simulate a diverging step: this step's loss on the last rank is multiplied by NaN, and so are its gradients
    (first attempt only); 0 is off. What happens next is watchdog.nonfinite's."""
    hang_at_step: int = bounded(0, ge=0)
    """Simulate a hang: after this step the last rank waits forever (first attempt only), as behind a stuck
    collective; 0 is off. watchdog.hang finds it."""


@dataclass
class WatchdogConfig:
    nonfinite: Literal["stop", "skip", "apply"] = "stop"
    """A step whose loss or gradients are not finite (NaN, inf), on any rank: stop (its update is not applied, the
    state before it is checkpointed, the run fails naming the step), skip its update and go on, or apply it anyway
    (unwatched, as before the watchdog). In fp16 the loss scaler skips such steps itself (its skipped_steps)."""
    max_consecutive_skips: int = bounded(5, ge=1, le=1000)
    """With nonfinite=skip, this many non-finite steps in a row stop the run as nonfinite=stop does: by then the
    weights or the learning rate are at fault, not a batch."""
    hang: bool = True
    """Watch each rank for a hang: when no step completes in time, dump every thread's Python stack into
    RUN_DIR/hangs and end the training processes, so that the supervisor restarts them (--max-restarts)."""
    hang_factor: int = bounded(10, ge=2, le=1000)
    """A hang is no step completed within this many times the recent step time (the median of the last 20 steps)."""
    hang_min_seconds: float = bounded(120.0, gt=0.0)
    """The shortest time that counts as a hang, however fast the steps are (a slow batch or log write is not one)."""
    hang_allowance_seconds: float = bounded(900.0, gt=0.0)
    """The limit where recent steps say nothing: the first steps of a start (compiling, warming up) and the first
    evaluation and checkpoint (later ones get hang_factor x the longest one before)."""


@dataclass
class DebugConfig:
    enabled: bool = False
    """Start debugpy in rank 0 before the trainer is built (`trainbook train --debug`); VS Code or any Debug Adapter
    Protocol client attaches to it. Other ranks do not listen."""
    wait_for_client: bool = True
    """Hold training (on every start and restart) until a debugger has attached; false: listen and train at once."""
    host: str = "127.0.0.1"
    """Address debugpy listens on: an IPv4 loopback address only (a debugger runs any code it likes, unauthenticated);
    from another machine, tunnel to it (ssh -L PORT:127.0.0.1:PORT, or Azure ML's VS Code / SSH job services)."""
    port: int = bounded(0, ge=0, le=65535)
    """TCP port debugpy listens on; 0: a free one, chosen at the first start, reported (CLI, events, status.json) and
    kept for restarts."""


@dataclass
class TrackingConfig:
    mlflow: Literal["auto", "always", "never"] = "auto"
    """Also log to MLflow (metrics under TensorBoard's names, the config as params, the run's files): auto where a
    tracking server is given (an Azure ML job's own, which it sets in $MLFLOW_TRACKING_URI, or tracking.mlflow_uri);
    always: locally too, into the workspace's store; never. Not on locally by default: MLflow's import and store
    cost each run seconds of CPU, for a UI that is installed apart."""
    mlflow_uri: str = ""
    """MLflow tracking URI, e.g. sqlite:///PATH/mlflow.db or http://HOST:5000; empty: $MLFLOW_TRACKING_URI (in an
    Azure ML job the job itself, so studio charts its metrics), else sqlite:///WORKSPACE/mlflow/mlflow.db, which
    `mlflow ui --backend-store-uri` opens."""
    experiment: str = ""
    """MLflow experiment the run goes to; empty: the config's name. An Azure ML job logs into its own run, in the
    job's experiment."""


@dataclass
class Config:
    name: str = "run"
    """Run name; the run directory defaults to runs/<name>-<timestamp>."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Which model and its shape."""
    data: DataConfig = field(default_factory=DataConfig)
    """Which data and how it is loaded."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and learning-rate schedule."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Loop length, batch, logging and evaluation cadence."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Engine, process count and precision."""
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    """torch.profiler settings."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """When and how training state is saved."""
    fault: FaultConfig = field(default_factory=FaultConfig)
    """Fault injection, for teaching and tests."""
    debug: DebugConfig = field(default_factory=DebugConfig)
    """Interactive debugging: debugpy in rank 0, on loopback."""
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    """What happens when a step is not finite or a rank hangs."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """Metrics in MLflow beside TensorBoard."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def fingerprint(self) -> str:
        """sha256 of the resolved config, for telling runs and checkpoints apart."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string under it in the class body), by field name."""
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {
        node.target.id: " ".join(nxt.value.value.split())
        for node, nxt in zip(body, body[1:])
        if isinstance(node, ast.AnnAssign)
        and isinstance(node.target, ast.Name)
        and isinstance(nxt, ast.Expr)
        and isinstance(nxt.value, ast.Constant)
        and isinstance(nxt.value.value, str)
    }


def commented_yaml(cfg: Config) -> str:
    """The resolved config as YAML that ``load`` reads back, each field followed by its doc as a comment
    (``trainbook config show``)."""
    lines = [f"# {cfg.name}: resolved (built-in defaults, the file, then --set); `trainbook train FILE` takes it"]

    def emit(obj, indent: str) -> None:
        docs = field_docs(type(obj))
        for f in dataclasses.fields(obj):
            value, doc = getattr(obj, f.name), docs.get(f.name, "")
            if dataclasses.is_dataclass(value):
                lines.append(f"{indent}{f.name}:  # {doc}" if doc else f"{indent}{f.name}:")
                emit(value, indent + "  ")
                continue
            text = yaml.safe_dump({f.name: value}, default_flow_style=True, width=10**6).strip()[1:-1]
            lines.append(f"{indent}{text}" + (f"  # {doc}" if doc else ""))

    emit(cfg, "")
    return "\n".join(lines) + "\n"


# --- loading and validation -------------------------------------------------------------------------------

_YAML11_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _describe_type(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is list:
        return "a list of strings"
    return {
        int: "an integer",
        float: "a number",
        bool: "true or false",
        str: "a string",
        dict: "a mapping of names to plain values (numbers, strings, true/false, lists)",
    }.get(tp, str(tp))


def _plain_data(value: Any) -> bool:
    """A value a YAML or JSON file can hold and a config can be fingerprinted from: no objects, no NaN."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def _coerce(path: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the annotation ``tp``; return it (ints widen to float)."""
    if typing.get_origin(tp) is Literal:
        if value in typing.get_args(tp) and type(value) is type(typing.get_args(tp)[0]):
            return value
    elif tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, str) and _YAML11_FLOAT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 reads '3e-3' (no dot) as a string; people write it anyway
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(tp) is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]  # --set model.lora.target_modules=q,v
        if isinstance(value, list) and all(isinstance(v, str) and v for v in value):
            return list(value)
    elif tp is dict:
        if isinstance(value, dict) and all(isinstance(k, str) for k in value) and _plain_data(value):
            return dict(value)
    raise ConfigError(not_allowed(path, value, _describe_type(tp)))


def _check_bounds(path: str, value: Any, meta: typing.Mapping) -> None:
    ge, le, gt = meta.get("ge"), meta.get("le"), meta.get("gt")
    allowed = []
    if gt is not None:
        allowed.append(f"> {gt}")
    if ge is not None:
        allowed.append(f">= {ge}")
    if le is not None:
        allowed.append(f"<= {le}")
    if (gt is not None and not value > gt) or (ge is not None and value < ge) or (le is not None and value > le):
        raise ConfigError(not_allowed(path, value, " and ".join(allowed), problem="is out of range"))


def _build(cls: type, data: Any, prefix: str) -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown keys and bad values with their path."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping of fields, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(refused(f"{where}{unknown[0]}", "unknown field", ", ".join(fields)))
    kwargs = {}
    for name, value in data.items():
        path = f"{prefix}.{name}" if prefix else name
        tp = hints[name]
        if dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value, path)
        else:
            value = _coerce(path, value, tp)
            _check_bounds(path, value, fields[name].metadata)
            kwargs[name] = value
    return cls(**kwargs)


MAX_RUN_NAME = 200

# What each model.name trains on, here with the fields it checks (validating a config loads no torch); the model
# registry, toolkit.train.models, builds and runs them.
TEXT_DATASETS = ("pydoc", "stdlib")
TEXT_ASSETS = ("uri_file", "uri_folder")
# data asset types: mltable for hf is labelled text for a sequence classifier (toolkit.data refuses a table for a
# causal LM); the user's own module trains on whatever data it is given, the batch's keys say what it is
ASSET_TYPES = {
    "gpt": TEXT_ASSETS,
    "digits_mlp": ("mltable",),
    "hf": TEXT_ASSETS + ("mltable",),
    "custom": TEXT_ASSETS + ("mltable",),
}


def builtin_datasets(model: ModelConfig) -> tuple[str, ...]:
    """The built-in data.dataset values ``model`` can train on (a transformers model only as a causal LM)."""
    if model.name == "hf":
        return TEXT_DATASETS if model.hf.task == "causal_lm" else ()
    return {"gpt": TEXT_DATASETS, "digits_mlp": ("digits",), "custom": TEXT_DATASETS + ("digits",)}[model.name]


def _check_relations(cfg: Config) -> None:
    """Constraints between fields, which a single field's bounds cannot express."""
    check_name(cfg.name, "name", ConfigError)  # it becomes the run folder's name
    if len(cfg.name) > MAX_RUN_NAME:  # the folder adds "-YYYYmmdd-HHMMSS[-n]" and must stay under 255 bytes
        raise ConfigError(
            refused(
                "name",
                f"{cfg.name[:20]!r}... has {len(cfg.name)} characters",
                f"at most {MAX_RUN_NAME} (the run folder's name adds a timestamp)",
            )
        )
    _check_model_source(cfg)
    _check_tracking(cfg.tracking)
    if cfg.data.tokenizer_sha256 and not re.fullmatch(r"[0-9a-f]{64}", cfg.data.tokenizer_sha256):
        raise ConfigError(
            not_allowed(
                "data.tokenizer_sha256",
                cfg.data.tokenizer_sha256,
                "empty, or the 64 hex digits of a sha256 (set at launch)",
            )
        )
    if cfg.data.prompt_field and cfg.data.prompt_field == cfg.data.completion_field:
        raise ConfigError(
            not_allowed(
                "data.completion_field",
                cfg.data.completion_field,
                "a field other than data.prompt_field",
                problem="is the prompt's field too",
            )
        )
    if bool(cfg.data.prompt_field) != bool(cfg.data.completion_field):
        given, missing = (
            ("data.prompt_field", "data.completion_field")
            if cfg.data.prompt_field
            else ("data.completion_field", "data.prompt_field")
        )
        raise ConfigError(
            refused(missing, f"is empty while {given} is set", "both fields set (instruction tuning) or neither")
        )
    if cfg.data.chat not in ("", *CHAT_SHAPES):
        raise ConfigError(
            not_allowed(
                "data.chat",
                cfg.data.chat,
                f"one of {', '.join(map(repr, CHAT_SHAPES))}, or empty (the data is not conversations)",
            )
        )
    if cfg.data.chat and cfg.data.prompt_field:
        raise ConfigError(
            not_allowed(
                "data.chat",
                cfg.data.chat,
                "empty while data.prompt_field is set (prompt/completion pairs), or data.prompt_field empty",
                problem="reads conversations, and data.prompt_field asks for prompt/completion pairs",
            )
        )
    if cfg.train.objective == "dpo":
        _check_dpo(cfg)
    if cfg.engine.tensor_parallel > 1:
        _check_tensor_parallel(cfg)
    if cfg.engine.pipeline_parallel > 1:
        _check_pipeline_parallel(cfg)
    _check_sampling(cfg)
    if cfg.model.n_embd % cfg.model.n_head:
        raise ConfigError(
            not_allowed(
                "model.n_head",
                cfg.model.n_head,
                "a divisor of n_embd",
                problem=f"does not divide model.n_embd={cfg.model.n_embd}",
            )
        )
    if cfg.optim.min_lr > cfg.optim.lr:
        raise ConfigError(
            not_allowed("optim.min_lr", cfg.optim.min_lr, "<= lr", problem=f"is above optim.lr={cfg.optim.lr}")
        )
    wanted = builtin_datasets(cfg.model)
    if not wanted and not (cfg.data.asset or cfg.data.path):
        raise ConfigError(
            refused(
                "data.asset",
                f"is empty, and no built-in dataset fits model.name={cfg.model.name!r} (task {cfg.model.hf.task!r})",
                "a registered asset or a data.path of labelled examples (JSON Lines with "
                "data.text_field and data.label_field, or a table)",
            )
        )
    if wanted and cfg.data.dataset not in wanted:
        raise ConfigError(
            not_allowed(
                "data.dataset",
                cfg.data.dataset,
                ", ".join(map(repr, wanted)),
                problem=f"does not fit model.name={cfg.model.name!r}",
            )
        )
    if cfg.data.asset:
        parse_ref(cfg.data.asset, "data.asset", ConfigError)
    if cfg.data.asset and cfg.data.path:
        raise ConfigError(
            not_allowed(
                "data.path",
                cfg.data.path,
                "one of the two",
                problem=f"given together with data.asset={bounded_repr(cfg.data.asset)}",
            )
        )
    if cfg.engine.name != "deepspeed" and cfg.engine.zero_stage:
        raise ConfigError(
            not_allowed(
                "engine.zero_stage",
                cfg.engine.zero_stage,
                f"0 with engine.name={cfg.engine.name!r}",
                problem="needs engine.name='deepspeed'",
            )
        )
    if cfg.engine.name == "fsdp":
        _check_fsdp(cfg)
    for path, default in (("engine.fsdp_reshard_after_forward", True), ("engine.fsdp_offload", False)):
        value = getattr(cfg.engine, path.split(".")[1])
        if value != default and cfg.engine.name != "fsdp":
            raise ConfigError(
                not_allowed(
                    path,
                    value,
                    f"{default} unless engine.name='fsdp'",
                    problem=f"is set while engine.name={cfg.engine.name!r}",
                )
            )
    for path in ("engine.deepspeed_config", "engine.deepspeed"):
        value = getattr(cfg.engine, path.split(".")[1])
        if value and cfg.engine.name != "deepspeed":
            raise ConfigError(
                not_allowed(
                    path,
                    value,
                    "empty unless engine.name='deepspeed'",
                    problem=f"is set while engine.name={cfg.engine.name!r}",
                )
            )
    if cfg.model.activation_checkpointing and cfg.model.name == "digits_mlp":
        raise ConfigError(
            not_allowed(
                "model.activation_checkpointing",
                True,
                "false with model.name='digits_mlp'",
                problem="has no blocks to recompute in a 2-layer MLP",
            )
        )
    if cfg.engine.launcher == "deepspeed" and cfg.engine.name != "deepspeed":
        raise ConfigError(
            not_allowed(
                "engine.launcher", cfg.engine.launcher, "'auto', 'torchrun'", problem="needs engine.name='deepspeed'"
            )
        )
    if not _ipv4_loopback(cfg.debug.host):
        raise ConfigError(
            not_allowed(
                "debug.host",
                cfg.debug.host,
                "an IPv4 loopback address such as '127.0.0.1' "
                "(from elsewhere, tunnel to it: ssh -L PORT:127.0.0.1:PORT)",
                problem="is not loopback: anyone who reaches the port could run any code as "
                "you, debugpy asks for no key",
            )
        )


def is_causal_lm(model: ModelConfig) -> bool:
    """Does the model predict the next token (the built-in GPT, or a transformers model with task causal_lm)?"""
    return model.name == "gpt" or (model.name == "hf" and model.hf.task == "causal_lm")


GPT_VOCAB = 256  # toolkit.train.models.gpt.VOCAB_SIZE (bytes), which tensor parallelism splits by rows


def _refuse_unsupported(needs: list[tuple[bool, str, object, str]], setting: str) -> None:
    """The first of ``needs`` (ok, field, value, allowed) that is not met, refused as unsupported with ``setting``."""
    for ok, field_name, value, allowed in needs:
        if not ok:
            raise ConfigError(not_allowed(field_name, value, allowed, problem=f"is not supported with {setting}"))


def _check_tensor_parallel(cfg: Config) -> None:
    """engine.tensor_parallel > 1: what the split supports (toolkit.train.tensor_parallel). A transformers model's
    sizes are known only once it is built: it checks them then. That it divides the processes is checked at launch
    (toolkit.train.engines.check_engine), where the world is known."""
    size = cfg.engine.tensor_parallel
    needs = [
        (cfg.engine.name == "torch", "engine.name", cfg.engine.name, "'torch'"),
        (cfg.model.name in ("gpt", "hf"), "model.name", cfg.model.name, "'gpt', or 'hf' with a plan (Llama, ...)"),
        (not cfg.model.lora.rank, "model.lora.rank", cfg.model.lora.rank, "0 (LoRA adapters are not split)"),
        (cfg.train.objective == "model", "train.objective", cfg.train.objective, "'model'"),
        (not cfg.train.compile, "train.compile", cfg.train.compile, "false"),
        (cfg.engine.precision != "fp16", "engine.precision", cfg.engine.precision, "'bf16' or 'fp32'"),
    ]
    _refuse_unsupported(needs, f"engine.tensor_parallel={size}")
    if cfg.model.name == "gpt":
        for field_name, count in (("model.n_head", cfg.model.n_head), ("the byte vocabulary", GPT_VOCAB)):
            if count % size:
                raise ConfigError(
                    not_allowed(
                        "engine.tensor_parallel",
                        size,
                        f"a divisor of {field_name} ({count})",
                        problem=f"does not divide {field_name} ({count}): each rank takes an equal share",
                    )
                )


def _check_fsdp(cfg: Config) -> None:
    """engine.name=fsdp: what its sharding supports so far (toolkit.train.engines.fsdp_engine); tensor and pipeline
    parallelism are refused by their own checks (engine.name='torch')."""
    needs = [
        (cfg.engine.precision != "fp16", "engine.precision", cfg.engine.precision, "'bf16' or 'fp32'"),
        (not cfg.train.compile, "train.compile", cfg.train.compile, "false"),
        (cfg.train.objective == "model", "train.objective", cfg.train.objective, "'model'"),
    ]
    _refuse_unsupported(needs, "engine.name='fsdp'")


def _check_pipeline_parallel(cfg: Config) -> None:
    """engine.pipeline_parallel > 1: what the stages support (toolkit.train.pipeline_parallel). That it divides the
    processes is checked at launch (toolkit.train.engines.check_engine)."""
    stages = cfg.engine.pipeline_parallel
    needs = [
        (cfg.engine.name == "torch", "engine.name", cfg.engine.name, "'torch'"),
        (cfg.model.name == "gpt", "model.name", cfg.model.name, "'gpt' (the built-in model, cut between its blocks)"),
        (not cfg.model.lora.rank, "model.lora.rank", cfg.model.lora.rank, "0"),
        (cfg.train.objective == "model", "train.objective", cfg.train.objective, "'model'"),
        (not cfg.train.compile, "train.compile", cfg.train.compile, "false"),
        (cfg.engine.precision != "fp16", "engine.precision", cfg.engine.precision, "'bf16' or 'fp32'"),
        (not cfg.data.pack, "data.pack", cfg.data.pack, "false (packed rows' positions do not cross stages)"),
    ]
    _refuse_unsupported(needs, f"engine.pipeline_parallel={stages}")
    for field_name, count, why in (
        ("model.n_layer", cfg.model.n_layer, "each stage runs at least one block"),
        ("train.grad_accum_steps", cfg.train.grad_accum_steps, "1F1B needs a micro-batch in flight per stage"),
    ):
        if count < stages:
            raise ConfigError(
                not_allowed(
                    field_name,
                    count,
                    f"at least engine.pipeline_parallel ({stages})",
                    problem=f"is fewer than the {stages} stages: {why}",
                )
            )


def _check_sampling(cfg: Config) -> None:
    """data.sampling=epochs numbers whole samples: packed rows take a varying number of examples a row."""
    if cfg.data.sampling == "epochs" and cfg.data.pack:
        raise ConfigError(
            not_allowed(
                "data.pack", True, "false with data.sampling=epochs", problem="packs a varying number of samples a row"
            )
        )
    if cfg.data.record_samples and cfg.data.sampling != "epochs":
        raise ConfigError(
            not_allowed(
                "data.record_samples",
                True,
                "false, or data.sampling=epochs",
                problem="records numbered samples, which data.sampling=random does not take",
            )
        )


def _check_dpo(cfg: Config) -> None:
    """train.objective=dpo: a causal language model (the built-in GPT or a transformers one) on preference pairs."""
    if not is_causal_lm(cfg.model):
        model = cfg.model.name if cfg.model.name != "hf" else f"hf (task {cfg.model.hf.task!r})"
        raise ConfigError(
            not_allowed(
                "train.objective",
                "dpo",
                "'model' for this model, or model.name 'gpt' or 'hf' with model.hf.task='causal_lm'",
                problem=f"needs a causal language model's per-token probabilities, and model.name={model} has none",
            )
        )
    if not (cfg.data.asset or cfg.data.path):
        raise ConfigError(
            refused(
                "data.asset",
                "is empty, and train.objective=dpo needs preference pairs, which no built-in dataset holds",
                'a registered asset or a data.path of JSON Lines with "prompt", "chosen" and "rejected"',
            )
        )
    if cfg.data.chat not in ("", "messages"):
        raise ConfigError(
            not_allowed(
                "data.chat",
                cfg.data.chat,
                "'messages' (each prompt a list of turns) or empty (prompts are text), with train.objective=dpo",
            )
        )
    if cfg.engine.name == "deepspeed" and cfg.engine.zero_stage == 3 and not cfg.model.lora.rank:
        raise ConfigError(
            not_allowed(
                "engine.zero_stage",
                3,
                "0 to 2 for a DPO full fine-tune, or model.lora.rank > 0 (the reference is then the model itself)",
                problem="would keep the reference, a frozen copy of the whole model, unpartitioned on every rank",
            )
        )
    for path, value in (("data.prompt_field", cfg.data.prompt_field), ("data.pack", cfg.data.pack)):
        if value:
            raise ConfigError(
                not_allowed(
                    path,
                    value,
                    "its default with train.objective=dpo",
                    problem='is not used by preference pairs (fields "prompt", "chosen", "rejected"; one pair a row)',
                )
            )


def _ipv4_loopback(host: str) -> bool:
    import ipaddress

    try:
        return ipaddress.IPv4Address(host).is_loopback
    except ValueError:
        return False


MAX_EXPERIMENT_NAME = 256  # MLflow's SQL stores hold experiment names in a 256-character column


def _check_tracking(t: TrackingConfig) -> None:
    """A tracking URI MLflow 3 can use and that keeps no password (the config is saved with the run and logged)."""
    import urllib.parse

    allowed = (
        "empty, or a tracking URI: sqlite:///PATH/mlflow.db, http(s)://HOST:PORT, azureml://..., databricks, "
        "or the scheme of an MLflow plugin"
    )
    if t.mlflow_uri and t.mlflow == "never":
        raise ConfigError(
            not_allowed(
                "tracking.mlflow_uri",
                t.mlflow_uri,
                "empty with tracking.mlflow='never'",
                problem="is set while tracking.mlflow='never'",
            )
        )
    if t.mlflow_uri and t.mlflow_uri != "databricks":
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]+:\S+", t.mlflow_uri):
            raise ConfigError(
                not_allowed(
                    "tracking.mlflow_uri",
                    t.mlflow_uri,
                    allowed,
                    problem="is not a URI (a folder is MLflow's old file store, which MLflow 3 "
                    "refuses: use sqlite:///FOLDER/mlflow.db)",
                )
            )
        if t.mlflow_uri.lower().startswith("file:"):
            raise ConfigError(
                not_allowed(
                    "tracking.mlflow_uri",
                    t.mlflow_uri,
                    allowed,
                    problem="is MLflow's old file store, which MLflow 3 refuses (use sqlite:///FOLDER/mlflow.db)",
                )
            )
        if urllib.parse.urlsplit(t.mlflow_uri).password is not None:
            raise ConfigError(
                refused(
                    "tracking.mlflow_uri",
                    "holds a password, and the config is saved with the run and logged as its params",
                    "a URI without one: a server's credentials go in MLFLOW_TRACKING_USERNAME and "
                    "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN), a database's URI with "
                    "its password in $MLFLOW_TRACKING_URI and tracking.mlflow_uri empty",
                )
            )
    if len(t.experiment) > MAX_EXPERIMENT_NAME or not t.experiment.isprintable():
        raise ConfigError(
            not_allowed(
                "tracking.experiment",
                t.experiment,
                f"empty, or printable text of at most {MAX_EXPERIMENT_NAME} characters",
            )
        )


def _check_model_source(cfg: Config) -> None:
    """Where the model comes from: each model.name has its own fields, and the others' stay empty."""
    m = cfg.model
    if m.name == "custom" and not m.factory:
        raise ConfigError(
            refused(
                "model.factory",
                "is empty while model.name='custom'",
                "'package.module:function' or 'path/to/file.py:function' returning an nn.Module",
            )
        )
    if m.name != "custom":
        for path, value in (("model.factory", m.factory), ("model.loss", m.loss), ("model.code_path", m.code_path)):
            if value:
                raise ConfigError(
                    not_allowed(
                        path, value, "empty unless model.name='custom'", problem=f"is set while model.name={m.name!r}"
                    )
                )
    if m.name == "hf":
        if not m.hf.source and not m.hf.architecture:
            raise ConfigError(
                refused(
                    "model.hf.source",
                    "is empty and so is model.hf.architecture",
                    "a save_pretrained folder in model.hf.source, or an architecture such as "
                    "'llama' in model.hf.architecture (with sizes in model.hf.config)",
                )
            )
        if m.hf.source and (m.hf.architecture or m.hf.config):
            other = "model.hf.architecture" if m.hf.architecture else "model.hf.config"
            raise ConfigError(
                not_allowed(
                    other,
                    m.hf.architecture or m.hf.config,
                    "empty with model.hf.source",
                    problem=f"is set together with model.hf.source={bounded_repr(m.hf.source)} "
                    "(the folder's config.json says what to build)",
                )
            )
    elif m.hf.source or m.hf.architecture or m.hf.config:
        raise ConfigError(refused("model.hf", f"is set while model.name={m.name!r}", "model.name='hf' with it"))
    if m.lora.rank and not m.lora.target_modules and m.name != "hf":
        # peft knows default targets for transformers architectures only
        raise ConfigError(
            refused(
                "model.lora.target_modules",
                f"is empty while model.lora.rank={m.lora.rank} and model.name={m.name!r}",
                "the names (or name suffixes) of the Linear, Embedding or Conv modules to adapt, "
                "e.g. [qkv, proj] for the built-in gpt; peft has defaults for transformers models "
                "only",
            )
        )


def given_fields(data: dict, prefix: str = "") -> set[str]:
    """The dotted fields a config mapping sets (``{"train": {"lr": 1}}`` -> ``{"train.lr"}``): what the user chose,
    as opposed to a default, which a DeepSpeed file's value may replace."""
    found = set()
    for key, value in data.items():
        path = f"{prefix}{key}"
        found.add(path)
        if isinstance(value, dict) and path.count(".") == 0:
            found |= given_fields(value, path + ".")
    return found


def from_dict(data: dict | None) -> Config:
    """A Config from a mapping (a saved config.yaml, a test), validated; nothing else is read."""
    # None (an empty YAML document) is all defaults; any other non-mapping, [] or '' included, is refused
    cfg = _build(Config, {} if data is None else data, "")
    _check_relations(cfg)
    return cfg


def _with_deepspeed_config(cfg: Config, data: dict) -> Config:
    """``cfg`` with its DeepSpeed file's (or kept copy's) values taken into the fields they mean, at the user's edge
    (:func:`load`) only: a saved run config is never merged again, and never makes Trainbook read a file."""
    from toolkit.deepspeed_config import DeepSpeedConfigError, adopt  # local: engine territory

    try:
        cfg = adopt(cfg, given_fields(data))
    except DeepSpeedConfigError as exc:
        raise ConfigError(str(exc)) from None
    try:  # the file's values, too, within the fields' types, bounds and rules
        return from_dict(cfg.to_dict())
    except ConfigError as exc:
        raise ConfigError(f"{exc} (a value from engine.deepspeed_config)") from None


def string_override(key: str, text: str) -> str:
    """``key=text`` as ``--set`` takes it, ``text`` kept exactly: double-quoted (a JSON string is a YAML one), so a
    '#', ': ' or leading space in a path stays in the value instead of ending it."""
    return f"{key}={json.dumps(text)}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'train.lr=3e-3'`` -> (['train', 'lr'], 0.003). The value is read as YAML, so types come out right."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected section.field=value, e.g. train.max_steps=100")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: {raw!r} is not a readable value ({exc.problem})") from None
    return key.strip().split("."), value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Return a copy of ``data`` with each ``section.field=value`` applied (validation comes later)."""
    data = json.loads(json.dumps(data or {}))
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for i, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{'.'.join(keys[: i + 1])}: is a value, not a section; cannot set {text!r}")
            node = child
        node[keys[-1]] = value
    return data


def load(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a YAML config (a path, or the name of a built-in config), apply overrides, validate; a DeepSpeed file
    it names is read and merged here (toolkit.deepspeed_config)."""
    from toolkit.plain_data import PlainDataError, read_document, read_text

    data: dict = {}
    if path is not None:
        file = resolve_config_path(path)
        try:
            data = read_document(read_text(file), "yaml")  # its size checked before it is read
        except PlainDataError as exc:
            raise ConfigError(f"{file}: {exc}") from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{file}: expected a mapping of sections at the top level")
        data.setdefault("name", file.stem)
    data = apply_overrides(data, overrides or [])
    cfg = from_dict(data)
    if cfg.engine.deepspeed_config or cfg.engine.deepspeed:
        cfg = _with_deepspeed_config(cfg, data)
    return cfg


# Built-in configs are package data (pyproject's package-data), so a name resolves the same from a checkout, an
# editable install or a wheel, whatever the current folder.
CONFIG_DIR = Path(__file__).resolve().parent / "configs"


def builtin_config_names() -> list[str]:
    """Names of the configs shipped with the package (``trainbook train <name>``)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def resolve_config_path(path: str | Path) -> Path:
    """Accept a path to a YAML file, or the name of a built-in config such as 'tiny' (with or without .yaml)."""
    candidates = [Path(path), CONFIG_DIR / path, CONFIG_DIR / f"{path}.yaml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    shipped = ", ".join(builtin_config_names())
    raise ConfigError(
        not_allowed(
            "config",
            path,
            "one of these names or a path to a YAML file",
            problem=f"is neither a file nor a shipped config; shipped: {shipped} (built into the package)",
        )
    )
