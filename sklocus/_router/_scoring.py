"""A router's stages composed: from LOCUS's probabilities to those it routes by.

The stages apply in one order, each to the probabilities the one before gave,
on the logit scale: LOCUS (refined embeddings, :mod:`._locus`); the pool
calibration (:mod:`._pool_calibration`); the query heads (:mod:`._heads`); the
probability map (:mod:`._probability_map`); and the group offsets
(:mod:`._group_offsets`), of the groups given with the queries or else of those
told from their encodings (:mod:`._learnt_groups`). Exploration moves LOCUS's
logits before the rest (:mod:`._exploration`). A stage a router has not fitted
is left out.
"""

from __future__ import annotations

import numpy as np

from sklocus._groups import logits
from sklocus._router._exploration import Exploration
from sklocus._router._group_offsets import GroupOffsets
from sklocus._router._heads import ATTRIBUTES as heads_attributes
from sklocus._router._heads import QueryHeads, heads_wanted
from sklocus._router._learnt_groups import LearntGroups, choose_groups, shifted
from sklocus._router._locus import Locus, chunks
from sklocus._router._policy import fit_budget
from sklocus._router._pool_calibration import ATTRIBUTES as pool_calibration_attributes
from sklocus._router._pool_calibration import PoolCalibration
from sklocus._router._probability_map import ProbabilityMap
from sklocus._router._rows import ModelRows, model_rows
from sklocus.encoders import as_query_list

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
    get it as None, never having clustered, and no learnt groups.
    """
    merge_calibration_settings(state)
    if "query_clusters" not in state:
        state["query_clusters"] = None
        if "embeddings_" in state:
            for name in ("group_source_", "group_weights_", "group_biases_"):
                state[name] = None
            state["held_out_losses_"] = None
    return state


class Scorer:
    """A router's stages, as fitted so far.

    ``fit`` builds it stage by stage, each fitted on what the stages before it
    predict; afterwards it is built from the router's fitted attributes.
    :meth:`probabilities` applies the stages up to the probability map; the
    group offsets apply in :meth:`chunks`.

    Parameters
    ----------
    locus : Locus
    calibration : PoolCalibration or None
    heads : QueryHeads or None
    probability_map : ProbabilityMap or None
    group_offsets : GroupOffsets or None
    exploration : Exploration or None
    learnt_groups : LearntGroups or None
    """

    def __init__(
        self,
        locus,
        calibration=None,
        heads=None,
        probability_map=None,
        group_offsets=None,
        exploration=None,
        learnt_groups=None,
    ):
        self.locus = locus
        self.calibration = calibration
        self.heads = heads
        self.probability_map = probability_map
        self.group_offsets = group_offsets
        self.exploration = exploration
        self.learnt_groups = learnt_groups

    def probabilities(self, rows, queries, explore=False, vectors=None):
        """P(correct) ``(n_queries, n_models)`` of the models of ``rows``.

        One chunk of queries (``vectors``: their encodings, when at hand). With
        ``explore`` (``rows`` being the pool's), returns ``(probabilities,
        explored)``: the second as routed by the exploration, LOCUS's logits
        moved before the other stages apply.
        """
        locus = self.locus
        if rows.heads is None and not explore:
            probabilities = locus.probabilities(rows.embeddings, queries)
        else:
            if not len(queries):
                empty = np.empty((0, len(rows.embeddings)), dtype=np.float32)
                return (empty, empty) if explore else empty
            if vectors is None:
                vectors = locus.encode(as_query_list(queries))
            probabilities = locus.predict(rows.embeddings, vectors)
        if explore:
            explored = self.exploration.move(probabilities, vectors)
            return self._adjusted(probabilities, rows, vectors), self._adjusted(
                explored, rows, vectors
            )
        return self._adjusted(probabilities, rows, vectors)

    def _adjusted(self, probabilities, rows, vectors):
        for stage in (self.calibration, self.heads, self.probability_map):
            if stage is not None:
                probabilities = stage.transform(probabilities, rows, vectors)
        return probabilities

    def logits(self, rows, queries):
        """Return :meth:`probabilities`' logits on every chunk of ``queries``."""
        found = np.empty((len(queries), len(rows.embeddings)))
        for chunk in chunks(len(queries)):
            part = queries[chunk]
            found[chunk.start : chunk.start + len(part)] = logits(
                self.probabilities(rows, part)
            )
        return found

    def locus_logits(self, embeddings, model_offsets, vectors):
        """LOCUS's logits on encoded queries, calibrated: what heads are fitted on."""
        rows = ModelRows(embeddings, model_offsets)
        found = np.empty((len(vectors), len(embeddings)))
        for chunk in chunks(len(vectors)):
            probabilities = self.locus.predict(embeddings, vectors[chunk])
            if model_offsets is not None:
                probabilities = self.calibration.transform(probabilities, rows)
            found[chunk] = logits(probabilities)
        return found

    def chunks(self, rows, queries, query_groups=None, explore=False):
        """Yield ``(start, probabilities, routed)`` for chunks of the queries.

        Every stage applies, the group offsets for the groups ``query_groups``
        (checked) give, or else for those the learnt groups tell.
        ``routed`` are the probabilities to route by: ``probabilities``
        themselves unless ``explore``.
        """
        groups = None if query_groups is None else self.group_offsets
        learnt = self.learnt_groups if query_groups is None else None
        learnt = None if rows.group_offsets is None else learnt
        for chunk in chunks(len(queries)):
            part = queries[chunk]
            vectors = None
            if learnt is not None and len(part):
                vectors = self.locus.encode(as_query_list(part))
            found = self.probabilities(rows, part, explore, vectors)
            found = found if explore else (found,)
            if groups is not None:
                labels = query_groups[chunk.start : chunk.start + len(part)]
                found = [
                    groups.transform(probabilities, labels, rows.group_offsets)
                    for probabilities in found
                ]
            elif vectors is not None:
                memberships = learnt.memberships(vectors)
                found = [
                    shifted(probabilities, memberships, rows.group_offsets)
                    for probabilities in found
                ]
            yield chunk.start, found[0], found[-1]


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


