"""The geometry of the model space: distances, substitutes and neighbours.

Every function takes embeddings of shape ``(n_models, embedding_dim)``, as made by
:meth:`LocusEmbedder.transform <sklocus.LocusEmbedder.transform>`, and a ``metric``,
``"cosine"`` or ``"euclidean"``.
"""

from __future__ import annotations

import numbers

import numpy as np
from sklearn.metrics import pairwise_distances

__all__ = ["check_embeddings", "model_distances", "nearest_models"]

METRICS = ("cosine", "euclidean")


def check_embeddings(embeddings, *, name="embeddings"):
    """Check model embeddings: a finite 2-D float array.

    Parameters
    ----------
    embeddings : array-like of shape (n_models, embedding_dim)
    name : str, default="embeddings"
        What to call them in error messages.

    Returns
    -------
    ndarray of shape (n_models, embedding_dim), dtype float64
    """
    embeddings = np.asarray(embeddings, dtype=np.float64)
    if embeddings.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D array (n_models, embedding_dim); got shape "
            f"{embeddings.shape}"
        )
    finite = np.isfinite(embeddings).all(axis=1)
    if not finite.all():
        raise ValueError(f"{name} row {int(np.argmin(finite))} is not finite")
    return embeddings


def _check_metric(metric):
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is not one of {METRICS}")
    return metric


def model_distances(embeddings, other=None, *, metric="cosine"):
    """Distances between models.

    Parameters
    ----------
    embeddings : array-like of shape (n_models, embedding_dim)
    other : array-like of shape (n_other, embedding_dim), default=None
        Distances to these models; by default among ``embeddings`` themselves.
    metric : {"cosine", "euclidean"}, default="cosine"
        Cosine distance is ``1 - cos(angle)``, in [0, 2].

    Returns
    -------
    ndarray of shape (n_models, n_other)

    Examples
    --------
    >>> from sklocus.geometry import model_distances
    >>> model_distances([[1, 0], [0, 2]], metric="euclidean").round(3)
    array([[0.   , 2.236],
           [2.236, 0.   ]])
    """
    embeddings = check_embeddings(embeddings)
    other = embeddings if other is None else check_embeddings(other, name="other")
    if other.shape[1] != embeddings.shape[1]:
        raise ValueError(
            f"other has width {other.shape[1]} but embeddings have width "
            f"{embeddings.shape[1]}"
        )
    distances = pairwise_distances(embeddings, other, metric=_check_metric(metric))
    return np.maximum(distances, 0.0)


def nearest_models(embeddings, k=5, *, metric="cosine"):
    """Each model's ``k`` nearest other models.

    Parameters
    ----------
    embeddings : array-like of shape (n_models, embedding_dim)
    k : int, default=5
        Neighbours per model; at most ``n_models - 1``.
    metric : {"cosine", "euclidean"}, default="cosine"

    Returns
    -------
    indices : ndarray of shape (n_models, k), int
        The neighbours, nearest first (ties by index).
    distances : ndarray of shape (n_models, k)

    Examples
    --------
    >>> from sklocus.geometry import nearest_models
    >>> indices, distances = nearest_models([[0.0], [1.0], [3.0]], k=1,
    ...                                     metric="euclidean")
    >>> indices.ravel().tolist(), distances.ravel().tolist()
    ([1, 0, 1], [1.0, 1.0, 2.0])
    """
    distances = model_distances(embeddings, metric=metric)
    n_models = len(distances)
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"k={k!r} must be a positive integer")
    if k > n_models - 1:
        raise ValueError(f"k={k} neighbours asked for, but only {n_models} models")
    np.fill_diagonal(distances, np.inf)
    indices = np.argsort(distances, axis=1, kind="stable")[:, :k]
    return indices, np.take_along_axis(distances, indices, axis=1)
