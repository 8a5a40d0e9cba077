"""``python -m toolkit.runs.job RUN_DIR --config FILE --nnodes N [--max-restarts R] [--set FIELD=VALUE ...]``: one
node of a multi-node job (an Azure ML command job runs it once per node). ``--nnodes MIN:MAX``: an elastic job (below).

RUN_DIR is on storage every node sees (an Azure ML ``rw_mount`` output on a datastore, named per run, so a retried
or resubmitted job finds it and resumes). Each node reads NODE_RANK, MASTER_ADDR and MASTER_PORT from the environment
(Azure ML's PyTorch distribution sets them; ``--node-rank``, ``--master-addr`` and ``--master-port`` override them).

What a node does, in order:
  1. joins the others through a TCP store on node 0 at MASTER_PORT (toolkit.runs.nodes): nodes coordinate through
     it, never through files, because what one node writes to shared storage another may see late (blob mounts
     cache);
  2. pre-flight: checks this node (run storage writable, disk, /dev/shm, GPUs) and then an all-reduce across all
     nodes; any failure ends every node at once with the report as the job's error, instead of a hang later;
  3. node 0 creates the run directory, or finds it (a retry, a resubmission) and checks that the config is the one it
     was started with, naming the first field that differs;
  4. runs the supervisor: torchrun starts this node's ranks (rendezvous on MASTER_PORT + 1), and when training dies
     every node's supervisor agrees, through the store, to restart from the last checkpoint (up to --max-restarts)
     or to end.

An elastic job (``--nnodes MIN:MAX``, data.sampling=epochs) starts training once MIN nodes are there and takes in more
up to MAX, or goes on without a lost one, as low-priority capacity comes and goes: torchrun's elastic agent on each
node (toolkit.runs.launchers.elastic_command) meets the others in a rendezvous on node 0, and at each change of nodes
stops the ranks (they checkpoint) and starts them again at the new world size, resuming from the checkpoint with the
data position kept (toolkit.data.epochs). Its nodes do not wait for one another, so the steps above are each node's
own: the storage check, node 0 preparing the run directory (a later node checks the config against it), then the
agent in place of the supervisor (it restarts failed ranks itself).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import socket
import sys
import time
import typing
from pathlib import Path

from toolkit.errors import not_allowed
from toolkit.runs.nodes import NodeGroup, NodeLost, NodeSpec
from toolkit.startup import command_process

PROBE_BYTES = 1 << 20  # written and fsynced to the run storage by every node: proves it writable, timed
JOIN_TIMEOUT_S = 600.0  # nodes of one job start minutes apart (image pulls, mounts)
LOST_AFTER_S = 60.0  # a node whose heartbeat has not moved for this long is lost


def command_line(
    run_dir: str,
    *,
    config: str,
    nnodes: int | str,
    max_restarts: int,
    gpus_per_node: int = 0,
    sets: dict[str, str] | None = None,
    tensorboard_link: str = "",
    python: str = "python",
) -> str:
    """The command an Azure ML job runs once per node (PyTorchDistribution, process_count_per_instance=1); ``nnodes``:
    N, or 'MIN:MAX' for an elastic job.
    Values may be Azure ML expressions such as ``${{outputs.runs}}/demo`` (left unquoted: Azure ML substitutes them
    before the shell runs)."""

    def arg(value: str) -> str:
        return value if "${{" in value else shlex.quote(value)

    words = [
        python,
        "-m",
        "toolkit.runs.job",
        arg(run_dir),
        "--config",
        arg(config),
        "--nnodes",
        str(nnodes),
        "--max-restarts",
        str(max_restarts),
    ]
    if gpus_per_node:
        words += ["--gpus-per-node", str(gpus_per_node)]
    if tensorboard_link:
        words += ["--tensorboard-link", shlex.quote(tensorboard_link)]
    for field_name, value in (sets or {}).items():
        words += ["--set", f"{field_name}={value}" if "${{" in value else shlex.quote(f"{field_name}={value}")]
    return " ".join(words)


# --- 2. pre-flight ---------------------------------------------------------------------------------------------


def _storage_check(run_dir: Path, node: int, nnodes: int) -> tuple[str, str]:
    """Write, fsync, read back and remove a file beside the run directory: the write a checkpoint makes. Several
    nodes need the folder to be there already (their shared mount): one made here would be this node's alone."""
    parent = run_dir.parent
    if nnodes == 1:
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return "fail", f"run storage {parent} cannot be created on node {node}: {exc.strerror or exc}"
    if not parent.is_dir():
        return "fail", f"run storage {parent} does not exist on node {node} (is the output mounted?)"
    probe = parent / f".trainbook-preflight-node{node}-{os.getpid()}"
    block = os.urandom(PROBE_BYTES)
    try:
        t0 = time.perf_counter()
        with open(probe, "xb") as f:
            f.write(block)
            f.flush()
            os.fsync(f.fileno())
        seconds = time.perf_counter() - t0
        if probe.read_bytes() != block:
            return "fail", f"run storage {parent} on node {node} read back different bytes than were written"
    except OSError as exc:
        return "fail", f"run storage {parent} is not writable from node {node}: {exc.strerror or exc}"
    finally:
        probe.unlink(missing_ok=True)
    from toolkit.machine import DISK_WARN_FREE_GIB

    free_gib = shutil.disk_usage(parent).free / 2**30
    summary = f"{parent}: writable ({PROBE_BYTES / seconds / 1e6:,.0f} MB/s write+fsync), {free_gib:,.1f} GiB free"
    if free_gib < DISK_WARN_FREE_GIB:
        return "warn", summary + f": under {DISK_WARN_FREE_GIB:g} GiB, checkpoints will fill it"
    return "pass", summary


