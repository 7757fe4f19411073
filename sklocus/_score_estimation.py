"""Estimate a model's scores from a few evaluations, and choose which to run next.

:class:`ScoreEstimator` wraps a fitted :class:`~sklocus.LocusEmbedder` and a pool of
reference models (typically the models the embedder was trained on). A new model's
evaluations weight the reference models by how well each explains them
(:mod:`sklocus._model_posterior`); the weighted references then predict the
model's score on any group of queries, with an interval, and say which queries'
outcomes would narrow those intervals most.

The interval's width is not assumed: :meth:`ScoreEstimator.fit` hides most of the
evaluations of some reference models, estimates their scores from the rest with
every other reference model, and scales the intervals so that they cover the
truth at ``confidence`` on half of them (split conformal prediction); the other
half measures the coverage (``coverage_``).

With the references' full scores, the read-out of :mod:`sklocus._score_readout`
estimates those instead, for the groups they name.
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from sklocus._groups import check_query_groups
from sklocus._model_posterior import (
    greedy_variance_reduction,
    group_moments,
    group_sums,
    posterior_weights,
)
from sklocus._progress import status
from sklocus._score_readout import FullScoreMixin
from sklocus._sklearn_compat import HasMethods, Interval, _fit_context
from sklocus._validation import check_count, shown
from sklocus._versioning import VersionStampMixin
from sklocus.encoders import as_query_list
from sklocus.evaluations import check_evaluation_sets

__all__ = ["ScoreEstimator"]

# Temperatures of the likelihood tried in fit; the one whose posterior predicts
# the hidden evaluations of the calibration models best is kept.
_TEMPERATURES = (1.0, 0.5, 0.25, 0.125, 0.0625)
# Evaluations shown per calibration model (at most half of its evaluations).
_SHOWN = (8, 32, 128)
# At most this many calibration models, and queries per calibration model.
_CALIBRATION_MODELS = 256
_CALIBRATION_QUERIES = 1024
# Queries predicted at once for every reference model (bounds memory).
_QUERY_CHUNK = 2048
# Predictions kept for queries asked about before, in bytes.
_CACHE_BYTES = 256 * 2**20

_TABLE_COLUMNS = (
    "model",
    "group",
    "n_queries",
    "n_evaluated",
    "estimate",
    "std",
    "lower",
    "upper",
    "target",
)

STRATEGIES = ("variance", "anchors", "disagreement", "coverage", "random")


class ScoreEstimator(FullScoreMixin, VersionStampMixin, BaseEstimator):
    """Estimate models' scores on groups of queries from a few evaluations each.

    A model's evaluations weight a pool of reference models (their LOCUS
    embeddings) by their likelihood; the weighted references predict the model's
    outcome on every query it was not evaluated on. Its estimated score on a group
    of queries (a benchmark, a subject, a category) is its observed scores there
    plus those predictions, divided by the group's size; the interval is scaled
    on reference models whose evaluations were hidden, so that its coverage is
    measured, not assumed. :meth:`suggest_queries` says which queries to evaluate
    next to narrow the intervals most.

    Given the reference models' full scores (a leaderboard's, one column per
    benchmark), ``fit(X, scores)`` also learns to read those scores from any
    few evaluations (:mod:`sklocus._score_readout`), and the groups named there
    are estimated, and queries chosen, on that scale.

    Read more in the :ref:`User Guide <score_estimation>`.

    Parameters
    ----------
    embedder : LocusEmbedder
        A fitted embedder (anything with ``transform`` and ``predict_correctness``).
        Its ``verbose`` also reports :meth:`fit` on standard error, the way the
        embedder reports its own steps.
    confidence : float, default=0.9
        The intervals' nominal coverage, in (0, 1).
    max_reference_models : int, default=2048
        At most this many reference models describe a new model (a random subset of
        those given to ``fit``); time and memory grow in proportion.
    random_state : int, RandomState instance or None, default=None
        Draws the reference subset, the calibration's hidden evaluations and the
        ``"random"`` strategy's queries. An int makes everything deterministic.

    Attributes
    ----------
    reference_embeddings_ : ndarray of shape (n_reference, embedding_dim)
        The reference models' embeddings.
    reference_indices_ : ndarray of shape (n_reference,)
        Their positions in the sets given to ``fit``.
    temperature_ : float
        The likelihood's temperature chosen on the calibration models.
    interval_scale_ : float
        Half-width of an interval in standard deviations of the estimate.
    coverage_ : float
        Share of the held-out calibration estimates whose interval held the truth.
    n_calibration_estimates_ : int
        How many estimates that share is over.
    score_groups_ : list or None
        The columns of the ``scores`` given to ``fit``: the groups estimated on
        their full scores' scale. None without scores (and so are the five
        attributes below).
    readout_queries_ : list or None
        The queries whose outcomes the full scores are read from (the most
        evaluated among the scored references, at most 2048).
    score_noise_ : float or None
        The read-out's ridge penalty chosen on the calibration models.
    score_variance_floors_ : ndarray of shape (n_score_groups,) or None
        Added to each full score's variance: what the read-out's errors exceed
        its own variance by, on calibration models shown the most results.
    score_interval_scales_ : ndarray of shape (n_score_groups,) or None
        Half-width of a full score's interval in its standard deviations.
    score_coverage_ : float or None
        Share of the held-out calibration models' full scores (every group)
        that their intervals held.

    See Also
    --------
    LocusRouter.add_models : Add a model to a router once it is evaluated.

    Examples
    --------
    >>> from sklocus import LocusEmbedder, ScoreEstimator
    >>> from sklocus.datasets import make_evaluations
    >>> data = make_evaluations(n_models=60, n_queries=100, evals_per_model=None,
    ...                         random_state=0)
    >>> references, new_model = data.evaluation_sets[:50], data.evaluation_sets[55]
    >>> embedder = LocusEmbedder(query_encoder=data.encoder, embedding_dim=16,
    ...                          n_latents=4, max_epochs=2, epoch_size=256,
    ...                          random_state=0).fit(references)
    >>> estimator = ScoreEstimator(embedder, random_state=0).fit(references)
    >>> first = estimator.suggest_queries({}, data.query_ids, 10)
    >>> results = {query: new_model[query] for query in first}
    >>> table = estimator.estimate_scores([results], data.query_ids, data.benchmarks)
    >>> table.columns.tolist()  # doctest: +NORMALIZE_WHITESPACE
    ['model', 'group', 'n_queries', 'n_evaluated', 'estimate', 'std', 'lower',
     'upper', 'target']
    >>> len(table)  # one row per benchmark
    5
    """

    _parameter_constraints = {
        "embedder": [HasMethods(["transform", "predict_correctness"])],
        "confidence": [Interval(numbers.Real, 0, 1, closed="neither")],
        "max_reference_models": [Interval(numbers.Integral, 2, None, closed="left")],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        embedder,
        *,
        confidence=0.9,
        max_reference_models=2048,
        random_state=None,
    ):
        self.embedder = embedder
        self.confidence = confidence
        self.max_reference_models = max_reference_models
        self.random_state = random_state

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, scores=None):
        """Embed the reference models and calibrate the intervals on them.

        Parameters
        ----------
        X : sequence of mappings
            The reference models' evaluation sets (query to score), at least two,
            typically those the embedder was trained on.
        scores : DataFrame, default=None
            The reference models' full scores: one row per set of ``X``, in its
            order, one column per group (a benchmark's score over all its items,
            as a leaderboard reports it; any scale), NaN where unknown. With
            them, :meth:`estimate_scores` reports a group named as a column on
            that scale, read from the evaluations by a linear read-out fitted on
            the references that have every score, and :meth:`suggest_queries`
            chooses queries for those scores. Without them, every group's
            estimate is the model's mean over the group's queries.

        Returns
        -------
        self
        """
        check_is_fitted(self.embedder)
        ragged = check_evaluation_sets(X)
        if ragged.n_sets < 2:
            raise ValueError(
                f"got {ragged.n_sets} reference model; a ScoreEstimator needs at "
                "least 2 (and its intervals are only as good as the references are "
                "many)"
            )
        rng = check_random_state(self.random_state)
        n_reference = min(ragged.n_sets, self.max_reference_models)
        chosen = np.sort(rng.permutation(ragged.n_sets)[:n_reference])
        self.reference_indices_ = chosen
        self._prediction_cache = {}
        references = ragged.subset(chosen)
        # Reported as the embedder reports its own steps (its verbose).
        label = f"Calibrating the estimates on {n_reference:,} reference models"
        with status(label, enabled=bool(_verbose(self.embedder))):
            self.reference_embeddings_ = np.asarray(self.embedder.transform(references))
            self._references = references
            self._reference_codes = {q: i for i, q in enumerate(references.queries)}
            # The reference model of each evaluation, for _reference_outcomes.
            self._reference_owner = np.repeat(
                np.arange(references.n_sets), references.sizes
            )
            self._calibrate(ragged, rng)
            self._fit_full_scores(ragged, scores, rng)
        return self

    # -- calibration --------------------------------------------------------------

    def _calibration_draws(self, ragged, rng):
        """Hidden-evaluation draws of the calibration models.

        Returns the calibration queries and a list of ``(model, codes, scores,
        shown)``: a model's evaluations among those queries (codes into them) and,
        for each number of shown evaluations, which of them are shown.
        """
        counts = np.bincount(ragged.query_codes, minlength=len(ragged.queries))
        # The most evaluated queries, ties in random order: shared by most models.
        order = np.lexsort((rng.random(len(counts)), -counts))
        keep = order[: min(_CALIBRATION_QUERIES, len(order))]
        position = np.full(len(ragged.queries), -1)
        position[keep] = np.arange(len(keep))
        draws = []
        for model in rng.permutation(ragged.n_sets):
            codes = position[ragged.set_codes(model)]
            inside = codes >= 0
            if inside.sum() < 2 * _SHOWN[0]:
                continue
            codes, scores = codes[inside], ragged.set_scores(model)[inside]
            shown_masks = []
            for n in _SHOWN:
                if 2 * n > len(codes):
                    break
                mask = np.zeros(len(codes), dtype=bool)
                mask[rng.choice(len(codes), n, replace=False)] = True
                shown_masks.append(mask)
            draws.append((model, codes, scores, shown_masks))
            if len(draws) == _CALIBRATION_MODELS:
                break
        if len(draws) < 2:
            raise ValueError(
                f"only {len(draws)} reference model has {2 * _SHOWN[0]} or more "
                "evaluations on common queries; calibrating the intervals needs at "
                "least 2 such models"
            )
        return [ragged.queries[i] for i in keep], draws

    def _calibrate(self, ragged, rng):
        """Choose ``temperature_`` and ``interval_scale_``; measure ``coverage_``."""
        queries, draws = self._calibration_draws(ragged, rng)
        predictions = self._reference_predictions(queries)
        outcomes = self._reference_outcomes(queries, predictions)
        slot = {int(model): k for k, model in enumerate(self.reference_indices_)}
        # Per temperature: squared error of the estimates, and their rows
        # (model, estimate, std, truth).
        losses, rows = {}, {}
        for temperature in _TEMPERATURES:
            found = []
            for model, codes, scores, shown_masks in draws:
                p, o = predictions[:, codes], outcomes[:, codes]
                for mask in shown_masks:
                    w = posterior_weights(
                        p[:, mask],
                        scores[mask],
                        temperature,
                        exclude=slot.get(int(model)),  # the model itself
                    )
                    hidden = ~mask
                    mean, variance = group_moments(
                        w,
                        o[:, hidden].sum(axis=1, keepdims=True, dtype=np.float64),
                        (p[:, hidden] * (1 - p[:, hidden])).sum(
                            axis=1, keepdims=True, dtype=np.float64
                        ),
                    )
                    size = len(scores)
                    estimate = (scores[mask].sum() + mean[0]) / size
                    found.append(
                        (model, estimate, math.sqrt(variance[0]) / size, scores.mean())
                    )
            table = np.asarray(found, dtype=np.float64)
            losses[temperature] = float(np.mean((table[:, 1] - table[:, 3]) ** 2))
            rows[temperature] = table
        self.temperature_ = min(_TEMPERATURES, key=losses.__getitem__)
        table = rows[self.temperature_]
        # Split by model, so that no model's draws fall on both sides.
        models = np.unique(table[:, 0])
        fitted_models = models[rng.permutation(len(models))[: (len(models) + 1) // 2]]
        in_fit = np.isin(table[:, 0], fitted_models)
        ratio = np.abs(table[:, 3] - table[:, 1]) / np.maximum(table[:, 2], 1e-9)
        fitted = np.sort(ratio[in_fit])
        rank = min(math.ceil((len(fitted) + 1) * self.confidence), len(fitted))
        self.interval_scale_ = float(fitted[rank - 1])
        held = ratio[~in_fit]
        self.coverage_ = (
            float(np.mean(held <= self.interval_scale_)) if len(held) else float("nan")
        )
        self.n_calibration_estimates_ = int(len(held))

    # -- predictions of the reference models ------------------------------------

    def _reference_predictions(self, queries):
        """P(correct) of every reference model on ``queries``, float32.

        Each query's column is kept (up to ``_CACHE_BYTES`` in all), since asking
        for one query at a time predicts the same candidates again and again.
        """
        n_reference = len(self.reference_embeddings_)
        if not queries:
            return np.empty((n_reference, 0), np.float32)
        cache = self.__dict__.setdefault("_prediction_cache", {})
        column_bytes = n_reference * 4
        distinct = list(dict.fromkeys(queries))
        if len(distinct) * column_bytes > _CACHE_BYTES:  # too many to keep: predict
            return self._predict_references(queries)
        missing = [q for q in distinct if q not in cache]
        if (len(cache) + len(missing)) * column_bytes > _CACHE_BYTES:
            cache.clear()
            missing = distinct
        if missing:
            block = self._predict_references(missing)
            cache.update(zip(missing, block.T.copy()))
        return np.stack([cache[q] for q in queries], axis=1)

    def _predict_references(self, queries):
        """P(correct) of every reference model on ``queries``, in chunks."""
        out = np.empty((len(self.reference_embeddings_), len(queries)), np.float32)
        for start in range(0, len(queries), _QUERY_CHUNK):
            chunk = queries[start : start + _QUERY_CHUNK]
            out[:, start : start + len(chunk)] = self.embedder.predict_correctness(
                self.reference_embeddings_, chunk
            ).T
        return out

    def __getstate__(self):
        # The cache is a speed-up of this process, not state worth pickling.
        state = super().__getstate__()
        state.pop("_prediction_cache", None)
        return state

    def _reference_outcomes(self, queries, predictions=None):
        """Each reference model's outcome on ``queries``: its score where evaluated.

        Where a reference model was not evaluated on a query, its predicted
        P(correct) stands in (``predictions``, computed when not given).
        """
        if predictions is None:
            predictions = self._reference_predictions(queries)
        out = np.array(predictions, dtype=np.float32)
        references = self._references
        column = np.full(len(references.queries), -1, dtype=np.int64)
        for position, query in enumerate(queries):
            code = self._reference_codes.get(query)
            if code is not None:
                column[code] = position
        at = column[references.query_codes]
        hit = at >= 0
        if hit.any():
            out[self._reference_owner[hit], at[hit]] = references.scores[hit]
        return out

    def _weights(self, evaluations):
        """Posterior weights of the reference models given one evaluation set."""
        if not evaluations:
            n_reference = len(self.reference_embeddings_)
            return np.full(n_reference, 1.0 / n_reference)
        queries = list(evaluations)
        scores = np.fromiter(evaluations.values(), dtype=np.float64, count=len(queries))
        return posterior_weights(
            self._reference_predictions(queries), scores, self.temperature_
        )

    # -- estimating scores ------------------------------------------------------

    def estimate_scores(self, X, queries, query_groups=None, model_names=None):
        """Estimate each model's score on each group of queries.

        A group named as a column of the ``scores`` given to :meth:`fit` is
        estimated on that scale (``target`` "full score"): the read-out's
        conditional mean given every evaluation of the model among the
        read-out queries, inside the group or not. Any other group's estimate
        is the model's mean over the group's queries (``target`` "item mean").

        Parameters
        ----------
        X : sequence of mappings
            One evaluation set (query to score) per model, possibly empty; its
            evaluations outside ``queries`` inform the estimate too.
        queries : sequence
            Every query of the groups (a benchmark's queries, say), distinct.
        query_groups : array-like of shape (n_queries,), default=None
            Each query's group (benchmark, subject, category); None or NaN leaves
            a query out of every group. Default: all queries form one group,
            ``"all"``. Groups are listed sorted (in order of appearance when
            their labels cannot be sorted).
        model_names : sequence of str, default=None
            Names for the ``model`` column; default the sets' positions.

        Returns
        -------
        DataFrame
            One row per model and group: ``n_queries`` (the group's size),
            ``n_evaluated`` (of them, how many the model was evaluated on),
            ``estimate``, ``std`` (its standard deviation), ``lower`` and
            ``upper`` (the interval at ``confidence``) and ``target``, what the
            estimate is of: ``"item mean"`` (observed scores plus predictions,
            over the group's size; the interval within what the unevaluated
            queries allow) or ``"full score"`` (on the scale of the fitted
            ``scores``).
        """
        check_is_fitted(self, "reference_embeddings_")
        sets = _evaluation_dicts(X, model_names)
        queries, codes, labels = _queries_and_groups(queries, query_groups)
        if model_names is None:
            model_names = list(range(len(sets)))
        predictions = self._reference_predictions(queries)
        outcomes = self._reference_outcomes(queries, predictions)
        known = codes >= 0
        sums, variances = group_sums(
            outcomes[:, known], predictions[:, known], codes[known], len(labels)
        )
        position = {query: i for i, query in enumerate(queries)}
        size = np.bincount(codes[known], minlength=len(labels))
        read = {}  # group label: its column of the fitted scores
        if self.score_groups_ is not None:
            column = {label: k for k, label in enumerate(self.score_groups_)}
            read = {label: column[label] for label in labels if label in column}
        scored = bool(read)
        rows = []
        for name, evaluations in zip(model_names, sets):
            w = self._weights(evaluations)
            inside = [
                (position[q], score)
                for q, score in evaluations.items()
                if q in position and codes[position[q]] >= 0
            ]
            observed = np.zeros(len(labels))
            count = np.zeros(len(labels), dtype=np.int64)
            model_sums, model_variances = sums, variances
            if inside:
                at = np.array([i for i, _ in inside])
                scores = np.array([s for _, s in inside], dtype=np.float64)
                np.add.at(observed, codes[at], scores)
                np.add.at(count, codes[at], 1)
                seen_sums, seen_variances = group_sums(
                    outcomes[:, at], predictions[:, at], codes[at], len(labels)
                )
                model_sums = sums - seen_sums
                model_variances = variances - seen_variances
            mean, variance = group_moments(
                w, model_sums, np.maximum(model_variances, 0.0)
            )
            full = count == size  # known exactly, whatever the rounding of sums
            mean[full], variance[full] = 0.0, 0.0
            estimate = (observed + mean) / size
            std = np.sqrt(np.maximum(variance, 0.0)) / size
            half = self.interval_scale_ * std
            lower = np.maximum(estimate - half, observed / size)
            upper = np.minimum(estimate + half, (observed + size - count) / size)
            target = np.full(len(labels), "item mean", dtype=object)
            if scored:
                full_mean, full_variance = self._full_scores(evaluations)
                at = np.array([read[label] for label in labels if label in read])
                put = np.array([label in read for label in labels])
                estimate[put] = full_mean[at]
                std[put] = np.sqrt(full_variance[at] + self.score_variance_floors_[at])
                half = self.score_interval_scales_[at] * std[put]
                lower[put], upper[put] = estimate[put] - half, estimate[put] + half
                target[put] = "full score"
            rows.extend(
                zip(
                    [name] * len(labels),
                    labels,
                    size.tolist(),
                    count.tolist(),
                    estimate.tolist(),
                    std.tolist(),
                    lower.tolist(),
                    upper.tolist(),
                    target,
                )
            )
        return pd.DataFrame(rows, columns=list(_TABLE_COLUMNS))

    # -- choosing queries ---------------------------------------------------------

    def suggest_queries(
        self,
        evaluations,
        candidates,
        n_queries=1,
        *,
        query_groups=None,
        strategy="variance",
    ):
        """Choose which of ``candidates`` to evaluate a model on next.

        Call it with ``n_queries=1`` after each new result to choose one at a time,
        or ask for a batch: each pick of a batch accounts for what the picks
        before it will tell.

        Parameters
        ----------
        evaluations : mapping
            The model's evaluations so far (query to score), possibly empty.
        candidates : sequence
            Queries it may be evaluated on, distinct; those it already was are
            never suggested.
        n_queries : int, default=1
            How many to suggest.
        query_groups : array-like of shape (n_candidates,), default=None
            Each candidate's group, as in :meth:`estimate_scores`: the
            ``"variance"`` strategy narrows every group's interval, groups
            weighted alike. A candidate in no group may still be suggested, for
            what its outcome tells about the groups. Default: one group of all
            candidates.
        strategy : {"variance", "anchors", "disagreement", "coverage", \
                "random"}, default="variance"
            ``"variance"``: the queries whose outcomes are expected to shrink the
            variance of the groups' estimated scores most, each group's variance
            relative to what it is before, given the model's results so far
            (for groups with full scores, the variance of those scores, among
            the read-out queries). ``"anchors"``: the same choice made as if no
            result were known, so that it depends only on which queries were
            evaluated, not on how they went: every model gets the same anchor
            queries (the tinyBenchmarks and metabench practice), comparable
            across models. ``"disagreement"``: the
            queries on which the reference models that explain the evaluations
            disagree most. ``"coverage"``: spread over the candidates' encodings
            (farthest first from what was evaluated). ``"random"``: at random,
            from ``random_state``.

        Returns
        -------
        list
            ``n_queries`` candidates, in the order chosen, none repeated.
        """
        check_is_fitted(self, "reference_embeddings_")
        if strategy not in STRATEGIES:
            raise ValueError(
                f"strategy must be one of {', '.join(map(repr, STRATEGIES))}; got "
                f"{strategy!r}"
            )
        check_count(n_queries, "n_queries")
        (evaluations,) = _evaluation_dicts([evaluations], None, what="evaluations")
        candidates, codes, labels = _queries_and_groups(
            candidates, query_groups, what="candidates"
        )
        open_ = np.array([q not in evaluations for q in candidates], dtype=bool)
        if n_queries > open_.sum():
            raise ValueError(
                f"asked for {n_queries} queries, but only {int(open_.sum())} of the "
                f"{len(candidates)} candidates are not evaluated yet; give more "
                "candidates or ask for fewer"
            )
        pool = [q for q, is_open in zip(candidates, open_) if is_open]
        pool_codes = codes[open_]
        if strategy == "random":
            rng = check_random_state(self.random_state)
            picks = rng.permutation(len(pool))[:n_queries]
        elif strategy == "coverage":
            picks = self._farthest_first(evaluations, pool, n_queries)
        elif strategy != "disagreement" and self._scored_targets(labels, query_groups):
            picks = self._suggest_for_full_scores(
                evaluations,
                pool,
                n_queries,
                self._scored_targets(labels, query_groups),
                local=strategy == "variance",
            )
        else:
            if strategy == "anchors":  # what every model would be asked: no results
                n_reference = len(self.reference_embeddings_)
                w = np.full(n_reference, 1.0 / n_reference)
            else:
                w = self._weights(evaluations)
            p = self._reference_predictions(pool)
            if strategy == "disagreement":
                spread = w @ (p - w @ p) ** 2
                picks = np.argsort(-spread, kind="stable")[:n_queries]
            else:
                grouped = pool_codes >= 0
                if not grouped.any():
                    raise ValueError(
                        "no candidate still to evaluate has a group; the variance "
                        "strategy narrows the groups' scores, so give the groups"
                    )
                o = self._reference_outcomes(pool, p)
                sums, _ = group_sums(
                    o[:, grouped], p[:, grouped], pool_codes[grouped], len(labels)
                )
                size = np.bincount(codes[codes >= 0], minlength=len(labels))
                # Each group's score in units of its current spread, so that
                # every group's interval counts alike, however wide.
                targets = sums / size
                spread = np.sqrt(w @ (targets - w @ targets) ** 2)
                targets = np.divide(
                    targets, spread, out=np.zeros_like(targets), where=spread > 1e-12
                )
                # The reference models' outcomes, not their predictions: a
                # result is a draw from the weighted mixture of what they did,
                # whose spread already holds the outcome's randomness (adding
                # p (1 - p) again chose worse queries on the Open LLM data).
                picks = greedy_variance_reduction(w, o, targets, n_queries)
        return [pool[int(i)] for i in picks]

    def collect_evaluations(
        self,
        evaluate,
        candidates,
        n_queries,
        *,
        batch_size=8,
        query_groups=None,
        evaluations=None,
        strategy="variance",
    ):
        """Evaluate a model on suggested queries, a batch at a time.

        Each batch is chosen by :meth:`suggest_queries` given every result so
        far, then scored by ``evaluate``: the loop of onboarding a new model,
        whose result :meth:`estimate_scores` and
        :meth:`LocusRouter.add_models <sklocus.LocusRouter.add_models>` take.

        Parameters
        ----------
        evaluate : callable
            Takes a list of queries and returns their scores in [0, 1], in the
            same order: the model's answers, graded.
        candidates : sequence
            Queries it may be evaluated on, distinct.
        n_queries : int
            How many queries to evaluate in all (beyond ``evaluations``).
        batch_size : int, default=8
            Queries per call of ``evaluate``; 1 chooses each query knowing every
            result before it.
        query_groups : array-like of shape (n_candidates,), default=None
            Each candidate's group, as in :meth:`suggest_queries`.
        evaluations : mapping, default=None
            Results the model already has; they are kept and never asked again.
        strategy : str, default="variance"
            As in :meth:`suggest_queries`.

        Returns
        -------
        dict
            ``evaluations`` (a copy) and the new results, query to score.
        """
        check_count(batch_size, "batch_size")
        check_count(n_queries, "n_queries")
        (collected,) = _evaluation_dicts([evaluations or {}], None, what="evaluations")
        collected = dict(collected)
        candidates, _, _ = _queries_and_groups(candidates, None, what="candidates")
        still_open = sum(query not in collected for query in candidates)
        if n_queries > still_open:  # before any evaluation is paid for
            raise ValueError(
                f"asked for {n_queries} queries, but only {still_open} of the "
                f"{len(candidates)} candidates are not evaluated yet; give more "
                "candidates or ask for fewer"
            )
        remaining = int(n_queries)
        while remaining:
            batch = self.suggest_queries(
                collected,
                candidates,
                min(batch_size, remaining),
                query_groups=query_groups,
                strategy=strategy,
            )
            scores = list(evaluate(list(batch)))
            if len(scores) != len(batch):
                raise ValueError(
                    f"evaluate returned {len(scores)} scores for {len(batch)} queries; "
                    "expected one score per query, in their order"
                )
            (checked,) = _evaluation_dicts(
                [dict(zip(batch, scores))], None, what="the scores evaluate returned"
            )
            collected.update(checked)
            remaining -= len(batch)
        return collected

    def _farthest_first(self, evaluations, pool, n_queries):
        """Farthest-point traversal of the pool's encodings (k-center's greedy)."""
        encode = self.embedder.query_encoder_.transform
        vectors = np.asarray(encode(pool), dtype=np.float64)
        picks = []
        if evaluations:
            seen = np.asarray(encode(list(evaluations)), dtype=np.float64)
            distance = np.full(len(vectors), np.inf)
            for start in range(0, len(seen), _QUERY_CHUNK):
                block = _distances(vectors, seen[start : start + _QUERY_CHUNK])
                distance = np.minimum(distance, block.min(axis=1))
        else:  # the first pick is the candidate nearest the centre of them all
            centre = vectors.mean(axis=0, keepdims=True)
            picks.append(int(np.argmin(_distances(vectors, centre)[:, 0])))
            distance = _distances(vectors, vectors[picks])[:, 0]
        while len(picks) < n_queries:
            distance[picks] = -np.inf
            i = int(np.argmax(distance))
            picks.append(i)
            to_new = _distances(vectors, vectors[i : i + 1])[:, 0]
            distance = np.minimum(distance, to_new)
        return np.asarray(picks)


def _distances(a, b):
    """Euclidean distances between the rows of ``a`` and ``b``."""
    squared = (a**2).sum(axis=1)[:, None] - 2 * a @ b.T + (b**2).sum(axis=1)[None, :]
    return np.sqrt(np.maximum(squared, 0.0))


def _evaluation_dicts(X, model_names, what="X"):
    """Check evaluation sets as every estimator does, empty ones allowed; give dicts."""
    if isinstance(X, dict) and what == "X":
        raise TypeError(
            "X must be a sequence of evaluation sets, one per model; wrap a single "
            "model's set in a list"
        )
    sets = list(X)
    for i, evaluation_set in enumerate(sets):
        if not hasattr(evaluation_set, "items"):
            where = what if what != "X" else f"X[{i}]"
            raise TypeError(
                f"{where} must be a mapping from query to score; got "
                f"{type(evaluation_set).__name__}"
            )
    if model_names is not None and len(model_names) != len(sets):
        raise ValueError(
            f"model_names has {len(model_names)} names for {len(sets)} evaluation sets"
        )
    out = []
    for i, evaluation_set in enumerate(sets):
        if not len(evaluation_set):
            out.append({})
            continue
        # One set at a time, so that a message names the set as the user knows it.
        where = what if what != "X" else f"X[{i}]"
        if model_names is not None:
            where += f" (model {str(model_names[i])!r})"
        try:
            (checked,) = check_evaluation_sets([evaluation_set]).to_dicts()
        except (TypeError, ValueError) as error:
            message = str(error).replace("evaluation set 0", where, 1)
            raise type(error)(message) from None
        out.append(checked)
    return out


def _queries_and_groups(queries, query_groups, what="queries"):
    """Distinct queries, each one's group code (-1 for none) and the group labels."""
    queries = as_query_list(queries)
    if not queries:
        raise ValueError(f"{what} is empty; give at least one query")
    seen = set()
    for query in queries:
        if query in seen:
            raise ValueError(f"query {shown(query)} appears twice in {what}")
        seen.add(query)
    if query_groups is None:
        return queries, np.zeros(len(queries), dtype=np.int64), ["all"]
    groups = check_query_groups(query_groups, len(queries))
    present = groups != None  # noqa: E711 (an object array: None marks no group)
    if not present.any():
        raise ValueError("query_groups gives no query a group")
    labels = list(dict.fromkeys(groups[present]))
    try:  # sorted, as pandas' groupby sorts, when the labels can be
        labels = sorted(labels)
    except TypeError:
        pass
    index = {label: code for code, label in enumerate(labels)}
    codes = np.full(len(queries), -1, dtype=np.int64)
    codes[present] = [index[group] for group in groups[present]]
    return queries, codes, labels


def _verbose(embedder):
    """Return the ``verbose`` of ``embedder`` or of the one it wraps; else 0."""
    return getattr(getattr(embedder, "estimator", embedder), "verbose", 0)
