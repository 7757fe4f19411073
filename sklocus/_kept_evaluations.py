"""The evaluations a router keeps of its models, as flat arrays.

A router embeds each model from its evaluations. To learn from more outcomes
(:meth:`~sklocus.LocusRouter.partial_fit`) it embeds a model again from all of
them, so it keeps them, ragged in the order of its models:

- ``queries``: the distinct queries, an object array;
- ``codes``: the query of each evaluation, an index into ``queries``;
- ``sums`` and ``counts``: the sum and number of the outcomes of each
  (model, query) pair. A pair's score is their ratio: repeated outcomes average,
  as :func:`~sklocus.evaluations.from_long` with ``duplicates="mean"`` does;
- ``offsets``: where each model's evaluations start, ``n_models + 1`` entries.

Every function returns new arrays and never writes into the ones it is given: a
served router's snapshots share them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sklocus.evaluations import RaggedEvaluations


class KeptEvaluations(NamedTuple):
    """A router's evaluations; see the module's docstring."""

    queries: np.ndarray
    codes: np.ndarray
    sums: np.ndarray
    counts: np.ndarray
    offsets: np.ndarray

    @property
    def sizes(self):
        """Number of distinct queries each model was evaluated on."""
        return np.diff(self.offsets)

    def owners(self):
        """Return the model of each evaluation, ``(n_evaluations,)``."""
        return np.repeat(np.arange(len(self.offsets) - 1), self.sizes)

    def n_scores(self):
        """Count the scores each model's embedding averages (a pair's every one)."""
        n_models = len(self.offsets) - 1
        found = np.bincount(self.owners(), weights=self.counts, minlength=n_models)
        return found.astype(np.int64)

    def ragged(self, models):
        """Return the evaluation sets of ``models`` (indices), scores averaged.

        Returns ``(ragged, used)``: the sets over the queries they hold only,
        and the index in ``queries`` of each of those queries.
        """
        models = np.asarray(models, dtype=np.int64)
        sizes = self.sizes[models]
        offsets = np.zeros(len(models) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        take = np.arange(offsets[-1]) + np.repeat(
            self.offsets[models] - offsets[:-1], sizes
        )
        used, codes = np.unique(self.codes[take], return_inverse=True)
        ragged = RaggedEvaluations(
            queries=self.queries[used].tolist(),
            query_codes=codes.astype(np.int64),
            scores=self.sums[take] / self.counts[take],
            offsets=offsets,
        )
        return ragged, used


def _object_array(values):
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def keep(ragged):
    """Return the :class:`KeptEvaluations` of checked sets, one outcome each."""
    return KeptEvaluations(
        queries=_object_array(ragged.queries),
        codes=np.asarray(ragged.query_codes, dtype=np.int64).copy(),
        sums=np.asarray(ragged.scores, dtype=np.float64).copy(),
        counts=np.ones(len(ragged.query_codes), dtype=np.int64),
        offsets=np.asarray(ragged.offsets, dtype=np.int64).copy(),
    )


def query_codes(kept, queries):
    """Codes of ``queries`` in ``kept.queries`` extended by the new ones.

    Returns ``(codes, all_queries)``: new queries are appended in order of first
    appearance.
    """
    position = {query: i for i, query in enumerate(kept.queries.tolist())}
    added = []
    codes = np.empty(len(queries), dtype=np.int64)
    for i, query in enumerate(queries):
        code = position.get(query)
        if code is None:
            code = position[query] = len(position)
            added.append(query)
        codes[i] = code
    if not added:
        return codes, kept.queries
    return codes, np.concatenate([kept.queries, _object_array(added)])


def add_outcomes(kept, models, queries, scores):
    """Join outcomes to the evaluations of their models.

    Parameters
    ----------
    kept : KeptEvaluations
    models : ndarray of shape (n_outcomes,), int
        The model (an index) of each outcome.
    queries : sequence of length n_outcomes
    scores : ndarray of shape (n_outcomes,), float in [0, 1]

    Returns
    -------
    KeptEvaluations
        A pair seen before adds to its sum and count; a new pair comes after its
        model's earlier evaluations, in order of first appearance.
    """
    codes, all_queries = query_codes(kept, queries)
    width = len(all_queries)
    models = np.asarray(models, dtype=np.int64)
    scores = np.asarray(scores, dtype=np.float64)
    n_models = len(kept.offsets) - 1
    owners = kept.owners()
    old_keys = owners * width + kept.codes
    new_keys = models * width + codes
    order = np.argsort(old_keys, kind="stable")
    at = np.minimum(np.searchsorted(old_keys[order], new_keys), max(len(order) - 1, 0))
    seen = np.zeros(len(new_keys), dtype=bool)
    if len(order):
        seen = old_keys[order][at] == new_keys
    sums, counts = kept.sums.copy(), kept.counts.copy()
    np.add.at(sums, order[at[seen]], scores[seen])
    np.add.at(counts, order[at[seen]], 1)
    fresh, first, inverse = np.unique(
        new_keys[~seen], return_index=True, return_inverse=True
    )
    fresh_sums = np.bincount(inverse, scores[~seen], minlength=len(fresh))
    fresh_counts = np.bincount(inverse, minlength=len(fresh)).astype(np.int64)
    arrival = np.argsort(first, kind="stable")
    fresh, fresh_sums, fresh_counts = (
        fresh[arrival],
        fresh_sums[arrival],
        fresh_counts[arrival],
    )
    all_owners = np.concatenate([owners, fresh // width])
    # Stable: within a model, its earlier evaluations first, then the new pairs.
    regroup = np.argsort(all_owners, kind="stable")
    offsets = np.zeros(n_models + 1, dtype=np.int64)
    np.cumsum(np.bincount(all_owners, minlength=n_models), out=offsets[1:])
    return KeptEvaluations(
        queries=all_queries,
        codes=np.concatenate([kept.codes, fresh % width])[regroup],
        sums=np.concatenate([sums, fresh_sums])[regroup],
        counts=np.concatenate([counts, fresh_counts])[regroup],
        offsets=offsets,
    )


def append_models(kept, ragged):
    """Return ``kept`` with the sets of ``ragged`` as new models after its own."""
    lookup, all_queries = query_codes(kept, ragged.queries)
    return KeptEvaluations(
        queries=all_queries,
        codes=np.concatenate([kept.codes, lookup[ragged.query_codes]]),
        sums=np.concatenate([kept.sums, np.asarray(ragged.scores, np.float64)]),
        counts=np.concatenate(
            [kept.counts, np.ones(len(ragged.query_codes), dtype=np.int64)]
        ),
        offsets=np.concatenate([kept.offsets, kept.offsets[-1] + ragged.offsets[1:]]),
    )


def keep_models(kept, mask):
    """Return the evaluations of the models ``mask`` keeps, and the queries' codes.

    Returns ``(kept, used)``: queries no kept model was evaluated on are dropped,
    and ``used`` says which of the old ``queries`` remain (to subset what is kept
    per query alongside).
    """
    mask = np.asarray(mask, dtype=bool)
    rows = kept.owners()
    chosen = mask[rows]
    used = np.zeros(len(kept.queries), dtype=bool)
    used[kept.codes[chosen]] = True
    recode = np.cumsum(used) - 1
    offsets = np.zeros(int(mask.sum()) + 1, dtype=np.int64)
    np.cumsum(kept.sizes[mask], out=offsets[1:])
    return (
        KeptEvaluations(
            queries=kept.queries[used],
            codes=recode[kept.codes[chosen]],
            sums=kept.sums[chosen],
            counts=kept.counts[chosen],
            offsets=offsets,
        ),
        used,
    )


def inconsistency(kept, n_models):
    """Say what in kept evaluations does not fit together (or None)."""
    queries, codes, sums, counts, offsets = kept
    if offsets.shape != (n_models + 1,) or offsets[0] != 0:
        return f"evaluation_offsets_ are not {n_models + 1} offsets from 0"
    if (np.diff(offsets) < 1).any() or offsets[-1] != len(codes):
        return (
            "evaluation_offsets_ do not give each model at least one of the "
            f"{len(codes)} evaluations"
        )
    if not len(codes) == len(sums) == len(counts):
        return (
            "evaluation_codes_, evaluation_sums_ and evaluation_counts_ differ in "
            "length"
        )
    if len(codes) and (codes.min() < 0 or codes.max() >= len(queries)):
        return "evaluation_codes_ point outside evaluation_queries_"
    if (
        (counts < 1).any()
        or not np.isfinite(sums).all()
        or (sums < 0).any()
        or (sums > counts).any()
    ):
        return "evaluation_sums_ are not sums of evaluation_counts_ scores in [0, 1]"
    keys = kept.owners() * max(len(queries), 1) + codes
    if len(np.unique(keys)) != len(keys):
        return "a model has two evaluations of one query in evaluation_codes_"
    if len(set(queries.tolist())) != len(queries):
        return "evaluation_queries_ hold a query twice"
    return None
