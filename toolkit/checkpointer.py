"""Asynchronous checkpoints that block training for (almost) nothing.

The state a checkpoint holds changes only in the optimizer step. So at step k we take *references* to the
engine's state tensors (microseconds) and let a background thread copy them into reusable staging buffers
while step k+1 runs its forward and backward passes, which read the weights but do not write them. The
engine calls :meth:`Checkpointer.before_update` just before step k+1's optimizer step; only if the copy is
not finished by then does training wait. The same thread then writes the staged copy to a temporary folder,
fsyncs and hashes it, and rank 0 publishes it atomically (see toolkit.checkpoint_store).

Blocking time = taking the references + any wait in before_update. Reported per checkpoint with the persist
time and bytes, in events.jsonl and TensorBoard.
"""

from __future__ import annotations

import copy
import errno
import json
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

from toolkit.checkpoint_store import CheckpointStore, describe_files
from toolkit.fsio import atomic_write_text, fsync_path
from toolkit.rng import capture_rng

PEER_TIMEOUT_S = 600.0  # how long rank 0 waits for the other ranks' files before giving the checkpoint up
DONE_SUFFIX = ".done.json"
FAILED_SUFFIX = ".failed.json"


@dataclass
class _Job:
    step: int
    folder: Path
    files: dict  # relative name -> (leaves, spec): tensor leaves are live references until staged
    manifest_extra: dict
    started: float
    persist: bool = True  # False: only fill the staging buffers (see warm_up)
    blocked_s: float = 0.0
    staged: threading.Event = field(default_factory=threading.Event)
    update_seen: threading.Event = field(default_factory=threading.Event)  # blocking time is final
    done: threading.Event = field(default_factory=threading.Event)


def _capture(state) -> tuple[list, object]:
    """Flatten a state dict: tensors by reference (copied later), everything else copied now. A torch.Size is a
    leaf: flattened as a tuple it would come back a plain tuple, which DeepSpeed's zero_to_fp32 cannot read."""
    leaves, spec = tree_flatten(state, is_leaf=lambda x: isinstance(x, torch.Size))
    return [leaf if isinstance(leaf, torch.Tensor) else copy.deepcopy(leaf) for leaf in leaves], spec


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


