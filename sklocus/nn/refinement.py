"""Test-time refinement: move an embedding to explain its own evaluations better.

The set encoder's forward pass places a model from what it learnt on its training
queries. On queries unlike those (a new benchmark), the predictor reads that
embedding with query terms that do not carry over, and the model's own evaluations,
which the encoder has just read, are predicted worse than the model's plain accuracy
would predict them. Refinement takes the forward-pass embedding ``z0`` of each model
and minimises, under the frozen predictor,

    sum_i BCE(G(z, phi(x_i)), y_i) + penalty / 2 * ||z - z0||^2

over the model's own evaluations ``(x_i, y_i)``: a MAP estimate under a Gaussian
prior centred on the forward pass. The data term grows with the number of
evaluations and the prior does not, so a few evaluations barely move ``z`` and many
move it as far as they justify.

The minimisation is a fixed number of steps of ``torch.optim.Adam`` from ``z0``,
with an optimiser made for the call and dropped after it. Adam's update is
elementwise and each model's loss depends on its own embedding only, so a model's
result does not depend on the other models of its batch (up to float rounding), and
the same evaluations always give the same vector: nothing is drawn at random and no
per-model state outlives the call.
"""

from __future__ import annotations

import torch
from torch import nn

# Adam's moment decay rates and its guard against division by zero.
_BETAS = (0.9, 0.999)
_EPS = 1e-8


def refine_embeddings(
    predictor, embeddings, projected, codes, scores, mask, *, steps, penalty, step_size
):
    """Refine embeddings on their own evaluations under a frozen predictor.

    Parameters
    ----------
    predictor : CorrectnessPredictor
        Read, never changed.
    embeddings : Tensor of shape (batch, embedding_dim)
        Forward-pass embeddings ``z0``.
    projected : Tensor of shape (n_queries, embedding_dim)
        ``predictor.project_query`` of the query table.
    codes : LongTensor of shape (batch, n_evals)
        Row of ``projected`` of each evaluation.
    scores : Tensor of shape (batch, n_evals)
    mask : BoolTensor of shape (batch, n_evals) or None
        ``True`` for real evaluations; ``None`` when there is no padding.
    steps : int
        Adam steps.
    penalty : float
        Weight of the squared distance to ``z0``, against the summed log loss.
    step_size : float
        Adam's step size.

    Returns
    -------
    Tensor of shape (batch, embedding_dim)
        Refined embeddings (no autograd history).
    """
    start = embeddings.detach().float()
    projected = projected.detach().float()
    weight = torch.ones_like(scores, dtype=torch.float32)
    if mask is not None:
        weight = mask.to(torch.float32)
    targets = scores.float()
    z = start.clone().requires_grad_(True)
    # On a GPU, Adam's update as one fused kernel rather than one per operation.
    optimizer = torch.optim.Adam(
        [z], lr=step_size, betas=_BETAS, eps=_EPS, fused=z.is_cuda or None
    )
    for _ in range(steps):
        with torch.enable_grad():
            logits = predictor.score_projected(z, projected, codes)
            loss = nn.functional.binary_cross_entropy_with_logits(
                logits, targets, weight=weight, reduction="sum"
            )
            loss = loss + 0.5 * penalty * (z - start).pow(2).sum()
            # autograd.grad, not backward: the gradient reaches z alone, and no
            # .grad accumulates on the predictor's parameters.
            (z.grad,) = torch.autograd.grad(loss, z)
        optimizer.step()
    return z.detach()
