"""Any ``nn.Module`` from the user's code (``model.name: custom``).

    model:
      name: custom
      factory: mypackage.models:build        # or path/to/models.py:build; called with no arguments
      loss: mypackage.models:loss_of         # optional: (model, batch) -> loss; default: model(**batch)
      code_path: /path/to/project            # optional: put first on sys.path (set at launch, see pin)

The default adapter calls ``model(**batch)`` (batch keys: see toolkit.train.models) and takes the result if it is
a tensor, else its ``.loss`` (a Hugging Face style output) or its ``["loss"]``. Everything is checked before a run
directory exists (toolkit.train.models.preflight): the import, the attribute, that the factory returns an
``nn.Module``, and that one forward on a small batch gives a finite scalar loss.

At launch :func:`pin` makes the run independent of the folder it was started from: a relative file path becomes
absolute, and a module path found in the user's own code (not an installed package) gets model.code_path, the
folder it was found in, so every rank, restart and resume imports the same code.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
import sysconfig
from pathlib import Path
from collections.abc import Callable

from toolkit.errors import UserError, bounded_repr, not_allowed, refused

FACTORY_ALLOWED = "'package.module:function' or 'path/to/file.py:function'"


class ModelImportError(UserError, ValueError):
    """An import path that does not import, lacks the attribute, or gives something unusable."""


def split_spec(field: str, spec: str) -> tuple[str, str]:
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr.isidentifier():
        raise ModelImportError(not_allowed(field, spec, FACTORY_ALLOWED, problem="is not an import path"))
    return where, attr


def is_file_path(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def _file(where: str, code_path: str) -> Path:
    """A file path of an import spec: relative ones are read from model.code_path when it is set."""
    path = Path(where).expanduser()
    return (Path(code_path) / path if code_path and not path.is_absolute() else path).resolve()


def _importable_from(code_path: str) -> None:
    if code_path and code_path not in sys.path:
        sys.path.insert(0, code_path)


def source_file(field: str, spec: str, code_path: str = "") -> Path | None:
    """The .py file ``spec`` names or imports from (None for a module without one, e.g. a built-in)."""
    where, _ = split_spec(field, spec)
    if is_file_path(where):
        return _file(where, code_path)
    _importable_from(code_path)
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError) as exc:
        raise ModelImportError(
            not_allowed(field, spec, FACTORY_ALLOWED, problem=f"does not import ({type(exc).__name__}: {exc})")
        ) from None
    if found is None:
        raise ModelImportError(
            not_allowed(
                field,
                spec,
                FACTORY_ALLOWED,
                problem=f"does not import (no module named {where!r} on sys.path; "
                "run from the folder that holds it, or set PYTHONPATH)",
            )
        )
    return Path(found.origin) if found.origin and found.origin.endswith(".py") else None


def resolve(field: str, spec: str, code_path: str = "") -> Callable:
    """The object ``spec`` names, imported (``code_path`` first on sys.path); every failure is a ModelImportError
    naming ``field``."""
    where, attr = split_spec(field, spec)
    _importable_from(code_path)
    try:
        if is_file_path(where):
            path = _file(where, code_path)
            if not path.is_file():
                raise ModelImportError(
                    not_allowed(field, spec, FACTORY_ALLOWED, problem=f"names {str(path)!r}, which is not a file")
                )
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
        raise ModelImportError(
            not_allowed(field, spec, FACTORY_ALLOWED, problem=f"does not import ({type(exc).__name__}: {exc})")
        ) from None
    if not hasattr(module, attr):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise ModelImportError(
            not_allowed(
                field,
                spec,
                f"a name it defines: {', '.join(public[:20]) or 'none'}",
                problem=f"has no attribute {attr!r}",
            )
        )
    return getattr(module, attr)


def build(cfg):
    import torch.nn as nn

    factory = resolve("model.factory", cfg.factory, cfg.code_path)
    try:
        model = factory()
    except Exception as exc:
        raise ModelImportError(
            refused(
                "model.factory",
                f"{cfg.factory} raised {type(exc).__name__}: {exc}",
                "a function that takes no arguments and returns an nn.Module",
            )
        ) from None
    if not isinstance(model, nn.Module):
        raise ModelImportError(
            not_allowed(
                "model.factory",
                cfg.factory,
                "a function returning an nn.Module",
                problem=f"returned {bounded_repr(type(model).__name__)}",
            )
        )
    return model


AC_ALLOWED = "false, or a module with a gradient_checkpointing_enable() method (as transformers models have)"


def check_activation_checkpointing(cfg, model) -> None:
    """model.activation_checkpointing on the user's module needs its own gradient_checkpointing_enable(): which parts
    to recompute is the module's to say."""
    if cfg.activation_checkpointing and not callable(getattr(model, "gradient_checkpointing_enable", None)):
        raise ModelImportError(
            not_allowed(
                "model.activation_checkpointing",
                True,
                AC_ALLOWED,
                problem=f"needs the module to have gradient_checkpointing_enable(), "
                f"and {type(model).__name__} from {cfg.factory} has none",
            )
        )


