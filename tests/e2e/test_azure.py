"""Azure ML plans and submission, offline: every written YAML loads back through azure-ai-ml's own loaders with
the planned values, bad input is one line naming the field with nothing written, and submission fails in
seconds with a plain message when config.json or credentials are missing. No Azure cloud is reachable here."""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import BIGRAM_MODEL, PROJECT, cli
from toolkit import config
from toolkit.cli import main
from toolkit.azure import AzureError, code_upload, connection
from toolkit.azure import submit as submit_mod
from toolkit.azure.plan import build_plan, write_plan
from toolkit.azure.skus import SKUS, get_sku
from toolkit.errors import UserError
from toolkit.resources import drift
from toolkit.runs import job as job_entry

# azure-ai-ml 1.35.2's schemas warn about marshmallow 4 hundreds of times per load; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::marshmallow.warnings.Marshmallow4Warning")

SUBSCRIPTION = "12345678-aaaa-bbbb-cccc-1234567890ab"  # looks real, is not; must never appear unmasked
MASKED = "1234…90ab"
DEEPSPEED = ["engine.name=deepspeed", "engine.zero_stage=2"]
IB_SKU = "Standard_ND96asr_v4"
# Credentials the default chain could find on a developer machine; the no-credentials tests remove them all.
CREDENTIAL_VARS = ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET", "AZURE_CLIENT_CERTIFICATE_PATH",
                   "AZURE_USERNAME", "AZURE_PASSWORD", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_TOKEN_CREDENTIALS",
                   *connection.MANAGED_IDENTITY_VARS)


@pytest.fixture
def pydoc_asset():
    from toolkit.data.builtin import BUILTINS
    from toolkit.catalogue.workspace import Workspace

    return BUILTINS["pydoc"](Workspace.open(None))


@pytest.fixture
def workspace_config(tmp_path) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"subscription_id": SUBSCRIPTION, "resource_group": "rg-train",
                                "workspace_name": "ws-train"}))
    return path


@pytest.fixture
def no_credentials(tmp_path, monkeypatch):
    """An environment in which DefaultAzureCredential can find nothing: no variables, an empty home and az config."""
    for name in CREDENTIAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AZURE_CONFIG_DIR", str(tmp_path / "home" / ".azure"))


@pytest.fixture
def cpu_plan(tmp_path) -> Path:
    cfg = config.load("tiny")
    return write_plan(build_plan(cfg, compute="cpu-smoke", sku="Standard_D4s_v3", instance_count=1),
                      tmp_path / "cpu-plan")


def _leftovers(folder: Path) -> list[str]:
    """Staging folders a plan left beside its --out (toolkit.fsio names them .NAME.<hex>.tmp or .old)."""
    return [p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith((".tmp", ".old"))]


# --- plans round-trip through the SDK -------------------------------------------------------------------------


def test_an_elastic_plan_runs_each_node_with_a_range_of_nodes_and_needs_epochs_sampling(tmp_path):
    from azure.ai.ml import load_job

    cfg = config.load("tiny", ["data.sampling=epochs"])
    plan = build_plan(cfg, compute="gpu-a100", sku=IB_SKU, instance_count=4, low_priority=True, elastic_min_nodes=2)
    out = write_plan(plan, tmp_path / "plan")
    job = load_job(out / "job.yaml")
    assert " --nnodes 2:4 --max-restarts 3 " in job.command and job.resources.instance_count == 4
    assert "Elastic (`--elastic-min-nodes 2`): each node runs `--nnodes 2:4`" in (out / "submit.md").read_text()
    with pytest.raises(AzureError, match="data.sampling: 'random' draws each step's rows by step and replica"):
        build_plan(config.load("tiny"), compute="gpu-a100", sku=IB_SKU, instance_count=4, elastic_min_nodes=2)
    with pytest.raises(AzureError, match=r"--elastic-min-nodes: 5 is not allowed; allowed: 1 to --instance-count \(4\)"):
        build_plan(cfg, compute="gpu-a100", sku=IB_SKU, instance_count=4, elastic_min_nodes=5)
    fixed = write_plan(build_plan(cfg, compute="gpu-a100", sku=IB_SKU, instance_count=4, low_priority=True),
                       tmp_path / "fixed")
    assert "(`--elastic-min-nodes`, with `data.sampling: epochs`)" in (fixed / "submit.md").read_text()



@pytest.mark.parametrize("overrides", [[], DEEPSPEED], ids=["torch", "deepspeed"])
def test_plan_files_load_back_through_the_sdk_with_the_planned_values(tmp_path, pydoc_asset, overrides):
    from azure.ai.ml import PyTorchDistribution, load_compute, load_data, load_environment, load_job
    from azure.ai.ml._schema.job.command_job import CommandJobSchema
    from azure.ai.ml.entities import TensorBoardJobService

    cfg = config.load("tiny", ["data.asset=pydoc", *overrides])
    plan = build_plan(cfg, compute="gpu-a100", sku=IB_SKU, instance_count=2, max_nodes=4, low_priority=True)
    out = write_plan(plan, tmp_path / "plan")
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["compute.yaml", "data.yaml", "environment.yaml", "environment.yml", "job.yaml", "submit.md",
         "trainbook-config.yaml"] + (["deepspeed_config.json"] if overrides else []))

    compute = load_compute(out / "compute.yaml")
    assert (compute.name, compute.size, compute.min_instances, compute.max_instances) == ("gpu-a100", IB_SKU, 0, 4)
    assert (compute.tier, compute.idle_time_before_scale_down) == ("low_priority", 1800)

    env = load_environment(out / "environment.yaml")
    assert env.image.startswith("mcr.microsoft.com/azureml/curated/acpt-pytorch-")
    assert env.conda_file["dependencies"][:2] == ["python=3.11", "pip"]  # environment.yml, resolved beside it
    assert (out / "environment.yml").read_bytes() == (PROJECT / "environment.yml").read_bytes()
    assert env.version == plan.environment.version
    image_pins = dict(spec.split("==") for spec in env.conda_file["dependencies"][2]["pip"])
    locked = drift.locked_versions(PROJECT / "constraints.txt")
    assert {"torch", "deepspeed", "azure-ai-ml", "azure-core", "onnxruntime"} <= set(image_pins)
    assert {name: version for name, version in image_pins.items() if locked[name] != version} == {}, "the lock's"

    data = load_data(out / "data.yaml")
    assert (data.name, data.version, data.type) == ("pydoc", str(pydoc_asset.version), "uri_file")
    assert Path(data.path) == pydoc_asset.path and Path(data.path).is_file()
    assert data.tags["sha256"] == pydoc_asset.sha256

    job = load_job(out / "job.yaml")
    # one entry per node, which starts the node's 8 ranks (all the A100s of the size) and restarts them itself
    assert job.command == job_entry.command_line("${{outputs.runs}}/tiny", config="${{inputs.config}}", nnodes=2,
                                                 max_restarts=3, gpus_per_node=8,
                                                 sets={"data.path": "${{inputs.data}}"}, tensorboard_link="tensorboard")
    assert (" --nnodes 2 --max-restarts 3 --gpus-per-node 8 --tensorboard-link tensorboard "
            "--set data.path=${{inputs.data}}") in job.command
    assert f"\ncommand: {job.command}\n" in (out / "job.yaml").read_text(), "one line, as it runs"
    assert job.compute == "gpu-a100" and Path(job.code) == PROJECT
    assert job.environment == f"trainbook:{plan.environment.version}"  # the loader drops "azureml:"
    assert isinstance(job.distribution, PyTorchDistribution)
    assert job.distribution.process_count_per_instance == 1
    runs = job.outputs["runs"]._data
    assert (runs.type, runs.mode, runs.path) == (
        "uri_folder", "rw_mount", "azureml://datastores/workspaceblobstore/paths/trainbook/runs/")
    assert job.display_name == "tiny" and job.tags["run_name"] == "tiny"
    assert submit_mod.run_location(submit_mod.load_plan(out).job) == (
        "azureml://datastores/workspaceblobstore/paths/trainbook/runs/tiny/"), "what submit says"
    # azure-ai-ml has no retry setting for command jobs (parallel jobs only): resubmitting the plan resumes instead.
    # When one appears, set it in entities.job and here.
    assert "retry_settings" not in CommandJobSchema(context={"base_path": out}).fields
    assert job.resources.instance_count == 2 and job.resources.shm_size == "16g"
    assert job.environment_variables["NCCL_IB_PCI_RELAXED_ORDERING"] == "1"
    assert job.environment_variables["UCX_IB_PCI_RELAXED_ORDERING"] == "on"
    assert job.environment_variables["NCCL_TOPO_FILE"] == "/opt/microsoft/ndv4-topo.xml"
    assert job.environment_variables["NCCL_SOCKET_IFNAME"] == "eth0"
    config_input, data_input = job.inputs["config"]._data, job.inputs["data"]._data
    assert config_input.type == "uri_file"
    assert (Path(job.base_path) / config_input.path).resolve() == out / "trainbook-config.yaml"
    assert (data_input.type, data_input.path, data_input.mode) == ("uri_file", "pydoc:1", "ro_mount")
    board = job.services["tensorboard"]
    assert set(job.services) == {"tensorboard"} and isinstance(board, TensorBoardJobService)
    assert board.log_dir == "tensorboard"  # the job entry links it to the run's tb/

    job_cfg = config.load(out / "trainbook-config.yaml")  # the job's config is a valid Trainbook config
    assert (job_cfg.data.asset, job_cfg.data.workspace) == ("", "")
    assert (job_cfg.engine.name, job_cfg.engine.zero_stage, job_cfg.engine.nproc) == (
        cfg.engine.name, cfg.engine.zero_stage, 8)
    submit_md = (out / "submit.md").read_text()
    for step in ("az ml compute create -f compute.yaml", "az ml environment create -f environment.yaml",
                 "az ml data create -f data.yaml", "az ml job create -f job.yaml --stream"):
        assert step in submit_md
    assert "no SSH, hostfile or" in submit_md and "world size 16" in submit_md
    assert "`azureml://datastores/workspaceblobstore/paths/trainbook/runs/tiny/` on datastore" in submit_md
    assert "Submitting this plan again resumes the run" in submit_md and "`--run-name tiny`" in submit_md
    assert "refused when the job starts, naming the first field that differs" in submit_md
    assert "up to 3 time(s)" in submit_md and "retry_settings" in submit_md
    assert ("run          azureml://datastores/workspaceblobstore/paths/trainbook/runs/tiny/ (shared by the nodes; "
            "submitting this plan again resumes it); up to 3 restart(s) inside the job") in plan.summary()
    assert "offload" not in plan.summary(), "no offload planned, none shown"
    assert _leftovers(tmp_path) == []


