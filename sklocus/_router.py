"""LocusRouter: send each query to the model most likely to answer it."""

from __future__ import annotations

import copy
import numbers
import warnings

import numpy as np
import pandas as pd
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, clone
from sklearn.exceptions import NotFittedError
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import HasMethods, Interval, StrOptions
from sklearn.utils.validation import check_is_fitted

from sklocus._budget import held_out_curve, weight_within
from sklocus._calibration import (
    apply_calibration,
    fit_calibration,
    fit_new_offsets,
    held_out_pairs,
    in_both_halves,
    split_halves,
)
from sklocus._embedder import _SMALL_POOL, LocusEmbedder
from sklocus._groups import (
    apply_group_offsets,
    check_query_groups,
    fit_group_offsets,
    logits,
)
from sklocus._kept_evaluations import (
    KeptEvaluations,
    add_outcomes,
    append_models,
    keep,
    keep_models,
)
from sklocus._query_heads import apply_heads, fit_heads
from sklocus._routing import (
    best_models,
    cost_utilities,
    policies_given,
    threshold_utilities,
)
from sklocus._validation import check_costs, check_model_names, shown
from sklocus._versioning import VersionStampMixin
from sklocus.calibration import ProbabilityCalibrator
from sklocus.encoders import as_query_list
from sklocus.evaluations import (
    _first_bad_score,
    check_evaluation_sets,
    from_matrix,
    query_sort_key,
    reusable,
    to_matrix,
)
from sklocus.geometry import model_distances
from sklocus.metrics import routing_accuracy
from sklocus.nn.uncertainty import logit_stds, posterior_factors

# predict and friends work through the queries in chunks of this many, so that
# memory stays bounded however many queries come in.
_QUERY_CHUNK = 8192


# What calibrate=True fits (None otherwise).
_CALIBRATION = ("calibration_slope_", "calibration_intercept_", "model_offsets_")
# What query heads fit (None otherwise).
_HEADS = ("head_weights_", "head_biases_", "head_blends_", "head_blend_")
# The evaluations the router keeps (:mod:`sklocus._kept_evaluations`), in the
# order of KeptEvaluations' fields.
_KEPT = (
    "evaluation_queries_",
    "evaluation_codes_",
    "evaluation_sums_",
    "evaluation_counts_",
    "evaluation_offsets_",
)


def check_cost(cost, names):
    """Return ``cost`` as a float array, one finite non-negative value per model."""
    if cost is None:
        return None
    if isinstance(cost, pd.Series):
        missing = [name for name in names if name not in cost.index]
        if missing:
            raise ValueError(f"cost has no value for model {missing[0]!r}")
        cost = cost.loc[list(names)]
    return check_costs(cost, names)


def _score_table(Y, queries, classes=None):
    """Return ``(scores, names)``: Y as an (n_queries, n_models) float array.

    A DataFrame's rows are matched to the queries as :func:`_align_rows` says;
    anything else is read row by row.
    """
    if isinstance(Y, pd.DataFrame):
        if isinstance(Y.columns, pd.MultiIndex):
            raise ValueError(
                f"Y's columns have {Y.columns.nlevels} levels, {shown(Y.columns[0])} "
                "first; a router names each model by one label. Join the levels, "
                "e.g. Y.columns = ['/'.join(map(str, c)) for c in Y.columns]"
            )
        if not Y.columns.is_unique:
            repeated = Y.columns[Y.columns.duplicated()][0]
            raise ValueError(
                f"Y names model {shown(repeated)} in more than one column; give each "
                "model one column"
            )
        Y = _align_rows(Y, queries)
        names = np.empty(len(Y.columns), dtype=object)
        names[:] = check_model_names(list(Y.columns), "Y's columns")
        try:
            scores = Y.to_numpy(dtype=np.float64, na_value=np.nan)
        except (TypeError, ValueError) as error:
            raise TypeError(f"Y must hold numbers in [0, 1] or NaN: {error}") from None
    else:
        scores = np.asarray(Y, dtype=np.float64)
        if scores.ndim != 2:
            raise ValueError(
                f"Y must be 2-D (n_queries, n_models); got shape {scores.shape}"
            )
        if classes is not None and scores.shape[1] != len(classes):
            raise ValueError(
                f"Y has {scores.shape[1]} columns but the router has "
                f"{len(classes)} models; give one column per model of classes_, "
                "in that order"
            )
        names = np.arange(scores.shape[1]) if classes is None else np.asarray(classes)
    if len(scores) != len(queries):
        raise ValueError(
            f"X has {len(queries)} queries but Y has {len(scores)} rows; give one row "
            "of scores per query"
        )
    if classes is not None and (
        len(names) != len(classes) or not np.array_equal(names, classes)
    ):
        raise ValueError(
            f"Y's columns {list(names)} are not the router's models {list(classes)}"
        )
    flat = scores.ravel()
    observed = np.flatnonzero(~np.isnan(flat))
    bad = _first_bad_score(flat[observed])
    if bad is not None:
        row, column = divmod(int(observed[bad[0]]), scores.shape[1])
        raise ValueError(
            f"Y's score of model {shown(names[column])} on query "
            f"{shown(queries[row])} is {scores[row, column]}; scores must be in "
            "[0, 1], or NaN where unobserved"
        )
    return scores, names


def _align_rows(Y, queries):
    """Y's rows in the order of ``queries`` when Y's index names them.

    An index that holds none of the queries (a ``RangeIndex``, or the row numbers
    a cross-validation split leaves) is read row by row; one that holds every
    query is matched by label; one that holds only some is an error.
    """
    if isinstance(Y.index, pd.RangeIndex):
        return Y
    wanted = pd.Index(queries)
    inside = wanted.isin(Y.index)
    if not inside.any():
        return Y
    if not inside.all():
        missing = queries[int(np.argmin(inside))]
        raise ValueError(
            f"query {shown(missing)} of X is not in Y's index, which names other "
            "queries of X; Y's rows are matched to X by their index labels "
            "(reset_index(drop=True) matches them by position)"
        )
    if not Y.index.is_unique:
        repeated = Y.index[Y.index.duplicated()][0]
        raise ValueError(
            f"Y's index holds query {shown(repeated)} more than once; give each query "
            "one row"
        )
    extra = Y.index.difference(wanted)
    if len(extra):
        raise ValueError(
            f"Y's index holds query {shown(extra[0])}, which is not in X; give one "
            "row of scores per query of X"
        )
    return Y.iloc[Y.index.get_indexer(wanted)]


