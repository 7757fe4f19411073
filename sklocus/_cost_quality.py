"""Quality against cost: a router's curve, its frontier, and RouterBench's AIQ.

A router with a cost trade-off (``LocusRouter``'s ``cost_weight``) is a family of
routers, one per weight; each routes a set of queries at some mean cost per query
to some mean quality. The points of the family, and those of any other router,
compare through their *frontier*: the non-decreasing concave hull of the points.
Any point on a segment between two points of the hull is reached by routing
each query by one router or the other at random, in the proportion that lands
on it; beyond the best point, spending more is never forced, so the frontier
stays flat. RouterBench (Hu et al., 2024) scores a router by the mean height of
its frontier over a range of costs, from the cheapest model's to the dearest's:
the Average Improvement in Quality, AIQ. Below the cheapest point a router
reaches, the frontier counts as 0, as RouterBench's own implementation counts it.

Scores and probabilities are ``(n_queries, n_models)``, as everywhere in
:mod:`sklocus.metrics`; a cost is one number per model, or per query and model
(for prices that depend on the prompt's length).
"""

from __future__ import annotations

import numbers

import numpy as np

from sklocus._routing import (
    best_models,
    check_cost_matrix,
    cost_utilities,
    threshold_utilities,
)
from sklocus._sklearn_compat import validate_params

# The weights of cost that cost_quality_curve sweeps by default: 0, a geometric
# ladder wide enough that its top routes every query to the cheapest model
# (utilities are probabilities, so a weight of 1e3 on costs in [0, 1] decides
# by cost alone unless two costs are within 1e-3 of the dearest), and infinity.
_DEFAULT_WEIGHTS = np.concatenate([[0.0], np.geomspace(1e-3, 1e3, 61), [np.inf]])


@validate_params(
    {
        "scores": ["array-like"],
        "probabilities": ["array-like"],
        "cost": ["array-like"],
        "cost_weights": ["array-like", None],
        "min_probabilities": ["array-like", None],
    },
    prefer_skip_nested_validation=True,
)
def cost_quality_curve(
    scores, probabilities, cost, *, cost_weights=None, min_probabilities=None
):
    """Mean cost and quality of routing by ``P(correct) - w * cost`` over weights w.

    For each weight, each query goes to the model of highest utility
    (:func:`cost_utilities`, ties as :func:`~sklocus.metrics.best_models` breaks
    them), and the point is the mean cost of the chosen models over every query,
    and their mean observed score over the queries whose chosen model was
    evaluated on them. With ``min_probabilities``, the curve is the
    threshold policy's instead (:func:`threshold_utilities`): the cheapest model
    whose probability reaches each threshold.

    Read more in the :ref:`User Guide <routing_on_a_budget>`.

    Parameters
    ----------
    scores : array-like of shape (n_queries, n_models)
        Observed scores, NaN where unobserved.
    probabilities : array-like of shape (n_queries, n_models)
        Predicted probabilities of a correct answer.
    cost : array-like of shape (n_models,) or (n_queries, n_models)
        Each model's cost, or its cost on each query; finite and at least 0.
    cost_weights : array-like of shape (n_weights,), default=None
        The weights, each at least 0 (``inf`` allowed). ``None`` sweeps 0, 61
        weights from 1e-3 to 1e3 spaced geometrically, and ``inf``, which routes
        every query to the cheapest model.
    min_probabilities : array-like of shape (n_settings,), default=None
        Thresholds in [0, 1] to sweep instead of weights; not with
        ``cost_weights``.

    Returns
    -------
    costs : ndarray of shape (n_weights,)
        Mean cost per query of each weight's routes.
    qualities : ndarray of shape (n_weights,)
        Mean observed score of each weight's routes.
    settings : ndarray of shape (n_weights,)
        The weights (or thresholds), in the order of the points.

    Examples
    --------
    >>> from sklocus.metrics import cost_quality_curve
    >>> scores = [[1, 1], [0, 1], [1, 1]]
    >>> probabilities = [[0.9, 0.95], [0.2, 0.9], [0.8, 0.9]]
    >>> costs, qualities, _ = cost_quality_curve(
    ...     scores, probabilities, [1.0, 10.0], cost_weights=[0, 0.5, float("inf")])
    >>> costs.tolist(), qualities.round(2).tolist()
    ([10.0, 4.0, 1.0], [1.0, 1.0, 0.67])
    """
    scores = np.asarray(scores, dtype=np.float64)
    probabilities = np.asarray(probabilities, dtype=np.float64)
    if scores.ndim != 2 or scores.shape != probabilities.shape:
        raise ValueError(
            f"scores have shape {scores.shape} and probabilities "
            f"{probabilities.shape}; both must be (n_queries, n_models)"
        )
    cost = check_cost_matrix(cost, scores.shape)
    if min_probabilities is None:
        settings, utilities = cost_weights, cost_utilities
        if settings is None:
            settings = _DEFAULT_WEIGHTS
    elif cost_weights is None:
        settings, utilities = min_probabilities, threshold_utilities
    else:
        raise ValueError("give cost_weights or min_probabilities, not both")
    settings = np.asarray(settings, dtype=np.float64).ravel()
    high = np.inf if utilities is cost_utilities else 1.0
    if not len(settings) or not ((settings >= 0) & (settings <= high)).all():
        name = "cost_weights" if high == np.inf else "min_probabilities"
        bound = "at least 0 (inf allowed)" if high == np.inf else "in [0, 1]"
        raise ValueError(
            f"{name} are {settings.tolist()[:5]}; expected at least one, each {bound}"
        )
    if not np.isfinite(probabilities).all():
        raise ValueError("probabilities must be finite numbers; got NaN or inf")
    costs, qualities, counts = route_points(
        scores, probabilities, cost, settings, utilities
    )
    if not counts.all():
        setting = settings[np.argmin(counts)]
        raise ValueError(
            f"at setting {setting}, no query's chosen model has an observed "
            "score; the point's quality is undefined"
        )
    return costs, qualities, settings


