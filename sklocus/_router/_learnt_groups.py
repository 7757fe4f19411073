"""The learnt groups stage: each query's group told from its encoding.

Group offsets (:mod:`._group_offsets`) correct each model per query group, for
queries whose group is known. A router learns to tell a query's group from its
encoding, so that routing needs no labels:

- given ``query_groups`` at ``fit``, a multinomial logistic regression on the
  encodings of the pool's labelled queries; at routing time each group's offset
  counts by its predicted probability (soft groups);
- without them, k-means clusters of the pool's query encodings, a query in the
  cluster of its nearest centre, the number of clusters (or none) chosen on
  held-out evaluations of the pool (:func:`choose_groups`).

Both are linear scores of the encoding, kept as the router's ``group_weights_``
and ``group_biases_``: a centre ``c`` scores ``x @ c - |c|^2 / 2``, highest for
the nearest centre.
"""

from __future__ import annotations

import numpy as np

from sklocus._groups import fit_group_offsets, logits
from sklocus._router._halves import in_both_halves

# The numbers of clusters ``query_clusters="auto"`` tries, beside none; a
# number is tried only where the pool has this many queries per cluster.
CLUSTER_GRID = (2, 4, 8, 16, 32)
QUERIES_PER_CLUSTER = 16
# k-means restarts, and its seed: clusters do not depend on ``random_state``,
# so that a router's fit is reproducible however it is seeded.
_RESTARTS = 4
_SEED = 0
# Inverse L2 penalty of the group classifier, on unit-norm encodings.
_CLASSIFIER_C = 10.0
# The score of a group no labelled query holds (model files hold finite numbers).
_NEVER = -1e30


class LearntGroups:
    """Linear scores of the encodings, one per group, and how they weigh groups.

    Parameters
    ----------
    weights : ndarray of shape (n_groups, query_dim)
    biases : ndarray of shape (n_groups,)
    soft : bool
        Each group counts by its softmax probability (groups from labels), or
        the best-scoring group alone (clusters).
    """

    def __init__(self, weights, biases, soft):
        self.weights = weights
        self.biases = biases
        self.soft = soft

    @classmethod
    def from_labels(cls, vectors, codes, n_groups):
        """Fit the classifier of groups ``codes`` (-1: none) on encoded queries."""
        from sklearn.linear_model import LogisticRegression

        labelled = codes >= 0
        weights = np.zeros((n_groups, vectors.shape[1]), dtype=np.float32)
        biases = np.zeros(n_groups, dtype=np.float32)
        present = np.unique(codes[labelled])
        if len(present) > 1:
            classifier = LogisticRegression(C=_CLASSIFIER_C, max_iter=1000)
            classifier.fit(vectors[labelled], codes[labelled])
            coef, intercept = classifier.coef_, classifier.intercept_
            if len(present) == 2:  # a binary fit scores the second class only
                coef = np.vstack([-coef / 2, coef / 2])
                intercept = np.array([-intercept[0] / 2, intercept[0] / 2])
            weights[present], biases[present] = coef, intercept
            # A group no labelled query holds is never predicted.
            biases[np.setdiff1d(np.arange(n_groups), present)] = _NEVER
        elif len(present) == 1:
            biases[:] = _NEVER
            biases[present] = 0.0
        return cls(weights, biases, soft=True)

    @classmethod
    def from_clusters(cls, vectors, n_clusters):
        """k-means of the encodings; return the stage and each query's cluster."""
        from sklearn.cluster import KMeans

        kmeans = KMeans(n_clusters, n_init=_RESTARTS, random_state=_SEED)
        kmeans.fit(vectors)
        centres = kmeans.cluster_centers_.astype(np.float32)
        biases = -0.5 * (centres.astype(np.float64) ** 2).sum(axis=1)
        stage = cls(centres, biases.astype(np.float32), soft=False)
        return stage, stage.codes(vectors)

    def scores(self, vectors):
        return np.asarray(vectors, dtype=np.float64) @ self.weights.T + self.biases

    def codes(self, vectors):
        """Each encoded query's likeliest group (nearest cluster)."""
        return self.scores(vectors).argmax(axis=1)

    def memberships(self, vectors):
        """``(n_queries, n_groups)``: how much each group's offset counts."""
        scores = self.scores(vectors)
        if not self.soft:
            out = np.zeros_like(scores)
            out[np.arange(len(scores)), scores.argmax(axis=1)] = 1.0
            return out
        scores -= scores.max(axis=1, keepdims=True)
        out = np.exp(scores)
        return out / out.sum(axis=1, keepdims=True)


def shifted(probabilities, memberships, offsets):
    """Probabilities with each model's membership-weighted group offsets added."""
    moved = logits(probabilities) + memberships @ offsets.T
    return (1.0 / (1.0 + np.exp(-moved))).astype(np.float32)


def held_out_loss(half_logits, scores, half, codes, shrinkage):
    """Log loss of group offsets fitted on one half of each model's evaluations.

    ``half_logits[h]`` are LOCUS's logits from each model's embedding of half
    ``h``; offsets for the groups ``codes`` (None: no groups) are fitted on
    half ``h`` and scored on the other half, both ways, for the models with
    evaluations in both.
    """
    total, count = 0.0, 0
    both = in_both_halves(half)
    for h in (0, 1):
        base = half_logits[h]
        scored = (half == 1 - h) & both
        if codes is not None:
            fitted = np.where(half == h, scores, np.nan)
            groups, offsets = fit_group_offsets(base, fitted, codes, shrinkage)
            column = np.empty(len(groups), dtype=np.int64)
            column[groups.astype(np.int64)] = np.arange(len(groups))
            base = base + offsets[:, column[codes.astype(np.int64)]].T
        rows, models = np.nonzero(scored)
        z, y = base[rows, models], scores[rows, models]
        # Binary cross-entropy on the logit scale, stable for large |z|.
        total += float((np.logaddexp(0.0, z) - y * z).sum())
        count += len(rows)
    return total / max(count, 1)


def choose_groups(vectors, half_logits, scores, half, shrinkage, n_clusters):
    """Choose the pool's clusters on held-out evaluations.

    ``n_clusters`` is the router's ``query_clusters``: ``"auto"`` tries every
    number of :data:`CLUSTER_GRID` the pool's queries allow, and none; a number
    is taken as it is. Returns ``(stage, codes, losses)``: the clusters' stage
    and each query's cluster (both None when none won) and each candidate's
    held-out loss (``"none"``, ``"2 clusters"``...).
    """
    losses = {"none": held_out_loss(half_logits, scores, half, None, shrinkage)}
    if n_clusters == "auto":
        grid = [k for k in CLUSTER_GRID if k * QUERIES_PER_CLUSTER <= len(vectors)]
    else:
        grid = [min(n_clusters, len(vectors))]
    best = ("none", None, None)
    for k in grid:
        stage, codes = LearntGroups.from_clusters(vectors, k)
        name = f"{k} clusters"
        losses[name] = held_out_loss(
            half_logits, scores, half, codes.astype(object), shrinkage
        )
        if n_clusters != "auto" or losses[name] < losses[best[0]]:
            best = (name, stage, codes)
    return best[1], best[2], losses
