"""The query heads stage: each model's own logistic regression, blended with LOCUS.

LOCUS predicts every model's success through one predictor shared by all models,
which reads a model only through its embedding. A router knows more: each pool
model's evaluations. Where a model has many, a logistic regression on the query
encodings fitted on them alone sees how *this* model's success varies with the
query, which the shared predictor smooths over (on the 9 LLMRouter models, each
with 5,608 evaluations, such a regression routed better than LOCUS alone:
docs/research/budget.md). The router fits one head per model and predicts

    logit = (1 - w_m) * LOCUS logit + w_m * head logit,

with, for each model, the head's penalty chosen from :data:`PENALTIES` by its
2-fold held-out log loss, and one blend weight ``w`` for the pool chosen by the
held-out log loss of every head's out-of-fold logits against LOCUS's. A model
with fewer than :data:`MIN_EVALUATIONS` evaluations, or with fewer than 8 on
either side of 0.5, gets no head (``w_m = 0``): LOCUS alone.

On its training queries LOCUS is in-sample: the network trained on those very
evaluations, and the embedding has seen them, so its logits there look better
than they will on new queries, and a blend chosen on them leans to LOCUS (on 10
Open LLM models it came out at 0). The router therefore chooses the blend, where
it can, on the queries the embedder held out of its training for validation
(``validation_queries``), against LOCUS's logits from embeddings of each model's
other evaluations: predictions of LOCUS on queries it has seen nothing of, like
the heads' out-of-fold ones. (Early stopping picked the epoch on those queries,
which flatters LOCUS a little there: the blend still leans, if at all, to LOCUS.)
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.optimize import minimize, minimize_scalar

from sklocus._embedder import _SMALL_POOL
from sklocus._groups import logits
from sklocus._router._locus import locus_given, sorted_order
from sklocus._router._stage import Stage

# Penalties on the head's squared weights, in units of the summed log loss of its
# evaluations (sklearn's LogisticRegression with C = 1 / penalty), largest first:
# each fit starts from the last one's solution.
PENALTIES = (1000.0, 100.0, 10.0, 1.0)
# Fewest evaluations, and fewest on each side of 0.5, of a model with a head.
MIN_EVALUATIONS = 64
_MIN_PER_CLASS = 8
# L-BFGS stops when a step improves the penalised log loss by less than this
# fraction of it: far below what moves a prediction.
_TOLERANCE = 1e-6


def _log_loss(z, y):
    """Return the summed log loss of logits ``z`` against scores ``y`` in [0, 1]."""
    return float(np.sum(np.logaddexp(0.0, z) - y * z))


def _fit_head(x, y, penalty, start=None):
    """Weights and bias (last) of one L2-penalised logistic regression."""
    n_features = x.shape[1]

    def loss_and_gradient(theta):
        weights = theta[:n_features]
        # The products in float32 (x is), the sums in float64.
        z = (x @ weights.astype(np.float32)).astype(np.float64) + theta[n_features]
        residual = 1.0 / (1.0 + np.exp(-z)) - y
        gradient = np.empty_like(theta)
        gradient[:n_features] = x.T @ residual.astype(np.float32) + penalty * weights
        gradient[n_features] = residual.sum()
        return _log_loss(z, y) + 0.5 * penalty * (weights @ weights), gradient

    if start is None:
        start = np.zeros(n_features + 1)
    return minimize(
        loss_and_gradient,
        start,
        jac=True,
        method="L-BFGS-B",
        options={"maxiter": 500, "ftol": _TOLERANCE},
    ).x


def _has_head(y):
    right = int(np.sum(y >= 0.5))
    return len(y) >= MIN_EVALUATIONS and min(right, len(y) - right) >= _MIN_PER_CLASS


def _folds(n, seed):
    """Two folds of ``n`` rows, drawn by ``seed``."""
    return np.random.default_rng(seed).permutation(n) % 2


def _out_of_fold(x, y, fold):
    """Each penalty's out-of-fold logits, shape ``(len(PENALTIES), n)``."""
    found = np.empty((len(PENALTIES), len(y)))
    for k in (0, 1):
        train, test = fold != k, fold == k
        theta = None
        for i, penalty in enumerate(PENALTIES):
            theta = _fit_head(x[train], y[train], penalty, theta)
            found[i, test] = x[test] @ theta[:-1] + theta[-1]
    return found


