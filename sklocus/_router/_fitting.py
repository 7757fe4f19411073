"""Fitting a router's stages, in order, each on what the stages before predict.

LOCUS first (the embedder, fitted or frozen, and the pool's embeddings); then,
as the router's settings say, the pool calibration, the query heads, the
probability map, the query groups (given, or clusters) and the policy (costs,
and a budget's weight of cost). Also what older routers' settings and state
become today (:func:`merge_calibration_settings`, :func:`upgraded_state`).
"""

from __future__ import annotations

import numpy as np

from sklocus._router._exploration import Exploration
from sklocus._router._heads import QueryHeads, heads_wanted
from sklocus._router._locus import Locus
from sklocus._router._policy import Policy
from sklocus._router._pool_calibration import PoolCalibration
from sklocus._router._probability_map import ProbabilityMap
from sklocus._router._query_groups import QueryGroups
from sklocus._router._stages import Stages

# The router's ``calibration`` settings: whether each fits the pool calibration,
# and the method of the probability map it fits, if any.
CALIBRATIONS = {
    None: (False, None),
    "pool": (True, None),
    "isotonic": (False, "isotonic"),
    "sigmoid": (False, "sigmoid"),
    "pool+isotonic": (True, "isotonic"),
    "pool+sigmoid": (True, "sigmoid"),
}


# The fitted attributes the stages hold (the rest: classes_ and the kept
# evaluations, the router's own).
STATE_OF_STAGES = tuple(Stages(None).to_arrays())


def merge_calibration_settings(params):
    """Give settings of a router from before ``calibration=`` that one setting.

    Routers of model file format 6 (and their pickles) had ``calibrate`` (a
    bool) and ``calibration_method``; ``params`` (a dict of
    parameters, changed in place) is translated when it holds them with values
    they could take, and left as it is otherwise (to be refused as it is).
    """
    old = {"calibrate", "calibration_method"}
    if "calibration" in params or not old <= params.keys():
        return params
    pool, method = params["calibrate"], params["calibration_method"]
    if isinstance(pool, bool | np.bool_) and method in (None, "isotonic", "sigmoid"):
        del params["calibrate"], params["calibration_method"]
        parts = ["pool"] * bool(pool) + ([method] if method is not None else [])
        params["calibration"] = "+".join(parts) or None
    return params


def upgraded_state(state):
    """Return a pickled router's state as this sklocus's, changed in place.

    Routers from before ``calibration=`` get that one setting
    (:func:`merge_calibration_settings`); those from before ``query_clusters``
    get it as None, never having clustered. A fitted router from before its
    stages were objects (its fitted attributes one flat set) gets them as
    ``stages_``.
    """
    merge_calibration_settings(state)
    state.setdefault("query_clusters", None)
    if "embeddings_" in state:
        gather_stages(state, state.get("random_state"))
    return state


def gather_stages(state, random_state):
    """Move a router's fitted attributes in ``state`` (a dict) into ``stages_``.

    What a model file and a pickle from before the stages were objects hold:
    one flat set of attributes (those added later missing, as None).
    ``random_state`` seeds the exploration's draws.
    """
    flat = {name: state.pop(name) for name in STATE_OF_STAGES if name in state}
    state.pop("_exploration_cache", None)
    state.pop("_exploration_rng", None)
    state["stages_"] = Stages.from_arrays(flat, random_state)


def table_needed(router, n_models, grouped):
    """Whether fitting a router's stages reads the pool's dense table.

    Query heads, ``calibration``, groups given (``grouped``) and
    ``query_clusters`` compare each model's scores with its predictions query
    by query.
    """
    return (
        router.calibration is not None
        or grouped
        or router.query_clusters is not None
        or heads_wanted(router, n_models)
    )


def fit_stages(router, evaluation_sets, table, query_groups, cost, kept, heads_on):
    """Fit a router's stages in order, each on what the stages before predict.

    ``router`` holds the settings; ``evaluation_sets`` are the pool's (a
    :class:`~sklocus.evaluations.RaggedEvaluations`); ``table`` is ``(queries,
    scores)``, dense, where a stage needs it; ``kept`` are the evaluations
    the router keeps; heads are fitted when ``heads_on``. Returns every stage,
    as the router keeps them (``stages_``).
    """
    kept_queries = kept.queries
    locus = Locus.fit(router.embedder, evaluation_sets, router.refine_steps)
    stages = Stages(locus, Exploration.start(router.random_state))
    queries, scores = (None, None) if table is None else table
    pool, method = CALIBRATIONS[router.calibration]
    width = locus.embeddings.shape[1]
    halves = None  # each model embedded from each half, computed once
    if router.calibration is not None:
        halves = locus.half_embeddings(queries, scores, width)
    if pool:
        calibration = PoolCalibration.fit(locus, queries, scores, halves)
        stages = stages.adding(calibration=calibration)
    head_held_out = None
    if heads_on:
        heads, head_held_out = QueryHeads.fit(stages, queries, scores)
        stages = stages.adding(heads=heads)
    if method is not None:
        probability_map = ProbabilityMap.fit(
            method, stages, queries, scores, halves, head_held_out
        )
        stages = stages.adding(probability_map=probability_map)
    shrinkage = router.group_shrinkage
    if query_groups is not None:
        groups = QueryGroups.fit_labels(
            stages, queries, scores, query_groups, kept_queries, shrinkage
        )
        stages = stages.adding(groups=groups)
    elif table is not None and router.query_clusters is not None and locus.inner:
        if halves is None:
            halves = locus.half_embeddings(queries, scores, width)
        groups = QueryGroups.fit_clusters(
            stages,
            queries,
            scores,
            halves,
            kept_queries,
            shrinkage,
            router.query_clusters,
        )
        stages = stages.adding(groups=groups)
    policy = Policy.fit(stages, evaluation_sets, cost, router.budget, kept_queries)
    return stages.adding(policy=policy)
