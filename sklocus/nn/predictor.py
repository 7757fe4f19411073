"""The LOCUS correctness predictor ``G(z, phi(x))``."""

from __future__ import annotations

import torch
from torch import nn


class CorrectnessPredictor(nn.Module):
    """Logit of P(model with embedding ``z`` answers query ``x`` correctly).

    ``u = A phi(x) + b``, then a two-layer MLP on ``[z, u, z * u]``.

    Parameters
    ----------
    query_dim : int
        Width of the query encodings.
    embedding_dim : int
        Width of the model embeddings (and of ``u``).
    hidden : int
        Hidden width of the MLP.
    dropout : float, default=0.0
        Dropout on the hidden layer during training.
    """

    def __init__(self, query_dim: int, embedding_dim: int, hidden: int, dropout=0.0):
        super().__init__()
        self.project_query = nn.Linear(query_dim, embedding_dim)
        self.mlp = nn.Sequential(
            nn.Linear(3 * embedding_dim, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, 1),
        )

    def forward(self, embeddings, query_table, codes):
        """Score each model on its own queries.

        Parameters
        ----------
        embeddings : Tensor of shape (batch, embedding_dim)
        query_table : Tensor of shape (n_queries, query_dim)
            Encodings of the distinct queries of the batch.
        codes : LongTensor of shape (batch, n_targets)
            Row of ``query_table`` of each query to score.

        Returns
        -------
        Tensor of shape (batch, n_targets)
            Logits.
        """
        return self.score_projected(embeddings, self.project_query(query_table), codes)

    def score_projected(self, embeddings, projected, codes):
        """Like :meth:`forward`, from ``project_query(query_table)``."""
        u = nn.functional.embedding(codes, projected)
        z = embeddings.unsqueeze(1).expand_as(u)
        return self.mlp(torch.cat([z, u, z * u], dim=-1)).squeeze(-1)

    def pairwise(self, embeddings, query_vectors):
        """Score every model on every query.

        Equal to ``forward`` on every (model, query) pair, but computed without
        building the ``(n_models, n_queries, 3 * embedding_dim)`` features: the first
        layer splits into a part for ``z``, one for ``u`` and one for ``z * u``, and the
        last is a batched matrix product.

        Parameters
        ----------
        embeddings : Tensor of shape (n_models, embedding_dim)
        query_vectors : Tensor of shape (n_queries, query_dim)

        Returns
        -------
        Tensor of shape (n_models, n_queries)
            Logits.
        """
        first, activation, _, last = self.mlp
        dim = embeddings.shape[1]
        weight_z, weight_u, weight_zu = first.weight.split(dim, dim=1)
        u = self.project_query(query_vectors)
        # (z * u) @ weight_zu.T for every pair = u @ (weight_zu * z_m).T for each m.
        interaction = torch.matmul(
            u, (weight_zu * embeddings[:, None, :]).transpose(1, 2)
        )
        hidden = interaction + (embeddings @ weight_z.T + first.bias)[:, None, :]
        hidden = hidden + (u @ weight_u.T)[None, :, :]
        return last(activation(hidden)).squeeze(-1)