def test_sizes_without_infiniband_get_no_infiniband_settings_and_cpu_sizes_run_engine_nproc():
    one_gpu = build_plan(config.load("tiny"), compute="gpu-one", sku="Standard_NC24ads_A100_v4", instance_count=1)
    env = one_gpu.job.environment_variables
    assert env["NCCL_DEBUG"] == "WARN" and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert not [name for name in env if "IB" in name or name == "NCCL_TOPO_FILE"]
    assert one_gpu.job.distribution.process_count_per_instance == 1 and one_gpu.world_size == 1

    fewer = build_plan(config.load("tiny"), compute="gpu-a", sku=IB_SKU, instance_count=2, gpus_per_node=4)
    assert fewer.processes_per_node == 4 and fewer.world_size == 8  # fewer GPUs than the node has is allowed

    cpu = build_plan(config.load("tiny", ["engine.nproc=2"]), compute="cpu-a", sku="standard_d4s_v3",
                     instance_count=3)
    assert cpu.sku.name == "Standard_D4s_v3"  # any case in, Azure's spelling out
    assert cpu.job.environment_variables == {} and cpu.job.resources.shm_size == "4g"
    assert cpu.job.distribution.process_count_per_instance == 1 and cpu.job.resources.instance_count == 3
    assert cpu.job_cfg.engine.nproc == 2 and cpu.world_size == 6  # each node's entry starts engine.nproc ranks
    assert cpu.job.command == ("python -m toolkit.runs.job ${{outputs.runs}}/tiny --config ${{inputs.config}} "
                               "--nnodes 3 --max-restarts 3 --tensorboard-link tensorboard")  # no data input, no GPU
    assert cpu.data is None and set(cpu.job.inputs) == {"config"}


