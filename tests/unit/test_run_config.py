"""A run directory's config.yaml is read as untrusted: only a regular file inside the run counts, never a link
(a copied run could point it at any file) nor anything else that is not a file. Real files, no subprocess."""

from __future__ import annotations

import os

import pytest

from toolkit import config as config_mod
from toolkit.errors import UserError
from toolkit.rundir import RunDir


def _run(tmp_path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    return run


def test_a_config_yaml_that_links_outside_the_run_is_refused_naming_it(tmp_path):
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(config_mod.load("tiny").to_yaml())
    run = _run(tmp_path)
    run.config_path.symlink_to(outside)
    with pytest.raises(config_mod.ConfigError) as caught:
        run.read_config()
    assert str(caught.value) == (f"config.yaml: '{run.config_path}' is a symbolic link to '{outside}'; allowed: a "
                                 "regular file (a link is never followed: it could lead anywhere)")


def test_a_config_yaml_that_is_a_folder_is_refused_naming_it(tmp_path):
    run = _run(tmp_path)
    run.config_path.mkdir()
    with pytest.raises(config_mod.ConfigError, match=f"^config.yaml: '{run.config_path}' is a directory, not a "
                                                     "regular file; allowed: a regular file$"):
        run.read_config()


@pytest.mark.timeout(10)  # before the fix, reading a FIFO waited forever for a writer
def test_a_config_yaml_that_is_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    run = _run(tmp_path)
    os.mkfifo(run.config_path)
    with pytest.raises(config_mod.ConfigError, match="is a FIFO, not a regular file"):
        run.read_config()


def test_a_regular_config_yaml_still_reads(tmp_path):
    cfg = config_mod.load("tiny")
    run = _run(tmp_path)
    run.config_path.write_text(cfg.to_yaml())
    assert run.read_config() == cfg


@pytest.mark.parametrize("name, read", [("status.json", RunDir.read_status), ("lineage.json", RunDir.read_lineage)])
def test_status_and_lineage_are_read_only_as_the_runs_own_json_objects(tmp_path, name, read):
    run = _run(tmp_path)
    assert read(run) == {}, "not written yet"
    outside = tmp_path / "elsewhere.json"
    outside.write_text('{"state": "running", "worker_pgid": 1}')
    (run.path / name).symlink_to(outside)
    with pytest.raises(ValueError, match=f"{name}: .* is a symbolic link"):
        read(run)
    (run.path / name).unlink()
    (run.path / name).write_text("[1, 2]")
    with pytest.raises(ValueError, match=f"{name}: .* holds a JSON list; allowed: a JSON object"):
        read(run)


@pytest.mark.parametrize("name, read", [("status.json", RunDir.read_status), ("lineage.json", RunDir.read_lineage)])
def test_status_and_lineage_that_are_not_json_or_grown_huge_are_user_errors_naming_the_file(tmp_path, name, read):
    # a copied run's file: half a JSON object is refused in one line (not a traceback), and a file of gigabytes
    # (here sparse: no disk used) is refused before it is read into memory
    run = _run(tmp_path)
    (run.path / name).write_text('{"state": "completed",')
    with pytest.raises(UserError, match=f"^{name}: '.*{name}' is not JSON \\(line 1 column 23: Expecting "):
        read(run)
    with open(run.path / name, "r+b") as f:
        f.truncate(1 << 30)
    with pytest.raises(UserError, match=f"^{name}: '.*{name}' is over 4,194,304 bytes"):
        read(run)
