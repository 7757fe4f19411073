"""Changing a fitted router's pool: models added, re-embedded, removed.

Each model's embedding and its rows of every stage depend on its own evaluations
only, under what ``fit`` chose for the whole pool (the embedder, the calibration
slope, the heads' blend, the probability map, the budget's curve, the groups):
so a model can be added, re-embedded from more evaluations (:mod:`._learning`)
or removed without touching the others, each change a new set of stages
(:meth:`~._stages.Stages.with_rows`, :meth:`~._stages.Stages.without_rows`).
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np
from sklearn.utils.validation import check_is_fitted

from sklocus._kept_evaluations import (
    append_models,
    keep_models,
)
from sklocus._router._tables import (
    check_cost,
    groups_of,
    selected,
)
from sklocus._routing import cost_rescaling
from sklocus._validation import check_model_names, shown
from sklocus.evaluations import (
    check_evaluation_sets,
    reusable,
    to_matrix,
)

# The evaluations the router keeps (:mod:`sklocus._kept_evaluations`), in the
# order of KeptEvaluations' fields.


class PoolEditingMixin:
    """``add_models`` and ``remove_models``: the pool of a fitted router changed.

    For :class:`~sklocus.LocusRouter`, with :class:`~._learning.LearningMixin`
    (its kept evaluations).
    """

    def named_groups(self):
        """Return the groups queries may be given (``groups_``), or None.

        None for a router fitted without ``query_groups``, and for one whose
        groups are clusters of its queries (``group_source_``): those are its
        own, and it assigns every query one itself.

        Returns
        -------
        ndarray of shape (n_groups,) or None
        """
        check_is_fitted(self, "embeddings_")
        return None if self._clustered() else self.groups_

    def add_models(self, evaluation_sets, model_names, cost=None, query_groups=None):
        """Onboard models: embed them as ``fit`` does, with no training of LOCUS.

        New embeddings are refined as ``refine_steps`` says, and new models get
        query heads (under the pool's blend) when the router has them; existing
        embeddings and heads do not change.

        Parameters
        ----------
        evaluation_sets : sequence of mappings
            One mapping from query to score per new model.
        model_names : sequence
            Their names, new to the router and distinct.
        cost : array-like of shape (n_new,), default=None
            Their costs; required when the router has costs, refused otherwise.
            Routes weigh each cost relative to the dearest model's: a new
            model over ten times dearer than any so far warns, as it changes
            what every cost weight and budget means.
        query_groups : mapping, default=None
            The group of each query of the new sets (a query missing from it has
            none), when the router was fitted with ``query_groups``: the new
            models' per-group offsets are fitted on their scores as in
            :meth:`fit`. Without it they get no offsets (LOCUS alone). A
            router whose groups are clusters (``group_source_``) fits the new
            models' offsets for its clusters, a new query in its nearest one,
            and takes no ``query_groups``.

        Returns
        -------
        self
        """
        check_is_fitted(self, "embeddings_")
        names = check_model_names(model_names)
        ragged = check_evaluation_sets(
            reusable(evaluation_sets), [str(name) for name in names]
        )
        if self.classes_.dtype != object and not all(
            isinstance(name, numbers.Integral) for name in names
        ):
            raise TypeError(
                "the router's models are numbered (it was fitted on an array Y); name "
                "new models with integers"
            )
        known = set(self.classes_.tolist())
        for name in names:
            if name in known:
                raise ValueError(f"model {name!r} is already in the router")
        if (cost is None) != (self.cost_ is None):
            raise ValueError(
                "the router was fitted with costs; give a cost for each new model"
                if cost is None
                else "the router was fitted without costs; leave cost out"
            )
        cost = check_cost(cost, names)
        if cost is not None:
            rescaling = cost_rescaling(self.cost_, cost)
            if rescaling is not None:
                position, message = rescaling
                warnings.warn(
                    f"model {shown(names[position])}: {message}",
                    UserWarning,
                    stacklevel=2,
                )
        if query_groups is not None:
            self._check_groups_given()
            groups_of(query_groups, ragged.queries, "add_models")
        kept = append_models(self._kept(), ragged)
        stages = self._stages()
        groups = kept_groups(stages, kept, query_groups, "ignore")
        group_of = None
        if query_groups is not None or self._clustered():
            # The groups kept: a query the router knows keeps its own.
            added = np.arange(len(self.classes_), len(self.classes_) + len(names))
            group_of = groups.group_map(*kept.ragged(added))
        rows = model_rows(stages, ragged, group_of)
        if cost is not None:
            rows["policy"] = {"cost": cost}
        # Everything is computed before anything changes: a failure leaves the
        # router as it was.
        n_models = len(self.classes_)
        indices = np.arange(n_models, n_models + len(names))
        self.stages_ = stages.adding(groups=groups).with_rows(indices, rows)
        self._set_kept(kept)
        self.classes_ = np.concatenate(
            [self.classes_, np.asarray(names, dtype=self.classes_.dtype)]
        )
        return self

    def remove_models(self, names):
        """Retire models from the router.

        Parameters
        ----------
        names : sequence
            Models to remove, each one of ``classes_``.

        Returns
        -------
        self
        """
        check_is_fitted(self, "embeddings_")
        kept = ~selected(self.classes_, names, "remove")
        evaluations, used = keep_models(self._kept(), kept)
        stages = self.stages_
        if stages.groups is not None and stages.groups.query_codes is not None:
            stages = stages.adding(groups=stages.groups.keeping_queries(used))
        self.stages_ = stages.without_rows(kept)
        self._set_kept(evaluations)
        self.classes_ = self.classes_[kept]
        return self

    def _clustered(self):
        """Whether the router's groups are clusters of its queries (its own)."""
        groups = self.stages_.groups
        return groups is not None and groups.clustered

    def _check_groups_given(self):
        """Refuse query_groups where the router has no groups of labels."""
        if self._clustered():
            raise ValueError(
                "the router's groups are clusters of its queries' encodings, "
                "which it assigns new queries itself; leave query_groups out"
            )
        if self.group_offsets_ is None:
            raise ValueError(
                "the router was fitted without query_groups; leave query_groups out"
            )


def kept_groups(stages, kept, group_of, conflicts):
    """Return the query groups stage with groups for ``kept``'s queries, or None.

    None where the router keeps no groups of queries; new queries come last
    in ``kept`` (see :meth:`~._query_groups.QueryGroups.with_queries`).
    """
    groups = stages.groups
    if groups is None or groups.query_codes is None:
        return groups
    return groups.with_queries(kept.queries, group_of, stages.locus.encode, conflicts)


def model_rows(stages, ragged, query_groups):
    """Compute every stage's rows for the sets of ``ragged`` (stage name to rows).

    Embedded as ``refine_steps`` says, with calibration offsets under the
    pool's slope, query heads under the pool's blend and offsets of the
    router's groups (zeros when ``query_groups``, a mapping from query to
    group, is None).
    """
    locus, calibration, heads = stages.locus, stages.calibration, stages.heads
    groups = stages.groups
    if groups is not None and groups.offsets is None:
        groups = None  # clusters tried, none kept
    embeddings = locus.embed(ragged)
    rows = {"locus": {"embeddings": embeddings}}
    grouped = groups is not None and query_groups is not None
    if calibration is not None or heads is not None or grouped:
        # The sets' dense table, built once for every stage that reads it.
        scores, queries = to_matrix(ragged)
    model_offsets = head_rows = None
    if calibration is not None:
        rows["calibration"] = calibration.fit_rows(locus, embeddings, queries, scores)
        model_offsets = rows["calibration"]["offsets"]
    if heads is not None:
        head_rows = heads.fit_rows(stages, embeddings, model_offsets, queries, scores)
        rows["heads"] = head_rows
    if groups is not None:
        rows["groups"] = groups.no_rows(ragged.n_sets)
        if grouped:
            others = stages.for_models(embeddings, model_offsets, head_rows)
            rows["groups"] = groups.fit_rows(others, queries, scores, query_groups)
    if stages.exploration.cached():
        # Kept up to date here, not at the next route, which would wait.
        factors = stages.exploration.posterior_factors(locus, embeddings, ragged)
        rows["exploration"] = {"factors": factors}
    return rows
