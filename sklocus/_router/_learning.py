"""Learning from outcomes: they join the evaluations each model is embedded from.

A fitted router keeps the evaluations it embedded each model from
(:mod:`sklocus._kept_evaluations`); outcomes join them, a query answered more
than once counting once with the mean of its outcomes, and each model with new
outcomes is embedded again, with its rows of every stage, under what ``fit``
chose for the whole pool (:mod:`._editing`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.utils.validation import check_is_fitted

from sklocus._groups import check_query_groups
from sklocus._kept_evaluations import KeptEvaluations, add_outcomes
from sklocus._router._editing import kept_groups, model_rows
from sklocus._router._tables import (
    check_distinct_queries,
    groups_of,
    is_fitted,
    score_table,
)
from sklocus._validation import as_item_list, shown
from sklocus.encoders import as_query_list
from sklocus.evaluations import _first_bad_score

KEPT = (
    "evaluation_queries_",
    "evaluation_codes_",
    "evaluation_sums_",
    "evaluation_counts_",
    "evaluation_offsets_",
)


class LearningMixin:
    """``partial_fit``, ``learn_outcomes`` and the evaluations a router keeps.

    For :class:`~sklocus.LocusRouter`.
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

    def _learn(self, models, queries, scores, group_of=None, check_groups=True):
        """Join checked outcomes (model indices, queries, scores) and re-embed.

        ``group_of`` maps queries to groups; with ``check_groups``, giving a
        known query another group than its own is an error, else it is ignored.
        """
        if not len(models):
            return self
        kept = add_outcomes(self._kept(), models, queries, scores)
        stages = self._stages()
        conflicts = "raise" if check_groups else "ignore"
        groups = kept_groups(stages, kept, group_of, conflicts)
        touched = np.unique(models)
        ragged, used = kept.ragged(touched)
        group_map = None if groups is None else groups.group_map(ragged, used)
        rows = model_rows(stages, ragged, group_map)
        rows["policy"] = stages.policy.rows_of(touched)
        self.stages_ = stages.adding(groups=groups).with_rows(touched, rows)
        self._set_kept(kept)
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
