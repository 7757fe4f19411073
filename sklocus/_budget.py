"""A budget: the weight of cost whose routes keep within a mean cost per query.

``LocusRouter(budget=B)`` routes by ``P(correct) - w * cost / max(cost)`` with the
weight ``w`` that gave the best quality at a mean cost per query of at most ``B``
on evaluations the embeddings had not seen. The pool's queries are split in two
halves by a fixed order of the queries (so the split does not depend on the order
given); each model is embedded from its evaluations on one half, every model is
routed over the other half's queries at each weight of a ladder, and each
weight's mean cost and quality (the mean observed score of the chosen models) are
averaged over the two halves, weighted by their queries. A model with no
evaluation on a half keeps its embedding from all of its evaluations there.
"""

from __future__ import annotations

import numpy as np

from sklocus._cost_quality import cost_quality_curve
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
        ``probabilities(embeddings, queries)`` gives P(correct), shape
        ``(n_models, n_queries)``, as the router routes by.
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
    total = 0
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
        scores = np.full((n_models, len(held)), np.nan)
        for i, (codes, values) in enumerate(sets):
            mine = fold[codes] == half
            scores[i, [column[c] for c in codes[mine]]] = values[mine]
        predicted = probabilities(z, [queries[c] for c in held])
        try:
            half_costs, half_qualities, _ = cost_quality_curve(
                scores, predicted, cost, cost_weights=BUDGET_WEIGHTS
            )
        except ValueError:  # no chosen model observed at some weight
            continue
        costs += len(held) * half_costs
        qualities += len(held) * half_qualities
        total += len(held)
    if not total:
        raise ValueError(
            "a budget needs evaluations to choose its weight of cost on: each "
            "model's queries are split in two halves, and no half predicted the "
            "other with an observed score"
        )
    return np.vstack([BUDGET_WEIGHTS, costs / total, qualities / total])


def weight_within(curve, budget):
    """Return the weight of best quality whose mean cost is at most ``budget``.

    Returns ``(weight, met)``: among equally good weights the largest (the
    cheapest routes); when no weight keeps within the budget, the largest weight
    of the ladder, and ``met`` False.
    """
    weights, costs, qualities = curve
    within = costs <= budget * (1 + 1e-9)
    if not within.any():
        return float(weights[-1]), False
    best = qualities[within].max()
    chosen = np.flatnonzero(within & (qualities >= best - 1e-12))[-1]
    return float(weights[chosen]), True
