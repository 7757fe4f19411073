r"""Strict JSON for request bodies: what :func:`json.loads` lets through, refused.

Python's parser takes ``NaN``, ``Infinity``, numbers that overflow a float
(``1e400``), integers of thousands of digits, escaped lone surrogates
(``"\ud800"`` escaped, not Unicode text) and repeated keys (the last one silently
wins). A request body holding any of them is refused with a
:class:`json.JSONDecodeError` whose message says what was found, and never
repeats more than a few characters of the body.
"""

from __future__ import annotations

import json
import math
import re

# An integer field here is a count (k), or a chat request's int64 seed (19
# digits); longer integers are refused before Python spends time converting
# them.
MAX_INTEGER_DIGITS = 20
_SHOWN_CHARS = 40
# Bodies larger than this are parsed on a worker thread, not the event loop.
PARSE_IN_THREAD_BYTES = 64 * 2**10
# Only an escape can put a surrogate in a string: raw surrogates are not UTF-8.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _Refused(ValueError):
    pass


def shorten(text, limit=_SHOWN_CHARS):
    """Return ``repr(text)`` cut to about ``limit`` characters, for messages.

    Parameters
    ----------
    text : object
    limit : int, default=40

    Returns
    -------
    str
    """
    shown = repr(text)
    if len(shown) <= limit:
        return shown
    return f"{shown[:limit]}... ({len(str(text)):,} characters)"


def _constant(name):
    raise _Refused(f"{name} is not a JSON number; give a finite number")


def _finite(text):
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {shorten(text)} overflows a float")
    return value


def _integer(text):
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _Refused(
            f"an integer of {len(text):,} digits; at most {MAX_INTEGER_DIGITS}"
        )
    return int(text)


def _object(pairs):
    found = dict(pairs)
    if len(found) < len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _Refused(f"the key {shorten(key)} appears twice in an object")
            seen.add(key)
    return found


def _check_unicode(value):
    """Refuse strings holding lone surrogates, anywhere in ``value``."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                code = ord(item[error.start])
                raise _Refused(
                    f"a string holds the lone surrogate \\u{code:04x}, which is not "
                    "Unicode text"
                ) from None


def loads(body):
    """Parse a request body as strict JSON.

    Parameters
    ----------
    body : bytes
        UTF-8 JSON text.

    Returns
    -------
    object

    Raises
    ------
    json.JSONDecodeError
        For invalid JSON, and for what :func:`json.loads` would accept but a
        request may not hold (see the module's docstring).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise json.JSONDecodeError(
            f"the body is not UTF-8 (byte {error.start:,})", "", error.start
        ) from None
    try:
        value = json.loads(
            text,
            parse_constant=_constant,
            parse_float=_finite,
            parse_int=_integer,
            object_pairs_hook=_object,
        )
        if _SURROGATE_ESCAPE.search(text):
            _check_unicode(value)
    except _Refused as error:
        raise json.JSONDecodeError(str(error), "", 0) from None
    except RecursionError:
        raise json.JSONDecodeError("the body is nested too deeply", "", 0) from None
    return value