class Checkpointer:
    def __init__(self, cfg, run_dir: Path, rank: int, world_size: int, engine, on_event=None, on_error=None):
        self.cfg = cfg.checkpoint
        self.full_cfg = cfg
        self.store = CheckpointStore(run_dir)
        self.rank, self.world_size = rank, world_size
        self.engine = engine
        self.on_event = on_event  # rank 0: called with each published checkpoint's figures
        self.on_error = on_error
        # ZeRO-3 gathers and frees parameters during forward, so its module state is not stable until the
        # next update: stage it before returning instead of behind the next forward/backward.
        self.stage_now = cfg.checkpoint.mode == "sync" or getattr(engine, "state_moves_in_forward", False)
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._pending: _Job | None = None
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._worker, name="checkpoint-writer", daemon=True)
        self._thread.start()
        self.last_saved_seconds = 0.0

    # --- called by the training loop --------------------------------------------------------------------

    def due(self, step: int, train_seconds: float, final: bool) -> bool:
        c = self.cfg
        if final:
            return c.at_end
        if c.every_steps and step % c.every_steps == 0:
            return True
        return bool(c.every_seconds) and train_seconds - self.last_saved_seconds >= c.every_seconds

    def save(self, step: int, trainer_state: dict) -> None:
        """Start checkpoint ``step``. Returns as soon as the state is referenced (async) or written (sync)."""
        t0 = time.perf_counter()
        if self._pending is not None:  # one checkpoint in flight at a time: its staging buffers are reused
            self._pending.done.wait()
        folder = self.store.tmp_folder(step)
        folder.mkdir(parents=True, exist_ok=True)
        states = self.engine.checkpoint_state(folder, is_writer=self.rank == 0)
        states[f"rank_{self.rank:05d}.pt"] = {"rng": capture_rng()}
        job = _Job(step=step, folder=folder, started=t0,
                   files={name: _capture(state) for name, state in states.items()},
                   manifest_extra={"trainer": trainer_state})
        self.last_saved_seconds = trainer_state.get("train_seconds", 0.0)
        self._pending = job
        if self.stage_now:
            self._stage(job)
        self._queue.put(job)
        job.blocked_s = time.perf_counter() - t0
        if self.stage_now and self.cfg.mode == "sync":
            job.update_seen.set()
            job.done.wait()  # sync mode: the whole write happens while training waits (the baseline)
            job.blocked_s = time.perf_counter() - t0

    def warm_up(self) -> None:
        """Allocate and touch the staging buffers in the background, once the optimizer state exists.

        Otherwise the first checkpoint pays for faulting in a second copy of the state (0.8 s for 1.1 GiB
        here) inside its staging window. The contents are overwritten by the first real checkpoint, so this
        copy may run while the optimizer changes the tensors. Engines whose state capture is itself a
        collective (DeepSpeed) skip it.
        """
        if not getattr(self.engine, "cheap_state_capture", False) or not (self.cfg.every_steps or self.cfg.every_seconds):
            return
        states = self.engine.checkpoint_state(None, is_writer=self.rank == 0)
        self._queue.put(_Job(step=-1, folder=Path(), started=time.perf_counter(), manifest_extra={},
                             files={name: _capture(state) for name, state in states.items()}, persist=False))

    def before_update(self) -> None:
        """Called by the engine right before the optimizer step: the staging copy must be complete."""
        job = self._pending
        if job is None or job.update_seen.is_set():
            return
        t0 = time.perf_counter()
        job.staged.wait()
        job.blocked_s += time.perf_counter() - t0
        job.update_seen.set()

    def close(self) -> None:
        """Wait for the checkpoint in flight (training is over, nothing more to overlap with)."""
        if self._pending is not None:
            self._pending.update_seen.set()
            self._pending.done.wait()
        self._queue.put(None)
        self._thread.join()

    # --- the background thread --------------------------------------------------------------------------

    def _stage(self, job: _Job) -> None:
        for name, (leaves, spec) in job.files.items():
            staged = []
            for i, leaf in enumerate(leaves):
                if isinstance(leaf, torch.Tensor):
                    key = (name, i)
                    buf = self._buffers.get(key)
                    if buf is None or buf.shape != leaf.shape or buf.dtype != leaf.dtype:
                        buf = self._buffers[key] = torch.empty_like(leaf, device="cpu")
                    _copy_without_omp(buf, leaf.detach())
                    staged.append(buf)
                else:
                    staged.append(leaf)
            job.files[name] = (staged, spec)
        job.staged.set()

    def _worker(self) -> None:
        while (job := self._queue.get()) is not None:
            try:
                if not job.staged.is_set():
                    self._stage(job)
                if job.persist:
                    self._persist(job)
            except Exception as exc:  # a full disk, a dead peer: report, drop this checkpoint, keep training
                job.staged.set()
                job.update_seen.set()
                self._abandon(job)
                if self.on_error:
                    self.on_error(job.step, f"{type(exc).__name__}: {exc}")
            finally:
                job.done.set()

    def _abandon(self, job: _Job) -> None:
        """Remove what a failed write left (rank 0), or tell rank 0 not to wait for us (other ranks)."""
        if self.rank == 0:
            shutil.rmtree(job.folder, ignore_errors=True)
        else:
            try:
                (job.folder / f"rank_{self.rank:05d}{FAILED_SUFFIX}").write_text("{}")
            except OSError:
                pass  # the disk is full: rank 0 gives up after PEER_TIMEOUT_S instead

    def _check_space(self, job: _Job, written_so_far: int = 0) -> None:
        """Fail with a plain ENOSPC message (torch.save's own on a full disk is an opaque zip-writer error)."""
        needed = sum(leaf.nbytes for leaves, _ in job.files.values() for leaf in leaves
                     if isinstance(leaf, torch.Tensor)) - written_so_far
        free = shutil.disk_usage(job.folder).free
        if needed > free:
            raise OSError(errno.ENOSPC, f"No space left on device: checkpoint step {job.step} needs "
                                        f"{needed / 1e6:.2f} MB more, {free / 1e6:.2f} MB free under {job.folder.parent}")

    def _persist(self, job: _Job) -> None:
        self._check_space(job)
        names, written = [], 0
        for name, (leaves, spec) in job.files.items():
            path = job.folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(path, "wb") as f:
                    torch.save(tree_unflatten(leaves, spec), f)
                    f.flush()
                    os.fsync(f.fileno())
            except (OSError, RuntimeError):
                self._check_space(job, written)  # a clearer reason when the disk filled up meanwhile
                raise
            written += path.stat().st_size
            names.append(name)
        described = describe_files(job.folder, names)
        atomic_write_text(job.folder / f"rank_{self.rank:05d}{DONE_SUFFIX}", json.dumps(described))
        if self.rank != 0:
            return
        files = self._gather_peer_files(job)
        manifest = {
            "step": job.step, "world_size": self.world_size, "engine": self.full_cfg.engine.name,
            "zero_stage": self.full_cfg.engine.zero_stage, "config_sha256": self.full_cfg.fingerprint(),
            "config": self.full_cfg.to_dict(), "created": time.time(), "files": files, **job.manifest_extra,
        }
        for done in job.folder.glob(f"*{DONE_SUFFIX}"):
            done.unlink()
        fsync_path(job.folder)
        published = self.store.publish(job.step, manifest)
        deleted = self.store.apply_retention(self.cfg.keep_last)
        job.update_seen.wait()  # the blocking figure is complete once the next update has passed
        if self.on_event:
            self.on_event(step=job.step, path=str(published), blocking_ms=1e3 * job.blocked_s,
                          persist_ms=1e3 * (time.perf_counter() - job.started),
                          bytes=sum(f["size"] for f in files.values()), deleted=deleted)

    def _gather_peer_files(self, job: _Job) -> dict:
        """Rank 0 waits for every rank's ``.done.json`` (written after its files are fsynced), then also lists
        files an engine wrote directly (DeepSpeed copies a recovery script into the folder)."""
        deadline = time.monotonic() + PEER_TIMEOUT_S
        expected = [job.folder / f"rank_{r:05d}{DONE_SUFFIX}" for r in range(self.world_size)]
        pause = 0.01
        while not all(p.exists() for p in expected):
            failed = sorted(p.name for p in job.folder.glob(f"*{FAILED_SUFFIX}"))
            if failed:
                raise RuntimeError(f"checkpoint step {job.step}: other ranks failed to write ({', '.join(failed)})")
            if time.monotonic() > deadline:
                missing = [p.name for p in expected if not p.exists()]
                raise TimeoutError(f"checkpoint step {job.step}: no files from {missing} after {PEER_TIMEOUT_S} s")
            time.sleep(pause)  # peers signal through the shared folder; no collective off the main thread
            pause = min(0.2, pause * 2)
        files = {}
        for p in expected:
            files.update(json.loads(p.read_text()))
        listed = set(files) | {p.name for p in expected}
        extra = [str(f.relative_to(job.folder)) for f in job.folder.rglob("*")
                 if f.is_file() and str(f.relative_to(job.folder)) not in listed]
        files.update(describe_files(job.folder, extra))
        return files
