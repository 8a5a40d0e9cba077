"""The local online endpoint, tested against a running server: the scoring contract, the key, every kind of bad
request, 50 concurrent clients, and batching that changes speed but not answers."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from toolkit.deploy.serving.batcher import Batcher
from toolkit.deploy.serving.protocol import MAX_BODY_BYTES, MAX_NEW_TOKENS, MAX_PROMPT_BYTES, GenerateRequest, ScoreRequest
from toolkit.deploy.serving.runtimes import load_runtime
from toolkit.deploy.serving.endpoint import PlainHTTPWarning, serve

from conftest import PROJECT, assert_server_dies_with_its_starter, cli
from served_model import exported_tiny_model


@pytest.fixture(scope="module")
def model_dir(finished_runs):
    return exported_tiny_model(finished_runs)


@pytest.fixture(scope="module")
def endpoint(model_dir, tmp_path_factory):
    with serve(model_dir, workspace=tmp_path_factory.mktemp("ws"), max_batch=16, max_wait_ms=5) as ep:
        yield ep


def call(url, body=None, headers=None, method=None, raw: bytes | None = None):
    """(status, JSON or text) of one HTTP request; HTTP errors are answers here, not exceptions."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def generate(endpoint, **body):
    return call(endpoint.scoring_url, {"prompt": "def ", "max_new_tokens": 8, **body}, endpoint.headers())


@pytest.mark.smoke
def test_generation_and_scoring_follow_the_contract(endpoint):
    status, answer = generate(endpoint, max_new_tokens=20, temperature=0.8, top_k=20, seed=7)
    assert status == 200 and answer["task"] == "generate" and answer["new_tokens"] == 20
    assert isinstance(answer["text"], str) and answer["prompt_bytes"] == 4
    assert {"queue", "compute", "total", "server", "steps"} <= set(answer["timing_ms"])
    assert generate(endpoint, max_new_tokens=20, temperature=0.8, top_k=20, seed=7)[1]["text"] == answer["text"], \
        "a seed makes sampling repeatable"
    long_text = "The quick brown fox jumps over the lazy dog. " * 5  # longer than the 32-byte context
    status, scored = call(endpoint.scoring_url, {"task": "score", "text": long_text}, endpoint.headers())
    assert status == 200 and scored["predicted_bytes"] == len(long_text) - 1
    assert scored["log_likelihood"] < 0 and 0 < scored["bits_per_byte"] < 8.5


def test_liveness_and_readiness(endpoint):
    assert call(endpoint.url + "/") == (200, "Healthy")  # the inference server's own liveness route
    assert call(endpoint.scoring_url) == (200, {"ready": True})  # readiness: no key needed, as for Azure ML's probes
    status, ready = call(endpoint.scoring_url, headers=endpoint.headers())  # the key's holder sees the details
    assert status == 200 and ready["ready"] and ready["runtime"] == "onnx" and ready["max_batch"] == 16


def test_the_key_is_private_and_the_server_listens_on_loopback_only(endpoint):
    key_file = endpoint.folder / "key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and len(endpoint.key) >= 32
    assert endpoint.key not in repr(endpoint) and endpoint.key not in endpoint.describe()
    assert endpoint.url.startswith("http://127.0.0.1:")
    port = int(endpoint.url.rsplit(":", 1)[1])
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # UDP connect sends nothing; it picks the outward interface
        outside = probe.getsockname()[0]
    except OSError:
        outside = "127.0.0.1"
    finally:
        probe.close()
    if outside.startswith("127."):
        pytest.skip("this machine has no non-loopback address to try")
    with pytest.raises(OSError):  # refused: nothing listens on that address
        socket.create_connection((outside, port), timeout=2).close()


BAD_REQUESTS = [
    # (what, body or raw bytes, headers: "good" | "none" | "wrong", method, status, words in the message)
    ("no key", {"prompt": "x"}, "none", None, 401, "Authorization: key missing"),
    ("wrong key", {"prompt": "x"}, "wrong", None, 401, "Authorization: key not valid"),
    ("not JSON", b"{prompt: 'x'", "good", None, 400, "body: not valid JSON"),
    ("not UTF-8", b"\xff\xfe\x00", "good", None, 400, "body: not"),
    ("a list", [1, 2], "good", None, 400, "body: a JSON array"),
    ("unknown task", {"task": "translate", "prompt": "x"}, "good", None, 400, "task: 'translate' is not allowed"),
    ("unknown field", {"prompt": "x", "beam": 4}, "good", None, 400, "beam: unknown field"),
    ("prompt not a string", {"prompt": 42}, "good", None, 400, "prompt: 42 is not allowed"),
    ("empty prompt", {"prompt": ""}, "good", None, 400, "prompt: empty"),
    ("prompt over the limit", {"prompt": "x" * (MAX_PROMPT_BYTES + 1)}, "good", None, 400, "over the limit"),
    ("negative max_new_tokens", {"prompt": "x", "max_new_tokens": -1}, "good", None, 400, "max_new_tokens: -1"),
    ("huge max_new_tokens", {"prompt": "x", "max_new_tokens": 10**9}, "good", None, 400,
     f"allowed: an integer from 1 to {MAX_NEW_TOKENS}"),
    ("temperature a word", {"prompt": "x", "temperature": "hot"}, "good", None, 400, "temperature: 'hot'"),
    ("body over the limit", b"{" + b" " * (MAX_BODY_BYTES + 10) + b"}", "good", None, 413, "body:"),
    ("unknown route", None, "good", "GET", 404, ""),
    ("method", {"prompt": "x"}, "good", "PUT", 405, ""),
]