def route_points(scores, probabilities, cost, settings, utilities):
    """Each setting's mean cost, mean quality and number of scored routes.

    The cost is over every query (a route's cost is known whether or not its
    score is); the quality over the queries whose chosen model has a score, NaN
    where none has. ``utilities(probabilities, cost, setting)`` is
    :func:`cost_utilities` or :func:`threshold_utilities`.
    """
    rows = np.arange(len(scores))
    costs = np.empty(len(settings))
    qualities = np.full(len(settings), np.nan)
    counts = np.zeros(len(settings), dtype=np.int64)
    for i, setting in enumerate(settings):
        chosen = best_models(utilities(probabilities, cost, setting))
        got = scores[rows, chosen]
        observed = ~np.isnan(got)
        costs[i] = cost[rows, chosen].mean()
        counts[i] = observed.sum()
        if counts[i]:
            qualities[i] = got[observed].mean()
    return costs, qualities, counts


def _check_points(costs, qualities):
    costs = np.asarray(costs, dtype=np.float64).ravel()
    qualities = np.asarray(qualities, dtype=np.float64).ravel()
    if costs.shape != qualities.shape or not len(costs):
        raise ValueError(
            f"got {len(costs)} costs and {len(qualities)} qualities; expected one "
            "quality per cost, at least one point"
        )
    if not (np.isfinite(costs).all() and np.isfinite(qualities).all()):
        raise ValueError("costs and qualities must be finite numbers")
    return costs, qualities


