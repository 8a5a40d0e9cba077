"""Any ``nn.Module`` from the user's code (``model.name: custom``).

    model:
      name: custom
      factory: mypackage.models:build        # or path/to/models.py:build; called with no arguments
      loss: mypackage.models:loss_of         # optional: (model, batch) -> loss; default: model(**batch)

The default adapter calls ``model(**batch)`` (batch keys: see toolkit.train.models) and takes the result if it is
a tensor, else its ``.loss`` (a Hugging Face style output) or its ``["loss"]``. Everything is checked before a run
directory exists (:func:`check`): the import, the attribute, that the factory returns an ``nn.Module``, and that
one forward on a small batch gives a finite scalar loss.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable

from toolkit.errors import bounded_repr, not_allowed, refused

FACTORY_ALLOWED = "'package.module:function' or 'path/to/file.py:function'"


class ModelImportError(ValueError):
    """An import path that does not import, lacks the attribute, or gives something unusable."""


def _split(field: str, spec: str) -> tuple[str, str]:
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr.isidentifier():
        raise ModelImportError(not_allowed(field, spec, FACTORY_ALLOWED, problem="is not an import path"))
    return where, attr


def is_file_path(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def source_file(field: str, spec: str) -> Path | None:
    """The .py file ``spec`` names or imports from (None for a module without one, e.g. a built-in)."""
    where, _ = _split(field, spec)
    if is_file_path(where):
        return Path(where).resolve()
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError) as exc:
        raise ModelImportError(not_allowed(field, spec, FACTORY_ALLOWED,
                                           problem=f"does not import ({type(exc).__name__}: {exc})")) from None
    if found is None:
        raise ModelImportError(not_allowed(field, spec, FACTORY_ALLOWED,
                                           problem=f"does not import (no module named {where!r} on sys.path; "
                                                   "run from the folder that holds it, or set PYTHONPATH)"))
    return Path(found.origin) if found.origin and found.origin.endswith(".py") else None


def resolve(field: str, spec: str) -> Callable:
    """The object ``spec`` names, imported; every failure is a ModelImportError naming ``field``."""
    where, attr = _split(field, spec)
    try:
        if is_file_path(where):
            path = Path(where).resolve()
            if not path.is_file():
                raise ModelImportError(not_allowed(field, spec, FACTORY_ALLOWED, problem=f"names {str(path)!r}, "
                                                                                         "which is not a file"))
            name = f"trainbook_user_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
            module = sys.modules.get(name)
            if module is None:
                loader_spec = importlib.util.spec_from_file_location(name, path)
                module = importlib.util.module_from_spec(loader_spec)
                sys.modules[name] = module  # dataclasses and pickling look their module up by name
                loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ModelImportError:
        raise
    except Exception as exc:  # the user's module may raise anything while it imports
        sys.modules.pop(locals().get("name", ""), None)
        raise ModelImportError(not_allowed(field, spec, FACTORY_ALLOWED,
                                           problem=f"does not import ({type(exc).__name__}: {exc})")) from None
    if not hasattr(module, attr):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ModelImportError(not_allowed(field, spec, f"a name it defines: {', '.join(public[:20]) or 'none'}",
                                           problem=f"has no attribute {attr!r}"))
    return getattr(module, attr)


def build(cfg):
    import torch.nn as nn

    factory = resolve("model.factory", cfg.factory)
    try:
        model = factory()
    except Exception as exc:
        raise ModelImportError(refused("model.factory", f"{cfg.factory} raised {type(exc).__name__}: {exc}",
                                       "a function that takes no arguments and returns an nn.Module")) from None
    if not isinstance(model, nn.Module):
        raise ModelImportError(not_allowed("model.factory", cfg.factory, "a function returning an nn.Module",
                                           problem=f"returned {bounded_repr(type(model).__name__)}"))
    return model


def default_loss(model, batch):
    """``model(**batch)``, and the loss in what it returns: the tensor itself, ``.loss`` or ``["loss"]``."""
    out = model(**batch)
    return loss_of(out, "model(**batch)")


def loss_of(out, call: str):
    import torch

    if isinstance(out, dict) and "loss" in out:
        out = out["loss"]
    elif not torch.is_tensor(out) and getattr(out, "loss", None) is not None:
        out = out.loss
    if not torch.is_tensor(out) or out.numel() != 1:
        shown = f"a tensor of shape {tuple(out.shape)}" if torch.is_tensor(out) else type(out).__name__
        raise ModelImportError(refused("model.loss", f"{call} returned {shown}, which holds no loss",
                                       "a scalar tensor, an object with .loss, a dict with 'loss', or model.loss set "
                                       "to 'module:function' taking (model, batch)"))
    return out.reshape(())


def loss_function(cfg) -> Callable:
    """The adapter: model.loss if set, else :func:`default_loss`."""
    if not cfg.loss:
        return default_loss
    function = resolve("model.loss", cfg.loss)

    def adapter(model, batch):
        return loss_of(function(model, batch), cfg.loss)

    return adapter
