"""Portfolio selection: choose a few models that stand in for the whole pool.

Each selector is a scikit-learn estimator whose samples are models and whose input is
a 2-D array of embeddings, so it runs after :class:`~sklocus.LocusEmbedder` in a
``Pipeline``. All of them set the same fitted attributes:

``selected_indices_``
    The chosen models, in the order they were chosen.
``cluster_centers_``
    Their embeddings.
``labels_``
    For each model, the position in the selection of its nearest selected model.

``predict(Z)`` maps any model to its nearest selected one (a position in the
selection) and ``transform(Z)`` gives its distance to each selected model.
"""

from __future__ import annotations

import heapq
import math
import numbers

import kmedoids
import numpy as np
from sklearn.base import (
    BaseEstimator,
    ClassNamePrefixFeaturesOutMixin,
    ClusterMixin,
    TransformerMixin,
)
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from sklocus._sklearn_compat import Interval, StrOptions, _fit_context
from sklocus._validation import check_costs
from sklocus._versioning import VersionStampMixin
from sklocus.geometry import METRICS, model_distances

__all__ = ["CoverageGreedySelector", "KCenterSelector", "KMedoidsSelector"]


class _BaseSelector(
    VersionStampMixin,
    ClassNamePrefixFeaturesOutMixin,
    ClusterMixin,
    TransformerMixin,
    BaseEstimator,
):
    """What every selector shares: input checks, assignment, predict, transform."""

    def _validate(self, X, reset):
        try:
            return validate_data(self, X, reset=reset, dtype=np.float64)
        except (TypeError, ValueError) as error:
            if "X" in str(error):  # scikit-learn's message names it already
                raise
            raise type(error)(
                f"X, the embeddings, must be a 2-D array of numbers: {error}"
            ) from None

    def _finish(self, X, selected):
        """Set the common fitted attributes from the chosen indices."""
        self.selected_indices_ = np.asarray(selected, dtype=np.int64)
        self.cluster_centers_ = X[self.selected_indices_]
        self._distances = model_distances(X, self.cluster_centers_, metric=self.metric)
        self.labels_ = np.argmin(self._distances, axis=1)
        return self

    @property
    def _n_features_out(self):
        return len(self.selected_indices_)

    def transform(self, X):
        """Distance of each model to each selected model.

        Parameters
        ----------
        X : array-like of shape (n_models, embedding_dim)
            Embeddings.

        Returns
        -------
        ndarray of shape (n_models, n_selected)
        """
        check_is_fitted(self, "selected_indices_")
        X = self._validate(X, reset=False)
        return model_distances(X, self.cluster_centers_, metric=self.metric)

    def predict(self, X):
        """Map each model to its nearest selected model.

        Parameters
        ----------
        X : array-like of shape (n_models, embedding_dim)
            Embeddings.

        Returns
        -------
        ndarray of shape (n_models,)
            Position in the selection (``selected_indices_[label]`` is the model).
        """
        return np.argmin(self.transform(X), axis=1)

    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_distances", None)
        return state


