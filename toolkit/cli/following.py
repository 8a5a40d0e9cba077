"""Following a run in the terminal until it ends: the progress bar (or plain lines), the signals that stop the run
with the command (Ctrl-C, SIGTERM, SIGHUP), and the last line that says how it ended and how to go on."""

from __future__ import annotations

import gc
import signal
import sys

from toolkit import status as run_status


class Terminated(Exception):
    """SIGTERM or SIGHUP reached the foreground CLI (`timeout`, a closed terminal, a cancelled CI job)."""


def raise_terminated(signum, frame):
    raise Terminated(signum)


class StoppedBeforeStart(BaseException):
    """A stop signal arrived during the checks before the run is written: nothing was started. A BaseException, as
    KeyboardInterrupt is: no ``except Exception`` of a check may take it for the check's own failure."""


def start_and_follow(start) -> int:
    """Start a run (``start()`` returns its handle, or None when nothing was started) and follow it to its end.
    The signals that stop a run are caught from before the start. During the checks (a model built, the data
    tokenized, a chat template rendered) one ends the command at once: nothing exists yet. Once the start commits
    (toolkit.runs.launch.COMMITTING: the run directory written, the supervisor started) one is remembered and stops
    the run as soon as its handle exists (raised inside, it would kill the CLI alone, or leave a supervisor started
    with no handle to stop it: a run training on, detached)."""
    from toolkit.runs.launch import COMMITTING

    pending: list[int] = []
    COMMITTING.clear()  # an earlier start in this process committed; this one has not yet

    def on_stop_signal(signum, frame):
        if COMMITTING.is_set():
            pending.append(signum)
        else:
            raise StoppedBeforeStart(signum)

    stop_signals = [
        sig
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)  # a shell's ignored Ctrl-C stays so
        if not (sig == signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN)
    ]
    previous = {sig: signal.signal(sig, on_stop_signal) for sig in stop_signals}
    try:
        try:
            handle = start()
        except StoppedBeforeStart as exc:
            _tell(f"interrupted ({signal.Signals(exc.args[0]).name}) before the run started: nothing was started")
            return 128 + exc.args[0]
        if handle is None:
            return 128 + pending[0] if pending else 0
        return _follow(handle, handle.run.read_config().train.max_steps, pending, previous)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _follow(handle, max_steps: int, pending: list[int], previous: dict) -> int:
    """Follow the run in the terminal until it ends. Ctrl-C, SIGTERM and SIGHUP stop the run with the CLI: it
    runs in its own session, so without this a closed terminal would leave it training, detached. ``pending``:
    the signals that arrived while it started; ``previous``: the handlers to restore once it has ended."""
    from toolkit.runs.progress import RunProgress, follow_in_terminal

    # What the start left on the heap stays till the end: the pre-launch checks of a Hugging Face model import
    # transformers (~400k objects). Frozen, the collector no longer rescans it whenever following the run allocates:
    # measured on `train llama`, the follower's CPU over the training fell from ~1 CPU s (9% of a core, taken from
    # the worker's two) to 0.04.
    gc.freeze()
    progress = RunProgress(max_steps)
    try:  # from here every stop signal raises, into the except below (handle.stop())
        for sig in previous:
            signal.signal(sig, previous[sig] if sig == signal.SIGINT else raise_terminated)
        print(f"run directory: {handle.path}", file=sys.stderr)
        if pending:  # arrived while the run was starting
            raise Terminated(pending[0])
        final = follow_in_terminal(handle, max_steps, progress=progress)
    except (KeyboardInterrupt, Terminated) as exc:
        signum = exc.args[0] if isinstance(exc, Terminated) else signal.SIGINT
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # a second signal must not cut the stop short
            signal.signal(sig, signal.SIG_IGN)
        _tell(f"interrupted ({signal.Signals(signum).name}): stopping the run")
        handle.stop()
        _tell(_stopped_message(handle, _last_step(handle, progress)))
        return 128 + signum
    finally:  # the run has ended or been stopped: a signal now ends the CLI the ordinary way
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return report_end(handle, progress, final)


def report_end(handle, progress, final) -> int:
    """One line on how the run ended (and how to go on); the exit code: 0 when its processes ended well."""
    code = handle.wait()
    status = handle.run.read_status()
    state, step = status.get("state"), _last_step(handle, progress)
    figures = {k: getattr(final, k) for k in ("val_loss", "val_bpb", "train_seconds")} if final else {}
    summary = ", ".join(f"{k}={v:.4g}" for k, v in figures.items() if v is not None)
    from toolkit.runs.supervisor import LOG_NAME

    if state == "killed":
        cause = str(status.get("error") or "a signal").removeprefix("signal ")
        print(f"killed by {cause} at step {step} (the last step logged)\n{resume_hint(handle)}", file=sys.stderr)
    elif state == "stopped":  # stopped from elsewhere (a stop button, a SIGTERM to the supervisor): not a failure
        print(_stopped_message(handle, step), file=sys.stderr)
    else:
        print(f"{state}: step {step} {summary}".rstrip(), file=sys.stderr)
        if code != 0:
            not_restarted = run_status.restart_forbidden(status, status.get("attempt"))
            why = f", not restarted: {not_restarted}" if not_restarted else ""
            print(f"training failed (exit code {code}){why}; log: {handle.path / LOG_NAME}", file=sys.stderr)
    return 0 if code == 0 else 1


def _last_step(handle, progress) -> int | None:
    """The last step the run logged: from its events (status.json's step is refreshed only every few seconds)."""
    return progress.step if progress.train else handle.run.read_status().get("step")


def _stopped_message(handle, step: int | None) -> str:
    return f"stopped at step {step}; {resume_hint(handle)}"


def resume_hint(handle) -> str:
    import shlex

    from toolkit.runs.supervisor import LOG_NAME

    return (
        f"to continue from its latest checkpoint: trainbook resume {shlex.quote(str(handle.path))}  "
        f"(log: {handle.path / LOG_NAME})"
    )


def _tell(message: str) -> None:
    """Print to a terminal that may be gone (SIGHUP): the run must still be stopped if the write fails."""
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:
        pass
