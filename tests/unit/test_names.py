"""The one name rule (toolkit.names): what it accepts, what it refuses and how it says so."""

import pytest

from toolkit import names
from toolkit.errors import bounded_repr


@pytest.mark.parametrize("good", ["a", "tiny", "my-model.v2", "A_1", "9lives", "x" * 255])
def test_names_that_are_allowed(good):
    assert names.is_name(good) and names.check_name(good) == good


@pytest.mark.parametrize("bad", ["", "-x", ".hidden", "..", "a/b", "a\\b", "a b", "a:1", "x" * 256, 7, None])
def test_names_that_are_refused_say_field_value_and_rule(bad):
    assert not names.is_name(bad)
    with pytest.raises(KeyError) as err:
        names.check_name(bad, "data.asset", KeyError)
    message = err.value.args[0]
    assert message.startswith(f"data.asset: {bounded_repr(bad)} is not allowed; allowed: letters, digits")


@pytest.mark.parametrize("ref, parsed", [("m", ("m", None)), ("m:1", ("m", 1)), ("m.v2:12", ("m.v2", 12))])
def test_references(ref, parsed):
    assert names.split_ref(ref) == parsed == names.parse_ref(ref, "model")


@pytest.mark.parametrize("ref", ["m:", "m:0", "m:-1", "m:x", ":1", "a/b:1", "m:1:2", "../m", "m:²", "m:\u0663"])
def test_bad_references_are_refused(ref):
    assert names.split_ref(ref) is None
    with pytest.raises(ValueError, match=rf"^model: {ref!r} is not a reference; allowed: 'name' \(latest\)"):
        names.parse_ref(ref, "model")
