"""The command line's conventions, as a table: each mistake a person makes -> exit code and the words that help.

In-process through ``toolkit.cli.main`` (argparse exits through SystemExit); nothing here starts a run or a server.
"""

from __future__ import annotations

import argparse

import pytest

from toolkit.cli import build_parser, main
from toolkit.cli.main import dispatch
from toolkit.cli.conventions import did_you_mean
from toolkit.errors import RefusedValue, not_allowed


def run_cli(argv, capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# argv -> (exit code, words in stderr, words in stdout)
MISTAKES = {
    "a misspelt flag shows that verb's usage and the flag meant": (
        ["train", "tiny", "--nprocs", "2"], 2, ["usage: trainbook train", "--nprocs", "did you mean --nproc?"], []),
    "no prefix matching: --max is not --max-restarts": (
        ["train", "tiny", "--max", "5"], 2, ["usage: trainbook train", "unrecognized arguments: --max 5",
                                             "trainbook train --help"], []),
    "a misspelt verb": (["trian", "demo"], 2, ["verb: 'trian' is not allowed; allowed: train, resume",
                                                "did you mean train?"], []),
    "a misspelt sub-verb": (["data", "lst"], 2, ["usage: trainbook data", "did you mean list?"], []),
    "a misspelt choice": (["serve", "demo", "--runtime", "onxx"], 2, ["did you mean onnx?"], []),
    "a misspelt doctor check": (["doctor", "--only", "matmull"], 2, ["did you mean matmul?"], []),
    "an engine that does not exist": (["train", "tiny", "--engine", "jax"], 2,
                                      ["--engine: 'jax' is not allowed; allowed: torch, deepspeed, fsdp"], []),
    "a flag of another verb": (["runs", "--nproc", "2"], 2, ["usage: trainbook runs", "--nproc"], []),
    "an integer choice": (["estimate", "7B", "--zero-stage", "5"], 2,
                          ["--zero-stage: '5' is not allowed; allowed: 0, 1, 2, 3"], []),
    "a count without its unit": (["estimate", "7"], 2, ["params: '7' has no unit", "7B for 7 billion"], []),
    "a register name checked before the export runs": (
        ["export", "no-such-run", "--register", "a/b"], 2, ["--register", "'a/b'"], []),
    "trainbook alone prints its help": ([], 0, [], ["usage: trainbook", "verbs:", "train", "examples:"]),
    "a verb group alone prints its help": (["data"], 0, [], ["usage: trainbook data", "register-builtin"]),
    "--version": (["--version"], 0, [], ["trainbook "]),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_each_mistake_gets_its_exit_code_and_words(case, capsys):
    argv, expected_code, in_err, in_out = MISTAKES[case]
    code, out, err = run_cli(argv, capsys)
    assert code == expected_code, (out, err)
    for words in in_err:
        assert words in err, err
    for words in in_out:
        assert words in out, out


def test_the_mistake_is_reported_once_in_the_verbs_own_usage(capsys):
    code, _, err = run_cli(["train", "tiny", "--nprocs", "2"], capsys)
    assert code == 2
    assert err.count("usage:") == 1 and "usage: trainbook [-h]" not in err


def all_parsers(parser: argparse.ArgumentParser, path=("trainbook",)):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from all_parsers(sub, (*path, name))


PARSERS = dict(all_parsers(build_parser()))


@pytest.mark.parametrize("path", sorted(" ".join(p) for p in PARSERS))
def test_every_verb_has_a_description_an_example_and_help_on_every_argument(path):
    parser = PARSERS[tuple(path.split())]
    assert parser.description and "\n" not in parser.description.strip().splitlines()[0], path
    assert parser.examples and all(e.startswith(path.split()[0]) for e in parser.examples), path
    assert not parser.allow_abbrev, path
    helpless = [a.dest for a in parser._actions if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert not helpless, f"{path}: no help for {helpless}"
    help_text = parser.format_help()
    assert "examples:" in help_text


def test_the_examples_parse(capsys):
    """Every example in every --help is a command line the parser accepts (verbs that exist, flags spelt right)."""
    import itertools
    import shlex

    parser = build_parser()
    for path, sub in PARSERS.items():
        for example in sub.examples:
            words = shlex.split(example)[1:]  # the command up to the shell's own operators
            argv = list(itertools.takewhile(lambda w: w not in ("&", "&&", ">>", ">", "|"), words))
            if argv and argv[-1] == "--help":
                continue
            parser.parse_args(argv)  # exits (SystemExit) on any mistake


@pytest.mark.parametrize("value", ["it's \"quoted\"", "back\\slash", "a, b"])
def test_a_refused_choice_names_the_value_as_given_whatever_its_characters(value, capsys):
    code, _, err = run_cli(["train", "tiny", "--engine", value], capsys)
    assert code == 2 and f"error: {not_allowed('--engine', value, 'torch, deepspeed, fsdp')}\n" in err, err


def _verb(args):
    """A verb that refuses bad input, or one with a bug (a ValueError no user input explains)."""
    if args.verb == "refuses":
        raise RefusedValue("--x: 'y' is not allowed; allowed: z")
    return int("not a number")


def test_a_bug_keeps_its_traceback_and_a_user_error_is_one_line(capsys):
    """The real dispatcher: a bug propagates (the interpreter prints it with its traceback and exits 1), a refusal is
    one line and exit 2."""
    with pytest.raises(ValueError, match="invalid literal for int"):
        dispatch(argparse.Namespace(func=_verb, verb="bug"))
    assert capsys.readouterr().err == ""
    assert dispatch(argparse.Namespace(func=_verb, verb="refuses")) == 2
    assert capsys.readouterr().err == "error: --x: 'y' is not allowed; allowed: z\n"


def test_did_you_mean_offers_only_close_words():
    assert did_you_mean("--nprocs", ["--nproc", "--engine"]) == "--nproc"
    assert did_you_mean("--colour", ["--nproc", "--engine"]) is None


def test_workspace_is_taken_before_and_after_a_data_sub_verb():
    parser = build_parser()
    assert parser.parse_args(["data", "--workspace", "A", "list"]).workspace == "A"
    assert parser.parse_args(["data", "list", "--workspace", "B"]).workspace == "B"
    assert parser.parse_args(["data", "list"]).workspace is None
    for verb in (["train", "tiny"], ["runs"], ["models"], ["export", "R"], ["serve", "M"], ["doctor"],
                 ["endpoints"], ["endpoints", "stop", "x"]):
        assert parser.parse_args([*verb, "--workspace", "W"]).workspace == "W", verb
