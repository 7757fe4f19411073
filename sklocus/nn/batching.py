"""Batching of ragged evaluation sets: padding and size buckets."""

from __future__ import annotations

import numpy as np
import torch

# Widths are multiples of this many rows. MKL on an Intel processor computes a
# matrix product in blocks of 16 rows and rounds a row differently at another
# place in its block, so the predictor's layers, which run over a batch's (set x
# evaluation) rows, give a set the same bits alone and among others only when
# every set starts a block. It is also the least width: fewer rows than that
# would make attention depend on the batch (sklocus.nn.attention). Other
# processors' kernels block otherwise, so this keeps a set's rounding alike in
# most company, not all: what is promised is agreement within float32 rounding
# (docs/user_guide/streaming.rst, "Why the vectors agree").
_ROW_BLOCK = 16
# Widths a set may be padded to per doubling of its size: at most 1/16 padding
# from 256 evaluations on, up to 15 rows below.
_WIDTHS_PER_OCTAVE = 16


def pad(rows, fill, dtype, width=None):
    """Stack 1-D arrays of varying length into one padded tensor.

    Parameters
    ----------
    rows : sequence of ndarray of shape (n_i,)
    fill : scalar
        Value of the padding.
    dtype : torch.dtype
    width : int, default=None
        Width of the result, at least the longest row; ``None`` is the longest.

    Returns
    -------
    padded : Tensor of shape (len(rows), width)
    mask : BoolTensor of shape (len(rows), width)
        ``True`` where a real value stands.
    """
    lengths = np.fromiter((len(row) for row in rows), dtype=np.int64, count=len(rows))
    longest = int(lengths.max()) if len(rows) else 0
    width = longest if width is None else max(width, longest)
    mask = np.arange(width)[None, :] < lengths[:, None]
    values = np.full((len(rows), width), fill, dtype=np.asarray(rows[0]).dtype)
    if len(rows):
        values[mask] = np.concatenate(rows)
    return torch.as_tensor(values, dtype=dtype), torch.from_numpy(mask)


def padded_width(sizes):
    """Return the width to which a set of each size is padded in inference.

    It depends on the set's own size alone, so that a set is embedded with the
    same padding whatever sets share its batch: attention over padded keys sums
    in an order that depends on their number, even where the mask hides them.
    Sizes are rounded up to a multiple of 16 and to one of 16 widths per doubling,
    whichever is coarser: a set's rows then start a block of 16 rows of every
    matrix product over the batch, where MKL's kernels compute them alike
    whatever precedes them, so embedding, refinement and prediction round a
    set alike alone and in most company (within float32 rounding in any).

    Parameters
    ----------
    sizes : ndarray of shape (n_sets,)
        Evaluations per set.

    Returns
    -------
    ndarray of shape (n_sets,), dtype int64
    """
    sizes = np.maximum(np.asarray(sizes, dtype=np.int64), 1)
    octave = np.floor(np.log2(sizes)).astype(np.int64)
    per_octave = np.left_shift(
        1, np.maximum(octave - int(np.log2(_WIDTHS_PER_OCTAVE)), 0)
    )
    step = np.maximum(per_octave, _ROW_BLOCK)  # powers of two: multiples of 16
    return -(-sizes // step) * step


def size_buckets(sizes, max_tokens, max_sets):
    """Group sets of one padded width into batches, so that little is padding.

    Parameters
    ----------
    sizes : ndarray of shape (n_sets,)
        Evaluations per set.
    max_tokens : int
        Largest ``batch_size * padded width`` of a batch (a set wider than this
        is a batch of its own).
    max_sets : int
        Largest number of sets in a batch.

    Returns
    -------
    list of (ndarray, int)
        Each batch: the indices of its sets and their one :func:`padded_width`,
        the width every inference pass (embedding, refinement, prediction) pads
        them to, so that no set's result depends on its batch-mates beyond
        float32 rounding. Sets are ordered by width (ties by index), so the
        batching of a given input never changes.
    """
    widths = padded_width(sizes)
    order = np.lexsort((np.arange(len(widths)), widths))
    batches, start = [], 0
    while start < len(order):
        width = widths[order[start]]
        stop = start + 1
        while (
            stop < len(order)
            and widths[order[stop]] == width
            and stop - start < max_sets
            and (stop - start + 1) * width <= max_tokens
        ):
            stop += 1
        batches.append((order[start:stop], int(width)))
        start = stop
    return batches
