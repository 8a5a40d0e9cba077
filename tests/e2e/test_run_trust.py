"""A run directory from elsewhere cannot run code, reach an address or open a port through its config.yaml: `resume`
and `export` honour such fields only in the user's own runs (signed when Trainbook wrote them) or with --trust-run.
Each attack below is a copied run whose config a stranger wrote, driven through the CLI as a user would."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from toolkit.rundir import RunDir

from conftest import BIGRAM_MODEL, cli

ONE_CHECKPOINT = ("--set", "train.max_steps=5", "--set", "checkpoint.every_steps=5")
FROM_START = ("--from", "step_00000005")  # the shared run has completed: resume rolls back to its checkpoint

EVIL = """
import sys
from pathlib import Path
Path(__file__).with_name("ran.marker").write_text("the run's code ran")
sys.path.insert(0, str(Path(__file__).parent))
from bigram import build  # noqa
"""


def rewrite_config(run: RunDir, **sections) -> None:
    """What a stranger does before handing the run over: edit config.yaml (it stays a valid config)."""
    data = yaml.safe_load(run.config_path.read_text())
    for section, fields in sections.items():
        data.setdefault(section, {}).update(fields)
    run.config_path.write_text(yaml.safe_dump(data))


@pytest.fixture
def listener():
    """An HTTP server on loopback that records every request it gets (and answers 404): where a run's config
    points tracking or a hub, to see whether anything was sent."""
    seen: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def _record(self):
            seen.append(f"{self.command} {self.path}")
            self.send_error(404)

        do_GET = do_POST = do_HEAD = do_PUT = _record

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def assert_refused(proc, run: RunDir, *named: str) -> None:
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "Traceback" not in proc.stderr and "not made here by you" in line and "--trust-run" in line, proc.stderr
    for text in named:
        assert text in line, line
    assert run.read_status()["state"] == "completed", "nothing changed: no roll back, no attempt"


@pytest.mark.parametrize("where", ["a module in code_path", "an absolute file path"])
def test_a_copied_run_naming_code_does_not_run_it_on_resume(tmp_path, monkeypatch, where):
    # a stranger trains a model of their own, whose module does more than build it, and hands the run over
    monkeypatch.setenv("TRAINBOOK_CONFIG_HOME", str(tmp_path / "stranger"))
    run = RunDir(tmp_path / "run")
    code = run.path / "code"
    code.mkdir(parents=True)
    (code / "bigram.py").write_text(BIGRAM_MODEL)
    (code / "evil.py").write_text(EVIL)
    factory = ("evil:build", f"model.code_path={code}") if where == "a module in code_path" else \
        (f"{code / 'evil.py'}:build", "model.code_path=")
    trained = cli("train", "tiny", "--run-dir", str(run.path), "--set", "model.name=custom",
                  "--set", f"model.factory={factory[0]}", "--set", factory[1], *ONE_CHECKPOINT)
    assert trained.returncode == 0 and (code / "ran.marker").exists(), trained.stderr[-2000:]
    (code / "ran.marker").unlink()

    monkeypatch.setenv("TRAINBOOK_CONFIG_HOME", str(tmp_path / "me"))
    proc = cli("resume", str(run.path), *FROM_START)
    assert_refused(proc, run, f"model.factory={factory[0]!r} (runs code)",
                   *([f"model.code_path={str(code)!r}"] if where == "a module in code_path" else []))
    assert not (code / "ran.marker").exists(), "the run's code was imported"
    listed = cli("checkpoints", str(run.path), "--json")  # looking is safe, and says why resume would refuse
    assert listed.returncode == 0 and json.loads(listed.stdout)["untrusted_fields"]["model.factory"] == factory[0]
    assert "resume needs --trust-run" in cli("checkpoints", str(run.path)).stderr


def test_a_copied_run_does_not_send_its_files_to_the_tracking_server_it_names(finished_run_copy, listener):
    url, seen = listener
    run = finished_run_copy(*ONE_CHECKPOINT)
    rewrite_config(run, tracking={"mlflow": "always", "mlflow_uri": url})
    proc = cli("resume", str(run.path), *FROM_START)
    assert_refused(proc, run, f"tracking.mlflow_uri={url!r} (reaches the network)")
    assert seen == [], "the run's params, metrics and files went to the config's server"


def test_a_copied_run_does_not_open_a_debugger_port(finished_run_copy):
    run = finished_run_copy(*ONE_CHECKPOINT)
    rewrite_config(run, debug={"enabled": True, "wait_for_client": False})
    proc = cli("resume", str(run.path), *FROM_START)
    assert_refused(proc, run, "(opens a port)")
    assert "debugger" not in run.read_status()


def test_export_of_a_copied_run_does_not_ask_a_hub_for_the_model_it_names(finished_run_copy, listener, monkeypatch):
    url, seen = listener
    monkeypatch.setenv("HF_ENDPOINT", url)  # where transformers would ask for a hub id: here, our listener
    run = finished_run_copy(*ONE_CHECKPOINT)
    rewrite_config(run, model={"name": "hf", "hf": {"source": "someone/some-model"}})
    proc = cli("export", str(run.path))
    assert proc.returncode == 2 and "model.hf.source='someone/some-model' (reaches the network)" in proc.stderr, \
        proc.stderr[-3000:]
    assert seen == [] and not (run.path / "model").exists()


def test_the_users_own_run_resumes_as_it_is_and_someone_elses_copy_only_with_trust_run(tmp_path, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "bigram.py").write_text(BIGRAM_MODEL)
    run = RunDir(tmp_path / "run")
    trained = cli("train", "tiny", "--run-dir", str(run.path), "--set", "model.name=custom",
                  "--set", f"model.factory={code / 'bigram.py'}:build", "--set", "train.max_steps=10",
                  "--set", "checkpoint.every_steps=5")
    assert trained.returncode == 0, trained.stderr[-2000:]
    again = cli("resume", str(run.path), "--from", "step_00000005")  # the user's own: no question asked
    assert again.returncode == 0 and run.read_status()["state"] == "completed", again.stderr[-2000:]

    # the same folder on another user's machine: their key did not sign it
    monkeypatch.setenv("TRAINBOOK_CONFIG_HOME", str(tmp_path / "another-user"))
    refused = cli("resume", str(run.path), "--from", "step_00000005")
    assert_refused(refused, run, "model.factory=")
    trusted = cli("resume", str(run.path), "--from", "step_00000005", "--trust-run")
    assert trusted.returncode == 0 and run.read_status()["state"] == "completed", trusted.stderr[-2000:]
    assert cli("resume", str(run.path), "--from", "step_00000005").returncode == 0, "vouched for once: signed"

    # a field changed by hand since it was signed is not vouched for
    rewrite_config(run, debug={"enabled": True, "wait_for_client": False})
    assert_refused(cli("resume", str(run.path), "--from", "step_00000005"), run, "(opens a port)")


def test_the_training_panel_shows_a_copied_runs_settings_and_resumes_only_when_trusted(finished_run_copy):
    from toolkit.trust import UntrustedRunError
    from widgets.training import TrainingPanel

    run = finished_run_copy(*ONE_CHECKPOINT)
    rewrite_config(run, debug={"enabled": True, "wait_for_client": False})
    panel = TrainingPanel(config="tiny").open_run(run.path)
    assert "(opens a port)" in panel.message.value and panel.trust_run.layout.display == "flex"
    with pytest.raises(UntrustedRunError, match="opens a port"):
        panel.resume()
    assert not (run.path / "trust.json").exists(), "nothing was vouched for"


def test_a_toolkit_folder_in_the_run_directory_is_not_what_resume_starts(finished_run_copy):
    """`cd RUN && trainbook resume .`: the processes Trainbook starts with `python -m` would put the current folder
    first on sys.path, so a `toolkit/` planted in the run would be imported in place of Trainbook's."""
    run = finished_run_copy(*ONE_CHECKPOINT)
    (run.path / "toolkit").mkdir()
    (run.path / "toolkit" / "__init__.py").write_text(
        "from pathlib import Path\nPath(__file__).parent.with_name('ran.marker').write_text('planted code ran')\n")
    trainbook = Path(sys.executable).with_name("trainbook")  # the console script a user types: not `python -m`
    proc = subprocess.run([str(trainbook), "resume", ".", *FROM_START], cwd=run.path, capture_output=True, text=True,
                          timeout=600)
    assert not (run.path / "ran.marker").exists(), "a process Trainbook started imported the run's toolkit/"
    assert proc.returncode == 0 and run.read_status()["state"] == "completed", proc.stderr[-2000:]


def test_a_copied_deepspeed_config_cannot_make_deepspeed_import_or_write(finished_run_copy):
    run = finished_run_copy(*ONE_CHECKPOINT)
    rewrite_config(run, engine={"name": "deepspeed", "deepspeed": {
        "torch_autocast": {"enabled": True, "lower_precision_safe_modules": ["this.x"]},
        "flops_profiler": {"enabled": True, "profile_step": 1, "output_file": str(run.path.parent / "overwritten")}}})
    proc = cli("resume", str(run.path), *FROM_START)
    assert_refused(proc, run, "engine.deepspeed=", "torch_autocast", "flops_profiler")
    assert not (run.path.parent / "overwritten").exists()
