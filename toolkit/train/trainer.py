"""The training loop. Read it top to bottom: build, then ``train()``; everything else is a component.

    trainer = Trainer(RunDir("runs/demo"))
    trainer.train()

It runs inside the training process (started by toolkit.runs.launch, once per rank), never in a notebook kernel.
Rank 0 writes the run directory: events.jsonl, status.json, lineage.json, tb/ and profile/.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import torch

from toolkit.data import corpus as data_mod
from toolkit.data.batch import SAMPLE_IDS
from toolkit.data.epochs import SampleRecord
from toolkit.checkpoint.store import CheckpointStore, check_compatible, step_name
from toolkit.checkpoint.checkpointer import Checkpointer
from toolkit.train import allocator, distributed
from toolkit.train.engines import build_engine
from toolkit.train.engines.accumulation import micro_batch_weights, weighted_mean
from toolkit.train.compilation import CompileWatch
from toolkit.train.flops import mfu_devices, mfu_peak
from toolkit.catalogue.lineage import collect_lineage
from toolkit.train.metrics import MetricsSink
from toolkit.train.models import flops_per_item, prepare_model
from toolkit.checkpoint.rng import restore_rng
from toolkit.train.faults import FaultPlan, attempt_number
from toolkit.train.log_window import LogWindow
from toolkit.train.objectives import build_objective
from toolkit.train.watchdog import HangWatchdog, NonFiniteGuard, NonFiniteLossError
from toolkit import safe_load
from toolkit import status as run_status
from toolkit.status import ELASTIC_ENV
from toolkit.events import CheckpointInvalidEvent
from toolkit.rundir import RunDir
from toolkit.fsio import atomic_write_text
from toolkit.machine import usable_cores


def _held_numel(param) -> int:
    """The elements of a parameter this rank holds: a DTensor's local slice, a ZeRO-3 parameter's partition."""
    if hasattr(param, "to_local"):
        return param.to_local().numel()
    if hasattr(param, "ds_tensor"):
        return param.ds_tensor.numel()
    return param.numel()


def _print_checkpoint_error(step: int, message: str) -> None:
    print(f"checkpoint at step {step} failed: {message}", file=sys.stderr)


def train_step(
    engine, micro_batches: list[dict], weights: list[float] | None = None, before_update=None
) -> torch.Tensor:
    """One optimizer step, whatever the engine: forward and backward over each micro-batch (train.grad_accum_steps of
    them: their gradients add up, each loss weighted by its share of the step's targets, ``weights``;
    toolkit.train.engines.accumulation), then the update. ``before_update`` runs when the gradients are whole and the
    weights still the previous step's (a checkpoint's staging copy must be done by then). Returns the step's loss."""
    n = len(micro_batches)
    if engine.pipelined:  # stages over ranks: the schedule interleaves every micro-batch's forward and backward
        loss = engine.forward_backward_step(micro_batches, weights)
    else:
        losses = [
            engine.forward_backward(batch, None if weights is None else weights[i], n, last=i == n - 1)
            for i, batch in enumerate(micro_batches)
        ]
        loss = weighted_mean(losses, weights)
    engine.optimizer_step(before_update)  # clip, check (watchdog.nonfinite), update or leave it out, clear gradients
    return loss


def lr_at(step: int, optim, max_steps: int) -> float:
    """Linear warmup to optim.lr, then cosine or linear decay to optim.min_lr at max_steps (or constant)."""
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    if optim.schedule == "constant":
        return optim.lr
    progress = min(1.0, (step - optim.warmup_steps) / max(1, max_steps - optim.warmup_steps))
    if optim.schedule == "linear":
        return optim.lr - (optim.lr - optim.min_lr) * progress
    return optim.min_lr + 0.5 * (optim.lr - optim.min_lr) * (1 + math.cos(math.pi * progress))


def time_budget_horizon(step: int, seconds: float, train) -> int:
    """Project the step at which train.max_seconds runs out from the pace so far (``step`` steps in ``seconds``),
    so the cosine decay ends when the time budget does (a schedule cut off half-way leaves the loss well above
    what the budget allows). e.g. 300 steps in 45 s with a 180 s budget -> the schedule ends at step 1,200.
    Never before train.min_steps (the floor a slow machine still trains to), never past train.max_steps, never at or
    before the step just taken."""
    projected = max(round(step * train.max_seconds / seconds), train.min_steps)
    return max(step + 1, min(train.max_steps, projected))


