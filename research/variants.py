"""Variants of LOCUS's network and loss that are not part of sklocus.

Each is passed to ``LocusEmbedder`` through its ``module`` and ``criterion``
parameters, the supported seam for such experiments; ``research/pools.py
--variant NAME`` fits one. What each did is in docs/research/tuning.md.
"""

from __future__ import annotations

import torch
from torch import nn

from sklocus.nn import LocusNetwork
from sklocus.nn.set_encoder import SetEncoder
from sklocus.nn.training import MaskedBCEWithLogitsLoss


class CountingSetEncoder(SetEncoder):
    """Adds a learned function of log(1 + set size) to the pooled vector.

    Attention only averages, so the paper's encoder cannot tell a set of 16
    evaluations from one of 512 with the same rates; this tells it.
    """

    def __init__(self, query_dim, embedding_dim, *args, **kwargs):
        super().__init__(query_dim, embedding_dim, *args, **kwargs)
        self.count = nn.Linear(1, embedding_dim)
        nn.init.zeros_(self.count.weight)
        nn.init.zeros_(self.count.bias)

    def embed_projected(self, projected, codes, scores, mask=None):
        tokens = self.tokenizer(projected, codes, scores)
        sizes = torch.full((len(tokens),), tokens.shape[1], device=tokens.device)
        if mask is not None:
            sizes = mask.sum(dim=1)
        tokens, mask = self._with_prior(tokens, mask)
        for layer in self.layers:
            tokens = layer(tokens, mask)
        count = torch.log1p(sizes.to(tokens.dtype))[:, None]
        return self.output(self.pooling(tokens, mask) + self.count(count))


class CountingNetwork(LocusNetwork):
    """``LocusNetwork`` with :class:`CountingSetEncoder`."""

    def __init__(
        self,
        query_dim,
        embedding_dim=128,
        n_latents=64,
        n_layers=2,
        n_heads=4,
        predictor_hidden=64,
        dropout=0.1,
        prior_tokens=0,
    ):
        super().__init__(
            query_dim,
            embedding_dim,
            n_latents,
            n_layers,
            n_heads,
            predictor_hidden,
            dropout,
            prior_tokens,
        )
        self.encoder = CountingSetEncoder(
            query_dim,
            embedding_dim,
            n_latents,
            n_layers,
            n_heads,
            dropout,
            prior_tokens,
        )


class CleanEncoderNetwork(LocusNetwork):
    """Training noise on the predictor's query encodings only, not the encoder's."""

    def forward(
        self, query_table, encoder_codes, encoder_scores, encoder_mask, decoder_codes
    ):
        query_table = query_table.flatten(0, -2)
        embeddings = self.encoder(
            query_table, encoder_codes, encoder_scores, encoder_mask
        )
        return self.predictor(embeddings, self._noisy(query_table), decoder_codes)


class RankingNetwork(LocusNetwork):
    """``LocusNetwork`` whose training output also carries the decoder codes."""

    def forward(self, decoder_codes, **inputs):
        return super().forward(decoder_codes=decoder_codes, **inputs), decoder_codes


class RankingLoss(nn.Module):
    """Binary cross-entropy plus a ranking term on shared decoder queries.

    On each decoder query that several models of a batch have as a target, a
    model that answered it right should score above one that answered it
    wrong: a logistic loss on the difference of their logits, mean over such
    pairs, weighted by ``weight``. Validation (no gradient) keeps the plain
    cross-entropy, so early stopping compares like with like.
    """

    def __init__(self, weight=1.0):
        super().__init__()
        self.weight = weight
        self.plain = MaskedBCEWithLogitsLoss()

    def forward(self, output, targets):
        logits, codes = output
        base = self.plain(logits, targets)
        if not torch.is_grad_enabled():
            return base
        real = ~torch.isnan(targets)
        rows = torch.arange(len(logits), device=logits.device)[:, None]
        rows, codes = rows.expand_as(targets)[real], codes[real]
        width = int(codes.max()) + 1
        grid = logits.new_zeros(len(logits), width)
        answers = logits.new_full((len(logits), width), float("nan"))
        grid = grid.index_put((rows, codes), logits[real])
        answers = answers.index_put((rows, codes), targets[real])
        right, wrong = answers == 1, answers == 0
        shared = right.any(0) & wrong.any(0)
        if not shared.any():
            return base
        grid, right, wrong = grid[:, shared], right[:, shared], wrong[:, shared]
        pairs = right[:, None] & wrong[None, :]
        margin = (grid[:, None] - grid[None, :])[pairs]
        return base + self.weight * nn.functional.softplus(-margin).mean()


VARIANTS = {
    "count": {"module": CountingNetwork},
    "clean": {"module": CleanEncoderNetwork},
    "ranking": {"module": RankingNetwork, "criterion": RankingLoss},
}
