"""How every ``trainbook`` verb parses its arguments: the conventions of the tools our users already know
(accelerate, transformers, Lightning, git).

- A flag is spelled out: ``--max 5`` is an error, never a silent ``--max-restarts 5`` (argparse's prefix matching).
- A mistake shows the usage of the verb it was made in (not the top-level one) and the closest valid spelling:
  ``trainbook train tiny --nprocs 2`` -> ``usage: trainbook train ...`` and ``did you mean --nproc?``.
- Every verb has a one-line description and at least one example in its ``--help``.
- A verb group called without its sub-verb (``trainbook``, ``trainbook data``) prints its help.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys

from toolkit.errors import not_allowed

# argparse's own wording (Python 3.11), the only place it is read back
_UNRECOGNIZED = re.compile(r"^unrecognized arguments: (?P<args>.*)$")
# the value is quoted as repr() does ('x', "it's"), or not at all (an integer choice)
_INVALID_CHOICE = re.compile(r"^argument (?P<field>[^:]+): invalid choice: (?P<value>'[^']*'|\"[^\"]*\"|\S+) "
                             r"\(choose from (?P<choices>.*)\)$")


def did_you_mean(word: str, candidates) -> str | None:
    """The closest candidate to a mistyped ``word``, or None when nothing is close."""
    close = difflib.get_close_matches(word, sorted(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


class VerbParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` with the conventions above; ``add_subparsers`` hands the class down to every verb.

    ``examples``: command lines shown under "examples:" at the end of --help."""

    def __init__(self, *args, examples: list[str] | tuple[str, ...] = (), **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        if examples:
            kwargs["epilog"] = "examples:\n" + "\n".join(f"  {e}" for e in examples)
        super().__init__(*args, **kwargs)
        self.examples = tuple(examples)

    def parse_known_args(self, args=None, namespace=None):
        # A verb reports the arguments it does not know itself, so the usage and suggestions are its own: by
        # default argparse hands them up and the top-level parser reports them with the top-level usage.
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras

    def error(self, message: str):
        if message == f"the following arguments are required: {VERB}":  # `trainbook`, `trainbook data`
            self.print_help()
            self.exit(0)
        self.print_usage(sys.stderr)
        message, hint = self._explained(message)
        self.exit(2, f"{self.prog}: error: {message}{f'; {hint}' if hint else ''}\n")

    def _explained(self, message: str) -> tuple[str, str | None]:
        """argparse's message (an invalid choice rewritten in the house format: field, value, what is allowed)
        and the hint that goes with it."""
        if m := _INVALID_CHOICE.match(message):
            choices = [c.strip().strip("'") for c in m["choices"].split(",")]
            field = m["field"].split("/")[-1]
            value = m["value"][1:-1] if m["value"][:1] in "'\"" else m["value"]
            close = did_you_mean(value, choices)
            return (not_allowed("verb" if field == VERB else field, value, ", ".join(choices)),
                    f"did you mean {close}?" if close else None)
        if m := _UNRECOGNIZED.match(message):
            flags = [a.split("=", 1)[0] for a in m["args"].split() if a.startswith("-")]
            for flag in flags:
                if close := did_you_mean(flag, self._option_string_actions):
                    return message, f"did you mean {close}?"
            if flags:
                return message, f"see: {self.prog} --help"
        return message, None


VERB = "VERB"  # the metavar of every verb group's sub-verbs


def add_verbs(parser: argparse.ArgumentParser, dest: str, required: bool = True):
    """The sub-verbs of ``parser`` (a group such as ``data``); without one the group prints its help, unless
    ``required`` is False (``trainbook endpoints`` lists them)."""
    return parser.add_subparsers(dest=dest, title="verbs", metavar=VERB, required=required)


def add_verb(verbs, name: str, help: str, examples: list[str], **kwargs) -> VerbParser:
    """A verb with its one-line ``help`` (shown in the parent's list and as its own description) and examples."""
    return verbs.add_parser(name, help=help, description=help, examples=examples, **kwargs)