class KCenterSelector(_BaseSelector):
    """Choose models so that every model is close to one of them (k-center).

    Greedy farthest-first traversal: start from the model nearest to the mean
    embedding, then repeatedly add the model farthest from those chosen. The largest
    distance of any model to the selection is at most twice the best achievable with
    ``n_selected`` models (Gonzalez, 1985). Deterministic; ties go to the lower
    index. Cost is ``O(n_models * n_selected)`` distances, so it scales to large
    pools.

    Read more in the :ref:`User Guide <portfolios>`.

    Parameters
    ----------
    n_selected : int, default=15
        Models to choose. With as many models as that or fewer, every model is
        chosen (and ``radius_`` is 0).
    metric : {"euclidean", "cosine"}, default="euclidean"

    Attributes
    ----------
    selected_indices_ : ndarray of shape (n_selected,)
        Chosen models, in the order chosen.
    cluster_centers_ : ndarray of shape (n_selected, embedding_dim)
    labels_ : ndarray of shape (n_models,)
        Position in the selection of each model's nearest selected model.
    radius_ : float
        The largest distance from a model to its nearest selected model.
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> from sklocus import KCenterSelector
    >>> Z = np.array([[0.0, 1], [0.1, 1], [1, 0], [1, 0.1], [-1, 0]])
    >>> KCenterSelector(n_selected=3).fit(Z).selected_indices_.tolist()
    [1, 4, 2]
    """

    _parameter_constraints = {
        "n_selected": [Interval(numbers.Integral, 1, None, closed="left")],
        "metric": [StrOptions(set(METRICS))],
    }

    def __init__(self, n_selected=15, *, metric="euclidean"):
        self.n_selected = n_selected
        self.metric = metric

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Choose the models.

        Parameters
        ----------
        X : array-like of shape (n_models, embedding_dim)
            Embeddings.
        y : None
            Ignored.

        Returns
        -------
        self
        """
        X = self._validate(X, reset=True)
        n_selected = min(self.n_selected, len(X))
        centre = X.mean(axis=0, keepdims=True)
        first = int(np.argmin(model_distances(X, centre, metric=self.metric)[:, 0]))
        selected = [first]
        nearest = model_distances(X, X[first : first + 1], metric=self.metric)[:, 0]
        # A chosen model covers itself, even an all-zero one under cosine, which is
        # at distance 1 from every vector.
        nearest[first] = 0.0
        for _ in range(n_selected - 1):
            farthest = int(np.argmax(nearest))
            if nearest[farthest] <= 0:  # every model already coincides with one
                break
            selected.append(farthest)
            new = model_distances(X, X[farthest : farthest + 1], metric=self.metric)
            nearest = np.minimum(nearest, new[:, 0])
            nearest[farthest] = 0.0
        self._finish(X, selected)
        self.radius_ = float(self._distances.min(axis=1).max())
        return self


class KMedoidsSelector(_BaseSelector):
    """Choose models that minimise the total distance of every model to them.

    k-medoids by FasterPAM, through the ``kmedoids`` package, on the matrix of
    pairwise distances (so memory grows as ``n_models**2``).

    Read more in the :ref:`User Guide <portfolios>`.

    Parameters
    ----------
    n_selected : int, default=15
        Medoids to choose. With as many models as that or fewer, every model is
        chosen (and ``inertia_`` is 0).
    metric : {"euclidean", "cosine"}, default="euclidean"
    init : {"build", "random", "first", "k-medoids++"}, default="build"
        Initialisation of FasterPAM (``"build"`` is deterministic).
    max_iter : int, default=100
        Most FasterPAM iterations.
    random_state : int, RandomState instance or None, default=None
        Seeds random initialisations.

    Attributes
    ----------
    selected_indices_ : ndarray of shape (n_selected,)
        The medoids, in the order FasterPAM returns them.
    cluster_centers_ : ndarray of shape (n_selected, embedding_dim)
    labels_ : ndarray of shape (n_models,)
    inertia_ : float
        Sum of the distances of the models to their nearest medoid.
    n_iter_ : int
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> from sklocus import KMedoidsSelector
    >>> Z = np.array([[0.0, 1], [0.1, 1], [0.2, 1], [1, 0], [1, 0.1], [1, 0.2]])
    >>> selector = KMedoidsSelector(n_selected=2, metric="euclidean").fit(Z)
    >>> sorted(selector.selected_indices_.tolist())
    [1, 4]
    """

    _parameter_constraints = {
        "n_selected": [Interval(numbers.Integral, 1, None, closed="left")],
        "metric": [StrOptions(set(METRICS))],
        "init": [StrOptions({"build", "random", "first", "k-medoids++"})],
        "max_iter": [Interval(numbers.Integral, 1, None, closed="left")],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        n_selected=15,
        *,
        metric="euclidean",
        init="build",
        max_iter=100,
        random_state=None,
    ):
        self.n_selected = n_selected
        self.metric = metric
        self.init = init
        self.max_iter = max_iter
        self.random_state = random_state

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None):
        """Choose the medoids.

        Parameters
        ----------
        X : array-like of shape (n_models, embedding_dim)
            Embeddings.
        y : None
            Ignored.

        Returns
        -------
        self
        """
        X = self._validate(X, reset=True)
        n_selected = int(self.n_selected)  # kmedoids refuses numpy integers
        if n_selected >= len(X):
            self._finish(X, np.arange(len(X)))
            self.inertia_, self.n_iter_ = 0.0, 0
            return self
        seed = check_random_state(self.random_state).randint(np.iinfo(np.int32).max)
        result = kmedoids.fasterpam(
            model_distances(X, metric=self.metric),
            n_selected,
            max_iter=self.max_iter,
            init=self.init,
            random_state=seed,
            n_cpu=1,
        )
        self._finish(X, result.medoids)
        self.inertia_ = float(result.loss)
        self.n_iter_ = int(result.n_iter)
        return self


def coverage_similarity(distances, scale):
    """Similarity used for coverage: ``1 - distance / scale``, clipped to [0, 1].

    Parameters
    ----------
    distances : ndarray
    scale : float
        The largest distance of the pool; 0 (all models identical) gives
        similarity 1 everywhere.

    Returns
    -------
    ndarray
    """
    if scale <= 0:
        return np.ones_like(distances)
    return np.clip(1.0 - distances / scale, 0.0, 1.0)


class CoverageGreedySelector(_BaseSelector):
    """Choose models within a total cost to cover the pool (facility location).

    The coverage of a selection ``S`` is the mean over all models of their best
    similarity to ``S``, with similarity ``1 - distance / largest_distance`` in
    [0, 1]. Starting empty, the selector repeatedly adds the affordable model of
    largest coverage gain per unit cost while ``max_total_cost`` allows. As the best
    single affordable model can beat that greedy run when costs differ, it keeps
    whichever covers more, which guarantees at least ``(1 - 1/e) / 2`` of the best
    coverage any selection within ``max_total_cost`` achieves, and ``1 - 1/e`` with
    equal costs (Khuller, Moss and Naor, 1999; Nemhauser, Wolsey and Fisher, 1978).

    Read more in the :ref:`User Guide <portfolios>`.

    Parameters
    ----------
    max_total_cost : float, default=15
        Largest total cost of the selection. With no ``cost``, every model costs 1
        and ``max_total_cost`` is a number of models.
    metric : {"euclidean", "cosine"}, default="euclidean"

    Attributes
    ----------
    selected_indices_ : ndarray of shape (n_selected,)
        Chosen models, in the order chosen.
    cluster_centers_ : ndarray of shape (n_selected, embedding_dim)
    labels_ : ndarray of shape (n_models,)
    coverage_ : float
        Coverage of the selection, in [0, 1].
    total_cost_ : float
        Total cost of the selection.
    n_features_in_ : int

    Examples
    --------
    >>> import numpy as np
    >>> from sklocus import CoverageGreedySelector
    >>> Z = np.array([[0.0, 1], [0.1, 1], [1, 0], [1, 0.1]])
    >>> selector = CoverageGreedySelector(max_total_cost=5).fit(Z, cost=[1, 8, 8, 1])
    >>> selector.selected_indices_.tolist(), selector.total_cost_
    ([3, 0], 2.0)
    """

    _parameter_constraints = {
        "max_total_cost": [Interval(numbers.Real, 0, None, closed="neither")],
        "metric": [StrOptions(set(METRICS))],
    }

    def __init__(self, max_total_cost=15, *, metric="euclidean"):
        self.max_total_cost = max_total_cost
        self.metric = metric

    def _check_cost(self, cost, n_models):
        if cost is None:
            if self.max_total_cost < 1:
                raise ValueError(
                    f"max_total_cost={self.max_total_cost} is below 1: with no cost "
                    "every model costs 1, so no selection fits; give a "
                    "max_total_cost of at least 1 or the models' costs"
                )
            return np.ones(n_models)
        # Coverage is gained per unit of cost, so a free model is refused.
        cost = check_costs(cost, list(range(n_models)), positive=True)
        if cost.min() > self.max_total_cost:
            raise ValueError(
                f"max_total_cost={self.max_total_cost} is below every model's cost "
                f"(the cheapest costs {float(cost.min())}); no selection fits"
            )
        return cost

    @_fit_context(prefer_skip_nested_validation=True)
    def fit(self, X, y=None, cost=None):
        """Choose the models.

        Parameters
        ----------
        X : array-like of shape (n_models, embedding_dim)
            Embeddings.
        y : None
            Ignored.
        cost : array-like of shape (n_models,), default=None
            Positive cost of each model (parameters, price...). In a ``Pipeline``
            it arrives through metadata routing: ``set_fit_request(cost=True)``.

        Returns
        -------
        self
        """
        X = self._validate(X, reset=True)
        cost = self._check_cost(cost, len(X))
        distances = model_distances(X, metric=self.metric)
        similarity = coverage_similarity(distances, distances.max())
        selected, self.coverage_ = coverage_greedy(
            similarity, cost, self.max_total_cost
        )
        self._finish(X, selected)
        self.total_cost_ = float(cost[selected].sum())
        return self


def coverage_greedy(similarity, cost, max_total_cost):
    """Greedy coverage within a total cost, on a precomputed similarity.

    What :class:`CoverageGreedySelector` computes, for callers that choose
    several selections from one pool (the model map's ladder of total costs) and so
    compute the similarity once.

    Parameters
    ----------
    similarity : ndarray of shape (n_models, n_models)
        From :func:`coverage_similarity`; column ``j`` is how well model ``j``
        stands in for each model.
    cost : ndarray of shape (n_models,)
        Positive costs.
    max_total_cost : float
        Largest total cost; at least the cheapest model's cost.

    Returns
    -------
    selected : list of int
        The chosen models, in the order chosen.
    coverage : float
        The selection's coverage.
    """
    selected = _lazy_greedy(similarity, cost, max_total_cost)
    affordable = np.flatnonzero(cost <= max_total_cost)
    best_single = int(affordable[np.argmax(similarity[:, affordable].sum(axis=0))])
    coverage = _coverage(similarity, selected)
    single = _coverage(similarity, [best_single])
    if single > coverage:
        return [best_single], single
    return selected, coverage


def _lazy_greedy(similarity, cost, max_total_cost):
    """Add the affordable model of largest coverage gain per unit cost, in turn.

    Gains only shrink as the selection grows (coverage is submodular), so a gain
    computed at an earlier step bounds the gain now: a max-heap of such bounds
    needs fresh gains only for the few models at its top (Minoux's lazy greedy,
    the "CELF" of Leskovec et al., 2007), O(n_models) each instead of
    O(n_models**2) for every step. Ties go to the lower index, as they would
    in a full scan.
    """
    n_models = len(similarity)
    best = np.zeros(n_models)  # each model's best similarity to the selection
    gains = similarity.sum(axis=0)
    heap = [
        (-gains[j] / cost[j], j) for j in range(n_models) if cost[j] <= max_total_cost
    ]
    heapq.heapify(heap)
    fresh = np.zeros(n_models, dtype=np.int64)  # the step each bound was computed
    selected, spent, step = [], 0.0, 0
    while heap:
        bound, j = heapq.heappop(heap)
        if cost[j] > max_total_cost - spent + 1e-12:
            continue  # unaffordable now and at every later step
        if fresh[j] < step:
            gain = np.maximum(similarity[:, j] - best, 0.0).sum()
            fresh[j] = step
            heapq.heappush(heap, (-gain / cost[j], j))
            continue
        if bound >= 0 and selected:
            break  # nothing left adds coverage
        selected.append(int(j))
        spent += cost[j]
        best = np.maximum(best, similarity[:, j])
        step += 1
    return selected


def _coverage(similarity, selected):
    if len(selected) == 0:
        return 0.0
    return float(similarity[:, selected].max(axis=1).mean())


# The guarantee of CoverageGreedySelector with unequal costs, for tests and docs.
GREEDY_BOUND_UNIT_COST = 1 - 1 / math.e
GREEDY_BOUND_WITH_COSTS = (1 - 1 / math.e) / 2
