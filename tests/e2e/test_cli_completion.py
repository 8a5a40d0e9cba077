"""Shell completion: what bash offers, with the script `trainbook completion bash` prints, run by a real bash."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from toolkit.cli import build_parser
from toolkit.cli.completion import bash_script


def complete(*words: str) -> list[str]:
    """What bash offers for the last word, with the script `trainbook completion bash` prints."""
    line = " ".join(shlex.quote(w) for w in ("trainbook", *words))
    probe = (f"{bash_script(build_parser())}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; _trainbook_complete; "
             'printf "%s\\n" "${COMPREPLY[@]}"')
    return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.split()


@pytest.mark.parametrize("words, offered", [
    (["tr"], ["train"]),
    (["data", "re"], ["register", "register-builtin"]),
    (["train", "tiny", "--eng"], ["--engine"]),
    (["train", "tiny", "--engine", ""], ["torch", "deepspeed", "fsdp"]),
    (["doctor", "--only", "mat"], ["matmul"]),
    (["endpoints", "st"], ["stop"]),
])
def test_shell_completion_offers_the_parsers_own_words(words, offered):
    assert sorted(complete(*words)) == sorted(offered)
