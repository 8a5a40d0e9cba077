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
import time
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


SHOW_ELAPSED_AFTER_S = 3.0  # an action that runs longer shows its seconds, so that a slow one visibly lives
ELAPSED_EVERY_S = 1.0  # how often those seconds are redrawn


def busy_html(what: str, seconds: float | None = None) -> str:
    elapsed = f" {seconds:.0f} s" if seconds is not None else ""
    return f"<i style='color:#1f77b4'>{html.escape(what)}…{elapsed}</i>"


def hint_html(message: str) -> str:
    """Why a control is greyed out, or what an empty field means: grey, not an error."""
    return f"<span style='color:#888'>{html.escape(message)}</span>"


class Outcome:
    """The line beside a control (a button or a row of them) where what it started shows: what it is doing while it
    runs (with its seconds after SHOW_ELAPSED_AFTER_S), then its result or its error, each replacing the last."""

    def __init__(self) -> None:
        self.doing = w.HTML()
        self.said = w.HTML()
        self.view = w.HBox([self.doing, self.said], layout=w.Layout(flex_flow="row wrap"))

    def say(self, text_html: str) -> None:
        self.said.value = text_html

    @property
    def value(self) -> str:
        """What the line shows, as HTML: the static twin's copy, and what tests read."""
        return self.doing.value + self.said.value


class Confirm:
    """A destructive button's second step: its first click asks (the question and Yes / Cancel beside it) and only
    Yes acts. ``question()`` is asked at the click, so it names what would be done then."""

    def __init__(self, question: Callable[[], str], yes: str) -> None:
        self.question = question
        self.text = w.HTML()
        self.yes = w.Button(description=yes, button_style="danger", layout=w.Layout(width="auto"))
        self.cancel = w.Button(description="Cancel", layout=w.Layout(width="auto"))
        self.view = w.HBox([self.text, self.yes, self.cancel], layout=w.Layout(display="none"))

    def ask(self) -> None:
        self.text.value = f"<b>{html.escape(self.question())}</b>&nbsp;"
        self.view.layout.display = "flex"

    def close(self) -> None:
        self.view.layout.display = "none"
        self.text.value = ""

    @property
    def open(self) -> bool:
        return self.view.layout.display != "none"


