"""Routing with a fitted router: each query's probabilities, its model, a ranking.

Every route runs the router's stages (:mod:`._stages`) on chunks of the
queries, with the settings of the time of the call, and the policy
(:mod:`._policy`) turns the probabilities into choices.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils.validation import check_is_fitted

from sklocus._groups import check_query_groups
from sklocus._router._exploration import check_exploration
from sklocus._router._policy import ranking
from sklocus._router._tables import selected
from sklocus._sklearn_compat import validate_parameter_constraints
from sklocus._validation import check_count
from sklocus.encoders import as_query_list


class RoutesMixin:
    """``predict_correctness``, ``predict`` and ``rank_models`` of LocusRouter."""

    def _stages(self):
        """Return the fitted stages with the settings of now (``Stages.configured``)."""
        return self.stages_.configured(self)

    def _chunks(self, X, query_groups=None, explore=False):
        """Yield ``(start, probabilities, routed)`` for chunks of the queries.

        ``routed`` are the probabilities to route by: ``probabilities``
        themselves unless ``explore`` and the router explores.
        """
        queries = as_query_list(X)
        if query_groups is not None:
            query_groups = check_query_groups(query_groups, len(queries))
        exploring = None
        if explore and getattr(self, "exploration", None) is not None:
            # Checked here, at use, as fit checks them: a setting changed by
            # set_params after the fit would otherwise route silently.
            names = ("exploration", "exploration_strength")
            validate_parameter_constraints(
                {name: self._parameter_constraints[name] for name in names},
                {name: getattr(self, name) for name in names},
                caller_name=type(self).__name__,
            )
            check_exploration(self)
            exploring = (self._pool_sets, self.exploration, self.exploration_strength)
        yield from self._stages().chunks(queries, query_groups, exploring)

    def _policy(self, cost_weight=None, min_probability=None, budget=None):
        """Return a call's policy, ``(cost_weight, min_probability)``."""
        defaults = (self.cost_weight, self.min_probability)
        return self.stages_.policy.call(cost_weight, min_probability, budget, defaults)

    def _pool_sets(self):
        """Return the evaluation sets every model is embedded from, as kept."""
        return self._kept().ragged(np.arange(len(self.classes_)))[0]

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
            None, get no offset. When this is None, groups (or clusters) learnt
            at ``fit`` are told from the queries' encodings.

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
        >>> Y = pd.DataFrame(scores, columns=data.model_names)
        >>> router = LocusRouter(FrozenEstimator(embedder)).fit(queries, Y)
        >>> models, probabilities = router.rank_models(queries[:2], k=2)
        >>> models.shape, probabilities.shape
        ((2, 2), (2, 2))
        """
        check_is_fitted(self, "embeddings_")
        cost_weight, min_probability = self._policy(
            cost_weight, min_probability, budget
        )
        excluded = selected(self.classes_, exclude, "exclude")
        available = int((~excluded).sum())
        check_count(k, "k")
        if k > available:
            raise ValueError(
                f"k={k} is more than the {available} models available to route to"
            )
        queries = as_query_list(X)
        ranked = np.empty((len(queries), k), dtype=np.int64)
        probabilities = np.empty((len(queries), k), dtype=np.float32)
        for start, chunk, routed in self._chunks(queries, query_groups, explore):
            rows = slice(start, start + len(chunk))
            ranked[rows] = ranking(
                routed, excluded, self.cost_, cost_weight, min_probability, k
            )
            probabilities[rows] = np.take_along_axis(chunk, ranked[rows], axis=1)
        return self.classes_[ranked], probabilities
