"""A copied run directory whose config.yaml is a link to a file outside the run: `trainbook export` and
`trainbook resume` refuse it in one line naming the link, and nothing is exported or trained from that file."""

from __future__ import annotations

from conftest import cli

from toolkit import config as config_mod
from toolkit.runs.rundir import RunDir


def _linked_run(tmp_path) -> tuple[RunDir, str]:
    """A queued run (nothing trained) whose config.yaml links to a valid config elsewhere; the refusal it gets."""
    outside = tmp_path / "elsewhere.yaml"
    cfg = config_mod.load("tiny", ["train.max_steps=2", "train.eval_every=2", "checkpoint.at_end=true"])
    outside.write_text(cfg.to_yaml())
    run = RunDir.create(tmp_path / "run", cfg)
    run.config_path.unlink()
    run.config_path.symlink_to(outside)
    return run, (f"error: config.yaml: '{run.config_path}' is a symbolic link to '{outside}'; allowed: a regular "
                 "file (a link is never followed: it could lead anywhere)\n")


def test_export_refuses_a_config_yaml_that_links_outside_the_run(tmp_path):
    run, refusal = _linked_run(tmp_path)
    proc = cli("export", str(run.path))
    assert proc.returncode == 2 and proc.stderr == refusal, proc.stderr
    assert not (run.path / "model").exists()


def test_resume_refuses_a_config_yaml_that_links_outside_the_run(tmp_path):
    run, refusal = _linked_run(tmp_path)
    before = run.read_status()
    proc = cli("resume", str(run.path), timeout=300)
    assert proc.returncode == 2 and proc.stderr == refusal, proc.stderr
    assert run.read_status() == before, "refused before anything changed (no supervisor was started)"
    assert not (run.path / "checkpoints").exists(), "nothing was trained from the linked config"
