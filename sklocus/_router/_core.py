"""LocusRouter: send each query to the model most likely to answer it."""

from __future__ import annotations

import numbers

from sklearn.base import BaseEstimator

from sklocus._kept_evaluations import keep
from sklocus._router._editing import PoolEditingMixin
from sklocus._router._exploration import check_exploration
from sklocus._router._fitting import (
    CALIBRATIONS,
    fit_stages,
    table_needed,
    upgraded_state,
)
from sklocus._router._heads import heads_wanted
from sklocus._router._learning import LearningMixin
from sklocus._router._routes import RoutesMixin
from sklocus._router._score import RoutingScoreMixin
from sklocus._router._stages import StageAttributesMixin
from sklocus._router._substitutes import SubstitutesMixin
from sklocus._router._tables import (
    check_cost,
    dense_table,
    pool_of_sets,
    pool_of_table,
)
from sklocus._routing import check_policy, policy_constraint
from sklocus._sklearn_compat import (
    HasMethods,
    Interval,
    StrOptions,
    _fit_context,
)
from sklocus._versioning import VersionStampMixin


class LocusRouter(
    StageAttributesMixin,
    RoutesMixin,
    LearningMixin,
    PoolEditingMixin,
    SubstitutesMixin,
    RoutingScoreMixin,
    VersionStampMixin,
    BaseEstimator,
):
    """Route each query to the model most likely to answer it correctly.

    A classifier whose samples are queries and whose classes are models. ``fit``
    embeds every model from its observed scores with a
    :class:`~sklocus.LocusEmbedder` (fitting it first unless it is wrapped in
    :class:`~sklearn.frozen.FrozenEstimator`); ``predict`` scores every query
    against every model with the embedder's correctness predictor and picks the
    best. Models can be added and removed afterwards without refitting.

    Its target is a matrix of scores with gaps, not class labels, so it is not
    a scikit-learn classifier (no ``ClassifierMixin``; ``is_classifier`` is
    False): an integer ``cv`` splits the queries with ``KFold``, as stratifying
    on the scores cannot, and ``score`` is the mean score of the routed models.

    Read more in the :ref:`User Guide <routing>`.

    Parameters
    ----------
    embedder : LocusEmbedder or FrozenEstimator or None, default=None
        ``None`` fits a ``LocusEmbedder()``; any other embedder is cloned and
        fitted, **even one that is already fitted** (``fit`` warns then);
        ``FrozenEstimator(fitted_embedder)`` is used as it is (``fit`` only
        embeds), which is what a trained embedder needs.
    cost_weight : float, default=0.0
        Route to the model of highest ``P(correct) - cost_weight * cost /
        max(cost)``: ``0.1`` trades at most 0.1 of probability against the
        dearest model's cost. Ignored when no cost is given.
    refine_steps : int or None, default=50
        Steps of test-time refinement of the pool's embeddings, in place of a
        :class:`~sklocus.LocusEmbedder`'s own ``refine_steps`` (``None`` keeps
        it; 0 routes with forward passes). Each model is embedded once, so it
        costs once per model; on pools the embedder never saw it raised routing
        accuracy and correctness (:ref:`refining_embeddings`).
    group_shrinkage : float, default=3.0
        Prior precision of each model's per-group logit offset; about four
        times this many evaluations in a group move it halfway to what they
        alone say (:ref:`query_groups`).
    query_clusters : "auto", int >= 2 or None, default=None
        Without ``query_groups`` in :meth:`fit`: group the pool's queries by
        k-means of their encodings, each model an offset per cluster, a query in
        its nearest centre's; ``"auto"`` chooses how many (2 to 32, or none) on
        held-out evaluations of the pool (``held_out_losses_``). Off by default:
        level in routing on pools of 112, below with query heads on 9.
    calibration : {"pool", "isotonic", "sigmoid", "pool+isotonic", \
            "pool+sigmoid"} or None, default=None
        Calibrate on the pool's own evaluations, each predicted from an
        embedding of the other half of its model's. ``"pool"`` fits LOCUS's
        logits first, one slope for the pool and one shrunken offset per model
        (:ref:`router_calibration`; off by default: it helped on some unseen
        benchmarks, hurt on others). ``"isotonic"`` and ``"sigmoid"`` map the
        final probabilities through one increasing
        :class:`~sklocus.calibration.ProbabilityCalibrator`, so that 0.8 comes
        true 8 times in 10, which moves thresholds, budgets and weights of cost
        but no query's likeliest model (:ref:`calibrated_probabilities`).
        ``"pool+..."`` does both. Each costs two more embeddings per model.
    min_probability : float in [0, 1] or None, default=None
        Route to the cheapest model whose probability reaches this, else to the
        likeliest (:ref:`routing_on_a_budget`). Needs costs, ``cost_weight=0``.
    budget : float or None, default=None
        Route within a mean cost per query: ``fit`` chooses the weight of cost
        whose routes were best within it on held-out evaluations of the pool
        (``budget_cost_weight_``; it warns when none kept within it) at two more
        embeddings of each model, kept when the pool changes
        (:ref:`routing_on_a_budget`). Needs costs, ``cost_weight=0``, no
        ``min_probability``.
    query_heads : "auto" or bool, default="auto"
        Fit each model a logistic regression on the query encodings of its
        evaluations and blend its logits with LOCUS's, the penalty chosen per
        model and the blend for the pool on held-out folds (:ref:`query_heads`);
        a model with fewer than 64 evaluations keeps LOCUS alone. ``"auto"``
        fits them on pools of fewer than 100 models. Needs a LocusEmbedder.
    exploration : {"thompson", "ucb"} or None, default=None
        How :meth:`predict` and :meth:`rank_models` explore, for a router that
        learns from its own routes' outcomes (:ref:`exploring_while_learning`):
        by LOCUS logits drawn from their Laplace posteriors (``"thompson"``) or
        by their upper bounds (``"ucb"``). Probabilities returned stay the best
        guesses; ``score`` does not explore. Needs a LocusEmbedder.
    exploration_strength : float > 0, default=1.0
        Standard deviations of each logit that exploration adds or draws with.
    random_state : int, RandomState instance or None, default=None
        Seeds ``"thompson"``'s draws: a router seeded alike routes alike.

    Attributes
    ----------
    classes_ : ndarray of shape (n_models,)
        The models: Y's column names, or 0..n_models-1 for an array Y.
    stages_ : object
        What ``fit`` learnt, stage by stage (``locus``, ``calibration``,
        ``heads``, ``probability_map``, ``groups``, ``policy``, each None
        where not fitted), every stage a frozen object that the pool's changes
        replace whole. The attributes below, but the kept evaluations, read
        from it and are read-only.
    embedder_ : LocusEmbedder or FrozenEstimator
        The fitted embedder.
    embeddings_ : ndarray of shape (n_models, embedding_dim), float32
        One embedding per model, in the order of ``classes_``.
    cost_ : ndarray of shape (n_models,) or None
        Cost of each model, when given.
    calibration_slope_, calibration_intercept_ : float or None
        With ``calibration="pool"`` or ``"pool+..."``: the slope ``b`` of
        LOCUS's logits and the pool's offset (``model_offsets_ + b * logit``).
    model_offsets_ : ndarray of shape (n_models,), float32, or None
        Each model's offset under the pool calibration.
    head_weights_, head_biases_ : ndarray, float32, or None
        With query heads: each model's head, ``(n_models, query_dim)`` and
        ``(n_models,)``.
    head_blend_ : float or None
        The pool's weight of the heads against LOCUS on the logit scale,
        chosen at ``fit`` and given to models added later.
    head_blends_ : ndarray of shape (n_models,), float32, or None
        Each model's: ``head_blend_``, or 0 for a model with no head.
    probability_calibrator_ : ProbabilityCalibrator or None
        With ``calibration`` ``"isotonic"``, ``"sigmoid"`` or ``"pool+..."`` of
        them: the map.
    groups_ : ndarray of shape (n_groups,) or None
        The query groups given to :meth:`fit`, in order of first appearance,
        or the clusters' numbers.
    group_offsets_ : ndarray of shape (n_models, n_groups), float32, or None
        Each model's logit offset for each group.
    group_source_ : {"labels", "clusters"} or None
        Where ``groups_`` came from: ``query_groups``, or ``query_clusters``.
    group_weights_, group_biases_ : ndarray, float32, or None
        Each group's linear score of a query encoding, ``(n_groups, query_dim)``
        and ``(n_groups,)``: a query given no group takes each group's offset by
        the scores' softmax (labels), or its best group's (nearest cluster's).
    held_out_losses_ : dict or None
        With ``query_clusters``: the held-out log loss of each number of
        clusters tried, and of ``"none"``; the least was kept.
    budget_curve_ : ndarray of shape (3, n_weights) or None
        With ``budget``: the weights of cost tried, and the held-out mean cost
        and quality of each; a call's ``budget=`` chooses from it again.
    budget_cost_weight_ : float or None
        With ``budget``: the weight of cost the router routes by.
    evaluation_queries_, evaluation_codes_, evaluation_sums_, \
            evaluation_counts_, evaluation_offsets_ : ndarray
        The evaluations each model is embedded from, kept to learn and change
        the pool: the distinct queries; each evaluation's query (an index into
        the first); the sum and number of its outcomes (its score is their
        mean); where each model's evaluations start (model ``j``'s are
        ``evaluation_offsets_[j]:evaluation_offsets_[j + 1]``).
        :meth:`evaluations` lists them as a table.
    evaluation_groups_ : ndarray of shape (n_queries,), int64, or None
        With groups: each kept query's index in ``groups_``, -1 for none.

    Examples
    --------
    >>> import pandas as pd
    >>> from sklocus import LocusEmbedder, LocusRouter
    >>> from sklocus.datasets import make_evaluations
    >>> from sklocus.evaluations import to_matrix
    >>> data = make_evaluations(n_models=8, n_queries=120, evals_per_model=None,
    ...                         random_state=0)
    >>> scores, queries = to_matrix(data.evaluation_sets)
    >>> Y = pd.DataFrame(scores, columns=data.model_names)
    >>> embedder = LocusEmbedder(query_encoder=data.encoder, embedding_dim=16,
    ...                          n_latents=4, max_epochs=2, epoch_size=256,
    ...                          random_state=0)
    >>> router = LocusRouter(embedder).fit(queries, Y)
    >>> router.predict(queries[:3]).shape
    (3,)
    """

    _parameter_constraints = {
        "embedder": [HasMethods(["fit", "transform"]), None],
        "cost_weight": [policy_constraint("cost_weight")],
        "min_probability": [policy_constraint("min_probability"), None],
        "budget": [policy_constraint("budget"), None],
        "refine_steps": [Interval(numbers.Integral, 0, None, closed="left"), None],
        "group_shrinkage": [Interval(numbers.Real, 0, None, closed="neither")],
        "query_clusters": [
            StrOptions({"auto"}),
            Interval(numbers.Integral, 2, None, closed="left"),
            None,
        ],
        "query_heads": [StrOptions({"auto"}), "boolean"],
        "calibration": [StrOptions({name for name in CALIBRATIONS if name}), None],
        "exploration": [StrOptions({"thompson", "ucb"}), None],
        "exploration_strength": [Interval(numbers.Real, 0, None, closed="neither")],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        embedder=None,
        *,
        cost_weight=0.0,
        refine_steps=50,
        group_shrinkage=3.0,
        query_clusters=None,
        calibration=None,
        min_probability=None,
        budget=None,
        query_heads="auto",
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
        self.query_clusters = query_clusters
        self.calibration = calibration
        self.query_heads = query_heads
        self.exploration = exploration
        self.exploration_strength = exploration_strength
        self.random_state = random_state

    def __setstate__(self, state):
        # A pickle of an older router gets the settings it was fitted with.
        super().__setstate__(upgraded_state(dict(state)))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.string = True
        tags.target_tags.multi_output = True
        tags.target_tags.single_output = False
        return tags

    # The embedder, a parameter, is validated when the router fits it.
    @_fit_context(prefer_skip_nested_validation=False)
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
            Each query's benchmark, subject or category (None or NaN for none):
            each model gets an offset per group (``group_offsets_``), applied to
            queries by the groups :meth:`predict` and the others are given, or
            else by those a logistic regression tells from their encodings.

        Returns
        -------
        self
        """
        pool = pool_of_table(X, Y, cost, query_groups)
        return self._fit(*pool)

    @_fit_context(prefer_skip_nested_validation=False)
    def fit_evaluations(
        self, evaluation_sets, model_names=None, cost=None, query_groups=None
    ):
        """Embed every model from its evaluation set, as :meth:`fit` does from a table.

        The same router as ``fit(queries, Y)`` with ``Y`` the dense table of these
        sets, without building that table: what a pool read as evaluation sets or a
        long table (:func:`~sklocus.evaluations.from_long`) needs, however many
        models it holds; only the stages that compare each model's scores with its
        predictions query by query build it (heads, calibration, groups, clusters).

        Read more in the :ref:`User Guide <routing>`.

        Parameters
        ----------
        evaluation_sets : sequence of mappings
            One mapping from query to score per model, as
            :class:`~sklocus.LocusEmbedder` takes them.
        model_names : sequence, default=None
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
        ragged, names = pool_of_sets(evaluation_sets, model_names)
        cost = check_cost(cost, names)
        needed = table_needed(self, len(names), query_groups is not None)
        table, groups = dense_table(ragged, query_groups, needed)
        return self._fit(ragged, names, cost, table, groups)

    def _fit(self, evaluation_sets, names, cost, table, query_groups):
        """Fit on checked sets; ``table`` is ``(queries, scores)``, dense, when needed.

        ``evaluation_sets`` is a :class:`~sklocus.evaluations.RaggedEvaluations`;
        ``scores`` is ``(n_queries, n_models)``, NaN where unobserved.
        """
        # The router's own weight is ignored without costs; 0 is no policy.
        check_policy(
            self.cost_weight or None,
            self.min_probability,
            self.budget,
            has_costs=cost is not None,
            weight_needs_costs=False,
        )
        heads_on = heads_wanted(self, len(names))  # refuses heads without a LOCUS
        check_exploration(self)
        kept = keep(evaluation_sets)
        stages = fit_stages(
            self, evaluation_sets, table, query_groups, cost, kept, heads_on
        )
        # Set together, once every stage is fitted.
        self._set_kept(kept)
        self.classes_ = names
        self.stages_ = stages
        return self