@pytest.mark.parametrize("what, body, auth, method, status, message", BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_the_right_status_and_the_server_stays_up(endpoint, what, body, auth, method, status,
                                                                    message):
    headers = {"good": endpoint.headers(), "none": {"Content-Type": "application/json"},
               "wrong": {**endpoint.headers(), "Authorization": "Bearer not-the-key"}}[auth]
    url = endpoint.url + "/nowhere" if what == "unknown route" else endpoint.scoring_url
    raw = body if isinstance(body, bytes) else None
    got, answer = call(url, None if raw is not None else body, headers, method=method, raw=raw)
    assert got == status, answer
    if message:
        assert message in answer["error"], answer
    assert "Traceback" not in json.dumps(answer)
    assert generate(endpoint)[0] == 200, "the server answers a good request afterwards"


def test_fifty_concurrent_clients_are_all_answered_and_share_forward_passes(endpoint):
    before = call(endpoint.scoring_url, headers=endpoint.headers())[1]
    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(lambda i: generate(endpoint, max_new_tokens=16, seed=i, temperature=1.0), range(50)))
    assert [status for status, _ in results] == [200] * 50
    assert all(answer["new_tokens"] == 16 for _, answer in results)
    after = call(endpoint.scoring_url, headers=endpoint.headers())[1]
    rows, forwards = after["rows"] - before["rows"], after["forwards"] - before["forwards"]
    assert rows == 50 * 16 and forwards < rows / 2, f"{forwards} forwards for {rows} rows: requests were not batched"
    assert generate(endpoint)[0] == 200


def test_batching_changes_speed_not_answers(model_dir):
    """Greedy generations of prompts of different lengths, submitted together: the same text batched (rows
    right-padded into one forward) as one at a time; and ONNX Runtime agrees with eager torch."""
    prompts = [b"def ", b"The return value of", b"x", b"class Foo:\n    def __init__(self"]
    requests = [GenerateRequest(p, 12, 0.0, 0, None) for p in prompts] + [ScoreRequest(b"import os\nimport sys\n" * 3)]
    answers = {}
    for runtime in ("onnx", "torch"):
        for max_batch in (1, 8):
            batcher = Batcher(load_runtime(model_dir, runtime), max_batch=max_batch, max_wait_ms=50)
            futures = [batcher.submit(r) for r in requests]
            answers[runtime, max_batch] = [f.result(timeout=60) for f in futures]
            if max_batch == 8:
                assert batcher.stats["forwards"] < len(requests) * 12, "the requests shared forward passes"
    reference = answers["torch", 1]
    for key, got in answers.items():
        assert [a["text"] for a in got[:4]] == [a["text"] for a in reference[:4]], key
        assert got[4]["log_likelihood"] == pytest.approx(reference[4]["log_likelihood"], abs=1e-3), key


def test_the_runtimes_agree_on_logits(model_dir):
    ids = np.random.default_rng(0).integers(0, 256, size=(3, 20), dtype=np.int64)
    onnx, torch_ = load_runtime(model_dir, "onnx"), load_runtime(model_dir, "torch")
    assert np.abs(onnx.forward(ids) - torch_.forward(ids)).max() <= 1e-4
    with pytest.raises(ValueError, match="runtime: 'tensorrt' is not allowed; allowed: onnx, torch"):
        load_runtime(model_dir, "tensorrt")


