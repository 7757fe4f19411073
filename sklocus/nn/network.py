"""The full LOCUS network that skorch trains: set encoder plus predictor."""

from __future__ import annotations

import torch
from torch import nn

from sklocus.nn.predictor import CorrectnessPredictor
from sklocus.nn.set_encoder import SetEncoder


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
    ):
        super().__init__()
        self.encoder = SetEncoder(
            query_dim, embedding_dim, n_latents, n_layers, n_heads, dropout
        )
        self.predictor = CorrectnessPredictor(
            query_dim, embedding_dim, predictor_hidden, dropout
        )
        self.query_noise = 0.0

    def _noisy(self, query_vectors):
        if self.training and self.query_noise > 0:
            return query_vectors + self.query_noise * torch.randn_like(query_vectors)
        return query_vectors

    def forward(self, encoder_vectors, encoder_scores, encoder_mask, decoder_vectors):
        """Predict the decoder batch of each model from its encoder subset.

        Parameters
        ----------
        encoder_vectors : Tensor of shape (batch, n_encoder, query_dim)
        encoder_scores : Tensor of shape (batch, n_encoder)
        encoder_mask : BoolTensor of shape (batch, n_encoder)
            ``True`` for real evaluations.
        decoder_vectors : Tensor of shape (batch, n_decoder, query_dim)

        Returns
        -------
        Tensor of shape (batch, n_decoder)
            Logits of correctness.
        """
        embeddings = self.encoder(
            self._noisy(encoder_vectors), encoder_scores, encoder_mask
        )
        return self.predictor(embeddings, self._noisy(decoder_vectors))
