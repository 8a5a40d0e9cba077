"""What every panel shares: buttons whose errors show inline, and a static HTML twin of the live view.

A panel subclass builds ``self.view`` (ipywidgets) and implements ``static_html()`` (the same figures as plain
HTML). ``show()`` displays both; ``update_static()`` refreshes the twin through its ``display_id``, so a notebook
executed headlessly by papermill still shows the panel's final state when it is opened without a kernel.
"""

from __future__ import annotations

import base64
import html
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import ipywidgets as w
from IPython.display import HTML, display

from toolkit.errors import refused

# What a button's action may raise for bad input or a wrong state (OSError: a missing or unwritable path the
# person typed); anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, OSError, RuntimeError, KeyError)


def error_html(message: str) -> str:
    return f"<span style='color:#d62728'>{html.escape(message)}</span>"


def warn_html(message: str) -> str:
    return f"<div style='color:#b35900'>&#9888; {html.escape(message)}</div>"


def ok_html(message: str) -> str:
    return f"<span style='color:#2ca02c'>{html.escape(message)}</span>"


def badge_html(text: str, colour: str) -> str:
    """A small coloured label (a status: pass, completed, done...)."""
    return (
        f"<span style='background:{colour};color:white;border-radius:4px;padding:1px 6px;font-size:0.8em;"
        "white-space:nowrap'>"
        f"{html.escape(text)}</span>"
    )


def pre_html(text: str) -> str:
    """A toolkit summary (fixed-width text) as HTML."""
    return f"<pre style='font-size:0.85em'>{html.escape(text)}</pre>"


def plot_png(draw: Callable[..., Path], *args, **kwargs) -> bytes:
    """The PNG bytes of a toolkit.report.plots function (they write files, for the CLI and reports): drawn into a
    temporary file and read back, for a widget and the static twin."""
    with tempfile.TemporaryDirectory() as tmp:
        return draw(*args, out=Path(tmp) / "plot.png", **kwargs).read_bytes()


def png_html(png: bytes, max_width: int = 900) -> str:
    """An inline <img> of PNG bytes (empty when there is no picture yet)."""
    if not png:
        return ""
    return f"<img src='data:image/png;base64,{base64.b64encode(png).decode()}' style='max-width:{max_width}px'/>"


class Panel:
    """A live view plus its static twin. Subclasses set ``self.view`` and implement ``static_html``."""

    title = ""

    def __init__(self) -> None:
        self.message = w.HTML()
        self.busy = w.HTML()  # what the background task is doing, while it does it
        self._static = None
        self._task: threading.Thread | None = None
        self._task_what = ""
        self._task_result = None

    def button(self, description: str, action: Callable[[], object], style: str = "", tooltip: str = "") -> w.Button:
        """A button whose click runs ``action``; bad input or a wrong state is shown in ``self.message``."""
        # as wide as its label: the default fixed width cuts "Write Azure ML plan" to "Write Azure ML pl..."
        button = w.Button(
            description=description,
            button_style=style,
            tooltip=tooltip,
            layout=w.Layout(width="auto", min_width="90px"),
        )
        button.on_click(lambda _: self.guarded(action))
        return button

    def guarded(self, action: Callable[[], object], clear: bool = True):
        """Run a panel action; a user error shows inline (red) instead of a traceback in the kernel log.
        ``clear``: start from an empty message (a background task keeps what its button's click said)."""
        try:
            if clear:
                self.message.value = ""
            return action()
        except USER_ERRORS as exc:
            self.message.value = error_html(str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))
            return None
        finally:
            self.update_static()

    def in_background(self, what: str, action: Callable[[], object], buttons: Iterable[w.Button] = ()) -> None:
        """Run slow work (an export, a measurement) in a thread so the kernel stays free; ``buttons`` are
        disabled at once (a second click must not slip in before the thread runs) and ``what`` shows in
        ``self.busy`` meanwhile. One task at a time: ``wait()`` blocks until it ends and returns its result."""
        if self._task is not None and self._task.is_alive():
            raise RuntimeError(refused("panel", f"busy with {self._task_what or 'another task'}", "wait for it to end"))
        buttons = list(buttons)

        def work() -> None:
            try:
                self._task_result = self.guarded(action, clear=False)
            finally:
                self.busy.value = ""
                for b in buttons:
                    b.disabled = False
                self.after_task()
                self.update_static()

        self._task_what = what
        self.busy.value = f"<i style='color:#1f77b4'>{html.escape(what)}…</i>" if what else ""
        for b in buttons:
            b.disabled = True
        self._task_result = None
        self._task = threading.Thread(target=work, daemon=True, name=f"trainbook-{type(self).__name__}")
        self._task.start()

    def after_task(self) -> None:
        """Called when a background task ends, error or not: a subclass re-derives which buttons make sense."""

    def wait(self, timeout: float | None = None):
        """Block until the background task (if any) ends; return what its action returned (None on an error)."""
        if self._task is not None:
            self._task.join(timeout)
        return self._task_result

    def static_html(self) -> str:
        raise NotImplementedError

    def _twin(self) -> HTML:
        return HTML(f"<div class='{self._twin_class}'>{self.static_html()}</div>")

    def update_static(self) -> None:
        if self._static is not None:
            self._static.update(self._twin())

    def show(self):
        """Display the live view and, below it, the static twin. Where the widgets render (a live kernel in
        JupyterLab), a style inside the view hides the twin, so nothing shows twice; where they cannot (an
        executed copy opened later, GitHub, nbconvert's HTML), that style is absent and the twin shows."""
        fit_labels(self.view)
        self._twin_class = f"trainbook-twin-{uuid.uuid4().hex[:12]}"
        hide_twin = w.HTML(f"<style>.{self._twin_class} {{display: none}}</style>", layout=w.Layout(height="0px"))
        display(w.VBox([hide_twin, self.view]))
        self._static = display(self._twin(), display_id=True)
        return self


def fit_labels(widget: w.Widget) -> None:
    """Every control's label at its full length: ipywidgets gives a description a fixed width and cuts what is
    longer ("resume fr...", "temperat..."). Walks the view once, at show()."""
    if isinstance(widget, w.Box):
        for child in widget.children:
            fit_labels(child)
    elif getattr(widget, "description", "") and hasattr(widget.style, "description_width"):
        widget.style.description_width = "initial"


def field_row(widgets: Iterable[w.Widget]) -> w.HBox:
    return w.HBox(list(widgets), layout=w.Layout(flex_flow="row wrap"))
