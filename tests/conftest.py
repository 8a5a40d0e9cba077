"""Shared helpers: run the real CLI in a subprocess, read a run directory."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import io
import os
import random
import select
import shutil
import signal
import subprocess
import sys
import traceback
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import pytest

from toolkit.rundir import RunDir

PROJECT = Path(__file__).resolve().parent.parent


# The smallest model of a user's own (model.name=custom, model.factory=FILE:build): a bigram table over bytes.
BIGRAM_MODEL = """
import torch.nn as nn
import torch.nn.functional as F


class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Embedding(256, 256)

    def forward(self, input_ids, labels):
        return F.cross_entropy(self.table(input_ids).flatten(0, 1), labels.flatten())


def build():
    return Bigram()
"""


@contextlib.contextmanager
def no_runaway_training(run: RunDir, *procs: subprocess.Popen):
    """Whatever the test asserts, leave no CLI, supervisor or rank of this run behind on a shared machine."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
        status = run.read_status() if run.status_path.exists() else {}
        for key in ("worker_pgid", "supervisor_pid"):
            if isinstance(status.get(key), int):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(status[key], signal.SIGKILL)


def cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m toolkit ARGS`` as a user would type it; stdout and stderr captured as text.

    A verb that only reads and writes files (IN_PROCESS_VERBS) runs through the same ``main(argv)`` in this process,
    as `trainbook` would run it in its own: a new interpreter would spend most of its life importing what this one
    has imported already. Everything that starts, follows, signals or serves a run (train, resume, stop, serve, ...)
    runs as its own process, as it must."""
    if _runs_in_process(args):
        return _cli_in_process(args)
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=PROJECT)


# verb -> its sub-verbs that run in process (None: the verb alone or with any flags). Each reads and writes files
# only: no process started, no signal handler, no server, no thread left behind.
IN_PROCESS_VERBS: dict[str, set[str | None] | None] = {
    "data": {"register", "register-builtin", "list", "show", "archive", "verify"},
    "runs": None, "models": None, "checkpoints": None, "advise": None, "estimate": None, "config": None,
    "export": None, "evaluate": None, "forecast": None,  # read checkpoints or events, write a folder or a picture
    "endpoints": {None},  # the listing; `endpoints stop` signals a server
}
# The filters a fresh interpreter starts with (no -W, no PYTHONWARNINGS): a warning shows on stderr as it would there
DEFAULT_WARNING_FILTERS = (("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
                           ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                           ("ignore", ResourceWarning, ""))


def _runs_in_process(args: tuple[str, ...]) -> bool:
    from toolkit.cli.main import build_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            parsed = build_parser().parse_args(list(args))
    except SystemExit:  # a usage error (or --help): argparse's own path, the same in process
        return True
    verb = getattr(parsed, "verb", None)
    if verb not in IN_PROCESS_VERBS:
        return False
    sub_verbs = IN_PROCESS_VERBS[verb]
    return sub_verbs is None or getattr(parsed, f"{verb}_verb", None) in sub_verbs


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """What a fresh interpreter does with a warning its filters show: one formatted line on stderr."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _cli_in_process(args: tuple[str, ...]) -> subprocess.CompletedProcess:
    """``main(ARGS)`` as ``python -m toolkit`` runs it, in the project folder, with what its process would give
    back: the exit status (SystemExit's, or 1 and the traceback for an exception), stdout and stderr, warnings printed
    there as a fresh interpreter prints them (not pytest's record of them). The environment is restored afterwards
    (DeepSpeed's import sets its accelerator there)."""
    from toolkit.cli.main import main

    out, err, environment = io.StringIO(), io.StringIO(), dict(os.environ)
    try:
        with (contextlib.chdir(PROJECT), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err),
              warnings.catch_warnings()):
            warnings.resetwarnings()
            for action, category, module in reversed(DEFAULT_WARNING_FILTERS):
                warnings.filterwarnings(action, category=category, module=module)
            warnings.showwarning = _print_warning  # not into pytest's record: to stderr, as the process prints it
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code
            except Exception:  # what the interpreter does with an uncaught exception
                traceback.print_exc()
                code = 1
    finally:
        os.environ.clear()
        os.environ.update(environment)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, status 1
        err.write(f"{code}\n")
        code = 1
    return subprocess.CompletedProcess([sys.executable, "-m", "toolkit", *args], code, out.getvalue(), err.getvalue())


