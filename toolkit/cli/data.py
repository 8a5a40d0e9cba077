"""``trainbook data``: register, list, show, verify and archive data assets in the workspace; measure DataLoader
settings; train a tokenizer. One function per sub-verb, found in ``SUB_VERBS``."""

from __future__ import annotations

import json
import sys

from toolkit.cli.common import (
    add_json,
    add_set,
    add_workspace,
    listing_json,
    local_time,
    print_json,
    workspace_line,
    workspace_path,
)
from toolkit.cli.conventions import add_verb, add_verbs
from toolkit.config import ConfigError
from toolkit.errors import not_allowed
from toolkit.tables import Column, text_table


def register(verbs) -> None:
    from toolkit.catalogue.data_assets import TYPES

    data = add_verb(
        verbs,
        "data",
        "register, list, show, verify and archive data assets in the workspace",
        ["trainbook data register-builtin", "trainbook data register mycorpus ./texts/", "trainbook data list --json"],
    )
    add_workspace(data)
    data_verbs = add_verbs(data, "data_verb")

    def data_verb(name, help, examples):
        verb = add_verb(data_verbs, name, help, examples)
        add_workspace(verb, below_group=True)
        return verb

    reg = data_verb(
        "register",
        "snapshot a file or folder as the next version of NAME",
        ["trainbook data register mycorpus ./texts/", "trainbook data register notes notes.jsonl --type uri_file"],
    )
    reg.add_argument("name", help="the asset's name: letters, digits, '-', '_', '.'")
    reg.add_argument("path", help="the file or folder to snapshot")
    reg.add_argument(
        "--type",
        choices=TYPES,
        help="uri_file for a file, uri_folder for a folder, mltable for a "
        "folder with an MLTable file (default: from PATH)",
    )
    reg.add_argument("--description", default="", help="one line about the data")
    reg.add_argument("--tag", action="append", metavar="KEY=VALUE", help="a tag (repeatable)")
    lst = data_verb("list", "registered versions, newest first", ["trainbook data list --name pydoc --all"])
    lst.add_argument("--name", help="only this asset's versions")
    lst.add_argument("--tag", help="only versions with this tag: KEY or KEY=VALUE")
    lst.add_argument("--all", action="store_true", help="include archived versions")
    add_json(lst, "the versions")
    show = data_verb("show", "one version: NAME (latest) or NAME:VERSION", ["trainbook data show pydoc:1"])
    show.add_argument("ref", help="NAME (the latest version) or NAME:VERSION")
    add_json(show, "the version")
    arc = data_verb("archive", "hide NAME:VERSION from listings (still resolvable)", ["trainbook data archive pydoc:1"])
    arc.add_argument("ref", help="NAME:VERSION")
    verify = data_verb(
        "verify",
        "re-hash every blob and check each version's snapshot against its listing; exit 1 if anything is wrong",
        ["trainbook data verify", "trainbook data verify pydoc:1 --json"],
    )
    verify.add_argument("ref", nargs="?", help="NAME (every version) or NAME:VERSION (default: the whole datastore)")
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.add_argument(
        "--repair",
        action="store_true",
        help="restore damaged blobs from their sources where those still hold the registered "
        "bytes (hash-checked), then rebuild snapshots whose listing and blobs are intact",
    )
    tune = data_verb(
        "tune",
        "measure DataLoader settings against the model's step time",
        ["trainbook data tune pydoc --config demo --steps 10"],
    )
    tune.add_argument("ref", help="the data asset, NAME or NAME:VERSION")
    tune.add_argument("--config", default="demo", help="the model and batch to measure with (default: demo)")
    add_set(tune, "override one config field")
    tune.add_argument("--steps", type=int, default=20, help="training steps timed per setting")
    builtin = data_verb(
        "register-builtin",
        "register the corpora that ship with Python/sklearn",
        ["trainbook data register-builtin", "trainbook data register-builtin stdlib"],
    )
    builtin.add_argument(
        "which",
        nargs="?",
        default="all",
        choices=["all", "pydoc", "stdlib", "digits"],
        help="which corpus (default: all)",
    )
    tokenizer = data_verb(
        "tokenizer",
        "tokenizers in the workspace (data assets tagged kind=tokenizer)",
        ["trainbook data tokenizer train pydoc --vocab 2048"],
    )
    tokenizer_verbs = add_verbs(tokenizer, "tokenizer_verb")
    tok_train = add_verb(
        tokenizer_verbs,
        "train",
        "train a byte-level BPE tokenizer on a text asset and register it (data.tokenizer=NAME:VERSION uses it)",
        ["trainbook data tokenizer train pydoc --vocab 2048"],
    )
    add_workspace(tok_train, below_group=True)
    tok_train.add_argument("asset", help="the text asset, NAME or NAME:VERSION")
    tok_train.add_argument("--vocab", type=int, required=True, help="vocabulary size, 257 or more")
    tok_train.add_argument("--name", help="register it as NAME (default: ASSET-bpeVOCAB)")
    tok_train.add_argument("--text-field", default="text", help="JSON Lines files: the field with the text")
    tok_train.add_argument("--prompt-field", default="", help="JSON Lines instruction data: the prompt's field")
    tok_train.add_argument("--completion-field", default="", help="JSON Lines instruction data: the completion's")
    data.set_defaults(func=cmd_data)


