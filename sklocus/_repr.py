"""Short reprs: a parameter that holds data prints as a summary, ``<1,000 texts>``.

scikit-learn prints an estimator, and every estimator nested in it, from the
parameters that its printer's ``_changed_params`` picks; a nested estimator's
own ``__repr__`` is not asked. So a :class:`~sklocus.PrecomputedEncoder` inside
a router would show its query ids and its array, and a short ``__repr__`` would
not help: worse, the printer takes ``repr(value)`` to measure a parameter that
did not fit on a line, and a ``__repr__`` shorter than the printer's own form
is written out as ``('query_encoder', SentenceEncoder(...))``.

Instead the printer's ``_changed_params`` passes the parameters of an estimator
that has a ``_repr_params`` method through it, the one change to scikit-learn's
printer. Every path of it then prints the same summaries in its own layout
(line wrapping, ``N_CHAR_MAX``): an encoder alone, inside a
:class:`~sklocus.LocusEmbedder`, a :class:`~sklearn.frozen.FrozenEstimator`, a
:class:`~sklocus.LocusRouter`, a :class:`~sklearn.pipeline.Pipeline`, and the
HTML diagram. ``get_params``, ``clone`` and pickling see the values unchanged.
With ``sklearn.set_config(print_changed_only=False)`` the printer does not call
``_changed_params`` and prints the data in full, as before.
"""

import functools

from sklocus._sklearn_compat import _pprint

__all__ = ["Summary", "summarize"]


class Summary:
    """A parameter's value as the printer shows it: ``text``, such as ``<1,000 texts>``.

    Parameters
    ----------
    text : str
    """

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def summarize(value, noun=""):
    """Return a :class:`Summary` of the size of ``value``, or ``value`` if it has none.

    Parameters
    ----------
    value : object
        An array (``<1,000 x 32>``) or a sized collection (``<1,000 texts>``).
    noun : str, default=""
        What the collection holds, in the plural, written after its length
        (in the singular when it holds one).

    Returns
    -------
    Summary or object

    Examples
    --------
    >>> import numpy as np
    >>> summarize(np.zeros((1000, 32)))
    <1,000 x 32>
    >>> summarize(["q1", "q2"], "queries")
    <2 queries>
    >>> summarize(["q1"], "queries")
    <1 query>
    """
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and len(shape) >= 2:
        return Summary("<" + " x ".join(f"{size:,}" for size in shape) + ">")
    try:
        length = len(value)
    except TypeError:
        return value
    if length == 1 and noun.endswith("ies"):
        noun = noun[: -len("ies")] + "y"
    elif length == 1 and noun.endswith("s"):
        noun = noun[: -len("s")]
    return Summary(f"<{length:,}{' ' + noun if noun else ''}>")


# scikit-learn's own, also when this module is imported again.
_changed_params = getattr(
    _pprint._changed_params, "__wrapped__", _pprint._changed_params
)


@functools.wraps(_changed_params)
def _summarized_params(estimator):
    """scikit-learn's ``_changed_params``, through the estimator's ``_repr_params``."""
    params = _changed_params(estimator)
    repr_params = getattr(estimator, "_repr_params", None)
    return params if repr_params is None else repr_params(params)


_pprint._changed_params = _summarized_params
