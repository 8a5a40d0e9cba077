"""PyTorch's own sharding (engine.name=fsdp): FSDP2's ``fully_shard`` per transformer block and at the root.

Every rank holds 1/N of every parameter, its gradient and its optimizer state (DTensors sharded by rows over a 1-D
mesh of all ranks). A block's parameters are all-gathered just before its forward and freed after it
(engine.fsdp_reshard_after_forward), gathered again for its backward, and its gradients reduce-scattered so each
rank keeps only its rows: ZeRO-3's memory with torch's own code. The root holds what is outside the blocks
(embeddings, the final norm, the output layer; a tied pair stays one parameter there).

Checkpoints never gather: every rank writes its own shards (toolkit.checkpoint.sharded), and a resume reads them
back into this run's shards.
"""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from toolkit import safe_load
from toolkit.checkpoint import sharded
from toolkit.checkpoint.store import SHARDS, shard_folder
from toolkit.train.engines.param_groups import HALF, trainable_only
from toolkit.train.engines.torch_engine import TorchEngine, keep_implementation


def blocks(model: torch.nn.Module, model_name: str) -> list[torch.nn.Module]:
    """The modules sharded one by one, each gathered only while it runs: the built-in GPT's blocks, a transformers
    model's decoder layers (the classes it declares unsplittable, ``_no_split_modules``, as accelerate's FSDP
    wrapping reads them), none for other models (the whole model is then one unit, sharded at rest)."""
    if model_name == "gpt":
        return list(model.get_submodule("blocks").children())
    names = set(getattr(model, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


class FSDPEngine(TorchEngine):
    def __init__(self, model, cfg, topo, loss_fn):
        super().__init__(model, cfg, topo, loss_fn)
        self._autocast = contextlib.nullcontext  # the mixed-precision policy casts at the gather instead

    def _wrap(self, cfg, topo) -> None:
        e = cfg.engine
        mesh = init_device_mesh(topo.device.type, (topo.world_size,), mesh_dim_names=("dp",))
        half = HALF.get(e.precision)
        # bf16: parameters gathered and computed in bf16, gradients reduced in fp32 (what autocast does elsewhere,
        # here at the gather: half the bytes on the wire); the sharded master weights and the optimizer stay fp32
        policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32) if half else MixedPrecisionPolicy()
        offload = CPUOffloadPolicy() if e.fsdp_offload else OffloadPolicy()
        for block in blocks(self.module, cfg.model.name):
            fully_shard(
                block,
                mesh=mesh,
                mp_policy=policy,
                offload_policy=offload,
                reshard_after_forward=e.fsdp_reshard_after_forward,
            )
        # the root is gathered for the whole forward anyway (its embeddings first, its output layer last)
        fully_shard(self.module, mesh=mesh, mp_policy=policy, offload_policy=offload, reshard_after_forward=False)
        self.model = self.module
        self.rank = topo.rank
        # LoRA: the adapters alone, as the torch engine saves them (the frozen base is rebuilt)
        adapters = trainable_only(cfg)
        self._state_options = StateDictOptions(ignore_frozen_params=adapters, strict=not adapters)

    def forward_backward(self, batch: dict, weight: float | None, n: int, last: bool) -> torch.Tensor:
        # inner micro-batches keep their unsharded gradients; the last backward reduce-scatters the sum once
        self.module.set_requires_gradient_sync(last)
        return super().forward_backward(batch, weight, n, last)

    def _state(self) -> dict:
        model, optimizer = get_state_dict(self.module, self.optimizer, options=self._state_options)
        return {"model": model, "optimizer": optimizer}

    def checkpoint_state(self, folder, is_writer: bool) -> dict:
        """Every rank's own shards (references to its DTensors: no gather, no copy), written into its shard folder."""
        return {shard_folder(self.rank): self._state()}

    def load_checkpoint_state(self, folder) -> None:
        if (folder / SHARDS).is_dir():
            sharded.load_into(self.module, self.optimizer, folder / SHARDS, self._state_options)
        else:  # a torch-engine checkpoint's whole tensors (DDP, one process): each rank keeps its shard of them
            weights = safe_load.load(folder / "model.pt", map_location=self.device)
            optimizer = safe_load.load(folder / "optimizer.pt", map_location=self.device)
            set_state_dict(
                self.module,
                self.optimizer,
                model_state_dict=weights,
                optim_state_dict=self._by_name(optimizer),
                options=StateDictOptions(
                    full_state_dict=True,
                    ignore_frozen_params=self._state_options.ignore_frozen_params,
                    strict=self._state_options.strict,
                ),
            )
        keep_implementation(self.optimizer)

    def _by_name(self, state: dict) -> dict:
        """A torch optimizer.state_dict() (parameters numbered in this optimizer's order: both engines build their
        groups alike) keyed by parameter name instead, as torch's distributed state dicts are."""
        names = {id(p): name for name, p in self.module.named_parameters()}
        order = [names[id(p)] for group in self.optimizer.param_groups for p in group["params"]]
        return {
            "state": {order[index]: moments for index, moments in state["state"].items()},
            "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in state["param_groups"]],
        }