@validate_params(
    {"costs": ["array-like"], "qualities": ["array-like"]},
    prefer_skip_nested_validation=True,
)
def quality_cost_frontier(costs, qualities):
    """Return the non-decreasing concave hull of quality-cost points.

    Read more in the :ref:`User Guide <routing_on_a_budget>`.

    Parameters
    ----------
    costs, qualities : array-like of shape (n_points,)
        Points, in any order: a router's curve (:func:`cost_quality_curve`), or
        single models' costs and qualities, whose frontier is what routing each
        query to a model drawn at random reaches.

    Returns
    -------
    costs, qualities : ndarray of shape (n_vertices,)
        The hull's vertices by increasing cost, from the cheapest point to the
        cheapest point of highest quality. Between vertices the frontier is the
        segment; beyond the last, it stays at its quality.

    Examples
    --------
    >>> from sklocus.metrics import quality_cost_frontier
    >>> quality_cost_frontier([1, 2, 3, 4], [0.5, 0.55, 0.8, 0.7])
    (array([1., 3.]), array([0.5, 0.8]))
    """
    costs, qualities = _check_points(costs, qualities)
    # By cost, and at one cost the best quality first (the others lie under it).
    order = np.lexsort((-qualities, costs))
    costs, qualities = costs[order], qualities[order]
    keep = np.concatenate([[True], costs[1:] > costs[:-1]])
    costs, qualities = costs[keep], qualities[keep]
    top = int(np.argmax(qualities))  # the first, so the cheapest, of the best
    hull = []
    for point in zip(costs[: top + 1], qualities[: top + 1]):
        # Andrew's monotone chain, upper half: drop a vertex that lies on or
        # under the segment from the one before it to the new point.
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (point[1] - y1) - (y2 - y1) * (point[0] - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append(point)
    hull = np.asarray(hull, dtype=np.float64)
    return hull[:, 0].copy(), hull[:, 1].copy()


@validate_params(
    {
        "costs": ["array-like"],
        "qualities": ["array-like"],
        "budget": [numbers.Real, "array-like"],
    },
    prefer_skip_nested_validation=True,
)
def quality_at_cost(costs, qualities, budget):
    """Return the frontier's quality at a mean cost per query of ``budget``.

    Parameters
    ----------
    costs, qualities : array-like of shape (n_points,)
        Points (:func:`cost_quality_curve`).
    budget : float or array-like
        Mean cost per query.

    Returns
    -------
    float or ndarray
        The quality; NaN below the cheapest point, which no mix of the points
        reaches.

    Examples
    --------
    >>> from sklocus.metrics import quality_at_cost
    >>> quality_at_cost([1, 3], [0.5, 0.8], [0.5, 2, 10]).tolist()
    [nan, 0.65, 0.8]
    """
    hull_costs, hull_qualities = quality_cost_frontier(costs, qualities)
    budget = np.asarray(budget, dtype=np.float64)
    found = np.interp(budget, hull_costs, hull_qualities)
    found = np.where(budget < hull_costs[0], np.nan, found)
    return float(found) if found.ndim == 0 else found


@validate_params(
    {"costs": ["array-like"], "qualities": ["array-like"], "target": [numbers.Real]},
    prefer_skip_nested_validation=True,
)
def cost_at_quality(costs, qualities, target):
    """Return the least mean cost per query at which the frontier reaches ``target``.

    Parameters
    ----------
    costs, qualities : array-like of shape (n_points,)
        Points (:func:`cost_quality_curve`).
    target : float
        The quality to reach.

    Returns
    -------
    float
        The cost; ``inf`` when no point reaches the target.

    Examples
    --------
    >>> from sklocus.metrics import cost_at_quality
    >>> cost_at_quality([1, 3], [0.5, 0.8], 0.65)
    2.0
    """
    hull_costs, hull_qualities = quality_cost_frontier(costs, qualities)
    if target > hull_qualities[-1]:
        return float("inf")
    if target <= hull_qualities[0]:
        return float(hull_costs[0])
    # The hull rises strictly up to its last vertex, so it inverts.
    return float(np.interp(target, hull_qualities, hull_costs))


@validate_params(
    {
        "costs": ["array-like"],
        "qualities": ["array-like"],
        "cost_range": [tuple, list, None],
    },
    prefer_skip_nested_validation=True,
)
def aiq(costs, qualities, *, cost_range=None):
    """RouterBench's Average Improvement in Quality: the frontier's mean height.

    ``AIQ = 1 / (c_max - c_min) * integral from c_min to c_max of F(c) dc``, where
    ``F`` is the :func:`quality_cost_frontier` of the points, flat beyond its best
    point and 0 below its cheapest.

    Read more in the :ref:`User Guide <routing_on_a_budget>`.

    Parameters
    ----------
    costs, qualities : array-like of shape (n_points,)
        Points (:func:`cost_quality_curve`).
    cost_range : (float, float), default=None
        ``(c_min, c_max)``; RouterBench takes the cheapest and the dearest
        model's mean cost per query, so that routers compare over one range.
        ``None`` takes the points' own cheapest and dearest.

    Returns
    -------
    float

    Examples
    --------
    >>> from sklocus.metrics import aiq
    >>> round(aiq([1, 3], [0.5, 0.8], cost_range=(1, 5)), 4)
    0.725
    """
    hull_costs, hull_qualities = quality_cost_frontier(costs, qualities)
    if cost_range is None:
        low, high = float(np.min(costs)), float(np.max(costs))
        if low == high:
            raise ValueError(
                f"every point costs {low}; give cost_range, the costs to average "
                "the frontier over"
            )
    else:
        low, high = (float(c) for c in cost_range)
    if not (np.isfinite(low) and np.isfinite(high) and high > low):
        raise ValueError(
            f"cost_range is ({low}, {high}); expected two finite costs, the "
            "second above the first"
        )
    # F is linear between the hull's vertices, flat beyond the last (np.interp
    # holds the end values) and 0 below the first. With every vertex inside the
    # range as a break, each piece is one trapezoid, and none straddles the step
    # at the first vertex.
    inside = hull_costs[(hull_costs > low) & (hull_costs < high)]
    grid = np.unique(np.concatenate([[low, high], inside]))
    heights = np.interp(grid, hull_costs, hull_qualities)
    left, right = grid[:-1], grid[1:]
    pieces = (right - left) * (heights[:-1] + heights[1:]) / 2
    area = pieces[left >= hull_costs[0]].sum()
    return float(area / (high - low))
