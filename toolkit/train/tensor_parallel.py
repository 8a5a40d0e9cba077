"""Tensor parallelism (engine.tensor_parallel): each block's matrices split over the ranks of a group, Megatron-style.

    attention:  qkv column-parallel (each rank: its own heads' q, k and v)  ->  proj row-parallel (one all-reduce)
    MLP:        up column-parallel (a slice of the hidden width)            ->  down row-parallel (one all-reduce)
    embedding:  row-parallel over the vocabulary; the output layer column-parallel over it, and for the built-in GPT
                the loss computed on the vocabulary shards (torch's loss_parallel: the logits are never gathered)

PyTorch's own DTensor styles do the splitting (torch.distributed.tensor.parallel); a plan says which module gets
which style. The ranks form a 2-D mesh (data parallel x tensor parallel): a tensor-parallel group is
``tensor_parallel`` consecutive ranks (one node's, when it divides the GPUs per node, so its all-reduces stay on
NVLink), and each such group is one data-parallel replica that draws its own batches.

Checkpoints hold whole tensors, gathered here (:func:`whole`) in the layout of the unsplit model: a run saved at
tensor_parallel 2 resumes at 1, or at 4, and exports as any other run does.
"""

from __future__ import annotations

import typing

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module

from toolkit.errors import RefusedValue, not_allowed, refused

FUSED_CHUNKS = "_tensor_parallel_fused_chunks"
"""Set on a parameter whose rows are several matrices stacked (the GPT's q, k and v): how many."""


class FusedColwiseParallel(ColwiseParallel):
    """Column-parallel for a projection whose output is ``chunks`` matrices side by side (the GPT's fused qkv).

    Plain column sharding would hand rank 0 all of q and half of k. Here each rank's rows are its slice of every
    chunk (rank r of 2: q_r, k_r, v_r), so its output splits into its own heads' q, k and v. The DTensor is the
    concatenation of those local rows; :func:`whole` and :func:`split` convert to and from the stacked layout."""

    def __init__(self, chunks: int):
        super().__init__()
        self.chunks = chunks

    def _partition_linear_fn(self, name, module, device_mesh):
        for pname, param in list(module.named_parameters(recurse=False)):
            local = _fused_rows(param.detach(), self.chunks, device_mesh.size(), device_mesh.get_local_rank())
            sharded = nn.Parameter(
                DTensor.from_local(local, device_mesh, [Shard(0)], run_check=False), requires_grad=param.requires_grad
            )
            setattr(sharded, FUSED_CHUNKS, self.chunks)
            module.register_parameter(pname, sharded)


def _fused_rows(full: torch.Tensor, chunks: int, n: int, i: int) -> torch.Tensor:
    """Rank i of n's rows of a stacked matrix: its slice of each of the ``chunks`` matrices, in order."""
    return torch.cat([part.chunk(n)[i] for part in full.chunk(chunks)])


def _unfuse(gathered: torch.Tensor, chunks: int, n: int) -> torch.Tensor:
    """The stacked layout back from the ranks' rows laid end to end (the inverse of :func:`_fused_rows` over all
    ranks): [q_0 k_0 v_0 q_1 k_1 v_1] -> [q_0 q_1 k_0 k_1 v_0 v_1]."""
    pieces = gathered.chunk(n * chunks)  # rank-major: rank r's chunk c is piece r * chunks + c
    return torch.cat([pieces[r * chunks + c] for c in range(chunks) for r in range(n)])


# --- plans: which module of which model gets which style ----------------------------------------------------------


def gpt_plan(model: nn.Module, loss_parallel: bool) -> dict[str, ParallelStyle]:
    """The built-in GPT (toolkit.train.models.gpt). Its token embedding and output layer share one (vocab, width)
    matrix: both split it by vocabulary rows, so the shared matrix stays one tensor. A pipeline stage
    (toolkit.train.pipeline_parallel.GPTStage) has the blocks, the embedding and the output layer it holds."""
    plan: dict[str, ParallelStyle] = {}
    if hasattr(model, "wte"):
        plan["wte"] = RowwiseParallel(input_layouts=Replicate())
    for i, _ in model.get_submodule("blocks").named_children():
        plan[f"blocks.{i}.attn.qkv"] = FusedColwiseParallel(chunks=3)
        plan[f"blocks.{i}.attn.proj"] = RowwiseParallel()
        plan[f"blocks.{i}.mlp.0"] = ColwiseParallel()
        plan[f"blocks.{i}.mlp.2"] = RowwiseParallel()
    if not hasattr(model, "lm_head"):
        return plan
    # loss_parallel: logits stay split by vocabulary (each rank 1/tp of them) and the cross entropy runs on the shards
    plan["lm_head"] = (
        ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
        if loss_parallel
        else ColwiseParallel(output_layouts=Replicate())
    )
    return plan


