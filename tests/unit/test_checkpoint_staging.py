"""Where a checkpoint's staging buffers are first filled: in the background at the start of a GPU run (pinning them
while the host idles), in the first checkpoint's own copy on a CPU (where a background fill would slow the steps
and go unreported)."""

from __future__ import annotations

import torch

from toolkit import config as config_mod
from toolkit.checkpoint.checkpointer import Checkpointer
from toolkit.data import corpus as data_mod
from toolkit.train.distributed import Topology
from toolkit.train.engines.torch_engine import TorchEngine
from toolkit.train.models import loss_function
from toolkit.train.models.gpt import GPT
from toolkit.train.trainer import train_step


def _engine_after_one_step(cfg) -> TorchEngine:
    torch.manual_seed(0)
    engine = TorchEngine(GPT(cfg.model), cfg, Topology(0, 0, 1, torch.device("cpu")), loss_function(cfg.model))
    batch = data_mod.load_corpus(cfg).batch("train", 2, torch.Generator().manual_seed(0))
    train_step(engine, [batch])  # AdamW's moments exist now: the state is full size
    return engine


def test_on_a_cpu_the_trainer_s_warm_up_leaves_the_buffers_to_the_first_checkpoint(tmp_path):
    cfg = config_mod.load("tiny", ["checkpoint.every_steps=10"])
    checkpointer = Checkpointer(cfg, tmp_path, rank=0, world_size=1, engine=_engine_after_one_step(cfg),
                                device=torch.device("cpu"))
    try:
        checkpointer.warm_up()
        assert checkpointer._pending is None and not checkpointer._buffers
        checkpointer.fill_staging_buffers()  # what a GPU run's warm-up does (and the benchmark, for steady state)
        checkpointer._pending.done.wait(timeout=60)
        assert checkpointer._buffers and not any(tmp_path.iterdir()), "staged, nothing written"
    finally:
        checkpointer.close()
