"""The LOCUS set encoder ``F``: a set of scored evaluations to one vector."""

from __future__ import annotations

import torch
from torch import nn

from sklocus.nn.attention import AttentionPooling, LatentBottleneckLayer


class EvaluationTokenizer(nn.Module):
    """Map each evaluation ``(phi(x), y)`` to a token.

    The MLP ``h`` reads ``[phi(x), y, phi(x) * (2y - 1)]``: the sign of the score
    multiplies the query encoding, so a right and a wrong answer to one query point
    in opposite directions.

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

    def forward(self, query_vectors, scores):
        """Tokenize.

        Parameters
        ----------
        query_vectors : Tensor of shape (batch, n_evals, query_dim)
        scores : Tensor of shape (batch, n_evals)

        Returns
        -------
        Tensor of shape (batch, n_evals, dim)
        """
        scores = scores.unsqueeze(-1).to(query_vectors.dtype)
        signed = query_vectors * (2.0 * scores - 1.0)
        return self.mlp(torch.cat([query_vectors, scores, signed], dim=-1))


class SetEncoder(nn.Module):
    """Tokenize, pass through latent bottlenecks, pool: ``z_m = F(S_m)``.

    No positional encoding anywhere, so the output does not depend on the order of
    the evaluations.

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
    """

    def __init__(
        self,
        query_dim: int,
        embedding_dim: int,
        n_latents: int,
        n_layers: int,
        n_heads: int,
        dropout: float = 0.0,
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

    def forward(self, query_vectors, scores, mask=None):
        """Embed each set.

        Parameters
        ----------
        query_vectors : Tensor of shape (batch, n_evals, query_dim)
        scores : Tensor of shape (batch, n_evals)
        mask : BoolTensor of shape (batch, n_evals), optional
            ``True`` for real evaluations, ``False`` for padding.

        Returns
        -------
        Tensor of shape (batch, embedding_dim)
        """
        tokens = self.tokenizer(query_vectors, scores)
        for layer in self.layers:
            tokens = layer(tokens, mask)
        return self.output(self.pooling(tokens, mask))
