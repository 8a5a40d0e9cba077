"""Azure ML's inference server (``azmlinfsrv``) bound to a chosen address.

``azmlinfsrv`` always binds 0.0.0.0: right inside Azure ML's container, wrong on a laptop, where a local
endpoint must not be reachable from the network. This entry sets the address, then runs the server exactly
as ``azmlinfsrv`` would, with the same arguments:

    python -m toolkit.serving.server_main --host 127.0.0.1 --entry_script score.py --model_dir M --port P

With ``TRAINBOOK_PARENT_PID`` set (``serve()`` sets it), the server also stops when that process dies: a
kernel that is killed or crashes without ``endpoint.stop()`` must not leave a server holding its port and
model memory (thirty workshop laptops restart kernels often).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading

PARENT_ENV = "TRAINBOOK_PARENT_PID"


def stop_with_parent(parent_pid: int) -> None:
    """SIGTERM this process group (gunicorn's arbiter and its workers) when ``parent_pid`` exits. Waits on a
    pidfd (an event: readable when the process ends), in a daemon thread that gunicorn's forks do not inherit."""
    try:
        pidfd = os.pidfd_open(parent_pid)
    except ProcessLookupError:  # gone already
        os.killpg(os.getpgrp(), signal.SIGTERM)
        return
    except (AttributeError, OSError):  # no pidfd on this platform: the server lives until stopped, as before
        return

    def watch() -> None:
        select.select([pidfd], [], [])
        os.killpg(os.getpgrp(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True, name="trainbook-parent-watch").start()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    host = "127.0.0.1"
    if "--host" in argv:
        i = argv.index("--host")
        host = argv[i + 1]
        del argv[i:i + 2]
    if os.environ.get(PARENT_ENV):
        stop_with_parent(int(os.environ[PARENT_ENV]))
    from azureml_inference_server_http import amlserver

    amlserver.DEFAULT_HOST = host  # read by amlserver.run() when it starts gunicorn
    sys.argv = ["azmlinfsrv", *argv]
    amlserver.run()


if __name__ == "__main__":
    main()
