"""Export a trained run for serving: ``RUN_DIR/model/`` with safetensors weights, ONNX, and a parity report.

    model/
      trainbook-model.json   manifest: format, files with sha256, the run, step, data lineage, ONNX opset
      model.safetensors      weights (never pickle: loading a model must not run code)
      model.onnx             the same network for ONNX Runtime, dynamic batch (and sequence) axes
      config.yaml            the run's resolved config (the model section builds the network)
      tokenizer.json         how text becomes input ids (bytes: id = byte value)
      parity.json            max |eager PyTorch - ONNX Runtime| on held-out inputs, per shape

A transformers model (model.name=hf) is written as a folder plain transformers loads (save_pretrained's
config.json, generation_config.json and model.safetensors, the tokenizer's own files), with ONNX where the
architecture exports: see toolkit.deploy.hf_export.

Weights come from the run's newest valid checkpoint, whatever the engine: torch's state dict, or DeepSpeed's
ZeRO files consolidated to fp32. The folder is assembled beside its destination (a hidden, locked staging folder),
fsynced and swapped into place in one step (see toolkit.fsio): after a crash at any point ``model/`` is
the previous complete export or the new one, never missing or partial. ``--out`` is checked first: only a
missing or empty folder or an earlier export is replaced.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

import torch

from toolkit import safe_load
from toolkit.checkpoint.store import CheckpointStore
from toolkit.train.models.preflight import BUILT_IN
from toolkit.errors import not_allowed
from toolkit.fsio import sha256_file, staging_folder
from toolkit.catalogue.model_format import (
    FORMAT,
    MANIFEST,
    MANIFEST_MAX_BYTES,
    ExportError,
    check_replaceable,
    publish_folder,
)
from toolkit.catalogue.model_format import read_manifest, verify_model_folder  # noqa: F401 (re-exported)
from toolkit import trust
from toolkit.deploy import onnx_file
from toolkit.rundir import RunDir

PARITY_TARGET = 1e-4  # float32: ONNX Runtime and eager PyTorch differ only by operator order
PARITY_SHAPES = ((4, None), (3, 17), (1, 1))  # (batch, sequence); None: the model's full context


# --- weights from a checkpoint, per engine ------------------------------------------------------------------


def _torch_weights(folder: Path, manifest: dict) -> dict:
    return safe_load.load(folder / "model.pt", map_location="cpu")


def _deepspeed_weights(folder: Path, manifest: dict) -> dict:
    from toolkit.train.engines.deepspeed_engine import DS_TAG

    if manifest.get("zero_stage", 0) == 0:  # no ZeRO partitions: the module's weights are saved whole
        (states,) = sorted((folder / DS_TAG).glob("mp_rank_*_model_states.pt"))[:1]
        weights = safe_load.load(states, map_location="cpu")["module"]
        return {k: v.float() for k, v in weights.items()}
    from toolkit.third_party import import_deepspeed

    import_deepspeed()
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    # Reassembles the fp32 master weights from every rank's optimizer partition (stages 1-3); a LoRA run saved its
    # adapters only (exclude_frozen_parameters), and the reader must be told so.
    lora = bool(((manifest.get("config") or {}).get("model") or {}).get("lora", {}).get("rank"))
    # DeepSpeed's reader unpickles with weights_only=False, and prints its progress: to stderr, as stdout is the
    # command's own (`export --json` prints one JSON document there)
    with safe_load.weights_only_everywhere(), contextlib.redirect_stdout(sys.stderr):
        return get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=DS_TAG, exclude_frozen_parameters=lora)


def _sharded_weights(folder: Path, manifest: dict) -> dict:
    """FSDP's shards, every rank's, each weight assembled whole (toolkit.checkpoint.sharded: nothing unpickled)."""
    from toolkit.checkpoint import sharded
    from toolkit.checkpoint.store import SHARDS

    return sharded.read_whole(folder / SHARDS, "model")


WEIGHT_READERS: dict[str, Callable[[Path, dict], dict]] = {
    "torch": _torch_weights,
    "deepspeed": _deepspeed_weights,
    "fsdp": _sharded_weights,
}


EXPORTABLE = (*BUILT_IN, "hf")  # models rebuilt from a config without running a user's code


def load_trained_model(run_dir: str | Path, trust_run: bool = False):
    """(model in eval mode, config, checkpoint info) from the run's newest valid checkpoint, for any model.name.

    The model is rebuilt as training built it (toolkit.train.models.prepare_model: the seed, the spec, and with
    LoRA the frozen base from model.hf.source / model.init_from and fresh adapters), then the checkpoint's weights
    are loaded over it: every weight, or with LoRA the adapters (all the checkpoint holds). With LoRA the result is
    the base with the adapters merged in (peft's merge_and_unload: a plain model of the base's class, e.g. a
    transformers LlamaForCausalLM) when model.lora.merge_on_export is true, else the peft PeftModel itself.
    Float32 on the CPU, whatever the training precision. A model.hf.source that is a hub id is fetched only for the
    user's own run, or with ``trust_run`` (toolkit.trust)."""
    from toolkit.train.engines.param_groups import load_trainable_state, trainable_only
    from toolkit.train.models import prepare_model

    run = RunDir(run_dir)
    if not run.config_path.exists():
        raise ExportError(f"run_dir: {str(run_dir)!r} is not a run directory (no config.yaml)")
    cfg = run.read_config()
    if cfg.model.name not in EXPORTABLE:
        # rebuilding a custom model would import and run the code its config.yaml names, from a run directory
        # that may have come from elsewhere (its weights stay readable in the checkpoint, through toolkit.safe_load)
        raise ExportError(
            not_allowed(
                "model.name",
                cfg.model.name,
                ", ".join(EXPORTABLE),
                problem=f"in {run.config_path} cannot be exported yet",
            )
        )
    trust.require(run.path, cfg, "export", trust_run)
    info, skipped = CheckpointStore(run.path).find_resume_point()
    if info is None:
        why = "; ".join(f"{s.name}: {s.reason}" for s in skipped) or "none was written"
        raise ExportError(
            not_allowed(
                "run_dir",
                run_dir,
                "a run with checkpoint.at_end or checkpoint.every_steps set",
                problem=f"has no valid checkpoint ({why})",
            )
        )
    engine = info.manifest.get("engine", "torch")
    state = WEIGHT_READERS[engine](info.path, info.manifest)
    model, _ = prepare_model(cfg, pretrained=trainable_only(cfg))  # the base only matters when it is not saved
    if trainable_only(cfg):
        try:
            load_trainable_state(model, state, info.path)
        except RuntimeError as exc:
            raise ExportError(str(exc)) from None
        if cfg.model.lora.merge_on_export:
            model = model.merge_and_unload()
        return model.float().eval(), cfg, info
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied weights (lm_head = wte) may be saved once; anything else missing or extra is a real mismatch.
    from toolkit.train.models.init_from import aliases

    tied = aliases(model)
    missing = [k for k in missing if not (tied.get(k, set()) - set(missing))]
    if missing or unexpected:
        raise ExportError(
            f"{info.path}: weights do not fit model {cfg.model.name} (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    return model.float().eval(), cfg, info


# --- the export ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportResult:
    path: Path
    manifest: dict
    parity: dict

    @property
    def parity_ok(self) -> bool:
        return self.parity["max_abs_diff"] <= self.parity["target"]

    def summary(self) -> str:
        p, m = self.parity, self.manifest
        onnx = (
            f"opset {m['onnx_opset']}, dynamic axes {m['dynamic_axes']}"
            if m["onnx_opset"] is not None
            else f"not exported ({m.get('onnx_not_exported')}); serve with --runtime torch"
        )
        weights = "safetensors" + (", a transformers folder (from_pretrained loads it)" if m["model"] == "hf" else "")
        compared = " and ".join(f"|torch - {c}|" for c in p.get("compared", ["onnxruntime"]))
        rows = [
            f"model folder  {self.path}",
            f"from          {m['run_dir']} ({m['checkpoint']}, {m['engine']})",
            f"weights       {m['parameters']:,} parameters, {weights}",
            f"onnx          {onnx}",
            f"parity        max {compared} = {p['max_abs_diff']:.2e} "
            f"over {sum(s['values'] for s in p['shapes']):,} logits ({'within' if self.parity_ok else 'OVER'} "
            f"the {p['target']:g} target)",
        ]
        return "\n".join(rows)


def _example_inputs(model_name: str, cfg, corpus, batch: int, seq: int | None) -> torch.Tensor:
    """Held-out inputs of a given shape: validation windows (text) or rows (tables)."""
    generator = torch.Generator().manual_seed(1234 + batch)
    example = corpus.batch("val", batch, generator)
    if corpus.pairs:  # preference pairs (DPO): the chosen answers are text like any other
        from toolkit.data.batch import CHOSEN, half

        example = half(example, CHOSEN)
    inputs = example["input_ids"] if "input_ids" in example else example["inputs"]
    return inputs[:, :seq] if seq is not None and inputs.dim() == 2 and model_name == "gpt" else inputs


# Which input axes may change size at serving time: batch always, sequence for the text model.
DYNAMIC_AXES = {"gpt": {0: "batch", 1: "sequence"}, "digits_mlp": {0: "batch"}}


def _export_onnx(model, example: torch.Tensor, model_name: str, block_size: int, path: Path) -> int:
    # The exporter logs that torchvision's ops are absent (we use none) and warns about a pytree API: noise here.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    axes = DYNAMIC_AXES[model_name]
    dims = {
        i: torch.export.Dim(name, min=1, max=block_size if name == "sequence" else 4096) for i, name in axes.items()
    }
    arg = next(iter(inspect.signature(model.forward).parameters))  # dynamic_shapes is keyed by argument name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.onnx.export(
            model,
            (example,),
            str(path),
            dynamo=True,
            input_names=["inputs"],
            output_names=["logits"],
            dynamic_shapes={arg: dims},
            external_data=False,
            verbose=False,
        )
    return onnx_file.finish(path)


