"""How a query is routed: the one rule, with its ties and its cost.

:func:`best_models` chooses, for each query, the model of highest utility, with
near-ties going to the model listed first; :func:`cost_utilities` is the utility
when cost counts. :class:`~sklocus.LocusRouter`, the metrics of
:mod:`sklocus.metrics` and the model map all route through these two.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from sklocus._sklearn_compat import Interval
from sklocus._validation import cost_violations

# Utilities this close to a query's best count as tied with it. A set embedded in
# another batch, or a row in another place of a GPU matrix product, rounds
# differently, so an exact copy of a model can score a few float32 ulps above the
# original (seen on the CPU and on an H200).
TIE_TOLERANCE = 1e-6


def best_models(utilities):
    """Choose the model each query is routed to: the one rule every router follows.

    The model of highest utility (a probability of a correct answer, less any
    cost); near-ties, utilities within ``TIE_TOLERANCE`` (1e-6) of the best, go to
    the model listed first, so that float rounding never decides a route.
    :meth:`sklocus.LocusRouter.predict`, :func:`routing_accuracy` and the model
    map all choose this way.

    Read more in the :ref:`User Guide <choosing_a_model>`.

    Parameters
    ----------
    utilities : array-like of shape (n_queries, n_models)
        Each model's utility for each query; ``-inf`` rules a model out.

    Returns
    -------
    ndarray of shape (n_queries,), int
        The column of the chosen model for each query.

    Examples
    --------
    >>> from sklocus.metrics import best_models
    >>> best_models([[0.9, 0.2], [0.6, 0.7], [0.5, 0.5 + 1e-9]])
    array([0, 1, 0])
    """
    utilities = np.asarray(utilities, dtype=np.float64)
    if utilities.ndim != 2 or utilities.shape[1] == 0:
        raise ValueError(
            f"utilities have shape {utilities.shape}; expected (n_queries, n_models) "
            "with at least one model"
        )
    if np.isnan(utilities).any():
        query, model = np.argwhere(np.isnan(utilities))[0]
        raise ValueError(
            f"the utility of model {model} for query {query} is NaN; a route needs "
            "a number for every model (-inf rules one out)"
        )
    best = utilities.max(axis=1, keepdims=True)
    return np.argmax(utilities >= best - TIE_TOLERANCE, axis=1)


# The routing policies, with their bounds: the one definition that a router's
# settings, each call's, the served router's requests and the command line are
# checked against.
POLICY_BOUNDS = {
    "cost_weight": (0.0, math.inf),
    "min_probability": (0.0, 1.0),
    "budget": (0.0, math.inf),
}


class PolicyError(ValueError):
    """A routing policy that cannot be routed by, naming the setting to blame.

    Parameters
    ----------
    setting : str
        ``"cost_weight"``, ``"min_probability"`` or ``"budget"``.
    message : str
    """

    def __init__(self, setting, message):
        super().__init__(message)
        self.setting = setting


def policy_constraint(name):
    """Return the scikit-learn parameter constraint of a policy setting."""
    low, high = POLICY_BOUNDS[name]
    if high == math.inf:
        return Interval(numbers.Real, low, None, closed="left")
    return Interval(numbers.Real, low, high, closed="both")


def check_policy(
    cost_weight=None,
    min_probability=None,
    budget=None,
    *,
    has_costs,
    has_budget_curve=True,
    weight_needs_costs=True,
):
    """Return the policies given (not None), as ``{name: value}``, each checked.

    A policy routes by a weight of cost, a threshold on the probability of a
    correct answer, or a budget; at most one is given. Each is a finite number
    within :data:`POLICY_BOUNDS` (``True`` is not 1, ``"0.5"`` not 0.5). A
    threshold, a budget and a weight other than 0 route by the models' costs.

    Parameters
    ----------
    cost_weight, min_probability, budget : float or None
    has_costs : bool
        Whether the router has costs.
    has_budget_curve : bool, default=True
        Whether the router has the held-out curve a call's budget chooses its
        weight from (a router fitted with a budget).
    weight_needs_costs : bool, default=True
        False for a router's own ``cost_weight``, which is ignored without
        costs.

    Returns
    -------
    dict

    Raises
    ------
    PolicyError
    """
    given = {
        name: value
        for name, value in zip(POLICY_BOUNDS, (cost_weight, min_probability, budget))
        if value is not None
    }
    for name, value in given.items():
        low, high = POLICY_BOUNDS[name]
        if (
            isinstance(value, bool | np.bool_)
            or not isinstance(value, numbers.Real)
            or not math.isfinite(value)
            or not low <= value <= high
        ):
            bound = (
                f"a finite number of at least {low:g}"
                if high == math.inf
                else f"in [{low:g}, {high:g}]"
            )
            raise PolicyError(name, f"{name}={value!r} must be {bound}")
    if len(given) > 1:
        settings = " and ".join(f"{name}={value!r}" for name, value in given.items())
        raise PolicyError(
            list(given)[-1],
            f"{settings}: give one policy (a weight of cost, a threshold or a "
            "budget), not several",
        )
    for name, value in given.items():
        # A weight of 0 routes by probability alone.
        needs_costs = name != "cost_weight" or (value != 0 and weight_needs_costs)
        if needs_costs and not has_costs:
            raise PolicyError(
                name,
                f"{name}={value!r} routes by the models' costs, which the router "
                "was fitted without",
            )
        if name == "budget" and not has_budget_curve:
            raise PolicyError(
                name,
                f"budget={value!r} chooses a weight of cost from the held-out "
                "curve of a router fitted with a budget; this one was fitted "
                "without",
            )
    return given


def check_cost_matrix(cost, shape):
    """Return ``cost`` as float64 of shape ``shape`` ``(n_queries, n_models)``.

    One cost per model is broadcast over the queries. Costs are finite and at
    least 0, as :func:`sklocus._validation.check_costs` has them.
    """
    try:
        cost = np.asarray(cost, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise type(error)(f"cost must be numbers: {error}") from None
    n_queries, n_models = shape
    if cost.shape == (n_models,):
        cost = np.broadcast_to(cost[None, :], shape)
    elif cost.shape != shape:
        raise ValueError(
            f"cost has shape {cost.shape}; expected one cost per model, "
            f"({n_models},), or one per query and model, {shape}"
        )
    bad = cost_violations(cost)
    if bad.any():
        query, model = np.argwhere(bad)[0]
        raise ValueError(
            f"cost of model {model} on query {query} is {cost[query, model]}; "
            "costs must be finite and at least 0"
        )
    return cost


def cost_utilities(probabilities, cost, cost_weight):
    """Return each model's utility for each query: P(correct) less weighted cost.

    ``probabilities - cost_weight * cost / max(cost)``: a weight of 0.1 trades at
    most 0.1 of probability against the dearest cost in ``cost`` (over every
    model and query, so that with per-query costs a dollar weighs the same on
    every query). An infinite weight decides
    by cost alone, and by probability among models of equal cost. The one
    definition that :class:`~sklocus.LocusRouter` and
    :func:`cost_quality_curve` route by.

    Parameters
    ----------
    probabilities : ndarray of shape (n_queries, n_models)
    cost : ndarray of shape (n_queries, n_models)
        Checked costs (:func:`check_cost_matrix`).
    cost_weight : float
        At least 0, or ``inf``.

    Returns
    -------
    ndarray of shape (n_queries, n_models), float64
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if cost_weight == 0:
        return probabilities
    if np.isinf(cost_weight):
        # Cost alone; probability only chooses among the cheapest.
        cheapest = cost == cost.min(axis=1, keepdims=True)
        return np.where(cheapest, probabilities, -np.inf)
    largest = cost.max()
    normalised = cost / largest if largest > 0 else cost
    return probabilities - cost_weight * normalised