def pytest_configure(config):
    """A suite started in the background of a script (`make test &`) inherits SIGINT ignored, and so would
    every process its tests start: the tests that stop a server or a run with SIGINT, as Ctrl-C does, would then wait
    forever. A handler here (Python's own) is reset to the default in each child at exec, as in a terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    _pin_xdist_worker()


def _pin_xdist_worker():
    """Under pytest-xdist (``make test`` runs ``-n auto``), pin each worker, and so every process its tests start, to
    its own share of the cores. Unpinned, two workers' training runs each start a thread per core and the threads
    fight: torch's pools spin-wait for the core the other run holds, and a step of the tiny model slows tenfold.
    Pinned, each run sees its cores (``toolkit.machine.usable_cores``) and sizes its threads to them."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if not worker or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    count, index = int(os.environ["PYTEST_XDIST_WORKER_COUNT"]), int(worker.removeprefix("gw"))
    os.sched_setaffinity(0, cores[index::count] or [cores[index % len(cores)]])


# Modules whose module-scoped fixtures train, export or serve: all their tests go to one xdist worker, which builds
# those fixtures once (spread over two workers, each would build them, and again whenever another module's test came
# in between). pytest-xdist's `--dist loadgroup` would do this from an xdist_group mark, but with pytest 9 its renaming
# of items (`item._nodeid`) no longer takes effect, so the groups are named here, by file.
ONE_WORKER_MODULES = {"test_serving.py", "test_multinode.py", "test_endpoint_fuzz.py", "test_deployment_panel.py",
                      "test_export_safety.py", "test_tensorboard.py", "test_hf_export_serving.py",
                      "test_untrusted_folders.py", "test_gpu_check.py",
                      "test_gpu_deepspeed.py", "test_gpu_serving.py"}  # tests/gpu: runs shared on one GPU


@pytest.hookimpl(optionalhook=True)  # without pytest-xdist (a GPU image's pytest) the hook is unknown, not an error
def pytest_xdist_make_scheduler(config, log):
    """Load scheduling (a test at a time to whichever worker is free), except that each of ONE_WORKER_MODULES is one
    unit of work."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if Path(module).name in ONE_WORKER_MODULES else nodeid

    return SharedFixtureModules(config, log)


# --- the unit tier is pure -------------------------------------------------------------------------------------
#
# tests/unit is pure logic and runs in seconds: a test there that starts a process (a subprocess, a fork, an exec)
# fails, naming what it started; such a test belongs in tests/e2e (docs/CONTRIBUTING.md, "Which tier a test goes in").
# The guard is a Python audit hook (PEP 578), which the standard library calls before it starts any process; it is
# on only while a unit test runs (an xdist worker runs both tiers). Here, not in a tests/unit/conftest.py: a second
# module named conftest would shadow this one for `from conftest import ...`, in tests and in their spawned children.
UNIT_TIER = PROJECT / "tests" / "unit"
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.posix_spawnp",
                            "os.system", "os.exec", "os.spawn", "pty.spawn"})
_unit_test_running = [False]


class StartedAProcess(RuntimeError):
    """A unit test started a process."""


def _refuse_processes(event: str, args: tuple) -> None:
    if _unit_test_running[0] and event in PROCESS_EVENTS:
        _unit_test_running[0] = False  # once: pytest reports the failure without the guard in its way
        raise StartedAProcess(f"tests/unit is pure logic, and this test started a process ({event}: "
                              f"{str(args[:2])[:200]}); a test that starts processes belongs in tests/e2e")


sys.addaudithook(_refuse_processes)  # a hook cannot be removed: it stays, off outside the unit tier's tests


@pytest.fixture(autouse=True)
def no_process_in_the_unit_tier(request):
    _unit_test_running[0] = request.node.path.is_relative_to(UNIT_TIER)
    try:
        yield
    finally:
        _unit_test_running[0] = False


def _use_workspace(patch: pytest.MonkeyPatch, workspace: Path, config_home: Path) -> None:
    """This process, and every process it starts, indexes in ``workspace`` and signs with the key in ``config_home``."""
    patch.setenv("TRAINBOOK_WORKSPACE", str(workspace))
    patch.setenv("TRAINBOOK_CONFIG_HOME", str(config_home))


@pytest.fixture(scope="session", autouse=True)
def session_workspace(tmp_path_factory):
    """What runs before a test's own private_workspace (a session or module fixture training a shared run) indexes
    and signs in a workspace of the session's, never in the checkout's .trainbook or the user's key."""
    with pytest.MonkeyPatch.context() as patch:
        root = tmp_path_factory.mktemp("session-workspace")
        _use_workspace(patch, root / "workspace", root / "user-config")
        yield


