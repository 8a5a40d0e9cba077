"""A copied run directory whose config.yaml is a link to a file outside the run: `trainbook export` and
`trainbook resume` refuse it in one line naming the link, and nothing is exported or trained from that file."""

from __future__ import annotations

from conftest import cli

from toolkit import config as config_mod
from toolkit.rundir import RunDir


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


# --- size: a config is a few KB; a file of megabytes is refused before it is read ---------------------------------

ONE_MIB = 1 << 20


def _padded(path, cfg_yaml: str, size: int):
    """A valid config grown to ``size`` bytes by a comment: only its size is wrong."""
    padding = size - len(cfg_yaml.encode()) - 3
    path.write_text(cfg_yaml + "# " + "x" * padding + "\n")
    assert path.stat().st_size == size
    return path


def test_a_config_file_over_the_cap_is_refused_naming_its_size_and_the_cap(tmp_path):
    big = _padded(tmp_path / "big.yaml", config_mod.load("tiny").to_yaml(), 2 * ONE_MIB + 7)
    for args in (["config", "show", str(big)], ["train", str(big), "--run-dir", str(tmp_path / "r")]):
        proc = cli(*args)
        assert proc.returncode == 2, proc.stdout[-500:] + proc.stderr
        assert proc.stderr == (f"error: {big}: 2,097,159 bytes is over the cap and was not read; allowed: a document "
                               f"of at most 1,048,576 bytes (a config is a few KB)\n"), proc.stderr
    assert not (tmp_path / "r").exists()
    fits = _padded(tmp_path / "fits.yaml", config_mod.load("tiny").to_yaml(), ONE_MIB)
    assert cli("config", "show", str(fits)).returncode == 0, "a config of exactly the cap is read"


def test_a_run_config_yaml_over_the_cap_is_refused_before_it_is_read(tmp_path):
    cfg = config_mod.load("tiny", ["train.max_steps=2"])
    run = RunDir.create(tmp_path / "run", cfg)
    _padded(run.config_path, cfg.to_yaml(), 5 * ONE_MIB)
    proc = cli("export", str(run.path))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: config.yaml: '{run.config_path}' is over 4,194,304 bytes"), proc.stderr
    assert not (run.path / "model").exists()


def test_a_deepspeed_config_over_the_cap_is_refused_before_it_is_read(tmp_path):
    ds = _padded(tmp_path / "ds.json", "", 2 * ONE_MIB)  # not even JSON: refused for its size before any parse
    proc = cli("config", "show", "tiny", "--set", "engine.name=deepspeed", "--set",
               f"engine.deepspeed_config={ds}")
    assert proc.returncode == 2 and str(ds) in proc.stderr and "1,048,576 bytes" in proc.stderr, proc.stderr
