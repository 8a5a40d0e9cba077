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
from toolkit import status as run_status
from toolkit.events import ErrorEvent, RestartEvent, StatusEvent
from toolkit.runs.launchers import worker_command  # imports no torch
from toolkit.rundir import RunDir
from toolkit.status import ATTEMPT_ENV, FINAL_STATES

LOG_NAME = "train.log"  # stdout and stderr of every rank: the first place to look when a run dies early
# How long the ranks have, after a stop was asked for, to finish their step and save it before they get the signal
# too; RunHandle.stop then kills whatever is left once its own grace has run out.
STOP_GRACE_S = 120.0


def describe_exit(code: int) -> str:
    return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"


def decide(outcomes: list[dict], restarts: int, max_restarts: int) -> dict:
    """What every node does after an attempt, from each node's outcome ({code, stopping, completed, no_restart};
    node 0's first): end it (completed, stopped, a failure a restart would repeat, out of restarts) or restart. The
    exit code is the first node's that failed."""
    code = next((o["code"] for o in outcomes if o["code"] != 0), 0)
    # completed, then died (in teardown): the training is done, another attempt would add nothing
    end = (
        code == 0
        or any(o["stopping"] for o in outcomes)
        or outcomes[0]["completed"]
        or bool(outcomes[0].get("no_restart"))
        or restarts >= max_restarts
    )
    return {
        "code": code,
        "end": end,
        "stopping": any(o["stopping"] for o in outcomes),
        "node": next((i for i, o in enumerate(outcomes) if o["code"] != 0), None),
    }


class Supervisor:
    """Runs a run's attempts on this machine; with ``nodes`` (toolkit.runs.nodes, a multi-node job), this node's
    share of them, every decision agreed with the other nodes. Only the supervisor of node 0 (the node of rank 0)
    writes the run's status and events."""

    def __init__(self, run: RunDir, max_restarts: int, lock_fd: int | None = None, nodes=None):
        self.run, self.max_restarts = run, max_restarts
        self.lock_fd = lock_fd  # the run lock (toolkit.run_lock), passed on to every attempt's processes
        self.nodes = nodes
        self.writes_run = nodes is None or nodes.spec.rank == 0
        self.log_name = LOG_NAME if self.writes_run else f"train.node{nodes.spec.rank}.log"
        self.worker: subprocess.Popen | None = None
        self.stopping = False
        self._forward: threading.Timer | None = None  # passes a stop signal on if the ranks have not ended

    def _start_worker(self, attempt: int) -> subprocess.Popen:
        cmd, extra_env = worker_command(
            self.run.read_config(), self.run.path, nodes=self.nodes.spec if self.nodes else None
        )
        with open_log(self.run.path / self.log_name) as log:
            log.write(f"\n===== attempt {attempt}: {' '.join(cmd)}\n".encode())
            log.flush()
            worker = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **extra_env, ATTEMPT_ENV: str(attempt)},
                start_new_session=True,  # its own group: killpg reaches every rank
                pass_fds=() if self.lock_fd is None else (self.lock_fd,),
            )
        if self.writes_run:
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

    def _agree(self, name: str, value: dict, decide_fn) -> dict:
        """One node decides alone; several agree through node 0 (toolkit.runs.nodes)."""
        if self.nodes is None:
            return decide_fn([value])
        return self.nodes.agree(name, value, decide_fn)

    def _wait_for_worker(self) -> int:
        """The attempt's exit code. In a multi-node job, also watch the other nodes meanwhile: when one is lost, this
        node's ranks would wait for it in their next collective, maybe for the backend's whole timeout; end them now."""
        if self.nodes is None:
            return self.worker.wait()
        from toolkit.runs.nodes import POLL_S, NodeLost

        while True:
            try:
                return self.worker.wait(timeout=POLL_S)
            except subprocess.TimeoutExpired:
                pass
            try:
                self.nodes.check_others()
            except NodeLost:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.worker.pid, signal.SIGKILL)
                self.worker.wait()
                raise

    def run_to_end(self) -> int:
        from toolkit.runs.nodes import NodeLost

        try:
            return self._attempts()
        except NodeLost as exc:
            print(
                f"[supervisor] {exc}: this node ends the job; resubmit it to resume from the last checkpoint",
                file=sys.stderr,
                flush=True,
            )
            if self.writes_run:  # the ranks may have recorded their own failure first (a closed connection)
                self.run.append_event(ErrorEvent(message=str(exc)))
                if self.run.read_status().get("state") in FINAL_STATES:
                    run_status.update(self.run, node_lost=str(exc))
                else:
                    self.run.append_event(StatusEvent(state="killed", exit_code=1, reason=str(exc)))
                    run_status.transition(self.run, "kill", exit_code=1, error=str(exc), node_lost=str(exc))
            return 1

    def _attempts(self) -> int:
        if self.writes_run:
            self.run.clear_stop_request()  # an earlier attempt's: this start (a resume) is wanted
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        # `resume` continues the count; node 0's status.json decides (another node's view of it may be stale)
        first = int(self.run.read_status().get("attempt", -1)) + 1 if self.writes_run else 0
        attempt = self._agree("first-attempt", {"attempt": first}, lambda values: values[0])["attempt"]
        restarts = 0
        while True:
            if self.stopping and self.nodes is None:  # stopped between two attempts: start nothing more
                code = -signal.SIGTERM
                break
            if self.nodes is not None:  # nobody starts an attempt before every node's last one has ended
                self.nodes.exchange("attempt-start", {"attempt": attempt})
            self.worker = self._start_worker(attempt)
            if self.stopping:  # stopped while it was starting, before the handler could see it: pass it on
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.worker.pid, signal.SIGTERM)
            code = self._wait_for_worker()
            status = self.run.read_status() if self.writes_run else {}
            no_restart = run_status.restart_forbidden(status, attempt) if code != 0 else None
            outcome = self._agree(
                "attempt-end",
                {
                    "code": code,
                    "stopping": self.stopping,
                    "completed": status.get("state") == "completed",
                    "no_restart": no_restart,
                },
                lambda values, restarts=restarts: decide(values, restarts, self.max_restarts),
            )
            code = outcome["code"]
            self.stopping = self.stopping or outcome["stopping"]
            if outcome["end"]:
                if no_restart and restarts < self.max_restarts:
                    print(
                        f"[supervisor] training failed ({describe_exit(code)}), not restarted: {no_restart}",
                        file=sys.stderr,
                        flush=True,
                    )
                break
            restarts += 1
            attempt += 1
            if not self.writes_run:
                continue
            info, skipped = CheckpointStore(self.run.path).find_resume_point()
            from_step = info.step if info else 0
            reason = describe_exit(code) + ("" if self.nodes is None else f" on node {outcome['node']}")
            print(
                f"[supervisor] training died ({reason}); restart {restarts}/{self.max_restarts} from step {from_step}",
                file=sys.stderr,
                flush=True,
            )
            self.run.append_event(
                RestartEvent(
                    restart=restarts,
                    attempt=attempt,
                    reason=reason,
                    from_step=from_step,
                    checkpoint=info.name if info else None,
                    skipped=[s.name for s in skipped],
                )
            )
            run_status.transition(self.run, "restart", last_failure=reason, last_failure_time=time.time())
        state = self.run.read_status().get("state") if self.writes_run else None
        if self.writes_run and code != 0 and (state not in FINAL_STATES or state == "completed"):
            final, name = (
                ("stopped", "stop") if self.stopping else ("killed", "kill") if code < 0 else ("failed", "fail")
            )
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
