"""Asynchronous checkpoints: stage a copy of the state, then write it in the background.

The state a checkpoint holds changes only in the optimizer step. Staging copies it into reusable buffers:
  - overlapped (the default on a GPU): at step k take *references* to the state tensors (microseconds) and
    let a background thread copy them (a device-to-host DMA) while step k+1 runs its forward and backward
    passes, which read the weights but do not write them. The engine calls :meth:`before_update` just before
    step k+1's optimizer step; only if the copy is not finished by then does training wait. On a GPU the copies
    run on a stream of their own, into pinned host buffers: on the training stream (the default one, which every
    thread shares) a device-to-host copy would queue behind step k+1's kernels and hold up the ones after it, and a
    copy into pageable memory is not a DMA but a staged, synchronous one. The copy stream first waits for an event
    recorded on the training stream when the checkpoint starts, so it reads step k's state, not an older one.
  - blocking (the default on CPU): copy now, with every core. On CPU a background copy runs on a core the
    step is using, so it is not free either: bench/bench_checkpoint.py measures both, and on this 2-core
    machine their training time lost is the same within noise (0.1-0.3 s for 1.1 GiB). Blocking is the
    default because its cost is bounded and predictable (one memory copy at full bandwidth, ~0.2 s here),
    where the overlapped copy's depends on how the OS schedules one more thread against the step's.
The background thread then writes the staged copy to a temporary folder, checksumming as it writes and
bypassing the page cache where it can (toolkit.checkpoint.checksum), fsyncs it, and rank 0 publishes it atomically
(toolkit.checkpoint.store). The thread runs at a lower scheduling priority than training.

What a checkpoint costs is not the time it blocks but the training time it loses, its blocking plus the
slowdown of the steps its background work overlaps: ``LostTimeLedger`` (toolkit.checkpoint.cost) measures it
from the step times the loop reports through :meth:`step_done`. Each checkpoint's event (events.jsonl,
TensorBoard) carries lost_ms, blocking_ms, persist_ms and bytes, once its window of steps has closed.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import os
import queue
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from toolkit.checkpoint.cost import CheckpointCost, LostTimeLedger
from toolkit.checkpoint.peers import PeerReports
from toolkit.checkpoint.store import CheckpointStore, describe_files, is_shard_folder
from toolkit.checkpoint.checksum import ChecksummedWriter, bounce_buffer
from toolkit.fsio import fsync_path
from toolkit.checkpoint.rng import capture_rng

WRITER_NICE = 10  # the writer thread's nice value (training runs at 0): it yields the cores to the step
PEER_TIMEOUT_S = 600.0  # how long rank 0 waits for the other ranks' files before giving the checkpoint up


@dataclass
class _Job:
    step: int
    folder: Path
    files: dict  # relative name -> (leaves, spec): tensor leaves are live references until staged
    manifest_extra: dict
    started: float
    persist: bool = True  # False: only fill the staging buffers (see fill_staging_buffers)
    written: dict | None = None  # rank 0, once published: path, persist_ms, bytes, deleted
    staged: threading.Event = field(default_factory=threading.Event)
    update_seen: threading.Event = field(default_factory=threading.Event)  # blocking time is final
    done: threading.Event = field(default_factory=threading.Event)
    waited_s: float = 0.0  # of its blocking, the wait for the previous checkpoint's write
    ready: object = None  # GPU, overlapped: a CUDA event on the training stream once the state to copy is computed


def _capture(state) -> tuple[list, object]:
    """Flatten a state dict: tensors by reference (copied later), everything else copied now. A torch.Size is a
    leaf: flattened as a tuple it would come back a plain tuple, which DeepSpeed's zero_to_fp32 cannot read."""
    leaves, spec = tree_flatten(state, is_leaf=lambda x: isinstance(x, torch.Size))
    return [leaf if isinstance(leaf, torch.Tensor) else copy.deepcopy(leaf) for leaf in leaves], spec


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank; any other tensor as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _like(original: torch.Tensor, staged: torch.Tensor) -> torch.Tensor:
    """The staged copy of ``original``'s local data, as the DTensor ``original`` is when it is one (its mesh,
    placements and global shape: what a sharded checkpoint records), with no collective."""
    if not hasattr(original, "to_local"):
        return staged
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        staged,
        original.device_mesh,
        original.placements,
        run_check=False,
        shape=original.shape,
        stride=original.stride(),
    )


