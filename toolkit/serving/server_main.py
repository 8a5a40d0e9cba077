"""Azure ML's inference server (``azmlinfsrv``) bound to a chosen address.

``azmlinfsrv`` always binds 0.0.0.0: right inside Azure ML's container, wrong on a laptop, where a local
endpoint must not be reachable from the network. This entry sets the address, then runs the server exactly
as ``azmlinfsrv`` would, with the same arguments:

    python -m toolkit.serving.server_main --host 127.0.0.1 --entry_script score.py --model_dir M --port P

With ``TRAINBOOK_PARENT_PID`` set (``serve()`` sets it), the server stops when that process dies
(toolkit.parent_watch).
"""

from __future__ import annotations

import sys

from toolkit.parent_watch import stop_with_parent


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    host = "127.0.0.1"
    if "--host" in argv:
        i = argv.index("--host")
        host = argv[i + 1]
        del argv[i:i + 2]
    stop_with_parent()
    from azureml_inference_server_http import amlserver

    amlserver.DEFAULT_HOST = host  # read by amlserver.run() when it starts gunicorn
    sys.argv = ["azmlinfsrv", *argv]
    amlserver.run()


if __name__ == "__main__":
    main()
