"""The guided notebooks in a real JupyterLab, driven by a real Chromium: what papermill cannot see.

Papermill runs the kernel only; the ipywidgets views (form, progress bar, live plot) are drawn by JupyterLab's
front end, so a panel that never renders (a missing or mismatched widgets extension, a front-end error) still
passes test_notebook.py. Here one JupyterLab serves parameterized copies of the course's notebooks, Chromium
(Debian's, installed by apt when missing) runs every cell of each through the Run menu, one after the other in one
page, and the test reads the rendered page; last, the training notebook (03) with tiny parameters: the progress
widget at 100%, the card saying completed, blue loss-line pixels in the plot image.

Screenshots of the finished pages are kept in outputs/browser/ (also on failure, with the server's log).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import deque
from pathlib import Path

import nbformat
import pytest
from matplotlib.colors import to_rgb
from papermill.iorw import load_notebook_node
from papermill.parameterize import parameterize_notebook
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from playwright.sync_api import expect, sync_playwright

from conftest import PROJECT
from test_notebook import CHECKS, COURSE, NBVAL, course_parameters, nbval
from toolkit.ports import free_port

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
APT_PACKAGES = ["chromium", "chromium-driver"]
# Chromium as Debian ships it, driven by Playwright's CDP client: no `playwright install`, nothing downloaded
# at run time. --no-sandbox because CI runs as root; the rest keeps a headless start quick and offline.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]
SCREENSHOTS = PROJECT / "outputs" / "browser"
NOTEBOOK = PROJECT / "notebooks" / "03_training.ipynb"
RUN_TIMEOUT_MS = 240_000  # the whole notebook, tiny run included, on a busy 2-core machine
# training_curves draws the training loss without an explicit colour: the first of matplotlib's cycle, C0.
LOSS_RGB = tuple(round(255 * c) for c in to_rgb("C0"))
# The loss axes are ~500 px wide and the train line crosses most of them; the legend's sample of the same colour
# covers ~30 columns, so a plot with a legend and no line stays far below this.
MIN_LOSS_LINE_COLUMNS = 200


@pytest.fixture(scope="session")
def chromium() -> Path:
    return ensure_chromium()


def ensure_chromium() -> Path:
    """/usr/bin/chromium, installed with apt on first use (CI is a fresh Debian machine where we are root).
    Where that is impossible the test fails, saying what to install: a skipped browser test would hide that the
    front end is no longer tested."""
    if CHROMIUM.exists():
        return CHROMIUM
    install = ["apt-get", "install", "-y", "--no-install-recommends", *APT_PACKAGES]
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail(f"{CHROMIUM} is missing and cannot be installed here (needs root and apt-get); "
                    f"install it first: sudo {' '.join(install)}", pytrace=False)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # A fresh machine (or Docker image) has empty package lists: apt only knows chromium after an update.
    if subprocess.run(["apt-cache", "show", "chromium"], capture_output=True, env=env).returncode != 0:
        _run_or_fail(["apt-get", "update"], env)
    _run_or_fail(install, env)
    if not CHROMIUM.exists():
        pytest.fail(f"{' '.join(install)} succeeded but {CHROMIUM} is still missing", pytrace=False)
    return CHROMIUM


def _run_or_fail(command: list[str], env: dict) -> None:
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=450)  # < pytest's 600 s
    if proc.returncode != 0:
        pytest.fail(f"`{' '.join(command)}` failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}"
                    f"{proc.stderr[-2000:]}", pytrace=False)


class JupyterLab:
    """A JupyterLab server from this venv on 127.0.0.1, with its own token and its own Jupyter directories."""

    def __init__(self, root: Path, home: Path, env: dict):
        self.port, self.token = free_port(), secrets.token_urlsafe(24)
        self.log_path = home / "jupyterlab.log"
        home.mkdir(parents=True, exist_ok=True)
        # Config, runtime and data directories in tmp: no user settings, saved workspace layout, user-level
        # kernelspec or extension of this machine changes what the page shows. The venv's own share/jupyter
        # (the python3 kernelspec and the widgets lab extension) stays on the path: it is sys.prefix's.
        env = {**env, **{f"JUPYTER_{kind}_DIR": str(home / kind.lower()) for kind in ("CONFIG", "RUNTIME", "DATA")}}
        # The user settings answer JupyterLab's first-run question (fetch news?) and turn the update check off:
        # no notification over the page, no request to the internet.
        settings = home / "config" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True)
        (settings / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
                   f"--port={self.port}", "--port-retries=0", f"--ServerApp.root_dir={root}",
                   f"--IdentityProvider.token={self.token}"]
        with open(self.log_path, "wb") as log:
            # its own process group, so stopping it reaches the server and nothing else of the test run
            self.proc = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def log_tail(self, lines: int = 60) -> str:
        with open(self.log_path, errors="replace") as log:
            return "".join(deque(log, lines))

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until /api/status answers 200; fails at once, with the log, if the server exits instead."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url("api/status"), timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:  # refused (not listening yet), reset or timed out while starting
                pass
            try:  # the pause between two polls doubles as the check that the server is still alive
                code = self.proc.wait(timeout=0.25)
                pytest.fail(f"JupyterLab exited with {code} before it was ready:\n{self.log_tail()}", pytrace=False)
            except subprocess.TimeoutExpired:
                pass
        pytest.fail(f"JupyterLab not ready on port {self.port} after {timeout:.0f} s:\n{self.log_tail()}",
                    pytrace=False)

    def stop(self) -> None:
        """SIGTERM: the server shuts its kernels down itself (they run in sessions of their own)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


