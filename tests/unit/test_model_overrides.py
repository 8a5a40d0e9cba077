"""One string names "your model" in forms and flags: an import path or a save_pretrained folder."""

from __future__ import annotations

import pytest

from toolkit import config as config_mod
from toolkit.train.models import model_overrides


def test_an_import_path_trains_a_custom_model_over_any_config():
    cfg = config_mod.load("llama", model_overrides("mypackage.models:build"))
    assert (cfg.model.name, cfg.model.factory, cfg.model.hf.architecture) == ("custom", "mypackage.models:build", "")
    assert config_mod.load("tiny", model_overrides("models/my_model.py:build")).model.factory == \
        "models/my_model.py:build"


def test_a_folder_trains_the_hugging_face_model_in_it(tmp_path):
    cfg = config_mod.load("llama", model_overrides(str(tmp_path)))
    assert (cfg.model.name, cfg.model.hf.source, cfg.model.hf.config) == ("hf", str(tmp_path), {})


def test_empty_keeps_the_configs_model():
    assert model_overrides("  ") == []


@pytest.mark.parametrize("text", ["no_such_folder", "mod:", ":fn", "mod:not-an-identifier"])
def test_anything_else_is_refused_naming_both_forms(text, tmp_path):
    with pytest.raises(ValueError) as caught:
        model_overrides(text)
    assert str(caught.value).startswith(f"model: {text!r} is neither an import path nor a folder; allowed: ")
