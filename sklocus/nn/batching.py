"""Batching of ragged evaluation sets: padding and size buckets."""

from __future__ import annotations

import numpy as np
import torch


def pad(rows, fill, dtype):
    """Stack 1-D arrays of varying length into one padded tensor.

    Parameters
    ----------
    rows : sequence of ndarray of shape (n_i,)
    fill : scalar
        Value of the padding.
    dtype : torch.dtype

    Returns
    -------
    padded : Tensor of shape (len(rows), max n_i)
    mask : BoolTensor of shape (len(rows), max n_i)
        ``True`` where a real value stands.
    """
    lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    width = int(lengths.max()) if len(rows) else 0
    mask = np.arange(width)[None, :] < lengths[:, None]
    values = np.full((len(rows), width), fill, dtype=np.asarray(rows[0]).dtype)
    if len(rows):
        values[mask] = np.concatenate(rows)
    return torch.as_tensor(values, dtype=dtype), torch.from_numpy(mask)


def size_buckets(sizes, max_tokens, max_sets):
    """Group sets of similar size into batches, so that little is padding.

    Parameters
    ----------
    sizes : ndarray of shape (n_sets,)
        Evaluations per set.
    max_tokens : int
        Largest ``batch_size * longest_set`` of a batch (a set longer than this is
        a batch of its own).
    max_sets : int
        Largest number of sets in a batch.

    Returns
    -------
    list of ndarray
        Indices of the sets of each batch. Sets are ordered by size (ties by index),
        so the batching of a given input never changes.
    """
    order = np.argsort(sizes, kind="stable")
    batches, start = [], 0
    while start < len(order):
        stop = start + 1
        # Sizes increase along `order`, so the last set of a batch is its longest.
        while (
            stop < len(order)
            and stop - start < max_sets
            and (stop - start + 1) * sizes[order[stop]] <= max_tokens
        ):
            stop += 1
        batches.append(order[start:stop])
        start = stop
    return batches
