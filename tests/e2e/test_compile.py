"""train.compile, for real: Inductor compiles the model in the training process, the run reports what compiling cost
and names each recompilation, the losses are eager's to float rounding, and a machine that cannot compile is told
so before anything starts. (Exact resume of a compiled run: test_checkpoint's golden tests.)"""

from __future__ import annotations

import pytest

from conftest import cli, cli_output
from test_checkpoint import CKPT, COMPILED


def test_a_compiled_run_trains_as_eager_does_and_reports_its_compiles(finished_runs):
    # the golden tests' uninterrupted runs, compiled (on one thread) and eager
    compiled, eager = finished_runs(*CKPT, *COMPILED), finished_runs(*CKPT)
    losses = [e["loss"] for e in compiled.events("train")]
    assert losses == pytest.approx([e["loss"] for e in eager.events("train")], rel=1e-4)
    assert not eager.events("compile")

    first, *later = compiled.events("compile")
    assert first["step"] == 1 and first["graphs"] >= 1 and first["recompiles"] == 0 and first["seconds"] > 0, first
    # evaluation runs under no_grad: a graph of its own, compiled at the first evaluation (after step 20), named
    (evaluation,) = [e for e in later if e["recompiles"]]
    assert evaluation["step"] == 20 and any("grad_mode" in r for r in evaluation["reasons"]), evaluation
    said = cli_output(compiled)
    assert "torch.compile: compiled" in said and "torch.compile: recompiled" in said, said


def test_compiling_without_a_compiler_is_refused_before_the_run_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++")
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", "train.compile=true")
    assert proc.returncode == 2, proc.stderr
    assert "train.compile: True needs a C++ compiler" in proc.stderr and "no-such-c++ is not on PATH" in proc.stderr
    assert not (tmp_path / "r" / "events.jsonl").exists()
