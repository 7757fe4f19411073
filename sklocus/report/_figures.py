"""Static figures of a pool, for documents: families and convergence (matplotlib)."""

from __future__ import annotations

import warnings

import numpy as np

from sklocus.geometry import check_embeddings, cluster_models


def plot_families(
    embeddings,
    model_names,
    *,
    n_clusters=8,
    metric="euclidean",
    ax=None,
    max_labels=60,
):
    """Draw the dendrogram of the models' families (average linkage).

    The tree is that of :func:`~sklocus.geometry.cluster_models`; branches below
    the cut into ``n_clusters`` families share a colour.

    Read more in the :ref:`User Guide <static_figures>`.

    Parameters
    ----------
    embeddings : array-like of shape (n_models, embedding_dim)
    model_names : sequence of str
        Leaf labels, shown when there are at most ``max_labels`` models.
    n_clusters : int, default=8
        Families to colour.
    metric : {"euclidean", "cosine"}, default="euclidean"
    ax : matplotlib Axes, default=None
        Where to draw; a new figure's axes when None.
    max_labels : int, default=60
        Above this many models, leaves are not labelled.

    Returns
    -------
    matplotlib.axes.Axes

    Examples
    --------
    >>> import numpy as np
    >>> from sklocus.report import plot_families
    >>> Z = np.random.default_rng(0).normal(size=(10, 4))
    >>> ax = plot_families(Z, [f"m{i}" for i in range(10)], n_clusters=3)
    >>> ax.get_ylabel()
    'average distance between families'
    """
    import matplotlib.pyplot as plt
    from scipy.cluster.hierarchy import dendrogram

    Z = check_embeddings(embeddings)
    names = [str(name) for name in model_names]
    if len(names) != len(Z):
        raise ValueError(f"got {len(Z)} embeddings but {len(names)} model names")
    labels, linkage = cluster_models(Z, n_clusters=n_clusters, metric=metric)
    if ax is None:
        ax = plt.figure(figsize=(10, 4)).add_subplot()
    # Merges above the (n_clusters - 1)-th highest are the ones that join families.
    threshold = linkage[-(n_clusters - 1), 2] if 1 < n_clusters <= len(Z) else 0
    labelled = len(names) <= max_labels
    dendrogram(
        linkage,
        ax=ax,
        labels=names if labelled else None,
        no_labels=not labelled,
        color_threshold=threshold,
        leaf_rotation=90,
    )
    ax.set_ylabel("average distance between families")
    ax.set_title(f"{len(names)} models in {labels.max() + 1} families")
    return ax


def plot_convergence(data, models=None, *, ax=None):
    """Draw how embeddings converge as evaluations are added.

    Read more in the :ref:`User Guide <static_figures>`.

    Parameters
    ----------
    data : dict
        What :func:`~sklocus.report.map_data` returns, with convergence (it needs
        the evaluation sets and the embedder).
    models : sequence of str, default=None
        Models to draw a line for; the median over all models is always drawn.
    ax : matplotlib Axes, default=None

    Returns
    -------
    matplotlib.axes.Axes
    """
    import matplotlib.pyplot as plt

    if not data.get("convergence"):
        raise ValueError(
            "data has no convergence; map_data computes it from evaluation_sets "
            "and an embedder"
        )
    sizes = np.array(data["convergence"]["n"])
    distance = np.array(data["convergence"]["distance"], dtype=np.float64)
    if ax is None:
        ax = plt.figure(figsize=(6, 4)).add_subplot()
    position = {name: i for i, name in enumerate(data["models"])}
    for name in models or []:
        if name not in position:
            raise ValueError(f"model {name!r} is not in the map")
        ax.plot(sizes, distance[position[name]], marker="o", alpha=0.7, label=name)
    with warnings.catch_warnings():  # a size no model reaches has no median
        warnings.simplefilter("ignore", RuntimeWarning)
        median = np.nanmedian(distance, axis=0)
    ax.plot(sizes, median, color="black", linewidth=2.5, label="median model")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(n) for n in sizes])
    ax.set_xlabel("evaluations used")
    ax.set_ylabel("distance to the embedding on all")
    ax.legend(fontsize=8)
    return ax
