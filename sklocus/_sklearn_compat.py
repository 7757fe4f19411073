"""The private parts of scikit-learn that sklocus builds on, imported in one place.

Parameter constraints (``Interval``, ``StrOptions``, ``HasMethods``), their
checkers (``validate_parameter_constraints``, and ``validate_params`` for
functions) and ``_fit_context`` are how scikit-learn validates its estimators'
parameters and its public functions' arguments, but they live in private modules
that a release may move. Every sklocus module takes them from here, so that such a
move is answered in this file alone (imbalanced-learn keeps
``utils/_sklearn_compat.py`` for the same reason). ``_pprint`` is the estimator
printer, whose choice of parameters to print ``sklocus._repr`` extends so that
those holding data print as summaries.
"""

import numpy as np
from sklearn.base import _fit_context
from sklearn.utils import _pprint
from sklearn.utils._param_validation import (
    HasMethods,
    StrOptions,
    validate_parameter_constraints,
    validate_params,
)
from sklearn.utils._param_validation import Interval as _Interval

__all__ = [
    "HasMethods",
    "Interval",
    "StrOptions",
    "_pprint",
    "_fit_context",
    "validate_parameter_constraints",
    "validate_params",
]


class Interval(_Interval):
    """scikit-learn's ``Interval``, refusing booleans.

    ``True`` is a ``numbers.Integral`` and a ``numbers.Real`` to Python and
    passes scikit-learn's own intervals: ``k=True`` would mean 1 and
    ``budget=True`` a budget of 1. Every interval sklocus checks is this one.
    """

    def is_satisfied_by(self, val):
        return not isinstance(val, bool | np.bool_) and super().is_satisfied_by(val)