def _parity(model, model_name: str, cfg, corpus, onnx_path: Path) -> dict:
    import numpy as np
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    shapes = []
    with torch.no_grad():
        for batch, seq in PARITY_SHAPES:
            x = _example_inputs(model_name, cfg, corpus, batch, seq)
            eager = model(x).numpy()
            served = session.run(None, {name: x.numpy()})[0]
            shapes.append(
                {"shape": list(x.shape), "values": int(eager.size), "max_abs_diff": float(np.abs(eager - served).max())}
            )
    return {
        "target": PARITY_TARGET,
        "dtype": "float32",
        "inputs": "held-out validation data",
        "max_abs_diff": max(s["max_abs_diff"] for s in shapes),
        "shapes": shapes,
    }


def export_run(run_dir: str | Path, out: str | Path | None = None, trust_run: bool = False) -> ExportResult:
    """Write ``RUN_DIR/model/`` (or ``out``) from the run's newest valid checkpoint; see the module docstring.
    ``out`` must be missing, empty or an earlier export: that is checked before any work."""
    run = RunDir(run_dir)
    out = Path(out) if out else run.path / "model"
    check_replaceable(out)
    model, cfg, info = load_trained_model(run_dir, trust_run)
    provenance = {
        "run_dir": str(run.path.resolve()),
        "checkpoint": info.name,
        "step": info.step,
        "engine": info.manifest.get("engine", "torch"),
        "zero_stage": info.manifest.get("zero_stage", 0),
        "data": run.read_lineage().get("data", {}),
    }
    return write_model_folder(model, cfg, out, provenance)


