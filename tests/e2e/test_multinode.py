"""Two nodes on one machine: the multi-node job (toolkit.runs.job) as Azure ML runs it, once per node.

Each "node" is its own process tree with its own node-local folder (its token cache, its log); the run directory is
in one shared folder, as an Azure ML rw_mount output is. The nodes find each other through MASTER_ADDR/MASTER_PORT on
127.0.0.1 (what Azure ML's PyTorch distribution sets), and coordinate through node 0's store, never through files.
A node is lost by SIGKILL of its whole process tree: its job entry, its torchrun, its ranks.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from toolkit.runs.local_nodes import LocalNodesJob
from toolkit.rundir import RunDir

pytestmark = pytest.mark.slow

STEPS, EVERY = 24, 8
CONFIG = f"""
name: two-nodes
model: {{name: gpt, n_layer: 2, n_head: 2, n_embd: 32, block_size: 32}}
optim: {{lr: 3.0e-3, min_lr: 3.0e-4, warmup_steps: 5}}
train: {{batch_size: 8, max_steps: {STEPS}, eval_every: 12, eval_batches: 4, log_every: 1}}
checkpoint: {{every_steps: {EVERY}}}
data: {{tokenizer: bytes}}
"""
ENGINES = {"torch": [], "deepspeed": ["--set", "engine.name=deepspeed", "--set", "engine.zero_stage=2"]}
LOST_AFTER_S = 4  # a node silent this long is lost (60 s on a real cluster)
DEADLINE_S = 240


# The job's data: Python's own sources, mounted read-only by each submission under a folder of its own, as Azure ML
# mounts an input under a path named after the job.
DATA = b"\n".join((Path(textwrap.__file__).parent / name).read_bytes() for name in ("textwrap.py", "shlex.py", "glob.py"))


class Job(LocalNodesJob):
    """A two-node submission of CONFIG (written beside the nodes' folders), its data mounted at a path of its own."""

    def __init__(self, root: Path, run: Path, *flags: str, max_restarts: int = 0, node_runs: dict | None = None):
        config = root / "config.yaml"
        config.write_text(CONFIG)
        self.data = root / f"mount-{len(list(root.glob('mount-*')))}" / "data"
        self.data.mkdir(parents=True)
        (self.data / "corpus.txt").write_bytes(DATA)
        super().__init__(root, run, config, "--set", f"data.path={self.data}", *flags, max_restarts=max_restarts,
                         lost_after_s=LOST_AFTER_S, node_run_dirs=node_runs)

    def wait(self) -> list[int]:
        return super().wait(timeout=DEADLINE_S)


def wait_for(condition, what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # another process's files: no event to wait on


def losses(run: RunDir) -> dict[int, float]:
    """Each step's loss; a step that ran twice (before a lost node and after the resume) keeps the later one."""
    return {e["step"]: e["loss"] for e in run.events("train")}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``reference(engine)``: the uninterrupted two-node run of that engine, trained on first use (`make test` runs
    only the torch one, `make test-matrix` only the DeepSpeed one)."""
    runs = {}

    def get(engine: str) -> RunDir:
        if engine not in runs:
            root = tmp_path_factory.mktemp(f"reference-{engine}")
            (root / "shared").mkdir()
            job = Job(root, root / "shared" / "run", *ENGINES[engine])
            assert job.wait() == [0, 0], job.output(0) + job.output(1)
            runs[engine] = RunDir(root / "shared" / "run")
        return runs[engine]

    return get


@pytest.mark.parametrize("engine", [pytest.param("torch"), pytest.param("deepspeed", marks=pytest.mark.matrix)])
def test_a_lost_node_ends_the_job_and_the_resubmitted_job_resumes_exactly(tmp_path, reference, engine):
    shared = tmp_path / "shared"
    shared.mkdir()
    run = RunDir(shared / "run")
    job = Job(tmp_path, run.path, *ENGINES[engine])
    wait_for(lambda: (run.path / "checkpoints" / f"step_{EVERY:08d}" / "manifest.json").exists(), "a checkpoint")
    job.lose_node(1)
    assert job.processes[0].wait(timeout=DEADLINE_S) == 1
    assert "node 1 is lost" in job.output(0)
    status = run.read_status()
    assert status["state"] in ("failed", "killed") and "node 1 is lost" in status["node_lost"]
    done = max(losses(run))
    assert done < STEPS  # the job ended with the node, not after training on without it

    again = Job(tmp_path, run.path, *ENGINES[engine])  # the same submission, as a retry or a person resubmits it
    assert again.wait() == [0, 0], again.output(0) + again.output(1)
    status = run.read_status()
    assert status["state"] == "completed" and status["step"] == STEPS
    assert run.read_config().data.path == str(again.data)  # the ranks read this job's mount, not the lost job's
    resumed = [e for e in run.events("status") if e.get("resumed_step")]
    assert resumed and resumed[-1]["resumed_step"] >= EVERY
    want = losses(reference(engine))
    got = losses(run)
    assert sorted(got) == list(range(1, STEPS + 1)) == sorted(want)
    assert [s for s in want if got[s] != want[s]] == [], (got, want)


def test_the_supervisor_in_the_job_restarts_every_node_after_a_crash(tmp_path, reference):
    shared = tmp_path / "shared"
    shared.mkdir()
    run = RunDir(shared / "run")
    # sync checkpoints: step 8's is published before step 9 starts, so the restart starts from it, not from 0
    job = Job(tmp_path, run.path, "--set", f"fault.kill_at_step={EVERY + 2}", "--set", "checkpoint.mode=sync",
              max_restarts=1)
    assert job.wait() == [0, 0], job.output(0) + job.output(1)
    assert run.read_status()["state"] == "completed"
    restarts = run.events("restart")
    assert len(restarts) == 1 and restarts[0]["from_step"] == EVERY and "on node 0" in restarts[0]["reason"]
    # node 1's ranks were not killed: they ended with their peer, and its supervisor started them again with node 0's
    assert "===== attempt 1" in (run.path / "train.node1.log").read_text()
    want, got = losses(reference("torch")), losses(run)
    assert [s for s in want if got[s] != want[s]] == []


def test_a_resubmitted_job_with_another_config_is_refused_naming_the_field(tmp_path, reference):
    run = reference("torch")
    before = run.config_path.read_bytes()
    job = Job(tmp_path, run.path, "--set", "optim.lr=0.01")
    assert job.wait() == [2, 2]
    for k in range(2):
        assert "optim.lr" in job.output(k) and "0.01" in job.output(k) and "0.003" in job.output(k)
    assert run.config_path.read_bytes() == before
    assert run.read_status()["state"] == "completed"


def test_run_storage_a_node_cannot_write_fails_the_preflight_naming_the_node_and_path(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    # Node 1's mount of the shared folder is not writable. Tests run as root here, which file modes do not stop;
    # sysfs refuses new files to everyone.
    unwritable = Path("/sys/trainbook-run")
    job = Job(tmp_path, shared / "run", node_runs={1: unwritable})
    assert job.wait() == [1, 1]
    for k in range(2):
        out = job.output(k)
        assert "pre-flight failed" in out and "node 1" in out and "/sys" in out and "not writable" in out, out
    assert not (shared / "run").exists()  # nothing started, nothing half-made