def test_cli_plan_prints_the_table_writes_the_files_and_never_the_subscription(tmp_path, pydoc_asset,
                                                                               workspace_config):
    out = tmp_path / "plans" / "demo"
    proc = cli("azure", "plan", "tiny", "--set", "data.asset=pydoc", "--set", "engine.name=deepspeed",
               "--compute", "gpu-a100", "--sku", IB_SKU, "--instance-count", "2", "--workspace-config",
               str(workspace_config), "--out", str(out), timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["compute", "job", "image", "data", "run", "services", "code",
                                                   "workspace", "plan"]
    assert "2 node(s) x 8 GPUs = world size 16" in proc.stdout and "pydoc:1" in proc.stdout
    assert lines[-1].endswith(str(out / "submit.md")) and (out / "job.yaml").is_file()
    submit_md = (out / "submit.md").read_text()
    assert "-g rg-train -w ws-train" in submit_md and MASKED in submit_md
    written = "".join(p.read_text() for p in out.iterdir())
    assert SUBSCRIPTION not in proc.stdout + proc.stderr + written
    assert "## Forecast" not in submit_md  # none asked for


def test_a_plan_carries_the_jobs_forecast_into_submit_md(tmp_path, capsys, pydoc_asset):
    out = tmp_path / "plan"
    assert main([*_plan_argv(out, "--set", "data.asset=pydoc"), "--forecast-tokens", "20B"]) == 0, capsys.readouterr()
    submit_md = (out / "submit.md").read_text()
    forecast = submit_md.split("## Forecast (`trainbook forecast`)")[1].split("## What runs")[0]
    assert f"{IB_SKU}  " in forecast and "    2    16" in forecast, forecast  # 2 nodes of 8 GPUs
    assert "tokens: 2e+10, given" in forecast and "Azure's published figure" in forecast
    assert "price (Standard_ND96asr_v4): 27.20 USD per node-hour" in forecast


# --- bad input: one line naming the field, nothing written -------------------------------------------------------

BAD_PLANS = [
    (["--instance-count", "0"], "--instance-count: 0 is not allowed; allowed: 1 or more"),
    (["--instance-count", "-1"], "--instance-count: -1 is not allowed"),
    (["--gpus-per-node", "0"], "--gpus-per-node: 0 is not allowed"),
    (["--gpus-per-node", "9"], "--gpus-per-node: 9 is not allowed on Standard_ND96asr_v4; allowed: 1 to 8"),
    (["--min-nodes", "3", "--max-nodes", "2"], "--min-nodes: 3 is above --max-nodes=2"),
    (["--instance-count", "3", "--max-nodes", "2"], "--instance-count: 3 is above --max-nodes=2"),
    (["--min-nodes", "-1"], "--min-nodes: -1 is not allowed"),
    (["--idle-seconds", "-5"], "--idle-seconds: -5 is not allowed"),
    (["--compute", "1gpu"], "--compute: '1gpu' is not allowed"),
    (["--compute", "ab"], "--compute: 'ab' is not allowed"),
    (["--compute", "gpu-1"], "--compute: 'gpu-1' is not allowed"),
    (["--compute", "gpu_a100"], "--compute: 'gpu_a100' is not allowed"),
    (["--compute", "g" * 25], "--compute: 'ggggg"),
    (["--sku", "Standard_Bogus_v9"], "--sku: 'Standard_Bogus_v9' is not a known VM size; allowed: Standard_NC6s_v3"),
    (["--image", "not an image"], "--image: 'not an image' is not allowed"),
    (["--set", "data.asset=nope"], "data.asset: 'nope' is not registered"),
    (["--set", "data.asset=pydoc:7"], "data.asset: 'pydoc:7' is not registered"),
    (["--run-name", "a/b"], "--run-name: 'a/b' is not allowed; allowed: letters, digits, '_', '-', '.', starting with"),
    (["--run-name", ".."], "--run-name: '..' is not allowed"),
    (["--datastore", "my-store"], "--datastore: 'my-store' is not allowed; allowed: letters, digits and '_'"),
    (["--datastore", ""], "--datastore: '' is not allowed"),
    (["--run-storage", "nfs"], "--run-storage: 'nfs' is not allowed; allowed: datastore or local"),
    (["--run-storage", "local"], "--run-storage: 'local' is not allowed with --instance-count 2, as the other "
                                 "nodes' checkpoint shards would never reach node 0's outputs"),
    (["--max-restarts", "-1"], "--max-restarts: -1 is not allowed; allowed: 0 or more"),
    (["--forecast-tokens", "many"], "--forecast-tokens: 'many' is not allowed"),
    (["--services", "tensorboard,jupyter"], "--services: 'tensorboard,jupyter' names 'jupyter', which is not a "
                                            "service; allowed: a comma-separated list of jupyterlab, vscode, "
                                            "tensorboard, ssh"),
    (["--services", "ssh"], "--services: ssh needs --ssh-public-key FILE"),
]


def _plan_argv(out: Path, *extra: str) -> list[str]:
    """``azure plan tiny`` with a valid GPU plan's flags, any of them replaced or added by ``extra`` pairs."""
    flags = {"--compute": "gpu-a100", "--sku": IB_SKU, "--instance-count": "2",
             **dict(zip(extra[::2], extra[1::2]))}
    return ["azure", "plan", "tiny", *[item for pair in flags.items() for item in pair], "--out", str(out)]


def _refused(capsys, argv: list[str], out: Path) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists() and _leftovers(out.parent) == []
    return err


@pytest.mark.parametrize("extra, message", BAD_PLANS, ids=[" ".join(e) for e, _ in BAD_PLANS])
def test_bad_plan_options_are_refused_naming_the_field(tmp_path, capsys, pydoc_asset, extra, message):
    err = _refused(capsys, _plan_argv(tmp_path / "out", *extra), tmp_path / "out")
    assert message in err


def test_gpus_per_node_is_refused_on_a_cpu_size(tmp_path, capsys):
    out = tmp_path / "out"
    err = _refused(capsys, ["azure", "plan", "tiny", "--compute", "cpu-a", "--sku", "Standard_D4s_v3",
                            "--instance-count", "1", "--gpus-per-node", "1", "--out", str(out)], out)
    assert "--gpus-per-node: 1 is not allowed on Standard_D4s_v3, which has no GPUs" in err
    err = _refused(capsys, ["azure", "plan", "tiny", "--set", "engine.nproc=8", "--compute", "cpu-a", "--sku",
                            "Standard_D4s_v3", "--instance-count", "1", "--out", str(out)], out)
    assert "engine.nproc: 8 is not allowed on Standard_D4s_v3; allowed: 1 to 4" in err


def _ssh_key_pair(folder: Path) -> tuple[Path, Path]:
    """A real ed25519 key pair, as ssh-keygen makes it: (private key file, public key file)."""
    private = folder / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "me@laptop", "-f", str(private)],
                   check=True, capture_output=True, timeout=30)
    return private, folder / "id_ed25519.pub"


def test_a_plan_names_its_run_datastore_restarts_and_debugging_services(tmp_path, capsys):
    from azure.ai.ml import load_job
    from azure.ai.ml.entities import JupyterLabJobService, SshJobService, TensorBoardJobService, VsCodeJobService

    private, public = _ssh_key_pair(tmp_path)
    out = tmp_path / "plan"
    code = main(_plan_argv(out, "--run-name", "exp-7.b", "--datastore", "team_runs", "--max-restarts", "0",
                           "--services", "jupyterlab, vscode,tensorboard,ssh", "--ssh-public-key", str(public)))
    assert code == 0, capsys.readouterr().err
    job = load_job(out / "job.yaml")
    assert job.outputs["runs"]._data.path == "azureml://datastores/team_runs/paths/trainbook/runs/"
    assert job.command.startswith("python -m toolkit.runs.job ${{outputs.runs}}/exp-7.b --config ${{inputs.config}} "
                                  "--nnodes 2 --max-restarts 0 ")
    assert {name: type(service) for name, service in job.services.items()} == {
        "jupyterlab": JupyterLabJobService, "vscode": VsCodeJobService, "tensorboard": TensorBoardJobService,
        "ssh": SshJobService}
    assert job.services["ssh"].ssh_public_keys == public.read_text().strip()
    assert {job.services[name].nodes for name in ("jupyterlab", "vscode", "ssh")} == {"all"}, "any node can hang"
    written = "".join(path.read_text() for path in out.iterdir() if path.is_file())
    secret_line = private.read_text().splitlines()[1]  # base64 of the private key itself
    assert secret_line not in written and "PRIVATE KEY" not in written
    submit_md = (out / "submit.md").read_text()
    assert "`azureml://datastores/team_runs/paths/trainbook/runs/exp-7.b/` on datastore team_runs" in submit_md
    assert "az ml job connect-ssh --name <job name>" in submit_md and "up to 0 time(s)" in submit_md


def test_local_run_storage_keeps_the_run_on_the_one_node(tmp_path):
    from azure.ai.ml import load_job

    plan = build_plan(config.load("tiny"), compute="cpu-a", sku="Standard_D4s_v3", instance_count=1,
                      run_storage="local", max_restarts=1)
    out = write_plan(plan, tmp_path / "plan")
    job = load_job(out / "job.yaml")
    assert job.command == ("python -m toolkit.runs.job outputs/run --config ${{inputs.config}} --nnodes 1 "
                           "--max-restarts 1")
    assert dict(job.outputs) == {} and job.services["tensorboard"].log_dir == "outputs/run/tb"
    assert submit_mod.run_location(job) is None
    assert "run          outputs/run in the job's outputs (node-local, uploaded when the job ends" in plan.summary()
    assert "submitting the plan again starts from step 0" in (out / "submit.md").read_text()
    quiet = build_plan(config.load("tiny"), compute="cpu-a", sku="Standard_D4s_v3", instance_count=1, services=())
    assert not quiet.job.services and "services     none" in quiet.summary()


