"""toolkit.runs.service, the one owner of a server process's life (TensorBoard and the endpoint use it):
started, awaited until it answers HTTP, stopped; a service that dies or never answers is reported with its log."""

import sys

import pytest

from toolkit.ports import free_port
from toolkit.runs.service import ServiceError, start_service, wait_until_answers


def test_a_server_is_awaited_until_it_answers_then_stopped(tmp_path):
    port = free_port()
    service = start_service([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                             "--directory", str(tmp_path)], tmp_path / "server.log")
    try:
        wait_until_answers(service, f"http://127.0.0.1:{port}/", 60, "http.server")
        assert service.process.poll() is None
    finally:
        service.stop()
    assert service.process.poll() is not None


def test_a_service_that_exits_is_reported_with_its_code_and_log(tmp_path):
    service = start_service([sys.executable, "-c", "print('port already taken'); raise SystemExit(3)"],
                            tmp_path / "dead.log")
    with pytest.raises(ServiceError, match=r"(?s)^dead exited with code 3 before it answered .*port already taken"):
        wait_until_answers(service, f"http://127.0.0.1:{free_port()}/", 60, "dead")


def test_a_service_that_never_answers_is_stopped_at_the_deadline(tmp_path):
    service = start_service([sys.executable, "-c", "import time; print('loading', flush=True); time.sleep(600)"],
                            tmp_path / "slow.log", fresh_log=True)
    with pytest.raises(ServiceError, match=r"(?s)^slow did not answer on http://127.0.0.1:\d+/ within 1 s .*loading"):
        wait_until_answers(service, f"http://127.0.0.1:{free_port()}/", 1, "slow")
    assert service.process.poll() is not None, "stopped, not left running"
