"""Whose run is this? The config fields that act beyond a run's folder, honoured only for the user's own runs.

A run directory may have come from elsewhere (copied, shared, downloaded): its config.yaml is data. A few fields
would turn that data into action on `resume` or `export`: they import code, reach an address, or open a port
(ACTING_FIELDS). Those are honoured only when

  * the run was made here by this user: Trainbook signs the acting fields' values, with the run's own path, when it
    writes a run's config (HMAC-SHA256 with a key in the user's config folder, never in a project, workspace or run,
    which travel); a copied, moved or edited run whose values the signature does not cover is not the user's; or
  * the user says so (`--trust-run`, like transformers' trust_remote_code), which signs the values, so that later
    restarts and resumes of the same values need not ask again.

Every verb that acts on a run's config asks :func:`require`; `trainbook checkpoints`, `open_run` and the panels show
:func:`untrusted` (nothing there acts). A run whose config sets none of these fields needs no signature.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from toolkit import key_files, paths
from toolkit.errors import UserError, bounded_repr, refused

TRUST_FILE = "trust.json"  # in the run directory: the signature of its acting fields' values
KEY_NAME = "run-signing.key"
FLAG = "--trust-run"

RUNS_CODE = "runs code"
REACHES_NETWORK = "reaches the network"
OPENS_PORT = "opens a port"
WRITES_OUTSIDE = "writes outside the run"
DEEPSPEED_ACTS = "DeepSpeed imports, writes or connects by it"


class UntrustedRunError(UserError, ValueError):
    """A run's config names code, an address or a port that this user did not vouch for; the message names each
    field, its value, what it would do and the flag that vouches for it."""


@dataclass(frozen=True)
class ActingField:
    name: str
    """The dotted config field (or, for DeepSpeed settings, the field and the setting inside it)."""
    effect: str
    """What honouring it does: RUNS_CODE, REACHES_NETWORK, OPENS_PORT or WRITES_OUTSIDE."""
    value: Callable
    """The field's value in a Config when it would act, else None."""
    verbs: tuple[str, ...] = ("resume",)
    """The verbs that would act on it (resume: the trainer and its followers; export: the model's rebuild)."""


def _set(value):
    return value or None


def _hub_id(cfg) -> str | None:
    """model.hf.source when it is not a folder on this machine: a hub id, which transformers would download."""
    source = cfg.model.hf.source
    if cfg.model.name != "hf" or not source:
        return None
    try:
        return None if Path(source).expanduser().is_dir() else source
    except RuntimeError:  # '~someone/...' of no such user: not a folder here
        return source


# DeepSpeed settings that are numbers, precisions and ZeRO's partitioning: Trainbook reads or fills them, and
# DeepSpeed neither imports nor writes by them. Anything else in engine.deepspeed is DeepSpeed's to act on (its
# monitors log to servers or write to paths, torch_autocast imports modules by name, the flops profiler writes its
# output_file, NVMe offload writes swap files at nvme_path).
PLAIN_DEEPSPEED = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "gradient_clipping",
    "steps_per_print",
    "wall_clock_breakdown",
    "memory_breakdown",
    "optimizer",
    "scheduler",
    "zero_optimization",
    "fp16",
    "bf16",
    "bfloat16",
    "prescale_gradients",
    "gradient_predivide_factor",
    "communication_data_type",
    "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
    "sparse_gradients",
    "managed_gradient_accumulation",
}
NVME_PATHS = ("offload_param", "offload_optimizer")


def _deepspeed_actions(cfg) -> dict | None:
    """The settings of engine.deepspeed that DeepSpeed acts on by itself (see PLAIN_DEEPSPEED), or None."""
    ds = cfg.engine.deepspeed or {}
    found = {key: value for key, value in ds.items() if key not in PLAIN_DEEPSPEED}
    zero = ds.get("zero_optimization")
    for section in NVME_PATHS:
        offload = zero.get(section) if isinstance(zero, dict) else None
        if isinstance(offload, dict) and offload.get("nvme_path"):
            found[f"zero_optimization.{section}.nvme_path"] = offload["nvme_path"]
    return found or None


def _new_workspace(cfg) -> str | None:
    """data.workspace when no workspace is there yet: opening it would make one (a catalogue, a datastore, with
    tracking.mlflow=always an MLflow store) wherever the config says."""
    where = cfg.data.workspace
    try:
        return where if where and not (Path(where).expanduser() / paths.CATALOGUE_NAME).is_file() else None
    except RuntimeError:
        return where


