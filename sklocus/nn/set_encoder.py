"""The LOCUS set encoder ``F``: a set of scored evaluations to one vector."""

from __future__ import annotations

import torch
from torch import nn

from sklocus.nn.attention import (
    AttentionPooling,
    LatentBottleneckLayer,
    apart_from_batch,
)


class EvaluationTokenizer(nn.Module):
    """Map each evaluation ``(phi(x), y)`` to a token.

    The MLP ``h`` reads ``[phi(x), y, phi(x) * (2y - 1)]``: the sign of the score
    multiplies the query encoding, so a right and a wrong answer to one query point
    in opposite directions.

    The first layer is linear in ``y``: with its weight split as ``[W1, w, W2]``
    over those three parts, its output is ``(W1 - W2) phi(x) + b + y (w + 2 W2
    phi(x))``. So each distinct query is projected once (:meth:`project_queries`)
    and every evaluation of it only combines the two projections with its score,
    instead of multiplying its own ``2 * query_dim + 1`` features.

    Parameters
    ----------
    query_dim : int
        Width of the query encodings ``phi(x)``.
    dim : int
        Width of the tokens.
    """

    def __init__(self, query_dim: int, dim: int):
        super().__init__()
        self.query_dim = query_dim
        self.mlp = nn.Sequential(
            nn.Linear(2 * query_dim + 1, dim), nn.GELU(), nn.Linear(dim, dim)
        )

    def project_queries(self, query_table):
        """Project each distinct query once.

        Parameters
        ----------
        query_table : Tensor of shape (n_queries, query_dim)

        Returns
        -------
        Tensor of shape (n_queries, 2, dim)
            For each query, the first layer's output at ``y = 0`` and its change per
            unit of ``y``.
        """
        first = self.mlp[0]
        d = self.query_dim
        plain, score, signed = first.weight.split([d, 1, d], dim=1)
        weight = torch.cat([plain - signed, 2.0 * signed])  # (2 * dim, query_dim)
        bias = torch.cat([first.bias, score[:, 0]])
        projected = nn.functional.linear(query_table, weight, bias)
        return projected.view(len(query_table), 2, -1)

    def forward(self, projected, codes, scores):
        """Tokenize.

        Parameters
        ----------
        projected : Tensor of shape (n_queries, 2, dim)
            Output of :meth:`project_queries`.
        codes : LongTensor of shape (batch, n_evals)
            Row of ``projected`` of each evaluation's query.
        scores : Tensor of shape (batch, n_evals)

        Returns
        -------
        Tensor of shape (batch, n_evals, dim)
        """
        # embedding() is a gather whose backward is a fast dense scatter-add.
        rows = nn.functional.embedding(codes, projected.flatten(1))
        at_zero, per_score = rows.unflatten(-1, projected.shape[1:]).unbind(-2)
        hidden = at_zero + scores.unsqueeze(-1).to(at_zero.dtype) * per_score
        return self.mlp[2](self.mlp[1](hidden))


class SetEncoder(nn.Module):
    """Tokenize, pass through latent bottlenecks, pool: ``z_m = F(S_m)``.

    No positional encoding anywhere, so the output does not depend on the order of
    the evaluations.

    Every set also holds ``prior_tokens`` learned tokens, the same for all sets,
    which every attention sees beside the real evaluations. Attention is a
    weighted mean, so without them a set of 16 evaluations and one of 512 with
    the same rates give the same embedding: the encoder cannot tell how much
    evidence it has. A learned token's share of each softmax shrinks as real
    evaluations are added (about ``1 / (1 + c n)``), so the embedding can lean on
    a learned prior for small sets and on the evaluations for large ones, as a
    posterior mean does.

    Parameters
    ----------
    query_dim : int
        Width of the query encodings.
    embedding_dim : int
        Width of the tokens, latents and the output embedding.
    n_latents : int
        Learned latents per bottleneck layer.
    n_layers : int
        Bottleneck layers.
    n_heads : int
        Attention heads.
    dropout : float, default=0.0
        Dropout during training.
    prior_tokens : int, default=0
        Learned tokens added to every set (0: the paper's encoder).
    """

    def __init__(
        self,
        query_dim: int,
        embedding_dim: int,
        n_latents: int,
        n_layers: int,
        n_heads: int,
        dropout: float = 0.0,
        prior_tokens: int = 0,
    ):
        super().__init__()
        self.tokenizer = EvaluationTokenizer(query_dim, embedding_dim)
        self.layers = nn.ModuleList(
            LatentBottleneckLayer(embedding_dim, n_latents, n_heads, dropout)
            for _ in range(n_layers)
        )
        self.pooling = AttentionPooling(embedding_dim, n_heads, dropout)
        self.output = nn.Sequential(
            nn.LayerNorm(embedding_dim), nn.Linear(embedding_dim, embedding_dim)
        )
        self.prior = nn.Parameter(torch.randn(prior_tokens, embedding_dim) * 0.02)

    def forward(self, query_table, codes, scores, mask=None):
        """Embed each set.

        Parameters
        ----------
        query_table : Tensor of shape (n_queries, query_dim)
            Encodings of the distinct queries of the batch.
        codes : LongTensor of shape (batch, n_evals)
            Row of ``query_table`` of each evaluation's query.
        scores : Tensor of shape (batch, n_evals)
        mask : BoolTensor of shape (batch, n_evals), optional
            ``True`` for real evaluations, ``False`` for padding.

        Returns
        -------
        Tensor of shape (batch, embedding_dim)
        """
        return self.embed_projected(
            self.tokenizer.project_queries(query_table), codes, scores, mask
        )

    def embed_projected(self, projected, codes, scores, mask=None):
        """Embed each set from queries already projected by the tokenizer.

        Lets a caller that embeds many batches over one query table project it
        once; see :meth:`forward` for the parameters and
        :meth:`EvaluationTokenizer.project_queries` for ``projected``.
        """
        tokens = self.tokenizer(projected, codes, scores)
        tokens, mask = self._with_prior(tokens, mask)
        for layer in self.layers:
            tokens = layer(tokens, mask)
        return apart_from_batch(self.output, self.pooling(tokens, mask))

    def _with_prior(self, tokens, mask):
        """Append the learned prior tokens to every set (and to its mask)."""
        n_prior = len(self.prior)
        if not n_prior:
            return tokens, mask
        batch = len(tokens)
        prior = self.prior.to(tokens.dtype).expand(batch, n_prior, -1)
        tokens = torch.cat([tokens, prior], dim=1)
        if mask is not None:
            real = mask.new_ones(batch, n_prior)
            mask = torch.cat([mask, real], dim=1)
        return tokens, mask
