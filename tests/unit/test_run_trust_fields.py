"""Which config fields act beyond a run (toolkit.trust), and the signature that makes them the user's."""

from __future__ import annotations

import json

import pytest

from toolkit import config as config_mod
from toolkit import trust


def cfg_with(*overrides: str):
    return config_mod.load("tiny", list(overrides))


@pytest.mark.parametrize("overrides, field, effect", [
    (("model.name=custom", "model.factory=evil.py:build"), "model.factory", trust.RUNS_CODE),
    (("model.name=custom", "model.factory=m:build", "model.loss=m:loss"), "model.loss", trust.RUNS_CODE),
    (("model.name=custom", "model.factory=m:build", "model.code_path=/tmp"), "model.code_path", trust.RUNS_CODE),
    (("model.name=hf", "model.hf.source=someone/some-model"), "model.hf.source", trust.REACHES_NETWORK),
    (("tracking.mlflow_uri=http://10.0.0.1:5000",), "tracking.mlflow_uri", trust.REACHES_NETWORK),
    (("debug.enabled=true",), "debug", trust.OPENS_PORT),
    (("data.workspace=/somewhere/new",), "data.workspace", trust.WRITES_OUTSIDE),
])
def test_each_acting_field_is_found_with_its_effect(overrides, field, effect):
    found = trust.acting_values(cfg_with(*overrides))
    assert field in found
    assert f"({effect})" in trust.describe({field: found[field]})


def test_deepspeed_settings_beyond_numbers_precision_and_zero_act():
    cfg = cfg_with()
    plain = {"train_micro_batch_size_per_gpu": 4, "bf16": {"enabled": True}, "optimizer": {"type": "AdamW"},
             "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}
    cfg.engine.deepspeed = plain
    assert trust.acting_values(cfg) == {}
    cfg.engine.deepspeed = {**plain, "wandb": {"enabled": True, "project": "p"},
                            "torch_autocast": {"enabled": True, "lower_precision_safe_modules": ["this.x"]},
                            "flops_profiler": {"enabled": True, "output_file": "/elsewhere/report.txt"},
                            "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"}}}
    assert set(trust.acting_values(cfg)["engine.deepspeed"]) == {
        "wandb", "torch_autocast", "flops_profiler", "zero_optimization.offload_param.nvme_path"}


def test_what_does_not_act_needs_no_signature(tmp_path):
    from toolkit.catalogue.workspace import Workspace

    existing = Workspace.open(tmp_path / "ws").root  # an existing workspace is opened, not made
    plain = cfg_with("tracking.mlflow=never", "debug.enabled=false", f"data.workspace={existing}")
    folder = tmp_path / "model"
    folder.mkdir()
    local_hf = cfg_with("model.name=hf", f"model.hf.source={folder}")  # a folder here, not a hub id
    for cfg in (plain, local_hf):
        assert trust.acting_values(cfg) == {} and trust.untrusted(tmp_path, cfg) == {}
        trust.sign(tmp_path, cfg)
        assert not (tmp_path / trust.TRUST_FILE).exists()


def test_a_signature_covers_exactly_the_values_it_signed(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINBOOK_CONFIG_HOME", str(tmp_path / "me"))
    mine = cfg_with("debug.enabled=true")
    trust.sign(tmp_path, mine)
    assert trust.untrusted(tmp_path, mine) == {}
    assert set(trust.untrusted(tmp_path, cfg_with("debug.enabled=true", "debug.port=5678"))) == {"debug"}  # its port
    changed = cfg_with("debug.enabled=true", "tracking.mlflow_uri=http://10.0.0.1:5000")
    assert set(trust.untrusted(tmp_path, changed)) == {"debug", "tracking.mlflow_uri"}
    assert trust.untrusted(tmp_path, changed, verb="export") == {}  # export acts on neither
    monkeypatch.setenv("TRAINBOOK_CONFIG_HOME", str(tmp_path / "someone-else"))
    assert set(trust.untrusted(tmp_path, mine)) == {"debug"}


def test_a_signature_copied_into_another_run_vouches_for_nothing(tmp_path):
    cfg = cfg_with("debug.enabled=true")
    (tmp_path / "mine").mkdir()
    (tmp_path / "theirs").mkdir()
    trust.sign(tmp_path / "mine", cfg)
    (tmp_path / "theirs" / trust.TRUST_FILE).write_bytes((tmp_path / "mine" / trust.TRUST_FILE).read_bytes())
    assert trust.untrusted(tmp_path / "mine", cfg) == {} and set(trust.untrusted(tmp_path / "theirs", cfg)) == {"debug"}


def test_trust_run_on_export_vouches_only_for_what_export_showed(tmp_path):
    cfg = cfg_with("model.name=hf", "model.hf.source=someone/some-model", "debug.enabled=true")
    with pytest.raises(trust.UntrustedRunError) as refused:
        trust.require(tmp_path, cfg, "export")
    assert "model.hf.source" in str(refused.value) and "debug" not in str(refused.value)
    trust.require(tmp_path, cfg, "export", trust_run=True)  # goes on, once
    assert set(trust.untrusted(tmp_path, cfg, "resume")) == {"model.hf.source", "debug"}


@pytest.mark.parametrize("planted", ["", "{", "[]", '{"hmac_sha256": 5}', '{"hmac_sha256": "00"}', "x" * 10_000])
def test_a_forged_or_broken_signature_is_no_signature(tmp_path, monkeypatch, planted):
    monkeypatch.setenv("TRAINBOOK_CONFIG_HOME", str(tmp_path / "me"))
    cfg = cfg_with("debug.enabled=true")
    trust.sign(tmp_path, cfg_with("tracking.mlflow_uri=http://10.0.0.1:5000"))  # the user has a key
    (tmp_path / trust.TRUST_FILE).write_text(planted)
    with pytest.raises(trust.UntrustedRunError, match=r"debug=\{'enabled': True.*\(opens a port\).*--trust-run"):
        trust.require(tmp_path, cfg, "resume")
    trust.require(tmp_path, cfg, "resume", trust_run=True)  # the user said so: signed from now on
    assert json.loads((tmp_path / trust.TRUST_FILE).read_text())["fields"] == ["debug"]
    trust.require(tmp_path, cfg, "resume")


def test_evaluate_asks_for_what_it_acts_on_a_model_source_and_a_new_workspace_not_code_it_never_runs(tmp_path):
    cfg = cfg_with("model.name=hf", "model.hf.source=someone/some-model", "data.workspace=/somewhere/new",
                   "debug.enabled=true")
    assert set(trust.untrusted(tmp_path, cfg, "evaluate")) == {"model.hf.source", "data.workspace"}
    with pytest.raises(trust.UntrustedRunError) as refused:
        trust.require(tmp_path, cfg, "evaluate")
    assert "`trainbook evaluate RUN_DIR --trust-run`" in str(refused.value)
