"""The docs: the generated reference pages match the code, the site builds with --strict (no broken link, anchor,
nav entry or snippet), and the README stays a first screen that names the two commands."""

from __future__ import annotations

import importlib.util
import os
import shutil
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
    for page in ("security", "contributing", "reference/config", "reference/cli", "figures"):
        assert (site / f"{page}.html").is_file(), page
    # the snippets resolved: the pages carry docs/SECURITY.md's and docs/CONTRIBUTING.md's text, not the include line
    assert "Files from elsewhere are data, never code" in (site / "security.html").read_text()
    assert "Tests and tiers" in (site / "contributing.html").read_text()
    assert "--8&lt;--" not in (site / "security.html").read_text()


def test_a_page_of_figures_the_writer_renders_builds_strict(tmp_path):
    """bench/figures.py's page, from records the real helper wrote (texts with a pipe, angle brackets, asterisks and
    code), in a --strict build of a copy of the site: its tables and its links hold."""
    spec = importlib.util.spec_from_file_location("bench_figures_e2e", PROJECT / "bench" / "figures.py")
    figures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figures)
    records = tmp_path / "records"
    bench = str(PROJECT / "bench" / "bench_serving.py")
    figures.record(bench, "overhead", area="serving", figure="the server's overhead | at p50", unit="ms",
                   compared="HTTP <p50> - in-process *p50*, `runs/<name>`", values=[1.5, 2.5, 2.0],
                   target=("<", 5.0), folder=records)
    figures.record(bench, "batching", area="serving", figure="batching", compared="batched / unbatched",
                   values=[1.5, 1.8], target=(">=", 2.0), note="2 < 16 clients", folder=records)
    docs = tmp_path / "docs"
    shutil.copytree(PROJECT / "docs", docs, ignore=shutil.ignore_patterns("build"))
    (docs / "pages" / "figures.md").write_text(figures.render(figures.read_records(records),
                                                              figures.makefile_benches()))
    site = tmp_path / "site"
    proc = _run("-m", "mkdocs", "build", "--strict", "-f", str(docs / "mkdocs.yml"), "-d", str(site))
    assert proc.returncode == 0, proc.stderr + proc.stdout
    html = (site / "figures.html").read_text()
    assert "<td>the server's overhead | at p50</td>" in html
    assert "<td>HTTP &lt;p50&gt; - in-process *p50*, <code>runs/&lt;name&gt;</code></td>" in html
    assert "<td><strong>2 ms</strong> [1.5 to 2.5]</td>" in html and "<td>&lt; 5 ms</td>" in html
    assert "<td>batching (2 &lt; 16 clients)</td>" in html and "<td><strong>no</strong></td>" in html
    assert html.count("<table>") == 2  # the serving figures, the GPU reports


def test_the_readme_is_a_first_screen_with_the_two_commands():
    readme = (PROJECT / "README.md").read_text()
    assert len(readme.splitlines()) <= 160
    assert "make demo" in readme and "make test" in readme