def fit_heads(vectors, scores, locus_logits, rows_of, blend=None, blend_on=None):
    """Fit one head per model and, unless given, the pool's blend weight.

    Parameters
    ----------
    vectors : ndarray of shape (n_queries, query_dim)
        Encodings of the queries.
    scores : ndarray of shape (n_queries, n_models)
        Observed scores, NaN where unobserved.
    locus_logits : ndarray of shape (n_queries, n_models)
        LOCUS's logits of the models on the queries (read where observed).
    rows_of : callable
        ``rows_of(j)`` gives the rows of model ``j``'s evaluations in an order
        that does not depend on the order of the queries, so that its folds do
        not either.
    blend : float or None
        The pool's blend weight; None chooses it on the out-of-fold logits.
    blend_on : tuple or None
        ``(rows, logits)``: a boolean mask of the queries to choose the blend
        on, and LOCUS's logits ``(n_queries, n_models)`` to choose it against
        there (queries LOCUS never trained on, predicted from embeddings that
        left them out; NaN where a model has no such prediction). None, or fewer
        than :data:`MIN_EVALUATIONS` such pairs among the heads' evaluations,
        chooses it on every evaluation against ``locus_logits``.

    Returns
    -------
    weights : ndarray of shape (n_models, query_dim), float32
    biases : ndarray of shape (n_models,), float32
    blends : ndarray of shape (n_models,), float32
        Each model's ``w_m``: the pool's weight, or 0 for a model with no head.
    held_out : ndarray of shape (n_queries, n_models)
        Each head's out-of-fold logit of each of its model's evaluations (from
        the head fitted on the other fold, at the chosen penalty); NaN where the
        model has no head or no evaluation.
    blend : float
        The pool's blend weight, as given or chosen.
    """
    vectors = np.asarray(vectors, dtype=np.float32)
    n_models = scores.shape[1]
    weights = np.zeros((n_models, vectors.shape[1]), dtype=np.float32)
    biases = np.zeros(n_models, dtype=np.float32)
    with_head = np.zeros(n_models, dtype=bool)
    held = []  # (out-of-fold head logits, LOCUS logits, scores) of each head
    held_apart = []  # the same, on blend_on's rows only
    held_out = np.full(scores.shape, np.nan)
    for j in range(n_models):
        rows = rows_of(j)
        x, y = vectors[rows], scores[rows, j]
        if not _has_head(y):
            continue
        found = _out_of_fold(x, y, _folds(len(rows), len(rows)))
        losses = [_log_loss(z, y) for z in found]
        best = int(np.argmin(losses))
        theta = _fit_head(x, y, PENALTIES[best])
        weights[j], biases[j] = theta[:-1], theta[-1]
        with_head[j] = True
        held.append((found[best], locus_logits[rows, j], y))
        held_out[rows, j] = found[best]
        if blend_on is not None:
            apart = blend_on[0][rows] & np.isfinite(blend_on[1][rows, j])
            held_apart.append(
                (found[best][apart], blend_on[1][rows[apart], j], y[apart])
            )
    if blend is None:
        usable = sum(len(pairs[2]) for pairs in held_apart) >= MIN_EVALUATIONS
        blend = choose_blend(held_apart if usable else held)
    blends = np.where(with_head, blend, 0.0).astype(np.float32)
    return weights, biases, blends, held_out, blend


def choose_blend(held):
    """Return the weight in [0, 1] of the heads that minimises the held-out log loss."""
    if not held:
        return 0.0
    heads, locus, y = (np.concatenate(column) for column in zip(*held))
    found = minimize_scalar(
        lambda w: _log_loss((1.0 - w) * locus + w * heads, y),
        bounds=(0.0, 1.0),
        method="bounded",
    )
    return float(found.x)


def apply_heads(probabilities, vectors, weights, biases, blends):
    """Blend LOCUS's probabilities ``(n_queries, n_models)`` with the heads'."""
    head = np.asarray(vectors, dtype=np.float32) @ weights.T + biases[None, :]
    blended = (1.0 - blends[None, :]) * logits(probabilities) + blends[None, :] * head
    return (1.0 / (1.0 + np.exp(-blended))).astype(np.float32)


