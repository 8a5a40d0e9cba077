"""Azure ML online endpoint plans and deployment, offline: both YAML files load back through azure-ai-ml's own loaders
with the planned values, every bad input is one line naming the field with nothing written, and deploying fails in
seconds with a plain message when config.json or credentials are missing. No Azure cloud is reachable here.

The model folders are placeholders with the file names of an export (the plan only uploads them), and the project
is a minimal copy with its own toolkit/deploy/serving/score.py, so these tests do not depend on the exporter or the
scoring script being finished."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from conftest import PROJECT, cli
from test_azure import (MASKED, SUBSCRIPTION, _leftovers, _project, _refused, no_credentials,  # noqa: F401
                        workspace_config)
from toolkit.cli import main
from toolkit.azure import AzureError, connection, entities
from toolkit.azure.deploy import deploy, load_deployment_plan
from toolkit.azure.deploy_plan import build_deployment_plan, write_deployment_plan
from toolkit.azure.plan_files import CONDA_COPY
from toolkit.azure.skus import SKUS, get_online_sku

pytestmark = pytest.mark.filterwarnings("ignore::marshmallow.warnings.Marshmallow4Warning")

EXPORT_FILES = ("model.safetensors", "model.onnx", "parity.json", "tokenizer.json", "config.yaml")
SCORE = "def init():\n    pass\n\n\ndef run(raw_data):\n    return raw_data\n"


def _model(folder: Path, config_name: str | None = "tiny", **manifest) -> Path:
    """A model folder shaped like toolkit.deploy.export's (manifest without a name, files with sizes, the run's config
    beside it), with placeholder bytes; ``manifest`` adds or replaces fields (None removes one)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in EXPORT_FILES:
        (folder / name).write_bytes(b"placeholder " + name.encode())
    (folder / "config.yaml").write_text((f"name: {config_name}\n" if config_name else "") + "model:\n  name: gpt\n")
    content = {"format": "trainbook-model-v1", "model": "gpt", "run_dir": "/runs/tiny", "checkpoint": "step_00000040",
               "step": 40, "data": {"name": "pydoc", "sha256": "ab" * 32},
               "files": {name: {"sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest(),
                                "size": (folder / name).stat().st_size} for name in EXPORT_FILES},
               **manifest}
    (folder / "trainbook-model.json").write_text(json.dumps({k: v for k, v in content.items() if v is not None}))
    return folder


@pytest.fixture
def serving(tmp_path, monkeypatch):
    """A project folder with a scoring script (the CLI's default project root too) and an exported model."""
    root = _project(tmp_path / "proj")
    (root / entities.SCORING_SCRIPT).parent.mkdir(parents=True)
    (root / entities.SCORING_SCRIPT).write_text(SCORE)
    monkeypatch.setattr("toolkit.paths.PROJECT_ROOT", root)
    return types.SimpleNamespace(root=root, model=_model(tmp_path / "export" / "model", name="tiny-lm", version=3))


def _plan(serving, model: Path | None = None, **options):
    return build_deployment_plan(model or serving.model, **{"endpoint": "tb-demo", "sku": "Standard_DS3_v2",
                                                            "project_root": serving.root, **options})


@pytest.fixture
def plan_dir(serving, tmp_path) -> Path:
    return write_deployment_plan(_plan(serving), tmp_path / "deploy-plan")


# --- plans round-trip through the SDK ----------------------------------------------------------------------------


