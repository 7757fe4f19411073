"""The ``--set NAME=VALUE`` grammar: ``LocusEmbedder`` parameters on a command line.

One definition, for ``sklocus fit`` and for scripts that take the same option
(the repository's benchmarks and research scripts).
"""

from __future__ import annotations

import ast

# Parameters that hold Python objects, which a command line cannot give.
PYTHON_ONLY = {
    "query_encoder": "Python",
    "callbacks": "Python",
    "module": "Python",
    "criterion": "Python",
}


def parse_settings(settings, *, reserved=PYTHON_ONLY):
    """Read ``["name=value", ...]`` as parameters of :class:`~sklocus.LocusEmbedder`.

    A value is read as a Python literal where it is one (``3``, ``1e-3``,
    ``(0.2, 0.1)``, ``None``, ``True``) and kept as text otherwise (``mlp``).

    Parameters
    ----------
    settings : iterable of str
        ``NAME=VALUE`` items, as the option gave them.
    reserved : mapping of str to str, default=PYTHON_ONLY
        Parameters that cannot be set this way, each with what sets it instead
        (another option, or ``"Python"``).

    Returns
    -------
    dict
        Parameter names to values, in the order given.

    Raises
    ------
    ValueError
        Naming the item that is not ``NAME=VALUE``, is reserved, or names no
        parameter of ``LocusEmbedder`` (the message lists those it has).
    """
    from sklocus import LocusEmbedder

    known = LocusEmbedder().get_params()
    parameters = {}
    for setting in settings:
        name, equals, text = setting.partition("=")
        name = name.strip()
        if not equals or not name:
            raise ValueError(f"--set {setting!r}: expected NAME=VALUE")
        if name in reserved:
            raise ValueError(f"--set {name}: give it with {reserved[name]}, not --set")
        if name not in known:
            raise ValueError(
                f"--set {name}: LocusEmbedder has no parameter {name!r}; its "
                f"parameters are {sorted(set(known) - set(reserved))}"
            )
        try:
            parameters[name] = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            parameters[name] = text.strip()
    return parameters
