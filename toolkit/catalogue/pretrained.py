"""Where pretrained weights come from (``model.init_from``, and the weights of ``model.hf.source``): a folder in
``save_pretrained`` layout, a Trainbook export, or a registered model ``NAME[:VERSION]``. Safetensors only: a
pickled checkpoint (pytorch_model.bin) could run code when loaded, so it is refused, never read.

    pin_init_from(value, workspace)   an absolute folder, so the run, its restarts and resumes read the same weights
                                      whatever the current folder and whatever version is registered later
    weights = open_weights(value)     the folder's safetensors files, checked: no link, nothing outside the folder,
                                      an export's files against its manifest (every byte)
    weights.shapes()                  {tensor name: shape} from the files' headers (no tensor is read)
    weights.load()                    {tensor name: tensor}
    weights.lineage()                 what the weights are: kind, folder, each file's size and sha256
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from toolkit import fsio, names
from toolkit.errors import UserError, bounded_repr, not_allowed, refused

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.bin")
INDEX_MAX_BYTES = 64 << 20  # a tensor-name -> shard map: kilobytes, megabytes for the largest models
EXPORT_MANIFEST = "trainbook-model.json"  # toolkit.catalogue.model_format.MANIFEST, named here without importing it
INIT_FROM_ALLOWED = (
    "a folder in save_pretrained layout (model.safetensors, or shards with "
    "model.safetensors.index.json), a folder written by `trainbook export`, or a registered model "
    "NAME[:VERSION] (`trainbook models`)"
)


class PretrainedError(UserError, ValueError):
    """Weights that cannot be used: missing, pickled, outside their folder, or not the model's; the message names the
    field, the value and what is allowed."""


@dataclass(frozen=True)
class PretrainedWeights:
    kind: str  # "save_pretrained" or "export"
    folder: Path
    files: tuple[Path, ...]  # safetensors files, in the order they are read
    manifest: dict | None = None  # an export's verified manifest

    def shapes(self) -> dict[str, tuple[int, ...]]:
        from safetensors import safe_open

        shapes = {}
        for path in self.files:
            with safe_open(str(path), framework="pt") as f:
                shapes.update({key: tuple(f.get_slice(key).get_shape()) for key in f.keys()})
        return shapes

    def load(self) -> dict:
        from safetensors.torch import load_file

        state = {}
        for path in self.files:
            state.update(load_file(str(path)))
        return state

    def lineage(self) -> dict:
        if self.manifest is not None:  # verified against these bytes when opened: no second read
            listed = self.manifest["files"]
            files = {p.name: listed[p.name] for p in self.files}
        else:
            files = {p.name: {"size": p.stat().st_size, "sha256": fsio.sha256_file(p)} for p in self.files}
        return {"kind": self.kind, "folder": str(self.folder), "files": files}


def _regular(path: Path, field: str, folder: Path) -> Path:
    if not path.is_file():
        raise PretrainedError(not_allowed(field, folder, "weight files that exist", problem=f"lacks {path.name}"))
    return path


def weight_files(folder: Path, field: str) -> tuple[Path, ...]:
    """The safetensors files of a save_pretrained folder: model.safetensors, or the shards its index names; the
    folder holding no link, FIFO or device (toolkit.fsio.check_plain_folder: it is read by name, by us and by
    transformers)."""
    fsio.check_plain_folder(folder, field=field, error=PretrainedError)
    if (folder / INDEX).exists():
        raw = fsio.read_regular_file(folder / INDEX, field=field, error=PretrainedError, limit=INDEX_MAX_BYTES)
        try:
            weight_map = json.loads(raw.decode("utf-8"))["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise PretrainedError(
                not_allowed(
                    field, folder / INDEX, "the index save_pretrained writes", problem="has no readable weight_map"
                )
            ) from None
        for shard in shards:
            if not (fsio.name_inside(shard) and "/" not in shard and shard.endswith(".safetensors")):
                raise PretrainedError(
                    refused(
                        field,
                        f"{folder / INDEX} names the shard {bounded_repr(shard)}",
                        "plain .safetensors file names in the same folder",
                    )
                )
        return tuple(_regular(folder / shard, field, folder) for shard in shards)
    if (folder / SINGLE).exists():
        return (_regular(folder / SINGLE, field, folder),)
    pickled = [name for name in PICKLED if (folder / name).exists()]
    if pickled:
        raise PretrainedError(
            not_allowed(
                field,
                folder,
                "safetensors weights (re-save them with model.save_pretrained(folder), which writes safetensors)",
                problem=f"holds only pickled weights ({pickled[0]}), which could run code when loaded",
            )
        )
    raise PretrainedError(
        not_allowed(field, folder, f"{SINGLE}, or shards listed in {INDEX}", problem="holds no weights")
    )


def _looks_like_ref(value: str) -> bool:
    return "/" not in value and "\\" not in value and names.split_ref(value) is not None


def pin_init_from(value: str, workspace: str | Path | None = None) -> str:
    """``value`` as the absolute folder it names: a folder given relative to here, or the snapshot of a registered
    model (its latest version when none is given)."""
    path = Path(value).expanduser()
    if path.is_dir():
        return str(path.resolve())
    if _looks_like_ref(value):
        from toolkit.catalogue.data_store import DataAssetError
        from toolkit.catalogue.model_registry import get_model
        from toolkit.catalogue.workspace import Workspace

        try:
            return str(get_model(Workspace.open(workspace), value).path)
        except DataAssetError as exc:
            detail = str(exc).removeprefix("model: ").removeprefix(repr(value)).strip().replace("; ", " (", 1)
            detail += ")" if "(" in detail else ""
            raise PretrainedError(
                not_allowed(
                    "model.init_from",
                    value,
                    INIT_FROM_ALLOWED,
                    problem=f"is not a folder, and as a model name {detail}",
                )
            ) from None
    raise PretrainedError(
        not_allowed("model.init_from", value, INIT_FROM_ALLOWED, problem="is neither a folder nor a registered model")
    )


def open_weights(value: str, field: str = "model.init_from") -> PretrainedWeights:
    """The weights in the folder ``value`` (pinned: see :func:`pin_init_from`), checked."""
    folder = Path(value).expanduser()
    if not folder.is_dir():
        raise PretrainedError(not_allowed(field, value, INIT_FROM_ALLOWED, problem="is not a folder"))
    folder = folder.resolve()
    if (folder / EXPORT_MANIFEST).exists():
        from toolkit.catalogue.model_format import verify_model_folder

        manifest = verify_model_folder(folder)  # every byte against the manifest: the weights are the exported ones
        if SINGLE not in manifest["files"]:
            raise PretrainedError(
                not_allowed(field, folder, f"an export holding {SINGLE}", problem=f"is an export without {SINGLE}")
            )
        return PretrainedWeights("export", folder, (folder / SINGLE,), manifest)
    return PretrainedWeights("save_pretrained", folder, weight_files(folder, field))
