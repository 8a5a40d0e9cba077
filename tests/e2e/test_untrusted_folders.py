"""A model folder a user trains from (``model.hf.source``, a save_pretrained folder from elsewhere) is data, and
every file in it is checked before transformers reads any: a link (to a file outside) is never followed, and a
FIFO (which would block a reader forever), listed by name or not, is refused at once, by `train` and by `export`,
naming the file. One tiny transformers run, trained from such a folder, serves the module."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.rundir import RunDir

from conftest import PROJECT, cli, no_runaway_training

LLAMA = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
         "num_key_value_heads": 2, "max_position_embeddings": 64}
STEPS = ("--set", "train.max_steps=3", "--set", "train.eval_every=3", "--set", "train.eval_batches=1")
PROMPTLY = 120  # seconds: a reader blocked on a FIFO fails the test here instead of hanging it


@pytest.fixture(scope="module")
def source_run(tmp_path_factory) -> tuple[Path, RunDir]:
    """(a save_pretrained folder of a small Llama with its own BPE tokenizer, a run trained from it). Tests change
    the folder inside :func:`changed` only, which puts it back."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from toolkit.data.tokenizer_training import train_bpe

    root = tmp_path_factory.mktemp("source")
    tokenizer = train_bpe([f"line {i}: the quick brown fox jumps over {i * i} lazy dogs" for i in range(400)], 300)
    LlamaForCausalLM(LlamaConfig(vocab_size=300, **LLAMA)).save_pretrained(str(root / "model"))
    tokenizer.save_pretrained(str(root / "model"))
    env = {**os.environ, "TRAINBOOK_WORKSPACE": str(root / "workspace")}
    proc = subprocess.run([sys.executable, "-m", "toolkit", "train", "tiny", "--run-dir", str(root / "run"),
                           "--set", "model.name=hf", "--set", f"model.hf.source={root / 'model'}", *STEPS],
                          capture_output=True, text=True, env=env, timeout=600, cwd=PROJECT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = RunDir(root / "run")
    assert run.read_config().data.tokenizer == "model", "the run tokenizes with the folder's own tokenizer"
    return root / "model", run


def link_outside(folder: Path, name: str) -> str:
    """``name`` becomes a link to a copy of itself outside the folder (same bytes: only the link is wrong)."""
    outside = folder.parent / f"outside-{name}"
    shutil.copyfile(folder / name, outside)
    (folder / name).unlink()
    (folder / name).symlink_to(outside)
    return "a symbolic link"


def fifo(folder: Path, name: str) -> str:
    (folder / name).unlink(missing_ok=True)
    os.mkfifo(folder / name)
    return "a FIFO"


CHANGES = [pytest.param(link_outside, "tokenizer.json", id="tokenizer-json-linked-outside"),
           pytest.param(fifo, "notes.txt", id="unlisted-fifo"),
           pytest.param(fifo, "generation_config.json", id="generation-config-fifo")]


def release_readers(path: Path) -> None:
    """Let a reader blocked on the FIFO ``path`` go (it reads end of file): what a hang would otherwise leave."""
    with contextlib.suppress(OSError):  # ENXIO: nobody is reading it
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


@contextlib.contextmanager
def changed(folder: Path, change, name: str):
    """The folder with ``change`` made to ``name``, put back afterwards (whatever was read meanwhile)."""
    backup = folder.parent / "backup"
    shutil.copytree(folder, backup)
    try:
        yield change(folder, name)
    finally:
        if (folder / name).is_fifo():
            release_readers(folder / name)
        shutil.rmtree(folder)
        backup.rename(folder)


@pytest.mark.parametrize("change, name", CHANGES)
def test_train_refuses_a_linked_or_fifo_file_in_the_model_folder_at_once(source_run, tmp_path, change, name):
    folder, _ = source_run
    run = RunDir(tmp_path / "run")
    with changed(folder, change, name) as what, no_runaway_training(run):
        proc = cli("train", "tiny", "--run-dir", str(run.path), "--set", "model.name=hf",
                   "--set", f"model.hf.source={folder}", *STEPS, timeout=PROMPTLY)
    assert proc.returncode == 2, proc.stderr[-3000:]
    # the first reader refuses it: the tokenizer, which data.tokenizer=auto takes from the folder, is pinned first
    assert proc.stderr.startswith(f"error: data.tokenizer: '{folder}' holds {name}, {what}") and \
        "allowed: regular files and plain subfolders" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not run.path.exists(), "refused before a run directory exists"


@pytest.mark.parametrize("change, name", CHANGES)
def test_export_refuses_a_linked_or_fifo_file_in_the_model_folder_and_copies_nothing(source_run, change, name):
    folder, trained = source_run
    with changed(folder, change, name) as what:
        proc = cli("export", str(trained.path), timeout=PROMPTLY)
    exported = (trained.path / "model").exists()
    shutil.rmtree(trained.path / "model", ignore_errors=True)  # the next test's export starts from none either
    assert proc.returncode == 2 and not exported, proc.stderr[-3000:]
    assert proc.stderr.startswith(f"error: model.hf.source: '{folder}' holds {name}, {what}"), proc.stderr


def test_train_checks_the_model_folder_itself_when_the_tokenizer_comes_from_elsewhere(source_run, tmp_path):
    folder, _ = source_run
    run = RunDir(tmp_path / "run")
    with changed(folder, fifo, "generation_config.json"), no_runaway_training(run):
        proc = cli("train", "tiny", "--run-dir", str(run.path), "--set", "model.name=hf",
                   "--set", f"model.hf.source={folder}", "--set", "data.tokenizer=bytes", *STEPS, timeout=PROMPTLY)
    assert proc.returncode == 2 and proc.stderr.startswith(
        f"error: model.hf.source: '{folder}' holds generation_config.json, a FIFO; allowed: regular files"), proc.stderr
    assert not run.path.exists()
