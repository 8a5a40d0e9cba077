"""Optional dependencies: a missing one is reported with the extra that installs it, and the table that says so
agrees with pyproject.toml's extras."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from toolkit import extras

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _extras() -> dict[str, list[str]]:
    return tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]


def test_every_optional_import_names_a_package_of_its_extra():
    declared = _extras()
    for module, (distribution, extra) in extras.OPTIONAL_IMPORTS.items():
        assert distribution in declared.get(extra, []), f"{module}: {distribution} is not in the '{extra}' extra"


def test_the_extras_that_a_job_image_needs_are_declared():
    assert set(extras.JOB_IMAGE_EXTRAS) <= set(_extras())
    assert not {"notebook", "test"} & set(extras.JOB_IMAGE_EXTRAS)


@pytest.mark.parametrize("missing, extra", [("onnxruntime", "serve"), ("azure", "azure"), ("azure.ai.ml", "azure"),
                                            ("matplotlib.pyplot", "notebook"), ("papermill", "notebook"),
                                            ("playwright", "test")])
def test_a_missing_optional_package_names_its_extra(missing, extra):
    message = extras.missing_extra_message(ModuleNotFoundError(f"No module named '{missing}'", name=missing),
                                           "trainbook export")
    assert message.startswith(f"trainbook export needs {missing.split('.')[0]}")
    assert f"the '{extra}' extra" in message and f"pip install 'trainbook[{extra}]'" in message


def test_a_missing_core_or_unknown_module_is_not_blamed_on_an_extra():
    for name in ("torch", "no_such_module", None):
        assert extras.missing_extra_message(ModuleNotFoundError("x", name=name), "trainbook train") is None


def test_importing_the_widgets_without_the_notebook_extra_names_it(monkeypatch):
    import importlib
    import sys

    import widgets

    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # how a core-only install looks to an import
    with pytest.raises(ModuleNotFoundError, match=r"^import widgets needs ipywidgets .*pip install 'trainbook\[notebook\]'"):
        importlib.reload(widgets)
