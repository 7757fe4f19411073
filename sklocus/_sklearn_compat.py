"""The private parts of scikit-learn that sklocus builds on, imported in one place.

Parameter constraints (``Interval``, ``StrOptions``, ``HasMethods``), their
checker and ``_fit_context`` are how scikit-learn's own estimators validate
their parameters, but they live in private modules that a release may move.
Every sklocus module takes them from here, so that such a move is answered in
this file alone (imbalanced-learn keeps ``utils/_sklearn_compat.py`` for the
same reason).
"""

from sklearn.base import _fit_context
from sklearn.utils._param_validation import (
    HasMethods,
    Interval,
    StrOptions,
    validate_parameter_constraints,
)

__all__ = [
    "HasMethods",
    "Interval",
    "StrOptions",
    "_fit_context",
    "validate_parameter_constraints",
]