@pytest.mark.parametrize("sku, runtime, image", [
    ("Standard_DS3_v2", "onnx", entities.CPU_INFERENCE_IMAGE),
    ("Standard_NC4as_T4_v3", "torch", entities.DEFAULT_IMAGE),
], ids=["cpu-onnx", "gpu-torch"])
def test_deployment_plan_files_load_back_through_the_sdk_with_the_planned_values(tmp_path, serving, sku, runtime,
                                                                                  image):
    from azure.ai.ml import load_online_deployment, load_online_endpoint
    from azure.ai.ml.entities import ManagedOnlineDeployment, ManagedOnlineEndpoint

    plan = _plan(serving, sku=sku, runtime=runtime, instance_count=2, deployment="green", max_batch=32,
                 max_wait_ms=20)
    out = write_deployment_plan(plan, tmp_path / "plan")
    assert sorted(p.name for p in out.iterdir()) == ["deploy.md", "deployment.yaml", "endpoint.yaml",
                                                      "environment.yml"]

    endpoint = load_online_endpoint(out / "endpoint.yaml")
    assert isinstance(endpoint, ManagedOnlineEndpoint) and (endpoint.name, endpoint.auth_mode) == ("tb-demo", "key")
    assert endpoint.tags == {"created_by": "trainbook", "model": "tiny-lm:3", "runtime": runtime}

    deployment = load_online_deployment(out / "deployment.yaml")
    assert isinstance(deployment, ManagedOnlineDeployment)
    assert (deployment.name, deployment.endpoint_name) == ("green", "tb-demo")
    assert (deployment.instance_type, deployment.instance_count) == (sku, 2)
    assert deployment.code_configuration.scoring_script == "toolkit/deploy/serving/score.py"
    assert Path(deployment.code_configuration.code) == serving.root
    model = deployment.model
    assert (Path(model.path), model.type, model.name, model.version) == (serving.model, "custom_model", "tiny-lm", "3")
    assert model.tags == {"format": "trainbook-model-v1", "run_dir": "/runs/tiny", "checkpoint": "step_00000040",
                          "step": "40", "data": '{"name":"pydoc","sha256":"' + "ab" * 32 + '"}'}
    env = deployment.environment
    assert env.image == image and env.version == plan.environment.version and env.name == "trainbook-serving"
    assert env.conda_file["dependencies"][:2] == ["python=3.11", "pip"]  # environment.yml, resolved beside it
    assert (out / CONDA_COPY).read_bytes() == (serving.root / "environment.yml").read_bytes()
    assert deployment.environment_variables == {
        "TRAINBOOK_RUNTIME": runtime, "TRAINBOOK_MAX_BATCH": "32", "TRAINBOOK_MAX_WAIT_MS": "20",
        "WORKER_COUNT": "1", "GUNICORN_CMD_ARGS": "--threads 16", "TRAINBOOK_THREADS": "16",
        "TRAINBOOK_HEADER_TIMEOUT_S": "20.0", "TRAINBOOK_BODY_TIMEOUT_S": "30.0", "TRAINBOOK_REQUEST_TIMEOUT_S": "10.0"}
    settings = deployment.request_settings
    assert settings.max_concurrent_requests_per_instance == entities.SERVER_THREADS == 16  # the server's threads
    assert (settings.request_timeout_ms, settings.max_queue_wait_ms) == (10_000, 500)
    for probe, planned in ((deployment.liveness_probe, entities.LIVENESS_PROBE),
                           (deployment.readiness_probe, entities.READINESS_PROBE)):
        assert {key: getattr(probe, key) for key in planned} == planned
    assert deployment.liveness_probe.success_threshold == 1  # Azure's fixed value for liveness
    assert deployment.liveness_probe.initial_delay >= deployment.readiness_probe.initial_delay

    deploy_md = (out / "deploy.md").read_text()
    for step in ("az ml online-endpoint create -f endpoint.yaml", "az ml online-deployment create -f deployment.yaml "
                 "--all-traffic", "az ml online-endpoint get-credentials -n tb-demo",
                 f"python -m toolkit azure deploy {out}"):
        assert step in deploy_md
    assert "-g <resource-group> -w <workspace-name>" in deploy_md  # no workspace given: placeholders
    assert _leftovers(tmp_path) == []
    loaded = load_deployment_plan(out)  # what `azure deploy` reads, offline
    assert loaded.deployment.name == "green" and loaded.endpoint.name == "tb-demo"


def test_an_export_as_written_is_named_after_its_run_and_azure_ml_numbers_it(tmp_path, serving):
    from azure.ai.ml import load_online_deployment

    for folder, name in ((_model(tmp_path / "exported"), "tiny"),  # toolkit.deploy.export's manifest: no name, no version
                         (_model(tmp_path / "nameless", config_name=None), "gpt"),  # no run name: the model's
                         (_model(tmp_path / "zero", version=0, description="my tiny model"), "tiny")):
        out = write_deployment_plan(_plan(serving, folder), tmp_path / f"plan-{folder.name}")
        model = load_online_deployment(out / "deployment.yaml").model
        assert (model.name, model.version) == (name, None)
        assert f"{name} (unregistered export)" in (out / "deploy.md").read_text()
    assert model.description == "my tiny model"