def test_serve_from_the_command_line_and_stop_with_ctrl_c(model_dir, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "toolkit", "serve", str(model_dir), "--runtime", "torch",
                             "--workspace", str(tmp_path / "ws")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=PROJECT)
    try:
        first = proc.stdout.readline()  # printed once the endpoint answers
        url = first.split(": ", 1)[1].split(" ")[0]
        told = ""  # the rest of what it prints when ready, to its last line
        while not told.endswith("stops it)\n"):
            line = proc.stdout.readline()
            assert line, f"serve stopped printing before its last line: {first + told}"
            told += line
        key = (tmp_path / "ws" / "endpoints" / "tiny" / "key").read_text()
        assert key not in first and "key " in first
        status, answer = call(url, {"prompt": "def ", "max_new_tokens": 4}, {"Authorization": f"Bearer {key}"})
        assert status == 200 and answer["new_tokens"] == 4
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert key not in out + err
    assert f"OpenAI's API: openai.OpenAI(base_url='{url.removesuffix('/score')}/v1', api_key=<the key>)" in told


def test_endpoints_lists_a_running_endpoint_and_stop_ends_it_and_its_serve_command(model_dir, tmp_path):
    ws = str(tmp_path / "ws")
    listed = cli("endpoints", "--workspace", ws)
    assert listed.returncode == 0 and "no endpoints running" in listed.stdout, listed.stderr
    assert not (tmp_path / "ws").exists()  # looking never creates a workspace
    proc = subprocess.Popen([sys.executable, "-m", "toolkit", "serve", str(model_dir), "--runtime", "torch",
                             "--workspace", ws], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=PROJECT)
    try:
        proc.stdout.readline()  # printed once the endpoint answers
        listed = cli("endpoints", "--workspace", ws, "--json")
        assert listed.returncode == 0, listed.stderr
        (endpoint,) = json.loads(listed.stdout)["endpoints"]
        assert endpoint["name"] == "tiny" and endpoint["runtime"] == "torch"
        assert endpoint["key_file"] == str(tmp_path / "ws" / "endpoints" / "tiny" / "key")
        assert endpoint["url"].startswith("http://127.0.0.1:") and endpoint["pid"] != proc.pid
        assert call(endpoint["url"] + "/")[0] == 200
        stopped = cli("endpoints", "stop", "tiny", "--workspace", ws)
        assert stopped.returncode == 0 and f"pid {endpoint['pid']}" in stopped.stdout, stopped.stderr
        out, err = proc.communicate(timeout=30)  # the serve command notices and ends
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "endpoint tiny stopped" in err, err
    assert "no endpoints running" in cli("endpoints", "--workspace", ws).stdout
    again = cli("endpoints", "stop", "tiny", "--workspace", ws)
    assert again.returncode == 2 and "'tiny' is not a running endpoint" in again.stderr, again.stderr


def test_serve_on_a_busy_port_says_so_at_once(model_dir):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = cli("serve", str(model_dir), "--port", str(port), timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"port {port} is in use; omit --port for a free one" in proc.stderr and "gunicorn" not in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--runtime", "tensorrt"], "--runtime: 'tensorrt' is not allowed; allowed: onnx, torch"),
    (["--port", "80"], "--port: 80 is not allowed; allowed: 1024 to 65535"),
    (["--max-batch", "0"], "--max-batch: 0 is not allowed"),
])
def test_bad_serve_arguments(model_dir, args, message):
    proc = subprocess.run([sys.executable, "-m", "toolkit", "serve", str(model_dir), *args], capture_output=True,
                          text=True, cwd=PROJECT, timeout=60, env={**os.environ})
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr



def test_an_endpoint_stops_when_the_process_that_started_it_is_killed(model_dir, tmp_path):
    """A kernel killed without endpoint.stop() must not leave a server holding its port."""
    assert_server_dies_with_its_starter(
        "from toolkit.deploy.serving.endpoint import serve; "
        f"server = serve({str(model_dir)!r}, workspace={str(tmp_path / 'ws')!r})")


