"""What the model map shows, computed in Python: testable without a browser.

:func:`map_data` turns embeddings (and, when given, the evaluations behind them)
into one JSON-able dict; :mod:`sklocus.report._html` draws it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from sklearn.decomposition import PCA
from sklearn.frozen import FrozenEstimator

from sklocus._router import LocusRouter
from sklocus._routing import TIE_TOLERANCE
from sklocus._selection import KCenterSelector, coverage_greedy, coverage_similarity
from sklocus._validation import check_costs, check_count
from sklocus._versioning import __version__
from sklocus.evaluations import check_evaluation_sets, subsample, to_matrix
from sklocus.geometry import (
    check_embeddings,
    cluster_models,
    find_duplicates,
    model_distances,
    nearest_models,
)
from sklocus.metrics import (
    expected_calibration_error,
    reliability_curve,
    routing_accuracy,
)

# Numbers in the page keep this many digits: enough to read, and the file of
# 5,949 models stays small.
_DIGITS = 4
# A metadata column with more distinct numbers than this is coloured by quantile;
# one with more distinct values of another kind keeps its most common ones.
_MAX_CATEGORIES = 12
# The most clusters the map colours by default: a legend of more colours is hard
# to tell apart.
_MAX_DEFAULT_CLUSTERS = 8


def default_sizes(n_models, max_portfolio=50):
    """Return the map's default number of clusters and portfolio size for a pool.

    Both are about the square root of the number of models: the clusters from 2
    to 8 (at most one per model), the portfolio from 1 to ``max_portfolio``. A
    pool of 9 models gets 3 clusters and a portfolio of 3, one of 112 (the LOCUS
    paper's, where 15 models chosen by k-center routed as well as all of them)
    8 clusters and 11 models, and one of 5,949 8 clusters and 50 models.

    Parameters
    ----------
    n_models : int
    max_portfolio : int, default=50

    Returns
    -------
    n_clusters, portfolio_size : int
    """
    root = round(math.sqrt(n_models))
    n_clusters = min(max(root, 2), _MAX_DEFAULT_CLUSTERS, n_models)
    return n_clusters, min(max(root, 1), max_portfolio, n_models)


def _rounded(values):
    """Return a float array as nested lists, NaN as None, rounded for the page."""
    array = np.round(np.asarray(values, dtype=np.float64), _DIGITS)
    listed = array.tolist()
    if not np.isnan(array).any():
        return listed

    def clean(item):
        if isinstance(item, list):
            return [clean(x) for x in item]
        return None if item != item else item

    return clean(listed)


def _projection(Z, random_state):
    """Three coordinates per model: the embeddings' first principal components."""
    n_components = min(3, *Z.shape)
    xyz = PCA(n_components=n_components, random_state=random_state).fit_transform(Z)
    if n_components < 3:
        xyz = np.hstack([xyz, np.zeros((len(Z), 3 - n_components))])
    return xyz


def _color(Z, metadata, color, n_clusters):
    """Each model's colour: its cluster, or its value of a metadata column."""
    if color is None or color == "cluster":
        n = min(n_clusters, len(Z))
        if n < 2:
            return {"by": "cluster", "values": [0] * len(Z), "labels": ["cluster 1"]}
        labels, _ = cluster_models(Z, n_clusters=n)
        names = [f"cluster {c + 1}" for c in range(labels.max() + 1)]
        return {"by": "cluster", "values": labels.tolist(), "labels": names}
    if color not in metadata.columns:
        raise ValueError(
            f"color={color!r} is neither 'cluster' nor a metadata column; the "
            f"columns are {list(metadata.columns)}"
        )
    values = metadata[color]
    numeric = pd.api.types.is_numeric_dtype(values)
    if numeric and values.nunique() > _MAX_CATEGORIES:
        values = pd.qcut(values, q=5, duplicates="drop").astype(str)
    elif values.nunique() > _MAX_CATEGORIES:
        # A legend of dozens of rare values hides the common ones.
        common = values.value_counts().index[: _MAX_CATEGORIES - 1]
        values = values.where(values.isin(common) | values.isna(), "other")
    categories = pd.Categorical(values.astype(str).where(values.notna(), "unknown"))
    return {
        "by": str(color),
        "values": categories.codes.tolist(),
        "labels": [str(c) for c in categories.categories],
    }


def _check_metadata(metadata, names):
    if metadata is None:
        return pd.DataFrame(index=range(len(names)))
    if not isinstance(metadata, pd.DataFrame):
        raise TypeError(
            f"metadata must be a pandas DataFrame; got {type(metadata).__name__}"
        )
    if len(metadata) != len(names):
        raise ValueError(
            f"metadata has {len(metadata)} rows; give one row per model "
            f"({len(names)}), in the order of model_names"
        )
    return metadata.reset_index(drop=True)


def _group_accuracy(scores, queries, query_groups):
    """Mean observed score per model and group; None where a model has none."""
    groups = pd.Series([query_groups.get(q) for q in queries], dtype=object)
    known = groups.notna().to_numpy()
    if not known.any():
        example = next(iter(query_groups), None)
        raise ValueError(
            f"query_groups gives a group to none of the {len(queries)} evaluated "
            f"queries (it has {len(query_groups)} entries, such as {example!r}, and "
            f"the evaluations have queries such as {queries[0]!r}); expected a "
            "mapping from the evaluations' queries to their groups"
        )
    names = sorted({g for g in groups[known]}, key=str)
    accuracy = np.full((len(scores), len(names)), np.nan)
    for j, name in enumerate(names):
        columns = (groups == name).to_numpy()
        block = scores[:, columns]
        counts = (~np.isnan(block)).sum(axis=1)
        sums = np.nansum(block, axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            accuracy[:, j] = np.where(counts > 0, sums / counts, np.nan)
    return [str(n) for n in names], accuracy


def _disagreement(scores, first, others):
    """Mean absolute score difference on the queries both models answered."""
    block = np.abs(scores[others] - scores[first][None, :])
    counts = (~np.isnan(block)).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, np.nansum(block, axis=1) / counts, np.nan)


def _convergence(embedder, sets, Z, sizes, n_models, random_state):
    """Distance from a model's embedding on n of its evaluations to its own.

    Measured for at most ``n_models`` models, drawn at random: each size costs
    one forward pass per model measured.
    """
    measured = np.arange(len(sets))
    if len(sets) > n_models:
        rng = np.random.default_rng(random_state)
        measured = np.sort(rng.choice(len(sets), size=n_models, replace=False))
    chosen = [sets[i] for i in measured]
    lengths = np.array([len(s) for s in chosen])
    distance = np.full((len(sets), len(sizes)), np.nan)
    for column, n in enumerate(sizes):
        embedded = embedder.transform(subsample(chosen, n, random_state=random_state))
        gap = np.linalg.norm(embedded - Z[measured], axis=1)
        distance[measured, column] = np.where(lengths > n, gap, np.nan)
    return distance


def split_evaluations(sets, test_queries):
    """Each set's evaluations outside ``test_queries``, and those inside."""
    test = set(test_queries)
    train = [{q: s for q, s in e.items() if q not in test} for e in sets]
    held = [{q: s for q, s in e.items() if q in test} for e in sets]
    return train, held


def map_data(
    embeddings,
    model_names,
    *,
    evaluation_sets=None,
    embedder=None,
    router=None,
    query_groups=None,
    metadata=None,
    color=None,
    test_queries=None,
    cost=None,
    n_clusters="auto",
    n_neighbors=10,
    max_portfolio=50,
    convergence_sizes=(8, 16, 32, 64, 128, 256),
    convergence_models=1000,
    random_state=0,
    title="Model map",
):
    """Compute everything the model map shows, as a JSON-able dict.

    Read more in the :ref:`User Guide <map_contents>`.

    Parameters
    ----------
    embeddings : array-like of shape (n_models, embedding_dim)
        One embedding per model, e.g. from ``LocusEmbedder.transform`` on the
        models' evaluations outside ``test_queries``.
    model_names : sequence of str
        The models, in the order of ``embeddings``.
    evaluation_sets : sequence of mappings, default=None
        Each model's ``{query: score}``: gives the number of evaluations, accuracy
        per group, disagreement between neighbours and, with ``embedder``,
        convergence, the routing portfolio and the portfolios' routing accuracy.
    embedder : LocusEmbedder, default=None
        The fitted embedder of ``embeddings``; needed for convergence and routing.
    router : LocusRouter, default=None
        The router whose routing the page measures, fitted on the same models
        (in the order of ``model_names``) without ``test_queries``. By default,
        with ``embedder`` and ``evaluation_sets``, ``LocusRouter(FrozenEstimator(
        embedder))`` fitted on the evaluations outside ``test_queries``: the
        router ``sklocus route`` builds, so that the map and ``route`` report
        the same routing accuracy. Building it refines each model's embedding
        (``refine_steps``), as routing does.
    query_groups : mapping, default=None
        Group (benchmark, subject...) of each query, for accuracy per group. At
        least one evaluated query must have a group.
    metadata : DataFrame, default=None
        One row per model (in the order of ``model_names``) of columns to show.
    color : str, default=None
        ``"cluster"`` (the default: ``cluster_models`` into ``n_clusters``) or a
        column of ``metadata``.
    test_queries : sequence, default=None
        Held-out queries: the portfolios' routing accuracy is measured on those
        of them that ``evaluation_sets`` scores (at least one must be).
        Leave them out of the evaluations behind ``embeddings``.
    cost : str or array-like of shape (n_models,), default=None
        Each model's cost (parameters, price...), positive, NaN where unknown: a
        column of ``metadata`` or the values. With it, the page also offers
        greedy coverage within a ladder of about ten total costs, chosen among the
        models whose cost is known.
    n_clusters : "auto" or int, default="auto"
        Clusters to colour by; ``"auto"`` is about the square root of the number
        of models, from 2 to 8 (3 for 9 models, 8 from 56 models on).
    n_neighbors : int, default=10
        Neighbours listed per model (at most ``n_models - 1``).
    max_portfolio : int, default=50
        Largest portfolio the page offers. The page opens on a portfolio of
        about the square root of the number of models (3 of 9, 11 of 112),
        chosen for routing where the page has a router (see Notes).
    convergence_sizes : sequence of int, default=(8, 16, 32, 64, 128, 256)
        Numbers of evaluations at which convergence is measured.
    convergence_models : int, default=1000
        Most models whose convergence is measured (a random sample of larger
        pools; the others show none).
    random_state : int, default=0
        Seeds the projection and the draws of evaluations for convergence.
    title : str, default="Model map"

    Returns
    -------
    dict
        What :func:`sklocus.report.write_map` embeds in the page.

    Notes
    -----
    With a router, the first portfolio method is greedy routing: the model of
    highest mean score on the evaluated queries outside ``test_queries``, then
    at each step the model that most raises the router's routing accuracy on
    those queries. k-center (farthest-first) and coverage choose by the
    embeddings alone, for spread rather than strength: k-center takes the
    outermost models, which are often the weakest.

    Examples
    --------
    >>> import numpy as np
    >>> from sklocus.report import map_data
    >>> Z = np.random.default_rng(0).normal(size=(6, 4))
    >>> data = map_data(Z, [f"m{i}" for i in range(6)], n_neighbors=2)
    >>> len(data["xyz"]), len(data["neighbors"][0])
    (6, 2)
    """
    Z = check_embeddings(embeddings)
    names = [str(name) for name in model_names]
    if len(names) != len(Z):
        raise ValueError(
            f"got {len(Z)} embeddings but {len(names)} model names; give one name "
            "per embedding"
        )
    if len(set(names)) != len(names):
        repeated = pd.Series(names)[pd.Series(names).duplicated()].iloc[0]
        raise ValueError(f"model {repeated!r} is named twice; names must be distinct")
    if len(Z) < 2:
        raise ValueError("a map needs at least two models")
    automatic_clusters, portfolio_size = default_sizes(len(Z), max_portfolio)
    if isinstance(n_clusters, str) and n_clusters == "auto":
        n_clusters = automatic_clusters
    for name, value, low in (
        ("n_neighbors", n_neighbors, 1),
        ("max_portfolio", max_portfolio, 1),
        ("n_clusters", n_clusters, 1),
        ("convergence_models", convergence_models, 1),
    ):
        check_count(value, name, low)
    metadata = _check_metadata(metadata, names)
    if cost is not None:
        cost = _check_cost(cost, metadata, names)

    scores = queries = train = held = None
    if evaluation_sets is not None:
        check_evaluation_sets(evaluation_sets, names)
        sets = list(evaluation_sets)
        if len(sets) != len(names):
            raise ValueError(f"got {len(sets)} evaluation sets for {len(names)} models")
        train, held = split_evaluations(sets, test_queries or [])
        scores, queries = to_matrix(sets)
        scores = scores.T  # a model per row, as the page reads them
    elif router is not None:
        raise ValueError("a router needs the evaluation_sets to measure routing on")
    measured = _Measured.of(embedder, router, names, train, held, queries, test_queries)

    k = min(n_neighbors, len(Z) - 1)
    neighbours, distances = nearest_models(Z, k=k)
    disagreement = np.full((len(Z), k), np.nan)
    if scores is not None:
        for i in range(len(Z)):
            disagreement[i] = _disagreement(scores, i, neighbours[i])
    distances, disagreement = _rounded(distances), _rounded(disagreement)
    near = [
        [[int(j), d, a] for j, d, a in zip(row, distances[i], disagreement[i])]
        for i, row in enumerate(neighbours.tolist())
    ]

    duplicates = [[] for _ in names]
    for first, second in find_duplicates(Z)[["first", "second"]].itertuples(
        index=False
    ):
        duplicates[first].append(int(second))
        duplicates[second].append(int(first))

    data = {
        "title": str(title),
        "sklocus_version": __version__,
        "models": names,
        "xyz": _rounded(_projection(Z, random_state)),
        "color": _color(Z, metadata, color, n_clusters),
        "n_evaluations": None,
        "metadata": {
            str(column): [
                None if pd.isna(v) else (v.item() if hasattr(v, "item") else v)
                for v in metadata[column]
            ]
            for column in metadata.columns
        },
        "groups": None,
        "accuracy": None,
        "neighbors": near,
        "duplicates": duplicates,
        "portfolio": _portfolio(Z, measured, max_portfolio, portfolio_size, cost),
        "convergence": None,
        "reliability": measured.reliability(),
    }
    if evaluation_sets is not None:
        data["n_evaluations"] = [len(e) for e in train]
        if query_groups is not None:
            groups, accuracy = _group_accuracy(scores, queries, query_groups)
            data["groups"], data["accuracy"] = groups, _rounded(accuracy)
        if embedder is not None and convergence_sizes:
            sizes = sorted({int(n) for n in convergence_sizes})
            distance = _convergence(
                embedder, train, Z, sizes, convergence_models, random_state
            )
            data["convergence"] = {"n": sizes, "distance": _rounded(distance)}
    return data


def pool_router(embedder, evaluation_sets, model_names):
    """Return the router the map measures routing with, unless it is given one.

    ``LocusRouter(FrozenEstimator(embedder))`` with its default settings, fitted
    on ``evaluation_sets``: what ``sklocus route`` builds without options.
    """
    return LocusRouter(FrozenEstimator(embedder)).fit_evaluations(
        evaluation_sets, model_names
    )


class _Measured:
    """The router's predictions that the page's routing figures come from.

    ``train`` holds the observed scores and predictions on the evaluated
    queries outside the test queries (the routing portfolio is chosen on
    them), ``held`` those on the held-out queries (its figures are measured
    on them); either is None when there is nothing to measure. Both are
    ``(n_models, n_queries)``: the page reads them a model at a time.
    """

    def __init__(self, train=None, held=None):
        self.train = train
        self.held = held

    @classmethod
    def of(cls, embedder, router, names, train, held, queries, test_queries):
        if train is None or (router is None and embedder is None):
            return cls()
        test = set(test_queries or [])
        held_queries = [q for q in queries if q in test]
        if test and not held_queries:
            raise ValueError(
                f"none of the {len(test)} test_queries is evaluated in "
                f"evaluation_sets (such as {next(iter(test))!r}); routing is "
                "measured on the held-out queries that the models were evaluated on"
            )
        if router is None:
            router = pool_router(embedder, train, names)
        elif list(map(str, router.classes_)) != names:
            raise ValueError(
                "router routes among other models than model_names, or in another "
                "order; fit it on the same models"
            )
        train_queries = [q for q in queries if q not in test]
        measured = cls()
        if train_queries:
            observed = to_matrix(train, queries=train_queries)[0].T
            predicted = router.predict_correctness(train_queries).T
            measured.train = (observed, predicted)
        if held_queries:
            observed = to_matrix(held, queries=held_queries)[0].T
            predicted = router.predict_correctness(held_queries).T
            measured.held = (observed, predicted)
        return measured

    def routing(self, chosen):
        """Held-out routing accuracy among the models ``chosen``, or None."""
        if self.held is None:
            return None
        observed, predicted = self.held
        return _routing(observed[chosen], predicted[chosen])

    def n_held_out(self):
        return 0 if self.held is None else self.held[0].shape[1]

    def reliability(self, n_bins=10):
        """Return the router's reliability on the held-out evaluations, or None.

        Each model's held-out scores against its predicted P(correct): the
        reliability curve's bins (:func:`sklocus.metrics.reliability_curve`)
        and the expected calibration error.
        """
        if self.held is None:
            return None
        observed, predicted = self.held
        bins = reliability_curve(observed, predicted, n_bins=n_bins)
        mean_predicted, mean_observed, counts = bins
        return {
            "predicted": _rounded(mean_predicted),
            "observed": _rounded(mean_observed),
            "counts": [int(c) for c in counts],
            "ece": round(
                float(expected_calibration_error(observed, predicted, n_bins=n_bins)),
                4,
            ),
        }


def routing_order(scores, probabilities, max_k):
    """Grow a portfolio for routing: each step adds the model it routes best with.

    The first model is the one of highest mean observed score; each next one
    is the model whose addition most raises the routing accuracy
    (:func:`~sklocus.metrics.routing_accuracy`) of the portfolio, each query
    going to the portfolio's model of highest probability. Near-ties aside, the
    portfolio of k models is the first k of the order. Ties go to the model
    listed first.

    Parameters
    ----------
    scores : ndarray of shape (n_models, n_queries)
        Observed scores, NaN where unobserved.
    probabilities : ndarray of shape (n_models, n_queries)
        Predicted probabilities of a correct answer.
    max_k : int
        Length of the order.

    Returns
    -------
    list of int
    """
    n_models = len(scores)
    best = np.full(scores.shape[1], -np.inf)  # the portfolio's best probability
    routed = np.full(scores.shape[1], np.nan)  # and the score it routes to
    order = []
    for _ in range(min(max_k, n_models)):
        # A model takes the queries where it beats the portfolio's best by more
        # than the tie tolerance (best_models sends near-ties to the earlier).
        takes = probabilities > best[None, :] + TIE_TOLERANCE
        candidate = np.where(takes, scores, routed[None, :])
        counts = (~np.isnan(candidate)).sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            value = np.where(counts > 0, np.nansum(candidate, axis=1) / counts, -np.inf)
        value[order] = np.nan  # never twice
        chosen = int(np.nanargmax(value)) if not np.isnan(value).all() else None
        if chosen is None:
            break
        order.append(chosen)
        routed = candidate[chosen]
        best = np.where(takes[chosen], probabilities[chosen], best)
    return order


def _portfolio(Z, measured, max_portfolio, portfolio_size, cost):
    """Portfolios of up to ``max_portfolio`` models, and their routing.

    Greedy routing (with a router's predictions), farthest-first (k-center)
    and greedy coverage with unit costs all grow one model at a time, so the
    first k of each order is that method's portfolio of k models, and the page
    can offer every k from one order. Coverage within a largest total cost is not
    nested (a larger total can drop a model a smaller one chose), so with costs
    the page offers a ladder of largest total costs, each selection in full.

    The page opens on the first method, greedy routing where there is one: a
    portfolio is for routing, and the strongest model is its first. k-center
    starts from the model nearest the mean embedding and then takes the
    farthest models, which in a pool of a few strong and a few weak models are
    the weak ones (on the 9 LLMRouter models, its 5 included the 3 weakest).
    """
    max_k = min(max_portfolio, len(Z))
    # One distance matrix serves every coverage selection: at 5,949 models
    # each costs seconds.
    distances = model_distances(Z)
    unit_cost = np.ones(len(Z))
    coverage, _ = coverage_greedy(
        coverage_similarity(distances, distances.max()), unit_cost, max_k
    )
    orders = {}
    if measured.train is not None:
        orders["routing"] = routing_order(*measured.train, max_k)
    orders["k-center"] = KCenterSelector(n_selected=max_k).fit(Z).selected_indices_
    orders["coverage"] = coverage
    route = measured.routing
    portfolio = {
        "max_k": int(max(len(order) for order in orders.values())),
        "default_k": int(portfolio_size),
        "n_held_out": measured.n_held_out(),
        "orders": {method: [int(i) for i in order] for method, order in orders.items()},
        "routing": {
            method: [route(order[:size]) for size in range(1, len(order) + 1)]
            for method, order in orders.items()
        },
        "full_pool": route(np.arange(len(Z))),
        "cost_ladder": None,
    }
    if cost is not None:
        portfolio["cost_ladder"] = _cost_ladder_portfolios(
            distances, cost, max_k, route
        )
    return portfolio


def _check_cost(cost, metadata, names):
    """Each model's cost as floats (NaN where unknown), and what it is called."""
    if isinstance(cost, str):
        if cost not in metadata.columns:
            raise ValueError(
                f"cost={cost!r} is not a metadata column; the columns are "
                f"{list(metadata.columns)}"
            )
        name, column = cost, metadata[cost]
        values = pd.to_numeric(column, errors="coerce")
        unreadable = (values.isna() & column.notna()).to_numpy()
        if unreadable.any():
            i = int(np.argmax(unreadable))
            raise ValueError(
                f"model {names[i]!r} has {name} {column.iloc[i]!r}; a cost must "
                "be a number (or missing where unknown)"
            )
        values = values.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        name, values = "cost", cost
    # The total costs are spaced geometrically from a typical cost: 0 is refused.
    values = check_costs(values, names, what=name, positive=True, missing=True)
    if np.isnan(values).all():
        raise ValueError(f"no model has a known {name}; give at least one cost")
    return name, values


def _cost_ladder(cost, max_k, n_rungs):
    """Largest total costs, geometrically from one typical model to ``max_k``.

    A typical model costs the median: the cheapest ones (a 1M-parameter toy in
    a pool of 7B models) would spend half the ladder on totals nobody deploys.
    Rounded to two significant digits, to read as totals a person would choose.
    """
    typical = float(np.median(cost))
    ladder = np.geomspace(typical, min(typical * max_k, cost.sum()), n_rungs)
    return sorted({max(float(f"{b:.2g}"), float(cost.min())) for b in ladder})


def _cost_ladder_portfolios(distances, cost, max_k, route, n_rungs=10):
    """Greedy coverage within each total cost of a ladder, among the priced models.

    Each selection is what ``CoverageGreedySelector(max_total_cost).fit(
    Z[priced], cost=cost[priced])`` chooses, from one similarity matrix.
    """
    name, cost = cost
    priced = np.flatnonzero(~np.isnan(cost))
    among = distances[np.ix_(priced, priced)]
    similarity = coverage_similarity(among, among.max())
    max_total_costs, selections, spent, routing = [], [], [], []
    for max_total_cost in _cost_ladder(cost[priced], max_k, n_rungs):
        chosen, _ = coverage_greedy(similarity, cost[priced], max_total_cost)
        chosen = priced[chosen]
        if selections and selections[-1] == chosen.tolist():
            continue  # a total that buys nothing more is no choice
        max_total_costs.append(max_total_cost)
        selections.append([int(i) for i in chosen])
        spent.append(round(float(cost[chosen].sum()), _DIGITS))
        routing.append(route(chosen))
    return {
        "by": name,
        "n_priced": int(len(priced)),
        "max_total_cost": max_total_costs,
        "selections": selections,
        "total_cost": spent,
        "routing": routing,
    }


def _routing(observed, predicted):
    """Routing accuracy, rounded; None when no chosen model was observed."""
    try:
        return round(routing_accuracy(observed.T, predicted.T), _DIGITS)
    except ValueError:
        return None