PROVENANCE = ("run_dir", "checkpoint", "step", "engine", "zero_stage", "data")


def write_model_folder(model, cfg, out: str | Path, provenance: dict) -> ExportResult:
    """The export of ``model`` (trained under ``cfg``) at ``out``, published in one step; ``provenance`` says where
    the weights came from (PROVENANCE's fields: the run, its checkpoint and data). export_run's writer, and the way
    to export a model trained outside a run."""
    out = Path(out)
    check_replaceable(out)
    with staging_folder(out) as tmp:
        if cfg.model.name == "hf":
            from toolkit.deploy.hf_export import write_hf_export

            fields, parity = write_hf_export(model, cfg, tmp, (provenance.get("data") or {}).get("label_names"))
        else:
            fields, parity = _write_builtin(model, cfg, tmp)
        (tmp / "config.yaml").write_text(cfg.to_yaml())  # what was read and validated, never a copy of the run's file
        (tmp / "parity.json").write_text(json.dumps(parity, indent=1))
        manifest = _write_manifest(tmp, model, cfg, provenance, fields, parity)
        publish_folder(tmp, out)
    return ExportResult(out, manifest, parity)


def _write_builtin(model, cfg, tmp: Path) -> tuple[dict, dict]:
    """The built-in models' files (weights, tokenizer, ONNX) into ``tmp``; returns (manifest fields, parity)."""
    from safetensors.torch import save_model

    from toolkit.data.corpus import load_corpus
    from toolkit.data.tokenizers import load_tokenizer

    corpus = load_corpus(cfg)
    save_model(model, str(tmp / "model.safetensors"))  # drops the tied duplicate (lm_head = wte) safely
    fields = {}
    if cfg.model.name == "gpt":
        tokenizer = load_tokenizer(cfg)
        tokenizer.save(tmp)
        fields["tokenizer"] = tokenizer.key  # the endpoint reads bytes without loading transformers
    else:
        (tmp / "tokenizer.json").write_text(
            json.dumps({"type": "features", "inputs": "float32 rows, scaled as in training"}, indent=1)
        )
    example = _example_inputs(cfg.model.name, cfg, corpus, 2, None)
    opset = _export_onnx(model, example, cfg.model.name, getattr(cfg.model, "block_size", 1), tmp / "model.onnx")
    parity = _parity(model, cfg.model.name, cfg, corpus, tmp / "model.onnx")
    return {
        **fields,
        "onnx_opset": opset,
        "dynamic_axes": list(DYNAMIC_AXES[cfg.model.name].values()),
        "block_size": getattr(cfg.model, "block_size", None),
    }, parity