# Evaluated on the panel's <img> (a blob: URL that ipywidgets' Image view creates): draw it onto a canvas and
# count the pixels near the loss colour, and the columns they fall in (how far along x the line reaches).
# Synchronous, so that it can also be the predicate of a wait.
MEASURE_PLOT_JS = """
(img, [r, g, b]) => {
  if (!img || !img.complete || !img.naturalWidth) return {width: 0, height: 0, pixels: 0, columns: 0};
  const canvas = document.createElement("canvas");
  canvas.width = img.naturalWidth;
  canvas.height = img.naturalHeight;
  const ctx = canvas.getContext("2d");
  ctx.drawImage(img, 0, 0);
  const {data} = ctx.getImageData(0, 0, canvas.width, canvas.height);
  let pixels = 0;
  const columns = new Set();
  for (let i = 0; i < data.length; i += 4) {
    if (Math.abs(data[i] - r) < 40 && Math.abs(data[i + 1] - g) < 40 && Math.abs(data[i + 2] - b) < 40) {
      pixels++;
      columns.add((i / 4) % canvas.width);
    }
  }
  return {width: img.naturalWidth, height: img.naturalHeight, pixels, columns: columns.size};
}
"""
# The panel redraws its plot from a background thread, and the first drawing can have a single point: wait for
# the one with the line rather than measure whichever is shown at that moment.
PLOT_HAS_LINE_JS = f"""
([rgb, minColumns]) => ({MEASURE_PLOT_JS})(document.querySelector("img.widget-image"), rgb).columns >= minColumns
"""

# JupyterLab renders both stderr and a cell's error (its traceback) with this MIME type.
STDERR_OUTPUT = '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'
# True once every code cell has an execution count, or as soon as an error shows (Run All stops there and the
# remaining cells never get one). The count of code cells is given, so cells not yet in the DOM are waited for.
RUN_ALL_DONE_JS = """
([codeCells, stderrOutput]) => {
  const prompts = [...document.querySelectorAll(".jp-CodeCell .jp-InputPrompt")].map(p => p.textContent.trim());
  const errors = [...document.querySelectorAll(stderrOutput)].filter(o => o.textContent.includes("Traceback"));
  return errors.length > 0 || (prompts.length === codeCells && prompts.every(p => /^\\[\\d+\\]:$/.test(p)));
}
"""


def run_all(page, lab: JupyterLab, notebook: Path) -> None:
    """Open the notebook in a JupyterLab workspace of its own (no tab of another notebook in the page), wait for an
    idle kernel, Run > Run All Cells, wait for the end; no cell may fail."""
    page.goto(lab.url(f"lab/workspaces/{notebook.stem}/tree/{notebook.name}"))
    expect(page.locator(".jp-NotebookPanel")).to_be_visible(timeout=60_000)
    # The status bar's "Python 3 (ipykernel) | Idle" appears only once a kernel is connected (the toolbar's
    # execution indicator says idle from the start); Run All before that opens a Select Kernel dialog instead.
    status_bar = page.get_by_role("contentinfo")
    expect(status_bar.get_by_role("button", name=re.compile(r"\| Idle$"))).to_be_visible(timeout=60_000)

    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text("Run All Cells", exact=True).click()
    code_cells = sum(c.cell_type == "code" for c in nbformat.read(notebook, as_version=4).cells)
    page.wait_for_function(RUN_ALL_DONE_JS, arg=[code_cells, STDERR_OUTPUT], timeout=RUN_TIMEOUT_MS, polling=500)

    tracebacks = page.locator(STDERR_OUTPUT, has_text="Traceback")
    assert tracebacks.count() == 0, f"{notebook.name}: a cell failed:\n{tracebacks.first.inner_text()[-3000:]}"


