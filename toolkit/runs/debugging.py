"""Interactive debugging, as Azure ML's guide recommends: debugpy in rank 0, listening on loopback, and training
held until a debugger has attached.

    trainbook train tiny --debug          # or `debug: {enabled: true}` in the config
    waiting for a debugger on 127.0.0.1:PORT ...   (the CLI adds a VS Code launch.json entry to paste)

The worker calls :func:`wait_for_debugger` before it builds the Trainer (after importing it: imports run twice as
fast untraced), so a breakpoint anywhere in building the model, loading the data or training is hit; expect the
traced training itself to run several times slower. The port is in status.json (``debugger``) and in a
``debugger`` event, which the CLI and the training panel show, so that a run that does not move says why.

Choices, and why:
- Rank 0 only. The other ranks go on and block in their first collective (the process group's rendezvous) until
  rank 0 joins: up to torch's process-group timeout (30 minutes by default), after which they fail.
- The debug adapter runs inside the worker (debugpy's ``in_process_debug_adapter``). debugpy's usual adapter is a
  process of its own, daemonised into its own session: out of reach of the supervisor's killpg, and alive after the
  worker dies for as long as a client stays connected. Inside the worker it ends with it, however the worker ends
  (stop, crash, SIGKILL, a lost node). What that costs: processes the worker starts (DataLoader workers, with
  data.num_workers > 0) are not debugged.
- Loopback only, and IPv4 (the in-process adapter binds IPv4): debugpy asks a client for no key and a client runs
  any code it likes, so config validation refuses any other debug.host. From another machine, tunnel to it
  (``ssh -L PORT:127.0.0.1:PORT``), or use Azure ML's VS Code / SSH job services, which run beside the job.
- Every attempt waits, restarts included: someone debugging a crash wants the debugger there when it comes again.
  With debug.port 0 the port an earlier attempt chose is asked for again, so the launch.json entry stays valid.
- A stop while waiting (`trainbook stop`, Ctrl-C, the stop button) ends the run "stopped" at once: nothing was
  trained, nothing is saved. Alone, rank 0 then exits 0; with other ranks it exits STOPPED_EXIT, a failure to the
  launcher (torchrun, DeepSpeed's), which then ends the ranks blocked in the rendezvous instead of waiting for them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from toolkit.errors import not_allowed, refused
from toolkit.ports import port_in_use
from toolkit import status as run_status
from toolkit.events import DebuggerEvent, StatusEvent
from toolkit.status import ATTEMPT_ENV
from toolkit.rundir import RunDir

# How often a waiting rank 0 looks for a stop request: a file another process writes, no event to wait on.
STOP_CHECK_S = 0.25
STOPPED_EXIT = 128 + 15  # as if ended by SIGTERM: what a stop is


class DebuggerError(RuntimeError):
    """debugpy cannot listen as the config asks (its port is taken, debugpy is missing); the message says which."""


def wait_for_debugger(run: RunDir) -> int | None:
    """With debug.enabled, in rank 0: listen for a debugger, report where, and (debug.wait_for_client) hold until one
    has attached. Returns None to go on training, or, when the run was stopped while it waited, the exit code the
    process ends with (the stop is recorded). Other ranks, and runs without debug.enabled, return None at once."""
    debug = run.read_config().debug
    if not debug.enabled or int(os.environ.get("RANK", "0")) != 0:
        return None
    port = _listen(debug.host, _port_to_ask(run, debug))
    attempt, world = int(os.environ.get(ATTEMPT_ENV, "0")), int(os.environ.get("WORLD_SIZE", "1"))

    def report(state: str) -> None:  # status.json first: whoever reads the event finds the status saying so too
        run_status.update(run, debugger={"state": state, "host": debug.host, "port": port, "attempt": attempt})
        event = run.append_event(
            DebuggerEvent(state=state, host=debug.host, port=port, world_size=world, attempt=attempt)
        )
        print(notice(event), file=sys.stderr, flush=True)  # the job's log too (train.log, Azure ML's std_log)

    if not debug.wait_for_client:
        report("listening")
        return None
    report("waiting")
    if _attached_unless_stopped(run):
        report("attached")
        return None
    try:
        status = run_status.transition(run, "stop", ended=time.time())
        run.append_event(StatusEvent(state="stopped", step=status.get("step", 0)))
    except run_status.IllegalTransition:
        pass  # the run's end was recorded meanwhile (a kill): it stands
    code = 0 if world == 1 else STOPPED_EXIT
    print(
        f"stopped while waiting for a debugger: nothing was trained; exit code {code}"
        + (" (a failure to the launcher, so that it ends the ranks waiting for rank 0)" if code else ""),
        file=sys.stderr,
        flush=True,
    )
    return code


def _port_to_ask(run: RunDir, debug) -> int:
    """debug.port if set (refused when taken); else the port an earlier attempt listened on, when it is free again;
    else 0, a free one. Checked before listening: pydevd binds in a thread of its own, and when the bind fails
    debugpy.listen waits for it forever."""
    if debug.port:
        if port_in_use(debug.host, debug.port):
            raise DebuggerError(
                not_allowed(
                    "debug.port",
                    debug.port,
                    "a free port, or 0 for one chosen at start",
                    problem=f"is in use on {debug.host} (another debugger or server)",
                )
            )
        return debug.port
    earlier = run.read_status().get("debugger")
    port = earlier.get("port") if isinstance(earlier, dict) else None
    if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536 and not port_in_use(debug.host, port):
        return port
    return 0


def _listen(host: str, port: int) -> int:
    """Start debugpy's in-process adapter on host:port; the port it listens on."""
    # Without -Xfrozen_modules=off pydevd warns that breakpoints in frozen standard-library modules may be missed;
    # the code people debug here (theirs, the toolkit's, torch's) is never frozen.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    try:
        import debugpy
    except ModuleNotFoundError:
        raise DebuggerError(
            refused(
                "debug.enabled",
                "needs debugpy, which is not installed here",
                "pip install debugpy (a core dependency: reinstalling trainbook brings it)",
            )
        ) from None
    _, port = debugpy.listen((host, port), in_process_debug_adapter=True)
    return port


