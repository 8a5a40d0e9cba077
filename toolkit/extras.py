"""Which pyproject extra installs an optional package, so a core-only install (`pip install trainbook`) that reaches
for one says what to install instead of a bare ModuleNotFoundError.

Core (training, checkpoints, data) never imports these at module level; each is imported where it is used.
"""

from __future__ import annotations

from toolkit.errors import refused

# Imported module (or dotted prefix) -> (distribution, extra). The longest matching prefix wins, so
# azure.identity names its own distribution while the rest of the azure namespace names azure-ai-ml.
OPTIONAL_IMPORTS = {
    "mlflow": ("mlflow-skinny", "tracking"),
    "onnx": ("onnx", "serve"),
    "onnxscript": ("onnxscript", "serve"),
    "onnxruntime": ("onnxruntime", "serve"),
    "azure": ("azure-ai-ml", "azure"),
    "azure.identity": ("azure-identity", "azure"),
    "azureml_inference_server_http": ("azureml-inference-server-http", "azure"),
    "matplotlib": ("matplotlib", "notebook"),
    "ipywidgets": ("ipywidgets", "notebook"),
    "papermill": ("papermill", "notebook"),
    "pytest": ("pytest", "test"),
    "playwright": ("playwright", "test"),
}
# The extras an Azure ML job or serving image gets on top of core (environment.yml): no notebook or test tools.
JOB_IMAGE_EXTRAS = ("serve", "azure", "tracking")


def missing_extra_message(exc: ModuleNotFoundError, what: str) -> str | None:
    """The user-facing error for ``exc`` raised while doing ``what`` (e.g. 'trainbook export'), or None when the
    missing module belongs to no extra (a broken core install is a different problem and keeps its traceback)."""
    name = exc.name or ""
    prefixes = [p for p in OPTIONAL_IMPORTS if name == p or name.startswith(p + ".")]
    if not prefixes:
        return None
    distribution, extra = OPTIONAL_IMPORTS[max(prefixes, key=len)]
    return refused(
        None,
        f"{what} needs {distribution} (module {name!r} is not installed), which comes with the '{extra}' extra",
        f"pip install 'trainbook[{extra}]' (in a checkout, `make setup` installs every extra)",
    )
