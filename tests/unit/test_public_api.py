"""The public API of ``toolkit`` (its __init__): every name resolves to a callable, lazily."""

import pytest

import toolkit


@pytest.mark.parametrize("name", toolkit.__all__)
def test_every_public_name_resolves_to_a_callable(name):
    assert callable(getattr(toolkit, name)), toolkit.PUBLIC_API[name]
    assert name in dir(toolkit)


def test_no_public_name_is_shadowed_by_a_subpackage():
    from pathlib import Path

    packages = {p.name for p in Path(toolkit.__file__).parent.iterdir() if (p / "__init__.py").exists()}
    assert not packages & set(toolkit.__all__)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'strat_run'"):
        toolkit.strat_run  # noqa: B018


def test_the_docs_list_every_public_name():
    """The public API's table moved from the README to the docs page "How the code is organised"."""
    from pathlib import Path

    page = Path(toolkit.__file__).resolve().parents[1] / "docs" / "pages" / "architecture.md"
    missing = [name for name in toolkit.__all__ if f"`toolkit.{name}`" not in page.read_text()]
    assert not missing, f"docs/pages/architecture.md does not list {missing}"

