"""The MLTable ``paths`` rule on its text alone: only a relative path inside the table's folder may be read."""

from __future__ import annotations

import pytest

from toolkit.catalogue.mltable import path_problem


@pytest.mark.parametrize("entry", [
    {"file": "/etc/passwd"}, {"file": "../outside.csv"}, {"file": "sub/../../outside.csv"}, {"file": "a/.."},
    {"file": "https://example.com/data.csv"}, {"file": "azureml://datastores/x/paths/y.csv"},
    {"file": "file:///etc/passwd"}, {"file": "C:/data/x.csv"}, {"file": "..\\outside.csv"}, {"file": "~/x.csv"},
    {"file": ""}, {"file": 3}, {"file": None}, "data.csv",
])
def test_a_path_that_can_leave_the_folder_is_refused_naming_the_entry(entry):
    problem = path_problem(entry)
    assert problem is not None and repr(entry) in problem, problem
    assert "allowed: a file inside the folder" in problem


@pytest.mark.parametrize("file", ["data.csv", "./data.csv", "sub/part-1.csv", "a..b.csv", "..data.csv", "x/.y.csv"])
def test_a_relative_path_inside_the_folder_is_allowed(file):
    assert path_problem({"file": file}) is None