def save(page, notebook: Path) -> None:
    """File > Save Notebook: the outputs the front end holds, written to the file the checks read."""
    written = notebook.stat().st_mtime_ns
    page.get_by_role("menuitem", name="File", exact=True).click()
    page.locator(".lm-Menu-itemLabel").get_by_text(re.compile(r"^Save( Notebook)?$")).first.click()
    expect(page.locator(".jp-mod-dirty"), f"{notebook.name} was never saved").to_have_count(0, timeout=30_000)
    assert notebook.stat().st_mtime_ns != written, f"{notebook.name}: saved, yet the file is the one written before"


def run_and_check_training_panel(page, lab: JupyterLab, notebook: Path, screenshot: Path) -> None:
    """Run the whole notebook, then check what the training panel shows."""
    run_all(page, lab, notebook)

    # The live panel (ipywidgets views, not the static HTML twin below them): drawn only by the widgets front end.
    progress = page.locator(".widget-hprogress")
    expect(progress, "the FloatProgress widget never rendered").to_have_count(1, timeout=30_000)
    expect(progress.locator(".widget-label")).to_have_text("100%", timeout=30_000)
    expect(progress.locator(".progress-bar")).to_have_attribute("style", re.compile(r"(^|[ ;])width: 100%"))
    expect(page.locator(".jupyter-widgets.widget-html", has_text="completed"),
           "the panel's card never said completed").to_have_count(1, timeout=30_000)

    plot = page.locator("img.widget-image")
    expect(plot, "the panel's plot (an ipywidgets Image) never rendered").to_have_count(1, timeout=30_000)
    rgb = list(LOSS_RGB)
    try:
        page.wait_for_function(PLOT_HAS_LINE_JS, arg=[rgb, MIN_LOSS_LINE_COLUMNS], timeout=30_000, polling=250)
    except PlaywrightTimeoutError:
        pass  # the assertions below say what the plot has instead
    measured = plot.evaluate(MEASURE_PLOT_JS, rgb)
    assert measured["width"] > 0, f"the panel's plot image never loaded: {measured}"
    assert measured["columns"] >= MIN_LOSS_LINE_COLUMNS, (
        f"the panel's loss plot has no line: {measured['pixels']} pixels of {LOSS_RGB} over {measured['columns']} "
        f"columns (expected >= {MIN_LOSS_LINE_COLUMNS})")
    save_screenshot(page, screenshot)


def save_screenshot(page, path: Path) -> None:
    """The page with the panel's cell at the top (Run All leaves the notebook scrolled to its end)."""
    try:
        page.locator(".jp-CodeCell", has_text="TrainingPanel(").first.evaluate(
            "cell => cell.scrollIntoView({block: 'start'})", timeout=5_000)
    except PlaywrightError:
        pass  # no such cell on the page (it did not load): the picture shows what is there instead
    page.screenshot(path=path, full_page=True)


@contextlib.contextmanager
def chromium_page(chromium: Path, lab: JupyterLab, on_failure=lambda page: None):
    """A Chromium page tall enough for a whole panel (JupyterLab scrolls inside its own panel, so a "full page"
    screenshot is the viewport). A failure inside comes back with the browser's console errors and JupyterLab's
    log, after ``on_failure(page)`` (a screenshot)."""
    console_errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(chromium), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.on("console", lambda m: m.type == "error" and console_errors.append(m.text))
            try:
                yield page
            except (AssertionError, PlaywrightError) as exc:
                on_failure(page)
                raise AssertionError(f"{exc}\n\nscreenshots: {SCREENSHOTS}\nbrowser console errors: "
                                     f"{console_errors[-10:]}\nJupyterLab log (tail):\n{lab.log_tail()}") from exc
        finally:
            browser.close()


# --- every notebook ---------------------------------------------------------------------------------------------

# Labels and buttons whose text does not fit their box (ipywidgets cuts it with an ellipsis): their full text.
CUT_OFF_LABELS_JS = """
() => [...document.querySelectorAll(".jp-OutputArea .widget-label, .jp-OutputArea .jupyter-button")]
  .filter(el => el.offsetParent !== null && el.scrollWidth > el.clientWidth + 1)
  .map(el => el.textContent.trim())
"""
# The journey table's status column, read from the live panel (a widget, not the static twin)
JOURNEY_BADGES_JS = """
() => [...document.querySelectorAll(".jp-OutputArea .widget-html table tr")].slice(1)
  .map(row => row.querySelectorAll("td")[2].textContent.trim())
"""
# The course as a participant who skips 03 does it, the journey (00) last; parameters smaller still than
# test_notebook.py's (what is checked here is the page, not the figures). 03 comes after, in the same page.
TRAINING_RUNS = "runs-03"


