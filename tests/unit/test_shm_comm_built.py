"""The doctor's "is DeepSpeed's shm comm op compiled" answer looks where torch's JIT loader builds it: under
TORCH_EXTENSIONS_DIR directly when that is set (import_deepspeed sets it to the venv's), under a per-Python tag otherwise.
It once looked one level too deep and warned "not compiled yet" on every machine `make setup` had prepared."""

from __future__ import annotations

from toolkit.machine import shm_comm_built


def _built(root):
    (root / "deepspeed_shm_comm").mkdir(parents=True)
    (root / "deepspeed_shm_comm" / "deepspeed_shm_comm.so").write_bytes(b"\x7fELF")


def test_an_op_built_under_torch_extensions_dir_is_found(tmp_path):
    assert not shm_comm_built({"TORCH_EXTENSIONS_DIR": str(tmp_path)})
    _built(tmp_path)
    assert shm_comm_built({"TORCH_EXTENSIONS_DIR": str(tmp_path)})


def test_the_default_cache_has_a_python_tag_level(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert not shm_comm_built({})
    _built(tmp_path / ".cache" / "torch_extensions" / "py311_cpu")
    assert shm_comm_built({})