class Panel:
    """A live view plus its static twin. Subclasses set ``self.view`` and implement ``static_html``.

    One rule for every button (``button``): what its click starts, how it goes and how it ends show on its
    Outcome line, placed beside it by the subclass (``outcome_of(button).view``), each result replacing the last. A
    button is disabled while the panel's state forbids it (``allow``, with the reason as its tooltip and, where the
    subclass shows it, beside it), and while its work runs when that work runs in the background (``in_background``,
    for anything slow). A click that reaches the kernel on a disabled button (a double click sent before the front
    end greyed it out) is dropped: it never queues a second run. A quick action that runs in the click itself (Start,
    Write this setting) holds the kernel until it is done; a second click then runs after it, on the state the
    first left (a started run greys Start out)."""

    title = ""
    # The toolkit names a field as its config key or command-line flag; the panel shows it by the label the person
    # sees next to the control. A message that starts "FIELD: " starts "LABEL: " here.
    field_labels: dict[str, str] = {}

    def __init__(self) -> None:
        self.message = w.HTML()  # what no button started: the form's checks, an opened run's warnings
        self._outcomes: dict[w.Button, Outcome] = {}
        self._tooltips: dict[w.Button, str] = {}
        self._static = None
        self._task: threading.Thread | None = None
        self._task_what = ""
        self._task_result = None

    def button(
        self,
        description: str,
        action: Callable[[], object],
        style: str = "",
        tooltip: str = "",
        outcome: Outcome | None = None,
        confirm: Confirm | None = None,
    ) -> w.Button:
        """A button whose click runs ``action``; its progress, result and error show on ``outcome`` (shared by a
        row of buttons; by default the button's own). With ``confirm``, the click asks first and Yes acts."""
        # as wide as its label: the default fixed width cuts "Write Azure ML plan" to "Write Azure ML pl..."
        button = w.Button(
            description=description,
            button_style=style,
            tooltip=tooltip,
            layout=w.Layout(width="auto", min_width="90px"),
        )
        self._outcomes[button] = outcome = outcome or Outcome()
        self._tooltips[button] = tooltip

        def act() -> None:
            self.guarded(action, outcome)

        if confirm is None:
            button.on_click(lambda _: None if button.disabled else act())
        else:

            def ask() -> None:
                outcome.say("")
                confirm.ask()

            def yes() -> None:
                if confirm.open:  # a second click on Yes finds the question closed: dropped
                    confirm.close()
                    act()

            button.on_click(lambda _: None if button.disabled else ask())
            confirm.yes.on_click(lambda _: yes())
            confirm.cancel.on_click(lambda _: confirm.close())
        return button

    def outcome_of(self, button: w.Button) -> Outcome:
        return self._outcomes[button]

    def allow(self, button: w.Button, why_not: str = "") -> None:
        """Enable ``button``, or disable it with the reason (its tooltip says it; a subclass may also show it)."""
        button.disabled = bool(why_not)
        button.tooltip = why_not or self._tooltips.get(button, "")

    def guarded(self, action: Callable[[], object], outcome: Outcome | None = None, clear: bool = True):
        """Run a panel action; a user error shows on ``outcome`` (default: the panel's message line) in red,
        replacing what it said before, instead of a traceback in the kernel log. ``clear``: start from an empty
        line (a background task keeps what its start said)."""
        line = outcome or self.message
        try:
            if clear:
                self._say(line, "")
            return action()
        except USER_ERRORS as exc:
            said = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
            self._say(line, error_html(self.relabel(said)))
            return None
        finally:
            self.update_static()

    def relabel(self, message: str) -> str:
        """``message`` with its leading field name replaced by this panel's label for it (field_labels)."""
        field, sep, rest = message.partition(": ")
        return f"{self.field_labels[field]}{sep}{rest}" if sep and field in self.field_labels else message

    @staticmethod
    def _say(line: Outcome | w.HTML, text_html: str) -> None:
        if isinstance(line, Outcome):
            line.say(text_html)
        else:
            line.value = text_html

    def in_background(
        self, what: str, action: Callable[[], object], buttons: Iterable[w.Button] = (), outcome: Outcome | None = None
    ) -> None:
        """Run slow work (an export, a measurement) in a thread so the kernel stays free; ``buttons`` are
        disabled at once (a second click must not slip in before the thread runs) and ``what`` shows on
        ``outcome`` meanwhile, with its seconds once it takes longer than SHOW_ELAPSED_AFTER_S. One task at a time:
        ``wait()`` blocks until it ends and returns its result."""
        if self._task is not None and self._task.is_alive():
            raise RuntimeError(refused("panel", f"busy with {self._task_what or 'another task'}", "wait for it to end"))
        buttons, line = list(buttons), outcome or Outcome()
        done = threading.Event()

        def show_elapsed(started: float) -> None:
            while not done.wait(ELAPSED_EVERY_S):
                seconds = time.monotonic() - started
                if what and seconds >= SHOW_ELAPSED_AFTER_S:
                    line.doing.value = busy_html(what, seconds)

        def work() -> None:
            try:
                self._task_result = self.guarded(action, line, clear=False)
            finally:
                done.set()
                line.doing.value = ""
                for b in buttons:
                    b.disabled = False
                self.after_task()
                self.update_static()

        self._task_what = what
        line.say("")
        line.doing.value = busy_html(what) if what else ""
        for b in buttons:
            b.disabled = True
        self._task_result = None
        threading.Thread(target=show_elapsed, args=(time.monotonic(),), daemon=True, name="trainbook-elapsed").start()
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
