"""How uncertain a model's embedding is, and so each prediction made from it.

A router's embedding of a model is the MAP estimate of test-time refinement
(:mod:`sklocus.nn.refinement`): it minimises the log loss of the model's own
evaluations plus ``penalty / 2 * ||z - z0||^2``. Its Laplace approximation is a
Gaussian around that estimate whose precision is the loss's curvature there, in
the Gauss-Newton form that logistic regression has:

    Lambda = penalty * I + sum_i p_i (1 - p_i) J_i J_i^T,

with ``J_i`` the gradient of evaluation ``i``'s logit with respect to ``z`` and
``p_i`` its predicted probability. A prediction's logit on a new query ``x`` then
has, to first order, the variance ``J(x)^T Lambda^-1 J(x)``: small where the
model's evaluations pin the embedding down along the directions the query reads,
large where they say nothing. A model with few evaluations is uncertain almost
everywhere, one with many only on queries unlike them.

The logit's gradient has a closed form. The predictor reads
``h = W_z z + W_u u + W_zu (z * u) + b`` and returns ``w . gelu(h) + c``, so

    d logit / d z = W_z^T g + u * (W_zu^T g),   g = w * gelu'(h).
"""

from __future__ import annotations

import math

import torch

# Queries whose gradients are formed at once, per model: bounds the
# (n_models, chunk, hidden) intermediates.
_CHUNK = 256


def _gelu_slope(h):
    """Differentiate the exact GELU, ``Phi(h) + h * phi(h)``."""
    density = torch.exp(-0.5 * h * h) / math.sqrt(2.0 * math.pi)
    return 0.5 * (1.0 + torch.erf(h / math.sqrt(2.0))) + h * density


def _parts(predictor):
    last = predictor.mlp[-1]
    return *predictor.first_layer_blocks(), last.weight[0], last.bias[0]


def logits_and_gradients(predictor, embeddings, projected):
    """Each model's logit on each query, and its gradient with respect to ``z``.

    Parameters
    ----------
    predictor : CorrectnessPredictor
    embeddings : Tensor of shape (n_models, embedding_dim)
        In the network's own units.
    projected : Tensor of shape (n_queries, embedding_dim)
        ``predictor.project_query`` of the queries.

    Returns
    -------
    logits : Tensor of shape (n_models, n_queries)
    gradients : Tensor of shape (n_models, n_queries, embedding_dim)
    """
    weight_z, weight_u, weight_zu, bias, weight, last_bias = _parts(predictor)
    z = embeddings[:, None, :]
    u = projected[None, :, :]
    hidden = (
        (embeddings @ weight_z.T + bias)[:, None, :]
        + (projected @ weight_u.T)[None]
        + (z * u) @ weight_zu.T
    )
    logits = torch.nn.functional.gelu(hidden) @ weight + last_bias
    slope = weight * _gelu_slope(hidden)
    gradients = slope @ weight_z + u * (slope @ weight_zu)
    return logits, gradients


@torch.no_grad()
def posterior_factors(predictor, embeddings, projected, codes, penalty):
    """Factors ``C`` of each embedding's Laplace covariance, ``C^T C``.

    Parameters
    ----------
    predictor : CorrectnessPredictor
    embeddings : Tensor of shape (n_models, embedding_dim)
        The refined embeddings, in the network's own units.
    projected : Tensor of shape (n_queries, embedding_dim)
        ``predictor.project_query`` of the query table.
    codes : sequence of LongTensor of shape (n_i,)
        Rows of ``projected`` that each model was evaluated on.
    penalty : float
        The refinement's prior precision.

    Returns
    -------
    Tensor of shape (n_models, embedding_dim, embedding_dim)
        Lower-triangular ``C = L^-1``, where ``L L^T`` is the precision; the
        variance of a logit whose gradient is ``J`` is ``||C J||^2``.
    """
    n_models, dim = embeddings.shape
    eye = torch.eye(dim, dtype=torch.float64, device=embeddings.device)
    precision = penalty * eye.expand(n_models, dim, dim).clone()
    for m in range(n_models):
        rows = codes[m]
        for start in range(0, len(rows), _CHUNK):
            chunk = projected[rows[start : start + _CHUNK]]
            logit, gradient = logits_and_gradients(
                predictor, embeddings[m : m + 1], chunk
            )
            p = torch.sigmoid(logit[0]).double()
            gradient = gradient[0].double()
            precision[m] += (gradient * (p * (1 - p))[:, None]).T @ gradient
    lower = torch.linalg.cholesky(precision)
    return torch.linalg.solve_triangular(lower, eye.expand_as(lower), upper=False)


@torch.no_grad()
def logit_stds(predictor, embeddings, factors, projected):
    """Return the standard deviation of each model's logit on each query.

    Shape ``(n_queries, n_models)``.

    ``factors`` are :func:`posterior_factors`' for ``embeddings``.
    """
    out = []
    factors = factors.to(embeddings.dtype)
    for start in range(0, len(projected), _CHUNK):
        _, gradients = logits_and_gradients(
            predictor, embeddings, projected[start : start + _CHUNK]
        )
        spread = torch.einsum("mij,mqj->mqi", factors, gradients)
        out.append(spread.norm(dim=2).T)
    return torch.cat(out) if out else projected.new_empty((0, len(embeddings)))
