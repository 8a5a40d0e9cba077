"""The files of a transformers model's export (model.name=hf): a folder plain transformers loads, plus ONNX where the
architecture exports, and a parity report.

    config.json, generation_config.json, model.safetensors   save_pretrained: AutoModelFor*.from_pretrained(folder)
    tokenizer files                                          the run's tokenizer's save(): AutoTokenizer loads them
    model.onnx                                               logits of input_ids, dynamic batch and sequence, when
                                                             torch.onnx.export handles the architecture
    parity.json                                              max |trained model - the folder reloaded by transformers|
                                                             and |trained model - ONNX Runtime|, per shape

An architecture ONNX cannot export still exports: the manifest's onnx_not_exported and parity.json say why, and
``--runtime onnx`` is refused naming it (toolkit.deploy.serving.options.check_runtime).
"""

from __future__ import annotations

import copy
import logging
import re
import warnings
from pathlib import Path

import torch

from toolkit.deploy import hf_folder, onnx_file

PARITY_TARGET = 1e-4  # float32, as for the built-in models
PARITY_BATCHES = (4, 3, 1)
PARITY_SEED = 1234
ONNX_MAX_BATCH = 4096


class _Logits(torch.nn.Module):
    """The model as ONNX sees it: int64 input_ids in, logits out (no cache, no attention mask: rows unpadded)."""

    def __init__(self, model, task: str):
        super().__init__()
        self.model, self.task = model, task

    def forward(self, input_ids):
        if self.task == "causal_lm":
            return self.model(input_ids=input_ids, use_cache=False).logits
        return self.model(input_ids=input_ids).logits


def _inputs(vocab: int, batch: int, seq: int) -> torch.Tensor:
    """Token ids for parity: seeded, uniform over the vocabulary (parity is about arithmetic, not about text, and
    an export must not need the run's data to still be there)."""
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(PARITY_SEED + batch))