def fitted_scorer(router):
    """Rebuild the stages a fitted router holds from its fitted attributes."""
    locus = Locus(router.embedder_, router.refine_steps)
    return Scorer(
        locus,
        PoolCalibration.of(router),
        QueryHeads.of(router),
        ProbabilityMap.of(router),
        GroupOffsets.of(router),
        Exploration(router, locus),
        LearntGroups.of(router),
    )


def fit_stages(router, locus, evaluation_sets, table, query_groups, heads_on):
    """Fit a router's stages in order, each on what the stages before predict.

    ``router`` holds its embeddings, kept evaluations, models and costs;
    ``table`` is ``(queries, scores)``, dense, where a stage needs it; heads
    are fitted when ``heads_on``. Sets every stage's fitted attributes (None
    for a stage not fitted).
    """
    for name in (*pool_calibration_attributes, *heads_attributes):
        setattr(router, name, None)
    router.probability_calibrator_ = None
    router.budget_curve_ = router.budget_cost_weight_ = None
    router.groups_ = router.group_offsets_ = router.evaluation_groups_ = None
    router.group_weights_ = router.group_biases_ = router.group_source_ = None
    router.held_out_losses_ = None
    scorer = Scorer(locus, exploration=Exploration(router, locus))
    queries, scores = (None, None) if table is None else table
    pool, method = CALIBRATIONS[router.calibration]
    embeddings = router.embeddings_
    halves = None  # each model embedded from each half, computed once
    if router.calibration is not None:
        halves = locus.half_embeddings(queries, scores, embeddings.shape[1])
    if pool:
        scorer.calibration, offsets = PoolCalibration.fit(
            locus, embeddings, queries, scores, halves
        )
        scorer.calibration.write(router, offsets)
    head_held_out = None
    if heads_on:
        scorer.heads, heads, held_out = QueryHeads.fit(
            scorer, embeddings, router.model_offsets_, queries, scores
        )
        scorer.heads.write(router, heads)
        head_held_out = (router.head_blends_, held_out)
    if method is not None:
        scorer.probability_map = ProbabilityMap.fit(
            method,
            scorer,
            queries,
            scores,
            halves,
            router.model_offsets_,
            head_held_out,
        )
        router.probability_calibrator_ = scorer.probability_map.calibrator
    if query_groups is not None:
        fit_given_groups(router, scorer, queries, scores, query_groups)
    elif table is not None and router.query_clusters is not None and locus.inner:
        if halves is None:
            halves = locus.half_embeddings(queries, scores, embeddings.shape[1])
        fit_clusters(router, scorer, queries, scores, halves)
    scorer.group_offsets = GroupOffsets.of(router)
    scorer.learnt_groups = LearntGroups.of(router)
    if router.budget is not None:
        fit_budget(router, scorer, evaluation_sets, router.cost_)


def fit_given_groups(router, scorer, queries, scores, query_groups):
    """Fit the offsets of the groups given, and learn to tell them from the text."""
    stage, router.group_offsets_ = GroupOffsets.fit(
        scorer,
        model_rows(router),
        queries,
        scores,
        query_groups,
        router.group_shrinkage,
    )
    router.groups_ = stage.groups
    group_of = dict(zip(queries, query_groups))
    router.evaluation_groups_ = router._group_codes(
        router.evaluation_queries_, group_of
    )
    if scorer.locus.inner is not None:
        codes = router._group_codes(np.asarray(queries, dtype=object), group_of)
        learnt = LearntGroups.from_labels(
            scorer.locus.encode(queries), codes, len(stage.groups)
        )
        learnt.write(router, "labels")


def fit_clusters(router, scorer, queries, scores, halves):
    """Cluster the pool's queries, if held-out evaluations say it helps."""
    locus = scorer.locus
    half, embeddings = halves
    half_logits = [locus.logits_on(z, queries) for z in embeddings]
    learnt, codes, router.held_out_losses_ = choose_groups(
        locus.encode(queries),
        half_logits,
        scores,
        half,
        router.group_shrinkage,
        router.query_clusters,
    )
    if learnt is None:
        return
    stage, offsets = GroupOffsets.fit(
        scorer,
        model_rows(router),
        queries,
        scores,
        codes.astype(object),
        router.group_shrinkage,
    )
    order = np.argsort(stage.groups.astype(np.int64))
    router.groups_ = stage.groups[order].astype(np.int64)
    router.group_offsets_ = offsets[:, order]
    router.evaluation_groups_ = router._group_codes(
        router.evaluation_queries_, dict(zip(queries, codes.tolist()))
    )
    learnt.write(router, "clusters")
