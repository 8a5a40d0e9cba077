"""events.jsonl's schema: every kind reads back as written, lines written before the schema read the same, and
what other versions write (unknown kinds and keys, missing optional fields) or a broken line never stops a
reader."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from toolkit import events
from toolkit.events import (CheckpointErrorEvent, CheckpointEvent, CheckpointInvalidEvent, DebuggerEvent,
                                 ErrorEvent, EvalEvent, EventLog, ProfileEvent, RestartEvent, StatusEvent, TrainEvent,
                                 read_events, read_new)
from toolkit.errors import UserError
from toolkit.rundir import RunDir

# One line of each kind as the writers before the schema put them on disk (same keys, same order).
LINES_BEFORE_THE_SCHEMA = [
    '{"event": "status", "time": 1700000000.0, "state": "running", "n_params": 207616, "flops_per_item": 1245696, '
    '"peak_flops": 120000000000.0, "attempt": 0}',
    '{"event": "status", "time": 1700000000.1, "state": "running", "n_params": 207616, "flops_per_item": 1245696, '
    '"peak_flops": 120000000000.0, "attempt": 1, "resumed_from": "step_00000020", "resumed_step": 20}',
    '{"event": "train", "time": 1700000001.5, "step": 10, "loss": 4.123456, "lr": 0.0003, "tokens_per_s": 81234.5, '
    '"data_wait_pct": 0.42, "mfu": 0.031, "elapsed_s": 1.25, "horizon": 200}',
    '{"event": "eval", "time": 1700000002.0, "step": 10, "val_loss": 3.9, "val_bpb": 5.626}',
    '{"event": "eval", "time": 1700000002.1, "step": 10, "val_loss": 0.61}',
    '{"event": "checkpoint", "time": 1700000003.0, "step": 10, "lost_ms": 14.32, "blocking_ms": 9.97, '
    '"window_steps": 3, "baseline_step_ms": null, "path": "/runs/r/checkpoints/step_00000010", '
    '"persist_ms": 420.5, "bytes": 2490368, "deleted": ["step_00000000"]}',
    '{"event": "checkpoint_error", "time": 1700000004.0, "step": 20, "message": "OSError: No space left on device"}',
    '{"event": "checkpoint_invalid", "time": 1700000005.0, "checkpoint": "step_00000030", '
    '"reason": "rank_00000.pt: checksum mismatch"}',
    '{"event": "profile", "time": 1700000006.0, "summary": "/runs/r/profile/summary.txt", '
    '"traces": ["rank0.1.pt.trace.json"], "top_ops": [{"name": "aten::mm", "self_cpu_ms": 12.5, "calls": 40}]}',
    '{"event": "error", "time": 1700000007.0, "message": "RuntimeError: boom"}',
    '{"event": "restart", "time": 1700000008.0, "restart": 1, "attempt": 1, "reason": "killed by SIGKILL", '
    '"from_step": 20, "checkpoint": "step_00000020", "skipped": []}',
    '{"event": "restart", "time": 1700000008.5, "restart": 2, "attempt": 2, "reason": "exit code 1", '
    '"from_step": 0, "checkpoint": null, "skipped": ["step_00000030"]}',
    '{"event": "status", "time": 1700000009.0, "state": "completed", "step": 200, "train_seconds": 12.345, '
    '"val_loss": 3.5, "val_bpb": 5.05}',
    '{"event": "status", "time": 1700000010.0, "state": "killed", "exit_code": -9, "reason": "killed by SIGKILL"}',
]
KINDS_SINCE_THE_SCHEMA = {"tracking", "debugger", "nonfinite", "hang", "compile"}  # no line of theirs predates it


def _write_lines(run: RunDir, lines: list[str | bytes]) -> None:
    run.path.mkdir(exist_ok=True)
    with open(run.events_path, "ab") as f:
        f.write(b"".join((line if isinstance(line, bytes) else line.encode()) + b"\n" for line in lines))


def test_every_kind_is_in_the_schema_and_every_field_is_described():
    seen = {json.loads(line)["event"] for line in LINES_BEFORE_THE_SCHEMA}
    assert seen | KINDS_SINCE_THE_SCHEMA == set(events.KINDS)
    for cls in events.KINDS.values():
        for f in dataclasses.fields(cls):
            doc = f.metadata.get("doc", "")
            assert doc and "\n" not in doc, f"{cls.__name__}.{f.name} has no one-line description"


def test_lines_written_before_the_schema_read_as_events_and_are_written_back_byte_for_byte(tmp_path):
    old = RunDir(tmp_path / "old")
    _write_lines(old, LINES_BEFORE_THE_SCHEMA)
    read = read_events(old)
    assert [type(e).kind for e in read] == [json.loads(line)["event"] for line in LINES_BEFORE_THE_SCHEMA]

    new = RunDir(tmp_path / "new")
    new.path.mkdir()
    log = EventLog(new.events_path)
    for event in read:
        log.write(event)
    log.close()
    assert new.events_path.read_text().splitlines() == LINES_BEFORE_THE_SCHEMA
    assert read_events(new) == read


def test_every_kind_round_trips_through_the_writer_and_the_reader(tmp_path):
    written = [
        StatusEvent(state="running", n_params=10, flops_per_item=60.0, peak_flops=1e12, attempt=0),
        TrainEvent(step=1, loss=5.5, lr=1e-3, tokens_per_s=1000.0, data_wait_pct=1.5, mfu=0.02, elapsed_s=0.5),
        EvalEvent(step=1, val_loss=5.0),
        CheckpointEvent(step=1, blocking_ms=3.0, lost_ms=40.0, window_steps=2, path="/x/step_00000001",
                        persist_ms=90.0, bytes=1024, deleted=[]),
        CheckpointErrorEvent(step=2, message="disk full"),
        CheckpointInvalidEvent(checkpoint="step_00000002", reason="truncated"),
        ProfileEvent(summary="/x/summary.txt", traces=[], top_ops=[]),
        ErrorEvent(message="ValueError: no"),
        RestartEvent(restart=1, attempt=1, reason="exit code 1", from_step=1, checkpoint=None, skipped=[]),
        StatusEvent(state="failed", exit_code=1, reason="exit code 1"),
        DebuggerEvent(state="waiting", host="127.0.0.1", port=5678, world_size=2, attempt=1),
        events.NonFiniteEvent(step=8, loss="nan", ranks=[1], action="skipped", skipped=1, in_a_row=1),
        events.HangEvent(step=8, phase="step", waited_s=3.0, limit_s=3.0, stacks="/x/hangs/attempt_0", attempt=0),
        events.TrackingEvent(state="logging", uri="sqlite:////w/mlflow/mlflow.db", run_id="0a1b", message="mlflow ui"),
        events.CompileEvent(step=1, seconds=5.8, graphs=1, recompiles=0, reasons=[], graph_breaks=0),
    ]
    assert {type(e) for e in written} == set(events.KINDS.values())
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    stamped = [run.append_event(e) for e in written]
    assert all(isinstance(e.time, float) for e in stamped)
    assert read_events(run) == stamped
    assert read_events(run, TrainEvent) == [stamped[1]]
    assert [e.state for e in read_events(run.path, StatusEvent)] == ["running", "failed"]
    # optional fields left unset are left off the line, as the writers before the schema did
    first = run.events()[0]
    assert list(first) == ["event", "time", "state", "n_params", "flops_per_item", "peak_flops", "attempt"]
    assert "val_bpb" not in run.events("eval")[0]
    assert run.events("restart")[0]["checkpoint"] is None  # a null the readers before the schema expect


def test_unknown_kinds_and_keys_from_other_versions_are_tolerated(tmp_path):
    run = RunDir(tmp_path / "r")
    _write_lines(run, [
        '{"event": "gpu_temperature", "time": 1.0, "celsius": 71}',
        '{"event": "eval", "time": 2.0, "step": 5, "val_loss": 2.5, "val_accuracy": 0.9}',
        '{"event": "checkpoint", "time": 3.0, "step": 5, "blocking_ms": 40.0, "path": "p", "persist_ms": 900.0, '
        '"bytes": 1, "deleted": []}',  # before lost_ms existed
    ])
    assert read_events(run) == [
        EvalEvent(time=2.0, step=5, val_loss=2.5),
        CheckpointEvent(time=3.0, step=5, blocking_ms=40.0, path="p", persist_ms=900.0, bytes=1, deleted=[])]
    assert read_events(run, CheckpointEvent)[0].lost_ms is None
    assert [r["event"] for r in run.events()] == ["gpu_temperature", "eval", "checkpoint"]


def test_a_malformed_line_is_skipped_with_a_warning_that_says_where(tmp_path):
    run = RunDir(tmp_path / "r")
    _write_lines(run, [
        '{"event": "error", "time": 1.0, "message": "first"}',
        '{"event": "error", "ti',  # a writer killed mid-line, then the next writer appended after it
        '[1, 2]',
        '{"time": 2.0, "message": "no kind"}',
        '{"event": "train", "time": 3.0, "step": 4}',  # a known kind without its required fields
        b'\x80 not utf-8',
        '{"event": "error", "time": 5.0, "message": ' + "[" * 5000 + "]" * 5000 + "}",  # deeper than json's parser
        '{"event": "error", "time": 4.0, "message": "last"}',
    ])
    with pytest.warns(RuntimeWarning) as caught:
        assert [e.message for e in read_events(run)] == ["first", "last"]
    messages = [str(w.message) for w in caught]
    assert any("JSON nested too deeply to read" in m for m in messages), messages
    assert len(messages) == 6 and all(m.startswith(str(run.events_path)) for m in messages)
    assert "at byte 52" in messages[0] and "is skipped" in messages[0]
    assert any("missing 6 required keyword-only arguments" in m for m in messages), messages


def test_a_follower_gets_each_event_once_and_waits_for_a_line_to_be_complete(tmp_path):
    run = RunDir(tmp_path / "r")
    _write_lines(run, ['{"event": "eval", "time": 1.0, "step": 1, "val_loss": 3.0}'])
    with open(run.events_path, "a") as f:
        f.write('{"event": "eval", "time": 2.0, "st')
    first, offset = read_new(run.events_path)
    assert [e.step for e in first] == [1]
    with open(run.events_path, "a") as f:
        f.write('ep": 2, "val_loss": 2.0}\n')
    more, end = read_new(run.events_path, offset)
    assert [e.step for e in more] == [2] and read_new(run.events_path, end) == ([], end)
    assert read_new(tmp_path / "none.jsonl", 7) == ([], 7)


def test_a_kind_that_is_not_an_event_class_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="kind: 'train' is not allowed; allowed: one of StatusEvent, TrainEvent"):
        read_events(tmp_path, "train")


def test_a_writer_passing_a_field_the_schema_lacks_fails_at_once():
    with pytest.raises(TypeError, match="unexpected keyword argument 'los'"):
        TrainEvent(step=1, los=5.0, lr=1e-3, tokens_per_s=1.0, data_wait_pct=0.0, mfu=0.0, elapsed_s=1.0)


def test_steady_state_averages_the_second_half_of_the_intervals():
    from toolkit.events import TrainEvent
    from toolkit.train.metrics import steady_state

    def interval(step, tokens_per_s, mfu, wait):
        return TrainEvent(step=step, loss=1.0, lr=1e-3, tokens_per_s=tokens_per_s, data_wait_pct=wait, mfu=mfu,
                          elapsed_s=float(step))

    train = [interval(1, 10.0, 0.01, 50.0), interval(2, 90.0, 0.09, 9.0), interval(3, 100.0, 0.1, 1.0),
             interval(4, 110.0, 0.11, 2.0)]
    speed = steady_state(train)
    assert (speed.tokens_per_s, round(speed.mfu, 3), speed.data_wait_pct_max, speed.intervals) == (105.0, 0.105, 2.0, 2)
    assert steady_state(train[:1]).tokens_per_s == 10.0, "one interval is its own steady state"
    assert steady_state([]) is None


def test_a_compile_event_reads_as_one_line_naming_each_recompilation():
    first = events.CompileEvent(step=1, seconds=18.43, graphs=2, recompiles=0, reasons=[], graph_breaks=0)
    again = events.CompileEvent(step=10, seconds=3.2, graphs=1, recompiles=1, graph_breaks=1,
                                reasons=["forward: 0/0: GLOBAL_STATE changed: grad_mode"])
    assert first.summary == "compiled 2 graphs in 18.4 s at step 1"
    assert again.summary == ("recompiled 1 graph in 3.2 s at step 10, 1 graph breaks: "
                             "forward: 0/0: GLOBAL_STATE changed: grad_mode")


def test_an_event_with_a_field_of_the_wrong_type_is_skipped_naming_the_field(tmp_path):
    # a copied run's events.jsonl: a reader that does arithmetic on a field (advise on lost_ms, forecast on
    # tokens_per_s) must never get a string where the schema says a number
    run = RunDir(tmp_path / "r")
    _write_lines(run, [
        '{"event": "eval", "time": 1.0, "step": 1, "val_loss": 3.0}',
        '{"event": "eval", "time": 2.0, "step": "2", "val_loss": 2.0}',
        '{"event": "eval", "time": 3.0, "step": 3, "val_loss": "fast"}',
        '{"event": "eval", "time": 4.0, "step": true, "val_loss": 1.0}',
        '{"event": "eval", "time": 5.0, "step": 5, "val_loss": 1}',  # an integer is a number
    ])
    with pytest.warns(RuntimeWarning) as caught:
        assert [(e.step, e.val_loss) for e in read_events(run)] == [(1, 3.0), (5, 1)]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 3, messages
    assert "'step': '2' is not allowed; allowed: an integer" in messages[0], messages
    assert "'val_loss': 'fast' is not allowed; allowed: a number" in messages[1], messages
    assert "'step': True is not allowed; allowed: an integer" in messages[2], messages


@pytest.mark.timeout(20)  # a FIFO would block the reader forever, /dev/zero would fill the memory
@pytest.mark.parametrize("make, message", [
    (lambda p: p.symlink_to("/dev/zero"), "is a symbolic link to '/dev/zero'"),
    (lambda p: os.mkfifo(p), "is a FIFO, not a regular file"),
])
def test_an_events_file_that_is_a_link_or_a_fifo_is_refused_naming_it(tmp_path, make, message):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    make(run.events_path)
    with pytest.raises(UserError, match=f"^events.jsonl: '{run.events_path}' {message}"):
        read_events(run)


def test_a_line_too_long_to_be_an_event_is_skipped_without_reading_it_whole(tmp_path):
    run = RunDir(tmp_path / "r")
    _write_lines(run, ['{"event": "eval", "time": 1.0, "step": 1, "val_loss": 3.0}',
                       '{"event": "error", "time": 2.0, "message": "' + "x" * (events.MAX_LINE_BYTES + 10) + '"}',
                       '{"event": "eval", "time": 3.0, "step": 3, "val_loss": 2.0}'])
    with pytest.warns(RuntimeWarning, match="at byte 59: a line that is not an event .*over 1,048,576 bytes"):
        assert [e.step for e in read_events(run)] == [1, 3]
    # a long line still being written (no newline yet) is left for the next call, as any unfinished line is
    with open(run.events_path, "a") as f:
        f.write("y" * (2 * events.MAX_LINE_BYTES))
    with pytest.warns(RuntimeWarning, match="at byte 59"):  # the finished long line, skipped again
        _, end = read_new(run.events_path)
    assert end == run.events_path.stat().st_size - 2 * events.MAX_LINE_BYTES
