"""Two-parameter logistic (2PL) IRT per benchmark: the baseline of score estimation.

What tinyBenchmarks and metabench build on, fitted as metabench fits it, one
model per benchmark: model ``m`` answers item ``i`` of benchmark ``d``
correctly with probability ``sigmoid(a_i * theta[m, d] - b_i)``, an ability per
model and benchmark, a discrimination and a difficulty per item.
:func:`fit_2pl` fits the items on training models (joint maximum a posteriori);
:func:`abilities` places new models from their results; :func:`fisher_items`
chooses each model's items adaptively, each the most informative (largest
``a_i^2 p (1 - p)``) at the model's current ability on its benchmark.

Scores may be fractions (truthfulqa's); the likelihood is then their
cross-entropy, as for LOCUS.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.special import expit


def fit_2pl(matrix, dims, *, steps=600, seed=0):
    """Fit item parameters on ``matrix`` (models x items, scores in [0, 1]).

    ``dims`` gives each item's benchmark as an integer code. Joint maximum a
    posteriori: standard normal priors on the abilities and on the logarithms
    of the discriminations, a normal prior of standard deviation 5 on the
    difficulties (items every model, or none, answers would otherwise run off to
    infinity).

    Returns ``(a, b)``, each of shape ``(n_items,)``.
    """
    generator = torch.Generator().manual_seed(seed)
    y = torch.as_tensor(matrix, dtype=torch.float32)
    dims = torch.as_tensor(dims)
    n_models, n_items = y.shape
    theta = torch.zeros(n_models, int(dims.max()) + 1, requires_grad=True)
    log_a = (0.1 * torch.randn(n_items, generator=generator)).requires_grad_()
    b = torch.zeros(n_items, requires_grad=True)
    optimizer = torch.optim.Adam([theta, log_a, b], lr=0.05)
    for _ in range(steps):
        optimizer.zero_grad()
        logits = log_a.exp() * theta[:, dims] - b
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            logits, y, reduction="sum"
        )
        prior = (theta**2).sum() + (log_a**2).sum() + (b**2).sum() / 25
        loss = (loss + 0.5 * prior) / n_models
        loss.backward()
        optimizer.step()
    a = log_a.exp().detach().numpy().astype(np.float64)
    return a, b.detach().numpy().astype(np.float64)


def abilities(a, b, dims, matrix, chosen, theta=None, iterations=20):
    """Each model's maximum a posteriori ability per benchmark from its results.

    ``matrix`` and ``chosen`` are ``(n_models, n_items)``; Newton steps from
    ``theta`` (``(n_models, n_dims)``, zeros when not given).
    """
    n_dims = int(dims.max()) + 1
    theta = np.zeros((len(matrix), n_dims)) if theta is None else theta.copy()
    y = np.where(chosen, matrix, 0.0)
    onehot = np.eye(n_dims)[dims]  # (n_items, n_dims)
    for _ in range(iterations):
        p = expit(theta[:, dims] * a - b)
        gradient = (chosen * a * (y - p)) @ onehot - theta
        curvature = -((chosen * a**2 * p * (1 - p)) @ onehot) - 1
        theta = np.clip(theta - gradient / curvature, -6.0, 6.0)
    return theta


def fisher_items(a, b, dims, matrix, quotas, total):
    """Choose ``total`` items per model adaptively by Fisher information.

    Each step gives every model the untaken item most informative at its
    current abilities, among benchmarks whose quota (``quotas[d]``, absent for
    none) it has not filled, then updates its abilities with the result.
    Returns the boolean mask of chosen items.
    """
    n_models, n_items = matrix.shape
    n_dims = int(dims.max()) + 1
    limit = np.array([quotas.get(d, n_items) for d in range(n_dims)])
    chosen = np.zeros((n_models, n_items), dtype=bool)
    counts = np.zeros((n_models, n_dims), dtype=np.int64)
    theta = np.zeros((n_models, n_dims))
    rows = np.arange(n_models)
    for _ in range(total):
        p = expit(theta[:, dims] * a - b)
        information = a**2 * p * (1 - p)
        information[chosen | (counts >= limit)[:, dims]] = -np.inf
        pick = np.argmax(information, axis=1)
        chosen[rows, pick] = True
        counts[rows, dims[pick]] += 1
        theta = abilities(a, b, dims, matrix, chosen, theta, iterations=3)
    return chosen


def estimated_means(a, b, dims, matrix, chosen):
    """Each model's mean per benchmark: its results, the model's P elsewhere.

    Returns ``(n_models, n_dims)``.
    """
    theta = abilities(a, b, dims, matrix, chosen)
    filled = np.where(chosen, matrix, expit(theta[:, dims] * a - b))
    n_dims = int(dims.max()) + 1
    return np.column_stack([filled[:, dims == d].mean(axis=1) for d in range(n_dims)])