# A new cost this many times the dearest one changes every weighted route.
COST_RESCALE_RATIO = 10.0


def cost_rescaling(existing, added):
    """Say how new costs would change what every cost weight means, if they would.

    Routes weigh ``cost / max(cost)`` (:func:`cost_utilities`): a model much
    dearer than the dearest one shrinks every other cost, so each cost weight
    and budget afterwards trades far less probability for cost than before.

    Parameters
    ----------
    existing : ndarray of shape (n_models,)
        The costs of the models routed to now.
    added : array-like of shape (n_new,)
        The new models' costs.

    Returns
    -------
    (int, str) or None
        The position in ``added`` of the first cost over
        ``COST_RESCALE_RATIO`` times the dearest existing one, and a message
        saying what it does; None when there is none.
    """
    dearest = float(np.max(existing)) if len(existing) else 0.0
    if dearest <= 0:
        return None
    for position, cost in enumerate(np.asarray(added, dtype=np.float64)):
        if cost > COST_RESCALE_RATIO * dearest:
            return position, (
                f"cost {cost:g} is {cost / dearest:,.0f} times the dearest "
                f"model's ({dearest:g}); costs are weighed relative to the "
                "dearest, so every cost weight and budget would then trade far "
                "less probability for cost than before"
            )
    return None


def threshold_utilities(probabilities, cost, min_probability):
    """Return utilities that route to the cheapest model likely enough to answer.

    The policy: among the models whose probability of a correct answer is at
    least ``min_probability``, the cheapest (the likeliest of those that cost
    the same); when no model is, the likeliest. The utilities encode the whole
    order, so that sorting by them ranks the models as the policy prefers them:
    the models that qualify, by cost and then probability, above the others, by
    probability. :func:`best_models` of the result is the policy's choice, its
    near-tie rule applying among the first models alike.

    Parameters
    ----------
    probabilities : ndarray of shape (n_queries, n_models)
    cost : ndarray of shape (n_queries, n_models)
        Checked costs (:func:`check_cost_matrix`).
    min_probability : float
        In [0, 1].

    Returns
    -------
    ndarray of shape (n_queries, n_models), float64
        Utilities above 1 for models that qualify, the probability for the others;
        the first choice's near-ties keep their probabilities' differences.
    """
    probabilities = np.asarray(probabilities, dtype=np.float64)
    qualifies = probabilities >= min_probability
    # Rank the qualifying models of each query by cost, then probability.
    keys = np.where(qualifies, cost, np.inf)
    order = np.lexsort((-probabilities, keys), axis=1)
    n_models = probabilities.shape[1]
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(n_models)[None, :], axis=1)
    # Each qualifying model sits in a band of width 1 above 2, below the band of
    # the model ranked before it; the cheapest's band holds its probability, so
    # that best_models sees near-ties among equally cheap models as ties.
    utilities = np.where(qualifies, 2.0 + (n_models - rank), probabilities)
    cheapest = qualifies & (keys == keys.min(axis=1, keepdims=True))
    top = 2.0 + n_models
    return np.where(cheapest, top + probabilities, utilities)