# transformers' names for its styles (a model's config.base_model_tp_plan and its class's _tp_plan) -> torch's
HF_STYLES: dict[str, typing.Callable[[], ParallelStyle]] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
    "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
    "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),  # by vocabulary rows
}


def hf_plan(model: typing.Any) -> dict[str, ParallelStyle]:
    """A transformers model, by the plan its architecture declares (config.base_model_tp_plan: Llama, Mistral,
    Qwen2 and others). The built model's ``_tp_plan`` is that plan under the base model's attribute, with the class's
    own entries (the embedding split by vocabulary rows, the output layer's logits gathered): taken as it is."""
    if not getattr(model.config, "base_model_tp_plan", None):
        raise RefusedValue(
            refused(
                "engine.tensor_parallel",
                f"{type(model).__name__} declares no tensor-parallel plan (config.base_model_tp_plan)",
                "1, or an architecture that declares one (Llama, Mistral, Qwen2, ...)",
            )
        )
    declared = model._tp_plan
    unknown = sorted({style for style in declared.values() if style not in HF_STYLES})
    if unknown:
        raise RefusedValue(
            not_allowed(
                "engine.tensor_parallel",
                unknown[0],
                ", ".join(map(repr, HF_STYLES)),
                problem=f"is a style in {type(model).__name__}'s plan that Trainbook does not map",
            )
        )
    return {name: HF_STYLES[style]() for name, style in declared.items()}


def check_divisible(model: nn.Module, size: int) -> None:
    """Every split dimension a multiple of ``size``, named when not (the heads first: they are what users set)."""
    cfg = getattr(model, "config", None)
    counts = {}
    if cfg is not None:  # transformers
        counts = {
            "num_attention_heads": getattr(cfg, "num_attention_heads", None),
            "num_key_value_heads": getattr(cfg, "num_key_value_heads", None),
            "intermediate_size": getattr(cfg, "intermediate_size", None),
            "vocab_size": getattr(cfg, "vocab_size", None),
        }
    for field, count in counts.items():
        if count and count % size:
            raise RefusedValue(
                not_allowed(
                    "engine.tensor_parallel",
                    size,
                    f"a divisor of {field} ({count})",
                    problem=f"does not divide the model's {field} ({count})",
                )
            )


# --- building -----------------------------------------------------------------------------------------------------