def _write_manifest(tmp: Path, model, cfg, provenance: dict, fields: dict, parity: dict) -> dict:
    """The manifest, written last: every file of ``tmp`` with its size and sha256, and where the weights came from."""
    from toolkit.catalogue.lineage import package_versions

    files = sorted(p.name for p in tmp.iterdir())
    manifest = {
        "format": FORMAT,
        "model": cfg.model.name,
        "parameters": sum(p.numel() for p in model.parameters()),
        **{key: provenance[key] for key in PROVENANCE},
        "config_sha256": cfg.fingerprint(),
        **fields,
        "parity_max_abs_diff": parity["max_abs_diff"],
        "exported": time.time(),
        "packages": package_versions(),
        "files": {name: {"sha256": sha256_file(tmp / name), "size": (tmp / name).stat().st_size} for name in files},
    }
    text = json.dumps(manifest, indent=1)
    size = len(text.encode())
    if size > MANIFEST_MAX_BYTES:  # every reader (serve, register, deploy-plan) would refuse it: publish nothing
        data = len(json.dumps(provenance.get("data")).encode())
        raise ExportError(
            f"the manifest would be {size:,} bytes, over the {MANIFEST_MAX_BYTES:,} bytes its readers accept; "
            f"its provenance 'data' (the run's lineage.json) is {data:,} bytes of it. Nothing was written."
        )
    (tmp / MANIFEST).write_text(text)
    return manifest