def _copy_without_omp(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy a CPU tensor with numpy (one thread, GIL released), not torch's OpenMP-parallel copy_.

    An OpenMP parallel region started from this background thread creates a second thread team that then
    competes with the training thread's team for the same cores; measured here, training ran ~15% slower
    for the rest of the run after the first asynchronous checkpoint. GPU tensors use copy_ (a DMA).
    """
    if src.device.type != "cpu" or src.numel() == 0 or not src.is_contiguous():
        dst.copy_(src)
        return
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(src.element_size())
    if as_int is None or src.is_complex():
        dst.copy_(src)
        return
    np.copyto(dst.view(as_int).numpy(), src.view(as_int).numpy())  # bit-exact for every dtype, bf16 included


def _training_stream_mark(files: dict):
    """A CUDA event recorded now on the current (training) stream when any state tensor is on a GPU: the kernels
    that compute the state are queued, not done, when the training thread hands it over. None on a CPU."""
    device = next(
        (
            leaf.device
            for leaves, _ in files.values()
            for leaf in leaves
            if isinstance(leaf, torch.Tensor) and leaf.is_cuda
        ),
        None,
    )
    if device is None:
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def stages_in_loop(cfg, engine, device: torch.device) -> bool:
    """Copy the state while training waits (True) or behind the next forward/backward (False)?"""
    c = cfg.checkpoint
    if c.mode == "sync" or getattr(engine, "state_moves_in_forward", False):
        # ZeRO-3 gathers and frees parameters during forward: its state is stable only until the next update
        return True
    return c.stage == "blocking" or (c.stage == "auto" and device.type == "cpu")


def checkpoint_due(c, step: int, train_seconds: float, last_saved_seconds: float, final: bool) -> bool:
    """Checkpoint after ``step``? ``c`` is the checkpoint config. The final step follows checkpoint.at_end alone:
    at_end=false leaves it out even on an every_steps multiple (benchmarks rely on that to time steps only)."""
    if final:
        return c.at_end
    if c.every_steps and step % c.every_steps == 0:
        return True
    return bool(c.every_seconds) and train_seconds - last_saved_seconds >= c.every_seconds


@contextlib.contextmanager
def _without_zip_crc32():
    """torch.save computes a CRC32 per record that torch.load never checks (its zip reader is built without
    the check); our own checksum covers the whole file, so skip it: ~0.2 s of CPU per GiB. The option is
    process-wide; this thread is the one that saves in a training process."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


class Checkpointer:
    def __init__(
        self,
        cfg,
        run_dir: Path,
        rank: int,
        world_size: int,
        engine,
        on_event=None,
        on_error=None,
        device: torch.device = torch.device("cpu"),
    ):
        self.cfg = cfg.checkpoint
        self.full_cfg = cfg
        self.store = CheckpointStore(run_dir)
        self.rank, self.world_size = rank, world_size
        self.peers = PeerReports(rank, world_size)
        self.engine = engine
        self.on_event = on_event  # rank 0: called (from the training thread) with each checkpoint's figures
        self.on_error = on_error
        self.device = device
        self.stage_now = stages_in_loop(cfg, engine, device)
        self.ledger = LostTimeLedger()
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._copy_streams: dict[torch.device, object] = {}  # GPU: the background copies' own stream, per device
        self._pending: _Job | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._worker, name="checkpoint-writer", daemon=True)
        self._thread.start()
        self.last_saved_seconds = 0.0

    # --- called by the training loop --------------------------------------------------------------------

    def due(self, step: int, train_seconds: float, final: bool) -> bool:
        return checkpoint_due(self.cfg, step, train_seconds, self.last_saved_seconds, final)

    def save(self, step: int, trainer_state: dict) -> None:
        """Start checkpoint ``step``. Returns as soon as the state is referenced (async) or written (sync)."""
        t0 = time.perf_counter()
        previous = self._pending
        if previous is not None:  # one checkpoint in flight at a time: its staging buffers are reused
            previous.done.wait()
        waited_s = time.perf_counter() - t0 if previous is not None and previous.persist else 0.0
        closed = self.ledger.checkpoint_started(step)  # this checkpoint ends the previous one's window
        if closed is not None:
            self._report(previous, closed)
        folder = self.store.tmp_folder(step)
        folder.mkdir(parents=True, exist_ok=True)
        states = self.engine.checkpoint_state(folder, is_writer=self.rank == 0)
        states[f"rank_{self.rank:05d}.pt"] = {"rng": capture_rng()}
        job = _Job(
            step=step,
            folder=folder,
            started=t0,
            waited_s=waited_s,
            files={name: _capture(state) for name, state in states.items()},
            manifest_extra={"trainer": trainer_state},
        )
        self.last_saved_seconds = trainer_state.get("train_seconds", 0.0)
        self._pending = job
        if self.stage_now:
            self._stage(job, in_loop=True)
            job.update_seen.set()
        else:
            job.ready = _training_stream_mark(job.files)
        self._queue.put(job)
        if self.cfg.mode == "sync":
            job.done.wait()  # sync mode: the whole write happens while training waits (the baseline)
        self.ledger.add_blocking(time.perf_counter() - t0)

    def warm_up(self) -> None:
        """On a GPU, allocate the pinned staging buffers and copy into them in the background, once the optimizer
        state exists: otherwise the first checkpoint pays for pinning a second copy of the state inside its
        staging window, while the host's cores are mostly idle beside a GPU's training.

        Not on a CPU, where training keeps every core busy: there the first checkpoint's own copy faults the
        buffers in (with every core at checkpoint.stage=auto), and that cost is counted in its lost time. Filled
        by a background thread right after the first step, they would slow the steps it overlaps by at least as
        much, in no checkpoint's window: a cost no checkpoint reports. Engines whose state capture is itself a
        collective (DeepSpeed) skip it too.
        """
        periodic = self.cfg.every_steps or self.cfg.every_seconds
        if self.device.type == "cpu" or not getattr(self.engine, "cheap_state_capture", False) or not periodic:
            return
        self.fill_staging_buffers()

    def fill_staging_buffers(self) -> None:
        """Stage the engine's current state into the staging buffers in the background, as a checkpoint that is
        not written. The contents are overwritten by the first real checkpoint, so this copy may run while the
        optimizer changes the tensors."""
        states = self.engine.checkpoint_state(None, is_writer=self.rank == 0)
        # Pending like a checkpoint, so that the first real one waits for it instead of staging into the same
        # buffers at the same time.
        self._pending = _Job(
            step=-1,
            folder=Path(),
            started=time.perf_counter(),
            manifest_extra={},
            files={name: _capture(state) for name, state in states.items()},
            persist=False,
        )
        self._pending.update_seen.set()  # its copy may race the optimizer (it is overwritten): never wait for it
        if not self.stage_now:
            self._pending.ready = _training_stream_mark(self._pending.files)
        self._queue.put(self._pending)

    def before_update(self) -> None:
        """Called by the engine right before the optimizer step: the staging copy must be complete."""
        job = self._pending
        if job is None or job.update_seen.is_set():
            return
        t0 = time.perf_counter()
        job.staged.wait()
        self.ledger.add_blocking(time.perf_counter() - t0)
        job.update_seen.set()

    def step_done(self, seconds: float) -> None:
        """The loop finished a step in ``seconds`` (evaluation excluded, checkpoint blocking included)."""
        job = self._pending
        if job is not None and job.done.is_set():
            self.ledger.background_done()
        cost = self.ledger.step_done(seconds)
        if cost is not None:
            self._report(job, cost)

    def close(self) -> None:
        """Wait for the checkpoint in flight (training is over, nothing more to overlap with)."""
        if self._pending is not None:
            self._pending.update_seen.set()
            self._pending.done.wait()
            cost = self.ledger.finish()
            if cost is not None:
                self._report(self._pending, cost)
        self._queue.put(None)
        self._thread.join()

    def _report(self, job: _Job, cost: CheckpointCost) -> None:
        """A checkpoint's window has closed: publish its figures (rank 0, if it was published at all)."""
        if self.on_event is None or job is None or job.written is None or job.step != cost.step:
            return
        baseline = None if cost.baseline_step_s is None else round(1e3 * cost.baseline_step_s, 3)
        self.on_event(
            step=job.step,
            lost_ms=1e3 * cost.lost_s,
            blocking_ms=1e3 * cost.blocking_s,
            waited_ms=1e3 * job.waited_s,
            window_steps=cost.steps,
            baseline_step_ms=baseline,
            **job.written,
        )

    # --- the background thread --------------------------------------------------------------------------

    def _copy_stream(self, device: torch.device, job: _Job):
        """The side stream background copies from ``device`` run on, made to wait for the job's training-stream mark
        (once per job and device)."""
        stream = self._copy_streams.get(device)
        if stream is None:
            stream = self._copy_streams[device] = torch.cuda.Stream(device=device)
        if job.ready is not None:
            stream.wait_event(job.ready)
        return stream

    def _stage(self, job: _Job, in_loop: bool) -> None:
        streams: dict = {}  # GPU, overlapped: device -> its copy stream, used by this job
        reading: list = []  # the GPU tensors those streams read: alive until the copies are done
        for name, (leaves, spec) in job.files.items():
            staged = []
            for i, whole in enumerate(leaves):
                if isinstance(whole, torch.Tensor):
                    leaf = _local(whole)  # a DTensor's own shard: all this rank ever copies or writes
                    key = (name, i)
                    buf = self._buffers.get(key)
                    if buf is None or buf.shape != leaf.shape or buf.dtype != leaf.dtype:
                        # pinned for a GPU tensor: a real DMA, and one that can run asynchronously
                        buf = self._buffers[key] = torch.empty(
                            leaf.shape, dtype=leaf.dtype, device="cpu", pin_memory=leaf.is_cuda
                        )
                    if in_loop:
                        buf.copy_(leaf.detach())  # every core: the step is waiting anyway
                    elif leaf.is_cuda:
                        if leaf.device not in streams:
                            streams[leaf.device] = self._copy_stream(leaf.device, job)
                        with torch.cuda.stream(streams[leaf.device]):
                            buf.copy_(leaf.detach(), non_blocking=True)
                        reading.append(leaf)
                    else:
                        _copy_without_omp(buf, leaf.detach())
                    staged.append(_like(whole, buf))
                else:
                    staged.append(whole)
            job.files[name] = (staged, spec)
        for stream in streams.values():
            stream.synchronize()  # the host buffers hold the copies now
        del reading  # a temporary among them may be freed (and its memory reused by training) only now
        job.staged.set()

    def _worker(self) -> None:
        try:  # Linux: a thread's nice value is its own (setpriority on its thread id)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WRITER_NICE)
        except (AttributeError, OSError):
            pass
        self._bounce = None
        while (job := self._queue.get()) is not None:
            try:
                if not job.staged.is_set():
                    self._stage(job, in_loop=False)
                if job.persist:
                    self._persist(job)
            except Exception as exc:  # a full disk, a dead peer: report, drop this checkpoint, keep training
                job.staged.set()
                job.update_seen.set()
                if not job.persist:
                    continue  # a warm-up has no folder to clean up (its folder is Path(), the current directory)
                reason = f"{type(exc).__name__}: {exc}"
                self._abandon(job, reason)
                if self.on_error:
                    self.on_error(job.step, reason)
            finally:
                job.done.set()

    def _abandon(self, job: _Job, reason: str) -> None:
        """Remove what a failed write left (rank 0), or tell rank 0 not to wait for us (other ranks)."""
        if self.rank == 0:
            shutil.rmtree(job.folder, ignore_errors=True)
        else:
            try:
                self.peers.report_failure(job.step, reason)
            except Exception:  # the store is gone too: rank 0 gives up after PEER_TIMEOUT_S instead
                pass

    def _check_space(self, job: _Job, written_so_far: int = 0) -> None:
        """Fail with a plain ENOSPC message (torch.save's own on a full disk is an opaque zip-writer error)."""
        needed = (
            sum(
                _local(leaf).nbytes
                for leaves, _ in job.files.values()
                for leaf in leaves
                if isinstance(leaf, torch.Tensor)
            )
            - written_so_far
        )
        free = shutil.disk_usage(job.folder).free
        if needed > free:
            raise OSError(
                errno.ENOSPC,
                f"No space left on device: checkpoint step {job.step} needs "
                f"{needed / 1e6:.2f} MB more, {free / 1e6:.2f} MB free under "
                f"{job.folder.parent}",
            )

    def _persist(self, job: _Job) -> None:
        if self._bounce is None:
            self._bounce = bounce_buffer()  # here, so a failure is reported like any other failed write
        self._check_space(job)
        if self.full_cfg.fault.slow_write_ms:
            time.sleep(self.full_cfg.fault.slow_write_ms / 1e3)  # fault injection: a slow disk
        described, written = {}, 0
        for name, (leaves, spec) in job.files.items():
            if is_shard_folder(name):  # a rank's shards, in DCP's format: its files checksummed once written
                from toolkit.checkpoint import sharded

                names = [f"{name}/{file}" for file in sharded.write(job.folder / name, tree_unflatten(leaves, spec))]
                shards = describe_files(job.folder, names)
                described.update(shards)
                written += sum(entry["size"] for entry in shards.values())
                continue
            path = job.folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            writer = ChecksummedWriter(path, self._bounce)
            try:
                with _without_zip_crc32():
                    torch.save(tree_unflatten(leaves, spec), writer)
                described[name] = entry = writer.close()
            except (OSError, RuntimeError):
                self._check_space(job, written)  # a clearer reason when the disk filled up meanwhile
                raise
            finally:
                writer.abort()  # closes the file if close() was not reached; nothing if it was
            if path.stat().st_size != entry["size"]:
                raise OSError(
                    errno.EIO,
                    f"checkpoint step {job.step}: {name} has {path.stat().st_size} bytes on "
                    f"disk, {entry['size']} were written",
                )
            written += entry["size"]
        if self.rank != 0:
            self.peers.report(job.step, described)
            return
        files = self._gather_peer_files(job, described)
        manifest = {
            "step": job.step,
            "world_size": self.world_size,
            "tensor_parallel": self.full_cfg.engine.tensor_parallel,
            "pipeline_parallel": self.full_cfg.engine.pipeline_parallel,
            "engine": self.full_cfg.engine.name,
            "zero_stage": self.full_cfg.engine.zero_stage,
            "config_sha256": self.full_cfg.fingerprint(),
            "config": self.full_cfg.to_dict(),
            "created": time.time(),
            "files": files,
            **job.manifest_extra,
        }
        fsync_path(job.folder)
        published = self.store.publish(job.step, manifest)
        deleted = self.store.apply_retention(self.cfg.keep_last)
        job.written = {
            "path": str(published),
            "persist_ms": 1e3 * (time.perf_counter() - job.started),
            "bytes": sum(f["size"] for f in files.values()),
            "deleted": deleted,
        }

    def _gather_peer_files(self, job: _Job, own: dict) -> dict:
        """Rank 0: every rank's files (reported through the store once fsynced, toolkit.checkpoint.peers), then the
        files an engine wrote directly (DeepSpeed copies a recovery script into the folder)."""
        files = self.peers.gather(job.step, own, PEER_TIMEOUT_S)
        extra = [
            str(f.relative_to(job.folder))
            for f in job.folder.rglob("*")
            if f.is_file() and str(f.relative_to(job.folder)) not in files
        ]
        files.update(describe_files(job.folder, extra))
        return files
