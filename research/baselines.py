"""Baselines that predict P(correct) for the research scripts (not part of sklocus).

Every baseline turns each target model's ``n`` observed evaluations into a
prediction for every test query. Observations come as a matrix of shape
``(n_train_queries, n_models)`` holding 0, 1 or NaN (not observed), and
predictions are ``(n_test_queries, n_models)``: a row per query and a column per
model, as :mod:`sklocus.metrics` takes them.

- ``overall_accuracy``: the model's mean score, for every query.
- ``per_subject_accuracy``: its mean score on the query's subject (benchmark
  labels, which LOCUS never sees), falling back to the overall mean.
- ``nearest_queries``: its mean score on the ``k`` observed queries whose
  encodings are closest to the test query.
- ``EncodedFactorModel``: logistic models whose item parameters are linear in the
  query encoding, so that they extend to unseen queries: ``kind="mf"`` is
  EmbedLLM-style logistic matrix factorisation (a ``dim``-d model vector dotted
  with a projected query encoding, plus a difficulty); ``kind="irt"`` is a
  two-parameter IRT model (one ability per model, discrimination and difficulty
  from the encoding). Item parameters are fitted jointly with the training models'
  factors; a new model's factors are then fitted on its ``n`` evaluations with the
  item parameters fixed (MAP under the standard normal prior used in training).
  ``tuned_factor_model`` picks their L2 penalty on the item weights by held-out
  training queries: with 768-d encodings and 806 training queries, the penalty
  first used (1e-4) let the item parameters fit the training queries' noise, and
  the IRT model predicted new queries worse than each model's overall accuracy.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

# How the benchmarks' tables name LOCUS and these baselines.
LOCUS = "LOCUS"
LABEL_FREE = (
    "overall accuracy",
    "k-nearest queries (k=10)",
    "MF (dim 16)",
    "IRT (2PL)",
)
LABELS = "per-subject accuracy (labels)"


def overall_accuracy(observed, n_test):
    """Each model's mean observed score, repeated for every test query."""
    return np.repeat(np.nanmean(observed, axis=0)[None, :], n_test, axis=0)


def per_subject_accuracy(observed, train_subjects, test_subjects):
    """Each model's mean score on the test query's subject (overall if unseen)."""
    overall = np.nanmean(observed, axis=0)
    out = np.repeat(overall[None, :], len(test_subjects), axis=0)
    seen = ~np.isnan(observed)
    for subject in np.unique(test_subjects):
        rows = train_subjects == subject
        counts = seen[rows].sum(axis=0)
        sums = np.nansum(observed[rows], axis=0)
        rate = np.where(counts > 0, sums / np.maximum(counts, 1), overall)
        out[test_subjects == subject] = rate[None, :]
    return out


def nearest_queries(observed, train_vectors, test_vectors, k=10):
    """Each model's mean score on its ``k`` observed queries nearest each test query."""
    similarity = torch.as_tensor(test_vectors @ train_vectors.T)  # (test, train)
    out = np.empty((len(test_vectors), observed.shape[1]))
    for i, column in enumerate(observed.T):
        seen = np.flatnonzero(~np.isnan(column))
        nearest = torch.topk(similarity[:, seen], min(k, len(seen)), dim=1).indices
        out[:, i] = column[seen][nearest.numpy()].mean(axis=1)
    return out


