"""Checks of arguments that several modules share."""

from __future__ import annotations

import numpy as np


def as_item_list(values, what: str) -> list:
    """Return a 1-D sequence of queries or names as a list.

    A bare string is refused: ``list("q1")`` would silently read it as the
    characters ``["q", "1"]``.

    Parameters
    ----------
    values : sequence
        A list, tuple, 1-D array, pandas Series or Index.
    what : str
        What the items are, for messages: "queries", "names", ...

    Returns
    -------
    list
    """
    if isinstance(values, str | bytes):
        raise TypeError(
            f"expected a sequence of {what}; got a single {type(values).__name__} "
            f"{values!r}, which would be read as its characters. Wrap it in a "
            f"list: [{values!r}]"
        )
    if hasattr(values, "ndim") and values.ndim != 1:
        raise ValueError(
            f"expected a 1-D sequence of {what}; got an array of shape {values.shape}"
        )
    try:
        return list(values)
    except TypeError:
        raise TypeError(
            f"expected a sequence of {what}; got {type(values).__name__}"
        ) from None


def shown(value) -> str:
    """``repr`` of a value as a user would write it: ``'q1'``, not ``np.str_('q1')``."""
    return repr(value.item() if isinstance(value, np.generic) else value)
