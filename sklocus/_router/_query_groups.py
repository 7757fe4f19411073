"""The query groups stage: each model's shrunken correction per group of queries.

With ``query_groups`` at ``fit`` (a benchmark, subject or category per query), a
router fits each model an offset per group on the logit scale, on its own
evaluations against what the stages before predict (the model is in
:mod:`sklocus._groups`), and adds it for queries whose groups are given; it
also learns to tell a query's group from its encoding (:mod:`._learnt_groups`),
so that queries given no group take the offsets their text tells. With
``query_clusters`` instead, the groups are k-means clusters of the pool's query
encodings, if held-out evaluations say they help.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sklocus._groups import apply_group_offsets, fit_group_offsets
from sklocus._router._learnt_groups import LearntGroups, choose_groups, shifted
from sklocus._router._stage import Stage
from sklocus._router._tables import groups_of
from sklocus._validation import shown


@dataclasses.dataclass(frozen=True, eq=False)
class QueryGroups(Stage):
    """The router's groups, each model's offsets for them, and how queries take them.

    Parameters
    ----------
    labels : ndarray of shape (n_groups,) or None
        ``groups_``: the groups given, or the clusters' numbers; None when
        clusters were tried and none helped.
    offsets : ndarray of shape (n_models, n_groups), float32, or None
        ``group_offsets_``.
    source : {"labels", "clusters"} or None
        ``group_source_``.
    weights, biases : ndarray or None
        ``group_weights_`` and ``group_biases_``: each group's linear score of
        a query encoding (:class:`~sklocus._router._learnt_groups.LearntGroups`).
    held_out_losses : dict or None
        ``held_out_losses_``, with ``query_clusters``.
    query_codes : ndarray of shape (n_kept_queries,), int64, or None
        ``evaluation_groups_``: each kept query's index in ``labels``, -1 for none.
    shrinkage : float
        The router's ``group_shrinkage`` at the time of use (a setting).
    """

    labels: np.ndarray | None = None
    offsets: np.ndarray | None = None
    source: str | None = None
    weights: np.ndarray | None = None
    biases: np.ndarray | None = None
    held_out_losses: dict | None = None
    query_codes: np.ndarray | None = None
    shrinkage: float = 3.0

    ATTRIBUTES = {
        "groups_": "labels",
        "group_offsets_": "offsets",
        "group_source_": "source",
        "group_weights_": "weights",
        "group_biases_": "biases",
        "held_out_losses_": "held_out_losses",
        "evaluation_groups_": "query_codes",
    }
    ROWS = ("offsets",)

    @property
    def clustered(self):
        """Whether the groups are clusters of the pool's queries (its own)."""
        return self.source == "clusters"

    @property
    def learnt(self):
        """The groups told from the encodings, or None."""
        if self.weights is None:
            return None
        return LearntGroups(self.weights, self.biases, soft=self.source == "labels")

    @classmethod
    def fit_labels(cls, stages, queries, scores, query_groups, kept_queries, shrinkage):
        """Fit the offsets of the groups given, and learn to tell them from the text.

        ``kept_queries`` are the router's kept evaluations' queries, which get
        their groups' codes.
        """
        labels, offsets = _fit_offsets(stages, queries, scores, query_groups, shrinkage)
        group_of = dict(zip(queries, query_groups))
        weights = biases = source = None
        if stages.locus.inner is not None:
            codes = _codes(labels, np.asarray(queries, dtype=object), group_of)
            learnt = LearntGroups.from_labels(
                stages.locus.encode(queries), codes, len(labels)
            )
            weights, biases, source = learnt.weights, learnt.biases, "labels"
        return cls(
            labels,
            offsets,
            source,
            weights,
            biases,
            query_codes=_codes(labels, kept_queries, group_of),
            shrinkage=shrinkage,
        )

    @classmethod
    def fit_clusters(
        cls, stages, queries, scores, halves, kept_queries, shrinkage, n_clusters
    ):
        """Cluster the pool's queries, if held-out evaluations say it helps."""
        locus = stages.locus
        half, embeddings = halves
        half_logits = [locus.logits_on(z, queries) for z in embeddings]
        learnt, codes, losses = choose_groups(
            locus.encode(queries), half_logits, scores, half, shrinkage, n_clusters
        )
        if learnt is None:
            return cls(held_out_losses=losses, shrinkage=shrinkage)
        labels, offsets = _fit_offsets(
            stages, queries, scores, codes.astype(object), shrinkage
        )
        order = np.argsort(labels.astype(np.int64))
        labels = labels[order].astype(np.int64)
        return cls(
            labels,
            offsets[:, order],
            "clusters",
            learnt.weights,
            learnt.biases,
            losses,
            _codes(labels, kept_queries, dict(zip(queries, codes.tolist()))),
            shrinkage,
        )

    def fit_rows(self, stages, queries, scores, query_groups):
        """Offsets of the models ``stages`` hold, for the router's groups.

        ``query_groups`` maps queries to groups; ``scores`` is ``(n_queries,
        n_models)``, NaN where unobserved.
        """
        groups = groups_of(query_groups, queries, "add_models")
        # Only the router's groups get offsets; others have nothing to apply to.
        known = set(self.labels.tolist())
        groups = np.array([g if g in known else None for g in groups], dtype=object)
        labels, offsets = _fit_offsets(stages, queries, scores, groups, self.shrinkage)
        column = {label: j for j, label in enumerate(self.labels)}
        out = np.zeros((scores.shape[1], len(self.labels)), dtype=np.float32)
        for j, label in enumerate(labels):
            out[:, column[label]] = offsets[:, j]
        return {"offsets": out}

    def no_rows(self, n_models):
        """Rows of models with no offsets (LOCUS alone)."""
        return {"offsets": np.zeros((n_models, len(self.labels)), np.float32)}

    def transform(self, probabilities, query_groups):
        """Add the offsets of each query's group given; unknown groups get none."""
        return apply_group_offsets(
            probabilities, query_groups, self.labels, self.offsets
        )

    def shift(self, probabilities, memberships):
        """Add the offsets of the groups told (``memberships`` of each query's)."""
        return shifted(probabilities, memberships, self.offsets)

    # -- the kept queries' groups ---------------------------------------------

    def with_queries(self, queries, group_of, encode, conflicts="raise"):
        """Return the stage with groups for the kept queries ``queries``.

        The first ``len(query_codes)`` are those the router keeps, in order;
        the others are new and take their groups from ``group_of`` (a
        mapping), or their nearest cluster's (``encode`` encodes them).
        ``conflicts="raise"`` refuses a known query given another group.
        """
        old = self.query_codes
        new = queries[len(old) :]
        if self.clustered:
            if not len(new):
                return self
            codes = self.learnt.codes(encode(list(new)))
            return dataclasses.replace(self, query_codes=np.concatenate([old, codes]))
        group_of = {} if group_of is None else group_of
        if conflicts == "raise" and len(group_of):
            column = {label: j for j, label in enumerate(self.labels.tolist())}
            for query, code in zip(queries[: len(old)].tolist(), old.tolist()):
                if query in group_of and column.get(group_of[query], -1) != code:
                    had = self.labels[code] if code >= 0 else None
                    raise ValueError(
                        f"query {shown(query)} is in group {shown(had)}, not "
                        f"{shown(group_of[query])}; a query keeps its group"
                    )
        codes = _codes(self.labels, new, group_of)
        return dataclasses.replace(self, query_codes=np.concatenate([old, codes]))

    def keeping_queries(self, used):
        """Return the stage with the kept queries ``used`` (indices) only."""
        return dataclasses.replace(self, query_codes=self.query_codes[used])

    def group_map(self, ragged, used):
        """Map each query of ``ragged`` that has a group to it.

        ``used`` are the queries' indices among the kept queries.
        """
        return {
            query: self.labels[g]
            for query, g in zip(ragged.queries, self.query_codes[used].tolist())
            if g >= 0
        }


def _fit_offsets(stages, queries, scores, query_groups, shrinkage):
    """Fit groups and each model's offsets, on what ``stages`` predict (no groups)."""
    return fit_group_offsets(stages.logits(queries), scores, query_groups, shrinkage)


def _codes(labels, queries, group_of):
    """Each query's index in ``labels`` (-1 for none), from a mapping."""
    column = {label: j for j, label in enumerate(labels.tolist())}
    return np.array(
        [column.get(group_of.get(query), -1) for query in queries.tolist()],
        dtype=np.int64,
    )
