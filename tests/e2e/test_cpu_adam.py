"""ZeRO-Offload's optimizer, built and run once here: DeepSpeed's CPU Adam (the C++ op that updates offloaded
optimizer state on the host while the GPUs go on) compiles with this machine's g++ and steps as torch's AdamW does.
Offload itself needs a GPU and is refused on this machine (tests/e2e/test_your_deepspeed_config.py); this is the part
of it that a CPU can run. The first build takes one to two minutes; it is cached in TORCH_EXTENSIONS_DIR.

In the matrix (`make test-matrix`): none of Trainbook's code runs here beyond import_deepspeed, which every DeepSpeed
test of `make test` runs."""

from __future__ import annotations

import pytest
import torch

from toolkit.third_party import import_deepspeed


@pytest.mark.slow
@pytest.mark.matrix
def test_deepspeed_cpu_adam_builds_and_matches_torch_adamw():
    import_deepspeed()
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    from deepspeed.ops.op_builder import CPUAdamBuilder

    assert CPUAdamBuilder().is_compatible(verbose=False)
    torch.manual_seed(0)
    ours = torch.nn.Parameter(torch.randn(4096))
    start = ours.detach().clone()
    reference = torch.nn.Parameter(start.clone())
    settings = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    cpu_adam = DeepSpeedCPUAdam([ours], adamw_mode=True, **settings)  # JIT-builds the op on first use
    adamw = torch.optim.AdamW([reference], **settings)
    for _ in range(5):
        grad = torch.randn(4096)
        ours.grad, reference.grad = grad.clone(), grad.clone()
        cpu_adam.step()
        adamw.step()
    assert (ours - start).abs().max().item() > 1e-2, "five steps of lr 1e-2 moved the weights"
    assert (ours - reference).abs().max().item() < 1e-6, "the same update as torch's AdamW"
    assert cpu_adam.state[ours]["step"] == 5