@pytest.mark.parametrize("extra, message", [
    (["--instance-count", "1", "--run-storage", "local", "--low-priority"],
     "--run-storage: 'local' is not allowed with --low-priority, as a preempted job could never resume (its "
     "checkpoints stay on the node that was taken away); allowed: datastore (the default) with --low-priority"),
    (["--ssh-public-key", "{public}"], "--ssh-public-key: '{public}' is given without ssh in --services"),
    (["--services", "ssh", "--ssh-public-key", "{private}"],
     "--ssh-public-key: '{private}' is a private key; allowed: the public key beside it (the .pub file)"),
    (["--services", "ssh", "--ssh-public-key", "{folder}/nowhere.pub"],
     "--ssh-public-key: '{folder}/nowhere.pub' does not exist"),
    (["--services", "ssh", "--ssh-public-key", "{folder}/notes.txt"],
     "--ssh-public-key: '{folder}/notes.txt' line 1 is not an OpenSSH public key"),
], ids=["low priority + local", "key without ssh", "private key", "missing key", "not a key"])
def test_run_storage_and_ssh_keys_are_checked_before_anything_is_written(tmp_path, capsys, extra, message):
    private, public = _ssh_key_pair(tmp_path)
    (tmp_path / "notes.txt").write_text("ssh-ed25519 not-base64!\n")
    names = {"public": public, "private": private, "folder": tmp_path}
    out = tmp_path / "out"
    flags = [item.format(**names) for item in extra if item != "--low-priority"]
    argv = _plan_argv(out, *flags) + (["--low-priority"] if "--low-priority" in extra else [])
    err = _refused(capsys, argv, out)
    assert message.format(**names) in err
    assert private.read_text().splitlines()[1] not in err, "a private key is never repeated"


@pytest.mark.parametrize("content, message", [
    ('{"subscription_id": "x",\n  "resource_group": }', "is not valid JSON (line 2, column"),
    (json.dumps({"subscription_id": SUBSCRIPTION, "resource_group": "rg"}), "workspace_name: missing in"),
    (json.dumps({"subscription_id": SUBSCRIPTION, "resource_group": "", "workspace_name": "ws"}),
     "resource_group: '' in"),
    (json.dumps({"subscription_id": "not-a-guid-but-long", "resource_group": "rg", "workspace_name": "ws"}),
     "subscription_id: 'not-…long' in"),
    ("[1, 2]", "holds a list, not an object"),
], ids=["malformed", "missing key", "empty key", "not a guid", "not an object"])
def test_bad_config_json_is_refused_naming_the_file_or_key(tmp_path, capsys, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    err = _refused(capsys, _plan_argv(tmp_path / "out", "--workspace-config", str(path)), tmp_path / "out")
    assert message in err and (str(path) in err or "--workspace-config" in err)
    assert "not-a-guid-but-long" not in err  # even a wrong subscription id is only shown masked


def test_missing_config_json_names_the_path_and_how_to_get_one(tmp_path, capsys):
    missing = tmp_path / "nowhere" / "config.json"
    err = _refused(capsys, _plan_argv(tmp_path / "out", "--workspace-config", str(missing)), tmp_path / "out")
    assert str(missing) in err and "download config.json from the Azure ML studio workspace page" in err


def test_unparsable_environment_yml_is_refused_with_its_line(tmp_path, capsys):
    bad = tmp_path / "environment.yml"
    bad.write_text("name: trainbook\ndependencies:\n  - python=3.11\n  pip: [torch]\n")
    err = _refused(capsys, _plan_argv(tmp_path / "out", "--conda-file", str(bad)), tmp_path / "out")
    assert f"--conda-file: '{bad}' is not valid YAML (line 4" in err
    no_deps = tmp_path / "no-deps" / "environment.yml"
    no_deps.parent.mkdir()
    no_deps.write_text("name: trainbook\nchannels: [conda-forge]\n")
    with pytest.raises(AzureError, match="environment.yml' has no dependencies list"):
        build_plan(config.load("tiny"), compute="gpu-a", sku=IB_SKU, instance_count=1, conda_file=no_deps)


# --- the code upload ----------------------------------------------------------------------------------------------


def _project(root: Path) -> Path:
    """A minimal Trainbook-shaped project folder."""
    for rel in ("toolkit/__init__.py", "toolkit/azure/plan.py", "toolkit/configs/tiny.yaml", "pyproject.toml"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("# x\n")
    shutil.copyfile(PROJECT / "environment.yml", root / "environment.yml")
    return root


def _plan_project(root: Path, **kwargs):
    return build_plan(config.load("tiny"), compute="gpu-a", sku=IB_SKU, instance_count=1, project_root=root,
                      **kwargs)


def test_upload_set_is_what_the_sdk_would_upload(tmp_path):
    from azure.ai.ml._utils._asset_utils import get_ignore_file, get_upload_files_from_folder

    root = _project(tmp_path / "proj")
    (root / ".gitignore").write_text("venv/\n*.log\n/outputs/\nnotes/*.tmp\n")
    for rel in ("venv/lib/site.py", "venv/bin/python", "run.log", "sub/deep.log", "outputs/x.bin", "notes/a.tmp",
                "notes/keep.md", "sub/outputs/kept.bin"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    sdk = sorted(dest for _, dest in get_upload_files_from_folder(root, ignore_file=get_ignore_file(root)))
    upload = code_upload.scan(root)
    assert [rel for rel, _ in upload.files] == sdk
    assert "sub/outputs/kept.bin" in sdk and "notes/keep.md" in sdk and "venv/lib/site.py" not in sdk
    assert upload.ignore_file == root / ".gitignore"


def test_a_code_folder_over_the_snapshot_limit_is_refused_with_its_biggest_entries(tmp_path):
    assert code_upload.SNAPSHOT_LIMIT_BYTES == 300 * 10**6
    root = _project(tmp_path / "proj")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(os.urandom(2 * 10**6))
    with pytest.raises(AzureError) as caught:
        _plan_project(root, code_limit_bytes=10**6)
    message = str(caught.value)
    assert message.startswith(f"code: '{root}' would upload 2.0 MB in 6 files, over the 1 MB snapshot limit")
    assert "biggest: data/ 2.0 MB" in message and ".gitignore" not in message and ".amlignore" in message
    with pytest.raises(AzureError, match="would upload 6 files, over the 5-file snapshot limit"):
        _plan_project(root, code_limit_files=5)
    (root / ".amlignore").write_text("data/\n")
    assert _plan_project(root, code_limit_bytes=10**6).code.total_bytes < 10**6  # ignoring it is the way out


def test_files_the_job_needs_dropped_by_an_ignore_file_are_named_with_the_ignore_file(tmp_path):
    root = _project(tmp_path / "proj")
    (root / ".gitignore").write_text("*.log\n")
    (root / ".amlignore").write_text("configs/\n*.toml\ntoolkit/azure/\n")  # .amlignore wins over .gitignore
    with pytest.raises(AzureError) as caught:
        _plan_project(root)
    message = str(caught.value)
    assert f"code: {root / '.amlignore'} drops files the job needs: " in message
    assert "pyproject.toml, toolkit/azure/plan.py, toolkit/configs/tiny.yaml" in message
    with pytest.raises(AzureError, match="has no toolkit/__init__.py"):
        _plan_project(tmp_path)  # not a project folder at all


def _project_copy(dest: Path) -> Path:
    """This project as a clone holds it (what .gitignore leaves out is not copied), with its own .amlignore."""
    shutil.copytree(PROJECT, dest, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.egg-info", "runs",
                                                                 "outputs", ".trainbook", ".pytest_cache", "results",
                                                                 ".ipynb_checkpoints", "build"))
    return dest


def _notebook_secrets(root: Path) -> list[str]:
    """What running the notebooks from notebooks/ (JupyterLab's kernel folder) leaves there: a workspace with an
    endpoint key, made by the real code, and the Azure ML config.json downloaded beside them."""
    from toolkit.deploy.serving.endpoint import endpoint_key
    from toolkit.catalogue.workspace import Workspace

    workspace = Workspace.open(root / "notebooks" / ".trainbook")
    endpoint_key(workspace.root / "endpoints" / "demo")
    for folder in ("notebooks", ".azureml"):
        (root / folder).mkdir(exist_ok=True)
        (root / folder / "config.json").write_text(json.dumps({"subscription_id": SUBSCRIPTION,
                                                                "resource_group": "rg", "workspace_name": "ws"}))
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
                  and (".trainbook" in p.parts or ".azureml" in p.parts or p.name == "config.json"))


def test_the_project_upload_leaves_out_workspaces_and_azure_config_at_any_depth(tmp_path):
    root = _project_copy(tmp_path / "proj")
    planted = _notebook_secrets(root)
    assert "notebooks/.trainbook/endpoints/demo/key" in planted and "notebooks/config.json" in planted
    uploaded = {rel for rel, _ in _plan_project(root).code.files}
    assert "notebooks/05_deployment.ipynb" in uploaded and "toolkit/azure/code_upload.py" in uploaded
    assert sorted(uploaded & set(planted)) == []


def _advice(message: str) -> list[str]:
    """The ignore lines a refusal says to add ("add 'a', '/b/'; a line without ...")."""
    return [rule.strip(" '") for rule in message.split("(add ")[1].split("; a line without")[0].split(",")]


def test_secret_looking_files_that_would_be_uploaded_are_named_and_refused(tmp_path):
    from toolkit.deploy.serving.endpoint import endpoint_key
    from toolkit.catalogue.workspace import Workspace

    root = _project_copy(tmp_path / "proj")
    for rel in ("notebooks/deploy.pem", "notebooks/.env", "id_rsa", "configs/.env.local"):
        (root / rel).parent.mkdir(exist_ok=True)  # configs/: any folder of the project, not only notebooks/
        (root / rel).write_text("secret")
    workspace = Workspace.open(root / "scratch" / "ws")  # TRAINBOOK_WORKSPACE=scratch/ws: not named .trainbook
    endpoint_key(workspace.root / "endpoints" / "demo")
    with pytest.raises(AzureError) as caught:
        _plan_project(root)
    message = str(caught.value)
    assert message.startswith(f"code: '{root}' would upload secret-looking files: configs/.env.local (an environment "
                              "file (often holds credentials)), id_rsa (an SSH key), notebooks/.env (an environment")
    assert "notebooks/deploy.pem (a private key or certificate)" in message
    assert "scratch/ws/catalogue.sqlite (a Trainbook workspace" in message
    assert "scratch/ws/endpoints/demo/key (a Trainbook workspace" in message and "'/scratch/ws/'" in message
    assert "allowed: exclude them in .amlignore (add " in message and "or move them out of the project" in message
    with (root / ".amlignore").open("a") as ignore:
        ignore.write("\n".join(_advice(message)) + "\n")
    uploaded = {rel for rel, _ in _plan_project(root).code.files}  # the advice is enough
    assert not [rel for rel in uploaded if rel.startswith("scratch/") or rel.endswith((".pem", ".env", "id_rsa"))]


def test_an_upload_filtered_by_gitignore_is_checked_for_secrets_too(tmp_path):
    root = _project(tmp_path / "proj")
    (root / ".gitignore").write_text("venv/\n")
    _notebook_secrets(root)
    (root / "toolkit" / "configs" / "config.json").write_text(json.dumps({"lr": 0.1}))  # config.json of other things: data
    with pytest.raises(AzureError) as caught:
        _plan_project(root)
    message = str(caught.value)
    assert ".azureml/config.json (Azure ML's config folder)" in message
    assert "notebooks/.trainbook/endpoints/demo/key (a Trainbook workspace (endpoint keys, catalogue, data))" in message
    assert "notebooks/config.json (an Azure ML workspace config with a subscription_id)" in message
    assert "configs/config.json" not in message and SUBSCRIPTION not in message
    assert "exclude them in .gitignore (add '.azureml/', '.trainbook/', 'config.json'; a line without" in message



# --- the code upload: secrets by content and by name, links out of the project --------------------------------------
# These plan from a copy of this project (build_plan with the copy as project_root, what `trainbook azure plan` run
# there calls), in this process: azure-ai-ml, which the scan uses, takes seconds to import in a new one. The CLI runs
# it as a user does, from the copy (that copy's toolkit plans, and that copy is what it would upload), in
# test_the_cli_refuses_an_upload_in_one_line_and_writes_no_plan and test_ordinary_files_and_links_inside_the_project_still_upload.
# What a test plants is removed after it (the copy is shared).

STORAGE_KEY = base64.b64encode(bytes(range(64))).decode()  # a storage account key's shape: 88 base64 characters
CLIENT_SECRET = "Xy8Q~" + "abcDEF123_" * 3 + "z.-"  # an Entra ID client secret's shape
AWS_KEY_ID, AWS_SECRET = "AKIA" + "Z7" * 8, "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCY" * 2 + "zz"  # AWS's documented shapes
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5" * 3 + "F6g7H8"


def _pem_key(folder: Path) -> str:
    """A real RSA private key in PEM (PKCS#8), as openssl writes it."""
    path = folder / "server.key"
    subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", str(path)],
                   check=True, capture_output=True, timeout=60)
    return path.read_text()