def mesh(device_type: str, world_size: int, size: int) -> DeviceMesh:
    """The (dp, tp) mesh: tp the inner dimension, so a tensor-parallel group is ``size`` consecutive ranks."""
    return init_device_mesh(device_type, (world_size // size, size), mesh_dim_names=("dp", "tp"))


def parallelize(model: nn.Module, model_name: str, tp_mesh: DeviceMesh, loss_parallel: bool) -> None:
    """Split ``model`` in place over ``tp_mesh`` by its plan. Every rank must hold the same whole model first (the
    same seed or the same checkpoint): each keeps its own slice of it."""
    check_divisible(model, tp_mesh.size())
    tied = _tied_parameters(model)
    plan = gpt_plan(model, loss_parallel) if model_name == "gpt" else hf_plan(model)
    parallelize_module(model, tp_mesh, plan)
    # parallelize_module gives each module its own new parameter: tie the shared ones again (both sides of each tie
    # were split the same way, by vocabulary rows)
    for keeper, followers in tied:
        kept = model.get_parameter(keeper)
        for name in followers:
            module_name, _, attr = name.rpartition(".")
            setattr(model.get_submodule(module_name), attr, kept)


def _tied_parameters(model: nn.Module) -> list[tuple[str, list[str]]]:
    """(first name, [other names]) for each parameter registered under several names (tied weights)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [(found[0], found[1:]) for found in names.values() if len(found) > 1]


# --- whole tensors, for checkpoints ----------------------------------------------------------------------------------


def whole(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` (a parameter, or optimizer state shaped like the parameter ``like``) as one whole tensor in the
    unsplit model's layout. A collective for a split tensor: every rank of the group must call it, in the same order."""
    if not isinstance(value, DTensor):
        return value
    gathered = value.full_tensor()
    chunks = getattr(like, FUSED_CHUNKS, None)
    return _unfuse(gathered, chunks, value.device_mesh.size()) if chunks else gathered


def split(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's slice of the whole tensor ``full``, placed as ``like`` (a parameter of the split model) is."""
    if not isinstance(like, DTensor):
        return full
    (placement,) = like.placements
    assert isinstance(placement, (Replicate, Shard)), placement  # the only placements the plans make
    group_mesh = like.device_mesh
    n, i = group_mesh.size(), group_mesh.get_local_rank()
    full = full.to(like.device)
    if isinstance(placement, Replicate):
        local = full
    elif chunks := getattr(like, FUSED_CHUNKS, None):
        local = _fused_rows(full, chunks, n, i)
    else:
        local = full.chunk(n, dim=placement.dim)[i]
    return DTensor.from_local(local.contiguous(), group_mesh, like.placements, run_check=False)


def parameter_names(module: nn.Module) -> dict[str, nn.Parameter]:
    """Every name a parameter goes by, tied ones included (state_dict lists both names of a tie)."""
    return dict(module.named_parameters(remove_duplicate=False))


def whole_state_dict(module: nn.Module, keep: bool = True) -> dict[str, torch.Tensor]:
    """module.state_dict() with every split tensor whole (a collective: every rank calls it). ``keep`` False: take
    part in the gathers and keep nothing, so a rank that writes nothing holds one whole tensor at a time."""
    params = parameter_names(module)
    gathered = ((key, whole(value, params.get(key, value))) for key, value in module.state_dict().items())
    return {key: value for key, value in gathered if keep}


def split_state_dict(module: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    params = parameter_names(module)
    return {key: split(value, params[key]) if key in params else value for key, value in state.items()}


def _optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters in the order optimizer.state_dict() numbers them."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def whole_optimizer_state(optimizer: torch.optim.Optimizer, keep: bool = True) -> dict:
    """optimizer.state_dict() with every split moment whole: the same file an unsplit run writes (a collective;
    ``keep`` as for :func:`whole_state_dict`)."""
    state = optimizer.state_dict()
    params = _optimizer_params(optimizer)
    whole_state = {}
    for index, moments in state["state"].items():
        gathered = {key: whole(v, params[index]) if torch.is_tensor(v) else v for key, v in moments.items()}
        if keep:
            whole_state[index] = gathered
    return {**state, "state": whole_state}


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """Load a whole optimizer state (written at any tensor_parallel) into this rank's split optimizer."""
    params = _optimizer_params(optimizer)
    state = {
        **state,
        "state": {
            index: {
                key: split(value, params[index]) if torch.is_tensor(value) and value.dim() else value
                for key, value in moments.items()
            }
            for index, moments in state["state"].items()
        },
    }
    optimizer.load_state_dict(state)


# --- gradients ------------------------------------------------------------------------------------------------------


def all_reduce_gradients(parameters, group) -> None:
    """Average the gradients over the data-parallel replicas (``group``): one all-reduce of every local shard laid
    end to end, as DDP's buckets do, without DDP (which does not take split parameters)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    shards = [local(g) for g in grads]
    flat = torch.cat([g.reshape(-1) for g in shards])
    dist.all_reduce(flat, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for g in shards:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank (the tensor itself otherwise)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def squared_norm(grads: list[torch.Tensor], group) -> torch.Tensor:
    """The squared global norm of ``grads`` (not empty), which clip_grad_norm_ cannot take (it refuses a mix of split
    and whole gradients): a split gradient's squares summed over its group (``group``), a whole one's, held alike by
    every rank, counted once."""
    split_grads: list[torch.Tensor] = []
    whole_grads: list[torch.Tensor] = []
    for g in grads:
        sharded = isinstance(g, DTensor) and not isinstance(g.placements[0], Replicate)
        (split_grads if sharded else whole_grads).append(local(g))
    zero = torch.zeros((), dtype=torch.float32, device=(split_grads or whole_grads)[0].device)
    split_sq = torch.nn.utils.get_total_norm(split_grads).float() ** 2 if split_grads else zero.clone()
    dist.all_reduce(split_sq, group=group)
    whole_sq = torch.nn.utils.get_total_norm(whole_grads).float() ** 2 if whole_grads else zero
    return split_sq + whole_sq


def scale_to_norm(grads: list[torch.Tensor], norm: torch.Tensor, max_norm: float | None) -> None:
    """Every gradient (this rank's part) scaled down so that their global ``norm`` is at most ``max_norm``, when set."""
    if max_norm:
        torch._foreach_mul_(
            [local(g) for g in grads], torch.clamp(max_norm / (norm + 1e-6), max=1.0)
        )  # clip_grad_norm_'s rule


def clip_gradients(parameters, max_norm: float | None, group) -> torch.Tensor:
    """The gradients' global norm over a tensor-parallel group (``group``: squared_norm), and, when ``max_norm`` is
    set, every gradient scaled down to it."""
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = squared_norm(grads, group).sqrt()
    scale_to_norm(grads, norm, max_norm)
    return norm