def _attached_unless_stopped(run: RunDir) -> bool:
    """Wait until a client has attached (True) or a stop is requested (False)."""
    import debugpy

    attached = threading.Event()

    def wait() -> None:
        debugpy.wait_for_client()  # returns after the client's configurationDone: its breakpoints are set
        attached.set()

    threading.Thread(target=wait, daemon=True, name="trainbook-debugger-wait").start()
    while not attached.wait(STOP_CHECK_S):
        if run.stop_requested():
            return False
    return True


# --- what people read --------------------------------------------------------------------------------------------


def notice(event: DebuggerEvent) -> str:
    """One line: where to attach and what the run does meanwhile."""
    where = f"{event.host}:{event.port}"
    if event.state == "attached":
        return f"debugger attached on {where}: training starts"
    if event.state == "listening":
        return f"debugger listening on {where} (rank 0; training goes on)"
    others = (
        f"; the other {event.world_size - 1} rank(s) wait for it in their first collective, up to torch's "
        "process-group timeout (30 min by default)"
        if event.world_size > 1
        else ""
    )
    return f"waiting for a debugger on {where} (rank 0: training starts once one attaches){others}"


def vscode_launch_json(host: str, port: int) -> str:
    """A .vscode/launch.json that attaches VS Code (its Python Debugger extension) to the run."""
    return json.dumps(
        {
            "version": "0.2.0",
            "configurations": [
                {
                    "name": "Attach to trainbook",
                    "type": "debugpy",
                    "request": "attach",
                    "connect": {"host": host, "port": port},
                    "justMyCode": False,  # the toolkit's and torch's code too: training bugs often surface there
                }
            ],
        },
        indent=2,
    )


def instructions(event: DebuggerEvent) -> str:
    """What the CLI prints for a debugger event: the notice, and how to attach while one can."""
    if event.state == "attached":
        return notice(event)
    return (
        f"{notice(event)}\nattach with VS Code: put this in .vscode/launch.json, then Run > Start Debugging "
        f"(any Debug Adapter Protocol client works)\n{vscode_launch_json(event.host, event.port)}"
    )
