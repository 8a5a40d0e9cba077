"""A run directory or an export from elsewhere is data: neither export nor serving imports the code a config.yaml
names (a custom model's factory writes a file here, so running it would show)."""

from __future__ import annotations

import pytest
import yaml

from toolkit import config as config_mod
from toolkit.deploy.export import ExportError, load_trained_model
from toolkit.deploy.serving.runtimes import TorchRuntime
from toolkit.rundir import RunDir

PLANTED = '''
from pathlib import Path
Path(__file__).with_name("ran").write_text("the factory ran")

def build():
    raise SystemExit("never")
'''


@pytest.fixture
def planted(tmp_path):
    (tmp_path / "evil.py").write_text(PLANTED)
    return config_mod.load("tiny", ["model.name=custom", f"model.factory={tmp_path / 'evil.py'}:build"])


def test_export_refuses_a_custom_model_before_importing_its_factory(tmp_path, planted):
    run = RunDir.create(tmp_path / "run", planted)
    with pytest.raises(ExportError, match=r"^model.name: 'custom' in .* cannot be exported yet; allowed: gpt, "
                                          r"digits_mlp, hf$"):
        load_trained_model(run.path)
    assert not (tmp_path / "ran").exists()


def test_the_torch_runtime_builds_only_built_ins_from_an_exports_config(tmp_path, planted):
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(planted.to_dict()))
    with pytest.raises(ValueError, match=r"^model: 'custom' in .* is not a built-in model this runtime builds; "
                                         r"allowed: gpt, digits_mlp$"):
        TorchRuntime(folder)
    assert not (tmp_path / "ran").exists()