def _gpu_check(gpus: int, node: int) -> tuple[str, str]:
    import torch

    seen = torch.cuda.device_count()
    if seen < gpus:
        return "fail", f"node {node} sees {seen} GPU(s), the job runs {gpus} per node (driver, CUDA_VISIBLE_DEVICES?)"
    return "pass", f"{seen} GPU(s) visible" + (f", {torch.cuda.get_device_name(0)}" if seen else "")


def _shm_check() -> tuple[str, str]:
    from toolkit.machine import shm, shm_verdict

    return shm_verdict(shm())


def node_checks(spec: NodeSpec, run_dir: Path, gpus: int) -> list[tuple[str, str, str]]:
    """This node's own checks: (name, pass/warn/fail, what was found)."""
    checks = [("run storage", *_storage_check(run_dir, spec.rank, spec.count)), ("shm", *_shm_check())]
    if gpus:
        checks.append(("gpus", *_gpu_check(gpus, spec.rank)))
    return checks


def all_reduce_check(group: NodeGroup, gpus: int) -> tuple[str, str]:
    """One all-reduce across every node, on the backend training will use (NCCL on GPUs): the path that hangs when
    a firewall, an interface name or an InfiniBand setting is wrong, tried here with a timeout."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    backend = "nccl" if gpus else "gloo"
    device = torch.device("cuda", 0) if gpus else torch.device("cpu")
    t0 = time.perf_counter()
    try:
        dist.init_process_group(
            backend,
            store=dist.PrefixStore("trainbook/preflight", group.store),
            rank=group.spec.rank,
            world_size=group.spec.count,
            timeout=timedelta(seconds=group.lost_after_s),
        )
        tensor = torch.ones(2**20, device=device)  # 4 MiB
        dist.all_reduce(tensor)
        if device.type == "cuda":
            torch.cuda.synchronize()
        ok = bool((tensor == group.spec.count).all())
    except Exception as exc:  # noqa: BLE001 - whatever the backend raises is the report
        return "fail", f"{backend} all-reduce across {group.spec.count} nodes failed on node {group.spec.rank}: {exc}"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if not ok:
        return "fail", f"{backend} all-reduce across {group.spec.count} nodes returned wrong sums"
    return "pass", f"{backend} all-reduce of 4 MiB across {group.spec.count} nodes in {time.perf_counter() - t0:.2f} s"


def preflight(group: NodeGroup, run_dir: Path, gpus: int) -> list[dict]:
    """Every node's checks, gathered by node 0 and given back to all; then the cross-node all-reduce. Raises
    PreflightError on any node's failure, on every node, with the whole report."""
    mine = {
        "node": group.spec.rank,
        "host": socket.gethostname(),
        "checks": [list(c) for c in node_checks(group.spec, run_dir, gpus)],
    }
    reports = group.exchange("preflight", mine)
    if not _failures(reports):
        status, summary = all_reduce_check(group, gpus)
        mine["checks"].append(["all-reduce", status, summary])
        reports = group.exchange("preflight-collective", mine)
    print(report_table(reports), file=sys.stderr, flush=True)
    failures = _failures(reports)
    if failures:
        raise PreflightError("pre-flight failed: " + "; ".join(failures))
    return reports


def _failures(reports: list[dict]) -> list[str]:
    return [
        f"node {r['node']} ({r['host']}) {name}: {summary}"
        for r in reports
        for name, status, summary in r["checks"]
        if status == "fail"
    ]


def report_table(reports: list[dict]) -> str:
    lines = ["pre-flight:"]
    for r in reports:
        lines += [
            f"  node {r['node']} {r['host']:<16} {name:<12} {status:<5} {summary}"
            for name, status, summary in r["checks"]
        ]
    return "\n".join(lines)


class PreflightError(RuntimeError):
    """A node cannot run the job; the message names the node, the check and the path."""