def enable_activation_checkpointing(cfg, model) -> None:
    """The module's own gradient_checkpointing_enable(), asked for torch's non-reentrant checkpoint where it takes
    transformers' keyword."""
    import inspect

    check_activation_checkpointing(cfg, model)
    enable = model.gradient_checkpointing_enable
    try:
        takes_kwargs = "gradient_checkpointing_kwargs" in inspect.signature(enable).parameters
    except (TypeError, ValueError):  # a callable without a signature to read
        takes_kwargs = False
    if takes_kwargs:
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        enable()


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
        raise ModelImportError(
            refused(
                "model.loss",
                f"{call} returned {shown}, which holds no loss",
                "a scalar tensor, an object with .loss, a dict with 'loss', or model.loss set "
                "to 'module:function' taking (model, batch)",
            )
        )
    return out.reshape(())


def loss_function(cfg) -> Callable:
    """The adapter: model.loss if set, else :func:`default_loss`."""
    if not cfg.loss:
        return default_loss
    function = resolve("model.loss", cfg.loss, cfg.code_path)

    def adapter(model, batch):
        return loss_of(function(model, batch), cfg.loss)

    return adapter


# --- launch: pin the import paths; lineage: what was imported ---------------------------------------------------


def specs(cfg) -> list[tuple[str, str]]:
    """(field, import spec) of the user's code a ModelConfig names: the factory, and the loss when set."""
    return [(field, spec) for field, spec in (("model.factory", cfg.factory), ("model.loss", cfg.loss)) if spec]


def _installed(root: Path) -> bool:
    """Is ``root`` where installed packages live (the standard library, site-packages)? Those import anywhere."""
    places = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(root == Path(p).resolve() or Path(p).resolve() in root.parents for p in places)


def import_root(where: str) -> Path | None:
    """The sys.path folder the top-level package or module of the dotted ``where`` is found in (None: not found,
    or nothing to pin: a built-in or an installed package)."""
    top = where.partition(".")[0]
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    if found.origin and found.origin.endswith(".py"):  # pkg/__init__.py or mod.py
        origin = Path(found.origin).resolve()
        root = origin.parent.parent if found.submodule_search_locations else origin.parent
    elif found.submodule_search_locations:  # a namespace package: no __init__.py
        root = Path(next(iter(found.submodule_search_locations))).resolve().parent
    else:
        return None
    return None if _installed(root) else root


def pin(cfg):
    """``cfg`` (a ModelConfig) with relative file paths made absolute and, for a module path of the user's own
    code, model.code_path set to the folder it imports from: the run no longer depends on the current folder."""
    changes = {}
    code_path = cfg.code_path and str(Path(cfg.code_path).expanduser().resolve())
    for field, spec in specs(cfg):
        where, attr = split_spec(field, spec)
        if is_file_path(where):
            changes[field.split(".")[1]] = f"{_file(where, code_path)}:{attr}"
        elif not code_path:
            root = import_root(where)
            code_path = str(root) if root is not None else ""
    return dataclasses.replace(cfg, **changes, code_path=code_path or "")


def code_lineage(cfg) -> dict:
    """What the run imports, for lineage.json: each import path, the file that defines what it names (a package's
    module, not its __init__.py) and that file's sha256."""
    import inspect

    from toolkit.fsio import sha256_file

    out = {"code_path": cfg.code_path} if cfg.code_path else {}
    for field, spec in specs(cfg):
        try:
            defined = inspect.getsourcefile(resolve(field, spec, cfg.code_path))
        except TypeError:  # a callable instance or a built-in: the module's file is what there is
            defined = None
        path = Path(defined) if defined else source_file(field, spec, cfg.code_path)
        out[field.split(".")[1]] = {
            "import": spec,
            "file": str(path) if path else None,
            "sha256": sha256_file(path) if path and path.is_file() else None,
        }
    return out
