"""Changing a fitted router's pool: models added, outcomes learnt, models removed.

Each model's embedding and its rows of every stage depend on its own evaluations
only, under what ``fit`` chose for the whole pool (the embedder, the calibration
slope, the heads' blend, the probability map, the budget's curve, the groups):
so a model can be added, re-embedded from more evaluations or removed without
touching the others. The router keeps the evaluations it embeds each model
from (:mod:`sklocus._kept_evaluations`) for this.
"""

from __future__ import annotations

import numbers
import warnings

import numpy as np
import pandas as pd
from sklearn.utils.validation import check_is_fitted

from sklocus._groups import check_query_groups
from sklocus._kept_evaluations import (
    KeptEvaluations,
    add_outcomes,
    append_models,
    keep_models,
)
from sklocus._router._learnt_groups import clustered
from sklocus._router._rows import ModelRows, keep_rows, set_rows
from sklocus._router._tables import (
    check_cost,
    check_distinct_queries,
    groups_of,
    is_fitted,
    score_table,
    selected,
)
from sklocus._routing import cost_rescaling
from sklocus._validation import as_item_list, check_model_names, shown
from sklocus.encoders import as_query_list
from sklocus.evaluations import (
    _first_bad_score,
    check_evaluation_sets,
    reusable,
    to_matrix,
)

# The evaluations the router keeps (:mod:`sklocus._kept_evaluations`), in the
# order of KeptEvaluations' fields.
KEPT = (
    "evaluation_queries_",
    "evaluation_codes_",
    "evaluation_sums_",
    "evaluation_counts_",
    "evaluation_offsets_",
)


