"""What a router holds per model, as one value: a row of each of its arrays.

A router's stages keep their per-model values in arrays of the router (one row
per model, in the order of ``classes_``); adding, re-embedding and removing
models writes or drops rows of every one of them at once, here.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from sklocus._router._exploration import Exploration


class ModelRows(NamedTuple):
    """Rows of the router's per-model arrays, each None where the router has none.

    ``heads`` is ``(weights, biases, blends)`` of the query heads; ``factors``
    the exploration's Laplace factors, kept only while they are cached.
    """

    embeddings: np.ndarray
    model_offsets: np.ndarray | None = None
    heads: tuple | None = None
    group_offsets: np.ndarray | None = None
    factors: torch.Tensor | None = None


def model_rows(router):
    """Return the rows of every model of a fitted router (no exploration factors)."""
    heads = None
    if getattr(router, "head_weights_", None) is not None:
        heads = (router.head_weights_, router.head_biases_, router.head_blends_)
    return ModelRows(
        router.embeddings_,
        getattr(router, "model_offsets_", None),
        heads,
        getattr(router, "group_offsets_", None),
    )


def _placed(old, new, indices):
    """Return ``old`` with ``new`` at ``indices`` (past the end: appended), anew."""
    n = max(len(old), int(indices.max()) + 1)
    if isinstance(old, torch.Tensor):
        out = old.new_empty((n, *old.shape[1:]))
    else:
        out = np.empty((n, *old.shape[1:]), dtype=old.dtype)
    out[: len(old)] = old
    out[indices] = new
    return out


def set_rows(router, indices, rows):
    """Put ``rows`` at ``indices`` of the router's arrays.

    Indices past the end append. The arrays are replaced, never written into: a
    served router's snapshots share them.
    """
    if rows.factors is not None:
        cached = _placed(router._exploration_cache[1], rows.factors, indices)
    router.embeddings_ = _placed(router.embeddings_, rows.embeddings, indices)
    if rows.factors is not None:
        router._exploration_cache = (router.embeddings_, cached)
    if rows.model_offsets is not None:
        router.model_offsets_ = _placed(
            router.model_offsets_, rows.model_offsets, indices
        )
    if rows.heads is not None:
        old = model_rows(router).heads
        router.head_weights_, router.head_biases_, router.head_blends_ = (
            _placed(before, new, indices) for before, new in zip(old, rows.heads)
        )
    if rows.group_offsets is not None:
        router.group_offsets_ = _placed(
            router.group_offsets_, rows.group_offsets, indices
        )


def keep_rows(router, kept):
    """Keep the rows of the models ``kept`` (a mask), dropping the others."""
    # Exploration's factors are kept only when current for these embeddings.
    cached = Exploration(router, None).cached()
    router.embeddings_ = router.embeddings_[kept]
    if cached:
        factors = router._exploration_cache[1][torch.as_tensor(kept)]
        router._exploration_cache = (router.embeddings_, factors)
    if router.group_offsets_ is not None:
        router.group_offsets_ = router.group_offsets_[kept]
    if router.model_offsets_ is not None:
        router.model_offsets_ = router.model_offsets_[kept]
    heads = model_rows(router).heads
    if heads is not None:
        router.head_weights_, router.head_biases_, router.head_blends_ = (
            values[kept] for values in heads
        )
