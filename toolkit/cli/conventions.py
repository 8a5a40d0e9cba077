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
import sys

from toolkit.errors import not_allowed


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
        self.verbs_dest: str | None = None  # a group whose sub-verb is required: its help, when none is given

    def parse_known_args(self, args=None, namespace=None):
        # A verb reports the arguments it does not know itself, so the usage and suggestions are its own: by
        # default argparse hands them up and the top-level parser reports them with the top-level usage.
        namespace, extras = super().parse_known_args(args, namespace)
        if self.verbs_dest and getattr(namespace, self.verbs_dest, None) is None:  # `trainbook`, `trainbook data`
            self.print_help()
            self.exit(0)
        if extras:
            hint = self._unknown_hint(extras)
            self.error(f"unrecognized arguments: {' '.join(extras)}{f'; {hint}' if hint else ''}")
        return namespace, extras

    def _check_value(self, action, value):
        # argparse's one check of a value against its choices, for an option's and for a verb group's; replaced so
        # the message is the house one (field, value, what is allowed) and a hint, never argparse's English re-read.
        # (A type= callable or an Action per argument would need every verb's add_argument changed.)
        if action.choices is None or value in action.choices:
            return
        choices = [str(c) for c in action.choices]
        name = action.option_strings[-1] if action.option_strings else action.metavar or action.dest
        message = not_allowed("verb" if name == VERB else name, str(value), ", ".join(choices))
        close = did_you_mean(str(value), choices)
        # no argument: argparse would put "argument NAME: " before the message, which names the field itself
        raise argparse.ArgumentError(None, f"{message}; did you mean {close}?" if close else message)

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _unknown_hint(self, extras: list[str]) -> str | None:
        """The flag meant by the first unknown flag close to one of this parser's, else where to look."""
        flags = [a.split("=", 1)[0] for a in extras if a.startswith("-")]
        for flag in flags:
            if close := did_you_mean(flag, self._option_string_actions):
                return f"did you mean {close}?"
        return f"see: {self.prog} --help" if flags else None


VERB = "VERB"  # the metavar of every verb group's sub-verbs


def add_verbs(parser: VerbParser, dest: str, required: bool = True):
    """The sub-verbs of ``parser`` (a group such as ``data``); without one the group prints its help, unless
    ``required`` is False (``trainbook endpoints`` lists them)."""
    if required:  # checked by VerbParser (it prints the help), not by argparse (it would print an error)
        parser.verbs_dest = dest
    return parser.add_subparsers(dest=dest, title="verbs", metavar=VERB)


def add_verb(verbs, name: str, help: str, examples: list[str], **kwargs) -> VerbParser:
    """A verb with its one-line ``help`` (shown in the parent's list and as its own description) and examples."""
    return verbs.add_parser(name, help=help, description=help, examples=examples, **kwargs)