def heads_wanted(router, n_models):
    """Whether ``fit`` fits query heads for a pool of ``n_models``.

    Refuses ``query_heads=True`` with an embedder that has no query encoder.
    """
    if router.query_heads == "auto":
        wanted = n_models < _SMALL_POOL
    else:
        wanted = bool(router.query_heads)
    usable = locus_given(router)
    if wanted and not usable and router.query_heads is True:
        raise ValueError(
            "query_heads=True needs a LocusEmbedder, whose query encoder "
            f"encodes the queries; got a {type(router.embedder).__name__}"
        )
    return wanted and usable


def unseen_logits(stages, queries, scores, vectors, model_offsets):
    """LOCUS's logits on the queries its network never trained on, or None.

    Returns ``(unseen, logits)``: which of ``queries`` are the embedder's
    ``validation_queries_``, and each model's logits on them from an embedding
    of its other evaluations (NaN elsewhere, and for a model with no other
    evaluation); None when the embedder has none of them.
    """
    locus = stages.locus
    held_out = set(getattr(locus.inner, "validation_queries_", None) or ())
    unseen = np.array([query in held_out for query in queries], dtype=bool)
    if not unseen.any():
        return None
    observed = ~np.isnan(scores)
    sets = [
        {queries[i]: scores[i, j] for i in np.flatnonzero(observed[:, j] & ~unseen)}
        for j in range(scores.shape[1])
    ]
    embedded = np.array([bool(s) for s in sets])
    if not embedded.any():
        return None
    rows = np.flatnonzero(unseen)
    found = np.full(scores.shape, np.nan)
    offsets = None if model_offsets is None else model_offsets[embedded]
    others = stages.for_models(
        locus.embed([s for s in sets if s], report=False), offsets
    )
    found[np.ix_(rows, np.flatnonzero(embedded))] = others.locus_logits(vectors[rows])
    return unseen, found


@dataclasses.dataclass(frozen=True, eq=False)
class QueryHeads(Stage):
    """Each model's logistic regression on the encodings, blended with LOCUS.

    Parameters
    ----------
    blend : float
        The pool's weight of the heads against LOCUS (``head_blend_``).
    weights, biases, blends : ndarray, float32, or None
        Each model's head and blend (``head_weights_``, ``head_biases_``,
        ``head_blends_``): ``(n_models, query_dim)``, ``(n_models,)``,
        ``(n_models,)``.
    """

    blend: float
    weights: np.ndarray | None = None
    biases: np.ndarray | None = None
    blends: np.ndarray | None = None

    ATTRIBUTES = {
        "head_weights_": "weights",
        "head_biases_": "biases",
        "head_blends_": "blends",
        "head_blend_": "blend",
    }
    ROWS = ("weights", "biases", "blends")

    @classmethod
    def fit(cls, stages, queries, scores):
        """Fit the pool's heads and blend on the stages before (``stages``).

        Returns the stage and each head's out-of-fold logit of each evaluation
        (NaN where none).
        """
        locus, calibration = stages.locus, stages.calibration
        offsets = None if calibration is None else calibration.offsets
        *heads, held_out, blend = _fit(
            stages, locus.embeddings, offsets, queries, scores, None
        )
        return cls(blend, *heads), held_out

    def fit_rows(self, stages, embeddings, model_offsets, queries, scores):
        """Heads of models under the pool's blend (field to rows)."""
        heads = _fit(stages, embeddings, model_offsets, queries, scores, self.blend)
        return dict(zip(self.ROWS, heads[:3]))

    def transform(self, probabilities, vectors):
        """LOCUS's probabilities blended with the models' heads."""
        if self.weights is None:
            return probabilities
        return apply_heads(
            probabilities, vectors, self.weights, self.biases, self.blends
        )


def _fit(stages, embeddings, model_offsets, queries, scores, blend):
    """:func:`fit_heads` on the pool's encodings and logits."""
    vectors = stages.locus.encode(queries)
    locus = stages.for_models(embeddings, model_offsets).locus_logits(vectors)
    order = np.array(sorted_order(queries), dtype=int)
    observed = ~np.isnan(scores)

    def rows_of(j):
        return order[observed[order, j]]

    blend_on = None
    if blend is None:
        blend_on = unseen_logits(stages, queries, scores, vectors, model_offsets)
    return fit_heads(vectors, scores, locus, rows_of, blend, blend_on)