def _root_cause(exc: BaseException) -> str:
    """The innermost error's type and first line: the exporter wraps what went wrong in its own generic error."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
    first_line = re.sub(r"\x1b\[[0-9;]*m", "", (str(exc).strip().splitlines() or [""])[0])  # no terminal colours
    return f"{type(exc).__name__}: {first_line}"


def _export_onnx(model, task: str, context: int, path: Path) -> tuple[int | None, str | None]:
    """(opset, None) once model.onnx is written; (None, why not) when torch.onnx.export fails on the architecture."""
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    dims = {
        0: torch.export.Dim("batch", min=1, max=ONNX_MAX_BATCH),
        1: torch.export.Dim("sequence", min=1, max=context),
    }
    example = _inputs(model.config.vocab_size, 2, min(16, context))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                _Logits(model, task),
                (example,),
                str(path),
                dynamo=True,
                input_names=["inputs"],
                output_names=["logits"],
                dynamic_shapes={"input_ids": dims},
                external_data=False,
                verbose=False,
            )
    except Exception as exc:  # torch.export fails in many ways on code it cannot trace: each is a reason, not a crash
        for leftover in path.parent.glob(path.name + "*"):
            leftover.unlink()
        return None, f"torch.onnx.export failed: {_root_cause(exc)}"[:300]
    return onnx_file.finish(path), None


def _parity(model, task: str, folder: Path, seq: int, onnx_path: Path | None, onnx_why: str | None) -> dict:
    """Logits of the trained model against the folder as transformers loads it (must be the same weights), and
    against ONNX Runtime when the export has model.onnx."""
    import numpy as np

    reloaded = hf_folder.load_model(folder, task)
    session = None
    if onnx_path is not None:
        import onnxruntime as ort

        session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    shapes = []
    with torch.no_grad():
        for batch, length in zip(PARITY_BATCHES, (seq, min(17, seq), 1)):
            x = _inputs(model.config.vocab_size, batch, length)
            eager = hf_folder.model_logits(model, task, x).numpy()
            diffs = {"transformers": float(np.abs(eager - hf_folder.model_logits(reloaded, task, x).numpy()).max())}
            if session is not None:
                served = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
                diffs["onnxruntime"] = float(np.abs(eager - served).max())
            shapes.append(
                {"shape": list(x.shape), "values": int(eager.size), "max_abs_diff": max(diffs.values()), **diffs}
            )
    compared = ["transformers from_pretrained"] + (["onnxruntime"] if session is not None else [])
    return {
        "target": PARITY_TARGET,
        "dtype": "float32",
        "inputs": f"random token ids (seed {PARITY_SEED})",
        "compared": compared,
        "onnx": "exported" if session is not None else f"not exported: {onnx_why}",
        "max_abs_diff": max(s["max_abs_diff"] for s in shapes),
        "shapes": shapes,
    }


def _name_labels(model, names: list[str] | None) -> None:
    """A classifier trained on class names (the run's lineage lists them in id order) answers with them: config.json's
    id2label becomes the names where it holds transformers' placeholders (LABEL_0, LABEL_1, ...)."""
    config = model.config
    placeholders = {i: f"LABEL_{i}" for i in range(config.num_labels)}
    if names and len(names) == config.num_labels and dict(config.id2label) == placeholders:
        config.id2label = {i: str(name) for i, name in enumerate(names)}
        config.label2id = {str(name): i for i, name in enumerate(names)}


def _save_model(model, tmp: Path) -> bool:
    """save_pretrained's files (transformers 5 writes safetensors only); True when LoRA adapters are kept separate.
    A peft model (model.lora.merge_on_export false) is saved as its base and its adapter side by side:
    from_pretrained on the folder loads the base and applies the adapter (transformers does when peft is installed)."""
    from peft import PeftModel

    from toolkit.third_party import import_deepspeed

    # save_pretrained unwraps the model through accelerate, which imports DeepSpeed where it is installed: imported
    # first as the toolkit does, its accelerator named, so DeepSpeed's "Setting accelerator to CPU" guess never
    # reaches a terminal or a notebook cell (06 printed it under its export)
    import_deepspeed()
    with hf_folder.quiet_progress():
        model.save_pretrained(str(tmp))  # a peft model: adapter_config.json and adapter_model.safetensors
        if not isinstance(model, PeftModel):
            return False
        (tmp / "README.md").unlink(missing_ok=True)  # peft's empty model card
        copy.deepcopy(model).unload().save_pretrained(str(tmp))  # the base without the adapter layers
    return True


def write_hf_export(model, cfg, tmp: Path, label_names: list[str] | None = None) -> tuple[dict, dict]:
    """Every file of a transformers model's folder into ``tmp``; returns (manifest fields, parity). ``label_names``:
    a classifier's class names in id order, when its data named them."""
    from toolkit.data.tokenizers import load_tokenizer

    task = cfg.model.hf.task
    model = model.float().eval()
    if task == "sequence_classification":
        _name_labels(model, label_names)
    lora = "separate" if _save_model(model, tmp) else "merged" if cfg.model.lora.rank else "none"
    tokenizer = load_tokenizer(cfg)
    tokenizer.save(tmp)
    context = hf_folder.context_length(model.config) or cfg.model.block_size
    opset, why = _export_onnx(model, task, context, tmp / "model.onnx")
    parity = _parity(model, task, tmp, min(cfg.model.block_size, context), tmp / "model.onnx" if opset else None, why)
    fields = {
        "task": task,
        "architecture": model.config.model_type,
        "tokenizer": tokenizer.key,
        "lora": lora,
        "onnx_opset": opset,
        "dynamic_axes": ["batch", "sequence"] if opset else [],
        "block_size": context,
    }
    if why:
        fields["onnx_not_exported"] = why
    if task == "sequence_classification":
        fields["labels"] = hf_folder.labels(tmp)
    return fields, parity