# --- 3. the run directory --------------------------------------------------------------------------------------


def prepare_run(run_dir: Path, config_file: str, overrides: list[str], nnodes: int, cuda: bool):
    """Node 0: create the run directory from the config, or check a retried or resubmitted job's config against the
    one the run was started with (any difference is refused, naming the first field: a run is one config; only where
    its inputs are mounted may move, toolkit.checkpoint.store.LOCATION_FIELDS). Returns the RunDir."""
    from toolkit import config as config_mod
    from toolkit.checkpoint.store import LOCATION_FIELDS, config_differences
    from toolkit import status as run_status
    from toolkit.runs.data_pin import pin_data_asset
    from toolkit.rundir import RunDir
    from toolkit.train.engines import check_engine
    from toolkit.train.models.preflight import check_model, pin_model

    cfg = pin_model(pin_data_asset(config_mod.load(config_file, overrides)))
    check_model(cfg)
    # this node's devices and the job's world
    check_engine(cfg, world=nnodes * cfg.engine.nproc, cuda=cuda, per_node=cfg.engine.nproc)
    run = RunDir(run_dir)
    if not run.config_path.exists():
        return RunDir.create(run_dir, cfg)
    stored = run.read_config()
    differences = config_differences(stored.to_dict(), cfg.to_dict(), LOCATION_FIELDS)
    if differences:
        key, old, new = differences[0]
        raise config_mod.ConfigError(
            not_allowed(
                key,
                new,
                f"{old!r}, the value the stored run in {run_dir} was started with (resubmit the same config to "
                "resume it, or give the job a new run name to start another run)",
                problem=f"differs from the stored run's ({len(differences)} field(s) differ; the first is named)",
            )
        )
    if cfg.fingerprint() != stored.fingerprint():  # only where the inputs are mounted moved: the ranks read them there
        run.write_config(cfg)
    run_status.transition(run, "retry", resumed=time.time())
    return run


def _link_tensorboard(link: Path, tb_dir: Path) -> None:
    """``link`` -> the run's tb/, made here and only here: whatever else is at ``link`` is left alone."""
    if not link.exists() and not link.is_symlink():
        tb_dir.mkdir(parents=True, exist_ok=True)
        link.symlink_to(tb_dir, target_is_directory=True)


# --- the entry ---------------------------------------------------------------------------------------------------


MAX_NODES = 10_000  # far above any cluster's job (Azure ML's largest run thousands of GPUs, 8 a node)


class NodeRange(typing.NamedTuple):
    low: int
    high: int
    elastic: bool
    """Given as MIN:MAX: an elastic job."""

    def counts_to_check(self) -> list[int]:
        """The node counts whose world sizes prove every count from low to high, so that a range is checked in
        constant time: both ends (DeepSpeed's batch arithmetic depends on the world), and where the range holds two
        counts c and c+1, one node, since a size divides both c x nproc and (c+1) x nproc only if it divides
        nproc itself (the divisibility of engine.tensor_parallel and engine.pipeline_parallel)."""
        return sorted({self.low, self.high} | ({1} if self.high > self.low else set()))


def node_range(text: str) -> NodeRange:
    """--nnodes: 'N' (a fixed job) or 'MIN:MAX' (an elastic one)."""
    low, colon, high = text.partition(":")
    try:
        nodes = NodeRange(int(low), int(high or low), bool(colon))
    except ValueError:
        nodes = NodeRange(0, 0, False)
    if not 1 <= nodes.low <= nodes.high <= MAX_NODES:
        raise argparse.ArgumentTypeError(
            not_allowed("--nnodes", text, f"N, or MIN:MAX with 1 <= MIN <= MAX, up to {MAX_NODES:,} nodes")
        )
    return nodes


def join_elastic_run(run_dir: Path, config_file: str, overrides: list[str], nodes: NodeRange, node: int):
    """An elastic job's run directory: node 0 prepares it as a fixed job's node 0 does (prepare_run, for every world
    size the nodes may make); a later node checks the config of the run it joins. Refuses random sampling, whose
    data position would not survive a change of world size. Returns the RunDir, or None when the run is complete
    (nothing to join)."""
    from toolkit import config as config_mod
    from toolkit.rundir import RunDir
    from toolkit.train.engines import check_engine

    cfg = config_mod.load(config_file, overrides)
    if cfg.data.sampling != "epochs":
        raise config_mod.ConfigError(
            not_allowed(
                "data.sampling",
                cfg.data.sampling,
                "'epochs' in an elastic job (--nnodes MIN:MAX)",
                problem="draws each step's rows by step and replica, so a change of nodes would repeat or skip data",
            )
        )
    for count in nodes.counts_to_check():
        check_engine(cfg, world=count * cfg.engine.nproc, cuda=None, per_node=cfg.engine.nproc)
    run = RunDir(run_dir)
    if run.config_path.exists() and run.read_status().get("state") == "completed":
        return None
    if node == 0:
        return prepare_run(run_dir, config_file, overrides, nnodes=nodes.high, cuda=False)
    return run