class EncodedFactorModel:
    """Logistic factor model with item parameters from query encodings.

    Parameters
    ----------
    kind : {"mf", "irt"}
        ``"mf"``: ``logit = theta_m . (A phi_q + a) - (w . phi_q + c)``;
        ``"irt"``: ``logit = softplus(v . phi_q + s) * (theta_m - (w . phi_q + c))``
        with a scalar ``theta_m``.
    dim : int, default=16
        Width of the model factors (``"mf"`` only).
    steps : int, default=400
        Full-batch Adam steps of each fit.
    item_decay : float, default=1e-4
        L2 penalty on the item-parameter weights (per observation).
    seed : int, default=0

    Attributes
    ----------
    weights_ : dict of str to Tensor
        Item-parameter weights.
    factors_ : Tensor of shape (n_models, dim)
        Factors of the training models.

    Observations and predictions are ``(n_queries, n_models)``; inside, the
    logits are ``(n_models, n_queries)``, a row per model as its factors are.
    """

    def __init__(self, kind, dim=16, steps=400, item_decay=1e-4, seed=0):
        if kind not in ("mf", "irt"):
            raise ValueError(f"kind={kind!r}; expected 'mf' or 'irt'")
        self.kind = kind
        self.dim = dim if kind == "mf" else 1
        self.steps = steps
        self.item_decay = item_decay
        self.seed = seed

    def _items(self, vectors):
        vectors = torch.as_tensor(vectors, dtype=torch.float32)
        loadings = vectors @ self.weights_["loading"] + self.weights_["loading_bias"]
        difficulty = vectors @ self.weights_["difficulty"] + self.weights_["offset"]
        if self.kind == "irt":
            loadings = F.softplus(loadings)
        return loadings, difficulty

    def _logits(self, factors, vectors):
        loadings, difficulty = self._items(vectors)
        if self.kind == "irt":
            return loadings[:, 0][None, :] * (factors - difficulty[None, :])
        return factors @ loadings.T - difficulty[None, :]

    def _fit_factors(self, observed, vectors, parameters):
        """Minimise the masked logistic loss plus the N(0, I) prior on factors."""
        observed = np.ascontiguousarray(observed.T)  # a row per model, as the logits
        target = torch.as_tensor(np.nan_to_num(observed), dtype=torch.float32)
        seen = torch.as_tensor(~np.isnan(observed), dtype=torch.float32)
        n_seen = seen.sum().clamp(min=1)
        generator = torch.Generator().manual_seed(self.seed)
        factors = torch.nn.Parameter(
            0.1 * torch.randn(len(observed), self.dim, generator=generator)
        )
        optimizer = torch.optim.Adam([factors, *parameters], lr=0.05)
        for _ in range(self.steps):
            optimizer.zero_grad()
            logits = self._logits(factors, vectors)
            loss = F.binary_cross_entropy_with_logits(
                logits, target, weight=seen, reduction="sum"
            )
            loss = loss + 0.5 * factors.pow(2).sum()
            if parameters:
                decay = sum(
                    value.pow(2).sum()
                    for name, value in self.weights_.items()
                    if name in ("loading", "difficulty")
                )
                loss = loss + self.item_decay * n_seen * decay
            (loss / n_seen).backward()
            optimizer.step()
        return factors.detach()

    def fit(self, observed, vectors):
        """Fit item parameters and training factors on ``observed`` (NaN: missing)."""
        width = vectors.shape[1]
        generator = torch.Generator().manual_seed(self.seed)
        self.weights_ = {
            "loading": torch.nn.Parameter(
                torch.randn(width, self.dim, generator=generator) * width**-0.5
            ),
            "loading_bias": torch.nn.Parameter(torch.zeros(self.dim)),
            "difficulty": torch.nn.Parameter(torch.zeros(width)),
            "offset": torch.nn.Parameter(torch.zeros(())),
        }
        self.factors_ = self._fit_factors(
            observed, vectors, list(self.weights_.values())
        )
        for value in self.weights_.values():
            value.requires_grad_(False)
        return self

    def predict(self, observed, train_vectors, test_vectors):
        """Fit each new model's factors on its observations; P(correct) on tests."""
        factors = self._fit_factors(observed, train_vectors, [])
        with torch.no_grad():
            return torch.sigmoid(self._logits(factors, test_vectors)).numpy().T


ITEM_DECAYS = (1e-3, 3e-3, 1e-2, 3e-2, 1e-1)


def tuned_factor_model(kind, observed, vectors, seed, decays=ITEM_DECAYS, held=0.2):
    """An ``EncodedFactorModel`` whose ``item_decay`` is chosen on held-out queries.

    A fraction ``held`` of the training queries (rows of ``observed``) is kept
    out; for each penalty, the model is fitted on the rest and scored by the mean
    log loss of the training models on the held-out queries (new queries, as test
    queries are). The best penalty is then refitted on every training query.
    Test queries are never seen.

    Returns
    -------
    model : EncodedFactorModel
    losses : dict of float to float
        Held-out log loss of each penalty tried.
    """
    rng = np.random.default_rng((seed, 7))
    held_out = np.zeros(len(observed), dtype=bool)
    held_out[rng.choice(len(held_out), int(round(held * len(held_out))), False)] = True
    target = observed[held_out].T  # (n_models, n_held), as the logits
    seen = ~np.isnan(target)
    losses = {}
    for decay in decays:
        model = EncodedFactorModel(kind, item_decay=decay, seed=seed).fit(
            observed[~held_out], vectors[~held_out]
        )
        with torch.no_grad():
            logits = model._logits(model.factors_, vectors[held_out]).numpy()
        losses[decay] = float(
            np.mean(np.logaddexp(0, logits[seen]) - target[seen] * logits[seen])
        )
    best = min(losses, key=losses.get)
    model = EncodedFactorModel(kind, item_decay=best, seed=seed)
    return model.fit(observed, vectors), losses
