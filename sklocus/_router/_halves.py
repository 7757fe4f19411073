"""Each model's evaluations in two halves, each predicted from the other.

What the stages fitted on the pool's own evaluations hold out: each model's
evaluations are split in two halves by a fixed order of its queries (so that a
model gets the same halves whatever pool it is in and whatever order its
evaluations come in), each half is embedded on its own, and each pair is
predicted from the embedding of the other half (:mod:`._pool_calibration`,
:mod:`._probability_map`, :mod:`._learnt_groups`).
"""

from __future__ import annotations

import numpy as np

from sklocus._groups import logits


def split_halves(observed, rank):
    """Assign each observed (query, model) pair to half 0 or 1.

    Parameters
    ----------
    observed : ndarray of bool, shape (n_queries, n_models)
    rank : ndarray of int, shape (n_queries,)
        Each query's place in an order that does not depend on the order given
        (:func:`sklocus.evaluations.query_sort_key`), so that the halves do not.

    Returns
    -------
    ndarray of int8, shape (n_queries, n_models)
        0 or 1 for observed pairs, -1 elsewhere. A model with one evaluation has
        it in half 0 and nothing to hold out.
    """
    half = np.full(observed.shape, -1, dtype=np.int8)
    for j in range(observed.shape[1]):
        rows = np.flatnonzero(observed[:, j])
        rows = rows[np.argsort(rank[rows], kind="stable")]
        order = np.random.default_rng(len(rows)).permutation(len(rows))
        half[rows, j] = 0
        half[rows[order[len(rows) // 2 :]], j] = 1 if len(rows) > 1 else 0
    return half


def in_both_halves(half):
    """Mask of the models with evaluations in both halves, shape ``(n_models,)``."""
    return (half == 0).any(axis=0) & (half == 1).any(axis=0)


def held_out_pairs(predict, scores, half, chunk):
    """Held-out logits of every observed pair, predicted from the other half.

    Parameters
    ----------
    predict : callable
        ``predict(h, rows)`` gives the probabilities, shape ``(len(rows),
        n_models)``, of every model embedded from its half ``h`` on the queries
        ``rows``.
    scores : ndarray of shape (n_queries, n_models)
    half : ndarray of shape (n_queries, n_models)
        From :func:`split_halves`.
    chunk : int
        Queries predicted at once.

    Returns
    -------
    held_logits, targets, models, halves : ndarray of shape (n_pairs,)
        Over the pairs of models with evaluations in both halves; ``halves`` is
        the half each pair was predicted from.
    """
    both = in_both_halves(half)
    rows = np.flatnonzero((half >= 0)[:, both].any(axis=1))
    none = np.zeros(0, dtype=np.int64)
    found = [(np.zeros(0), np.zeros(0), none, none)]
    for start in range(0, len(rows), chunk):
        block = rows[start : start + chunk]
        for h in (0, 1):
            # Pairs of the other half, predicted from the embedding of half h.
            local, models = np.nonzero((half[block] == 1 - h) & both[None, :])
            if not len(local):
                continue
            predicted = logits(predict(h, block))
            found.append(
                (
                    predicted[local, models],
                    scores[block[local], models],
                    models,
                    np.full(len(models), h),
                )
            )
    return tuple(np.concatenate(column) for column in zip(*found))
