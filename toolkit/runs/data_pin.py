"""Pin a run's data to one immutable snapshot before it starts (imported by every training process that creates
a run directory, so it imports nothing of the launcher or the supervisor)."""

from __future__ import annotations

import dataclasses

from toolkit import config as config_mod
from toolkit.errors import refused


def pin_data_asset(config: config_mod.Config) -> config_mod.Config:
    """Resolve data.asset ('name' means latest) to the exact name:version and workspace, so the run, its
    restarts and its lineage all use one immutable snapshot even if a new version is registered meanwhile.
    A data.path is checked to exist and to suit the model; it is read in place. The tokenizer is pinned too
    (:func:`pin_tokenizer`), and the data is tokenized now (:func:`prepare_data`), so a bad line or label is
    refused before a run directory exists."""
    config = _pin_asset(config)
    if _reads_text(config):
        config = pin_tokenizer(config)
        prepare_data(config)
    return config


def _pin_asset(config: config_mod.Config) -> config_mod.Config:
    if not config.data.asset and not config.data.path:
        return config
    from toolkit.catalogue import data_assets
    from toolkit.data.tokenizers import KIND_TAG
    from toolkit.catalogue.workspace import Workspace

    if config.data.path:
        asset, field = data_assets.open_path(config.data.path, hash=False), "data.path"
    else:
        ws = Workspace.open(config.data.workspace or None)
        asset, field = data_assets.get(ws, config.data.asset), "data.asset"
        if asset.tags.get(KIND_TAG[0]) == KIND_TAG[1]:
            raise data_assets.DataAssetError(
                refused(
                    "data.asset",
                    f"{asset.ref} is a tokenizer, not data",
                    "a data asset (the tokenizer goes in data.tokenizer)",
                )
            )
        config = dataclasses.replace(
            config, data=dataclasses.replace(config.data, asset=asset.ref, workspace=str(ws.root))
        )
    allowed = config_mod.ASSET_TYPES[config.model.name]
    if asset.type not in allowed:
        shown = config.data.path if config.data.path else asset.ref
        raise data_assets.DataAssetError(
            refused(
                field,
                f"{shown} is a {asset.type} asset",
                f"{', '.join(allowed)} (for model.name={config.model.name!r})",
            )
        )
    return config


def _reads_text(config: config_mod.Config) -> bool:
    """Whether the run's data goes through a tokenizer (not digits, not a feature table)."""
    from toolkit.data.documents import data_format

    if not config.data.asset and not config.data.path:
        return config.data.dataset != "digits"
    if data_format(config).mode != "text":
        return True
    from toolkit.catalogue import data_assets
    from toolkit.catalogue.workspace import Workspace

    if config.data.path:
        return data_assets.open_path(config.data.path, hash=False).type != "mltable"
    return data_assets.get(Workspace.open(config.data.workspace or None), config.data.asset).type != "mltable"


def pin_tokenizer(config: config_mod.Config) -> config_mod.Config:
    """data.tokenizer as the run will use it: 'auto' as what it chose, a registered 'name' as 'name:version' (and
    the workspace it is in), and the tokenizer's content hash in data.tokenizer_sha256 (toolkit.data.tokenizers
    refuses any other, so a resume tokenizes as the run began)."""
    from toolkit.data.tokenizers import load_tokenizer, pin_tokenizer as pinned, registered

    load_tokenizer(config)  # a pin that is already there must still hold
    value, sha256 = pinned(config)
    data = dataclasses.replace(config.data, tokenizer=value, tokenizer_sha256=sha256)
    if registered(value) and not data.workspace:
        from toolkit.catalogue.workspace import Workspace

        data = dataclasses.replace(data, workspace=str(Workspace.open(None).root))
    return dataclasses.replace(config, data=data)


def prepare_data(config: config_mod.Config) -> None:
    """Tokenize the run's data now (a cached token file makes this a look-up): a bad JSON line, a missing field,
    a label the model has no class for, a block too long for the data are refused before anything starts. A
    built-in corpus read as bytes needs no token file and is left to the trainer."""
    if not config.data.asset and not config.data.path and config.data.tokenizer == "bytes":
        return
    from toolkit.data.corpus import load_corpus  # imports torch: ~1 s of CPU the launcher spares a byte-level run

    load_corpus(config)