LOOKING = ("list", "show")  # sub-verbs that only look: they never create a workspace


def cmd_data(args) -> int:
    from toolkit.catalogue.workspace import Workspace

    ws = Workspace.existing(args.workspace) if args.data_verb in LOOKING else Workspace.open(args.workspace)
    return SUB_VERBS[args.data_verb](args, ws)


def _show(args, ws) -> int:
    from toolkit.catalogue import data_assets

    if ws is None:
        raise data_assets.DataAssetError(
            not_allowed(
                "ref",
                args.ref,
                "a registered asset",
                problem=f"is unknown: there is no workspace at "
                f"{workspace_path(ws, args.workspace)} yet; register data first",
            )
        )
    asset = data_assets.get(ws, args.ref)
    print_json(_asset_json(asset)) if args.json else _print_asset(asset)
    return 0


def _list(args, ws) -> int:
    from toolkit.catalogue import data_assets

    assets = data_assets.list_assets(ws, name=args.name, include_archived=args.all, tag=args.tag) if ws else []
    if args.json:
        print_json(listing_json(ws, "assets", [_asset_json(a) for a in assets]))
        return 0
    print(workspace_line(ws, args.workspace))
    if not assets:
        print(
            "no data assets"
            + (" match" if ws and (args.name or args.tag) else "")
            + ": try `trainbook data register-builtin`, or `trainbook data register NAME PATH`"
        )
        return 0
    print(
        text_table(
            assets,
            [
                Column("asset", lambda a: a.ref + (" (archived)" if a.archived else "")),
                Column("type", "type"),
                Column("size", "size_bytes", ",", right=True),
                Column("files", "file_count", right=True),
                Column("created", lambda a: local_time(a.created)),
                Column("tags", lambda a: ",".join(f"{k}={v}" for k, v in sorted(a.tags.items()))),
            ],
        )
    )
    return 0


def _register(args, ws) -> int:
    from toolkit.catalogue import data_assets

    asset = data_assets.register(
        ws, args.name, args.path, type=args.type, description=args.description, tags=_parse_tags(args.tag)
    )
    print(asset.ref)
    if args.type is None:
        print(f"  type {asset.type} (from the path; --type sets it)", file=sys.stderr)
    return 0


def _archive(args, ws) -> int:
    from toolkit.catalogue import data_assets

    print(f"archived {data_assets.archive(ws, args.ref).ref}")
    return 0


def _verify(args, ws) -> int:
    from toolkit.catalogue import data_verify

    report = data_verify.verify(ws, args.ref, repair=args.repair, progress=True)
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.summary())
    return 0 if report.ok else 1


def _tune(args, ws) -> int:
    from toolkit import config as config_mod
    from toolkit.train.loading_advisor import tune
    from toolkit.runs.data_pin import pin_data_asset

    cfg = config_mod.load(
        args.config,
        [
            config_mod.string_override("data.asset", args.ref),
            config_mod.string_override("data.workspace", str(ws.root)),
            *(args.set or []),
        ],
    )
    print(tune(pin_data_asset(cfg), steps=args.steps).summary())
    return 0


def _tokenizer(args, ws) -> int:
    from toolkit.data.tokenizer_training import train_tokenizer

    tokenizer = train_tokenizer(
        ws,
        args.asset,
        args.vocab,
        name=args.name,
        text_field=args.text_field,
        prompt_field=args.prompt_field,
        completion_field=args.completion_field,
        progress=sys.stderr.isatty(),
    )
    print(tokenizer.ref)
    print(f"  {tokenizer.description}; use it with --set data.tokenizer={tokenizer.ref}", file=sys.stderr)
    return 0


def _register_builtin(args, ws) -> int:
    from toolkit.data.builtin import BUILTINS

    for name in BUILTINS if args.which == "all" else [args.which]:
        print(BUILTINS[name](ws).ref)
    return 0


SUB_VERBS = {
    "register": _register,
    "list": _list,
    "show": _show,
    "archive": _archive,
    "verify": _verify,
    "tune": _tune,
    "register-builtin": _register_builtin,
    "tokenizer": _tokenizer,
}


def _asset_json(asset) -> dict:
    import dataclasses

    fields = dataclasses.asdict(asset)
    fields.pop("listing", None)  # every file's hash: `data verify` is the verb that reads them
    return {"ref": asset.ref, **fields}


def _print_asset(asset) -> None:
    tags = ", ".join(f"{k}={v}" for k, v in sorted(asset.tags.items()))
    print(
        f"{asset.ref}  ({asset.type}{', archived' if asset.archived else ''})\n"
        f"  sha256   {asset.sha256}\n  size     {asset.size_bytes:,} bytes in {asset.file_count} file(s)\n"
        f"  snapshot {asset.path}\n  source   {asset.source}\n"
        + (f"  about    {asset.description}\n" if asset.description else "")
        + (f"  tags     {tags}\n" if tags else ""),
        end="",
    )


def _parse_tags(pairs) -> dict:
    tags = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(not_allowed("--tag", pair, "key=value"))
        tags[key] = value
    return tags
