"""Fixtures that take seconds, and the tests they make slow.

A module's fixture that trains a model costs seconds once per test file; a test
that uses it is only quick in appearance. :func:`slow_fixture` declares the cost
where it is paid, and conftest.py marks every test that uses such a fixture,
directly or through another fixture, ``slow``: ``-m "not slow"`` then leaves out
the set-up with the tests that need it.
"""

import pytest

# (module, name) of each fixture declared slow.
_SLOW_FIXTURES = set()


def slow_fixture(function=None, **kwargs):
    """``pytest.fixture`` (same arguments) for a fixture that takes seconds."""

    def declare(function):
        _SLOW_FIXTURES.add((function.__module__, function.__name__))
        return pytest.fixture(**kwargs)(function)

    return declare if function is None else declare(function)


def uses_a_slow_fixture(item):
    """Whether test ``item`` uses a fixture declared by :func:`slow_fixture`."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # a doctest
        return False
    for name in item.fixturenames:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            function = fixturedef.func
            key = (getattr(function, "__module__", None), function.__name__)
            if key in _SLOW_FIXTURES:
                return True
    return False
