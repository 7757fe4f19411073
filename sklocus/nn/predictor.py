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

    def first_layer_blocks(self):
        """Split the first layer into its blocks for ``z``, ``u`` and ``z * u``.

        Returns
        -------
        weight_z, weight_u, weight_zu : Tensor of shape (hidden, embedding_dim)
        bias : Tensor of shape (hidden,)
        """
        first = self.mlp[0]
        blocks = first.weight.split(self.project_query.out_features, dim=1)
        return (*blocks, first.bias)

    def score_projected(self, embeddings, projected, codes):
        """Like :meth:`forward`, from ``project_query(query_table)``.

        The first layer on ``[z, u, z * u]`` is computed by parts, without
        building the ``(batch, n_targets, 3 * embedding_dim)`` features: the
        ``z`` part once per model, and the ``u`` and ``z * u`` parts per pair:
        two thirds of the products, and no concatenation. Each part is
        computed row by row alike whatever the batch and the table hold (the
        ``z`` part as a sum of products, not a matrix product whose kernel may
        change with the number of models), so a model's logits do not depend
        on the other models or queries passed with it beyond float32 rounding,
        which a kernel may apply to a row by its place in the batch.
        """
        _, activation, dropout, last = self.mlp
        weight_z, weight_u, weight_zu, bias = self.first_layer_blocks()
        model_part = (embeddings.unsqueeze(1) * weight_z).sum(-1) + bias
        u = nn.functional.embedding(codes, projected)
        hidden = u @ weight_u.T + (embeddings.unsqueeze(1) * u) @ weight_zu.T
        hidden = hidden + model_part.unsqueeze(1)
        return last(dropout(activation(hidden))).squeeze(-1)

    def pairwise(self, embeddings, query_vectors, chunk=512):
        """Score every model on every query.

        Equal to ``forward`` on every (model, query) pair, but computed without
        building the ``(n_models, n_queries, 3 * embedding_dim)`` features: the first
        layer splits into a part for ``z``, one for ``u`` and one for ``z * u``; the
        last is ``(z * u) @ W_zu.T = u @ (W_zu * z).T``, so for a chunk of queries
        the interaction with every model is one matrix product against the stacked
        ``W_zu * z_m``. Chunks of ``chunk`` queries keep the hidden layer small
        enough to stay in cache.

        Parameters
        ----------
        embeddings : Tensor of shape (n_models, embedding_dim)
        query_vectors : Tensor of shape (n_queries, query_dim)
        chunk : int, default=512
            Queries scored at once.

        Returns
        -------
        Tensor of shape (n_models, n_queries)
            Logits.
        """
        return self.pairwise_projected(
            embeddings, self.project_query(query_vectors), chunk
        )

    def pairwise_projected(self, embeddings, projected, chunk=512):
        """Like :meth:`pairwise`, from ``project_query(query_vectors)``.

        Lets a caller that scores many chunks of models against one set of queries
        project the queries once.
        """
        _, activation, _, last = self.mlp
        n_models, dim = embeddings.shape
        weight_z, weight_u, weight_zu, bias = self.first_layer_blocks()
        hidden_dim = bias.shape[0]
        # (dim, n_models * hidden): column block m is (W_zu * z_m).T.
        stacked = (weight_zu[None] * embeddings[:, None, :]).reshape(-1, dim).T
        model_part = embeddings @ weight_z.T + bias  # (n_models, hidden)
        u = projected
        query_part = u @ weight_u.T  # (n_queries, hidden)
        out = []
        for start in range(0, len(u), chunk):
            rows = slice(start, start + chunk)
            hidden = (u[rows] @ stacked).view(-1, n_models, hidden_dim)
            hidden = hidden + model_part + query_part[rows, None, :]
            out.append(last(activation(hidden)).squeeze(-1))  # (chunk, n_models)
        return torch.cat(out).T
