"""train.compile, for real: Inductor compiles the model in the training process, the run reports what compiling cost
and names each recompilation, the losses are eager's to float rounding, and a machine that cannot compile is told
so before anything starts. (Exact resume of a compiled run: test_checkpoint's golden tests.)"""

from __future__ import annotations

import pytest

from toolkit.rundir import RunDir

from conftest import cli

FLAGS = ("--set", "train.max_steps=20", "--set", "train.eval_every=10", "--set", "train.log_every=1")


def test_a_compiled_run_trains_as_eager_does_and_reports_its_compiles(tmp_path, finished_runs):
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "c"), *FLAGS, "--set", "train.compile=true")
    assert proc.returncode == 0, proc.stderr
    compiled, eager = RunDir(tmp_path / "c"), finished_runs(*FLAGS)
    losses = [e["loss"] for e in compiled.events("train")]
    assert losses == pytest.approx([e["loss"] for e in eager.events("train")], rel=1e-4)
    assert not eager.events("compile")

    first, *later = compiled.events("compile")
    assert first["step"] == 1 and first["graphs"] >= 1 and first["recompiles"] == 0 and first["seconds"] > 0, first
    # evaluation runs under no_grad: a graph of its own, compiled at the first evaluation (after step 10), named
    (evaluation,) = [e for e in later if e["recompiles"]]
    assert evaluation["step"] == 10 and any("grad_mode" in r for r in evaluation["reasons"]), evaluation
    assert "torch.compile: compiled" in proc.stderr and "torch.compile: recompiled" in proc.stderr, proc.stderr


def test_compiling_without_a_compiler_is_refused_before_the_run_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++")
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", "train.compile=true")
    assert proc.returncode == 2, proc.stderr
    assert "train.compile: True needs a C++ compiler" in proc.stderr and "no-such-c++ is not on PATH" in proc.stderr
    assert not (tmp_path / "r" / "events.jsonl").exists()
