"""The full LOCUS network that skorch trains: set encoder plus predictor."""

from __future__ import annotations

import torch
from torch import nn

from sklocus.nn.predictor import CorrectnessPredictor
from sklocus.nn.set_encoder import SetEncoder

# The largest value of each size argument of LocusNetwork: far beyond any useful
# network, and small enough that a description's modules are quick to build, so
# a model file cannot make loading build millions of them.
SIZE_LIMITS = {
    "query_dim": 1 << 16,
    "embedding_dim": 1 << 14,
    "n_latents": 1 << 14,
    "n_layers": 64,
    "n_heads": 256,
    "predictor_hidden": 1 << 14,
    "prior_tokens": 1 << 14,
}


class LocusNetwork(nn.Module):
    """Embed each model from its encoder subset, predict its decoder batch.

    Parameters
    ----------
    query_dim : int
        Width of the query encodings.
    embedding_dim : int, default=128
        Width of tokens, latents and embeddings.
    n_latents : int, default=64
        Learned latents per bottleneck layer.
    n_layers : int, default=2
        Bottleneck layers.
    n_heads : int, default=4
        Attention heads.
    predictor_hidden : int, default=64
        Hidden width of the predictor.
    dropout : float, default=0.1
        Dropout during training.
    prior_tokens : int, default=0
        Learned tokens added to every set by the encoder (see
        :class:`~sklocus.nn.set_encoder.SetEncoder`).

    Attributes
    ----------
    query_noise : float
        Standard deviation of the Gaussian noise added to query encodings during
        training (set by the training loop; 0 disables it).
    """

    def __init__(
        self,
        query_dim: int,
        embedding_dim: int = 128,
        n_latents: int = 64,
        n_layers: int = 2,
        n_heads: int = 4,
        predictor_hidden: int = 64,
        dropout: float = 0.1,
        prior_tokens: int = 0,
    ):
        super().__init__()
        self.encoder = SetEncoder(
            query_dim,
            embedding_dim,
            n_latents,
            n_layers,
            n_heads,
            dropout,
            prior_tokens,
        )
        self.predictor = CorrectnessPredictor(
            query_dim, embedding_dim, predictor_hidden, dropout
        )
        self.query_noise = 0.0

    def _noisy(self, query_vectors):
        if self.training and self.query_noise > 0:
            return query_vectors + self.query_noise * torch.randn_like(query_vectors)
        return query_vectors

    def forward(
        self, query_table, encoder_codes, encoder_scores, encoder_mask, decoder_codes
    ):
        """Predict the decoder batch of each model from its encoder subset.

        Parameters
        ----------
        query_table : Tensor of shape (n_queries, query_dim) or (batch, k, query_dim)
            Encodings of the distinct queries of the batch; the 3-d form (how the
            training collator sends it, as skorch wants one row per model) is
            flattened to ``(batch * k, query_dim)``. In training, noise is drawn
            once per distinct query for the encoder and once for the predictor,
            each shared by the models of the batch.
        encoder_codes : LongTensor of shape (batch, n_encoder)
            Row of ``query_table`` of each input evaluation.
        encoder_scores : Tensor of shape (batch, n_encoder)
        encoder_mask : BoolTensor of shape (batch, n_encoder)
            ``True`` for real evaluations.
        decoder_codes : LongTensor of shape (batch, n_decoder)
            Row of ``query_table`` of each target.

        Returns
        -------
        Tensor of shape (batch, n_decoder)
            Logits of correctness.
        """
        query_table = query_table.flatten(0, -2)
        embeddings = self.encoder(
            self._noisy(query_table), encoder_codes, encoder_scores, encoder_mask
        )
        return self.predictor(embeddings, self._noisy(query_table), decoder_codes)