# id: (where it is planted, its content made in a scratch folder, what the refusal says the file holds)
SECRET_CONTENTS = {
    "openssh private key": ("notes/deploy.txt", lambda tmp: _ssh_key_pair(tmp)[0].read_text(),
                            "an OpenSSH private key"),
    "pem private key": ("certs/server.crt", _pem_key, "a PEM private key"),
    "putty private key": ("notes/laptop.txt", lambda _: "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n"
                                                        f"Comment: me\nPublic-Lines: 2\n{STORAGE_KEY}\n",
                          "a PuTTY private key"),
    "storage connection string": ("settings.ini", lambda _: "[storage]\nconn = DefaultEndpointsProtocol=https;"
                                                            f"AccountName=demo;AccountKey={STORAGE_KEY};"
                                                            "EndpointSuffix=core.windows.net\n",
                                  "an Azure connection string with its key"),
    "service bus connection string": ("bus.yaml", lambda _: "conn: Endpoint=sb://demo.servicebus.windows.net/;"
                                                            f"SharedAccessKeyName=root;SharedAccessKey={STORAGE_KEY}\n",
                                      "an Azure connection string with its key"),
    "service principal json": ("azure-sp.json", lambda _: json.dumps({
        "clientId": "00000000-0000-0000-0000-000000000001", "clientSecret": CLIENT_SECRET,
        "subscriptionId": SUBSCRIPTION, "tenantId": "00000000-0000-0000-0000-000000000002"}, indent=2),
        "a client secret beside an Azure subscription id"),
    "client secret in yaml": ("conf/auth.yaml", lambda _: f"tenant: contoso\nclient_secret: {CLIENT_SECRET}\n",
                              "a client secret"),
    "netrc logins": ("notes/hosts.txt", lambda _: f"machine api.example.com\n  login me\n  password {CLIENT_SECRET}\n",
                     "netrc logins (machine ... password)"),
    "git credential store": ("notes/remotes.txt", lambda _: f"https://me:{CLIENT_SECRET}@git.example.com\n",
                             "a URL with a password in it"),
    "aws keys": ("notes/aws.cfg", lambda _: f"[default]\naws_access_key_id = {AWS_KEY_ID}\n"
                                            f"aws_secret_access_key = {AWS_SECRET}\n", "an AWS access key"),
    "github token": ("notes/ci.txt", lambda _: f"token: {GITHUB_TOKEN}\n", "a GitHub token"),
}
SECRET_NAMES = ["prod.env", "configs/.envrc", ".ENV", "ID_RSA", "backup/id_rsa.bak", "id_ed25519_sk", ".netrc",
                "_netrc", ".git-credentials", ".pypirc", "credentials", "certs/client.pfx", "certs/client.p12",
                "keys/laptop.ppk", "notes/api_key.txt", "notes/ApiKey.json", "conf/db-secret.yaml"]
