"""The ``--set name=value`` option shared by the benchmark scripts."""

from __future__ import annotations

import ast


def parse_overrides(items):
    """``["n_layers=0", "query_noise=(0.2, 0.1)"]`` to a dict of Python values.

    Raises
    ------
    SystemExit
        Naming the item that is not ``name=value`` with a Python literal value.
    """
    overrides = {}
    for item in items:
        name, equals, value = item.partition("=")
        try:
            if not equals:
                raise ValueError
            overrides[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            raise SystemExit(
                f"--set {item!r}: expected name=value with a Python literal value"
            ) from None
    return overrides
