"""Pipeline parallelism (engine.pipeline_parallel): the built-in GPT's blocks cut into consecutive stages, one a rank.

    stage 0:      token and position embeddings, blocks 0 .. k-1
    stage i:      its share of the blocks
    last stage:   its blocks, the final norm, the output layer and the loss

Each optimizer step's micro-batches (train.grad_accum_steps of them) go through the stages in torch's 1F1B order
(torch.distributed.pipelining's Schedule1F1B): once the pipeline is full, every stage alternates one micro-batch's
forward with an earlier one's backward, so a stage holds the activations of at most as many micro-batches as there
are stages, not of all of them as GPipe does. Of a step's time the pipeline idles (stages - 1) / (micro-batches +
stages - 1): the bubble. torch's schedules rather than DeepSpeed's PipelineModule because they take the model as it is
(a stage is an nn.Module made of the model's own blocks) and work with the torch engine's optimizer, precision,
clipping and checkpoints unchanged; DeepSpeed's wants the model rewritten as a list of layers.

The ranks form a 2-D mesh (pipeline x data parallel), pipeline the outer dimension as in Megatron: a pipeline's
stages are ``world / stages`` ranks apart (on several nodes, one stage a node, its point-to-point sends the only
traffic between nodes), and each pipeline is one data-parallel replica drawing its own batches.

The output layer shares its weight with the token embedding (tying), which lives on the first stage: the last stage
keeps a copy, and the two copies' gradients are summed every step (Megatron's embedding group), so they stay equal.

Checkpoints hold whole tensors in the unsplit model's layout, gathered here: a run saved at 2 stages resumes at 1.
"""

from __future__ import annotations

import typing

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

if typing.TYPE_CHECKING:  # the stages' arithmetic (stage_blocks, GPTStage) is read by the memory model: no mesh import
    from torch.distributed.device_mesh import DeviceMesh

from toolkit.data.batch import IGNORE_INDEX, LABELS
from toolkit.train.engines.param_groups import adamw_param_groups

TIED = ("wte.weight", "lm_head.weight")
"""The tied pair: the token embedding (first stage) and the output layer (last stage's copy)."""


def stage_blocks(n_layer: int, stages: int) -> list[range]:
    """Which blocks each stage runs: consecutive, as even as they divide, the earlier stages taking one more.
    e.g. 10 blocks over 4 stages: 0-2, 3-5, 6-7, 8-9."""
    size, extra = divmod(n_layer, stages)
    bounds = [0]
    for stage in range(stages):
        bounds.append(bounds[-1] + size + (stage < extra))
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


class GPTStage(nn.Module):
    """One stage of a toolkit.train.models.gpt.GPT: its own modules of that model (the same objects, under the same
    names, so its state_dict keys are the whole model's), and a forward that runs them.

    Input: token ids on the first stage, the residual stream (B, T, n_embd) on the others. Output: the residual
    stream, or the logits on the last stage."""

    wte: nn.Embedding
    wpe: nn.Embedding
    drop: nn.Module
    blocks: nn.ModuleDict
    ln_f: nn.Module
    lm_head: nn.Linear

    def __init__(self, gpt: typing.Any, stage: int, stages: int):
        super().__init__()
        self.first, self.last = stage == 0, stage == stages - 1
        self.activation_checkpointing = gpt.activation_checkpointing
        if self.first:
            self.wte, self.wpe, self.drop = gpt.wte, gpt.wpe, gpt.drop
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in stage_blocks(len(gpt.blocks), stages)[stage]})
        if self.last:
            self.ln_f, self.lm_head = gpt.ln_f, gpt.lm_head
            if not self.first and gpt.lm_head.weight is gpt.wte.weight:  # the tie crosses stages: a copy of its own
                self.lm_head.weight = nn.Parameter(gpt.wte.weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.drop(self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device)))
        # as GPT.forward: recompute each block in backward (model.activation_checkpointing) while training only
        recompute = self.activation_checkpointing and self.training and torch.is_grad_enabled()
        for block in self.blocks.values():
            x = checkpoint(block, x, use_reentrant=False) if recompute else block(x)
        return self.lm_head(self.ln_f(x)) if self.last else x