def test_a_registered_model_reference_resolves_through_the_local_registry(tmp_path, serving, monkeypatch):
    snapshot = _model(tmp_path / "registry" / "snapshot")
    asked: list[str] = []

    def get_model(ws, ref):
        asked.append(ref)
        if ref != "demo:2":
            raise LookupError(f"model: {ref!r} is not registered; registered: demo:2")
        return types.SimpleNamespace(path=snapshot, name="demo", version=2, description="registered demo")

    monkeypatch.setitem(sys.modules, "toolkit.catalogue.model_registry", types.SimpleNamespace(get_model=get_model))
    plan = _plan(serving, "demo:2")
    assert plan.model.path == snapshot and asked == ["demo:2"]
    model = plan.deployment.model  # the Azure ML model mirrors the local registration
    assert (model.name, model.version, model.description) == ("demo", "2", "registered demo")
    with pytest.raises(AzureError, match=r"^MODEL: 'demo:9' is not registered"):
        _plan(serving, "demo:9")
    monkeypatch.setitem(sys.modules, "toolkit.catalogue.model_registry", None)  # no registry: only folders
    with pytest.raises(AzureError, match=r"^MODEL: folder 'demo:2' does not exist; allowed: a model folder"):
        _plan(serving, "demo:2")


def test_a_model_registered_in_the_local_workspace_deploys_under_its_name_and_version(tmp_path, serving):
    registry = pytest.importorskip("toolkit.catalogue.model_registry")
    from toolkit.catalogue.workspace import Workspace

    registered = registry.register_model(Workspace.open(None), _model(tmp_path / "exported"))
    plan = _plan(serving, registered.ref)
    assert plan.model.path == Path(registered.path).resolve()
    assert (plan.deployment.model.name, plan.deployment.model.version) == (registered.name, str(registered.version))


# --- the CLI ---------------------------------------------------------------------------------------------------


