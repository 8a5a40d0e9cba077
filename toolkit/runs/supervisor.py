"""``python -m toolkit.runs.supervisor RUN_DIR [--max-restarts N]``: start the training processes, restart them from
the latest valid checkpoint when they die, and record every restart.

The supervisor and the training processes live in different process groups: a lost node (any rank killed,
by any signal, SIGKILL included) takes the training group down, and the supervisor, still alive, decides
what happens next. Only the supervisor writes the run's final state when the ranks could not.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

from toolkit.checkpoint.store import CheckpointStore
from toolkit.fsio import open_log
from toolkit.runs import status as run_status
from toolkit.runs.events import RestartEvent, StatusEvent
from toolkit.runs.launchers import ATTEMPT_ENV, worker_command  # imports no torch
from toolkit.runs.rundir import RunDir
from toolkit.runs.status import FINAL_STATES

LOG_NAME = "train.log"  # stdout and stderr of every rank: the first place to look when a run dies early
# How long the ranks have, after a stop was asked for, to finish their step and save it before they get the signal
# too; RunHandle.stop then kills whatever is left once its own grace has run out.
STOP_GRACE_S = 120.0


def describe_exit(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


class Supervisor:
    def __init__(self, run: RunDir, max_restarts: int, lock_fd: int | None = None):
        self.run, self.max_restarts = run, max_restarts
        self.lock_fd = lock_fd  # the run lock (toolkit.runs.run_lock), passed on to every attempt's processes
        self.worker: subprocess.Popen | None = None
        self.stopping = False
        self._forward: threading.Timer | None = None  # passes a stop signal on if the ranks have not ended

    def _start_worker(self, attempt: int) -> subprocess.Popen:
        cmd, extra_env = worker_command(self.run.read_config(), self.run.path)
        with open_log(self.run.path / LOG_NAME) as log:
            log.write(f"\n===== attempt {attempt}: {' '.join(cmd)}\n".encode())
            log.flush()
            worker = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      env={**os.environ, **extra_env, ATTEMPT_ENV: str(attempt)},
                                      start_new_session=True,  # its own group: killpg reaches every rank
                                      pass_fds=() if self.lock_fd is None else (self.lock_fd,))
        run_status.update(self.run, worker_pgid=worker.pid, attempt=attempt, command=cmd)
        return worker

    def _on_stop_signal(self, signum, frame):
        """The run was stopped on request: ask every rank to save a checkpoint and end (the stop request in the run
        directory); pass the signal on only if they have not ended STOP_GRACE_S later. The run is recorded as
        stopped, not killed."""
        self.stopping = True
        self.run.request_stop()
        if self.worker is not None and self.worker.poll() is None and self._forward is None:
            worker = self.worker
            self._forward = threading.Timer(STOP_GRACE_S, self._forward_signal, (worker, signum))
            self._forward.daemon = True
            self._forward.start()

    @staticmethod
    def _forward_signal(worker: subprocess.Popen, signum: int) -> None:
        if worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.pid, signum)

    def run_to_end(self) -> int:
        self.run.clear_stop_request()  # an earlier attempt's: this start (a resume) is wanted
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        attempt = int(self.run.read_status().get("attempt", -1)) + 1  # `resume` continues the count
        restarts = 0
        while True:
            if self.stopping:  # stopped between two attempts: start nothing more
                code = -signal.SIGTERM
                break
            self.worker = self._start_worker(attempt)
            if self.stopping:  # stopped while it was starting, before the handler could see it: pass it on
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.worker.pid, signal.SIGTERM)
            code = self.worker.wait()
            # completed, then died (in teardown): the training is done, another attempt would add nothing
            if code == 0 or self.stopping or self.run.read_status().get("state") == "completed":
                break
            if restarts >= self.max_restarts:
                break
            restarts += 1
            attempt += 1
            info, skipped = CheckpointStore(self.run.path).find_resume_point()
            from_step = info.step if info else 0
            reason = describe_exit(code)
            print(f"[supervisor] training died ({reason}); restart {restarts}/{self.max_restarts} "
                  f"from step {from_step}", file=sys.stderr, flush=True)
            self.run.append_event(RestartEvent(restart=restarts, attempt=attempt, reason=reason, from_step=from_step,
                                               checkpoint=info.name if info else None,
                                               skipped=[s.name for s in skipped]))
            run_status.transition(self.run, "restart", last_failure=reason, last_failure_time=time.time())
        state = self.run.read_status().get("state")
        if code != 0 and (state not in FINAL_STATES or state == "completed"):
            final, name = ("stopped", "stop") if self.stopping else ("killed", "kill") if code < 0 else \
                ("failed", "fail")
            self.run.append_event(StatusEvent(state=final, exit_code=code, reason=describe_exit(code)))
            run_status.transition(self.run, name, exit_code=code, error=describe_exit(code))
        return 0 if code == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir")
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--lock-fd", type=int, help="the run lock's file descriptor, inherited from the launcher")
    args = parser.parse_args(argv)
    return Supervisor(RunDir(args.run_dir), args.max_restarts, args.lock_fd).run_to_end()


if __name__ == "__main__":
    sys.exit(main())
