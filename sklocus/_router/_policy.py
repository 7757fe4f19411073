"""The routing policy stage: from probabilities to the model each query goes to.

A router routes by probability alone, by ``P(correct) - w * cost / max(cost)``
(a weight of cost), by a threshold on the probability (the cheapest model that
reaches it), or within a budget (the weight of cost whose held-out routes kept
within a mean cost per query, :mod:`sklocus._budget`). The router's settings
hold unless a call gives its own.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from sklocus._budget import held_out_curve, weight_within
from sklocus._router._stage import Stage
from sklocus._routing import (
    best_models,
    check_policy,
    cost_utilities,
    threshold_utilities,
)
from sklocus.evaluations import check_evaluation_sets, to_matrix


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

    @classmethod
    def from_arrays(cls, values):
        # Every router has a policy, with or without costs.
        fields = cls.ATTRIBUTES.items()
        return cls(**{name: values.get(public) for public, name in fields})

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
    """:func:`~sklocus._budget.held_out_curve` of the router's stages.

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
