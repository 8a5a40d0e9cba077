"""A user's own models, for real: an nn.Module named by import path, a Hugging Face causal LM built from a config on
both engines and 1 and 2 processes, pretrained weights (a save_pretrained folder, a registered export), LoRA, and
the Azure ML job of a user's module; bad input refused by the CLI in one line before any run directory exists."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from toolkit import config as config_mod
from toolkit.data import corpus as data_mod
from toolkit.ports import free_port_pair
from toolkit.rundir import RunDir
from toolkit.safe_load import load as safe_load

from conftest import PROJECT, cli
from test_checkpoint import CKPT, EVERY, STEPS, assert_log_matches

pytestmark = pytest.mark.slow

LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 128}
HF = ("--set", "model.name=hf", "--set", "model.hf.architecture=llama", "--set", f"model.hf.config={json.dumps(LLAMA)}")
LORA = ("--set", "model.lora.rank=4")  # peft's default targets for llama: q_proj, v_proj

MODULE = textwrap.dedent('''
    """A user's model: bytes in, the loss out, the Hugging Face way (an object with .loss)."""
    import torch.nn as nn
    import torch.nn.functional as F
    from types import SimpleNamespace


    class ByteMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(256, 64)
            self.mix = nn.Linear(64, 64)
            self.head = nn.Linear(64, 256)

        def forward(self, input_ids, labels):
            logits = self.head(F.silu(self.mix(self.emb(input_ids))))
            return SimpleNamespace(loss=F.cross_entropy(logits.reshape(-1, 256), labels.reshape(-1)))


    def build():
        return ByteMLP()
    ''')


def losses(run: RunDir) -> list[float]:
    return [e["loss"] for e in run.events("train")]


def assert_learns(run: RunDir) -> None:
    got = losses(run)
    assert sum(got[-5:]) / 5 < sum(got[:5]) / 5 - 0.5, got


def save_llama(folder, seed: int):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **LLAMA))
    model.save_pretrained(folder)
    return model.eval()


def first_batch_loss(model, run: RunDir, loss_fn) -> float:
    """The loss of ``model`` on the batch the run trained on at step 1 (rank 0), computed the way the trainer does."""
    cfg = run.read_config()
    batch = data_mod.StepBatches(data_mod.load_corpus(cfg), cfg.train.batch_size, cfg.train.seed, 0)[0]
    with torch.no_grad():
        return loss_fn(model, batch).item()


# --- an nn.Module by import path -------------------------------------------------------------------------------------

def test_a_users_module_trains_by_import_path_and_resumes_from_any_folder(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "bytemlp.py").write_text(MODULE)
    run_dir = tmp_path / "run"
    # started from the folder that holds the module, as a user would; killed after step 25
    proc = subprocess.run([sys.executable, "-m", "toolkit", "train", "tiny", "--run-dir", str(run_dir),
                           "--set", "model.name=custom", "--set", "model.factory=bytemlp:build",
                           "--set", "checkpoint.every_steps=10", "--set", "fault.kill_at_step=25"],
                          capture_output=True, text=True, cwd=code, timeout=600)
    run = RunDir(run_dir)
    assert proc.returncode != 0 and run.read_status()["state"] == "killed", proc.stderr[-2000:]
    cfg = run.read_config()
    assert (cfg.model.factory, cfg.model.code_path) == ("bytemlp:build", str(code))

    resumed = cli("resume", str(run_dir))  # from the project folder, where no 'bytemlp' module exists
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert run.read_status()["state"] == "completed"
    assert_learns(run)
    lineage = json.loads(run.lineage_path.read_text())["model"]["code"]
    assert lineage["factory"] == {"import": "bytemlp:build", "file": str(code / "bytemlp.py"),
                                  "sha256": hashlib.sha256(MODULE.encode()).hexdigest()}
    running = [e for e in run.events("status") if e["state"] == "running"]
    assert running[-1]["flops_source"].startswith("estimated as 6 x parameters")


# --- bad input: one line, exit 2, no run directory -------------------------------------------------------------------

@pytest.fixture
def narrow_llama(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **{**LLAMA, "hidden_size": 32})).save_pretrained(
        tmp_path / "narrow")
    return tmp_path / "narrow"


@pytest.mark.parametrize("flags, message", [
    (("--set", "model.name=custom", "--set", "model.factory=json:nothing"),
     "error: model.factory: 'json:nothing' has no attribute 'nothing'; allowed: a name it defines: "),
    (("--set", "model.name=custom", "--set", "model.factory=json:dumps"),
     "error: model.factory: json:dumps raised TypeError"),
    ((*HF, "--set", "model.hf.architecture=lama"),
     "error: model.hf.architecture: 'lama' is not a transformers architecture (close: llama"),
    (("--set", "model.name=hf", "--set", "model.hf.source=."),
     "error: model.hf.source: '/"),
    ((*HF, *LORA, "--set", "model.lora.target_modules=q_prj"),
     "error: model.lora.target_modules: 'q_prj' matches no module of the model; allowed: names (or name suffixes) "
     "of this model's modules: embed_tokens, q_proj, k_proj"),
    ((*HF, "--set", "model.init_from=NARROW"),
     "its tensor model.embed_tokens.weight has shape [256, 32], this model's has [256, 64]"),
], ids=["no-attribute", "factory-raises", "unknown-architecture", "no-config-json", "lora-targets", "shape"])
def test_bad_models_are_refused_in_one_line_before_a_run_directory_exists(tmp_path, narrow_llama, flags, message):
    flags = [f.replace("NARROW", str(narrow_llama)) for f in flags]
    proc = cli("train", "tiny", "--runs-root", str(tmp_path / "runs"), *flags)
    assert proc.returncode == 2 and proc.stderr.startswith("error: model.") and message in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "runs").exists()


# --- a Hugging Face causal LM from a config: both engines, 1 and 2 processes, exact resume ---------------------------

# Both engines and both process counts, at the lowest cost: DDP over torchrun for 2 processes (the DeepSpeed
# launcher's extra processes each import deepspeed), DeepSpeed ZeRO-2 in 1 (the LoRA test below runs it too).
ENGINES = [pytest.param(("--nproc", "2"), id="torch-ddp-2"),
           pytest.param(("--engine", "deepspeed", "--set", "engine.zero_stage=2"), id="deepspeed-zero2-1",
                        marks=pytest.mark.matrix)]


@pytest.mark.parametrize("flags", ENGINES)
def test_an_hf_model_learns_and_resumes_exactly_after_sigkill(tmp_path, finished_runs, flags, rng):
    reference = finished_runs(*CKPT, *HF, *flags)
    assert_learns(reference)
    assert json.loads(reference.lineage_path.read_text())["model"]["hf"] == {"architecture": "llama"}
    status = reference.events("status")[0]
    assert status["flops_source"] == "the hf formula" and status["n_trainable"] == status["n_params"]

    kill_at = rng.randint(EVERY + 1, STEPS - 1)
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), *CKPT, *HF, *flags,
               "--set", f"fault.kill_at_step={kill_at}", "--max-restarts", "1")
    assert proc.returncode == 0, f"kill at {kill_at}: {proc.stderr[-3000:]}"
    run = RunDir(tmp_path / "r")
    assert len(run.events("restart")) == 1
    assert_log_matches(run, reference)


# --- pretrained weights ----------------------------------------------------------------------------------------------

def test_the_first_loss_is_the_pretrained_models_loss_on_the_same_batch(tmp_path):
    from toolkit.train.models.hf import causal_lm_loss

    source = save_llama(tmp_path / "src", seed=7)
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), *HF, "--set", f"model.init_from={tmp_path / 'src'}",
               "--set", "train.log_every=1", "--set", "train.max_steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = RunDir(tmp_path / "r")
    assert losses(run)[0] == pytest.approx(first_batch_loss(source, run, causal_lm_loss), abs=2e-6)
    origin = json.loads(run.lineage_path.read_text())["model"]["init_from"]
    digest = hashlib.sha256((tmp_path / "src" / "model.safetensors").read_bytes()).hexdigest()
    assert origin["kind"] == "save_pretrained" and origin["files"]["model.safetensors"]["sha256"] == digest


def test_a_gpt_starts_from_a_registered_model(tmp_path, finished_runs, ws, monkeypatch):
    from safetensors.torch import load_model

    from toolkit.catalogue.model_registry import register_model
    from toolkit.deploy.export import export_run
    from toolkit.train.models import build_model

    exported = export_run(finished_runs().path, out=tmp_path / "export")
    registered = register_model(ws, exported.path, name="base")
    monkeypatch.setenv("TRAINBOOK_WORKSPACE", str(ws.root))  # where `base` is registered, for the CLI below
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), "--set", "model.init_from=base",
               "--set", "train.log_every=1", "--set", "train.max_steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = RunDir(tmp_path / "r")
    assert run.read_config().model.init_from == str(registered.path), "pinned to the version's snapshot"
    model = build_model(run.read_config().model)
    load_model(model, str(registered.path / "model.safetensors"), strict=False)
    assert losses(run)[0] == pytest.approx(first_batch_loss(model.eval(), run, lambda m, b: m(b["input_ids"],
                                                                                               b["labels"])), abs=2e-6)
    assert json.loads(run.lineage_path.read_text())["model"]["init_from"]["kind"] == "export"


# --- LoRA ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("flags", [pytest.param((), id="torch-1"),
                                   pytest.param(("--engine", "deepspeed", "--set", "engine.zero_stage=2"),
                                                id="deepspeed-zero2-1")])
def test_lora_trains_and_checkpoints_only_the_adapters_and_resumes_exactly(tmp_path, finished_runs, flags, rng):
    from toolkit.deploy.export import load_trained_model

    source = save_llama(tmp_path / "src", seed=3)
    pretrained = ("--set", f"model.init_from={tmp_path / 'src'}", *LORA)
    reference = finished_runs(*CKPT, *HF, *pretrained, *flags)
    status = reference.events("status")[0]
    assert 0 < status["n_trainable"] < status["n_params"] / 20

    # the checkpoint holds the adapters and their optimizer state, nothing of the frozen base
    last = reference.path / "checkpoints" / "step_00000040"
    if not flags:
        weights = safe_load(last / "model.pt")
        assert weights and all(".lora_" in name for name in weights), sorted(weights)[:5]
    else:
        module = safe_load(next((last / "ds").glob("mp_rank_*_model_states.pt")))["module"]
        assert all(".lora_" in name for name in module), sorted(module)[:5]
    assert sum(f.stat().st_size for f in last.rglob("*.pt")) < 200_000

    # only the adapted modules differ from the pretrained model, once the adapters are merged in
    merged, cfg, _ = load_trained_model(reference.path)
    assert type(merged) is type(source)
    changed = {name for name, w in merged.state_dict().items() if not torch.equal(w, source.state_dict()[name])}
    assert changed and all(name.endswith(("q_proj.weight", "v_proj.weight")) for name in changed), changed
    # kept separate on request: the peft model, whose merge is the same model
    kept = tmp_path / "kept"
    shutil.copytree(reference.path, kept)
    (kept / "config.yaml").write_text((kept / "config.yaml").read_text().replace("merge_on_export: true",
                                                                                 "merge_on_export: false"))
    separate, _, _ = load_trained_model(kept)
    assert type(separate).__name__.startswith("PeftModel")
    remerged = separate.merge_and_unload().state_dict()
    assert all(torch.allclose(w, remerged[name]) for name, w in merged.state_dict().items())

    kill_at = rng.randint(EVERY + 1, STEPS - 1)
    proc = cli("train", "tiny", "--run-dir", str(tmp_path / "r"), *CKPT, *HF, *pretrained, *flags,
               "--set", f"fault.kill_at_step={kill_at}", "--max-restarts", "1")
    assert proc.returncode == 0, f"kill at {kill_at}: {proc.stderr[-3000:]}"
    assert_log_matches(RunDir(tmp_path / "r"), reference)


# --- the Azure ML job of a user's module -----------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::marshmallow.warnings.Marshmallow4Warning")
def test_the_azure_job_uploads_the_users_package_and_trains_from_the_mounted_copy(tmp_path, monkeypatch):
    from azure.ai.ml import load_job

    from toolkit.azure.plan import build_plan, write_plan

    package = tmp_path / "code" / "mymodels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from .bytes import build\n")
    (package / "bytes.py").write_text(MODULE)
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "bytes.cpython-311.pyc").write_bytes(b"compiled")
    monkeypatch.chdir(tmp_path / "code")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    cfg = config_mod.load("tiny", ["model.name=custom", "model.factory=mymodels:build", "train.max_steps=6"])
    plan = write_plan(build_plan(cfg, compute="cpu-smoke", sku="Standard_D4s_v3", instance_count=1), tmp_path / "plan")
    assert sorted(p.relative_to(plan / "model-code").as_posix() for p in (plan / "model-code").rglob("*")) == [
        "mymodels", "mymodels/__init__.py", "mymodels/bytes.py"]
    job = load_job(plan / "job.yaml")
    assert job.command.endswith("--set model.code_path=${{inputs.model_code}}")
    assert job.inputs["model_code"].type == "uri_folder"

    # what each rank of the job runs, with the input mounted at another path and the user's folder out of reach
    mounted = tmp_path / "mnt" / "model_code"
    mounted.parent.mkdir()
    (plan / "model-code").rename(mounted)
    run_dir = tmp_path / "outputs" / "run"
    proc = subprocess.run([sys.executable, "-m", "toolkit.runs.job", str(run_dir), "--config",
                           str(plan / "trainbook-config.yaml"), "--set", f"model.code_path={mounted}", "--nnodes", "1",
                           "--master-port", str(free_port_pair())], capture_output=True, text=True, cwd=PROJECT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code = json.loads((run_dir / "lineage.json").read_text())["model"]["code"]
    assert code["factory"] == {"import": "mymodels:build", "file": str(mounted / "mymodels" / "bytes.py"),
                               "sha256": hashlib.sha256(MODULE.encode()).hexdigest()}
    assert code["code_path"] == str(mounted)


@pytest.mark.filterwarnings("ignore::marshmallow.warnings.Marshmallow4Warning")
def test_the_azure_plan_uploads_pretrained_weights_and_refuses_links_and_keys_in_model_code(tmp_path, monkeypatch):
    from azure.ai.ml import load_job

    from toolkit.azure import AzureError
    from toolkit.azure.plan import build_plan, write_plan

    save_llama(tmp_path / "src", seed=1)
    monkeypatch.chdir(tmp_path)
    cfg = config_mod.load("tiny", [a for a in HF if a != "--set"] + ["model.init_from=src", *LORA[1:]])
    plan = write_plan(build_plan(cfg, compute="cpu-smoke", sku="Standard_D4s_v3", instance_count=1), tmp_path / "plan")
    job = load_job(plan / "job.yaml")
    assert job.command.endswith("--set model.init_from=${{inputs.init_from}}")
    assert (job.inputs["init_from"].type, job.inputs["init_from"].path) == ("uri_folder", str(tmp_path / "src"))

    package = tmp_path / "code" / "leaky"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    custom = config_mod.load("tiny", ["model.name=custom", "model.factory=leaky:build"])
    (package / "deploy.pem").write_text("a private key")
    with pytest.raises(AzureError, match=r"secret-looking files: .*leaky/deploy.pem \(a private key or certificate\)"):
        build_plan(custom, compute="cpu-smoke", sku="Standard_D4s_v3", instance_count=1)
    (package / "deploy.pem").unlink()
    (package / "data").symlink_to("/etc")
    with pytest.raises(AzureError, match=r"holds leaky/data, a symbolic link"):
        build_plan(custom, compute="cpu-smoke", sku="Standard_D4s_v3", instance_count=1)
