"""A real TensorBoard on a real run: scalars and the PyTorch profiler plugin answer over HTTP; stop() stops it."""

from __future__ import annotations

import json
import socket
import time
import urllib.parse
import urllib.request

import pytest

from toolkit.runs.tensorboard import TensorBoardError, start_tensorboard

from conftest import assert_server_dies_with_its_starter
from test_activation_checkpointing import AC, PROFILE
from test_checkpoint import CKPT


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def poll_json(url: str, until, timeout_s: float = 60.0):
    """The profiler plugin finds runs by scanning the log folder on a timer, parses each in a thread, then hands
    it to a third thread through a queue, so "loading": false does not mean the run is listed yet (before the
    first scan, and between the parse ending and the hand-over, the list is empty and nothing is loading).
    There is no push notification to await, so ask again (with a growing pause) until the answer is there."""
    deadline, pause = time.monotonic() + timeout_s, 0.05
    while True:
        answer = get_json(url)
        if until(answer) or time.monotonic() > deadline:
            return answer
        time.sleep(pause)
        pause = min(1.0, pause * 2)


@pytest.fixture
def profiled_run(finished_run_copy):
    """A copy (TensorBoard writes its log into the run) of the suite's profiled run: activation checkpointing's,
    every step logged, rank 0 tracing 2 steps."""
    return finished_run_copy(*CKPT, *AC, *PROFILE)


def test_tensorboard_serves_scalars_and_profiler_then_stops(profiled_run):
    server = start_tensorboard(profiled_run.path)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        tags = get_json(server.url + "data/plugin/scalars/tags")
        assert "train/loss" in tags["tb"] and "eval/val_bpb" in tags["tb"], tags
        query = urllib.parse.urlencode({"run": "tb", "tag": "train/loss", "format": "json"})
        points = get_json(server.url + f"data/plugin/scalars/scalars?{query}")
        steps = [p[1] for p in points]
        assert steps == [e["step"] for e in profiled_run.events("train")]

        plugins = get_json(server.url + "data/plugins_listing")
        assert "pytorch_profiler" in plugins, sorted(plugins)
        runs = poll_json(server.url + "data/plugin/pytorch_profiler/runs", until=lambda r: r["runs"])
        assert runs["runs"] == ["profile"], runs
        workers = get_json(server.url + "data/plugin/pytorch_profiler/workers?run=profile&view=Overview")
        assert workers and workers[0].startswith("rank0"), workers
    finally:
        server.stop()
    assert server.process.poll() is not None
    port = int(server.url.rsplit(":", 1)[1].strip("/"))
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0, "TensorBoard still listening after stop()"


def test_tensorboard_refuses_a_missing_run(tmp_path):
    with pytest.raises(TensorBoardError, match=r"run_dir: .*nope' is not a folder"):
        start_tensorboard(tmp_path / "nope")


@pytest.mark.parametrize("where", ["tb", "tb/run_b"])
def test_tensorboard_refuses_a_run_whose_folders_link_out_of_it(tmp_path, where):
    # TensorBoard walks its whole logdir: a copied run's tb/ (or a folder in it) linked elsewhere would serve the
    # scalars of whatever it points to (`tb -> /` would walk the whole disk)
    run, elsewhere = tmp_path / "run", tmp_path / "someone-elses-runs"
    elsewhere.mkdir()
    (run / where).parent.mkdir(parents=True)
    (run / where).symlink_to(elsewhere)
    with pytest.raises(TensorBoardError, match=f"run_dir: '{run}' holds {where}, a symbolic link to '{elsewhere}'"):
        start_tensorboard(run)
    assert not (run / "tensorboard.log").exists(), "nothing was started"


def test_tensorboard_stops_when_the_process_that_started_it_is_killed(tmp_path):
    (tmp_path / "tb").mkdir()
    assert_server_dies_with_its_starter(
        f"from toolkit.runs.tensorboard import start_tensorboard; server = start_tensorboard({str(tmp_path)!r})")
