"""The data panel: register a file or folder as a versioned asset, see the catalogue, measure loading.

    panel = DataPanel(workspace=None, config="demo").show()
    panel.name.value, panel.path.value, panel.type.value = "notes", "/data/notes.txt", "uri_file"
    panel.register()            # what the Register button does (in a background thread there); returns the asset
    panel.measure_loading()     # the loading advisor on the chosen asset; panel.wait() for its report

The form checks itself on every change with :func:`toolkit.catalogue.data_assets.registration_problems` (the same checks
``register`` makes), so a bad name or path is named under the form before anything is written. Snapshotting a
large folder and the advisor's timed training steps run in a background thread: the kernel stays free.
"""

from __future__ import annotations

import time
from pathlib import Path

import ipywidgets as w

from toolkit.catalogue import data_assets
from toolkit.catalogue.workspace import Workspace
from toolkit.errors import refused
from toolkit.tables import html_table
from widgets.panel import Confirm, Panel, error_html, hint_html, ok_html, plot_png, png_html, pre_html

PICKER_ENTRIES = 200  # suggestions shown by the path box: enough to browse, few enough to stay responsive


def path_suggestions(text: str, limit: int = PICKER_ENTRIES) -> list[str]:
    """Entries of the folder being typed (folders end with '/'), for the path box's drop-down."""
    typed = Path(text).expanduser() if text else Path.cwd()
    folder = typed if text.endswith("/") or not text else typed.parent
    try:
        entries = sorted(folder.iterdir(), key=lambda p: (not p.is_dir(), p.name))[:limit]
    except OSError:  # missing or unreadable folder: no suggestions; the check below the form says why
        return []
    return [f"{p}/" if p.is_dir() else str(p) for p in entries if not p.name.startswith(".")]