def _check_number(value, name, *, high):
    """Refuse a setting of one call that is not a number in [0, high]."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not 0 <= value <= high
        or value == np.inf
    ):
        bound = "a finite number of at least 0" if high == np.inf else f"in [0, {high}]"
        raise ValueError(f"{name}={value!r} must be {bound}")


def _check_policy(cost_weight, min_probability, budget, cost):
    """Refuse a threshold or a budget without costs, or beside another policy."""
    given = {}
    if cost_weight:
        given["cost_weight"] = cost_weight
    if min_probability is not None:
        given["min_probability"] = min_probability
    if budget is not None:
        given["budget"] = budget
    if len(given) > 1:
        settings = " and ".join(f"{name}={value!r}" for name, value in given.items())
        raise ValueError(
            f"{settings}: a router routes by one policy (a weight of cost, a "
            "threshold or a budget); leave the others at their defaults"
        )
    if cost is None:
        name, value = next(iter(given.items()))
        raise ValueError(
            f"{name}={value!r} routes by the models' costs, which the router does "
            "not have: give cost"
        )


def _is_fitted(estimator):
    try:
        check_is_fitted(estimator)
    except NotFittedError:
        return False
    return True


def _check_distinct_queries(queries):
    seen = set()
    for query in queries:
        if query in seen:
            raise ValueError(
                f"query {shown(query)} is in X more than once; give each query once, "
                "with its scores in one row of Y"
            )
        seen.add(query)


class LocusRouter(VersionStampMixin, ClassifierMixin, BaseEstimator):
    """Route each query to the model most likely to answer it correctly.

    A classifier whose samples are queries and whose classes are models. ``fit``
    embeds every model from its observed scores with a
    :class:`~sklocus.LocusEmbedder` (fitting it first unless it is wrapped in
    :class:`~sklearn.frozen.FrozenEstimator`); ``predict`` scores every query
    against every model with the embedder's correctness predictor and picks the
    best. Models can be added and removed afterwards without refitting.

    Its target is a matrix of scores with gaps, not class labels, so its tags do
    not call it a classifier (``sklearn.base.is_classifier`` is False): an integer
    ``cv`` splits the queries with ``KFold``, as stratifying on the scores cannot.

    Read more in the :ref:`User Guide <routing>`.

    Parameters
    ----------
    embedder : LocusEmbedder or FrozenEstimator or None, default=None
        The embedder. ``None`` fits a ``LocusEmbedder()`` with default settings; any
        other embedder is cloned and fitted, **even one that is already fitted**
        (``fit`` warns then); ``FrozenEstimator(fitted_embedder)`` is used as it is
        (``fit`` then only embeds), which is what a trained embedder needs.
    cost_weight : float, default=0.0
        Weight of cost in the choice: the router picks the model of highest
        ``P(correct) - cost_weight * cost / max(cost)``, so ``cost_weight=0.1`` trades
        at most 0.1 of probability against the most expensive model's cost. Ignored
        when no cost is given.
    min_probability : float in [0, 1] or None, default=None
        Route by a threshold instead (:ref:`routing_on_a_budget`): to the cheapest
        model whose probability of a correct answer is at least this, or to the
        likeliest model when none is. Needs costs, and ``cost_weight=0``.
    budget : float or None, default=None
        Route within a mean cost per query instead (:ref:`routing_on_a_budget`):
        ``fit`` chooses the weight of cost whose routes gave the best quality at a
        mean cost of at most this on held-out evaluations of the pool
        (``budget_cost_weight_``), and warns when none kept within it. Needs
        costs, ``cost_weight=0`` and no ``min_probability``; costs two more
        embeddings of each model at ``fit``. The weight is kept when models are
        added or removed, though costs are weighed relative to the dearest model:
        fit again to choose it for the new pool.
    refine_steps : int or None, default=50
        Steps of test-time refinement of the pool's embeddings (the embedder's
        ``refine_steps``, used in place of its own setting when the embedder is a
        :class:`~sklocus.LocusEmbedder`). A router embeds each model once, so
        refinement costs once per model, not per query; on pools of models the
        embedder was not trained on it raised routing accuracy and correctness
        (:ref:`refining_embeddings`). Each model's embedding is the MAP estimate
        under a prior centred on the forward pass, so the more evaluations a model
        has, the further they move it. ``None`` uses the embedder's own
        ``refine_steps``; 0 routes with forward passes.
    group_shrinkage : float, default=3.0
        With ``query_groups`` in :meth:`fit`: prior precision of each model's
        per-group logit offset (:mod:`sklocus._groups`). About four times this
        many evaluations of a model in a group move its offset halfway to what
        they alone say. 3 was chosen among 1, 3, 10 and 30 on the Open LLM
        Leaderboard data: with benchmark groups it routed better than 10 and 30,
        most clearly when models have few evaluations, and predicted correctness
        as well as 1 and 10 (:doc:`/research/tuning`, "Routers that refine, query
        groups, small pools").
    calibrate : bool, default=False
        Fit LOCUS's predictions to the pool's own evaluations before routing
        (:mod:`sklocus._calibration`): each model's evaluations are predicted
        half from the other half, and on those held-out predictions the router
        fits one slope for the pool's logits (how far LOCUS's order of the queries
        holds there, kept at 0 or above) and one offset per model, shrunk towards
        the pool's. It costs two more embeddings of each model, at ``fit`` and
        :meth:`add_models`. Off by default: on benchmarks the embedder never saw
        it helped on some and hurt on others (:ref:`router_calibration`).
    query_heads : "auto" or bool, default="auto"
        Fit each model's own logistic regression on the query encodings of its
        evaluations, and blend its logits with LOCUS's (:mod:`sklocus._query_heads`):
        the head's penalty is chosen per model and the blend for the pool, both on
        held-out halves of the evaluations, the blend on the queries the embedder
        held out of training where it knows them (LOCUS is in-sample on the
        others; see the embedder's ``validation_queries``); a model with fewer than 64
        evaluations (or fewer than 8 on either side of 0.5) keeps LOCUS's
        predictions alone. ``"auto"`` fits heads on pools
        of fewer than 100 models, where each model's evaluations are what a team
        has most of; it costs a few seconds per thousand evaluations of each
        model at ``fit`` and :meth:`add_models`. Needs a
        :class:`~sklocus.LocusEmbedder` (its query encoder encodes the queries).
        Measured in :doc:`/research/budget`.
    calibration_method : {"isotonic", "sigmoid"} or None, default=None
        Map the router's probabilities through a
        :class:`~sklocus.calibration.ProbabilityCalibrator` of this method, fitted
        at ``fit`` on the pool's own evaluations, each predicted from an
        embedding of the other half of its model's evaluations (and, with query
        heads, by heads fitted on the other fold), so that a predicted 0.8 comes
        true about 8 times in 10 (:ref:`calibrated_probabilities`). The map is
        increasing and the same for every model, so it leaves the likeliest model
        of each query as it was (up to the router's tie tolerance), and moves
        what thresholds, budgets and weights of cost choose. Costs two more
        embeddings of each model at ``fit``; models added later are mapped alike.
    exploration : {"thompson", "ucb"} or None, default=None
        How :meth:`predict` and :meth:`rank_models` explore, for a router that
        learns from the outcomes of its own routes (:meth:`partial_fit`), where
        a model is only ever judged on what it was sent
        (:ref:`exploring_while_learning`). Each embedding is uncertain by the
        Laplace approximation of its refinement, so each LOCUS logit has a
        standard deviation: large for a model with few evaluations, or on queries
        unlike them. ``"thompson"`` routes by logits drawn from their Gaussians,
        ``"ucb"`` by their upper bounds, ``exploration_strength`` standard
        deviations up. ``predict_correctness`` and the probabilities
        ``rank_models`` returns stay the best guesses; ``score`` routes without
        exploring. Needs a :class:`~sklocus.LocusEmbedder`.
    exploration_strength : float > 0, default=1.0
        Standard deviations of each logit that exploration adds (``"ucb"``) or
        draws with (``"thompson"``).
    random_state : int, RandomState instance or None, default=None
        Seeds ``"thompson"``'s draws: a router seeded alike routes alike, call
        after call.

    Attributes
    ----------
    classes_ : ndarray of shape (n_models,)
        The models: Y's column names, or 0..n_models-1 for an array Y.
    embedder_ : LocusEmbedder or FrozenEstimator
        The fitted embedder.
    embeddings_ : ndarray of shape (n_models, embedding_dim), float32
        One embedding per model, in the order of ``classes_``.
    cost_ : ndarray of shape (n_models,) or None
        Cost of each model, when given.
    groups_ : ndarray of shape (n_groups,) or None
        The query groups given to :meth:`fit`, in order of first appearance.
    group_offsets_ : ndarray of shape (n_models, n_groups), float32, or None
        Each model's logit offset for each group, added to LOCUS's prediction for
        queries whose group is given at prediction time.
    calibration_slope_ : float or None
        With ``calibrate=True``, the pool calibration's slope ``b``: predictions are
        ``model_offsets_ + b * logit`` on the logit scale.
    calibration_intercept_ : float or None
        The pool's offset, with which a new model's offset starts.
    model_offsets_ : ndarray of shape (n_models,), float32, or None
        Each model's calibrated offset.
    budget_curve_ : ndarray of shape (3, n_weights) or None
        With ``budget``: the weights of cost considered, and the mean cost and
        quality of each on held-out evaluations (:mod:`sklocus._budget`). A
        call's ``budget=`` chooses from it again.
    budget_cost_weight_ : float or None
        With ``budget``: the weight of cost the router routes by.
    head_weights_ : ndarray of shape (n_models, query_dim), float32, or None
        With query heads: each model's head, on the query encodings.
    head_biases_ : ndarray of shape (n_models,), float32, or None
        Each head's bias.
    head_blends_ : ndarray of shape (n_models,), float32, or None
        Each model's weight of its head against LOCUS on the logit scale:
        ``head_blend_``, or 0 for a model with no head.
    head_blend_ : float or None
        With query heads: the pool's weight of the heads, chosen in ``fit``
        and given to the heads of models added later, whichever models remain.
    probability_calibrator_ : ProbabilityCalibrator or None
        With ``calibration_method``: the map applied to every prediction.
    evaluation_queries_ : ndarray of shape (n_queries,), dtype object
        The distinct queries of the evaluations the router keeps, each model's
        embedding being computed from its own (:meth:`evaluations` lists them;
        :meth:`partial_fit` adds to them).
    evaluation_codes_ : ndarray of shape (n_evaluations,), int64
        The query of each kept evaluation, an index into
        ``evaluation_queries_``; model ``j``'s are
        ``evaluation_offsets_[j]:evaluation_offsets_[j + 1]``.
    evaluation_sums_ : ndarray of shape (n_evaluations,), float64
        The sum of the outcomes of each evaluation's model and query.
    evaluation_counts_ : ndarray of shape (n_evaluations,), int64
        How many outcomes that is; the evaluation's score is the mean.
    evaluation_offsets_ : ndarray of shape (n_models + 1,), int64
        Where each model's evaluations start.
    evaluation_groups_ : ndarray of shape (n_queries,), int64, or None
        With ``query_groups``: each kept query's index in ``groups_``, -1 for
        none.

    Examples
    --------
    >>> import pandas as pd
    >>> from sklocus import LocusEmbedder, LocusRouter
    >>> from sklocus.datasets import make_evaluations
    >>> from sklocus.evaluations import to_matrix
    >>> data = make_evaluations(n_models=8, n_queries=120, evals_per_model=None,
    ...                         random_state=0)
    >>> scores, queries = to_matrix(data.evaluation_sets)
    >>> Y = pd.DataFrame(scores.T, columns=data.model_names)
    >>> embedder = LocusEmbedder(query_encoder=data.encoder, embedding_dim=16,
    ...                          n_latents=4, max_epochs=2, epoch_size=256,
    ...                          random_state=0)
    >>> router = LocusRouter(embedder).fit(queries, Y)
    >>> router.predict(queries[:3]).shape
    (3,)
    """

    _parameter_constraints = {
        "embedder": [HasMethods(["fit", "transform"]), None],
        "cost_weight": [Interval(numbers.Real, 0, None, closed="left")],
        "min_probability": [Interval(numbers.Real, 0, 1, closed="both"), None],
        "budget": [Interval(numbers.Real, 0, None, closed="left"), None],
        "refine_steps": [Interval(numbers.Integral, 0, None, closed="left"), None],
        "group_shrinkage": [Interval(numbers.Real, 0, None, closed="neither")],
        "calibrate": ["boolean"],
        "query_heads": [StrOptions({"auto"}), "boolean"],
        "calibration_method": [StrOptions({"isotonic", "sigmoid"}), None],
        "exploration": [StrOptions({"thompson", "ucb"}), None],
        "exploration_strength": [Interval(numbers.Real, 0, None, closed="neither")],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        embedder=None,
        cost_weight=0.0,
        refine_steps=50,
        group_shrinkage=3.0,
        calibrate=False,
        min_probability=None,
        budget=None,
        query_heads="auto",
        calibration_method=None,
        exploration=None,
        exploration_strength=1.0,
        random_state=None,
    ):
        self.embedder = embedder
        self.cost_weight = cost_weight
        self.min_probability = min_probability
        self.budget = budget
        self.refine_steps = refine_steps
        self.group_shrinkage = group_shrinkage
        self.calibrate = calibrate
        self.query_heads = query_heads
        self.calibration_method = calibration_method
        self.exploration = exploration
        self.exploration_strength = exploration_strength
        self.random_state = random_state

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.string = True
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = False
        # Y is a score matrix, not class labels: without this, cross-validation
        # with an integer cv stratifies on Y, which fails on its NaNs.
        tags.estimator_type = None
        return tags

    def fit(self, X, Y, cost=None, query_groups=None):
        """Embed every model from its observed scores.

        Parameters
        ----------
        X : sequence of length n_queries
            Queries (texts or ids understood by the embedder's query encoder).
        Y : DataFrame or array-like of shape (n_queries, n_models)
            Scores in [0, 1]; NaN where a model was not evaluated on a query. A
            DataFrame's columns name the models; when its index holds the queries
            of X, its rows are matched to X by label, otherwise row by row.
        cost : array-like of shape (n_models,) or Series, default=None
            Cost of each model (parameters, price...), non-negative.
        query_groups : array-like of shape (n_queries,), default=None
            Each query's benchmark, subject or category (None or NaN for none).
            Each model then gets a shrunken logit offset per group, fitted on its
            own scores (``group_offsets_``), which :meth:`predict` and the other
            methods apply to queries whose groups they are given.

        Returns
        -------
        self
        """
        self._validate_params()
        queries = as_query_list(X)
        _check_distinct_queries(queries)
        if query_groups is not None:
            query_groups = check_query_groups(query_groups, len(queries))
        scores, names = _score_table(Y, queries)
        if not queries or not len(names):
            raise ValueError(
                f"got {len(queries)} queries and {len(names)} models (columns of Y); "
                "fitting a router needs at least one of each"
            )
        cost = check_cost(cost, names)
        observed = ~np.isnan(scores)
        empty = ~observed.any(axis=0)
        if empty.any():
            raise ValueError(
                f"model {names[int(np.argmax(empty))]!r} has no observed score in Y; "
                "every model needs at least one"
            )
        model_names = [str(name) for name in names]
        ragged = check_evaluation_sets(from_matrix(scores.T, queries), model_names)
        return self._fit(ragged, names, cost, (queries, scores), query_groups)

    def fit_evaluations(
        self, evaluation_sets, names=None, cost=None, query_groups=None
    ):
        """Embed every model from its evaluation set, as :meth:`fit` does from a table.

        The same router as ``fit(queries, Y)`` with ``Y`` the dense table of these
        sets, without building that table: what a pool read as evaluation sets or a
        long table (:func:`~sklocus.evaluations.from_long`) needs, however many
        models it holds. Only query heads, ``calibrate=True``,
        ``calibration_method`` and ``query_groups``, which compare each model's
        scores with its predictions query by query, build it.

        Read more in the :ref:`User Guide <routing>`.

        Parameters
        ----------
        evaluation_sets : sequence of mappings
            One mapping from query to score per model, as
            :class:`~sklocus.LocusEmbedder` takes them.
        names : sequence, default=None
            The models' names, distinct strings or integers; ``None`` numbers them
            0 to n_models - 1, as an array ``Y`` does.
        cost : array-like of shape (n_models,) or Series, default=None
            Cost of each model, non-negative; a Series is matched by name.
        query_groups : mapping, default=None
            The group of each query (a query missing from it has none), as
            :meth:`add_models` takes them.

        Returns
        -------
        self
        """
        self._validate_params()
        evaluation_sets = reusable(evaluation_sets)
        if names is None:
            ragged = check_evaluation_sets(evaluation_sets)
            names = np.arange(ragged.n_sets)
        else:
            checked = check_model_names(names)
            ragged = check_evaluation_sets(evaluation_sets, [str(n) for n in checked])
            names = np.empty(len(checked), dtype=object)
            names[:] = checked
        cost = check_cost(cost, names)
        table = groups = None
        if (
            self.calibrate
            or self.calibration_method is not None
            or query_groups is not None
            or self._heads_on(len(names))
        ):
            scores, queries = to_matrix(ragged)
            table = (queries, scores.T)
            if query_groups is not None:
                groups = self._groups_of(query_groups, queries, "fit_evaluations")
        return self._fit(ragged, names, cost, table, groups)

    def _fit(self, evaluation_sets, names, cost, table, query_groups):
        """Fit on checked sets; ``table`` is ``(queries, scores)``, dense, when needed.

        ``evaluation_sets`` is a :class:`~sklocus.evaluations.RaggedEvaluations`.
        ``scores`` is ``(n_queries, n_models)`` with NaN where unobserved; only
        calibration and query groups read it.
        """
        if self.min_probability is not None or self.budget is not None:
            _check_policy(self.cost_weight, self.min_probability, self.budget, cost)
        self._heads_on(len(names))  # refuses query_heads=True without a LOCUS
        self._check_exploration()
        embedder = LocusEmbedder() if self.embedder is None else self.embedder
        if isinstance(embedder, LocusEmbedder) and _is_fitted(embedder):
            warnings.warn(
                "LocusRouter clones and refits its embedder, so this fitted "
                "LocusEmbedder is trained again from scratch; wrap it in "
                "sklearn.frozen.FrozenEstimator to route with it as it is",
                UserWarning,
                stacklevel=2,
            )
        self.embedder_ = clone(embedder).fit(evaluation_sets, None)
        self.embeddings_ = self._embed(evaluation_sets)
        self._exploration_cache = None
        self._exploration_rng = check_random_state(self.random_state)
        self._set_kept(keep(evaluation_sets))
        self.evaluation_groups_ = None
        self.classes_ = names
        self.cost_ = cost
        for name in _CALIBRATION:
            setattr(self, name, None)
        halves = None  # each model embedded from each half, computed once
        if self.calibrate or self.calibration_method is not None:
            halves = self._half_embeddings(*table)
        if self.calibrate:
            queries, scores = table
            held = self._held_out_logits(queries, scores, halves)
            levels = self._levels(self.embeddings_, queries, scores)
            (
                self.calibration_slope_,
                self.calibration_intercept_,
                self.model_offsets_,
            ) = fit_calibration(*held, levels)
        for name in _HEADS:
            setattr(self, name, None)
        if self._heads_on(len(names)):
            queries, scores = table
            *heads, head_held_out, self.head_blend_ = self._fit_heads(
                self.embeddings_, self.model_offsets_, queries, scores
            )
            self.head_weights_, self.head_biases_, self.head_blends_ = heads
        self.probability_calibrator_ = None
        if self.calibration_method is not None:
            queries, scores = table
            held_out = self._held_out_matrix(queries, scores, halves)
            if self._heads() is not None:
                blends = self.head_blends_[None, :].astype(np.float64)
                blended = (1.0 - blends) * held_out + blends * head_held_out
                held_out = np.where(np.isnan(head_held_out), held_out, blended)
            usable = ~np.isnan(held_out)
            self.probability_calibrator_ = ProbabilityCalibrator(
                self.calibration_method
            ).fit(
                1.0 / (1.0 + np.exp(-np.where(usable, held_out, 0.0))),
                np.where(usable, scores, np.nan),
            )
        self.budget_curve_ = self.budget_cost_weight_ = None
        if self.budget is not None:
            self._choose_budget_weight(evaluation_sets, cost)
        self.groups_ = self.group_offsets_ = None
        if query_groups is not None:
            queries, scores = table
            self.groups_, self.group_offsets_ = self._group_offsets(
                self.embeddings_,
                self.model_offsets_,
                self._heads(),
                queries,
                scores,
                query_groups,
            )
            self.evaluation_groups_ = self._group_codes(
                self.evaluation_queries_, dict(zip(queries, query_groups))
            )
        return self

    # -- the evaluations kept ---------------------------------------------------

    def _kept(self):
        if not hasattr(self, _KEPT[0]):
            raise ValueError(
                "this router was fitted by a sklocus that kept no evaluations "
                "(before model file format 6), so it cannot learn from outcomes or "
                "change its pool: fit it again"
            )
        return KeptEvaluations(*(getattr(self, name) for name in _KEPT))

    def _set_kept(self, kept):
        for name, value in zip(_KEPT, kept):
            setattr(self, name, value)

    def _group_codes(self, queries, group_of):
        """Each query's index in ``groups_`` (-1 for none), from a mapping."""
        column = {label: j for j, label in enumerate(self.groups_.tolist())}
        return np.array(
            [column.get(group_of.get(query), -1) for query in queries.tolist()],
            dtype=np.int64,
        )

    def evaluations(self):
        """Return the evaluations the router embeds each model from, as a table.

        What :meth:`fit` and :meth:`add_models` were given and
        :meth:`partial_fit` added: one row per model and query, with the mean
        of the outcomes of that pair and their number.

        Returns
        -------
        pandas.DataFrame
            Columns ``model``, ``query``, ``score`` and ``n_outcomes``, models in
            the order of ``classes_``.
        """
        check_is_fitted(self, "embeddings_")
        kept = self._kept()
        return pd.DataFrame(
            {
                "model": self.classes_[kept.owners()],
                "query": kept.queries[kept.codes],
                "score": kept.sums / kept.counts,
                "n_outcomes": kept.counts,
            }
        )

    def _choose_budget_weight(self, evaluation_sets, cost):
        """Set ``budget_curve_`` and ``budget_cost_weight_``, as ``budget`` says."""

        def probabilities(embeddings, queries, seen):
            # Query heads, like the embeddings, from the seen half alone (under
            # the pool's blend): heads of every evaluation would have seen the
            # queries they are scored on.
            heads = self._heads()
            if heads is not None:
                scores, seen_queries = to_matrix(seen)
                heads = self._fit_heads(
                    embeddings, self.model_offsets_, seen_queries, scores.T
                )[:3]
            chunks = [
                self._base_probabilities(
                    embeddings,
                    self.model_offsets_,
                    queries[i : i + _QUERY_CHUNK],
                    heads,
                )
                for i in range(0, len(queries), _QUERY_CHUNK)
            ]
            return np.concatenate(chunks).T

        self.budget_curve_ = held_out_curve(
            check_evaluation_sets(evaluation_sets),
            self.embeddings_,
            self._embed,
            probabilities,
            cost,
        )
        self.budget_cost_weight_, met = weight_within(self.budget_curve_, self.budget)
        if not met:
            warnings.warn(
                f"no weight of cost kept the mean cost per query within "
                f"budget={self.budget!r} on held-out evaluations (the least was "
                f"{self.budget_curve_[1].min():.6g}); the router routes by the "
                f"weight of that least cost, {self.budget_cost_weight_:g}",
                UserWarning,
                stacklevel=3,
            )

    def _embed(self, evaluation_sets):
        """Embeddings of the pool's models, refined as ``refine_steps`` says."""
        embedder = self.embedder_
        inner = getattr(embedder, "estimator", embedder)  # FrozenEstimator's
        if self.refine_steps is not None and isinstance(inner, LocusEmbedder):
            # A shallow copy shares the fitted network and leaves the user's
            # embedder (perhaps frozen, perhaps shared) as it was.
            embedder = copy.copy(inner)
            embedder.refine_steps = self.refine_steps
        return np.asarray(embedder.transform(evaluation_sets), dtype=np.float32)

    def _half_embeddings(self, queries, scores):
        """Each model embedded from each half of its evaluations.

        Returns ``(half, embeddings)``: :func:`~sklocus._calibration.split_halves`'
        assignment, and for halves 0 and 1 an ``(n_models, embedding_dim)`` array
        (zeros for a model without evaluations in both halves).
        """
        keys = [query_sort_key(query) for query in queries]
        rank = np.empty(len(keys), dtype=np.int64)
        rank[sorted(range(len(keys)), key=keys.__getitem__)] = np.arange(len(keys))
        half = split_halves(~np.isnan(scores), rank)
        both = in_both_halves(half)
        embeddings = []
        for h in (0, 1):
            sets = [
                {queries[i]: scores[i, j] for i in np.flatnonzero(half[:, j] == h)}
                for j in np.flatnonzero(both)
            ]
            z = np.zeros((scores.shape[1], self.embeddings_.shape[1]), np.float32)
            if sets:
                z[both] = self._embed(sets)
            embeddings.append(z)
        return half, embeddings

    def _held_out_logits(self, queries, scores, halves=None):
        """Each model's evaluations predicted from an embedding of the other half.

        What the pool calibration is fitted on (:mod:`sklocus._calibration`).
        ``halves`` is :meth:`_half_embeddings`' result, computed when not given.
        """
        if halves is None:
            halves = self._half_embeddings(queries, scores)
        half, embeddings = halves

        def predict(h, rows):
            chunk = [queries[i] for i in rows]
            return self.embedder_.predict_correctness(embeddings[h], chunk).T

        return held_out_pairs(predict, scores, half, _QUERY_CHUNK)

    def _held_out_matrix(self, queries, scores, halves):
        """LOCUS's held-out logits, ``(n_queries, n_models)``, NaN where none.

        Each observed pair is predicted from the embedding of the other half of
        its model's evaluations (``halves``, :meth:`_half_embeddings`' result),
        with the pool calibration's offsets when fitted: what
        ``calibration_method``'s map is fitted on.
        """
        half, embeddings = halves
        both = in_both_halves(half)
        out = np.full(scores.shape, np.nan)
        for start in range(0, len(queries), _QUERY_CHUNK):
            rows = slice(start, start + _QUERY_CHUNK)
            chunk = queries[rows]
            for h in (0, 1):
                found = self._base_probabilities(
                    embeddings[h], self.model_offsets_, chunk
                )
                wanted = (half[rows] == 1 - h) & both[None, :]
                out[rows][wanted] = logits(found)[wanted]
        return out

    def _levels(self, embeddings, queries, scores):
        """Each model's mean LOCUS logit on the queries it was evaluated on."""
        total = np.zeros(scores.shape[1])
        observed = ~np.isnan(scores)
        for start in range(0, len(queries), _QUERY_CHUNK):
            chunk = queries[start : start + _QUERY_CHUNK]
            found = logits(self.embedder_.predict_correctness(embeddings, chunk).T)
            seen = observed[start : start + len(chunk)]
            total += np.where(seen, found, 0.0).sum(axis=0)
        return total / np.maximum(observed.sum(axis=0), 1)

    def _check_exploration(self):
        if self.exploration is None:
            return
        embedder = self.embedder if self.embedder is not None else LocusEmbedder()
        if not isinstance(getattr(embedder, "estimator", embedder), LocusEmbedder):
            raise ValueError(
                f"exploration={self.exploration!r} needs a LocusEmbedder, whose "
                f"embeddings it knows the uncertainty of; got a "
                f"{type(embedder).__name__}"
            )

    def _inner_embedder(self):
        """Return the fitted LocusEmbedder (unwrapped from FrozenEstimator), or None."""
        inner = getattr(self.embedder_, "estimator", self.embedder_)
        return inner if isinstance(inner, LocusEmbedder) else None

    def _heads_on(self, n_models):
        """Whether ``fit`` fits query heads for a pool of ``n_models``."""
        if self.query_heads == "auto":
            wanted = n_models < _SMALL_POOL
        else:
            wanted = bool(self.query_heads)
        embedder = self.embedder if self.embedder is not None else LocusEmbedder()
        usable = isinstance(getattr(embedder, "estimator", embedder), LocusEmbedder)
        if wanted and not usable and self.query_heads is True:
            raise ValueError(
                "query_heads=True needs a LocusEmbedder, whose query encoder "
                f"encodes the queries; got a {type(embedder).__name__}"
            )
        return wanted and usable

    def _heads(self):
        """``(weights, biases, blends)`` of the pool's query heads, or None."""
        if getattr(self, "head_weights_", None) is None:
            return None
        return self.head_weights_, self.head_biases_, self.head_blends_

    def _fit_heads(self, embeddings, model_offsets, queries, scores):
        """Query heads of ``embeddings``' models, on their scores (:mod:`_query_heads`).

        The pool's blend is chosen when the router has none yet (in ``fit``) and
        kept for models added later.
        """
        inner = self._inner_embedder()
        vectors = np.concatenate(
            [
                inner._encode(queries[i : i + _QUERY_CHUNK])
                for i in range(0, len(queries), _QUERY_CHUNK)
            ]
        )
        locus = self._locus_logits(embeddings, model_offsets, vectors)
        keys = [query_sort_key(query) for query in queries]
        order = np.array(sorted(range(len(keys)), key=keys.__getitem__), dtype=int)
        observed = ~np.isnan(scores)

        def rows_of(j):
            return order[observed[order, j]]

        blend = getattr(self, "head_blend_", None)
        blend_on = None
        if blend is None:
            blend_on = self._unseen_logits(queries, scores, vectors, model_offsets)
        return fit_heads(vectors, scores, locus, rows_of, blend, blend_on)

    def _unseen_logits(self, queries, scores, vectors, model_offsets):
        """LOCUS's logits on the queries its network never trained on, or None.

        Returns ``(unseen, logits)``: which of ``queries`` are the embedder's
        ``validation_queries_``, and each model's logits on them from an
        embedding of its other evaluations (NaN elsewhere, and for a model with
        no other evaluation); None when the embedder has none of them.
        """
        inner = self._inner_embedder()
        held_out = set(getattr(inner, "validation_queries_", None) or ())
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
        found[np.ix_(rows, np.flatnonzero(embedded))] = self._locus_logits(
            self._embed([s for s in sets if s]), offsets, vectors[rows]
        )
        return unseen, found

    def _locus_logits(self, embeddings, model_offsets, vectors):
        """LOCUS's logits ``(n_queries, n_models)`` on encoded queries, with offsets."""
        inner = self._inner_embedder()
        embeddings = inner._check_embeddings(embeddings)
        found = np.empty((len(vectors), len(embeddings)))
        for start in range(0, len(vectors), _QUERY_CHUNK):
            rows = slice(start, start + _QUERY_CHUNK)
            probabilities = inner._predict(embeddings, vectors[rows]).T
            if model_offsets is not None:
                probabilities = apply_calibration(
                    probabilities, self.calibration_slope_, model_offsets
                )
            found[rows] = logits(probabilities)
        return found

    def _base_probabilities(
        self, embeddings, model_offsets, queries, heads=None, explore=False
    ):
        """LOCUS's P(correct), ``(n_queries, n_models)``, calibrated if fitted so.

        With ``heads`` (``(weights, biases, blends)`` of ``embeddings``' models),
        blended with the query heads'. With ``explore`` (``embeddings`` being the
        pool's), returns ``(probabilities, explored)``: the second as routed by
        ``exploration``, LOCUS's logits moved before the rest applies.
        """
        inner = self._inner_embedder() if heads is not None or explore else None
        if inner is None:
            probabilities = self.embedder_.predict_correctness(embeddings, queries).T
        else:
            if not len(queries):
                empty = np.empty((0, len(embeddings)), dtype=np.float32)
                return (empty, empty) if explore else empty
            vectors = inner._encode(as_query_list(queries))
            embeddings = inner._check_embeddings(embeddings)
            probabilities = inner._predict(embeddings, vectors).T

        def adjusted(probabilities):
            if model_offsets is not None:
                probabilities = apply_calibration(
                    probabilities, self.calibration_slope_, model_offsets
                )
            if heads is not None:
                probabilities = apply_heads(probabilities, vectors, *heads)
            calibrator = getattr(self, "probability_calibrator_", None)
            if calibrator is not None:
                probabilities = calibrator.predict(probabilities)
            return probabilities

        if explore:
            explored = self._explored(probabilities, vectors)
            return adjusted(probabilities), adjusted(explored)
        return adjusted(probabilities)

    # -- exploring ----------------------------------------------------------------

    def _explored(self, probabilities, vectors):
        """Move LOCUS's probabilities as ``exploration`` says (nn.uncertainty)."""
        inner = self._inner_embedder()
        predictor = inner.net_.module_.predictor
        with torch.no_grad():
            projected = predictor.project_query(
                torch.as_tensor(vectors, device=inner.device_)
            )
            z = torch.as_tensor(
                self.embeddings_ * np.float32(inner.embedding_scale_),
                device=inner.device_,
            )
        stds = logit_stds(predictor, z, self._exploration_factors(), projected)
        moves = self.exploration_strength * stds.cpu().numpy().astype(np.float64)
        if self.exploration == "thompson":
            moves = moves * self._draws().standard_normal(moves.shape)
        found = logits(probabilities) + moves
        return (1.0 / (1.0 + np.exp(-found))).astype(np.float32)

    def _draws(self):
        """Return the random state of ``"thompson"``'s draws, made on first use.

        Made at ``fit`` (and once for a loaded router); copies of the router
        share it, so a served router's snapshots draw on, not afresh.
        """
        rng = getattr(self, "_exploration_rng", None)
        if rng is None:
            rng = self._exploration_rng = check_random_state(self.random_state)
        return rng

    def _exploration_cached(self):
        """Whether the pool's exploration factors are computed and current."""
        cache = getattr(self, "_exploration_cache", None)
        return (
            getattr(self, "exploration", None) is not None
            and cache is not None
            and cache[0] is self.embeddings_
        )

    def _exploration_factors(self):
        """Each model's :func:`~sklocus.nn.uncertainty.posterior_factors`, cached."""
        cache = getattr(self, "_exploration_cache", None)
        if not self._exploration_cached():
            models = np.arange(len(self.classes_))
            factors = self._posterior_factors(
                self.embeddings_, self._kept().ragged(models)[0]
            )
            cache = self._exploration_cache = (self.embeddings_, factors)
        return cache[1]

    def _posterior_factors(self, embeddings, ragged):
        """Laplace covariance factors of ``embeddings``, refined on ``ragged``."""
        inner = self._inner_embedder()
        predictor = inner.net_.module_.predictor
        used, codes = np.unique(ragged.query_codes, return_inverse=True)
        vectors = inner._encode([ragged.queries[i] for i in used.tolist()])
        with torch.no_grad():
            projected = predictor.project_query(
                torch.as_tensor(vectors, device=inner.device_)
            )
        bounds = ragged.offsets.tolist()
        rows = [
            torch.as_tensor(codes[a:b], device=inner.device_)
            for a, b in zip(bounds[:-1], bounds[1:])
        ]
        z = torch.as_tensor(
            embeddings * np.float32(inner.embedding_scale_), device=inner.device_
        )
        return posterior_factors(predictor, z, projected, rows, inner.refine_penalty)

    def _group_offsets(
        self, embeddings, model_offsets, heads, queries, scores, query_groups
    ):
        """Fit per-group offsets of ``embeddings``' models on their own scores."""
        base = np.empty(scores.shape)
        for start in range(0, len(queries), _QUERY_CHUNK):
            chunk = queries[start : start + _QUERY_CHUNK]
            probabilities = self._base_probabilities(
                embeddings, model_offsets, chunk, heads
            )
            base[start : start + len(chunk)] = logits(probabilities)
        return fit_group_offsets(base, scores, query_groups, self.group_shrinkage)

    # -- scoring queries ----------------------------------------------------------

    def _chunks(self, X, query_groups=None, explore=False):
        """Yield ``(start, probabilities, routed)`` for chunks of the queries.

        ``routed`` are the probabilities to route by: ``probabilities``
        themselves unless ``explore`` and the router explores.
        """
        queries = as_query_list(X)
        if query_groups is not None:
            query_groups = check_query_groups(query_groups, len(queries))
        corrected = query_groups is not None and self.group_offsets_ is not None
        explore = explore and getattr(self, "exploration", None) is not None
        if explore:
            self._check_exploration()
        for start in range(0, len(queries), _QUERY_CHUNK):
            chunk = queries[start : start + _QUERY_CHUNK]
            found = self._base_probabilities(
                self.embeddings_, self.model_offsets_, chunk, self._heads(), explore
            )
            found = found if explore else (found,)
            if corrected:
                found = [
                    apply_group_offsets(
                        probabilities,
                        query_groups[start : start + len(chunk)],
                        self.groups_,
                        self.group_offsets_,
                    )
                    for probabilities in found
                ]
            yield start, found[0], found[-1]

    def predict_correctness(self, X, query_groups=None):
        """Probability that each model answers each query correctly.

        Parameters
        ----------
        X : sequence of length n_queries
            Queries.
        query_groups : array-like of shape (n_queries,), default=None
            The queries' groups, when the router was fitted with
            ``query_groups``: each model's offset for a query's group is added
            to the logit of its probability. Groups not seen in ``fit``, and
            None, get no offset; so does every query when this is None.

        Returns
        -------
        ndarray of shape (n_queries, n_models), float32
            Columns in the order of ``classes_``.
        """
        check_is_fitted(self, "embeddings_")
        queries = as_query_list(X)
        out = np.empty((len(queries), len(self.classes_)), dtype=np.float32)
        for start, probabilities, _ in self._chunks(queries, query_groups):
            out[start : start + len(probabilities)] = probabilities
        return out

    def predict_proba(self, X, query_groups=None):
        """Each query's correctness probabilities, normalised to sum to one.

        These are not probabilities that a model is *the* best; they are
        ``predict_correctness(X)`` rows divided by their sum, which keeps the
        ranking of models and lets scikit-learn tools that expect
        ``predict_proba`` work.

        Parameters
        ----------
        X : sequence of length n_queries
            Queries.
        query_groups : array-like of shape (n_queries,), default=None
            The queries' groups (see :meth:`predict_correctness`).

        Returns
        -------
        ndarray of shape (n_queries, n_models)
        """
        probabilities = self.predict_correctness(X, query_groups).astype(np.float64)
        return probabilities / probabilities.sum(axis=1, keepdims=True)

    def _select(self, names, verb):
        """Mask of the models named; every name must be a model, and some must stay."""
        mask = np.zeros(len(self.classes_), dtype=bool)
        if names is None:
            return mask
        if isinstance(names, str) or not np.iterable(names):
            names = [names]
        for name in names:
            matches = self.classes_ == name
            if not matches.any():
                raise ValueError(
                    f"cannot {verb} {name!r}: the router has no such model"
                )
            mask |= matches
        if mask.all():
            raise ValueError(f"cannot {verb} every model; leave at least one")
        return mask

    def _policy(self, cost_weight, min_probability, budget=None):
        """Return the routing policy of a call: ``(cost_weight, min_probability)``.

        A call's own setting replaces the router's policy; unset, the router's
        holds. A budget routes by the weight it chooses from ``budget_curve_``.
        """
        given = [
            f"{name}={value!r}"
            for name, value in policies_given(
                cost_weight, min_probability, budget
            ).items()
        ]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)}: give one policy per call")
        if budget is not None:
            _check_number(budget, "budget", high=np.inf)
            if self.budget_curve_ is None:
                raise ValueError(
                    f"budget={budget!r}: a call chooses its weight of cost from the "
                    "held-out curve of a router fitted with a budget, and this one "
                    "was fitted without"
                )
            weight, _ = weight_within(self.budget_curve_, budget)
            return weight, None
        if cost_weight is not None:
            _check_number(cost_weight, "cost_weight", high=np.inf)
            if cost_weight and self.cost_ is None:
                raise ValueError(
                    f"cost_weight={cost_weight!r} needs costs, but the router was "
                    "fitted without them"
                )
            return cost_weight, None
        if min_probability is not None:
            _check_number(min_probability, "min_probability", high=1)
            _check_policy(0, min_probability, None, self.cost_)
            return 0, min_probability
        if self.budget_cost_weight_ is not None:
            return self.budget_cost_weight_, None
        return self.cost_weight, self.min_probability

    def _utility(self, probabilities, cost_weight, min_probability=None):
        """Utilities of ``(n_queries, n_models)`` probabilities, as routed."""
        if min_probability is None and (self.cost_ is None or cost_weight == 0):
            return probabilities
        cost = np.broadcast_to(self.cost_[:, None], probabilities.T.shape)
        if min_probability is not None:
            return threshold_utilities(probabilities.T, cost, min_probability).T
        return cost_utilities(probabilities.T, cost, cost_weight).T

    def predict(
        self,
        X,
        exclude=None,
        query_groups=None,
        *,
        cost_weight=None,
        min_probability=None,
        budget=None,
        explore=True,
    ):
        """Choose a model for each query.

        Parameters
        ----------
        X : sequence of length n_queries
            Queries.
        exclude : sequence of model names, default=None
            Models that are unavailable; each query goes to the best of the others.
        query_groups : array-like of shape (n_queries,), default=None
            The queries' groups (see :meth:`predict_correctness`).
        cost_weight, min_probability, budget : float, default=None
            The policy of this call only (see :meth:`rank_models`).
        explore : bool, default=True
            Route as the router's ``exploration`` says; False routes by the best
            guesses (see :meth:`rank_models`).

        Returns
        -------
        ndarray of shape (n_queries,)
            The chosen model of each query (an entry of ``classes_``). Ties, models
            whose utilities lie within 1e-6 of the best, go to the one listed first
            in ``classes_``.
        """
        models, _ = self.rank_models(
            X,
            k=1,
            exclude=exclude,
            cost_weight=cost_weight,
            min_probability=min_probability,
            budget=budget,
            query_groups=query_groups,
            explore=explore,
        )
        return models[:, 0]

    def rank_models(
        self,
        X,
        k=3,
        exclude=None,
        *,
        cost_weight=None,
        min_probability=None,
        budget=None,
        query_groups=None,
        explore=True,
    ):
        """List the ``k`` best models for each query, best first, with probabilities.

        Models are ranked as :meth:`predict` chooses them, so the first is
        ``predict``'s choice: by probability of a correct answer less the weighted
        cost; or, with ``min_probability``, the models that reach it by cost (then
        probability) above the others by probability.

        Parameters
        ----------
        X : sequence of length n_queries
            Queries.
        k : int, default=3
            Models to list per query; at most the number of models not excluded.
        exclude : sequence of model names, default=None
            Models that are unavailable; they are never listed.
        cost_weight : float, default=None
            The weight of cost for this call only, in place of the router's policy;
            ``None`` keeps the router's. A served router takes it per request this
            way, without changing the shared estimator.
        min_probability : float in [0, 1], default=None
            A threshold for this call only, in place of the router's policy (see
            the router's ``min_probability``).
        budget : float, default=None
            A mean cost per query for this call only, in place of the router's
            policy: the weight of cost is chosen from ``budget_curve_``, so the
            router must have been fitted with a ``budget``. One of
            ``cost_weight``, ``min_probability`` and ``budget`` per call.
        query_groups : array-like of shape (n_queries,), default=None
            The queries' groups (see :meth:`predict_correctness`).
        explore : bool, default=True
            With the router's ``exploration``, rank by its draws (or upper
            bounds) of the probabilities, not by their best guesses; the
            probabilities returned are the best guesses all the same. Without
            ``exploration`` this changes nothing.

        Returns
        -------
        models : ndarray of shape (n_queries, k)
            Entries of ``classes_``, best first.
        probabilities : ndarray of shape (n_queries, k), float32
            Probability that each listed model answers the query correctly.

        Examples
        --------
        >>> import pandas as pd
        >>> from sklearn.frozen import FrozenEstimator
        >>> from sklocus import LocusEmbedder, LocusRouter
        >>> from sklocus.datasets import make_evaluations
        >>> from sklocus.evaluations import to_matrix
        >>> data = make_evaluations(n_models=6, n_queries=80, evals_per_model=None,
        ...                         random_state=0)
        >>> scores, queries = to_matrix(data.evaluation_sets)
        >>> embedder = LocusEmbedder(query_encoder=data.encoder, embedding_dim=16,
        ...                          n_latents=4, max_epochs=1, epoch_size=128,
        ...                          random_state=0).fit(data.evaluation_sets)
        >>> Y = pd.DataFrame(scores.T, columns=data.model_names)
        >>> router = LocusRouter(FrozenEstimator(embedder)).fit(queries, Y)
        >>> models, probabilities = router.rank_models(queries[:2], k=2)
        >>> models.shape, probabilities.shape
        ((2, 2), (2, 2))
        """
        check_is_fitted(self, "embeddings_")
        cost_weight, min_probability = self._policy(
            cost_weight, min_probability, budget
        )
        excluded = self._select(exclude, "exclude")
        available = int((~excluded).sum())
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"k={k!r} must be a positive integer")
        if k > available:
            raise ValueError(
                f"k={k} is more than the {available} models available to route to"
            )
        queries = as_query_list(X)
        ranked = np.empty((len(queries), k), dtype=np.int64)
        probabilities = np.empty((len(queries), k), dtype=np.float32)
        for start, chunk, routed in self._chunks(queries, query_groups, explore):
            # An excluded model neither qualifies for a threshold nor is chosen.
            routable = np.where(excluded, -np.inf, routed.astype(np.float64))
            utility = self._utility(routable, cost_weight, min_probability)
            # The first is best_models' choice (near-ties to the model listed
            # first in classes_): lift it above the rest before sorting.
            first = best_models(utility.T)
            utility[np.arange(len(utility)), first] = np.inf
            order = np.argsort(-utility, axis=1, kind="stable")[:, :k]
            rows = slice(start, start + len(chunk))
            ranked[rows] = order
            probabilities[rows] = np.take_along_axis(chunk, order, axis=1)
        return self.classes_[ranked], probabilities

    def score(self, X, Y, sample_weight=None, query_groups=None):
        """Routing accuracy: the mean observed score of the chosen model.

        Each query is routed with :meth:`predict`; queries whose chosen model has no
        observed score in ``Y`` are left out of the mean.

        Parameters
        ----------
        X : sequence of length n_queries
            Queries.
        Y : DataFrame or array-like of shape (n_queries, n_models)
            Observed scores, NaN where unobserved, columns as ``classes_``; rows
            matched to X as in :meth:`fit`.
        sample_weight : array-like of shape (n_queries,), default=None
            Weights of the queries.
        query_groups : array-like of shape (n_queries,), default=None
            The queries' groups (see :meth:`predict_correctness`).

        Returns
        -------
        float
        """
        check_is_fitted(self, "embeddings_")
        queries = as_query_list(X)
        scores, _ = _score_table(Y, queries, self.classes_)
        # Routed as predict routes without exploring: by the utilities of the
        # router's policy, which routing_accuracy chooses from as predict does.
        cost_weight, min_probability = self._policy(None, None)
        utilities = np.empty(scores.shape)
        for start, probabilities, _ in self._chunks(queries, query_groups):
            rows = slice(start, start + len(probabilities))
            utilities[rows] = self._utility(
                probabilities.astype(np.float64), cost_weight, min_probability
            )
        return routing_accuracy(scores.T, utilities.T, sample_weight=sample_weight)

    def _correctness_pairs(self, X, Y):
        """Observed scores of Y and predicted probabilities, as two matrices.

        What the scorers of :func:`sklocus.metrics.get_scorer` measure.
        """
        check_is_fitted(self, "embeddings_")
        queries = as_query_list(X)
        if Y is None:
            raise ValueError("scoring a router's correctness needs Y, the scores")
        scores, _ = _score_table(Y, queries, self.classes_)
        return scores, self.predict_correctness(queries)

    # -- changing the pool ------------------------------------------------------

    def add_models(self, evaluation_sets, names, cost=None, query_groups=None):
        """Onboard models: embed them as ``fit`` does, with no training of LOCUS.

        New embeddings are refined as ``refine_steps`` says, and new models get
        query heads (under the pool's blend) when the router has them; existing
        embeddings and heads do not change.

        Parameters
        ----------
        evaluation_sets : sequence of mappings
            One mapping from query to score per new model.
        names : sequence
            Their names, new to the router and distinct.
        cost : array-like of shape (n_new,), default=None
            Their costs; required when the router has costs, refused otherwise.
        query_groups : mapping, default=None
            The group of each query of the new sets (a query missing from it has
            none), when the router was fitted with ``query_groups``: the new
            models' per-group offsets are fitted on their scores as in
            :meth:`fit`. Without it they get no offsets (LOCUS alone).

        Returns
        -------
        self
        """
        check_is_fitted(self, "embeddings_")
        names = check_model_names(names)
        ragged = check_evaluation_sets(
            reusable(evaluation_sets), [str(name) for name in names]
        )
        if self.classes_.dtype != object and not all(
            isinstance(name, numbers.Integral) for name in names
        ):
            raise TypeError(
                "the router's models are numbered (it was fitted on an array Y); name "
                "new models with integers"
            )
        known = set(self.classes_.tolist())
        for name in names:
            if name in known:
                raise ValueError(f"model {name!r} is already in the router")
        if (cost is None) != (self.cost_ is None):
            raise ValueError(
                "the router was fitted with costs; give a cost for each new model"
                if cost is None
                else "the router was fitted without costs; leave cost out"
            )
        cost = check_cost(cost, names)
        if query_groups is not None and self.group_offsets_ is None:
            raise ValueError(
                "the router was fitted without query_groups; leave query_groups out"
            )
        if query_groups is not None:
            self._groups_of(query_groups, ragged.queries, "add_models")
        kept = append_models(self._kept(), ragged)
        groups = self._extended_groups(kept, query_groups)
        group_of = None
        if query_groups is not None:
            # The groups kept: a query the router knows keeps its own.
            added = np.arange(len(self.classes_), len(self.classes_) + len(names))
            group_of = self._group_map_of(groups, *kept.ragged(added))
        rows = self._model_rows(ragged, group_of)
        # Everything is computed before anything changes: a failure leaves the
        # router as it was.
        n_models = len(self.classes_)
        self._set_rows(np.arange(n_models, n_models + len(names)), rows)
        self._set_kept(kept)
        self.evaluation_groups_ = groups
        self.classes_ = np.concatenate(
            [self.classes_, np.asarray(names, dtype=self.classes_.dtype)]
        )
        if cost is not None:
            self.cost_ = np.concatenate([self.cost_, cost])
        return self

    def partial_fit(self, X, Y, query_groups=None):
        """Learn from more outcomes: join them to their models' evaluations.

        Each model with an outcome in ``Y`` is embedded again, as :meth:`fit`
        embeds it, from all its evaluations: those it had and the new ones, a
        repeated query counting once with the mean of its outcomes
        (:func:`~sklocus.evaluations.from_long` with ``duplicates="mean"``).
        Its calibration offset, query head and group offsets are fitted again
        the same way; the other models, and what :meth:`fit` chose for the
        whole pool (the embedder, the calibration slope, the heads' blend, the
        probability calibrator, the budget's curve), do not change. A model's
        embedding is then the one a router fitted on all its evaluations with
        this embedder (frozen) gives it, up to float32 rounding; so is
        everything else of it when the pool-wide choices are the same.

        On a router not yet fitted, ``partial_fit`` is :meth:`fit`.

        Read more in the :ref:`User Guide <learning_from_outcomes>`.

        Parameters
        ----------
        X : sequence of length n_queries
            Queries, distinct; new queries are welcome.
        Y : DataFrame or array-like of shape (n_queries, n_columns)
            Outcomes in [0, 1], NaN where a model has none: a DataFrame's columns
            name some of the router's models, an array's are all of them in the
            order of ``classes_``. Rows are matched to X as in :meth:`fit`.
        query_groups : array-like of shape (n_queries,), default=None
            The queries' groups, for a router fitted with ``query_groups``: new
            queries take them; a query the router knows keeps its group, and
            giving it another is an error.

        Returns
        -------
        self
        """
        if not _is_fitted(self):
            return self.fit(X, Y, query_groups=query_groups)
        queries = as_query_list(X)
        _check_distinct_queries(queries)
        if query_groups is not None:
            if self.group_offsets_ is None:
                raise ValueError(
                    "the router was fitted without query_groups; leave query_groups out"
                )
            query_groups = check_query_groups(query_groups, len(queries))
        if isinstance(Y, pd.DataFrame):
            scores, names = _score_table(Y, queries)
            column = {name: j for j, name in enumerate(self.classes_.tolist())}
            for name in names:
                if name not in column:
                    raise ValueError(
                        f"Y has outcomes of model {shown(name)}, which the router "
                        "does not have; add it with add_models"
                    )
            models = np.array([column[name] for name in names], dtype=np.int64)
        else:
            scores, _ = _score_table(Y, queries, self.classes_)
            models = np.arange(len(self.classes_))
        rows, columns = np.nonzero(~np.isnan(scores))
        group_of = None
        if query_groups is not None:
            group_of = {q: g for q, g in zip(queries, query_groups) if g is not None}
        return self._learn(
            models[columns], [queries[i] for i in rows], scores[rows, columns], group_of
        )

    def _learn(self, models, queries, scores, group_of=None, check_groups=True):
        """Join checked outcomes (model indices, queries, scores) and re-embed.

        ``group_of`` maps queries to groups; with ``check_groups``, giving a
        known query another group than its own is an error, else it is ignored.
        """
        if not len(models):
            return self
        kept = add_outcomes(self._kept(), models, queries, scores)
        groups = self._extended_groups(kept, group_of, check=check_groups)
        touched = np.unique(models)
        ragged, used = kept.ragged(touched)
        rows = self._model_rows(ragged, self._group_map_of(groups, ragged, used))
        self._set_rows(touched, rows)
        self._set_kept(kept)
        self.evaluation_groups_ = groups
        return self

    def _extended_groups(self, kept, group_of, check=False):
        """``evaluation_groups_`` for ``kept``, whose new queries come last.

        New queries take their groups from ``group_of``; with ``check``, a known
        query given another group than its own is an error.
        """
        old = self.evaluation_groups_
        if old is None:
            return None
        group_of = {} if group_of is None else group_of
        new = self._group_codes(kept.queries[len(old) :], group_of)
        if check and len(group_of):
            known = kept.queries[: len(old)].tolist()
            column = {label: j for j, label in enumerate(self.groups_.tolist())}
            for query, code in zip(known, old.tolist()):
                if query in group_of:
                    given = column.get(group_of[query], -1)
                    if given != code:
                        had = self.groups_[code] if code >= 0 else None
                        raise ValueError(
                            f"query {shown(query)} is in group {shown(had)}, not "
                            f"{shown(group_of[query])}; a query keeps its group"
                        )
        return np.concatenate([old, new])

    def _group_map_of(self, groups, ragged, used):
        """Map each query of ``ragged`` that has a group to it (None: no groups).

        ``used`` are the queries' indices in ``groups`` (``evaluation_groups_``
        of the kept evaluations).
        """
        if groups is None:
            return None
        return {
            query: self.groups_[g]
            for query, g in zip(ragged.queries, groups[used].tolist())
            if g >= 0
        }

    def _model_rows(self, ragged, query_groups):
        """Compute what the router holds per model, for the sets of ``ragged``.

        Returns ``(embeddings, model_offsets, heads, group_offsets)``, each None
        where the router has none: embedded as ``refine_steps`` says, with
        calibration offsets under the pool's slope, query heads under the pool's
        blend and offsets of the router's groups (zeros when ``query_groups``, a
        mapping from query to group, is None).
        """
        embeddings = self._embed(ragged)
        model_offsets = heads = group_offsets = None
        if self.model_offsets_ is not None:
            model_offsets = self._new_calibration_offsets(embeddings, ragged)
        if self._heads() is not None:
            scores, queries = to_matrix(ragged)
            heads = self._fit_heads(embeddings, model_offsets, queries, scores.T)[:3]
        if self.group_offsets_ is not None:
            group_offsets = np.zeros((ragged.n_sets, len(self.groups_)), np.float32)
            if query_groups is not None:
                group_offsets = self._new_model_offsets(
                    embeddings, model_offsets, heads, ragged, query_groups
                )
        factors = None
        if self._exploration_cached():
            # Kept up to date here, not at the next route, which would wait.
            factors = self._posterior_factors(embeddings, ragged)
        return embeddings, model_offsets, heads, group_offsets, factors

    def _set_rows(self, indices, rows):
        """Put :meth:`_model_rows`' values at ``indices`` of new arrays.

        Indices past the end append. The arrays are replaced, never written
        into: a served router's snapshots share them.
        """
        embeddings, model_offsets, heads, group_offsets, factors = rows

        def placed(old, new):
            n = max(len(old), int(indices.max()) + 1)
            if isinstance(old, torch.Tensor):
                out = old.new_empty((n, *old.shape[1:]))
            else:
                out = np.empty((n, *old.shape[1:]), dtype=old.dtype)
            out[: len(old)] = old
            out[indices] = new
            return out

        if factors is not None:
            cached = placed(self._exploration_cache[1], factors)
        self.embeddings_ = placed(self.embeddings_, embeddings)
        if factors is not None:
            self._exploration_cache = (self.embeddings_, cached)
        if model_offsets is not None:
            self.model_offsets_ = placed(self.model_offsets_, model_offsets)
        if heads is not None:
            self.head_weights_, self.head_biases_, self.head_blends_ = (
                placed(old, new) for old, new in zip(self._heads(), heads)
            )
        if group_offsets is not None:
            self.group_offsets_ = placed(self.group_offsets_, group_offsets)

    def _new_calibration_offsets(self, embeddings, evaluation_sets):
        """Calibration offsets of new models under the pool's fitted slope."""
        scores, queries = to_matrix(evaluation_sets)
        held = self._held_out_logits(queries, scores.T)
        return fit_new_offsets(
            *held,
            self._levels(embeddings, queries, scores.T),
            self.calibration_slope_,
            self.calibration_intercept_,
        )

    def _new_model_offsets(
        self, embeddings, model_offsets, heads, evaluation_sets, query_groups
    ):
        """Offsets for the router's groups of new models, from a query-to-group map."""
        scores, queries = to_matrix(evaluation_sets)
        groups = self._groups_of(query_groups, queries, "add_models")
        # Only the router's groups get offsets; others have nothing to apply to.
        known = set(self.groups_.tolist())
        groups = np.array([g if g in known else None for g in groups], dtype=object)
        fitted_groups, offsets = self._group_offsets(
            embeddings, model_offsets, heads, queries, scores.T, groups
        )
        column = {label: j for j, label in enumerate(self.groups_)}
        out = np.zeros((len(scores), len(self.groups_)), dtype=np.float32)
        for j, label in enumerate(fitted_groups):
            out[:, column[label]] = offsets[:, j]
        return out

    @staticmethod
    def _groups_of(query_groups, queries, method):
        """Each query's group from a mapping, checked as ``fit``'s are."""
        if not hasattr(query_groups, "get"):
            raise TypeError(
                f"query_groups is a {type(query_groups).__name__}; {method} takes "
                "a mapping from each query to its group"
            )
        return check_query_groups([query_groups.get(q) for q in queries], len(queries))

    def remove_models(self, names):
        """Retire models from the router.

        Parameters
        ----------
        names : sequence
            Models to remove, each one of ``classes_``.

        Returns
        -------
        self
        """
        check_is_fitted(self, "embeddings_")
        kept = ~self._select(names, "remove")
        evaluations, used = keep_models(self._kept(), kept)
        self._set_kept(evaluations)
        if self.evaluation_groups_ is not None:
            self.evaluation_groups_ = self.evaluation_groups_[used]
        cached = self._exploration_cached()
        self.embeddings_ = self.embeddings_[kept]
        if cached:
            factors = self._exploration_cache[1][torch.as_tensor(kept)]
            self._exploration_cache = (self.embeddings_, factors)
        if self.group_offsets_ is not None:
            self.group_offsets_ = self.group_offsets_[kept]
        if self.model_offsets_ is not None:
            self.model_offsets_ = self.model_offsets_[kept]
        if self._heads() is not None:
            self.head_weights_, self.head_biases_, self.head_blends_ = (
                values[kept] for values in self._heads()
            )
        self.classes_ = self.classes_[kept]
        if self.cost_ is not None:
            self.cost_ = self.cost_[kept]
        return self

    def substitutes(self, name, k=5, *, metric="euclidean"):
        """List the models nearest to ``name`` in embedding space, its substitutes.

        Parameters
        ----------
        name : object
            One of ``classes_``.
        k : int, default=5
            How many.
        metric : {"euclidean", "cosine"}, default="euclidean"

        Returns
        -------
        pandas.Series
            Distances, indexed by model name, nearest first.
        """
        check_is_fitted(self, "embeddings_")
        matches = np.flatnonzero(self.classes_ == name)
        if len(matches) == 0:
            raise ValueError(f"the router has no model {name!r}")
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
            raise ValueError(f"k={k!r} must be a positive integer")
        index = matches[0]
        distances = model_distances(
            self.embeddings_[index : index + 1], self.embeddings_, metric=metric
        )[0]
        distances[index] = np.inf
        order = np.argsort(distances, kind="stable")[: min(k, len(distances) - 1)]
        return pd.Series(
            distances[order],
            index=pd.Index(self.classes_[order], name="model"),
            name=f"{metric} distance to {name}",
        )
