"""The torch engine's AdamW: the fused kernel on a CPU as on a GPU (one pass per parameter instead of several), and
torch's foreach path for parameters split by tensor parallelism (DTensors), which the fused kernel cannot take."""

from __future__ import annotations

import torch
import torch.distributed as dist

from toolkit import config as config_mod
from toolkit.train.distributed import Topology
from toolkit.train.engines.torch_engine import TorchEngine, adamw_implementation
from toolkit.train.models import loss_function
from toolkit.train.models.gpt import GPT


def test_the_engine_steps_with_the_fused_adamw_on_a_cpu():
    cfg = config_mod.load("tiny", [])
    engine = TorchEngine(GPT(cfg.model), cfg, Topology(0, 0, 1, torch.device("cpu")), loss_function(cfg.model))
    assert engine.optimizer.defaults["fused"] is True and not engine.optimizer.defaults["foreach"]


def test_split_parameters_keep_torch_s_default_path():
    from torch.distributed.tensor import distribute_tensor, init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        split = torch.nn.Parameter(distribute_tensor(torch.zeros(4, 4), init_device_mesh("cpu", (1,))))
        plain = torch.nn.Parameter(torch.zeros(4))
        assert adamw_implementation(torch.device("cpu"), [{"params": [split]}, {"params": [plain]}]) == {}
        assert adamw_implementation(torch.device("cpu"), [{"params": [plain]}]) == {"fused": True}
    finally:
        dist.destroy_process_group()
