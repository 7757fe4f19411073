"""Refine embeddings with learned steps on their own prediction errors."""

from __future__ import annotations

import torch
from torch import nn


class ResidualRefinement(nn.Module):
    """Correct each embedding by what the predictor gets wrong on its own set.

    The set encoder sees every evaluation but never its own mistakes, and
    attention is a weighted mean, so a model's embedding does not sharpen as its
    evaluations grow. Each refinement step scores the set's own evaluations with
    the predictor, takes the residuals ``r_i = y_i - P(z, x_i)`` and moves

        ``z <- z + V (sum_i r_i u_i) / (n + c)``

    where ``u_i`` is the predictor's projection of query ``x_i``, ``n`` the number
    of evaluations, ``V`` a learned matrix and ``c > 0`` a learned pseudo-count.
    For a bilinear predictor ``sum_i r_i u_i`` is the gradient of the set's
    log-likelihood in ``z``, so a step is a learned Newton step whose size
    shrinks the correction of small sets towards the encoder's guess
    (``n / (n + c)``) and trusts that of large ones. It is part of the forward
    pass, deterministic and order-free (a masked sum); nothing is fitted per
    model. ``V`` starts at zero, so an untrained step leaves the encoder's
    embedding as it is.

    Parameters
    ----------
    embedding_dim : int
        Width of the embeddings and of the predictor's query projection.
    steps : int
        Refinement steps (0: the embeddings pass unchanged).
    """

    def __init__(self, embedding_dim: int, steps: int):
        super().__init__()
        self.directions = nn.ModuleList(
            nn.Linear(embedding_dim, embedding_dim, bias=False) for _ in range(steps)
        )
        for direction in self.directions:
            nn.init.zeros_(direction.weight)
        # softplus(c_raw) is the pseudo-count; softplus(3.0) is about 3 evaluations.
        self.pseudo_counts = nn.Parameter(torch.full((steps,), 3.0))

    def forward(self, embeddings, predictor, projected, codes, scores, mask=None):
        """Refine each set's embedding.

        Parameters
        ----------
        embeddings : Tensor of shape (batch, embedding_dim)
            The set encoder's embeddings.
        predictor : CorrectnessPredictor
            Scores an embedding on a query.
        projected : Tensor of shape (n_queries, embedding_dim)
            ``predictor.project_query`` of the query table.
        codes : LongTensor of shape (batch, n_evals)
            Row of ``projected`` of each evaluation's query.
        scores : Tensor of shape (batch, n_evals)
        mask : BoolTensor of shape (batch, n_evals), optional
            ``True`` for real evaluations, ``False`` for padding.

        Returns
        -------
        Tensor of shape (batch, embedding_dim)
        """
        if not len(self.directions):
            return embeddings
        u = nn.functional.embedding(codes, projected)
        scores = scores.to(u.dtype)
        if mask is None:
            weight = torch.ones_like(scores)
        else:
            weight = mask.to(u.dtype)
        counts = weight.sum(1, keepdim=True)
        for direction, raw in zip(self.directions, self.pseudo_counts):
            logits = predictor.score_projected(embeddings, projected, codes)
            residuals = (scores - torch.sigmoid(logits)) * weight
            gradient = torch.einsum("bn,bnd->bd", residuals, u)
            step = direction(gradient) / (counts + nn.functional.softplus(raw))
            embeddings = embeddings + step.to(embeddings.dtype)
        return embeddings
