"""The model behind an endpoint: ``forward(ids) -> logits`` over an exported model folder, in ONNX Runtime or
eager PyTorch. Both take int64 ids of shape (batch, sequence) and return float32 logits (batch, sequence, vocab)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np

from toolkit.deploy.serving.options import WEIGHTS
from toolkit.errors import not_allowed


class OnnxRuntime:
    name = "onnx"

    def __init__(self, model_dir: Path):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3  # warnings about unused initialisers are noise in a server log
        # ORT's worker threads spin after each run waiting for the next; in a server the request threads need
        # those cycles (on 2 cores spinning halved the endpoint's throughput), so they sleep instead.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(model_dir / WEIGHTS[self.name]), options,
                                            providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def forward(self, ids: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: ids})[0]


class TorchRuntime:
    name = "torch"

    def __init__(self, model_dir: Path):
        import torch
        import yaml
        from safetensors.torch import load_model

        from toolkit import config as config_mod
        from toolkit.train.models import build_model

        cfg = config_mod.from_dict(yaml.safe_load((model_dir / "config.yaml").read_text()))
        self.model = build_model(cfg.model)
        load_model(self.model, str(model_dir / WEIGHTS[self.name]), strict=False)  # the tied lm_head is shared
        self.model.eval()
        self._torch = torch

    def forward(self, ids: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            return self.model(self._torch.from_numpy(ids)).numpy()


RUNTIMES: dict[str, Callable[[Path], object]] = {"onnx": OnnxRuntime, "torch": TorchRuntime}


def load_runtime(model_dir: str | Path, name: str):
    """The runtime ``name`` over ``model_dir`` (an exported folder, every file checked against its manifest:
    a changed byte is refused, naming the file); the error names the field and the choices."""
    from toolkit.deploy.model_format import verify_model_folder

    if name not in RUNTIMES:
        raise ValueError(not_allowed("runtime", name, ", ".join(RUNTIMES)))
    model_dir = Path(model_dir)
    manifest = verify_model_folder(model_dir)
    if manifest["model"] != "gpt":
        raise ValueError(not_allowed("model", manifest["model"], "gpt", problem="cannot be served as text"))
    runtime = RUNTIMES[name](model_dir)
    runtime.block_size = manifest["block_size"]
    runtime.manifest = manifest
    return runtime


def find_model_dir(root: str | Path) -> Path:
    """Azure ML mounts a registered model under AZUREML_MODEL_DIR inside a folder named as it was uploaded; a
    local endpoint points straight at the folder. Accept both."""
    from toolkit.deploy.model_format import MANIFEST

    root = Path(root)
    if (root / MANIFEST).is_file():
        return root
    found = sorted(p.parent for p in root.glob(f"*/{MANIFEST}"))
    if not found:
        raise FileNotFoundError(f"AZUREML_MODEL_DIR: no {MANIFEST} in {root} or one folder below")
    return found[0]


def describe(runtime) -> dict:
    m = runtime.manifest
    return {"runtime": runtime.name, "model": m["model"], "parameters": m["parameters"], "step": m["step"],
            "block_size": runtime.block_size, "run": Path(m["run_dir"]).name,
            "data": (m.get("data") or {}).get("name")}