def mesh(device_type: str, world_size: int, stages: int, tensor_parallel: int = 1) -> DeviceMesh:
    """The (pp, dp, tp) mesh, Megatron's order: a tensor-parallel group is consecutive ranks (one node's NVLink), a
    pipeline's stages the farthest apart (world / stages ranks)."""
    from torch.distributed.device_mesh import init_device_mesh

    shape = (stages, world_size // (stages * tensor_parallel), tensor_parallel)
    return init_device_mesh(device_type, shape, mesh_dim_names=("pp", "dp", "tp"))


class Pipeline:
    """This rank's stage of ``model`` (a whole GPT, the same on every rank: the same seed or checkpoint), its place in
    the mesh, and the 1F1B schedule over ``micro_batches`` micro-batches a step. With a tensor-parallel dimension
    (engine.tensor_parallel), each stage's blocks are split over its group too (toolkit.train.tensor_parallel): the
    residual stream between stages is whole on every rank of a group, so rank t of one stage sends to rank t of the
    next."""

    def __init__(self, model: typing.Any, ranks: DeviceMesh, micro_batches: int, device: torch.device):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        self.pp, self.dp, self.tp = ranks["pp"], ranks["dp"], ranks["tp"]
        self.stages, self.index = self.pp.size(), self.pp.get_local_rank()
        self.pp_ranks = dist.get_process_group_ranks(self.pp.get_group())  # global ranks, stage order
        # The whole model's layout, for checkpoints: its state_dict keys in order, and the index each parameter has in
        # the optimizer state an unsplit run writes (adamw_param_groups' order; a tie counts once, under its first name)
        self.whole_keys = list(model.state_dict())
        groups = adamw_param_groups(model, 0.0)
        numbers = {id(p): i for i, p in enumerate(p for group in groups for p in group["params"])}
        self.whole_index = {name: numbers[id(p)] for name, p in model.named_parameters(remove_duplicate=False)}
        self.whole_groups = [[numbers[id(p)] for p in group["params"]] for group in groups]
        self.tied = model.lm_head.weight is model.wte.weight
        self.width: int = model.wte.embedding_dim  # of the residual stream that passes between stages
        self.module = GPTStage(model, self.index, self.stages).to(device)
        if self.tp.size() > 1:  # the stage's own blocks split over its group, as a whole model's would be
            from toolkit.train import tensor_parallel

            tensor_parallel.parallelize(self.module, "gpt", self.tp, loss_parallel=False)
        # the group of each replica's first and last stage, for the tied weight's gradient: every rank creates every
        # group (new_group is a collective), and keeps its own
        self.tie_group = None
        if self.tied:
            for pipeline in self.pp_ranks_of_every_replica():
                group = dist.new_group([pipeline[0], pipeline[-1]])
                if dist.get_rank() in (pipeline[0], pipeline[-1]):
                    self.tie_group = group
        self.params = dict(self.module.named_parameters())  # this stage's, as split (the optimizer's own objects)
        self._targets = 1  # predicted tokens in the current step: each micro-batch's summed loss is divided by it
        stage = PipelineStage(self.module, self.index, self.stages, device, group=self.pp.get_group())
        self.schedule = Schedule1F1B(stage, micro_batches, loss_fn=self._step_share_of_loss, scale_grads=False)

    def pp_ranks_of_every_replica(self) -> list[list[int]]:
        """Every pipeline (one a replica and tensor-parallel rank), as global ranks in stage order."""
        stages, replicas, split = self.stages, self.dp.size(), self.tp.size()
        return [
            [(stage * replicas + replica) * split + t for stage in range(stages)]
            for replica in range(replicas)
            for t in range(split)
        ]

    def _step_share_of_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """A micro-batch's summed cross entropy over the step's predicted tokens: the micro-batches' shares add up to
        the step's mean loss, each weighted by its share of the targets (toolkit.train.engines.accumulation)."""
        summed = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        return summed / self._targets

    def forward_backward(self, micro_batches: list[dict], autocast) -> torch.Tensor:
        """Every micro-batch through every stage (1F1B), gradients added up; returns the step's loss, on every rank
        of the pipeline (the last stage computes it)."""
        labels = torch.cat([batch[LABELS] for batch in micro_batches])
        self._targets = max(int((labels != IGNORE_INDEX).sum()), 1)
        losses: list[torch.Tensor] = []
        with autocast():
            if self.index == 0:
                self.schedule.step(torch.cat([batch["input_ids"] for batch in micro_batches]))
            elif self.index == self.stages - 1:
                self.schedule.step(target=labels, losses=losses)
            else:
                self.schedule.step()
        loss = torch.stack(losses).sum().detach() if losses else torch.zeros((), device=labels.device)
        return self._from_last_stage(loss)

    @torch.no_grad()
    def eval_loss(self, batch: dict, autocast) -> torch.Tensor:
        """The mean loss of one batch, forward only: the residual stream sent stage to stage."""
        ids = batch["input_ids"]
        with autocast():
            if self.index == 0:
                x = ids
            else:
                x = torch.empty((*ids.shape, self.width), device=ids.device)  # sent as float32 (below)
                dist.recv(x, self.pp_ranks[self.index - 1], group=self.pp.get_group())
            out = self.module(x)
            if self.index < self.stages - 1:
                dist.send(out.float().contiguous(), self.pp_ranks[self.index + 1], group=self.pp.get_group())
                loss = torch.zeros((), device=ids.device)
            else:
                loss = F.cross_entropy(out.flatten(0, 1).float(), batch[LABELS].flatten(), ignore_index=IGNORE_INDEX)
        return self._from_last_stage(loss.detach())

    def _from_last_stage(self, value: torch.Tensor) -> torch.Tensor:
        value = value.float().contiguous()
        dist.broadcast(value, self.pp_ranks[-1], group=self.pp.get_group())
        return value

    # --- gradients -------------------------------------------------------------------------------------------------

    def reduce_gradients(self) -> None:
        """The tied weight's two gradients summed (first and last stage), then every gradient averaged over the
        data-parallel replicas of this stage."""
        if self.tp.size() > 1:
            # the first stage's vocabulary-split embedding gets its gradient whole (replicated) from DTensor's
            # backward: laid out as the weight is, both sides of the tie hold the same rows
            from torch.distributed.tensor import DTensor

            for p in self.module.parameters():
                if isinstance(p, DTensor) and isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                    p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        if self.tie_group is not None:
            tied = self.module.get_parameter(TIED[0] if self.index == 0 else TIED[1])
            if tied.grad is not None:  # split alike on both stages (by vocabulary rows): the local shards add up
                from toolkit.train.tensor_parallel import local

                dist.all_reduce(local(tied.grad), group=self.tie_group)
        if self.dp.size() > 1:
            from toolkit.train.tensor_parallel import all_reduce_gradients

            all_reduce_gradients(self.module.parameters(), self.dp.get_group())

    def clip_gradients(self, max_norm: float | None) -> torch.Tensor:
        """The global gradient norm over every stage (the tied weight counted once; a tensor-parallel shard's squares
        summed over its group, a whole gradient's counted once), and every gradient scaled down to ``max_norm`` when
        set: clip_grad_norm_'s result for the unsplit model."""
        from toolkit.train.tensor_parallel import scale_to_norm, squared_norm

        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        counted = [
            p.grad
            for name, p in self.module.named_parameters()
            if p.grad is not None and not (self.tied and name == TIED[1] and self.index > 0)
        ]
        total = squared_norm(counted, self.tp.get_group())
        dist.all_reduce(total, group=self.pp.get_group())
        norm = total.sqrt()
        scale_to_norm(grads, norm, max_norm)
        return norm

    # --- whole tensors, for checkpoints ------------------------------------------------------------------------------

    def _gather(self, local, keep: bool) -> list | None:
        """Every stage's ``local`` on the first rank (rank 0 for replica 0); replicas are alike, and so are the ranks
        of a tensor-parallel group once their tensors are whole: only the first pipeline gathers."""
        if self.dp.get_local_rank() != 0 or self.tp.get_local_rank() != 0:
            return None
        found = [None] * self.stages if keep else None
        dist.gather_object(local, found, group_dst=0, group=self.pp.get_group())
        return found

    def whole_state_dict(self, keep: bool) -> dict[str, torch.Tensor]:
        """The unsplit model's state_dict (a collective over the pipeline; ``keep``: on this rank, the writer)."""
        parts = self._gather({k: self._whole(k, v).detach().cpu() for k, v in self.module.state_dict().items()}, keep)
        if not keep or parts is None:
            return {}
        merged: dict[str, torch.Tensor] = {}
        for part in parts:
            merged.update(part)
        return {key: merged[key] for key in self.whole_keys}

    def whole_optimizer_state(self, optimizer: torch.optim.Optimizer, keep: bool) -> dict:
        """optimizer.state_dict() as an unsplit run writes it: every stage's moments under the whole model's parameter
        numbers (a collective over the pipeline)."""
        names = self._names_by_index(optimizer)
        state = optimizer.state_dict()
        local = {}
        for index, moments in state["state"].items():
            name = names[index]
            if self.tied and name == TIED[1] and self.index > 0:
                continue  # the copy: the first stage's moments are the tied weight's
            local[self.whole_index[name]] = {
                k: self._whole(name, v).cpu() if torch.is_tensor(v) else v for k, v in moments.items()
            }
        parts = self._gather(local, keep)
        if not keep or parts is None:
            return {}
        whole_state: dict = {}
        for part in parts:
            whole_state.update(part)
        groups = [{**group, "params": numbers} for group, numbers in zip(state["param_groups"], self.whole_groups)]
        return {"state": dict(sorted(whole_state.items())), "param_groups": groups}

    def _whole(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """``value`` (parameter ``name``, or state laid out as it is) whole: a tensor-parallel shard gathered over its
        group, a collective; a buffer or an unsplit tensor as it is."""
        if self.tp.size() == 1 or name not in self.params:
            return value
        from toolkit.train import tensor_parallel

        return tensor_parallel.whole(value, self.params[name])

    def _split(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """This rank's part of the whole ``value`` of parameter ``name`` (itself when nothing is split)."""
        if self.tp.size() == 1 or name not in self.params:
            return value
        from toolkit.train import tensor_parallel

        return tensor_parallel.split(value, self.params[name])

    def load_state_dict(self, whole: dict[str, torch.Tensor]) -> None:
        self.module.load_state_dict({key: self._split(key, whole[key]) for key in self.module.state_dict()})

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, whole: dict) -> None:
        """This stage's moments out of a whole optimizer state (written at any engine.pipeline_parallel)."""
        names = self._names_by_index(optimizer)
        own = optimizer.state_dict()
        state = {
            index: {
                key: self._split(name, value) if torch.is_tensor(value) and value.dim() else value
                for key, value in whole["state"][self.whole_index[name]].items()
            }
            for index, name in names.items()
            if self.whole_index[name] in whole["state"]
        }
        groups = [
            {**saved, "params": mine["params"]} for saved, mine in zip(whole["param_groups"], own["param_groups"])
        ]
        optimizer.load_state_dict({"state": state, "param_groups": groups})

    def _names_by_index(self, optimizer: torch.optim.Optimizer) -> dict[int, str]:
        """The optimizer's parameter numbers (its state_dict's) -> the parameters' names in the model."""
        names = {id(p): name for name, p in self.module.named_parameters()}
        return {i: names[id(p)] for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])}