def test_cli_deploy_plan_prints_the_table_writes_the_files_and_never_the_subscription(tmp_path, serving, capsys,
                                                                                     workspace_config):
    out = tmp_path / "plans" / "serve"
    code = main(["azure", "deploy-plan", str(serving.model), "--endpoint", "tb-demo", "--sku", "standard_f4s_v2",
                 "--runtime", "torch", "--max-batch", "8", "--workspace-config", str(workspace_config),
                 "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0 and captured.err == "", captured.err
    lines = captured.out.splitlines()
    assert [line.split()[0] for line in lines] == ["endpoint", "deployment", "model", "runtime", "image", "code",
                                                   "workspace", "plan"]
    assert "1 x Standard_F4s_v2" in captured.out and "batches of up to 8 requests" in captured.out
    assert lines[-1].endswith(str(out / "deploy.md"))
    deploy_md = (out / "deploy.md").read_text()
    assert "-g rg-train -w ws-train" in deploy_md and MASKED in deploy_md
    assert f"--workspace-config {workspace_config}" in deploy_md
    written = "".join(p.read_text() for p in out.iterdir())
    assert SUBSCRIPTION not in captured.out + captured.err + written


def test_cli_deploy_plan_on_the_real_project(tmp_path, workspace_config):
    """`python -m toolkit azure deploy-plan` as typed, on this project's own code upload: it plans once
    toolkit/deploy/serving/score.py exists, and until then says exactly that it is missing, writing nothing."""
    model, out = _model(tmp_path / "model"), tmp_path / "plan"
    proc = cli("azure", "deploy-plan", str(model), "--endpoint", "tb-demo", "--sku", "Standard_DS3_v2",
               "--workspace-config", str(workspace_config), "--out", str(out), timeout=120)
    assert "Traceback" not in proc.stderr and SUBSCRIPTION not in proc.stdout + proc.stderr
    if (PROJECT / entities.SCORING_SCRIPT).is_file():
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines()[-1].endswith(str(out / "deploy.md"))
        assert SUBSCRIPTION not in "".join(p.read_text() for p in out.iterdir())
    else:
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1
        assert proc.stderr.startswith("error: scoring_script: 'toolkit/deploy/serving/score.py' is missing in ")
        assert not out.exists()


# --- bad input: one line naming the field, nothing written -------------------------------------------------------

# (flag, values it refuses, what the message allows)
BAD_OPTIONS = [
    ("--endpoint", ["1demo", "tb", "t" * 33, "tb_demo", "tb-demo-"],
     "3 to 32 letters, digits and '-', starting with a letter and ending with a letter or digit"),
    ("--deployment", ["b1", "blue.2"], "3 to 32 letters, digits and '-'"),
    ("--instance-count", ["0", "-2"], "1 or more"),
    ("--runtime", ["tensorflow"], "onnx, torch"),
    ("--max-batch", ["0", "257"], "1 to 256"),
    ("--max-wait-ms", ["-1", "1001"], "0 to 1000"),
    ("--image", ["Not An Image"], f"an image reference like {entities.CPU_INFERENCE_IMAGE}"),
    ("--sku", ["Standard_D4s_v3"], "Standard_NC6s_v3, Standard_NC12s_v3"),  # a training size, not for endpoints
]
BAD_DEPLOY_PLANS = [(flag, value, allowed) for flag, values, allowed in BAD_OPTIONS for value in values]


def _deploy_plan_argv(model: Path, out: Path, *extra: str) -> list[str]:
    """``azure deploy-plan MODEL`` with a valid CPU plan's flags, any of them replaced or added by ``extra``."""
    flags = {"--endpoint": "tb-demo", "--sku": "Standard_DS3_v2", **dict(zip(extra[::2], extra[1::2]))}
    return ["azure", "deploy-plan", str(model), *[item for pair in flags.items() for item in pair], "--out", str(out)]


@pytest.mark.parametrize("flag, value, allowed", BAD_DEPLOY_PLANS, ids=[f"{f} {v}" for f, v, _ in BAD_DEPLOY_PLANS])
def test_bad_deploy_plan_options_are_refused_naming_the_field(tmp_path, serving, capsys, flag, value, allowed):
    out = tmp_path / "out"
    err = _refused(capsys, _deploy_plan_argv(serving.model, out, flag, value), out)
    shown = value if value.lstrip("-").isdigit() else repr(value)
    refusal = "is not allowed for managed online endpoints" if flag == "--sku" else "is not allowed"
    assert err.startswith(f"error: {flag}: {shown} {refusal}; allowed: {allowed}"), err


def test_an_unknown_size_is_refused_naming_the_known_ones(tmp_path, serving, capsys):
    out = tmp_path / "out"
    err = _refused(capsys, _deploy_plan_argv(serving.model, out, "--sku", "Standard_Bogus_v9"), out)
    assert err.startswith("error: --sku: 'Standard_Bogus_v9' is not a known VM size; allowed: Standard_NC6s_v3")


def _broken_models(root: Path) -> list[tuple[Path, list[str], str]]:
    """(model folder, extra flags, what the error says) for each way a model folder can be unusable."""
    cases = []

    def case(name: str, change, message: str, *flags: str) -> None:
        folder = _model(root / name)
        change(folder)
        cases.append((folder, list(flags), message.format(folder=folder)))

    case("no-onnx", lambda f: (f / "model.onnx").unlink(),
         "MODEL: '{folder}' has no model.onnx, which --runtime onnx loads; allowed: a folder with model.onnx, or "
         "--runtime torch")
    case("no-safetensors", lambda f: (f / "model.safetensors").unlink(),
         "MODEL: '{folder}' has no model.safetensors, which --runtime torch loads", "--runtime", "torch")
    case("no-manifest", lambda f: (f / "trainbook-model.json").unlink(),
         "MODEL: '{folder}' is not an exported model folder (no trainbook-model.json); allowed: a folder written by "
         "`trainbook export RUN_DIR`")
    case("bad-json", lambda f: (f / "trainbook-model.json").write_text("{not json"),
         "trainbook-model.json' cannot be read")
    case("a-list", lambda f: (f / "trainbook-model.json").write_text("[]"), "holds a list, not an object")
    case("bad-name", lambda f: _model(f, name="tiny lm"), "MODEL: name 'tiny lm' of ")
    case("bad-version", lambda f: _model(f, version="v2"), "MODEL: version 'v2' in ")
    case("lacks-tokenizer", lambda f: (f / "tokenizer.json").unlink(),
         "MODEL: '{folder}' lacks tokenizer.json, listed in trainbook-model.json")
    case("torn", lambda f: (f / "model.onnx").write_bytes(b"cut"),
         "MODEL: '{folder}' has model.onnx of 3 bytes, trainbook-model.json lists 22; allowed: the files as exported")
    case("changed", lambda f: (f / "model.onnx").write_bytes(b"Placeholder model.onnx"),  # same size, other bytes
         "MODEL: '{folder}' has model.onnx whose sha256 differs from trainbook-model.json")
    case("unlisted", lambda f: (f / "model.onnx.data").write_bytes(b"weights"),
         "MODEL: '{folder}' holds model.onnx.data, which trainbook-model.json does not list")
    case("files-not-names", lambda f: _model(f, files="model.onnx"), "MODEL: files 'model.onnx' in ")
    case("names-leave", lambda f: _model(f, files={"../secret": {"size": 1, "sha256": "0" * 64}}),
         "lists '../secret'; allowed: plain file names inside the folder")
    return cases


def test_unusable_model_folders_are_refused_naming_model_and_what_is_missing(tmp_path, serving, capsys):
    out = tmp_path / "out"
    for folder, flags, message in _broken_models(tmp_path / "broken"):
        err = _refused(capsys, _deploy_plan_argv(folder, out, *flags), out)
        assert err.startswith("error: MODEL: ") and message in err, (folder.name, err)
    missing = tmp_path / "nowhere" / "model"
    err = _refused(capsys, _deploy_plan_argv(missing, out), out)
    assert f"MODEL: folder '{missing}' does not exist; allowed: a model folder exported by Trainbook" in err
    a_file = serving.model / "model.onnx"
    assert "is a file, not a folder" in _refused(capsys, _deploy_plan_argv(a_file, out), out)


def test_the_scoring_script_must_be_uploaded_and_parse(serving, tmp_path):
    script = serving.root / entities.SCORING_SCRIPT
    script.write_text("def init(:\n    pass\n")
    with pytest.raises(AzureError, match=rf"^scoring_script: '{script}' does not parse \(line 1: "):
        _plan(serving)
    script.unlink()
    with pytest.raises(AzureError, match=rf"^scoring_script: 'toolkit/deploy/serving/score.py' is missing in "
                                         rf"'{serving.root}'; allowed: the scoring script"):
        _plan(serving)
    script.write_text(SCORE)
    (serving.root / ".amlignore").write_text("toolkit/deploy/serving/\n")  # uploads everything but score.py
    with pytest.raises(AzureError, match=r"^code: .*\.amlignore drops files the job needs: toolkit/deploy/serving/score.py"):
        _plan(serving)


def test_environment_yml_needs_the_inference_server(serving):
    conda = serving.root / "environment.yml"
    conda.write_text(re.sub(r"      - azureml-inference-server-http==.*\n", "", conda.read_text()))
    with pytest.raises(AzureError, match="^environment.yml: .* has no azureml-inference-server-http in its pip list"):
        _plan(serving)


def test_a_deployment_plan_refuses_to_upload_an_endpoint_key(serving):
    """The deployment's code upload is the project folder too: a local endpoint's key must not go with it."""
    from toolkit.deploy.serving.endpoint import endpoint_key

    endpoint_key(serving.root / "notebooks" / ".trainbook" / "endpoints" / "tb-demo")
    with pytest.raises(AzureError, match=r"^code: .* would upload secret-looking files: "
                                         r"notebooks/.trainbook/endpoints/tb-demo/key \(a Trainbook workspace .*"
                                         r"exclude them in .amlignore \(add '.trainbook/'"):
        _plan(serving)


def test_an_earlier_deployment_plan_is_replaced_whole_and_other_folders_are_never_touched(tmp_path, serving):
    from toolkit import config
    from toolkit.azure.plan import build_plan, write_plan

    out = write_deployment_plan(_plan(serving), tmp_path / "plan")
    (out / "notes.txt").write_text("someone's notes, written into the plan folder")
    with pytest.raises(AzureError, match="holds 'notes.txt', which a deployment plan folder does not"):
        write_deployment_plan(_plan(serving, runtime="torch"), out)  # replacing would delete them
    (out / "notes.txt").unlink()
    write_deployment_plan(_plan(serving, runtime="torch"), out)
    assert "TRAINBOOK_RUNTIME: torch" in (out / "deployment.yaml").read_text()
    assert _leftovers(tmp_path) == []
    training = write_plan(build_plan(config.load("tiny"), compute="cpu-a", sku="Standard_D4s_v3", instance_count=1,
                                     project_root=serving.root), tmp_path / "training-plan")
    before = sorted(p.name for p in training.iterdir())
    with pytest.raises(AzureError, match="--out: .* exists and is not a deployment plan folder"):
        write_deployment_plan(_plan(serving), training)
    assert sorted(p.name for p in training.iterdir()) == before


# --- deploy ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("given_config, expected", [
    (False, "error: --workspace-config: no config.json at "),
    (True, "error: credentials: none found; run `az login` (Azure CLI) or set AZURE_CLIENT_ID"),
], ids=["no config.json", "no credentials"])
def test_deploy_offline_exits_2_in_seconds_with_one_line_naming_the_missing_piece(tmp_path, plan_dir, workspace_config,
                                                                                   no_credentials, given_config,
                                                                                   expected):
    argv = [sys.executable, "-m", "toolkit", "azure", "deploy", str(plan_dir)]
    argv += ["--workspace-config", str(workspace_config)] if given_config else []
    elsewhere = tmp_path / "elsewhere"  # the search for config.json starts in the current folder: an empty one
    elsewhere.mkdir()
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=elsewhere, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert (proc.returncode, proc.stdout, proc.stderr.count("\n")) == (2, "", 1), proc.stderr
    assert proc.stderr.startswith(expected) and "Traceback" not in proc.stderr
    assert SUBSCRIPTION not in proc.stderr and elapsed < 30, f"took {elapsed:.1f} s"