# Ordinary files of a project, whatever their names or words suggest: they must still upload.
ORDINARY = {
    "keyboard.py": "LAYOUT = 'qwerty'\n",
    "monkey.py": "def patch(): ...\n",
    "tokenizer.json": json.dumps({"model": {"type": "BPE", "vocab": {"key": 0, "secret": 1}}}),
    "configs/environment.yml": "name: extra\ndependencies:\n  - pip\n",
    "src/api_keys.py": "import os\n\n\ndef api_key():\n    return os.environ['SERVICE_API_KEY']\n",
    "src/client_secrets.py": "import os\nclient_secret = os.environ['AZURE_CLIENT_SECRET']\n"
                             "credential = ClientSecretCredential(tenant, client, client_secret=client_secret)\n",
    "docs/ssh.md": "A private key starts with `-----BEGIN OPENSSH PRIVATE KEY-----`: never commit one.\n",
    "docs/storage.md": "Put `AccountKey=<your key>` in the connection string (`DefaultEndpointsProtocol=https;...`), "
                       "or `clientSecret: ${{ secrets.SP }}` in CI.\n",
    "docs/remotes.md": "Clone https://github.com/org/repo.git or git@github.com:org/repo.git\n",
    "notes/machine.txt": "machine learning needs a password manager\n",
    "notes/monkey.key.md": "notes on keys\n",
}


@pytest.fixture(scope="module")
def project_copy(tmp_path_factory) -> Path:
    return _project_copy(tmp_path_factory.mktemp("copy") / "proj")


@pytest.fixture
def project(project_copy):
    """The shared copy as the test found it: what it plants is removed after it, and .amlignore restored."""
    root = project_copy

    def entries() -> set[str]:
        return {os.path.join(here, name) for here, dirs, files in os.walk(root) for name in dirs + files}

    before, ignore = entries(), (root / ".amlignore").read_text()
    yield root
    for path in sorted(entries() - before):  # a planted folder sorts before what is in it
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
        elif os.path.isdir(path):
            shutil.rmtree(path)
    (root / ".amlignore").write_text(ignore)


def _plant(root: Path, rel: str, content: str = "harmless\n", link_to: Path | None = None) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(link_to) if link_to else path.write_text(content)
    return path


def _plan_cli(root: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit", "azure", "plan", "tiny", "--compute", "cpu-a", "--sku",
                           "Standard_D4s_v3", "--instance-count", "1", "--out", str(out)], cwd=root,
                          capture_output=True, text=True, timeout=120)


def _upload_refused(root: Path) -> str:
    """The one-line refusal of planning from ``root`` (the CLI prints it after "error: ")."""
    with pytest.raises(AzureError) as refused:
        build_plan(config.load("tiny"), compute="cpu-a", sku="Standard_D4s_v3", instance_count=1, project_root=root)
    err = str(refused.value)
    assert err.startswith(f"code: '{root}' would upload secret-looking files: ") and "\n" not in err, err
    return err


def test_the_cli_refuses_an_upload_in_one_line_and_writes_no_plan(project, tmp_path):
    _plant(project, "keys/id_ed25519")
    proc = _plan_cli(project, tmp_path / "plan")
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
    err = proc.stderr
    assert err.startswith(f"error: code: '{project}' would upload secret-looking files: ") and err.count("\n") == 1
    assert " keys/id_ed25519 (" in err, err
    assert not (tmp_path / "plan").exists()


@pytest.mark.parametrize("case", SECRET_CONTENTS)
def test_files_holding_secrets_are_refused_by_content_whatever_their_name(project, tmp_path, case):
    rel, make, what = SECRET_CONTENTS[case]
    content = make(tmp_path)
    _plant(project, rel, content)
    err = _upload_refused(project)
    assert f"{rel} (holds {what})" in err and f"(add '/{rel}';" in err, err
    assert not [line for line in content.splitlines() if len(line) > 16 and line in err], "never repeats the secret"
    for secret in (STORAGE_KEY, CLIENT_SECRET, AWS_SECRET, GITHUB_TOKEN):
        assert secret not in err


@pytest.mark.parametrize("rel", SECRET_NAMES)
def test_secret_file_names_are_refused_in_any_case_and_with_any_suffix(project, tmp_path, rel):
    _plant(project, rel)
    err = _upload_refused(project)
    name = rel.rpartition("/")[2]
    assert f" {rel} (" in err and f"(add '{name}';" in err, err


# id: (the link, what it leads to under a scratch home, a line added to .amlignore, the name the refusal gives it)
LINKS_OUT = {
    "a file linked to a key": ("notes/readme.txt", ".ssh/id_rsa", None, "notes/readme.txt"),
    "a linked folder": ("data", "backup", None, "data/"),
    "a linked folder .amlignore lists": ("data", "backup", "/data/", "data/"),
    "a linked folder in an ignored folder": ("node_modules/pkg", "backup", "node_modules/", "node_modules/pkg/"),
}


@pytest.mark.parametrize("case", LINKS_OUT)
def test_links_out_of_the_project_are_refused_naming_where_they_lead(project, tmp_path, case):
    """azure-ai-ml follows links (``os.walk(followlinks=True)``) and judges ignore rules by where a linked folder
    leads, so a link is never followed out of the project, listed in .amlignore or not."""
    link, target, ignore_line, shown = LINKS_OUT[case]
    home = (tmp_path / "home").resolve()
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, capture_output=True,
                   timeout=30)
    _plant(home, "backup/readme.txt", key.read_text())  # a harmless name under a linked folder
    if ignore_line:
        with (project / ".amlignore").open("a") as ignore:
            ignore.write(ignore_line + "\n")
    _plant(project, link, link_to=home / target)
    err = _upload_refused(project)
    assert f"{shown} (a link to {home / target}, outside the project" in err, err
    assert "readme.txt (" not in err.replace(f"{link} (", ""), "a linked folder is never walked"
    if shown.endswith("/"):  # Azure ML follows it whatever the ignore file says: no ignore line helps
        assert "(add " not in err and "whatever the ignore file says" in err, err
    else:
        assert f"(add '/{link}';" in err, err


def test_a_link_inside_the_project_is_judged_by_what_it_leads_to(project, tmp_path):
    from toolkit.deploy.serving.endpoint import endpoint_key
    from toolkit.catalogue.workspace import Workspace

    endpoint_key(Workspace.open(project / "notebooks" / ".trainbook").root / "endpoints" / "demo")  # .amlignore'd
    _plant(project, "notes/endpoint.txt", link_to=Path("../notebooks/.trainbook/endpoints/demo/key"))
    err = _upload_refused(project)
    assert ("notes/endpoint.txt (a link to notebooks/.trainbook/endpoints/demo/key, a Trainbook workspace" in err
            and "(add '/notes/endpoint.txt';" in err), err


def test_ordinary_files_and_links_inside_the_project_still_upload(project, tmp_path):
    for rel, content in ORDINARY.items():
        _plant(project, rel, content)
    _plant(project, "notes/latest.md", link_to=Path("../README.md"))
    proc = _plan_cli(project, tmp_path / "plan")
    assert proc.returncode == 0, proc.stderr
    uploaded = {rel for rel, _ in code_upload.scan(project).files}
    assert sorted({*ORDINARY, "notes/latest.md"} - uploaded) == []


