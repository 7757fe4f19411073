"""Read a benchmark's full score from a few of its items: a Gaussian over references.

The reference models' outcomes on the read-out queries and their full-benchmark
scores (what a leaderboard reports) are treated as one Gaussian vector, whose
mean and covariance are those of the references. A new model's scores on some of
the queries then give its full scores' conditional mean and variance: the best
linear read-out of exactly those queries (a ridge regression of the references'
scores on them, whatever queries they are), with the variance it leaves. The
same covariance says which query would shrink that variance most, so the
choice of queries, fixed (the same anchors for every model) or given what a
model has shown so far, aims at the full score itself.

The functions here are the arithmetic; :class:`~sklocus.ScoreEstimator` holds
the moments and calibrates the intervals.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from sklocus._model_posterior import posterior_weights
from sklocus._validation import shown

# Rows needed to read a column's scores: fewer cannot describe the covariance of a
# column with even a handful of queries.
MIN_SCORED_REFERENCES = 10
# Columns of full scores one fit reads: each is a row and a column of the joint
# covariance with every query (the Open LLM Leaderboard's subtasks number 60).
MAX_SCORE_COLUMNS = 1_000
# Largest magnitude of a full score: a fraction, a percentage or a rating fits
# far within it, and the covariance of such scores cannot overflow.
MAX_SCORE_MAGNITUDE = 1e9


def check_reference_scores(scores, n_sets):
    """Validate the references' full scores: one row per set, one column per group.

    Returns the column labels and a float64 array (NaN where a score is unknown).
    """
    if not isinstance(scores, pd.DataFrame):
        raise TypeError(
            "scores must be a pandas DataFrame with one row per reference set and "
            "one column per group (a benchmark's full score); got "
            f"{type(scores).__name__}"
        )
    if len(scores) != n_sets:
        raise ValueError(
            f"scores has {len(scores)} rows for {n_sets} reference sets; give one "
            "row per set, in the same order"
        )
    if scores.shape[1] == 0:
        raise ValueError("scores has no columns; give one column per group")
    if scores.shape[1] > MAX_SCORE_COLUMNS:
        raise ValueError(
            f"scores has {scores.shape[1]:,} columns; at most {MAX_SCORE_COLUMNS:,} "
            "groups of full scores are read"
        )
    labels = list(scores.columns)
    if len(set(labels)) != len(labels):
        raise ValueError("scores has a column name twice; name each group once")
    columns = []
    for label in labels:
        column = scores[label]
        types = pd.api.types
        if not types.is_numeric_dtype(column) or types.is_bool_dtype(column):
            raise TypeError(
                f"scores column {shown(label)} must hold numbers (NaN where a "
                f"reference has no score); got dtype {column.dtype}"
            )
        values = column.to_numpy(dtype=np.float64, na_value=np.nan)
        absurd = np.flatnonzero(np.abs(values) > MAX_SCORE_MAGNITUDE)
        if len(absurd):
            raise ValueError(
                f"scores column {shown(label)} row {int(absurd[0])} is "
                f"{values[absurd[0]]:g}; scores must be finite numbers of magnitude "
                f"at most {MAX_SCORE_MAGNITUDE:g} (NaN where unknown)"
            )
        columns.append(values)
    values = np.column_stack(columns)
    complete = int((~np.isnan(values).any(axis=1)).sum())
    if complete < MIN_SCORED_REFERENCES:
        raise ValueError(
            f"only {complete} reference sets have a score in every column of scores; "
            f"reading full scores needs at least {MIN_SCORED_REFERENCES}"
        )
    return labels, values


def conditional_scores(mean, covariance, n_queries, seen, values, noise):
    """Condition the targets on some queries' outcomes: their mean and variance.

    Parameters
    ----------
    mean, covariance : ndarray
        Joint moments of ``n_queries`` outcomes followed by the targets.
    n_queries : int
    seen : ndarray of int
        Positions (in the outcomes) of the evaluated queries.
    values : ndarray of float
        Their outcomes.
    noise : float
        Added to each seen outcome's variance: the ridge penalty of the read-out.

    Returns
    -------
    mean, variance : ndarray of shape (n_targets,)
    """
    targets = np.arange(n_queries, len(mean))
    prior_mean, prior_variance = mean[targets], np.diag(covariance)[targets]
    if len(seen) == 0:
        return prior_mean.copy(), prior_variance.copy()
    block = covariance[np.ix_(seen, seen)] + noise * np.eye(len(seen))
    cross = covariance[np.ix_(seen, targets)]
    gain = np.linalg.solve(block, cross)
    estimate = prior_mean + (np.asarray(values, np.float64) - mean[seen]) @ gain
    variance = prior_variance - np.einsum("st,st->t", cross, gain)
    return estimate, np.maximum(variance, 0.0)


def greedy_queries(covariance, n_queries, seen, candidates, n_choices, noise):
    """Choose the queries whose outcomes shrink the targets' variance most.

    The covariance is first conditioned on the ``seen`` queries; each pick then
    shrinks each target's variance by ``Cov(q, t)^2 / (Var(q) + noise)``, every
    target in units of its variance before any pick, and conditions the
    covariance on itself, so that a batch does not ask twice what one query
    tells. The conditioning is kept as one vector per query (the covariance
    less ``basis.T @ basis``), so a pick costs ``len(covariance)`` times the
    picks so far, not a pass over the whole matrix.

    Returns positions in ``candidates``, in the order chosen.
    """
    sigma = np.asarray(covariance, dtype=np.float64)
    targets = np.arange(n_queries, len(sigma))
    scale = np.maximum(np.diag(sigma)[targets], 1e-12)
    candidates = np.asarray(candidates, dtype=np.int64)
    seen = np.asarray(seen, dtype=np.int64)
    basis = np.zeros((len(seen) + n_choices, len(sigma)))
    cross = sigma[np.ix_(candidates, targets)]
    variance = sigma[candidates, candidates]
    open_ = np.ones(len(candidates), dtype=bool)
    picks = []

    def condition_on(query, k):
        column = sigma[:, query] - basis[:k].T @ basis[:k, query]
        basis[k] = column / np.sqrt(max(column[query], 0.0) + noise)
        u = basis[k]
        cross[:] -= np.outer(u[candidates], u[targets])
        variance[:] -= u[candidates] ** 2

    for k, query in enumerate(seen):
        condition_on(query, k)
    for k in range(len(seen), len(seen) + n_choices):
        gain = (cross**2 / scale).sum(axis=1) / (np.maximum(variance, 0.0) + noise)
        gain[~open_] = -np.inf
        best = int(np.argmax(gain))
        picks.append(best)
        open_[best] = False
        condition_on(candidates[best], k)
    return np.asarray(picks, dtype=np.int64)


def weighted_moments(table, weights, columns):
    """Mean and covariance of ``table``'s ``columns`` under the rows' ``weights``.

    Only the columns asked for are read, so that conditioning on a model's few
    queries costs ``len(table) * len(columns) ** 2``, whatever the read-out's size.
    """
    block = table[:, columns]
    mean = weights @ block
    centred = (block - mean) * np.sqrt(weights)[:, None]
    return mean, centred.T @ centred


# The read-out's ridge penalties tried in fit (outcomes are in [0, 1]); the one
# whose estimates of the calibration models' scores err least is kept.
NOISES = (0.005, 0.01, 0.02, 0.05, 0.1)
# How much the new model's likely neighbours weigh in the moments: the weights
# are this share of LOCUS's posterior over the references (at temperature
# LOCAL_TEMPERATURE) plus the rest spread evenly over them.
LOCALITY = 0.5
LOCAL_TEMPERATURE = 0.1
# Evaluations shown per calibration model, and at most this many models.
SHOWN = (16, 64, 256, 512)
CALIBRATION_MODELS = 256
# At most this many read-out queries (the most evaluated among the references).
READOUT_QUERIES = 2048


class FullScoreMixin:
    """What :class:`~sklocus.ScoreEstimator` does with the references' full scores.

    Fitted state (``score_groups_`` is None when ``fit`` got no scores):
    ``score_groups_``, ``readout_queries_``, ``score_noise_``,
    ``score_variance_floors_``, ``score_interval_scales_``, ``score_coverage_``;
    private: ``_readout`` (each scored reference's outcomes on the read-out
    queries, then its scores), ``_readout_rows`` (their rows among the
    references), ``_readout_codes`` (each read-out query's position).
    """

    def _fit_full_scores(self, ragged, scores, rng):
        """Fit the read-out of ``scores`` (or record that there is none)."""
        self.score_groups_ = self.readout_queries_ = None
        self.score_noise_ = self.score_interval_scales_ = None
        self.score_variance_floors_ = self.score_coverage_ = None
        self._readout = self._readout_rows = self._readout_codes = None
        if scores is None:
            return
        labels, values = check_reference_scores(scores, ragged.n_sets)
        values = values[self.reference_indices_]
        rows = np.flatnonzero(~np.isnan(values).any(axis=1))
        if len(rows) < MIN_SCORED_REFERENCES:
            raise ValueError(
                f"only {len(rows)} of the {len(values)} reference models kept "
                f"(max_reference_models={self.max_reference_models}) have every "
                f"score; reading full scores needs at least {MIN_SCORED_REFERENCES}"
            )
        references = self._references
        owner = np.repeat(np.arange(references.n_sets), references.sizes)
        scored = np.isin(owner, rows)
        counts = np.bincount(
            references.query_codes[scored], minlength=len(references.queries)
        )
        order = np.argsort(-counts, kind="stable")
        keep = order[: min(READOUT_QUERIES, int((counts > 0).sum()))]
        queries = [references.queries[i] for i in keep]
        outcomes = self._reference_outcomes(queries)[rows]
        self.score_groups_ = labels
        self.readout_queries_ = queries
        self._readout_codes = {query: i for i, query in enumerate(queries)}
        self._readout = np.concatenate(
            [outcomes.astype(np.float64), values[rows]], axis=1
        )
        self._readout_rows = rows
        self._calibrate_full_scores(rng)

    def _readout_positions(self, evaluations):
        """Return the read-out positions of a model's evaluations, and its scores."""
        code = self._readout_codes
        found = [(code[q], s) for q, s in evaluations.items() if q in code]
        positions = np.array([i for i, _ in found], dtype=np.int64)
        return positions, np.array([s for _, s in found], dtype=np.float64)

    def _local_weights(self, evaluations, exclude=None, local=True):
        """Weigh the scored references for one model's moments."""
        n = len(self._readout_rows)
        even = np.full(n, 1.0 / n)
        if exclude is not None:
            even[exclude] = 0.0
            even /= even.sum()
        if not evaluations or not local:
            return even
        queries = list(evaluations)
        scores = np.fromiter(evaluations.values(), np.float64, count=len(queries))
        predictions = self._reference_predictions(queries)[self._readout_rows]
        posterior = posterior_weights(
            predictions, scores, LOCAL_TEMPERATURE, exclude=exclude
        )
        return LOCALITY * posterior + (1 - LOCALITY) * even

    def _full_scores(self, evaluations, noises=None, exclude=None):
        """Conditional mean and variance of every score group for one model.

        One ``(mean, variance)`` per penalty of ``noises`` (default: the fitted
        one alone, returned bare): the moments are computed once for all.
        """
        seen, values = self._readout_positions(evaluations)
        n_groups = len(self.score_groups_)
        columns = np.r_[seen, np.arange(-n_groups, 0)]
        weights = self._local_weights(evaluations, exclude)
        mean, covariance = weighted_moments(self._readout, weights, columns)
        k = len(seen)
        found = [
            conditional_scores(mean, covariance, k, np.arange(k), values, noise)
            for noise in (noises or [self.score_noise_])
        ]
        return found if noises else found[0]

    def _calibrate_full_scores(self, rng):
        """Choose ``score_noise_``; scale the intervals on held-out references.

        Each calibration model is shown, at each size of ``SHOWN`` it allows, a
        random draw of its own results on the read-out queries and the first of
        the anchors it was evaluated on, since chosen queries leave less
        variance in the read-out's eyes than random ones, and the intervals
        must hold for both.
        """
        truth = self._readout[:, len(self.readout_queries_) :]
        references = self._references
        order = self._anchor_order(max(SHOWN))
        draws = []  # (row, size, anchors or not, evaluations shown)
        for row in rng.permutation(len(self._readout_rows))[:CALIBRATION_MODELS]:
            model = int(self._readout_rows[row])
            # Only a reference's own results are shown, never LOCUS's stand-ins.
            own = dict(
                zip(
                    (references.queries[c] for c in references.set_codes(model)),
                    references.set_scores(model).astype(np.float64),
                )
            )
            own = {q: own[q] for q in self.readout_queries_ if q in own}
            queries = list(own)
            anchors = [q for q in order if q in own]
            for n in SHOWN:
                if n > len(own):
                    break
                picked = rng.choice(len(queries), n, replace=False)
                shown_ = {queries[i]: own[queries[i]] for i in picked}
                draws.append((row, n, False, shown_))
                draws.append((row, n, True, {q: own[q] for q in anchors[:n]}))
        if len(draws) < 4:
            raise ValueError(
                f"only {len(draws)} calibration draws: the scored references need "
                f"{SHOWN[0]} or more evaluations on the read-out queries each"
            )
        rows = np.array([draw[0] for draw in draws])
        sizes = np.array([draw[1] for draw in draws])
        chosen = np.array([draw[2] for draw in draws])
        found = [
            self._full_scores(shown_, NOISES, exclude=row)
            for row, _, _, shown_ in draws
        ]
        spread = np.maximum(truth.std(axis=0), 1e-12)

        def loss(k):
            errors = [(f[k][0] - truth[row]) / spread for row, f in zip(rows, found)]
            return float(np.mean(np.square(errors)))

        best = min(range(len(NOISES)), key=loss)
        self.score_noise_ = NOISES[best]
        mean = np.array([f[best][0] for f in found])
        variance = np.array([f[best][1] for f in found])
        squared = (truth[rows] - mean) ** 2
        # Split by model, so that no model's draws fall on both sides.
        models = np.unique(rows)
        fitted_models = models[rng.permutation(len(models))[: (len(models) + 1) // 2]]
        in_fit = np.isin(rows, fitted_models)
        # What the read-out cannot know (its Gaussian is only an approximation)
        # shows at the largest size, where its own variance is least: the mean
        # excess of the squared errors there is added to every variance.
        largest = in_fit & (sizes == sizes[in_fit].max())
        excess = (squared[largest] - variance[largest]).mean(axis=0)
        self.score_variance_floors_ = np.maximum(excess, 0.0)
        ratio = np.sqrt(squared / (variance + self.score_variance_floors_ + 1e-12))
        # Wide enough for random and chosen queries alike: the larger scale.
        scales = []
        for kind in (False, True):
            fitted = np.sort(ratio[in_fit & (chosen == kind)], axis=0)
            rank = min(math.ceil((len(fitted) + 1) * self.confidence), len(fitted))
            scales.append(fitted[rank - 1])
        self.score_interval_scales_ = np.max(scales, axis=0)
        held = ratio[~in_fit]
        self.score_coverage_ = (
            float(np.mean(held <= self.score_interval_scales_))
            if len(held)
            else float("nan")
        )

    def _anchor_order(self, n_queries):
        """Return the first ``n_queries`` anchors: chosen knowing no result."""
        n_read = len(self.readout_queries_)
        n_groups = len(self.score_groups_)
        weights = np.full(len(self._readout_rows), 1.0 / len(self._readout_rows))
        columns = np.r_[np.arange(n_read), np.arange(-n_groups, 0)]
        _, covariance = weighted_moments(self._readout, weights, columns)
        noise = self.score_noise_ or NOISES[len(NOISES) // 2]
        picks = greedy_queries(
            covariance, n_read, [], np.arange(n_read), min(n_queries, n_read), noise
        )
        return [self.readout_queries_[i] for i in picks]

    def _scored_targets(self, labels, query_groups):
        """Columns of the fitted scores that a suggestion aims at, if any."""
        if self.score_groups_ is None:
            return []
        if query_groups is None:
            return list(range(len(self.score_groups_)))
        present = set(labels)
        return [k for k, label in enumerate(self.score_groups_) if label in present]

    def _suggest_for_full_scores(self, evaluations, pool, n_queries, targets, local):
        """Positions in ``pool`` whose outcomes narrow the full scores most.

        ``local``: weigh the references by what the model's results say (the
        adaptive choice); otherwise evenly (the anchors, the same for every
        model that was evaluated on the same queries).
        """
        seen, _ = self._readout_positions(evaluations)
        code = self._readout_codes
        inside = np.array([i for i, q in enumerate(pool) if q in code], np.int64)
        if n_queries > len(inside):
            raise ValueError(
                f"asked for {n_queries} queries, but only {len(inside)} of the open "
                "candidates are among the read-out queries, whose outcomes the "
                f"fitted scores are read from ({len(self.readout_queries_)} "
                "queries the references were evaluated on); ask for fewer"
            )
        n_read = len(self.readout_queries_)
        columns = np.r_[
            seen,
            [code[pool[i]] for i in inside],
            n_read + np.asarray(targets, np.int64),
        ].astype(np.int64)
        weights = self._local_weights(evaluations, local=local)
        _, covariance = weighted_moments(self._readout, weights, columns)
        k, c = len(seen), len(inside)
        picks = greedy_queries(
            covariance,
            k + c,
            np.arange(k),
            np.arange(k, k + c),
            n_queries,
            self.score_noise_,
        )
        return inside[picks]
