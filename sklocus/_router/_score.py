"""A router as scikit-learn's tools read a classifier: ``score``, ``predict_proba``.

Its ``score`` is how well it routes, as a classifier's is its accuracy; its
``decision_function`` is each model's probability of a correct answer, one column
per model as a multilabel classifier's, which scikit-learn's ``"roc_auc"`` and
``"average_precision"`` scorers read.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils.validation import check_is_fitted

from sklocus._router._policy import utilities
from sklocus._router._tables import score_table
from sklocus.encoders import as_query_list
from sklocus.metrics import routing_accuracy


class RoutingScoreMixin:
    """``score``, ``predict_proba`` and the pairs the correctness scorers read.

    Where :class:`~sklearn.base.ClassifierMixin` scores a classifier by its
    accuracy, :class:`~sklocus.LocusRouter` is scored by its routing accuracy.
    """

    def predict_proba(self, X, query_groups=None):
        """Each query's correctness probabilities, normalised to sum to one.

        Not probabilities that a model is *the* best: ``predict_correctness``'s
        rows over their sums, for scikit-learn tools that expect them.

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

    def decision_function(self, X, query_groups=None):
        """Probability that each model answers each query correctly, for scorers.

        :meth:`predict_correctness` under the name scikit-learn's scorers look for
        first: with ``Y`` as labels, a column per model, ``scoring="roc_auc"`` (or
        ``"average_precision"``) measures how well each model's correct answers
        are told from its wrong ones, averaged over the models. scikit-learn's
        metrics need ``Y`` complete and of 0/1 scores; a ``Y`` with gaps needs
        :func:`sklocus.metrics.get_scorer`, whose scorers skip them.

        Parameters
        ----------
        X : sequence of length n_queries
            Queries.
        query_groups : array-like of shape (n_queries,), default=None
            The queries' groups (see :meth:`predict_correctness`).

        Returns
        -------
        ndarray of shape (n_queries, n_models)
            Columns in the order of ``classes_``.
        """
        return self.predict_correctness(X, query_groups)

    def score(self, X, Y, sample_weight=None, query_groups=None):
        """Routing accuracy: the mean observed score of the chosen model.

        Each query is routed with :meth:`predict`; queries whose chosen model has no
        observed score in ``Y`` are left out of the mean. It is what
        ``GridSearchCV`` and ``cross_val_score`` maximise by default; for how well
        the router predicts correctness instead, pass
        ``scoring=sklocus.metrics.get_scorer("neg_log_loss")`` (or ``"roc_auc"``,
        ``"neg_brier_score"``, ``"accuracy"``): scikit-learn's own strings read
        ``Y`` as class labels, which a ``Y`` with gaps is not
        (:ref:`scoring_strings`).

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
        scores, _ = score_table(Y, queries, self.classes_)
        # Routed as predict routes without exploring: by the utilities of the
        # router's policy, which routing_accuracy chooses from as predict does.
        cost_weight, min_probability = self._policy()
        found = np.empty(scores.shape)
        for start, probabilities, _ in self._chunks(queries, query_groups):
            rows = slice(start, start + len(probabilities))
            found[rows] = utilities(
                probabilities.astype(np.float64),
                self.cost_,
                cost_weight,
                min_probability,
            )
        return routing_accuracy(scores, found, sample_weight=sample_weight)

    def _correctness_pairs(self, X, Y):
        """Observed scores of Y and predicted probabilities, as two matrices.

        What the scorers of :func:`sklocus.metrics.get_scorer` measure.
        """
        check_is_fitted(self, "embeddings_")
        queries = as_query_list(X)
        if Y is None:
            raise ValueError("scoring a router's correctness needs Y, the scores")
        scores, _ = score_table(Y, queries, self.classes_)
        return scores, self.predict_correctness(queries)