MODEL_CODE_HOLES = {  # id: (plant under the code folder, what the refusal says)
    "a key in the package": (lambda code, _: _plant(code, "leaky/settings.txt", f"conn: AccountKey={STORAGE_KEY}\n"),
                             "leaky/settings.txt (holds an Azure connection string with its key)"),
    "a module linked out": (lambda code, tmp: _plant(code, "leaky.py", link_to=_plant(tmp, "home/model.py",
                                                                                       BIGRAM_MODEL)),
                            "leaky.py, a symbolic link"),
}


@pytest.mark.parametrize("case", MODEL_CODE_HOLES)
def test_the_users_model_code_is_judged_like_the_project(tmp_path, case):
    plant, message = MODEL_CODE_HOLES[case]
    code = tmp_path / "code"
    if case == "a key in the package":
        _plant(code, "leaky/__init__.py", BIGRAM_MODEL)
    plant(code, tmp_path)
    cfg = config.load("tiny", ["model.name=custom", "model.factory=leaky:build", f"model.code_path={code}"])
    with pytest.raises(UserError) as refused:
        build_plan(cfg, compute="cpu-a", sku="Standard_D4s_v3", instance_count=1)
    assert message in str(refused.value) and STORAGE_KEY not in str(refused.value), refused.value


# --- plan folders ----------------------------------------------------------------------------------------------


def test_an_earlier_plan_is_replaced_whole_and_a_foreign_folder_is_never_touched(tmp_path):
    out = tmp_path / "plan"
    torch_plan = build_plan(config.load("tiny"), compute="gpu-a", sku=IB_SKU, instance_count=1)
    write_plan(torch_plan, out)
    (out / "data.yaml").write_text("from an older plan that had a data input")
    ds_plan = build_plan(config.load("tiny", DEEPSPEED), compute="gpu-a", sku=IB_SKU, instance_count=1)
    write_plan(ds_plan, out)
    assert not (out / "data.yaml").exists() and "deepspeed" in (out / "trainbook-config.yaml").read_text()
    assert _leftovers(tmp_path) == []
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "mine.txt").write_text("keep")
    with pytest.raises(AzureError, match="--out: .* exists and is not a plan folder"):
        write_plan(ds_plan, foreign)
    assert [p.name for p in foreign.iterdir()] == ["mine.txt"]


@pytest.mark.parametrize("target", ["an earlier plan", "an unrelated folder"])
def test_a_plan_out_that_is_a_link_is_refused_and_its_target_left_whole(tmp_path, capsys, target):
    real = tmp_path / "real"
    if target == "an earlier plan":
        write_plan(build_plan(config.load("tiny"), compute="cpu-a", sku="Standard_D4s_v3", instance_count=1), real)
    else:
        real.mkdir()
        (real / "mine.txt").write_text("keep")
    before = {p.name: p.read_bytes() for p in real.iterdir()}
    link = tmp_path / "plan"
    link.symlink_to(real)
    code = main(["azure", "plan", "tiny", "--compute", "cpu-a", "--sku", "Standard_D4s_v3", "--instance-count", "1",
                 "--out", str(link)])
    err = capsys.readouterr().err
    assert code == 2 and err == (f"error: --out: '{link}' is a symbolic link; allowed: a real folder path (a link is "
                                 "never written through or replaced)\n"), err
    assert link.is_symlink() and os.readlink(link) == str(real), "the link itself is left as it was"
    assert {p.name: p.read_bytes() for p in real.iterdir()} == before, "its target is left whole"
    assert _leftovers(tmp_path) == [], "no staging folder left"


def test_a_plan_out_holding_a_job_yaml_beside_other_files_is_not_replaced(tmp_path, capsys):
    """A job.yaml of one's own (any Azure ML project has one) does not make a folder an earlier plan."""
    mine = tmp_path / "project"
    (mine / "src").mkdir(parents=True)
    (mine / "job.yaml").write_text("command: python train.py\n")
    (mine / "src" / "train.py").write_text("print('years of work')\n")
    code = main(["azure", "plan", "tiny", "--compute", "cpu-a", "--sku", "Standard_D4s_v3", "--instance-count", "1",
                 "--out", str(mine)])
    err = capsys.readouterr().err
    assert code == 2 and f"--out: '{mine}' holds 'src', which a plan folder does not" in err, err
    assert (mine / "src" / "train.py").read_text() == "print('years of work')\n"


# --- connection -------------------------------------------------------------------------------------------------


def test_workspace_ref_masks_the_subscription_everywhere(tmp_path, workspace_config):
    ref = connection.workspace_ref(workspace_config)
    assert (ref.resource_group, ref.workspace_name, ref.source) == ("rg-train", "ws-train", str(workspace_config))
    assert ref.masked() == MASKED
    for text in (repr(ref), str(ref), ref.describe(), f"{ref}"):
        assert SUBSCRIPTION not in text and MASKED in text
    explicit = connection.workspace_ref(subscription_id=SUBSCRIPTION, resource_group="rg", workspace_name="ws")
    assert explicit.source == "arguments" and explicit.subscription_id == SUBSCRIPTION
    with pytest.raises(AzureError, match="--workspace-name: missing"):
        connection.workspace_ref(subscription_id=SUBSCRIPTION, resource_group="rg")
    with pytest.raises(AzureError, match="--workspace-config: given together with --subscription"):
        connection.workspace_ref(workspace_config, subscription_id=SUBSCRIPTION, resource_group="rg",
                                 workspace_name="ws")


def test_config_json_is_found_in_the_current_folder_then_in_dot_azureml(tmp_path, workspace_config):
    nested = tmp_path / "elsewhere"
    (nested / ".azureml").mkdir(parents=True)
    shutil.copyfile(workspace_config, nested / ".azureml" / "config.json")
    assert connection.find_config(cwd=nested) == nested / ".azureml" / "config.json"
    shutil.copyfile(workspace_config, nested / "config.json")
    assert connection.find_config(cwd=nested) == nested / "config.json"
    assert connection.find_config(nested / ".azureml") == nested / ".azureml" / "config.json"  # a folder works
    with pytest.raises(AzureError) as caught:
        connection.find_config(cwd=tmp_path / "empty")
    assert str(tmp_path / "empty" / "config.json") in str(caught.value)
    assert str(tmp_path / "empty" / ".azureml" / "config.json") in str(caught.value)


def test_a_service_principal_that_cannot_sign_in_is_reported_in_seconds(monkeypatch, no_credentials):
    monkeypatch.setenv("AZURE_CLIENT_ID", "00000000-0000-0000-0000-000000000001")
    monkeypatch.setenv("AZURE_TENANT_ID", "00000000-0000-0000-0000-000000000002")
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "not-a-secret")
    start = time.monotonic()
    with pytest.raises(AzureError, match="^credentials: EnvironmentCredential is set up, but"):
        connection.check_credentials()  # offline: unreachable; online: refused; never a token
    assert time.monotonic() - start < connection.CREDENTIAL_TIMEOUT_S + 5


# --- submit ------------------------------------------------------------------------------------------------------


