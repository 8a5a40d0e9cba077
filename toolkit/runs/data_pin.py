"""Pin a run's data to one immutable snapshot before it starts (imported by every training process that creates
a run directory, so it imports nothing of the launcher or the supervisor)."""

from __future__ import annotations

from toolkit import config as config_mod
from toolkit.errors import refused


def pin_data_asset(config: config_mod.Config) -> config_mod.Config:
    """Resolve data.asset ('name' means latest) to the exact name:version and workspace, so the run, its
    restarts and its lineage all use one immutable snapshot even if a new version is registered meanwhile.
    A data.path is checked to exist and to suit the model; it is read in place."""
    if not config.data.asset and not config.data.path:
        return config
    import dataclasses

    from toolkit.catalogue import data_assets
    from toolkit.train.models import MODELS
    from toolkit.catalogue.workspace import Workspace

    if config.data.path:
        asset, field = data_assets.open_path(config.data.path, hash=False), "data.path"
    else:
        ws = Workspace.open(config.data.workspace or None)
        asset, field = data_assets.get(ws, config.data.asset), "data.asset"
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, asset=asset.ref,
                                                                      workspace=str(ws.root)))
    allowed = MODELS[config.model.name].asset_types
    if asset.type not in allowed:
        shown = config.data.path if config.data.path else asset.ref
        raise data_assets.DataAssetError(
            refused(field, f"{shown} is a {asset.type} asset",
                    f"{', '.join(allowed)} (for model.name={config.model.name!r})"))
    return config