@pytest.fixture(autouse=True)
def private_workspace(tmp_path, monkeypatch):
    """Every test (and every process it starts) indexes runs and data in its own workspace, and signs its runs with
    a key of its own (toolkit.trust): a test's runs are its user's, another test's are from elsewhere."""
    _use_workspace(monkeypatch, tmp_path / "workspace", tmp_path / "user-config")


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    """Opt in (``pytestmark = pytest.mark.usefixtures("private_cache")``) where a test counts or plants token
    files: they go to the user cache, and with this each test (and every process it starts) gets its own."""
    monkeypatch.setenv("TRAINBOOK_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def ws(tmp_path):
    """A fresh workspace (catalogue) of this test's own."""
    from toolkit.catalogue.workspace import Workspace

    return Workspace.open(tmp_path / "ws")


SEED_ENV = "TRAINBOOK_TEST_SEED"


@pytest.fixture
def rng(request, record_property) -> random.Random:
    """The one source of randomness for tests that draw kill points, delays or inputs: seeded from
    $TRAINBOOK_TEST_SEED, or from a fresh seed, printed with the test's id so that a failure's report (its
    captured setup output) says how to replay it."""
    raw = os.environ.get(SEED_ENV, "")
    if raw.strip():
        if not raw.strip().isdigit():
            raise pytest.UsageError(f"{SEED_ENV}: {raw!r} is not allowed; allowed: a non-negative integer")
        seed = int(raw)
    else:
        seed = random.SystemRandom().randrange(2**32)
    record_property("seed", seed)
    print(f"{request.node.nodeid}: random seed {seed}; replay with {SEED_ENV}={seed} python -m pytest "
          f"'{request.node.nodeid}'")
    return random.Random(seed)


@pytest.fixture
def train_tiny(tmp_path):
    """Train the built-in tiny config through the CLI with extra flags; return (process, RunDir)."""

    def run(*flags: str, name: str = "run") -> tuple[subprocess.CompletedProcess, RunDir]:
        run_dir = tmp_path / name
        proc = cli("train", "tiny", "--run-dir", str(run_dir), *flags)
        return proc, RunDir(run_dir)

    return run


@pytest.fixture(scope="session")
def finished_runs(tmp_path_factory, worker_id):
    """``finished_runs(*flags)``: the finished run of ``trainbook train tiny FLAGS``, trained once per ``make test`` on
    first use and shared by every test that asks for the same flags, in every xdist worker: read it, never change it
    (``finished_run_copy`` gives a test a copy of its own). It is indexed in a workspace of its own and signed with
    the suite's key, not the asking test's: what the run is does not depend on which test asked first. A worker that
    asks while another trains the same run waits on the run's lock file (flock) and then reads it. What the CLI
    printed while it trained is kept beside the run (``cli_output``)."""
    base = tmp_path_factory.getbasetemp()
    root = (base if worker_id == "master" else base.parent) / "finished-runs"  # the parent: one per pytest run
    root.mkdir(exist_ok=True)

    def get(*flags: str) -> RunDir:
        key = hashlib.sha256("\0".join(flags).encode()).hexdigest()[:16]
        run = RunDir(root / key)
        with open(root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not run.path.exists():
                with pytest.MonkeyPatch.context() as patch:  # whichever test asks first, the same run
                    _use_workspace(patch, root / "workspaces" / key / "workspace", root / "user-config")
                    proc = cli("train", "tiny", "--run-dir", str(run.path), *flags)
                assert proc.returncode == 0, proc.stderr
                _cli_output_path(run).write_text(proc.stderr)
            elif run.read_status().get("state") != "completed":
                pytest.fail(f"the shared run for {flags} failed in another test (see its report): {run.path}")
        return run

    return get


def _cli_output_path(run: RunDir) -> Path:
    return run.path.with_name(run.path.name + ".cli-stderr.txt")


def cli_output(run: RunDir) -> str:
    """What ``trainbook train`` printed (its stderr) while it trained the shared run ``finished_runs`` gave."""
    return _cli_output_path(run).read_text()


# A finished run of 10 steps, each logged: what a run of the same config (or the same bytes) must log again
TEN_STEPS = ("--set", "train.max_steps=10", "--set", "train.log_every=1")
# A finished run of 10 steps with checkpoints at 5 and 10: what resume, rollback and a copied run's checks read
TWO_CHECKPOINTS = ("--set", "train.max_steps=10", "--set", "checkpoint.every_steps=5")
# A finished run with no checkpoint (none during the run, none at its end): what export, resume and the panels refuse
NO_CHECKPOINT = ("--set", "train.max_steps=5", "--set", "checkpoint.at_end=false")


@pytest.fixture
def finished_run_copy(finished_runs, tmp_path):
    """``finished_run_copy(*flags, name="run")``: this test's own copy of ``finished_runs(*flags)``, to resume,
    export into, corrupt or tamper with."""

    def copy(*flags: str, name: str = "run") -> RunDir:
        shutil.copytree(finished_runs(*flags).path, tmp_path / name)
        return RunDir(tmp_path / name)

    return copy


@pytest.fixture
def small_mount(tmp_path):
    """``with small_mount(options) as path:`` a real filesystem to fail on: a tmpfs of a given size (a full disk)
    or a read-only bind mount (Azure ML's ro_mount). Mounting needs root; elsewhere the test is skipped."""

    @contextlib.contextmanager
    def mount(*args: str):
        path = tmp_path / f"mount{len(list(tmp_path.glob('mount*')))}"
        path.mkdir()
        if subprocess.run(["mount", *args, str(path)], capture_output=True).returncode != 0:
            pytest.skip(f"cannot mount {' '.join(args)} here (needs root)")
        try:
            yield path
        finally:
            subprocess.run(["umount", "-l", str(path)])

    return mount


def assert_server_dies_with_its_starter(start_code: str) -> None:
    """Run ``start_code`` (which binds ``server`` with ``.process`` and ``.url``) in a starter process, SIGKILL
    the starter (no atexit, no stop(): a kernel killed from the launcher), and await the server's own exit."""
    starter = subprocess.Popen(
        [sys.executable, "-c", f"import sys; {start_code}; print(server.process.pid, server.url, flush=True); "
                               "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=PROJECT)
    pid = None
    try:
        pid, url = starter.stdout.readline().split()
        server = os.pidfd_open(int(pid))  # readable once the server process has exited: an event to wait on
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200, "the server is up while its starter lives"
        starter.kill()
        starter.wait()
        readable, _, _ = select.select([server], [], [], 30)
        assert readable, f"the server (pid {pid}) still runs 30 s after its starter was killed"
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(url, timeout=5)
    finally:
        starter.kill()
        if pid is not None:  # a failed check must not leave the server running either
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid), signal.SIGKILL)


# Tests that use work `make test-matrix` starts beside the session (the CPU Adam build: see the Makefile) run last,
# when that work has had the session's idle cycles.
RUN_LAST = {"test_cpu_adam.py"}


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.path.name in RUN_LAST)  # a stable sort: the others keep their order


def pytest_collection_finish(session):
    """What collection imported (torch, transformers, the toolkit) lives as long as the session: frozen
    (toolkit.startup), the collector's passes during the tests skip it."""
    gc.freeze()


# The suite's wall time moves with this machine's speed (2 to 3x between days), so a `make test` (pytest-xdist) ends
# by timing, on the machine it has just left idle, what every training rank does first
# (toolkit.machine.startup_reference_cpu_s). docs/CONTRIBUTING.md gives its figures with this one.
def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    from toolkit.machine import startup_reference_cpu_s

    seconds = startup_reference_cpu_s()
    if seconds is not None:
        terminalreporter.write_line(f"this machine's speed: a fresh process imports torch and torch._dynamo in "
                                    f"{seconds:.2f} s of CPU (what each training rank starts with)")
