"""A budget: the weight of cost whose routes keep within a mean cost per query.

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

import numpy as np

from sklocus._cost_quality import route_points
from sklocus._routing import cost_utilities
from sklocus.evaluations import query_sort_key

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