def peak_memory_mb(device) -> float:
    """This process's peak memory so far: the allocator's high-water mark on a GPU, the resident set's on a CPU
    (Linux reports ru_maxrss in KiB): what toolkit.resources.memory_model predicts."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def default_threads(cfg) -> int:
    """Share the cores this process may use between the ranks on this node, so two ranks do not fight over one
    core."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    return cfg.train.threads or max(1, usable_cores() // local_world)


class Trainer:
    def __init__(self, run: RunDir):
        self.stop_requested = False
        # an elastic job's ranks: torchrun's SIGTERM is a change of nodes, after which they start again
        self.elastic = os.environ.get(ELASTIC_ENV) == "1"
        self.run = run
        self.cfg = cfg = run.read_config()
        threads = default_threads(cfg)
        if threads != torch.get_num_threads():
            # Only when it changes anything: set_num_threads also turns off MKL's dynamic choice of threads per
            # call, which small matmuls need (a 128-wide Llama ran ~3% slower with the same 2 threads set again).
            torch.set_num_threads(threads)
        # Before the model and the data exist, so that their memory, too, is kept rather than handed back
        self.allocator = allocator.keep_freed_memory()
        self.topo = distributed.setup(cfg.engine)
        if self.topo.device.type == "cuda":  # engine.tf32; on a CPU "high" would let oneDNN use bf16 too: left alone
            torch.set_float32_matmul_precision("high" if cfg.engine.tf32 else "highest")
            torch.backends.cudnn.allow_tf32 = cfg.engine.tf32
        # The MFU denominator, recorded with the run (the cache may hold another figure later): a GPU's datasheet
        # peak, or a measurement, which on a GPU must come before the model is there (toolkit.train.flops.mfu_peak)
        self.peak = mfu_peak(self.topo.device, cfg.engine.precision)
        self.peak_flops = self.peak["flops"]
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", self.topo.world_size))
        self.mfu_denominator = self.peak_flops * mfu_devices(self.topo.world_size, local_world, self.topo.device.type)
        # A stop asked for (`trainbook stop`, Ctrl-C, a stop button: the supervisor's stop request in the run
        # directory; a SIGTERM to this process, as a preempted node gets) means a checkpoint, then the end: noted
        # here, acted on between two steps (see train()). Only from here: a rank still in the rendezvous has nothing
        # to save, and must die of the SIGTERM its launcher sends when another rank failed.
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            signal.signal(signal.SIGTERM, self._on_stop_signal)

        store = CheckpointStore(run.path)
        if self.topo.is_main:
            store.discard_partial()  # writes that a crash interrupted; nothing is in flight at start-up
        # Found before the model is built: a resumed run takes its weights from the checkpoint, not init_from
        self.resume_point, self.unusable = store.find_resume_point()
        model, self.pretrained = prepare_model(cfg, pretrained=self.resume_point is None)
        self.n_params = sum(p.numel() for p in model.parameters())
        self.n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        # train.objective: the model's own loss, or DPO (whose reference may be a second model, built here)
        self.objective = build_objective(cfg, model, self.topo.device)
        flops, self.flops_source = flops_per_item(model, cfg.model)
        self.flops_per_item = self.objective.flops_per_token(flops)
        self.engine = build_engine(model, cfg, self.topo, loss_fn=self.objective)
        if self.topo.is_main and self.engine.deepspeed_config is not None:  # what DeepSpeed got, for people to read
            atomic_write_text(run.deepspeed_config_path, json.dumps(self.engine.deepspeed_config, indent=1) + "\n")
        # Dropout differs per replica, as it should; the ranks of one tensor-parallel group draw the same masks, as
        # the activations they hold whole must stay alike on each of them
        torch.manual_seed(cfg.train.seed + 1 + self.topo.dp_rank)

        self.corpus = data_mod.load_corpus(cfg)
        # Items (tokens for text, samples for tables) that all replicas together consume per optimizer step.
        # e.g. 8 sequences * 4 micro-steps * 128 tokens * 2 replicas = 8,192 tokens per step (DPO: two rows a pair);
        # a tensor-parallel group is one replica, its ranks sharing each batch
        per_micro_step = cfg.train.batch_size * (cfg.model.block_size if self.corpus.bytes_per_item else 1)
        per_micro_step *= self.objective.rows_per_item
        self.items_per_step = per_micro_step * cfg.train.grad_accum_steps * self.topo.dp_size
        self.step = 0  # optimizer steps completed
        # data.sampling=epochs: samples all replicas have taken (toolkit.data.epochs), checkpointed with the step
        self.samples_seen = 0
        self.samples_per_step = cfg.train.batch_size * cfg.train.grad_accum_steps * self.topo.dp_size
        # The step at which the LR schedule ends: max_steps, or sooner when train.max_seconds will stop the run.
        self.horizon = cfg.train.max_steps
        self.train_seconds = 0.0  # training time so far, agreed between ranks (evaluation excluded)
        self.sink = MetricsSink(run, cfg) if self.topo.is_main else None
        self.checkpointer = Checkpointer(
            cfg,
            run.path,
            self.topo.rank,
            self.topo.world_size,
            self.engine,
            device=self.topo.device,
            on_event=self.sink.checkpoint if self.sink else None,
            on_error=self.sink.checkpoint_error if self.sink else _print_checkpoint_error,
        )
        self.saved_step: int | None = None  # the step of the last checkpoint started (or resumed from)
        self.guard = NonFiniteGuard(cfg.watchdog)
        self.compile_watch = CompileWatch() if cfg.train.compile else None
        self.attempt = attempt_number()  # 0 first, +1 per restart or resume
        self.faults = FaultPlan(cfg.fault, self.topo.rank, self.topo.world_size, self.attempt)
        self.watchdog = HangWatchdog(
            cfg, run, self.topo.rank, self.topo.world_size, self.attempt, events=self.sink.events if self.sink else None
        )
        self.resumed_from = self._resume()
        # data.record_samples: the first rank of each replica writes what its steps trained on
        first_of_replica = self.topo.rank < self.topo.dp_size * self.topo.tensor_parallel
        first_of_replica = first_of_replica and self.topo.rank % self.topo.tensor_parallel == 0
        self.sample_record = None
        if cfg.data.record_samples:
            # the processes' start, the same on every rank: tells a step trained again after a restart from its first
            (started,) = distributed.all_reduce_sum([time.time() if self.topo.is_main else 0.0], self.topo.device)
            if first_of_replica:
                self.sample_record = SampleRecord(run.path, self.topo.dp_rank, started)

    # --- the loop -------------------------------------------------------------------------------------------

    def train(self) -> dict:
        """Steps until max_steps (or the time budget, or a stop): each a train_step (forward, backward, update), then
        what falls due after it, each component keeping its own cadence: the log line, evaluation, the checkpoint."""
        cfg, engine = self.cfg, self.engine
        self._announce_start()
        profiler = self._profiler()
        batches = self._batches()
        self.watchdog.start(self.step)
        if cfg.train.eval_at_start and self.step == 0:
            self._evaluate()  # the starting point, e.g. pretrained weights on the fine-tuning data
        engine.train()
        window = LogWindow(self.topo.device, self.topo.rank, self.topo.world_size, self.train_seconds)
        first_step, last_val, stopping = self.step + 1, None, False
        while self.step < cfg.train.max_steps:
            t0 = time.perf_counter()
            batch = self._next_batch(batches)
            window.step_started(data_wait=time.perf_counter() - t0)
            self.faults.before_step()
            engine.set_lr(lr_at(self.step, cfg.optim, self.horizon))
            micro_batches = self._micro_batches(batch)
            on_device, weights = [self._to_device(b) for b in micro_batches], micro_batch_weights(micro_batches)
            with self.faults.nan_loss(self.step + 1, engine):
                loss = train_step(engine, on_device, weights, before_update=self.checkpointer.before_update)
            if action := self.guard.judge(engine.update_skipped):
                self._nonfinite(loss, action, window.agreed_seconds)  # raises when the run stops here
            else:
                window.add_loss(loss)
            if profiler:
                profiler.step()
            self.step += 1
            self.samples_seen += self.samples_per_step
            if self.step == first_step:
                self.checkpointer.warm_up()  # the optimizer state exists now (on a GPU: pin the staging buffers)
            last = self.step == cfg.train.max_steps

            # One process stops at the step it is in; several agree on the step at the next log interval, as the
            # request reaches each rank at a different step and they must all save the same one.
            stopping = stopping or (self.topo.world_size == 1 and not last and self._stop_asked())
            logged = self.step % cfg.train.log_every == 0 or last or stopping
            log_start = time.perf_counter()
            if logged:
                stopping, last = self._log(window, last)
            # Logging happens every log_every steps, checkpoints usually on one of them: keep it out of the step
            # time that checkpoint costs are measured from, as evaluation is.
            log_seconds = time.perf_counter() - log_start
            if stopping:  # checkpointed as a final step is (checkpoint.at_end), without the evaluation
                if self.checkpointer.due(self.step, window.agreed_seconds, final=True):
                    self._save(window.agreed_seconds)
                break
            eval_seconds = 0.0
            if last or self.step % cfg.train.eval_every == 0:
                last_val, eval_seconds = self._timed_evaluate()
                window.exclude(eval_seconds)  # evaluation is not training time
            if self.checkpointer.due(self.step, window.agreed_seconds, final=last):
                self._save(window.agreed_seconds)
                self.faults.checkpoint_saved()
            # the step's time, checkpoint blocking included: what the checkpoint's cost is measured from
            self.checkpointer.step_done(time.perf_counter() - t0 - eval_seconds - log_seconds)
            self._step_done()
            if logged:
                window.reset()
            if last:
                break
        return self._finish(profiler, window.agreed_seconds, last_val, stopping)

    # --- what the loop calls ------------------------------------------------------------------------------

    def _announce_start(self) -> None:
        """Rank 0: lineage.json and the run's `running` event, with everything MFU and a resume are read against."""
        if not self.sink:
            return
        lineage = {
            **collect_lineage(self.cfg, self.corpus, self.topo.world_size),
            "mfu_peak": self.peak,
            "model": self._model_lineage(),
            "allocator": self.allocator,
            "device": self._device_lineage(),
            "parallel": self._parallel_lineage(),
        }
        self.sink.start(
            lineage=lineage,
            n_params=self.n_params,
            n_trainable=self.n_trainable,
            flops_per_item=self.flops_per_item,
            flops_source=self.flops_source,
            peak_flops=self.peak_flops,
            peak_source=self.peak["source"],
            bytes_per_token=self.corpus.bytes_per_item,
            dropped_examples=(
                f"{self.corpus.dropped} conversations of {self.corpus.name} dropped: no assistant token within "
                f"model.block_size={self.cfg.model.block_size} tokens of their start"
                if self.corpus.dropped
                else None
            ),
            attempt=self.attempt,
            **self.resumed_from,
        )

    def _log(self, window: LogWindow, last: bool) -> tuple[bool, bool]:
        """The log interval: its one collective, its train event, and the time budget. Returns (stopping, last):
        whether any rank was asked to stop (at the last step the run simply completes), and whether this is the last
        step now that the agreed clock is known."""
        closed = window.close(self._stop_asked(), peak_memory_mb(self.topo.device))
        figures = self.objective.collect("train", self.topo.device)  # DPO's rewards; a collective, every rank
        items_per_s = self.items_per_step * closed.steps / closed.seconds
        if self.sink:
            self.sink.train(
                step=self.step,
                loss=closed.loss,
                lr=lr_at(self.step - 1, self.cfg.optim, self.horizon),
                tokens_per_s=items_per_s,
                data_wait_pct=closed.data_wait_pct,
                mfu=items_per_s * self.flops_per_item / self.mfu_denominator,
                elapsed_s=closed.agreed_seconds,
                horizon=self.horizon,
                peak_memory_mb=[round(m, 1) for m in closed.peak_memory_mb],
                **self._loss_scaling(),
                **self.guard.train_fields(),
                **figures,
            )
        stopping = closed.stop_votes > 0 and not last
        if self.cfg.train.max_seconds:
            out_of_time = closed.agreed_seconds >= self.cfg.train.max_seconds
            last = last or (out_of_time and self.step >= self.cfg.train.min_steps)
            self.horizon = time_budget_horizon(self.step, closed.agreed_seconds, self.cfg.train)
        return stopping, last

    def _step_done(self) -> None:
        """The step is over, evaluation and checkpoint included: the components that watch steps hear of it."""
        self.watchdog.step_done(self.step)
        if self.compile_watch and (compiled := self.compile_watch.step_done(self.step)) and self.sink:
            self.sink.compile(**compiled)
        self.faults.after_step(self.step)

    def _finish(self, profiler, agreed_seconds: float, last_val: dict | None, stopped: bool) -> dict:
        if profiler:
            profiler.close()
        with self.watchdog.phase("final checkpoint"):
            self.checkpointer.close()  # the last checkpoint is published before the run says it is complete
        self.watchdog.close()
        result = {
            "step": self.step,
            "train_seconds": round(agreed_seconds, 3),
            **{key: value for key, value in (last_val or {}).items() if key in ("val_loss", "val_bpb")},
            "peak_memory_mb": round(peak_memory_mb(self.topo.device), 1),
        }
        if self.sink and stopped and self.elastic and not self.run.stop_requested():
            # torchrun's agent stopped the ranks for a change of nodes: the run goes on at the next rendezvous
            print(f"elastic: checkpointed step {self.step} for the next rendezvous of the nodes", file=sys.stderr)
        elif self.sink:
            self.sink.finish(result, stopped=stopped)
        return result

    def _batches(self) -> Iterator[dict]:
        """This replica's batches from the run's position on (its step, and with data.sampling=epochs its sample)."""
        return iter(
            data_mod.train_loader(
                self.corpus,
                self.cfg,
                self.topo.dp_rank,
                first_step=self.step,
                world_size=self.topo.dp_size,
                position=self.samples_seen,
            )
        )

    def _next_batch(self, batches: Iterator[dict]) -> dict:
        """The next step's batch; what it trains on is recorded first where data.record_samples asks."""
        batch = next(batches)
        sample_ids = batch.pop(SAMPLE_IDS, None)  # data.sampling=epochs: the samples of this step's rows
        if self.sample_record is not None:
            self.sample_record.write(self.step + 1, sample_ids)
        return batch

    def _timed_evaluate(self) -> tuple[dict, float]:
        """The evaluation and the seconds it took, which the log window leaves out of training time."""
        start = time.perf_counter()
        result = self._evaluate()
        return result, time.perf_counter() - start

    def _evaluate(self) -> dict:
        with self.watchdog.phase("evaluation"):
            return self.evaluate()

    def _micro_batches(self, batch: dict) -> list[dict]:
        """The step's batch (batch_size x grad_accum_steps rows) as grad_accum_steps micro-batches (views)."""
        size = self.cfg.train.batch_size
        if self.cfg.train.grad_accum_steps == 1:
            return [batch]
        return [{k: v[i : i + size] for k, v in batch.items()} for i in range(0, len(next(iter(batch.values()))), size)]

    def _eval_batch(self, batch: dict) -> float:
        """A validation batch's loss, in micro-batches as training runs them (their memory), weighted as one batch
        (the same validation loss whatever train.grad_accum_steps)."""
        micro_batches = self._micro_batches(batch)
        losses = [self.engine.eval_loss(self._to_device(b)) for b in micro_batches]
        return weighted_mean(losses, micro_batch_weights(micro_batches)).item()

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.topo.device, non_blocking=True) for k, v in batch.items()}

    def _loss_scaling(self) -> dict:
        """fp16 only: the loss scale now and the optimizer steps skipped so far for overflowing gradients."""
        scale = self.engine.loss_scale
        return {} if scale is None else {"loss_scale": scale, "skipped_steps": int(self.engine.skipped_steps)}

    def _on_stop_signal(self, signum, frame) -> None:
        self.stop_requested = True

    def _stop_asked(self) -> bool:
        return self.stop_requested or self.run.stop_requested()  # a stat: ~2 us, once a step at most

    def _save(self, agreed_seconds: float) -> None:
        self.train_seconds, self.saved_step = agreed_seconds, self.step
        with self.watchdog.phase("checkpoint"):
            self.checkpointer.save(
                self.step,
                {
                    "step": self.step,
                    "horizon": self.horizon,
                    "train_seconds": agreed_seconds,
                    "nonfinite_skipped": self.guard.skipped,
                    "samples_seen": self.samples_seen,
                },
            )

    def _nonfinite(self, loss: torch.Tensor, action: str, agreed_seconds: float) -> None:
        """The engine left the update of step self.step + 1 out: its loss or gradients were not finite on some rank.
        That decision is the same on every rank, so all ranks are here and may take a collective. Skipped: recorded,
        and training goes on with the next batch. Stopped: the state before the step is checkpointed (unless it just
        was), then the run fails naming the step and its loss."""
        losses = [0.0] * self.topo.world_size
        losses[self.topo.rank] = loss.item()
        losses = distributed.all_reduce_sum(losses, self.topo.device)
        checkpoint = None
        if action == "stopped":
            if self.saved_step != self.step:
                self._save(agreed_seconds)
            with self.watchdog.phase("final checkpoint"):
                self.checkpointer.close()  # published before the run says it failed
            if (self.checkpointer.store.root / step_name(self.step)).is_dir():
                checkpoint = step_name(self.step)
        event = self.guard.event(self.step + 1, losses, action, checkpoint)
        if self.sink:
            self.sink.events.write(event)
            run_status.update(self.run, nonfinite_skipped=self.guard.skipped)
            print(f"watchdog: {event.summary}", file=sys.stderr, flush=True)
        if action == "stopped":
            if self.sink:
                run_status.forbid_restart(
                    self.run, self.attempt, "a non-finite step: a restart from the checkpoint before it would repeat it"
                )
            raise NonFiniteLossError(event.summary)

    # --- resuming -------------------------------------------------------------------------------------------

    def _resume(self) -> dict:
        """Continue from the newest valid checkpoint in the run directory, if there is one.

        Everything a step depends on comes back: weights, optimizer moments, the schedule position, every
        RNG, and the data position (batches are a function of the step), so the losses after the resume
        point equal those of a run that was never interrupted, bit for bit.
        """
        info = self.resume_point
        for bad in self.unusable:
            print(f"checkpoint {bad.name} is not usable: {bad.reason}; trying an older one", file=sys.stderr)
            if self.sink:
                self.sink.events.write(CheckpointInvalidEvent(checkpoint=bad.name, reason=bad.reason))
        if info is None:
            return {}
        check_compatible(info.manifest, self.cfg.to_dict(), self.topo.world_size, self.topo.ranks_per_replica)
        self.engine.load_checkpoint_state(info.path)
        # The random state of this rank's replica: any of its ranks' (they hold the same), so the first one's in the
        # layout the checkpoint was written at (engine.tensor_parallel may have changed since; a pipeline's first
        # stage is the replica's own number, tensor-parallel groups within a stage being consecutive)
        written_split = info.manifest.get("tensor_parallel", 1)
        written_replicas = info.manifest["world_size"] // (written_split * info.manifest.get("pipeline_parallel", 1))
        # (data.sampling=epochs may change the replicas: a new one takes an old one's generators)
        written_rank = self.topo.dp_rank % written_replicas * written_split
        rank_state = safe_load.load(info.path / f"rank_{written_rank:05d}.pt")
        restore_rng(rank_state["rng"])
        trainer = info.manifest["trainer"]
        self.step, self.train_seconds = trainer["step"], trainer["train_seconds"]
        self.samples_seen = trainer.get("samples_seen", self.step * self.samples_per_step)
        self.saved_step, self.guard.skipped = self.step, trainer.get("nonfinite_skipped", 0)
        # A step-budgeted schedule follows max_steps (which a resume may extend); a time-budgeted one goes on
        # from where the clock had put it.
        self.horizon = trainer["horizon"] if self.cfg.train.max_seconds else self.cfg.train.max_steps
        self.checkpointer.last_saved_seconds = self.train_seconds
        return {"resumed_from": info.name, "resumed_step": self.step}

    # --- lineage, evaluation, profiling -----------------------------------------------------------------------

    def _model_lineage(self) -> dict:
        """Where the model came from: the user's code (each import path and its file's sha256, read now: a resume
        runs the code as it is now) and the pretrained weights, recorded by the start that loaded them (a resume
        takes its weights from the checkpoint and keeps that record)."""
        m = self.cfg.model
        out = {"name": m.name}
        if m.name == "custom":
            from toolkit.train.models.custom import code_lineage

            out["code"] = code_lineage(m)
        if m.name == "hf":
            out["hf"] = {"source": m.hf.source} if m.hf.source else {"architecture": m.hf.architecture}
        if m.init_from:
            earlier = (self.run.read_lineage().get("model") or {}).get("init_from") if self.resume_point else None
            out["init_from"] = self.pretrained or earlier or {"init_from": m.init_from}
        if m.lora.rank:
            out["lora"] = {"rank": m.lora.rank, "alpha": m.lora.alpha, "trainable_parameters": self.n_trainable}
        return out

    def _parallel_lineage(self) -> dict:
        """How the processes share the work: tensor-parallel groups of engine.tensor_parallel ranks or pipelines of
        engine.pipeline_parallel stages, data-parallel replicas of them, and the parameters rank 0 holds
        (1/tensor_parallel of the split matrices, all of the rest; its stage's; under ZeRO-3, its partition)."""
        held = sum(_held_numel(p) for p in self.engine.module.parameters())
        return {
            "processes": self.topo.world_size,
            "tensor_parallel": self.topo.tensor_parallel,
            "pipeline_parallel": self.topo.pipeline_parallel,
            "data_parallel": self.topo.dp_size,
            "parameters_per_rank": held,
        }

    def _device_lineage(self) -> dict:
        """What rank 0 trained on: the device (a GPU by the name torch gives it), the precision, and the collective
        backend where there is a process group (nccl on GPUs, gloo on CPUs; a lone torch-engine process has none)."""
        device = self.topo.device
        import torch.distributed as dist

        return {
            "type": device.type,
            "name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "precision": self.cfg.engine.precision,
            "backend": dist.get_backend() if dist.is_initialized() else None,
        }

    def evaluate(self) -> dict:
        """Mean validation loss over the fixed validation batches, each replica taking its share (the ranks of a
        tensor-parallel group count theirs alike, which leaves the mean as it is)."""
        self.engine.eval()
        loss_sum, count = 0.0, 0
        for batch in data_mod.val_batches(self.corpus, self.cfg, self.topo.dp_rank, self.topo.dp_size):
            loss_sum += self._eval_batch(batch)
            count += 1
        if self.engine.state_moves_in_forward:
            # ZeRO-3 gathers each layer's weights from every rank inside forward: a rank whose share of the batches
            # is one short (eval_batches not a multiple of the ranks) must still join the others' last forward, or
            # they wait for it forever. Its extra forward is not counted.
            per_rank = -(-self.cfg.train.eval_batches // self.topo.world_size)
            with self.objective.uncounted():
                for _ in range(per_rank - count):
                    self._eval_batch(data_mod.val_batch(self.corpus, self.cfg, 0))
        loss_sum, count = distributed.all_reduce_sum([loss_sum, count], self.topo.device)
        self.engine.train()
        result = {"val_loss": loss_sum / count}
        result.update({f"val_{k}": v for k, v in self.objective.collect("val", self.topo.device).items()})
        bpb = data_mod.bits_per_byte(result["val_loss"], self.corpus) if self.objective.bits_per_byte else None
        if bpb is not None:
            result["val_bpb"] = bpb
        if self.sink:
            self.sink.eval(step=self.step, **result)
        return result

    def _profiler(self):
        if not (self.cfg.profile.enabled and self.topo.is_main):
            return None
        from toolkit.train.profiling import StepProfiler

        self.run.profile_dir.mkdir(exist_ok=True)
        return StepProfiler(
            self.cfg.profile, self.run.profile_dir, worker_name=f"rank{self.topo.rank}", on_summary=self.sink.profile
        )

    def close(self):
        if self.sample_record is not None:
            self.sample_record.close()
        self.watchdog.close()
        self.checkpointer.close()
        if self.sink:
            self.sink.close()
        distributed.teardown()
