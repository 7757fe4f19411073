"""The routing policy stage: from probabilities to the model each query goes to.

A router routes by probability alone, by ``P(correct) - w * cost / max(cost)``
(a weight of cost), by a threshold on the probability (the cheapest model that
reaches it), or within a budget (the weight of cost whose held-out routes kept
within a mean cost per query, :mod:`sklocus._budget`). The router's settings
hold unless a call gives its own.
"""

from __future__ import annotations

import warnings

import numpy as np

from sklocus._budget import held_out_curve, weight_within
from sklocus._router._rows import ModelRows
from sklocus._routing import (
    best_models,
    check_policy,
    cost_utilities,
    threshold_utilities,
)
from sklocus.evaluations import check_evaluation_sets, to_matrix


def call_policy(router, cost_weight, min_probability, budget=None):
    """Return the routing policy of a call: ``(cost_weight, min_probability)``.

    A call's own setting replaces the router's policy; unset, the router's
    holds. A budget routes by the weight it chooses from ``budget_curve_``.
    Checked by :func:`~sklocus._routing.check_policy`.
    """
    given = check_policy(
        cost_weight,
        min_probability,
        budget,
        has_costs=router.cost_ is not None,
        has_budget_curve=router.budget_curve_ is not None,
    )
    if "budget" in given:
        weight, _ = weight_within(router.budget_curve_, budget)
        return weight, None
    if "cost_weight" in given:
        return cost_weight, None
    if "min_probability" in given:
        return 0, min_probability
    if router.budget_cost_weight_ is not None:
        return router.budget_cost_weight_, None
    return router.cost_weight, router.min_probability


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


def fit_budget(router, scorer, evaluation_sets, cost):
    """Set ``budget_curve_`` and ``budget_cost_weight_``, as ``budget`` says.

    ``scorer`` holds the router's stages as fitted; the heads and group
    offsets, like the embeddings, are fitted again on the half each model is
    embedded from.
    """
    group_of = None
    if scorer.learnt_groups is not None:
        codes = router.evaluation_groups_.tolist()
        group_of = {
            query: router.groups_[code]
            for query, code in zip(router.evaluation_queries_.tolist(), codes)
            if code >= 0
        }

    def probabilities(embeddings, queries, seen):
        # Query heads, like the embeddings, from the seen half alone (under
        # the pool's blend): heads of every evaluation would have seen the
        # queries they are scored on.
        heads = None
        scores, seen_queries = to_matrix(seen)
        if scorer.heads is not None:
            heads = scorer.heads.fit_models(
                scorer, embeddings, router.model_offsets_, seen_queries, scores
            )
        rows = ModelRows(embeddings, router.model_offsets_, heads)
        if group_of is not None:
            # So are the group offsets, each seen query in its group, and
            # the held-out queries take the groups their text tells.
            offsets = scorer.group_offsets.fit_models(
                scorer, rows, seen_queries, scores, group_of
            )
            rows = rows._replace(group_offsets=offsets)
        found = [p for _, p, _ in scorer.chunks(rows, queries)]
        return np.concatenate(found)

    router.budget_curve_ = held_out_curve(
        check_evaluation_sets(evaluation_sets),
        router.embeddings_,
        scorer.locus.embed,
        probabilities,
        cost,
    )
    router.budget_cost_weight_, met = weight_within(router.budget_curve_, router.budget)
    if not met:
        warnings.warn(
            f"no weight of cost kept the mean cost per query within "
            f"budget={router.budget!r} on held-out evaluations (the least was "
            f"{router.budget_curve_[1].min():.6g}); the router routes by the "
            f"weight of that least cost, {router.budget_cost_weight_:g}",
            UserWarning,
            stacklevel=5,
        )