ACTING_FIELDS = (
    ActingField("model.factory", RUNS_CODE, lambda cfg: _set(cfg.model.factory)),
    ActingField("model.loss", RUNS_CODE, lambda cfg: _set(cfg.model.loss)),
    ActingField("model.code_path", RUNS_CODE, lambda cfg: _set(cfg.model.code_path)),  # first on sys.path
    ActingField("model.hf.source", REACHES_NETWORK, _hub_id, verbs=("resume", "export", "evaluate")),
    ActingField(
        "tracking.mlflow_uri",
        REACHES_NETWORK,
        lambda cfg: _set(cfg.tracking.mlflow_uri) if cfg.tracking.mlflow != "never" else None,
    ),
    # the whole section: where it listens is part of what is vouched for
    ActingField("debug", OPENS_PORT, lambda cfg: dataclasses.asdict(cfg.debug) if cfg.debug.enabled else None),
    ActingField("engine.deepspeed", DEEPSPEED_ACTS, _deepspeed_actions),
    ActingField("data.workspace", WRITES_OUTSIDE, _new_workspace, verbs=("resume", "evaluate")),
)


def acting_values(cfg, verb: str | None = None) -> dict[str, object]:
    """{field: value} of the fields that would act (for ``verb`` only, when given)."""
    found = {}
    for f in ACTING_FIELDS:
        if verb is None or verb in f.verbs:
            value = f.value(cfg)
            if value is not None:
                found[f.name] = value
    return found


def _digest(run_path: Path, values: dict, key: str) -> str:
    """The signature of ``values`` for the run at ``run_path``: bound to its real path, so that a trust.json copied
    into another run (or the run moved elsewhere) vouches for nothing."""
    message = json.dumps(
        {"run": str(Path(run_path).resolve()), "values": values}, sort_keys=True, default=str, separators=(",", ":")
    ).encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def _key(create: bool) -> str | None:
    path = paths.user_config_dir() / KEY_NAME
    if create:
        made = key_files.ensure(path, "the run-signing key")
        if "replaced" in made.note:  # runs signed with the old key need --trust-run once more
            print(f"note: {made.note}; runs signed with the old key ask for {FLAG} again", file=sys.stderr)
        return made.key
    try:
        return key_files.read(path, "the run-signing key")
    except (FileNotFoundError, key_files.KeyFileError):
        return None  # no good key: nothing is signed by this user, so nothing is trusted without the flag


def sign(run_path: Path, cfg) -> None:
    """Vouch for ``cfg``'s acting values as this user's (they are, or the user said so): write the run's TRUST_FILE.
    Nothing is written for a config without acting fields, and an old signature is removed."""
    from toolkit.fsio import atomic_write_text

    values = acting_values(cfg)
    trust_file = run_path / TRUST_FILE
    if not values:
        trust_file.unlink(missing_ok=True)
        return
    signature = _digest(run_path, values, _key(create=True))
    atomic_write_text(trust_file, json.dumps({"hmac_sha256": signature, "fields": sorted(values)}, indent=1) + "\n")


def untrusted(run_path: Path, cfg, verb: str | None = None) -> dict[str, object]:
    """The acting fields (for ``verb``, when given) whose values this user has not vouched for: {} for the user's own
    run, or for a run whose config acts on nothing."""
    values = acting_values(cfg)
    if not values:
        return {}
    key = _key(create=False)
    if key is not None and hmac.compare_digest(_signature(run_path), _digest(run_path, values, key)):
        return {}
    return acting_values(cfg, verb) if verb else values


def _signature(run_path: Path) -> str:
    from toolkit.fsio import read_regular_file

    try:
        record = json.loads(read_regular_file(run_path / TRUST_FILE, field=TRUST_FILE, error=ValueError, limit=4096))
    except (OSError, ValueError):  # missing, a link, too big, not JSON: no signature
        return ""
    signature = record.get("hmac_sha256") if isinstance(record, dict) else None
    return signature if isinstance(signature, str) else ""


def describe(fields: dict[str, object]) -> str:
    """``model.factory='evil.py:build' (runs code), debug.enabled=True (opens a port)``."""
    effects = {f.name: f.effect for f in ACTING_FIELDS}
    return ", ".join(f"{name}={bounded_repr(value)} ({effects[name]})" for name, value in fields.items())


def require(run_path: Path, cfg, verb: str, trust_run: bool = False) -> None:
    """Before ``verb`` acts on a run's config: its acting fields are this user's, or ``trust_run`` (the user said so
    explicitly) signs them; else UntrustedRunError naming each field, its value, what it does and the flag."""
    fields = untrusted(run_path, cfg, verb)
    if not fields:
        return
    if trust_run:  # signed only when the refusal would have shown every field the signature covers
        if fields == acting_values(cfg):
            sign(run_path, cfg)
        return
    raise UntrustedRunError(
        refused(
            f"{run_path / 'config.yaml'}",
            f"sets {describe(fields)}, and this run was not made here by you (or those fields were changed since)",
            f"such fields in your own runs only, or once you have read the config and trust it, "
            f"`trainbook {verb} RUN_DIR {FLAG}` (or remove them)",
        )
    )
