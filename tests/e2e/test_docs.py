"""The docs: the generated reference pages match the code, the site builds with --strict (no broken link, anchor,
nav entry or snippet), and the README stays a first screen that names the two commands."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import PROJECT


def _run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, *args], cwd=PROJECT, capture_output=True, text=True, timeout=timeout,
                          env=env)


def test_the_generated_reference_pages_are_up_to_date():
    proc = _run("docs/generate.py", "--check")
    assert proc.returncode == 0, proc.stderr + proc.stdout


def test_the_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    proc = _run("-m", "mkdocs", "build", "--strict", "-f", "docs/mkdocs.yml", "-d", str(site))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert (site / "index.html").is_file()
    for page in ("security", "contributing", "reference/config", "reference/cli"):
        assert (site / f"{page}.html").is_file(), page
    # the snippets resolved: the pages carry docs/SECURITY.md's and docs/CONTRIBUTING.md's text, not the include line
    assert "Files from elsewhere are data, never code" in (site / "security.html").read_text()
    assert "Tests and tiers" in (site / "contributing.html").read_text()
    assert "--8&lt;--" not in (site / "security.html").read_text()


def test_the_readme_is_a_first_screen_with_the_two_commands():
    readme = (PROJECT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160
    assert "make demo" in readme and "make test" in readme
