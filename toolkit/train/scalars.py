"""The names a run's numbers go by, TensorBoard's and MLflow's alike: which fields of which events are scalars, and
what each is called. Their one owner: rank 0's MetricsSink writes TensorBoard from it, the MLflow follower
(toolkit.train.tracking) reads events.jsonl through it.
"""

from __future__ import annotations

from toolkit.events import CheckpointEvent, EvalEvent, TrainEvent

# train.objective=dpo's figures (toolkit.train.objectives.DPO), fields of train events and, prefixed val_, eval events
DPO_FIGURES = ("chosen_reward", "rejected_reward", "reward_margin", "reward_accuracy", "chosen_logps", "rejected_logps")

# event field -> TensorBoard tag
TRAIN_SCALARS = {
    "loss": "train/loss",
    "lr": "train/lr",
    "tokens_per_s": "perf/tokens_per_s",
    "mfu": "perf/mfu",
    "data_wait_pct": "perf/data_wait_pct",
}
OPTIONAL_TRAIN_SCALARS = {
    "loss_scale": "train/loss_scale",
    "skipped_steps": "train/skipped_steps",  # fp16
    "nonfinite_skipped": "train/nonfinite_skipped",  # watchdog.nonfinite=skip
    **{key: f"dpo/{key}" for key in DPO_FIGURES},  # train.objective=dpo
}
MEMORY_TAG = "memory/peak_mb"  # one scalar per rank: memory/peak_mb/rank0, ...
EVAL_SCALARS = {
    "val_loss": "eval/val_loss",
    "val_bpb": "eval/val_bpb",
    **{f"val_{key}": f"eval/dpo_{key}" for key in DPO_FIGURES},
}
CHECKPOINT_SCALARS = {key: f"checkpoint/{key}" for key in ("lost_ms", "blocking_ms", "persist_ms", "bytes")}
SCALARS = {
    TrainEvent: {**TRAIN_SCALARS, **OPTIONAL_TRAIN_SCALARS},
    EvalEvent: EVAL_SCALARS,
    CheckpointEvent: CHECKPOINT_SCALARS,
}


def scalars(event) -> dict[str, float]:
    """An event's scalars by name, as TensorBoard and MLflow show them: the fields it holds of its kind's table
    (SCALARS), and a train event's peak memory per rank. {} for an event that has none."""
    found = {
        tag: getattr(event, key) for key, tag in SCALARS.get(type(event), {}).items() if getattr(event, key) is not None
    }
    if isinstance(event, TrainEvent):
        found.update({f"{MEMORY_TAG}/rank{rank}": mb for rank, mb in enumerate(event.peak_memory_mb or ())})
    return found