class DataPanel(Panel):
    def __init__(
        self,
        workspace: str | Path | None = None,
        config: str = "demo",
        tune_steps: int = 15,
        name: str = "",
        path: str = "",
        type: str = "uri_folder",
        description: str = "",
    ):
        super().__init__()
        self.ws = Workspace.open(workspace)
        self.config_name, self.tune_steps = config, tune_steps
        self._form_start = {"name": name, "path": path, "type": type, "description": description}  # clear_form
        self.name = w.Text(value=name, description="name", placeholder="e.g. pydoc")
        self.path = w.Combobox(
            value=path,
            options=path_suggestions(path),
            description="path",
            placeholder="a file or folder",
            ensure_option=False,
            layout=w.Layout(width="520px"),
        )
        self.type = w.Dropdown(options=list(data_assets.TYPES), value=type, description="type")
        self.description = w.Text(value=description, description="about", layout=w.Layout(width="520px"))
        self.problems = w.HTML()
        self.register_button = self.button(
            "Register", self.register_in_background, "primary", "snapshot the path and record it as the next version"
        )
        for control in (self.name, self.path, self.type):
            control.observe(lambda _: self.check_form(), names="value")
        self.path.observe(lambda change: setattr(self.path, "options", path_suggestions(change["new"])), names="value")

        self.versions = w.HTML()
        self.show_archived = w.Checkbox(value=False, description="show archived")
        self.show_archived.observe(lambda _: self.refresh_versions(), names="value")
        self.archive_choice = w.Dropdown(description="version")
        # archiving hides a version from listings and from its name's latest: asked before it is done
        self.archive_confirm = Confirm(
            lambda: (
                f"Archive {self.archive_choice.value}? It leaves the listings and '{self._name_of_choice()}' "
                f"(latest); '{self.archive_choice.value}' still resolves."
            ),
            yes="Yes, archive",
        )
        self.archive_button = self.button(
            "Archive", self.archive, tooltip="hide from listings; name:N still resolves", confirm=self.archive_confirm
        )

        self.advisor_asset = w.Dropdown(description="asset")
        self.measure_button = self.button(
            "Measure loading",
            self.measure_loading_in_background,
            "info",
            "time real training steps for a few DataLoader settings",
        )
        self.advice_text = w.HTML()
        self.advice_plot = w.Image(format="png", layout=w.Layout(max_width="760px", display="none"))
        self._advice_png = b""
        self.registered: data_assets.DataAsset | None = None
        self.report = None

        self.view = w.VBox(
            [
                w.HTML("<b>Register data</b>"),
                self.name,
                self.path,
                w.HBox([self.type, self.description]),
                self.problems,
                self.register_button,
                self.outcome_of(self.register_button).view,
                w.HTML("<b>Catalogue</b>"),
                self.versions,
                w.HBox([self.show_archived, self.archive_choice, self.archive_button]),
                self.archive_confirm.view,
                self.outcome_of(self.archive_button).view,
                w.HTML("<b>Loading advisor</b>"),
                w.HBox([self.advisor_asset, self.measure_button]),
                self.outcome_of(self.measure_button).view,
                self.advice_text,
                self.advice_plot,
            ]
        )
        self.check_form()
        self.refresh_versions()

    # --- registration ----------------------------------------------------------------------------------------

    def check_form(self) -> dict[str, str]:
        """Show what registration would refuse, field by field, and allow Register only when nothing would."""
        problems = data_assets.registration_problems(self.name.value, self.path.value, self.type.value)
        # an empty field is not an error yet, just not done: a grey hint instead of a red message
        empty = [f for f in ("name", "path") if not getattr(self, f).value.strip()]
        shown = [error_html(m) for f, m in problems.items() if f not in empty]
        if empty:
            shown.append(hint_html(f"fill in: {', '.join(empty)}"))
        self.problems.value = "<br>".join(shown)
        self.allow(self.register_button, "the form above says what to fix first" if problems else "")
        return problems

    def register(self) -> data_assets.DataAsset:
        """Register the form's path; the asset's version is new only if its content is."""
        before = {a.ref for a in data_assets.list_assets(self.ws, self.name.value, include_archived=True)}
        asset = data_assets.register(
            self.ws, self.name.value, self.path.value, type=self.type.value, description=self.description.value
        )
        news = "registered" if asset.ref not in before else "unchanged content, already"
        self.outcome_of(self.register_button).say(
            ok_html(
                f"{news} {asset.ref}: {asset.file_count:,} file(s), "
                f"{asset.size_bytes / 2**20:,.2f} MB, sha256 {asset.sha256[:12]}"
            )
        )
        self.registered = asset
        self.refresh_versions()
        return asset

    def clear_form(self) -> None:
        """The form as the panel was made (its constructor's name, path, type and description), no message: after
        a scripted demo, so that a person's own registration inherits none of its values."""
        for field, value in self._form_start.items():
            getattr(self, field).value = value
        self.outcome_of(self.register_button).say("")
        self.check_form()
        self.update_static()

    def register_in_background(self) -> None:
        self.in_background(
            f"snapshotting {self.path.value}",
            self.register,
            [self.register_button],
            self.outcome_of(self.register_button),
        )

    # --- the catalogue ---------------------------------------------------------------------------------------

    def refresh_versions(self) -> list[data_assets.DataAsset]:
        assets = data_assets.list_assets(self.ws, include_archived=self.show_archived.value)
        rows = [
            {
                "asset": a.ref,
                "type": a.type,
                "MB": f"{a.size_bytes / 2**20:,.2f}",
                "files": a.file_count,
                "sha256": a.sha256[:12],
                "registered": time.strftime("%Y-%m-%d %H:%M", time.localtime(a.created)),
                "archived": "yes" if a.archived else "",
                "about": a.description,
            }
            for a in assets
        ]
        self.versions.value = html_table(
            rows,
            empty="no data registered in this workspace yet",
            highlight=lambda r: "#f3f3f3" if r["archived"] else "",
        )
        live = [a.ref for a in assets if not a.archived]
        self.archive_choice.options = live
        self.archive_choice.value = live[-1] if live else None
        self.allow(self.archive_button, "" if live else "no version to archive")
        names = sorted({a.name for a in assets if not a.archived})
        current = self.advisor_asset.value
        self.advisor_asset.options = names
        self.advisor_asset.value = current if current in names else (names[0] if names else None)
        self.update_static()
        return assets

    def archive(self, ref: str | None = None) -> data_assets.DataAsset:
        """Archive ``ref`` (default: the version chosen in the drop-down); archiving twice is harmless."""
        ref = ref or self.archive_choice.value
        if not ref:
            raise ValueError(refused("version", "none chosen", "one of the catalogue's versions"))
        asset = data_assets.archive(self.ws, ref)
        self.outcome_of(self.archive_button).say(
            ok_html(
                f"archived {asset.ref}: hidden from listings and from '{asset.name}' (latest); "
                f"'{asset.ref}' still resolves"
            )
        )
        self.refresh_versions()
        return asset

    def _name_of_choice(self) -> str:
        return str(self.archive_choice.value or "").rsplit(":", 1)[0]

    # --- the loading advisor -----------------------------------------------------------------------------------

    def measure_loading(self):
        """Time real training steps of the config's model on the chosen asset for a few loader settings."""
        from toolkit import config as config_mod
        from toolkit.report import plots
        from toolkit.train.loading_advisor import tune
        from toolkit.runs.data_pin import pin_data_asset

        if not self.advisor_asset.value:
            raise ValueError(refused("asset", "none chosen", "a registered asset (register one above)"))
        self._show_advice(None)  # a new measurement: the last one's table and plot go, whatever this one ends in
        cfg = pin_data_asset(
            config_mod.load(
                self.config_name, [f"data.asset={self.advisor_asset.value}", f"data.workspace={self.ws.root}"]
            )
        )
        report = tune(cfg, steps=self.tune_steps)
        self._show_advice(report, plot_png(plots.loader_trials, report))
        self.outcome_of(self.measure_button).say(ok_html(f"measured {self.advisor_asset.value}"))
        return report

    def _show_advice(self, report, png: bytes = b"") -> None:
        self.report, self._advice_png = report, png
        self.advice_text.value = pre_html(report.summary()) if report else ""
        self.advice_plot.value = png
        self.advice_plot.layout.display = "" if png else "none"
        self.update_static()

    def measure_loading_in_background(self) -> None:
        self.in_background(
            f"measuring loading of {self.advisor_asset.value} ({self.tune_steps} training steps per setting)",
            self.measure_loading,
            [self.measure_button],
            self.outcome_of(self.measure_button),
        )

    def static_html(self) -> str:
        return (
            f"<div>{self.outcome_of(self.register_button).value}<b>Catalogue</b>{self.versions.value}"
            f"{self.outcome_of(self.archive_button).value}"
            f"<b>Loading advisor</b>{self.outcome_of(self.measure_button).value}{self.advice_text.value}"
            f"{png_html(self._advice_png, 760)}</div>"
        )