def test_deploy_refuses_what_is_not_a_deployment_plan_or_no_longer_matches_this_machine(tmp_path, plan_dir, serving):
    with pytest.raises(AzureError, match=r"^plan_dir: .* is not a deployment plan folder \(missing endpoint.yaml, "
                                         r"deployment.yaml\); allowed: a folder written by `trainbook azure "
                                         r"deploy-plan`"):
        load_deployment_plan(tmp_path / "empty")
    serving.model.rename(serving.model.with_name("moved"))
    with pytest.raises(AzureError, match=rf"^deployment.yaml model.path: '{serving.model}' does not exist on this "
                                         r"machine; allowed: deploy from the machine that planned"):
        load_deployment_plan(plan_dir)
    (plan_dir / "deployment.yaml").write_text("name: blue\ninstance_count: many\n")
    with pytest.raises(AzureError, match="^deployment.yaml: the Azure ML SDK cannot load it"):
        load_deployment_plan(plan_dir)


def test_deploy_with_a_token_but_no_reachable_workspace_names_the_workspace(plan_dir, workspace_config):
    from azure.core.credentials import AccessToken

    # Stands in for Microsoft Entra ID (unreachable here): a token no service will accept.
    static_token = types.SimpleNamespace(get_token=lambda *scopes, **kw: AccessToken("x", int(time.time()) + 3600))
    lines: list[str] = []
    with pytest.raises(AzureError) as caught:
        deploy(plan_dir, connection.workspace_ref(workspace_config), credential=static_token, log=lines.append)
    message = str(caught.value)
    assert message.startswith(("workspace: management.azure.com is unreachable", "credentials: refused by Azure"))
    assert "workspace ws-train in resource group rg-train" in message and SUBSCRIPTION not in message
    assert lines == []  # nothing was created


