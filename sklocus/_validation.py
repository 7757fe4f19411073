"""Checks of arguments that several modules share."""

from __future__ import annotations

import numbers
import unicodedata

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


def shown(value, limit: int = 72) -> str:
    """``repr`` of a value as a user would write it: ``'q1'``, not ``np.str_('q1')``.

    A repr longer than ``limit`` characters is cut, ending in an ellipsis (and,
    for a text, its closing quote and its length): a message quotes a question,
    not the page it fills.
    """
    value = value.item() if isinstance(value, np.generic) else value
    text = repr(value)
    if len(text) <= limit:
        return text
    if isinstance(value, str):
        return f"{text[: limit - 2]}…{text[-1]} ({len(value):,} characters)"
    return f"{text[: limit - 1]}…"


def check_model_names(names, what: str = "model names") -> list:
    """Return model names as a list, refusing names a user could not type back.

    A name is a string or an integer (the column labels a router's ``Y`` may
    have); a string may not be empty or hold control characters, line or
    paragraph separators (a name with a newline cannot be addressed on a command
    line or in a table). Names must be distinct.

    Parameters
    ----------
    names : sequence
        The names.
    what : str
        What they are, for messages.

    Returns
    -------
    list
    """
    names = as_item_list(names, what)
    seen = set()
    for i, name in enumerate(names):
        if isinstance(name, np.generic):
            name = name.item()
        if isinstance(name, bool) or not isinstance(name, str | int):
            raise TypeError(
                f"{what}[{i}] is {shown(name)}, a {type(name).__name__}; a model is "
                "named by a string or an integer"
            )
        if isinstance(name, str) and not name.strip():
            raise ValueError(f"{what}[{i}] is {name!r}; a model name may not be blank")
        if isinstance(name, str) and has_control_character(name):
            raise ValueError(
                f"{what}[{i}] is {name!r}, which holds a control character; a model "
                "name may hold only printable characters and spaces"
            )
        if name in seen:
            raise ValueError(
                f"{what} hold {name!r} twice; each model needs its own name"
            )
        seen.add(name)
    return names


def check_count(value, name: str, minimum: int = 1) -> int:
    """Return ``value`` as an int: an integer of at least ``minimum``, or refused.

    The one check of a count in sklocus (``k``, ``n_resamples``, a batch
    size...): ``True`` is not 1 and ``2.0`` is not 2.

    Parameters
    ----------
    value : object
    name : str
        The parameter, named in the message.
    minimum : int, default=1

    Returns
    -------
    int
    """
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < minimum
    ):
        least = (
            "a positive integer"
            if minimum == 1
            else f"an integer of at least {minimum}"
        )
        raise ValueError(f"{name}={value!r} must be {least}")
    return int(value)


def has_control_character(text: str) -> bool:
    """Tell whether ``text`` holds a character that does not print as itself.

    Those are controls (a newline, a tab), format and private-use characters,
    and the line and paragraph separators.
    """
    return any(unicodedata.category(c)[0] == "C" or c in "\u2028\u2029" for c in text)


def check_costs(values, names, *, what="cost", positive=False, missing=False):
    """Return each model's cost as float64, checked by the one rule of sklocus.

    Costs are finite and at least 0: a model may be free (one the team already
    runs). Callers that divide by a cost (coverage per unit of cost, a ladder of
    total costs) ask for ``positive``; the model map, which shows models whose cost
    is unknown, allows ``missing`` (NaN).

    Parameters
    ----------
    values : array-like of shape (n_models,)
        The costs, in the order of ``names``.
    names : sequence of str
        The models, to name the offending one.
    what : str, default="cost"
        What the costs are called in messages (a column's name).
    positive : bool, default=False
        Refuse 0 too.
    missing : bool, default=False
        Accept NaN, for a cost not known.

    Returns
    -------
    ndarray of shape (n_models,), float64
    """
    raw = np.asarray(values, dtype=object).ravel()
    for i, value in enumerate(raw):
        if isinstance(value, bool | np.bool_ | str | bytes):
            name = f"model {shown(names[i])}" if i < len(names) else f"entry {i}"
            raise TypeError(
                f"{name} has {what} {value!r}; costs must be numbers, not "
                f"{type(value).__name__}"
            )
    try:
        values = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise type(error)(f"{what} must be numbers, one per model: {error}") from None
    if values.shape != (len(names),):
        raise ValueError(
            f"{what} has shape {values.shape}; give one cost per model ({len(names)})"
        )
    bad = cost_violations(values, positive=positive, missing=missing)
    if bad.any():
        i = int(np.argmax(bad))
        rule = "positive" if positive else "at least 0"
        raise ValueError(
            f"model {shown(names[i])} has {what} {float(values[i])!r}; costs must "
            f"be finite and {rule}" + (" (NaN where unknown)" if missing else "")
        )
    return values


def cost_violations(values, *, positive=False, missing=False):
    """Mask of the costs that break the rule of :func:`check_costs`, any shape."""
    known = ~np.isnan(values) if missing else np.ones(values.shape, dtype=bool)
    with np.errstate(invalid="ignore"):
        below = values <= 0 if positive else values < 0
        return known & (~np.isfinite(values) | below)
