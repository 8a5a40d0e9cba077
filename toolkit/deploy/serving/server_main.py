"""Azure ML's inference server (``azmlinfsrv``) bound to a chosen address, with a gunicorn worker that no slow
client can starve.

``azmlinfsrv`` always binds 0.0.0.0: right inside Azure ML's container, wrong on a laptop, where a local
endpoint must not be reachable from the network. This entry sets the address, then runs the server exactly
as ``azmlinfsrv`` would, with the same arguments:

    python -m toolkit.deploy.serving.server_main --host 127.0.0.1 --entry_script score.py --model_dir M --port P

and more gunicorn settings (added to GUNICORN_CMD_ARGS):

``--no-control-socket``
    gunicorn 25.1+ opens a control socket at $XDG_RUNTIME_DIR/gunicorn.ctl (else ~/.gunicorn/gunicorn.ctl):
    one path for every server of the user, so a second endpoint unlinks the first one's, and ``gunicornc`` on
    it can add workers under the one batcher that owns the model. A local endpoint needs none of it.
``--worker-class toolkit.deploy.serving.http_worker.WholeRequestWorker``
    a pool thread only ever gets a request that has fully arrived; slow or idle clients time out with 408
    (see toolkit.deploy.serving.http_worker).
``--worker-connections 1000``
    open connections at once (the soft limit on open files is raised to fit; when the hard limit is lower, the
    worker takes as many as fit).

Settings (serve() sets them): TRAINBOOK_HEADER_TIMEOUT_S, TRAINBOOK_BODY_TIMEOUT_S, and score.py's (among them
TRAINBOOK_REQUEST_TIMEOUT_S). With
``TRAINBOOK_PARENT_PID`` set, the server stops when that process dies (toolkit.parent_watch).
"""

from __future__ import annotations

import os
import sys

from toolkit.parent_watch import stop_with_parent
from toolkit.deploy.serving.http_worker import GUNICORN_ARGS, enough_descriptors


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    host = "127.0.0.1"
    if "--host" in argv:
        i = argv.index("--host")
        host = argv[i + 1]
        del argv[i : i + 2]
    stop_with_parent()
    enough_descriptors()
    from azureml_inference_server_http import amlserver

    amlserver.DEFAULT_HOST = host  # read by amlserver.run() when it starts gunicorn
    os.environ["GUNICORN_CMD_ARGS"] = " ".join([os.environ.get("GUNICORN_CMD_ARGS", ""), *GUNICORN_ARGS]).strip()
    sys.argv = ["azmlinfsrv", *argv]
    amlserver.run()


if __name__ == "__main__":
    main()