@pytest.fixture
def course_lab(tmp_path):
    """A JupyterLab over parameterized copies of the course's notebooks and of 03 (skipped by this participant in
    the course, run after it)."""
    lab_root = tmp_path / "lab"
    lab_root.mkdir()
    for name, parameters in course_parameters(tmp_path).items():
        source = PROJECT / "notebooks" / f"{name}.ipynb"
        nbformat.write(parameterize_notebook(load_notebook_node(str(source)), parameters), lab_root / source.name)
    # 03, run after the course and its nbval re-runs: the tiny config, profiling off, its runs in a folder of their
    # own (the course's 05 registers the newest run of the course's folder, again in nbval's re-run)
    training = parameterize_notebook(load_notebook_node(str(NOTEBOOK)), {
        "config": "tiny", "runs_root": str(tmp_path / TRAINING_RUNS), "overrides": ["profile.enabled=false"]})
    nbformat.write(training, lab_root / NOTEBOOK.name)
    env = {**os.environ, "TRAINBOOK_RUNS": str(tmp_path / "runs"), "TRAINBOOK_WORKSPACE": str(tmp_path / "workspace")}
    server = JupyterLab(lab_root, tmp_path / "jupyter", env)
    try:
        server.wait_ready()
        yield server, lab_root
    finally:
        server.stop()


def check_the_data_panel_as_a_learner_clicks(page) -> None:
    """After Run All: a bad value in the form is named beside the form, with Register greyed out; a double click
    on Measure loading measures once, and what it says shows right under its button."""
    name = page.locator(".widget-text", has=page.locator("label", has_text=re.compile(r"^name$"))).locator("input")
    name.fill("bad name!")
    expect(page.get_by_text("name: 'bad name!' is not allowed").first).to_be_visible(timeout=30_000)
    expect(page.get_by_role("button", name="Register")).to_be_disabled()
    measure = page.get_by_role("button", name="Measure loading")
    measure.dblclick()
    said = page.locator(".jp-OutputArea .widget-html", has_text=re.compile(r"^measured "))
    expect(said, "the measurement's result never showed").to_have_count(1, timeout=120_000)
    expect(page.get_by_text("busy with")).to_have_count(0)  # the second click was dropped, not refused
    below = said.bounding_box()["y"] - (measure.bounding_box()["y"] + measure.bounding_box()["height"])
    assert 0 <= below < 80, f"the result is {below:.0f} px from the button that started it"


def test_every_notebook_runs_all_in_jupyterlab_and_the_journey_tells_the_truth(chromium, course_lab):
    """Run All in each notebook in turn: no failed cell, no widget that fails to display while the kernel lives,
    no label or button cut short, and what each printed and drew (saved from the page: test_notebook's checks);
    then 00's journey says which steps were done, 03 (skipped) left to do and 01 too (a doctor that ran two of its
    checks). Then, in the same JupyterLab and page, 03's training panel renders and finishes."""
    lab, lab_root = course_lab
    tmp_path, runs = lab_root.parent, lab_root.parent / "runs"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with chromium_page(chromium, lab) as page:
        for name in COURSE:
            notebook, screenshot = lab_root / f"{name}.ipynb", SCREENSHOTS / f"{name}.png"
            screenshot.unlink(missing_ok=True)
            runs_before = set(runs.iterdir()) if runs.exists() else set()
            try:
                run_all(page, lab, notebook)
                if name in CHECKS:  # what it printed and drew, as saved from the page (test_notebook's checks)
                    save(page, notebook)
                    CHECKS[name](notebook, tmp_path, runs_before)
                # in outputs: the first cell's markdown explains the message to someone without a kernel
                failed = page.locator(".jp-OutputArea-output", has_text="Error displaying widget")
                assert failed.count() == 0, f"{name}: {failed.count()} widget(s) failed to display"
                cut = page.evaluate(CUT_OFF_LABELS_JS)
                assert not cut, f"{name}: labels cut short: {cut}"
                if name == "00_overview":
                    badges = page.evaluate(JOURNEY_BADGES_JS)
                    assert badges == ["to do", "done", "to do", "done", "done", "done"], badges
                if name == "02_data":
                    check_the_data_panel_as_a_learner_clicks(page)
            finally:
                page.screenshot(path=screenshot, full_page=True)
        # nbval re-runs these as saved by the page, with their parameters, and compares the cells marked
        # NBVAL_CHECK_OUTPUT with the outputs the page saved
        for name in NBVAL:
            nbval(lab_root / f"{name}.ipynb", tmp_path)

        # 03 in the same page: the training panel renders and finishes
        screenshot = SCREENSHOTS / NOTEBOOK.with_suffix(".png").name
        screenshot.unlink(missing_ok=True)  # never mistake the previous run's picture for this one's
        try:
            run_and_check_training_panel(page, lab, lab_root / NOTEBOOK.name, screenshot)
        except (AssertionError, PlaywrightError):
            save_screenshot(page, screenshot)
            raise
    (run_dir,) = (tmp_path / TRAINING_RUNS).iterdir()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "completed", f"{status}; screenshot: {screenshot}"
