"""DeepSpeed's JIT op builder reads TORCH_CUDA_ARCH_LIST as MAJOR.MINOR[+PTX]; PyTorch also accepts architecture-
specific entries (9.0a, 10.0f), which the H200 image sets and on which DeepSpeed's FusedAdam build failed at step 0
(ValueError: invalid literal for int() with base 10: '0a'). Trainbook hands DeepSpeed the list without the suffixes."""

import importlib
import os

import pytest

from toolkit.third_party import deepspeed_arch_list, import_deepspeed


@pytest.mark.parametrize("given, handed", [
    ("9.0a", "9.0"),
    ("8.0 9.0a+PTX;10.0f", "8.0;9.0+PTX;10.0"),
    (" 9.0a ; 12.0a ", "9.0;12.0"),
])
def test_architecture_specific_entries_lose_their_suffix(given, handed):
    assert deepspeed_arch_list(given) == handed


@pytest.mark.parametrize("given", [None, "", "8.0;9.0+PTX", "7.5 8.6"])
def test_a_list_deepspeed_parses_is_left_alone(given):
    assert deepspeed_arch_list(given) is None


def test_import_deepspeed_hands_it_the_list_it_parses(monkeypatch, capsys):
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a")
    import_deepspeed()
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == "8.0;9.0"
    assert "'8.0;9.0a' handed to DeepSpeed as '8.0;9.0'" in capsys.readouterr().err


def test_deepspeed_builds_for_the_list_it_is_handed(monkeypatch):
    import_deepspeed()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a")
    builder = importlib.import_module("deepspeed.ops.op_builder.fused_adam").FusedAdamBuilder()
    builder.jit_mode = True
    with pytest.raises(ValueError, match="0a"):  # DeepSpeed's own parser, as on the H200
        builder.compute_capability_args()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", deepspeed_arch_list("8.0;9.0a"))
    assert builder.compute_capability_args() == []  # JIT: the list goes to torch's extension builder as it is