class _Workspace:
    """Stands in for MLClient (no Azure here): records what deploy asks for, in order."""

    def __init__(self, fail_deployment: bool = False):
        self.calls: list[tuple] = []
        self.fail_deployment = fail_deployment
        self.workspaces = types.SimpleNamespace(get=lambda name: self.calls.append(("workspace", name)))
        self.online_endpoints = types.SimpleNamespace(begin_create_or_update=self._endpoint, get=self._get)
        self.online_deployments = types.SimpleNamespace(begin_create_or_update=self._deployment)

    def _endpoint(self, endpoint):
        self.calls.append(("endpoint", endpoint.name, dict(endpoint.traffic or {}), endpoint.auth_mode))
        return types.SimpleNamespace(result=lambda: types.SimpleNamespace(provisioning_state="Succeeded"))

    def _deployment(self, deployment):
        from azure.core.exceptions import HttpResponseError

        self.calls.append(("deployment", deployment.name, deployment.instance_type))
        if self.fail_deployment:
            raise HttpResponseError("ResourceNotReady: the container crashed during init()")
        return types.SimpleNamespace(result=lambda: deployment)

    def _get(self, name):
        return types.SimpleNamespace(name=name, scoring_uri=f"https://{name}.westeurope.inference.ml.azure.com/score")


