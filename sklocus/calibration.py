"""Calibrated probabilities of a correct answer, fitted on held-out evaluations.

A predicted P(correct) is calibrated when, of the pairs predicted at about p, about
a fraction p are answered correctly (:func:`sklocus.metrics.reliability_curve`).
LOCUS's predictions need not be: on new models and new queries they drift towards
over- or under-confidence. As :class:`sklearn.calibration.CalibratedClassifierCV`
does for a classifier, :class:`ProbabilityCalibrator` learns a monotone map from
predictions to probabilities on pairs the predictor did not fit, either a sigmoid
of the logit (Platt's two parameters) or an isotonic step function, and applies it
to new predictions. :class:`~sklocus.LocusRouter` fits one with
``calibration="isotonic"`` or ``"sigmoid"`` on its pool's evaluations, each
predicted from an embedding of the other half of its model's evaluations (the
network itself may have been trained on the pool); for an embedder, fit one on
models and queries it never saw.

Read more in the :ref:`User Guide <calibrated_probabilities>`.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import minimize
from sklearn.base import BaseEstimator
from sklearn.isotonic import IsotonicRegression
from sklearn.utils.validation import check_is_fitted

from sklocus._sklearn_compat import StrOptions, _fit_context
from sklocus.metrics import _observed_pairs

__all__ = ["ProbabilityCalibrator"]

# Probabilities are clipped this far from 0 and 1 before their logits are taken.
_EPS = 1e-6
# Share of the prediction itself in the isotonic map: it keeps the map strictly
# increasing beyond its first and last steps too (where isotonic regression is
# flat), so that no two models tie that did not, at a cost of at most this much
# calibration.
_IDENTITY = 1e-3


def _logits(p):
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


class ProbabilityCalibrator(BaseEstimator):
    """Map predicted probabilities of a correct answer to calibrated ones.

    Fitted on pairs of predictions and observed scores that the predictor did not
    see (held-out models, queries, or both), as :mod:`sklearn.calibration` fits its
    calibrators on held-out folds. Scores between 0 and 1 (partial credit) count as
    they are.

    Read more in the :ref:`User Guide <calibrated_probabilities>`.

    Parameters
    ----------
    method : {"isotonic", "sigmoid"}, default="isotonic"
        ``"isotonic"`` fits isotonic regression (a non-decreasing step function
        of the prediction) and maps through its steps' centres, interpolated
        linearly, which needs a few thousand pairs; ``"sigmoid"`` fits
        ``sigmoid(a * logit(p) + b)``, two parameters, for fewer pairs.

    Attributes
    ----------
    x_thresholds_, y_thresholds_ : ndarray of shape (n_thresholds,) or None
        With ``"isotonic"``: the predictions and calibrated probabilities
        between which new predictions are interpolated, both increasing: each
        step's mean prediction and mean score, and (0, 0) and (1, 1) where they
        lie below the first and above the last. The map is 0.999 of this
        interpolation plus 0.001 of the prediction, strictly increasing, so it
        keeps the order of the models on each query.
    slope_, intercept_ : float or None
        With ``"sigmoid"``: ``a`` and ``b``.
    n_pairs_ : int
        Observed pairs fitted on.

    Examples
    --------
    >>> import numpy as np
    >>> from sklocus.calibration import ProbabilityCalibrator
    >>> rng = np.random.default_rng(0)
    >>> truth = rng.uniform(size=5000)
    >>> scores = (rng.uniform(size=5000) < truth).astype(float)
    >>> overconfident = np.clip(2 * truth - 0.5, 0.01, 0.99)
    >>> calibrator = ProbabilityCalibrator("sigmoid").fit(overconfident, scores)
    >>> round(float(calibrator.predict([0.99])[0]), 1)
    0.9
    """

    _parameter_constraints = {"method": [StrOptions({"isotonic", "sigmoid"})]}

    def __init__(self, method="isotonic"):
        self.method = method

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, probabilities, scores):
        """Fit the map on predictions and the scores observed for them.

        Parameters
        ----------
        probabilities : array-like
            Predicted probabilities in [0, 1], of any shape.
        scores : array-like
            Observed scores in [0, 1] of the same shape, NaN where unobserved
            (those pairs are left out).

        Returns
        -------
        self
        """
        y, p = _observed_pairs(
            np.atleast_2d(scores), np.atleast_2d(probabilities), "calibration"
        )
        self.n_pairs_ = len(y)
        self.x_thresholds_ = self.y_thresholds_ = None
        self.slope_ = self.intercept_ = None
        if self.method == "isotonic":
            self.x_thresholds_, self.y_thresholds_ = _isotonic_steps(p, y)
        else:
            self.slope_, self.intercept_ = _fit_sigmoid(_logits(p), y)
        return self

    def predict(self, probabilities):
        """Return calibrated probabilities, in the shape given, as float32.

        Parameters
        ----------
        probabilities : array-like
            Predicted probabilities in [0, 1], of any shape.

        Returns
        -------
        ndarray of the same shape, float32
        """
        check_is_fitted(self, "n_pairs_")
        p = np.asarray(probabilities, dtype=np.float64)
        if p.size and not (np.isfinite(p).all() and 0 <= p.min() and p.max() <= 1):
            raise ValueError("probabilities must be finite numbers in [0, 1]")
        if self.method == "isotonic":
            stepped = np.interp(p, self.x_thresholds_, self.y_thresholds_)
            out = (1.0 - _IDENTITY) * stepped + _IDENTITY * p
        else:
            out = 1.0 / (1.0 + np.exp(-(self.slope_ * _logits(p) + self.intercept_)))
        return out.astype(np.float32)


def _isotonic_steps(p, y):
    """Return the increasing points of the isotonic map (see the attributes)."""
    fitted = IsotonicRegression(y_min=0.0, y_max=1.0).fit(p, y).predict(p)
    levels, step = np.unique(fitted, return_inverse=True)
    centres = np.bincount(step, p) / np.bincount(step)
    x, y = [centres], [levels]
    if centres[0] > 0 and levels[0] > 0:
        x.insert(0, [0.0])
        y.insert(0, [0.0])
    if centres[-1] < 1 and levels[-1] < 1:
        x.append([1.0])
        y.append([1.0])
    return np.concatenate(x), np.concatenate(y)


def _fit_sigmoid(z, y):
    """Return ``(a, b)`` minimising the log loss of ``sigmoid(a z + b)`` against y."""

    def loss_and_gradient(theta):
        t = theta[0] * z + theta[1]
        residual = 1.0 / (1.0 + np.exp(-t)) - y
        loss = float(np.sum(np.logaddexp(0.0, t) - y * t))
        return loss, np.array([residual @ z, residual.sum()])

    # A slope of at least 0 keeps the map increasing: never reverses an order.
    found = minimize(
        loss_and_gradient,
        np.array([1.0, 0.0]),
        jac=True,
        method="L-BFGS-B",
        bounds=[(0.0, None), (None, None)],
    )
    return float(found.x[0]), float(found.x[1])
