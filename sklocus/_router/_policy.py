"""The routing policy stage: from probabilities to the model each query goes to.

A router routes by probability alone, by ``P(correct) - w * cost / max(cost)``
(a weight of cost), by a threshold on the probability (the cheapest model that
reaches it), or within a budget. The router's settings hold unless a call
gives its own.

``LocusRouter(budget=B)`` routes by ``P(correct) - w * cost / max(cost)`` with the
weight ``w`` that gave the best quality at a mean cost per query of at most ``B``
on evaluations the embeddings had not seen. The pool's queries are split in two
halves by a fixed order of the queries (so the split does not depend on the order
given); each model is embedded from its evaluations on one half, every model is
routed over the other half's queries at each weight of a ladder, and each
weight's mean cost (over every query) and quality (the mean observed score of the
chosen models) are averaged over the two halves, weighted by their queries and
by their scored routes. A model with no evaluation on the half it would be
embedded from is left out of the routes over the other half, which it has not
been held out from.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from sklocus._cost_quality import route_points
from sklocus._router._stage import Stage
from sklocus._routing import (
    best_models,
    check_policy,
    cost_utilities,
    threshold_utilities,
)
from sklocus.evaluations import check_evaluation_sets, query_sort_key, to_matrix

# The weights a budget chooses among: 0 and a geometric ladder whose top routes by
# cost alone unless two costs lie within 1e-3 of the dearest (utilities are
# probabilities). Finite, so that a model file holds the choice as a number.
BUDGET_WEIGHTS = np.concatenate([[0.0], np.geomspace(1e-3, 1e3, 61)])


def held_out_curve(ragged, embeddings, embed, probabilities, cost):
    """Each weight's mean cost and quality on queries the embeddings did not see.

    Parameters
    ----------
    ragged : RaggedEvaluations
        The pool's evaluations, one set per model.
    embeddings : ndarray of shape (n_models, embedding_dim)
        Each model's embedding from all its evaluations.
    embed : callable
        ``embed(sets)`` embeds a list of ``{query: score}`` dicts as the router does.
    probabilities : callable
        ``probabilities(embeddings, queries, seen)`` gives P(correct), shape
        ``(n_queries, n_models)``, as the router routes by, where ``seen`` holds
        each model's evaluations the embeddings were built from (empty for a
        model left out), for whatever else the router fits on them.
    cost : ndarray of shape (n_models,)

    Returns
    -------
    ndarray of shape (3, n_weights)
        The weights, their mean costs and their mean qualities.
    """
    queries = ragged.queries
    order = sorted(range(len(queries)), key=lambda i: query_sort_key(queries[i]))
    fold = np.empty(len(queries), dtype=np.int64)
    fold[order] = np.arange(len(queries)) % 2
    n_models = ragged.n_sets
    sets = [(ragged.set_codes(i), ragged.set_scores(i)) for i in range(n_models)]
    costs = np.zeros(len(BUDGET_WEIGHTS))
    qualities = np.zeros(len(BUDGET_WEIGHTS))
    routed = 0
    scored = np.zeros(len(BUDGET_WEIGHTS), dtype=np.int64)
    for half in (0, 1):
        held = np.flatnonzero(fold == half)
        seen = [
            {queries[c]: float(s) for c, s in zip(codes, scores) if fold[c] != half}
            for codes, scores in sets
        ]
        kept = [i for i, evaluations in enumerate(seen) if evaluations]
        if not len(held) or not kept:
            continue
        z = np.array(embeddings, dtype=np.float32, copy=True)
        z[kept] = embed([seen[i] for i in kept])
        column = {code: j for j, code in enumerate(held)}
        scores = np.full((len(held), n_models), np.nan)
        for i, (codes, values) in enumerate(sets):
            mine = fold[codes] == half
            scores[[column[c] for c in codes[mine]], i] = values[mine]
        predicted = np.array(
            probabilities(z, [queries[c] for c in held], seen), copy=True
        )
        left_out = np.setdiff1d(np.arange(n_models), kept)
        predicted[:, left_out] = -np.inf  # never chosen: not held out from this half
        half_costs, half_qualities, counts = route_points(
            scores,
            predicted,
            np.broadcast_to(cost[None, :], scores.shape),
            BUDGET_WEIGHTS,
            cost_utilities,
        )
        costs += len(held) * half_costs
        routed += len(held)
        qualities += counts * np.nan_to_num(half_qualities)
        scored += counts
    if not routed or not scored.all():
        raise ValueError(
            "a budget needs evaluations to choose its weight of cost on: the "
            "pool's queries are split in two halves, each predicted from the "
            "other, and some weight's routes met no observed score"
        )
    return np.vstack([BUDGET_WEIGHTS, costs / routed, qualities / scored])


def weight_within(curve, budget):
    """Return the weight of best quality whose mean cost is at most ``budget``.

    Returns ``(weight, met)``: among equally good weights the largest (the
    cheapest routes); when no weight keeps within the budget, the weight of least
    mean cost, and ``met`` False.
    """
    weights, costs, qualities = curve
    within = costs <= budget * (1 + 1e-9)
    if not within.any():
        return float(weights[np.argmin(costs)]), False
    best = qualities[within].max()
    chosen = np.flatnonzero(within & (qualities >= best - 1e-12))[-1]
    return float(weights[chosen]), True


@dataclasses.dataclass(frozen=True, eq=False)
class Policy(Stage):
    """What routes weigh besides the probabilities: costs, and a budget's choice.

    Parameters
    ----------
    cost : ndarray of shape (n_models,) or None
        ``cost_``: each model's cost, as given (not fitted).
    budget_curve : ndarray of shape (3, n_weights) or None
        ``budget_curve_``: with ``budget``, the weights of cost tried and the
        held-out mean cost and quality of each.
    budget_cost_weight : float or None
        ``budget_cost_weight_``: the weight within the router's budget.
    """

    cost: np.ndarray | None = None
    budget_curve: np.ndarray | None = None
    budget_cost_weight: float | None = None

    ATTRIBUTES = {
        "cost_": "cost",
        "budget_curve_": "budget_curve",
        "budget_cost_weight_": "budget_cost_weight",
    }
    ROWS = ("cost",)
    OPTIONAL = False  # every router has a policy, with or without costs

    @classmethod
    def fit(cls, stages, evaluation_sets, cost, budget, kept_queries):
        """Fit the policy of a router of ``cost`` (or None), within ``budget`` if given.

        ``stages`` are the router's other stages as fitted; ``kept_queries``
        its kept evaluations' queries.
        """
        if budget is None:
            return cls(cost)
        curve = _held_out_budget_curve(stages, evaluation_sets, cost, kept_queries)
        weight, met = weight_within(curve, budget)
        if not met:
            warnings.warn(
                f"no weight of cost kept the mean cost per query within "
                f"budget={budget!r} on held-out evaluations (the least was "
                f"{curve[1].min():.6g}); the router routes by the weight of that "
                f"least cost, {weight:g}",
                UserWarning,
                stacklevel=5,
            )
        return cls(cost, curve, weight)

    def call(self, cost_weight, min_probability, budget, settings):
        """Return the routing policy of a call: ``(cost_weight, min_probability)``.

        A call's own setting replaces the router's policy; unset, the router's
        holds (``settings``: its ``cost_weight`` and ``min_probability``). A
        budget routes by the weight it chooses from ``budget_curve``. Checked
        by :func:`~sklocus._routing.check_policy`.
        """
        given = check_policy(
            cost_weight,
            min_probability,
            budget,
            has_costs=self.cost is not None,
            has_budget_curve=self.budget_curve is not None,
        )
        if "budget" in given:
            weight, _ = weight_within(self.budget_curve, budget)
            return weight, None
        if "cost_weight" in given:
            return cost_weight, None
        if "min_probability" in given:
            return 0, min_probability
        if self.budget_cost_weight is not None:
            return self.budget_cost_weight, None
        return settings


def utilities(probabilities, cost, cost_weight, min_probability=None):
    """Utilities of ``(n_queries, n_models)`` probabilities, as routed."""
    if min_probability is None and (cost is None or cost_weight == 0):
        return probabilities
    cost = np.broadcast_to(cost[None, :], probabilities.shape)
    if min_probability is not None:
        return threshold_utilities(probabilities, cost, min_probability)
    return cost_utilities(probabilities, cost, cost_weight)


def ranking(probabilities, excluded, cost, cost_weight, min_probability, k):
    """Each query's ``k`` best models, best first, as indices ``(n_queries, k)``.

    Ranked by utility under the policy, the first being
    :func:`~sklocus._routing.best_models`' choice (near-ties to the model
    listed first); ``excluded`` (a mask) are never ranked.
    """
    # An excluded model neither qualifies for a threshold nor is chosen.
    routable = np.where(excluded, -np.inf, probabilities.astype(np.float64))
    utility = utilities(routable, cost, cost_weight, min_probability)
    # Lift best_models' choice above the rest before sorting.
    first = best_models(utility)
    utility[np.arange(len(utility)), first] = np.inf
    return np.argsort(-utility, axis=1, kind="stable")[:, :k]


def _held_out_budget_curve(stages, evaluation_sets, cost, kept_queries):
    """:func:`held_out_curve` of the router's stages.

    The heads and group offsets, like the embeddings, are fitted again on the
    half each model is embedded from.
    """
    groups = stages.groups
    group_of = None
    if groups is not None and groups.learnt is not None:
        group_of = {
            query: groups.labels[code]
            for query, code in zip(kept_queries.tolist(), groups.query_codes.tolist())
            if code >= 0
        }
    calibration = stages.calibration
    model_offsets = None if calibration is None else calibration.offsets

    def probabilities(embeddings, queries, seen):
        # Query heads, like the embeddings, from the seen half alone (under
        # the pool's blend): heads of every evaluation would have seen the
        # queries they are scored on.
        heads = None
        scores, seen_queries = to_matrix(seen)
        if stages.heads is not None:
            heads = stages.heads.fit_rows(
                stages, embeddings, model_offsets, seen_queries, scores
            )
        others = stages.for_models(embeddings, model_offsets, heads)
        if group_of is not None:
            # So are the group offsets, each seen query in its group, and
            # the held-out queries take the groups their text tells.
            offsets = groups.fit_rows(others, seen_queries, scores, group_of)
            others = stages.for_models(
                embeddings, model_offsets, heads, offsets["offsets"]
            )
        return np.concatenate([p for _, p, _ in others.chunks(queries)])

    return held_out_curve(
        check_evaluation_sets(evaluation_sets),
        stages.locus.embeddings,
        stages.locus.embed,
        probabilities,
        cost,
    )
