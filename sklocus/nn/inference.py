"""Inference over ragged evaluation sets: one batching loop for every pass.

Embedding (the set encoder's forward pass), refinement and scoring each model on
its own queries all walk the sets through :func:`padded_batches`: sets are padded
to :func:`~sklocus.nn.batching.padded_width` of their own size and grouped by it
(:func:`~sklocus.nn.batching.size_buckets`), so a set is padded alike whatever
sets share its batch, and the batching of a given input never changes. Scoring
every model on every query (:func:`score_pairs`) needs no padding and chunks the
models instead.

These functions take the torch modules and plain arrays; the scikit-learn face
(:class:`~sklocus.LocusEmbedder`) validates the input and chooses the settings.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from sklocus.nn.batching import pad, size_buckets
from sklocus.nn.refinement import refine_embeddings

# Inference batches: at most MAX_SETS sets, and at most as many (set x evaluation)
# tokens as keep a batch's activations (tokens x embedding_dim floats) within
# CPU_BATCH_FLOATS on a CPU, where cache-sized batches run 1.5x faster than 2^16
# tokens at the default width (benchmarks/speed.py), or GPU_MAX_TOKENS on a GPU.
CPU_BATCH_FLOATS = 1 << 20
GPU_MAX_TOKENS = 1 << 16
# Refinement runs tens of small steps per batch, and on a GPU each step's time was
# mostly the launching of its kernels, not their work: its batches there hold up
# to GPU_REFINE_FLOATS floats per (tokens x embedding_dim) tensor (256 MiB; a
# step keeps several such tensors and the hidden layer: about 2.5 GiB at the
# default width by count, not measured), 8 times the forward pass's tokens at
# that width, so that a pool takes fewer batches: 112 x 4,096 evaluations, one.
GPU_REFINE_FLOATS = 1 << 26
MAX_SETS = 256
# score_pairs works through at most this many (model, query) pairs at once.
MAX_PAIRS = 1 << 20
# Choices of the inference precision (torch dtype names).
PRECISIONS = ("float32", "bfloat16", "float16")


def max_tokens(device, embedding_dim, refining=False):
    """Most (set x evaluation) tokens of an inference batch on ``device``."""
    if torch.device(device).type == "cpu":
        return max(CPU_BATCH_FLOATS // embedding_dim, 1)
    if refining:
        return max(GPU_REFINE_FLOATS // embedding_dim, GPU_MAX_TOKENS)
    return GPU_MAX_TOKENS


def inference_context(device, precision="float32"):
    """Context of an inference pass: no autograd, and autocast below float32.

    Parameters
    ----------
    device : str
    precision : {"float32", "bfloat16", "float16"}, default="float32"

    Returns
    -------
    contextlib.ExitStack
    """
    if precision not in PRECISIONS:
        raise ValueError(
            f"inference_precision={precision!r}; expected one of "
            f"{', '.join(map(repr, PRECISIONS))}"
        )
    stack = contextlib.ExitStack()
    stack.enter_context(torch.inference_mode())
    if precision != "float32":
        stack.enter_context(
            torch.autocast(
                device_type=torch.device(device).type, dtype=getattr(torch, precision)
            )
        )
    return stack


def padded_batches(codes, scores, *, device, tokens):
    """Batches of sets padded to their own width, as tensors on ``device``.

    Parameters
    ----------
    codes : sequence of ndarray of shape (n_i,), int
        Query rows of each set.
    scores : sequence of ndarray of shape (n_i,), or None
        Scores of each set; ``None`` when the pass needs only the queries.
    device : str
    tokens : int
        Most (set x evaluation) tokens of a batch (see :func:`max_tokens`).

    Yields
    ------
    batch : ndarray of int
        Indices of the batch's sets.
    codes : LongTensor of shape (len(batch), width)
    scores : Tensor of shape (len(batch), width), or None
    mask : BoolTensor of shape (len(batch), width), or None
        ``True`` for real evaluations; ``None`` when no set of the batch is
        padded, which lets attention take its unmasked fast path.
    """
    sizes = np.fromiter((len(c) for c in codes), dtype=np.int64, count=len(codes))
    for batch, width in size_buckets(sizes, tokens, MAX_SETS):
        batch_codes, mask = pad([codes[i] for i in batch], 0, torch.long, width)
        batch_scores = None
        if scores is not None:
            batch_scores, _ = pad([scores[i] for i in batch], 0.0, torch.float32, width)
            batch_scores = batch_scores.to(device)
        mask = None if mask.all() else mask.to(device)
        yield batch, batch_codes.to(device), batch_scores, mask


def _set_codes_and_scores(ragged):
    codes = [ragged.set_codes(i) for i in range(ragged.n_sets)]
    scores = [ragged.set_scores(i) for i in range(ragged.n_sets)]
    return codes, scores


def embed_sets(
    encoder,
    ragged,
    vectors,
    *,
    embedding_dim,
    device,
    precision="float32",
    progress=None,
):
    """Forward-pass embeddings of every set, in the network's own units.

    Parameters
    ----------
    encoder : SetEncoder
    ragged : RaggedEvaluations
    vectors : ndarray of shape (n_queries, query_dim)
        Encodings of ``ragged.queries``.
    embedding_dim : int
        The encoder's output width.
    device : str
    precision : str, default="float32"
    progress : callable, default=None
        Called with the number of sets of each batch once it is embedded.

    Returns
    -------
    ndarray of shape (n_sets, embedding_dim), float32
    """
    codes, scores = _set_codes_and_scores(ragged)
    out = np.empty((ragged.n_sets, embedding_dim), dtype=np.float32)
    tokens = max_tokens(device, embedding_dim)
    with inference_context(device, precision):
        table = torch.as_tensor(vectors, device=device)
        projected = encoder.tokenizer.project_queries(table)
        for batch, batch_codes, batch_scores, mask in padded_batches(
            codes, scores, device=device, tokens=tokens
        ):
            z = encoder.embed_projected(projected, batch_codes, batch_scores, mask)
            out[batch] = z.float().cpu().numpy()
            if progress is not None:
                progress(len(batch))
    return out


def refine_sets(
    predictor, ragged, vectors, embeddings, *, device, progress=None, **settings
):
    """Refine ``embeddings`` in place on each set's own evaluations.

    Parameters
    ----------
    predictor : CorrectnessPredictor
        Read, never changed.
    ragged : RaggedEvaluations
    vectors : ndarray of shape (n_queries, query_dim)
    embeddings : ndarray of shape (n_sets, embedding_dim), float32
        Forward-pass embeddings in the network's own units; overwritten.
    device : str
    progress : callable, default=None
        Called with the number of sets of each batch once it is refined.
    **settings
        ``steps``, ``penalty`` and ``step_size`` of
        :func:`~sklocus.nn.refinement.refine_embeddings`.
    """
    codes, scores = _set_codes_and_scores(ragged)
    # Autograd cannot run under inference_mode; no_grad keeps the frozen
    # predictor's weights out of the graph's outputs all the same.
    with torch.no_grad():
        projected = predictor.project_query(torch.as_tensor(vectors, device=device))
    tokens = max_tokens(device, embeddings.shape[1], refining=True)
    for batch, batch_codes, batch_scores, mask in padded_batches(
        codes, scores, device=device, tokens=tokens
    ):
        z = refine_embeddings(
            predictor,
            torch.as_tensor(embeddings[batch], device=device),
            projected,
            batch_codes,
            batch_scores,
            mask,
            **settings,
        )
        embeddings[batch] = z.cpu().numpy()
        if progress is not None:
            progress(len(batch))


def score_own_queries(
    predictor, embeddings, codes, vectors, *, device, precision="float32"
):
    """Probabilities of each model on its own queries, as a list of arrays.

    Parameters
    ----------
    predictor : CorrectnessPredictor
    embeddings : ndarray of shape (n_models, embedding_dim)
        In the network's own units.
    codes : sequence of ndarray of shape (n_i,), int
        Rows of ``vectors`` that each model is scored on.
    vectors : ndarray of shape (n_queries, query_dim)
    device : str
    precision : str, default="float32"

    Returns
    -------
    list of ndarray of shape (n_i,), float32
    """
    out = [None] * len(codes)
    tokens = max_tokens(device, embeddings.shape[1])
    with inference_context(device, precision):
        projected = predictor.project_query(torch.as_tensor(vectors, device=device))
        for batch, batch_codes, _, _ in padded_batches(
            codes, None, device=device, tokens=tokens
        ):
            z = torch.as_tensor(embeddings[batch], device=device)
            logits = predictor.score_projected(z, projected, batch_codes)
            probabilities = torch.sigmoid(logits).float().cpu().numpy()
            for row, i in enumerate(batch):
                out[i] = probabilities[row, : len(codes[i])]
    return out


def score_pairs(predictor, embeddings, vectors, *, device, precision="float32"):
    """Probability of every model on every query.

    Parameters
    ----------
    predictor : CorrectnessPredictor
    embeddings : ndarray of shape (n_models, embedding_dim)
        In the network's own units.
    vectors : ndarray of shape (n_queries, query_dim)
    device : str
    precision : str, default="float32"

    Returns
    -------
    ndarray of shape (n_models, n_queries), float32
    """
    out = np.empty((len(embeddings), len(vectors)), dtype=np.float32)
    step = max(1, MAX_PAIRS // max(len(vectors), 1))
    with inference_context(device, precision):
        # Project the queries once, not once per chunk of models.
        u = predictor.project_query(torch.as_tensor(vectors, device=device))
        for start in range(0, len(embeddings), step):
            z = torch.as_tensor(embeddings[start : start + step], device=device)
            logits = predictor.pairwise_projected(z, u)
            out[start : start + step] = torch.sigmoid(logits).float().cpu().numpy()
    return out
