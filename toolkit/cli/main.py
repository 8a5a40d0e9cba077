"""trainbook: train, checkpoint, export and serve your models on this machine, and plan the same run for Azure ML.

One verb per job, each a thin toolkit call; `trainbook VERB --help` shows a verb's options and examples.
"""

from __future__ import annotations

import argparse
import sys

from toolkit.cli import (
    advise,
    checkpoints,
    completion,
    config,
    data,
    doctor,
    estimate,
    evaluate,
    export,
    forecast,
    lifecycle,
    models,
    resume,
    runs,
    scale,
    serve,
    tensorboard,
    train,
    workshop,
)
from toolkit.cli.conventions import VerbParser, add_verbs
from toolkit.errors import UserError
from toolkit.startup import command_process

# Each module adds its verbs (parser and command): in this order in `trainbook --help`; azure's come last.
VERBS = (
    train,
    resume,
    lifecycle,
    checkpoints,
    advise,
    data,
    runs,
    tensorboard,
    doctor,
    estimate,
    scale,
    forecast,
    export,
    evaluate,
    models,
    serve,
    config,
    completion,
    workshop,
)


def _version() -> str:
    from importlib import metadata

    try:
        version = metadata.version("trainbook")
    except metadata.PackageNotFoundError:  # a checkout run without pip install
        version = "unknown (not installed)"
    return f"trainbook {version} (python {sys.version.split()[0]})"


def build_parser() -> argparse.ArgumentParser:
    parser = VerbParser(
        prog="trainbook",
        description=__doc__,
        examples=[
            "trainbook data register-builtin",
            "trainbook train demo",
            "trainbook runs",
            "trainbook train --help",
        ],
    )
    parser.add_argument("--version", action="version", version=_version())
    verbs = add_verbs(parser, "verb")
    for module in VERBS:
        module.register(verbs)
    from toolkit.cli.azure import add_azure_verbs  # a verb group: its sub-verbs parse like every verb

    add_azure_verbs(verbs)
    parser.set_defaults(root_parser=parser)  # what `trainbook completion` describes
    return parser


def main(argv: list[str] | None = None) -> int:
    command_process()  # fewer collections while a verb loads torch, none at its exit (toolkit.startup)
    return dispatch(build_parser().parse_args(argv))


def dispatch(args: argparse.Namespace) -> int:
    """Run the verb ``args.func``: a UserError is printed as one line (exit 2); any other exception is a bug and
    propagates with its traceback."""
    try:
        return args.func(args)
    except ModuleNotFoundError as exc:  # a verb that needs an extra this install lacks (pip install . is core only)
        from toolkit.extras import missing_extra_message

        sub = getattr(args, f"{args.verb}_verb", None)  # data register, azure plan, workshop run, ...
        message = missing_extra_message(exc, f"trainbook {args.verb}" + (f" {sub}" if sub else ""))
        if message is None:
            raise
        print(f"error: {message}", file=sys.stderr)
        return 2
    except UserError as exc:  # bad input or a refused state: one line; anything else is a bug, with its traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