@pytest.fixture
def fake_workspace(monkeypatch):
    client = _Workspace()
    monkeypatch.setattr("toolkit.azure.submit.check_credentials", lambda credential: None)
    monkeypatch.setattr("toolkit.azure.submit.ml_client", lambda ref, credential: client)
    return client


def test_deploy_creates_the_endpoint_then_the_deployment_then_routes_all_traffic(plan_dir, workspace_config,
                                                                                  fake_workspace, capsys):
    code = main(["azure", "deploy", str(plan_dir), "--workspace-config", str(workspace_config)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert fake_workspace.calls == [("workspace", "ws-train"), ("endpoint", "tb-demo", {}, "key"),
                                    ("deployment", "blue", "Standard_DS3_v2"),
                                    ("endpoint", "tb-demo", {"blue": 100}, "key")]
    assert captured.out.splitlines() == [
        "scoring uri: https://tb-demo.westeurope.inference.ml.azure.com/score",
        "keys: az ml online-endpoint get-credentials -n tb-demo -g rg-train -w ws-train"]
    assert "traffic: 100% to blue" in captured.err and SUBSCRIPTION not in captured.out + captured.err


def test_a_deployment_that_fails_says_where_its_logs_are(plan_dir, workspace_config, fake_workspace, capsys):
    fake_workspace.fail_deployment = True
    code = main(["azure", "deploy", str(plan_dir), "--workspace-config", str(workspace_config)])
    err = capsys.readouterr().err.splitlines()[-1]
    assert code == 2 and err.startswith("error: deployment: Azure ML refused it (ResourceNotReady: the container")
    assert err.endswith("logs: az ml online-deployment get-logs -n blue -e tb-demo -g rg-train -w ws-train")
    assert [call[0] for call in fake_workspace.calls] == ["workspace", "endpoint", "deployment"]  # no traffic moved


# --- sizes and imports -------------------------------------------------------------------------------------------


def test_online_sizes_follow_azures_managed_online_endpoint_list():
    for name in ("Standard_DS2_v2", "Standard_DS3_v2", "Standard_DS4_v2", "Standard_F2s_v2", "Standard_F4s_v2",
                 "Standard_F8s_v2", "Standard_E4s_v3", "Standard_NC6s_v3", "Standard_NC4as_T4_v3",
                 "Standard_NC24ads_A100_v4", "Standard_ND96asr_v4", "Standard_NC40ads_H100_v5"):
        assert get_online_sku(name.lower()).name == name
    assert not any(SKUS[name].online for name in ("standard_d4s_v3", "standard_d16s_v3", "standard_nc24rs_v3"))
    with pytest.raises(AzureError, match="--sku: 'Standard_D16s_v3' is not allowed for managed online endpoints"):
        get_online_sku("Standard_D16s_v3")


def test_importing_the_deploy_modules_leaves_the_sdk_unloaded():
    code = ("import sys, toolkit.azure.deploy_plan, toolkit.azure.deploy; "
            "print(sorted(k for k in sys.modules if k.split('.')[0] == 'azure'))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=PROJECT)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
