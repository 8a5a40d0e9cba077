"""The model behind an endpoint: ``forward(ids) -> logits`` over an exported model folder, in ONNX Runtime or
eager PyTorch. Both take int64 ids of shape (batch, sequence) and return float32 logits: (batch, sequence, vocab)
for a language model, (batch, labels) for a classifier.

Every runtime also has the folder's ``tokenizer`` (encode, decode, eos_ids), its ``tasks`` (what requests it
answers), ``block_size`` (its context) and ``labels`` (a classifier's class names); a transformers causal LM on
torch also offers ``decoder()``, a batched KV cache (toolkit.deploy.serving.kv_cache) to generate with.

The torch runtimes run on the first GPU when the server process sees one (``device``; CUDA_VISIBLE_DEVICES= keeps
an endpoint on the CPU), ONNX Runtime on the CPU. The device is chosen in the process that serves (gunicorn's worker,
after its fork), never before: CUDA does not survive a fork.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from collections.abc import Callable

import numpy as np

from toolkit.deploy.serving.options import WEIGHTS, check_runtime, served_tasks
from toolkit.errors import RefusedValue, not_allowed
from toolkit.train.models.preflight import BUILT_IN  # what TorchRuntime builds: no user code, no hub


def serving_device():
    """Where a torch runtime puts its model: the first GPU this process sees, else the CPU."""
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


class OnnxRuntime:
    name = "onnx"
    device = "cpu"  # CPUExecutionProvider

    def __init__(self, model_dir: Path):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 3  # warnings about unused initialisers are noise in a server log
        # ORT's worker threads spin after each run waiting for the next; in a server the request threads need
        # those cycles (on 2 cores spinning halved the endpoint's throughput), so they sleep instead.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(
            str(model_dir / WEIGHTS[self.name]), options, providers=["CPUExecutionProvider"]
        )
        self.input_name = self.session.get_inputs()[0].name

    def forward(self, ids: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: ids})[0]


class TorchRuntime:
    """A built-in model in eager PyTorch, built from the export's config.yaml."""

    name = "torch"

    def __init__(self, model_dir: Path):
        import torch
        import yaml
        from safetensors.torch import load_model

        from toolkit import config as config_mod
        from toolkit.train.models import build_model

        cfg = config_mod.from_dict(yaml.safe_load((model_dir / "config.yaml").read_text()))
        # An export from elsewhere is data: its config.yaml may only name the built-in it was exported as (a
        # custom model's factory would be imported and run; an hf source fetched), whatever its manifest says.
        if cfg.model.name not in BUILT_IN:
            raise RefusedValue(
                not_allowed(
                    "model",
                    cfg.model.name,
                    ", ".join(BUILT_IN),
                    problem=f"in {model_dir / 'config.yaml'} is not a built-in model this runtime builds",
                )
            )
        self.model = build_model(cfg.model)
        load_model(self.model, str(model_dir / WEIGHTS[self.name]), strict=False)  # the tied lm_head is shared
        self.device = serving_device()
        self.model.to(self.device).eval()  # in place: the tied lm_head stays the embedding's
        self._torch = torch

    def forward(self, ids: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            return self.model(self._torch.from_numpy(ids).to(self.device)).float().cpu().numpy()


class HFRuntime:
    """A transformers model in eager PyTorch, from the folder's safetensors through from_pretrained (local files
    only, no remote code)."""

    name = "torch"

    def __init__(self, model_dir: Path, task: str):
        import torch

        from toolkit.deploy.hf_folder import load_model
        from toolkit.deploy.serving.kv_cache import supports_batched_cache

        self.task = task
        self.device = serving_device()
        self.model = load_model(model_dir, task).to(self.device)
        self.kv_cache = task == "causal_lm" and supports_batched_cache(self.model)
        self._torch = torch

    def forward(self, ids: np.ndarray) -> np.ndarray:
        from toolkit.deploy.hf_folder import model_logits

        with self._torch.inference_mode():
            ids = self._torch.from_numpy(ids).to(self.device)
            return model_logits(self.model, self.task, ids).float().cpu().numpy()

    def decoder(self):
        """A new batched KV cache over this model (None when its cache cannot be batched: then it generates by
        recomputing its context, as ONNX Runtime does)."""
        from toolkit.deploy.serving.kv_cache import CachedDecoder

        return CachedDecoder(self.model) if self.kv_cache else None


# runtime name -> model family -> how it loads a folder
RUNTIMES: dict[str, dict[str, Callable]] = {
    "onnx": {"gpt": lambda folder, task: OnnxRuntime(folder), "hf": lambda folder, task: OnnxRuntime(folder)},
    "torch": {"gpt": lambda folder, task: TorchRuntime(folder), "hf": HFRuntime},
}


def load_runtime(model_dir: str | Path, name: str | None = None):
    """The runtime ``name`` (None: the folder's default) over ``model_dir`` (an exported folder, every file checked
    against its manifest: a changed byte is refused, naming the file); the error names the field and the choices."""
    from toolkit.deploy import hf_folder
    from toolkit.catalogue.model_format import verify_model_folder

    if name is not None and name not in RUNTIMES:
        raise RefusedValue(not_allowed("runtime", name, ", ".join(RUNTIMES)))
    model_dir = Path(model_dir)
    manifest = verify_model_folder(model_dir)
    tasks = served_tasks(manifest)
    name = check_runtime(model_dir, manifest, name)
    family = manifest["model"]
    with hf_folder.quiet_progress() if family == "hf" else contextlib.nullcontext():
        runtime = RUNTIMES[name][family](model_dir, manifest.get("task"))
    runtime.tasks = tasks
    runtime.block_size = manifest["block_size"]
    runtime.manifest = manifest
    eos = hf_folder.eos_ids(model_dir) if family == "hf" else frozenset()
    runtime.tokenizer = hf_folder.load_tokenizer(model_dir, eos, manifest.get("tokenizer"))
    runtime.labels = hf_folder.labels(model_dir) if "classify" in tasks else None
    return runtime


def find_model_dir(root: str | Path) -> Path:
    """Azure ML mounts a registered model under AZUREML_MODEL_DIR inside a folder named as it was uploaded; a
    local endpoint points straight at the folder. Accept both."""
    from toolkit.catalogue.model_format import MANIFEST

    root = Path(root)
    if (root / MANIFEST).is_file():
        return root
    found = sorted(p.parent for p in root.glob(f"*/{MANIFEST}"))
    if not found:
        raise FileNotFoundError(f"AZUREML_MODEL_DIR: no {MANIFEST} in {root} or one folder below")
    return found[0]


def describe(runtime) -> dict:
    m = runtime.manifest
    return {
        "runtime": runtime.name,
        "model": m["model"],
        "tasks": list(runtime.tasks),
        "parameters": m["parameters"],
        "step": m["step"],
        "block_size": runtime.block_size,
        "tokenizer": runtime.tokenizer.name,
        "kv_cache": getattr(runtime, "kv_cache", False),
        "device": str(getattr(runtime, "device", "cpu")),
        "run": Path(m["run_dir"]).name,
        "data": (m.get("data") or {}).get("name"),
    }
