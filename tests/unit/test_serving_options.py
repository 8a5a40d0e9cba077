"""ServingOptions (toolkit.deploy.serving.options): the one owner of the serving knobs' bounds and of the
environment variables that carry them to a server process."""

import math

import pytest

from toolkit.deploy.serving.options import ServingOptions, ServingOptionsError
from toolkit.deploy.serving.runtimes import RUNTIMES


def test_the_environment_round_trips_every_option():
    options = ServingOptions(runtime="torch", max_batch=8, max_wait_ms=2.5, threads=4, header_timeout=3.0,
                             body_timeout=4.0, request_timeout=60.0)
    env = options.environment()
    assert env["GUNICORN_CMD_ARGS"] == "--threads 4" and env["WORKER_COUNT"] == "1"
    assert ServingOptions.from_environment(env) == options
    assert ServingOptions.from_environment({}) == ServingOptions(), "unset variables take the defaults"


@pytest.mark.parametrize("field, value, allowed", [
    ("runtime", "tensorrt", "onnx, torch"),
    ("max_batch", 0, "1 to 256"), ("max_batch", 257, "1 to 256"), ("max_batch", 2.5, "1 to 256"),
    ("max_batch", True, "1 to 256"), ("max_wait_ms", -1, "0 to 1000"), ("max_wait_ms", math.nan, "0 to 1000"),
    ("threads", 0, "1 to 256"), ("header_timeout", 0.1, "0.5 to 3600 seconds"),
    ("body_timeout", 3601, "0.5 to 3600 seconds"), ("request_timeout", "10", "0.5 to 3600 seconds"),
])
def test_a_value_out_of_bounds_is_refused_naming_flag_value_and_bounds(field, value, allowed):
    with pytest.raises(ServingOptionsError) as err:
        ServingOptions(**{field: value})
    flag = "--" + field.replace("_", "-")
    assert str(err.value) == f"{flag}: {value!r} is not allowed; allowed: {allowed}"


def test_a_malformed_variable_is_refused_naming_the_variable():
    with pytest.raises(ServingOptionsError, match=r"^TRAINBOOK_MAX_BATCH: 'many' is not allowed; allowed: 1 to 256"):
        ServingOptions.from_environment({"TRAINBOOK_MAX_BATCH": "many"})


def test_every_runtime_the_options_allow_can_be_loaded():
    from toolkit.deploy.serving.options import WEIGHTS

    assert set(WEIGHTS) == set(RUNTIMES)