def run_elastic(spec: NodeSpec, nodes: NodeRange, args, run_dir: Path) -> int:
    """One node of an elastic job: its storage check, the run directory, then torchrun's elastic agent to the end."""
    import subprocess

    from toolkit import config as config_mod
    from toolkit.runs.launchers import elastic_command

    status, summary = _storage_check(run_dir, spec.rank, spec.count)
    print(
        f"[job] node {spec.rank} (elastic, {nodes.low} to {nodes.high} nodes): {summary}", file=sys.stderr, flush=True
    )
    if status == "fail":
        return 1
    try:
        run = join_elastic_run(run_dir, args.config, args.set, nodes, spec.rank)
    except (ValueError, OSError) as exc:
        print(f"[job] node {spec.rank}: {exc}", file=sys.stderr, flush=True)
        return 2
    if run is None:
        print(f"[job] node {spec.rank}: the run in {run_dir} is complete: nothing to join", file=sys.stderr, flush=True)
        return 0
    cfg = config_mod.load(args.config, args.set)
    command, env = elastic_command(cfg, run_dir, spec, nodes.low, args.max_restarts)
    return subprocess.run(command, env={**os.environ, **env}, check=False).returncode


def _spec(args) -> NodeSpec:
    def pick(flag, env: str, default: str | None) -> str:
        value = flag if flag is not None else os.environ.get(env, default)
        if value is None:
            raise SystemExit(f"{env} is not set: pass --{env.lower().replace('_', '-')} or run under a launcher")
        return str(value)

    spec = NodeSpec(
        rank=int(pick(args.node_rank, "NODE_RANK", "0")),
        count=args.nnodes.high,
        addr=pick(args.master_addr, "MASTER_ADDR", "127.0.0.1"),
        port=int(pick(args.master_port, "MASTER_PORT", None)),
    )
    if not 0 <= spec.rank < spec.count:
        raise SystemExit(not_allowed("NODE_RANK", spec.rank, f"0 to {spec.count - 1} (--nnodes {spec.count})"))
    return spec


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m toolkit.runs.job", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir")
    parser.add_argument("--config", required=True, help="the run's config (read on node 0 only)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument("--nnodes", type=node_range, required=True, help="N, or MIN:MAX for an elastic job")
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--gpus-per-node", type=int, default=0, help="0: a CPU job")
    parser.add_argument("--node-rank", type=int)
    parser.add_argument("--master-addr")
    parser.add_argument("--master-port", type=int)
    parser.add_argument(
        "--tensorboard-link",
        default="",
        help="node 0 links this name in the working directory to RUN_DIR/tb (Azure ML's TensorBoard "
        "service reads a folder of the working directory; a mount's place is not known before)",
    )
    parser.add_argument(
        "--lost-after",
        type=float,
        default=LOST_AFTER_S,
        help="seconds without a heartbeat before a node counts as lost",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    command_process()  # its pre-flight loads torch (toolkit.startup)
    if args.max_restarts < 0:
        raise SystemExit(not_allowed("--max-restarts", args.max_restarts, "0 or more"))
    spec = _spec(args)
    run_dir = Path(args.run_dir).absolute()
    if args.nnodes.elastic:
        return run_elastic(spec, args.nnodes, args, run_dir)
    try:
        with NodeGroup(spec, join_timeout_s=JOIN_TIMEOUT_S, lost_after_s=args.lost_after) as group:
            preflight(group, run_dir, args.gpus_per_node)
            if spec.rank == 0:
                error = ""
                try:
                    prepare_run(run_dir, args.config, args.set, nnodes=spec.count, cuda=args.gpus_per_node > 0)
                except (ValueError, OSError) as exc:  # ConfigError, ModelImportError, DataAssetError... name a field
                    error = str(exc)
                if not error and args.tensorboard_link:
                    _link_tensorboard(Path(args.tensorboard_link), run_dir / "tb")
                group.exchange("run-dir", {"error": error})
            else:
                error = next((r["error"] for r in group.exchange("run-dir", {}) if r.get("error")), "")
            if error:
                print(f"[job] node {spec.rank}: {error}", file=sys.stderr, flush=True)
                return 2
            from toolkit.rundir import RunDir
            from toolkit.runs.supervisor import Supervisor

            return Supervisor(RunDir(run_dir), args.max_restarts, nodes=group).run_to_end()
    except (PreflightError, NodeLost) as exc:
        print(f"[job] node {spec.rank}: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
