"""Start a real TensorBoard for a run (scalars from tb/, traces from profile/) on 127.0.0.1, and stop it."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from toolkit.errors import UserError, not_allowed
from toolkit.fsio import check_plain_folder
from toolkit.ports import busy_port_message, free_port, port_in_use
from toolkit.runs.service import ServiceProcess, start_service, wait_until_answers

READY_TIMEOUT_S = 90.0


class TensorBoardError(UserError, RuntimeError):
    pass


@dataclass
class TensorBoardServer:
    url: str
    logdir: Path
    service: ServiceProcess

    @property
    def process(self):
        return self.service.process

    def stop(self) -> None:
        self.service.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def start_tensorboard(run_dir: str | Path, port: int | None = None) -> TensorBoardServer:
    """Serve ``run_dir`` (its tb/ scalars and profile/ traces) and return once TensorBoard answers HTTP."""
    logdir = Path(run_dir)
    if not logdir.is_dir():
        raise TensorBoardError(not_allowed("run_dir", logdir, "a run directory", problem="is not a folder"))
    # TensorBoard reads every event file under its logdir: a run copied from elsewhere with a link in it (tb/ -> /)
    # would have it serve whatever the link points to; a FIFO would hang its reader
    check_plain_folder(logdir, field="run_dir", error=TensorBoardError)
    if port is not None and port_in_use("127.0.0.1", port):
        raise TensorBoardError(busy_port_message("--port", port))
    port = port or free_port()
    service = start_service(
        [
            sys.executable,
            "-m",
            "toolkit.runs.tensorboard_main",
            "--logdir",
            str(logdir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--reload_interval",
            "5",
        ],
        logdir / "tensorboard.log",
    )
    server = TensorBoardServer(url=f"http://127.0.0.1:{port}/", logdir=logdir, service=service)
    wait_until_answers(service, server.url + "data/logdir", READY_TIMEOUT_S, "TensorBoard", TensorBoardError)
    return server