def unix_socket_paths(pid: int) -> set[str]:
    """The filesystem paths of the Unix sockets process ``pid`` holds open."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    paths = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith("/"):
            paths.add(fields[7])
    return paths


def test_endpoints_share_no_control_socket_and_a_running_ones_name_is_refused(model_dir, tmp_path, monkeypatch):
    """gunicorn's control socket lived at one path per user (~/.gunicorn/gunicorn.ctl, or in $XDG_RUNTIME_DIR): a
    second endpoint replaced the first's, and it could add workers under the one batcher. No endpoint opens one,
    wherever it would be: neither server holds any Unix socket with a path. A third `serve` under a running one's
    name (a second `trainbook serve` of the same model) is refused naming it, and leaves its record and log be."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    with serve(model_dir, workspace=tmp_path / "ws", name="first") as first, \
            serve(model_dir, workspace=tmp_path / "ws", name="second") as second:
        pids = [first.process.pid, second.process.pid]
        pids += [int(child) for pid in pids for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        assert [path for path in home.rglob("*") if path.is_socket()] == []
        assert set().union(*map(unix_socket_paths, pids)) == set()
        assert generate(first)[0] == generate(second)[0] == 200
        log = first.log_path.read_bytes()
        again = cli("serve", str(model_dir), "--name", "first", "--workspace", str(tmp_path / "ws"), timeout=120)
        assert again.returncode == 2, again.stderr[-3000:]
        assert f"--name: 'first' is already served at {first.url} (pid {first.process.pid}" in again.stderr
        assert first.log_path.read_bytes().startswith(log) and len(log) > 0
        listed = json.loads(cli("endpoints", "--workspace", str(tmp_path / "ws"), "--json").stdout)
        assert {e["name"]: e["pid"] for e in listed["endpoints"]}["first"] == first.process.pid
        assert generate(first)[0] == 200


def test_binding_beyond_loopback_warns_that_the_key_travels_in_plain_http(tmp_path):
    """Checked before anything starts: here the model does not exist, so nothing is ever bound."""
    with pytest.warns(PlainHTTPWarning, match="0.0.0.0: .*plain HTTP.*key"), pytest.raises(Exception):
        serve(tmp_path / "no-model", host="0.0.0.0", workspace=tmp_path / "ws")
    proc = subprocess.run([sys.executable, "-m", "toolkit", "serve", str(tmp_path / "no-model"), "--host", "0.0.0.0",
                           "--workspace", str(tmp_path / "ws")], capture_output=True, text=True, cwd=PROJECT,
                          timeout=60)
    assert proc.returncode != 0 and "plain HTTP" in proc.stderr, proc.stderr


REQUEST_TIMEOUT = 1.0  # tiny, so that waiting past it shows within the test
LONG = {"prompt": "def ", "max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0}  # hundreds of ms each, one at a time


def test_requests_queued_behind_long_generations_get_503_at_the_request_timeout(model_dir, tmp_path):
    """One request at a time (max_batch=1) and long generations at once: more work than fits the timeout (as many
    as three timeouts' worth of this machine's measured generation time). Each is answered, 200 or 503 naming the
    limit, in about the timeout; then the server answers as before."""
    import math
    import time

    with serve(model_dir, workspace=tmp_path / "ws", max_batch=1, request_timeout=REQUEST_TIMEOUT) as endpoint:
        def timed(seed: int):
            started = time.perf_counter()
            status, answer = call(endpoint.scoring_url, {**LONG, "seed": seed}, endpoint.headers())
            return status, answer, time.perf_counter() - started

        status, one, _ = timed(0)  # how long one generation takes here: machines (and days) differ tenfold
        assert status == 200, one
        clients = max(12, math.ceil(3 * REQUEST_TIMEOUT * 1000 / one["timing_ms"]["compute"]))
        with ThreadPoolExecutor(clients) as pool:
            results = list(pool.map(timed, range(clients)))
        refused = [(answer, seconds) for status, answer, seconds in results if status == 503]
        assert refused and all(status in (200, 503) for status, _, _ in results), results
        for answer, seconds in refused:
            assert f"no answer within {REQUEST_TIMEOUT:g} s" in answer["error"], answer
            assert REQUEST_TIMEOUT <= seconds < REQUEST_TIMEOUT + 10, "refused at the limit, not before, not long after"
        assert generate(endpoint)[0] == 200


def test_an_in_process_request_waits_no_longer_than_its_timeout(model_dir):
    """The service's own wait honours the deadline, whatever the batcher is busy with: here work submitted
    without a deadline (Batcher.submit's default), which no scheduling drops. A request queued behind it gets its
    503 while that work still runs; its job is cancelled, and the service answers afterwards."""
    from toolkit.deploy.serving.options import ServingOptions
    from toolkit.deploy.serving.service import ScoringService

    service = ScoringService(model_dir, ServingOptions(max_batch=1, request_timeout=0.5))
    ahead = [service.batcher.submit(GenerateRequest(b"def ", MAX_NEW_TOKENS, 1.0, 0, seed)) for seed in range(12)]
    body = json.dumps({"prompt": "def ", "max_new_tokens": 4}).encode()
    status, answer = service.handle("POST", None, len(body), lambda n: body[:n])
    assert (status, answer) == (503, {"error": "no answer within 0.5 s: the endpoint is overloaded; try again later"})
    assert not ahead[-1].done(), "answered before the work ahead of it was done, not after"
    for future in ahead:
        future.cancel()
    assert service.handle("POST", None, len(body), lambda n: body[:n])[0] == 200
    with pytest.raises(ValueError, match="request-timeout: 0 is not allowed; allowed: 0.5 to 3600 seconds"):
        ScoringService(model_dir, ServingOptions(request_timeout=0))
