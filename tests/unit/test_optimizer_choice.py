"""The torch engine's AdamW: the fused kernel on a CPU as on a GPU (one pass per parameter instead of several),
torch's default path for parameters split by tensor parallelism (DTensors), and that choice kept by a resume."""

from __future__ import annotations

import torch
import torch.distributed as dist

from toolkit import config as config_mod
from toolkit.data import corpus as data_mod
from toolkit.train.distributed import Topology
from toolkit.train.engines.torch_engine import TorchEngine, adamw_implementation
from toolkit.train.models import loss_function
from toolkit.train.models.gpt import GPT
from toolkit.train.trainer import train_step


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


def test_a_resume_keeps_the_engine_s_choice_whatever_the_checkpoint_says(tmp_path):
    """Loading an optimizer's state replaces its groups' settings with the saved ones: a checkpoint written before the
    fused kernel was chosen (fused None), or in another layout, must not choose it for the resumed run."""
    cfg = config_mod.load("tiny", [])
    engine = TorchEngine(GPT(cfg.model), cfg, Topology(0, 0, 1, torch.device("cpu")), loss_function(cfg.model))
    batch = data_mod.load_corpus(cfg).batch("train", 2, torch.Generator().manual_seed(0))
    train_step(engine, [batch])
    files = engine.checkpoint_state(tmp_path, is_writer=True)
    for group in files["optimizer.pt"]["param_groups"]:
        group["fused"] = None  # as torch's default AdamW saved it
    for name, state in files.items():
        torch.save(state, tmp_path / name)
    resumed = TorchEngine(GPT(cfg.model), cfg, Topology(0, 0, 1, torch.device("cpu")), loss_function(cfg.model))
    resumed.load_checkpoint_state(tmp_path)
    assert [group["fused"] for group in resumed.optimizer.param_groups] == [True, True]
    assert resumed.optimizer.state  # the moments were loaded