class PoolEditingMixin:
    """Changing the pool, learning outcomes, and what the router keeps of them.

    For :class:`~sklocus.LocusRouter`, which gives ``_scorer()``: its stages as
    fitted.
    """

    def evaluations(self):
        """Return the evaluations the router embeds each model from, as a table.

        What :meth:`fit` and :meth:`add_models` were given and
        :meth:`partial_fit` added: one row per model and query, with the mean
        of the outcomes of that pair and their number.

        Returns
        -------
        pandas.DataFrame
            Columns ``model``, ``query``, ``score`` and ``n_outcomes``, models in
            the order of ``classes_``.
        """
        check_is_fitted(self, "embeddings_")
        kept = self._kept()
        return pd.DataFrame(
            {
                "model": self.classes_[kept.owners()],
                "query": kept.queries[kept.codes],
                "score": kept.sums / kept.counts,
                "n_outcomes": kept.counts,
            }
        )

    def evaluation_counts(self):
        """Return how many evaluations and outcomes each model is embedded from.

        Returns
        -------
        pandas.DataFrame
            Indexed by model, in the order of ``classes_``: ``n_evaluations``,
            the distinct queries of its evaluations, and ``n_scores``, the
            outcomes they hold (a query answered twice counts twice).
        """
        check_is_fitted(self, "embeddings_")
        kept = self._kept()
        return pd.DataFrame(
            {"n_evaluations": kept.sizes, "n_scores": kept.n_scores()},
            index=pd.Index(self.classes_, name="model"),
        )

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
        return None if clustered(self) else self.groups_

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
        groups = self._extended_groups(kept, query_groups)
        group_of = None
        if query_groups is not None or clustered(self):
            # The groups kept: a query the router knows keeps its own.
            added = np.arange(len(self.classes_), len(self.classes_) + len(names))
            group_of = self._group_map_of(groups, *kept.ragged(added))
        rows = self._model_rows(ragged, group_of)
        # Everything is computed before anything changes: a failure leaves the
        # router as it was.
        n_models = len(self.classes_)
        set_rows(self, np.arange(n_models, n_models + len(names)), rows)
        self._set_kept(kept)
        self.evaluation_groups_ = groups
        self.classes_ = np.concatenate(
            [self.classes_, np.asarray(names, dtype=self.classes_.dtype)]
        )
        if cost is not None:
            self.cost_ = np.concatenate([self.cost_, cost])
        return self

    def partial_fit(self, X, Y, query_groups=None):
        """Learn from more outcomes: join them to their models' evaluations.

        Each model with an outcome in ``Y`` is embedded again, as :meth:`fit`
        embeds it, from all its evaluations: those it had and the new ones, a
        repeated query counting once with the mean of its outcomes
        (:func:`~sklocus.evaluations.from_long` with ``duplicates="mean"``).
        Its calibration offset, query head and group offsets are fitted again
        the same way; the other models, and what :meth:`fit` chose for the
        whole pool (the embedder, the calibration slope, the heads' blend, the
        probability calibrator, the budget's curve), do not change. A model's
        embedding is then the one a router fitted on all its evaluations with
        this embedder (frozen) gives it, up to float32 rounding; so is
        everything else of it when the pool-wide choices are the same.

        On a router not yet fitted, ``partial_fit`` is :meth:`fit`.

        Read more in the :ref:`User Guide <learning_from_outcomes>`.

        Parameters
        ----------
        X : sequence of length n_queries
            Queries, distinct; new queries are welcome.
        Y : DataFrame or array-like of shape (n_queries, n_columns)
            Outcomes in [0, 1], NaN where a model has none: a DataFrame's columns
            name some of the router's models, an array's are all of them in the
            order of ``classes_``. Rows are matched to X as in :meth:`fit`.
        query_groups : array-like of shape (n_queries,), default=None
            The queries' groups, for a router fitted with ``query_groups``: new
            queries take them; a query the router knows keeps its group, and
            giving it another is an error.

        Returns
        -------
        self
        """
        if not is_fitted(self):
            return self.fit(X, Y, query_groups=query_groups)
        queries = as_query_list(X)
        check_distinct_queries(queries)
        if query_groups is not None:
            self._check_groups_given()
            query_groups = check_query_groups(query_groups, len(queries))
        if isinstance(Y, pd.DataFrame):
            scores, names = score_table(Y, queries)
            column = {name: j for j, name in enumerate(self.classes_.tolist())}
            for name in names:
                if name not in column:
                    raise ValueError(
                        f"Y has outcomes of model {shown(name)}, which the router "
                        "does not have; add it with add_models"
                    )
            models = np.array([column[name] for name in names], dtype=np.int64)
        else:
            scores, _ = score_table(Y, queries, self.classes_)
            models = np.arange(len(self.classes_))
        rows, columns = np.nonzero(~np.isnan(scores))
        group_of = None
        if query_groups is not None:
            group_of = {q: g for q, g in zip(queries, query_groups) if g is not None}
        return self._learn(
            models[columns], [queries[i] for i in rows], scores[rows, columns], group_of
        )

    def learn_outcomes(
        self, models, queries, scores, query_groups=None, *, group_conflicts="raise"
    ):
        """Learn from outcomes listed one by one, as :meth:`partial_fit` from a table.

        What a log of routed queries holds: which model answered which query,
        and how well. Each model with an outcome is embedded again from all its
        evaluations, a query answered more than once counting once with the
        mean of its outcomes, exactly as :meth:`partial_fit` does.

        Parameters
        ----------
        models : sequence of length n_outcomes
            The model of each outcome, an entry of ``classes_``.
        queries : sequence of length n_outcomes
            The query of each outcome; new queries are welcome.
        scores : array-like of shape (n_outcomes,)
            Each outcome, a number in [0, 1].
        query_groups : mapping, default=None
            The group of new queries, for a router fitted with
            ``query_groups`` (a query missing from it has none).
        group_conflicts : {"raise", "ignore"}, default="raise"
            What a known query given another group than its own does: an error,
            or nothing (the query keeps its group).

        Returns
        -------
        self
        """
        check_is_fitted(self, "embeddings_")
        if group_conflicts not in ("raise", "ignore"):
            raise ValueError(
                f"group_conflicts={group_conflicts!r} must be 'raise' or 'ignore'"
            )
        models = as_item_list(models, "models")
        queries = as_query_list(queries)
        # Kept as given (a list mixing numbers and text is not read as text).
        if not isinstance(scores, np.ndarray):
            scores = np.array(list(scores), dtype=object)
        if scores.ndim != 1 or not len(models) == len(queries) == len(scores):
            raise ValueError(
                f"models, queries and scores give one value per outcome: got "
                f"{len(models)}, {len(queries)} and {scores.shape}"
            )
        column = {name: j for j, name in enumerate(self.classes_.tolist())}
        for position, name in enumerate(models):
            if name not in column:
                raise ValueError(
                    f"outcome {position} is of model {shown(name)}, which the "
                    "router does not have; add it with add_models"
                )
        bad = _first_bad_score(scores)
        if bad is not None:
            position, reason = bad
            raise ValueError(
                f"outcome {position} has score {shown(scores[position])} "
                f"({reason}); an outcome is a number in [0, 1]"
            )
        if query_groups is not None:
            self._check_groups_given()
            groups_of(query_groups, queries, "learn_outcomes")
        return self._learn(
            np.array([column[name] for name in models], dtype=np.int64),
            queries,
            scores.astype(np.float64),
            query_groups,
            check_groups=group_conflicts == "raise",
        )

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
        self._set_kept(evaluations)
        if self.evaluation_groups_ is not None:
            self.evaluation_groups_ = self.evaluation_groups_[used]
        keep_rows(self, kept)
        self.classes_ = self.classes_[kept]
        if self.cost_ is not None:
            self.cost_ = self.cost_[kept]
        return self

    # -- the evaluations kept ---------------------------------------------------

    def _learn(self, models, queries, scores, group_of=None, check_groups=True):
        """Join checked outcomes (model indices, queries, scores) and re-embed.

        ``group_of`` maps queries to groups; with ``check_groups``, giving a
        known query another group than its own is an error, else it is ignored.
        """
        if not len(models):
            return self
        kept = add_outcomes(self._kept(), models, queries, scores)
        groups = self._extended_groups(kept, group_of, check=check_groups)
        touched = np.unique(models)
        ragged, used = kept.ragged(touched)
        rows = self._model_rows(ragged, self._group_map_of(groups, ragged, used))
        set_rows(self, touched, rows)
        self._set_kept(kept)
        self.evaluation_groups_ = groups
        return self

    def _kept(self):
        if not hasattr(self, KEPT[0]):
            raise ValueError(
                "this router was fitted by a sklocus that kept no evaluations "
                "(before model file format 6), so it cannot learn from outcomes or "
                "change its pool: fit it again"
            )
        return KeptEvaluations(*(getattr(self, name) for name in KEPT))

    def _set_kept(self, kept):
        for name, value in zip(KEPT, kept):
            setattr(self, name, value)

    def _check_groups_given(self):
        """Refuse query_groups where the router has no groups of labels."""
        if clustered(self):
            raise ValueError(
                "the router's groups are clusters of its queries' encodings, "
                "which it assigns new queries itself; leave query_groups out"
            )
        if self.group_offsets_ is None:
            raise ValueError(
                "the router was fitted without query_groups; leave query_groups out"
            )

    def _group_codes(self, queries, group_of):
        """Each query's index in ``groups_`` (-1 for none), from a mapping."""
        column = {label: j for j, label in enumerate(self.groups_.tolist())}
        return np.array(
            [column.get(group_of.get(query), -1) for query in queries.tolist()],
            dtype=np.int64,
        )

    def _extended_groups(self, kept, group_of, check=False):
        """``evaluation_groups_`` for ``kept``, whose new queries come last.

        New queries take their groups from ``group_of``; with ``check``, a known
        query given another group than its own is an error.
        """
        old = self.evaluation_groups_
        if old is None:
            return None
        group_of = {} if group_of is None else group_of
        new = kept.queries[len(old) :]
        if clustered(self):  # each new query in its nearest cluster
            scorer = self._scorer()
            if not len(new):
                return old
            vectors = scorer.locus.encode(list(new))
            return np.concatenate([old, scorer.learnt_groups.codes(vectors)])
        new = self._group_codes(new, group_of)
        if check and len(group_of):
            known = kept.queries[: len(old)].tolist()
            column = {label: j for j, label in enumerate(self.groups_.tolist())}
            for query, code in zip(known, old.tolist()):
                if query in group_of:
                    given = column.get(group_of[query], -1)
                    if given != code:
                        had = self.groups_[code] if code >= 0 else None
                        raise ValueError(
                            f"query {shown(query)} is in group {shown(had)}, not "
                            f"{shown(group_of[query])}; a query keeps its group"
                        )
        return np.concatenate([old, new])

    def _group_map_of(self, groups, ragged, used):
        """Map each query of ``ragged`` that has a group to it (None: no groups).

        ``used`` are the queries' indices in ``groups`` (``evaluation_groups_``
        of the kept evaluations).
        """
        if groups is None:
            return None
        return {
            query: self.groups_[g]
            for query, g in zip(ragged.queries, groups[used].tolist())
            if g >= 0
        }

    def _model_rows(self, ragged, query_groups):
        """Compute the router's rows of every stage for the sets of ``ragged``.

        Embedded as ``refine_steps`` says, with calibration offsets under the
        pool's slope, query heads under the pool's blend and offsets of the
        router's groups (zeros when ``query_groups``, a mapping from query to
        group, is None).
        """
        scorer = self._scorer()
        embeddings = scorer.locus.embed(ragged)
        model_offsets = heads = group_offsets = None
        groups = scorer.group_offsets
        grouped = groups is not None and query_groups is not None
        if scorer.calibration is not None or scorer.heads is not None or grouped:
            # The sets' dense table, built once for every stage that reads it.
            scores, queries = to_matrix(ragged)
        if scorer.calibration is not None:
            model_offsets = scorer.calibration.fit_models(
                scorer.locus, embeddings, queries, scores
            )
        if scorer.heads is not None:
            heads = scorer.heads.fit_models(
                scorer, embeddings, model_offsets, queries, scores
            )
        if groups is not None:
            group_offsets = np.zeros((ragged.n_sets, len(groups.groups)), np.float32)
            if grouped:
                rows = ModelRows(embeddings, model_offsets, heads)
                group_offsets = groups.fit_models(
                    scorer, rows, queries, scores, query_groups
                )
        factors = None
        if scorer.exploration.cached():
            # Kept up to date here, not at the next route, which would wait.
            factors = scorer.exploration.posterior_factors(embeddings, ragged)
        return ModelRows(embeddings, model_offsets, heads, group_offsets, factors)