def test_submit_without_config_json_exits_2_with_one_line(tmp_path, cpu_plan, no_credentials):
    start = time.monotonic()
    # Not conftest.cli: the search for config.json starts in the current folder, which must be an empty one.
    proc = subprocess.run([sys.executable, "-m", "toolkit", "azure", "submit", str(cpu_plan)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: --workspace-config: no config.json at ")
    assert str(tmp_path / "config.json") in proc.stderr and "Download config file" in proc.stderr
    assert time.monotonic() - start < 30


def test_submit_without_credentials_exits_2_in_seconds_naming_what_is_missing(cpu_plan, workspace_config,
                                                                              no_credentials):
    start = time.monotonic()
    proc = cli("azure", "submit", str(cpu_plan), "--workspace-config", str(workspace_config), timeout=60)
    elapsed = time.monotonic() - start
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: credentials: none found; run `az login`")
    assert "AZURE_CLIENT_ID" in proc.stderr and SUBSCRIPTION not in proc.stdout + proc.stderr
    assert elapsed < 30, f"took {elapsed:.1f} s"


def test_submit_refuses_a_folder_that_is_not_a_plan(tmp_path, workspace_config, no_credentials):
    proc = cli("azure", "submit", str(tmp_path), "--workspace-config", str(workspace_config), timeout=60)
    assert proc.returncode == 2 and "plan_dir: " in proc.stderr and "missing compute.yaml" in proc.stderr


# --- sizes and imports -------------------------------------------------------------------------------------------


def test_sku_catalogue_has_the_training_sizes_and_names_them_canonically():
    for name in ("Standard_NC6s_v3", "Standard_NC12s_v3", "Standard_NC24s_v3", "Standard_NC24rs_v3",
                 "Standard_ND40rs_v2", "Standard_NC24ads_A100_v4", "Standard_NC48ads_A100_v4",
                 "Standard_NC96ads_A100_v4", "Standard_ND96asr_v4", "Standard_ND96amsr_A100_v4",
                 "Standard_NC40ads_H100_v5", "Standard_ND96isr_H100_v5", "Standard_D4s_v3", "Standard_D16s_v3",
                 "Standard_DS3_v2", "Standard_E16s_v3"):
        assert get_sku(name.upper()).name == name
    assert get_sku("Standard_ND96isr_H100_v5").gpus == 8 and get_sku("Standard_ND96isr_H100_v5").infiniband
    # Azure's naming convention: an "r" (RDMA) among a GPU size's suffix letters means InfiniBand.
    assert all(s.infiniband == ("r" in s.name.split("_")[1][-3:]) for s in SKUS.values() if s.gpus)
    assert all(not s.infiniband and not s.gpu_model for s in SKUS.values() if not s.gpus)


def test_importing_the_azure_package_and_building_the_cli_leaves_the_sdk_unloaded():
    code = ("import sys, toolkit.azure.plan, toolkit.azure.submit, toolkit.cli as m; m.build_parser(); "
            "print(sorted(k for k in sys.modules if k.split('.')[0] == 'azure'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=PROJECT)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


def test_submit_with_a_token_but_no_reachable_workspace_names_the_workspace(cpu_plan, workspace_config):
    from azure.core.credentials import AccessToken, AccessTokenInfo

    from toolkit.azure.submit import submit

    class StaticToken:
        """Stands in for Microsoft Entra ID (unreachable here): a token no service will accept."""

        def get_token(self, *scopes, **kwargs):
            return AccessToken("not-a-token", int(time.time()) + 3600)

        def get_token_info(self, *scopes, **kwargs):
            return AccessTokenInfo("not-a-token", int(time.time()) + 3600)

    lines: list[str] = []
    with pytest.raises(AzureError) as caught:
        submit(cpu_plan, connection.workspace_ref(workspace_config), credential=StaticToken(), log=lines.append)
    message = str(caught.value)
    # Offline: the workspace cannot be reached; online: Azure refuses the token. Nothing was created either way.
    assert message.startswith(("workspace: management.azure.com is unreachable", "credentials: refused by Azure"))
    assert "workspace ws-train in resource group rg-train" in message and SUBSCRIPTION not in message
    assert lines == []


def test_submit_checks_the_code_again_for_secrets_added_after_planning(tmp_path, workspace_config, no_credentials):
    root = _project_copy(tmp_path / "proj")
    plan = write_plan(_plan_project(root), tmp_path / "plan")
    (root / "notebooks" / "deploy.pem").write_text("a key saved after the plan was written")
    proc = cli("azure", "submit", str(plan), "--workspace-config", str(workspace_config), timeout=60)
    assert proc.returncode == 2 and "notebooks/deploy.pem (a private key or certificate)" in proc.stderr, proc.stderr
    assert "credentials" not in proc.stderr, "checked before anything is sent"


def test_a_plan_refuses_a_data_asset_whose_snapshot_changed_since_registration(pydoc_asset):
    snapshot_file = pydoc_asset.path  # a uri_file: the snapshot's one file, a hard link to its blob
    snapshot_file.chmod(0o644)
    snapshot_file.write_bytes(snapshot_file.read_bytes()[:-1] + b"!")  # through the link: the blob changes too
    cfg = config.load("tiny", [f"data.asset={pydoc_asset.ref}"])
    with pytest.raises(AzureError, match=rf"data.asset: {pydoc_asset.ref} does not match its registration"):
        build_plan(cfg, compute="cpu-smoke", sku="Standard_D4s_v3", instance_count=1)


def test_a_users_offload_config_is_refused_on_cpu_sizes_and_carried_by_a_gpu_plan(tmp_path, capsys):
    """transformers' ZeRO-2 example offloads optimizer state to the CPU and leaves fp16 "auto": the plan for a GPU
    size carries both to the job (its config and the merged DeepSpeed config, checked by DeepSpeed's parser); a CPU
    size, where offload means nothing, is refused before anything is written, naming the key."""
    from ds_examples import ZERO2_OFFLOAD

    ds = tmp_path / "ds_config_zero2.json"
    ds.write_text(json.dumps(ZERO2_OFFLOAD))
    cfg = config.load("tiny", ["engine.name=deepspeed", f"engine.deepspeed_config={ds}", "engine.precision=fp16"])
    plan = build_plan(cfg, compute="gpu-a100", sku=IB_SKU, instance_count=2)
    assert "ZeRO stage 2, offload optimizer state to cpu" in plan.summary()
    out = write_plan(plan, tmp_path / "plan")
    merged = json.loads((out / "deepspeed_config.json").read_text())
    assert merged["zero_optimization"]["offload_optimizer"]["device"] == "cpu" and merged["fp16"]["enabled"]
    assert merged["train_batch_size"] == 8 * 2 * 8, "micro batch x 2 nodes x 8 GPUs"
    job_cfg = config.load(out / "trainbook-config.yaml")
    assert job_cfg.engine.deepspeed == ZERO2_OFFLOAD, "the job reads the kept copy, not a file on this machine"
    with pytest.raises(ValueError, match="zero_optimization.offload_optimizer.device: 'cpu' moves state out of GPU"):
        build_plan(cfg, compute="cpu", sku="Standard_D4s_v3", instance_count=1)
    no_offload = dataclasses.replace(cfg, engine=dataclasses.replace(cfg.engine, deepspeed={}, deepspeed_config=""))
    with pytest.raises(ValueError, match="engine.precision: 'fp16' needs a GPU"):
        build_plan(no_offload, compute="cpu", sku="Standard_D4s_v3", instance_count=1)
    assert main(["azure", "plan", "tiny", "--set", "engine.name=deepspeed", "--set", f"engine.deepspeed_config={ds}",
                 "--compute", "cpu", "--sku", "Standard_D4s_v3", "--instance-count", "1",
                 "--out", str(tmp_path / "cpu-plan")]) == 2
    assert "offload_optimizer.device" in capsys.readouterr().err and not (tmp_path / "cpu-plan").exists()
