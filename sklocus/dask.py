"""Embedding a ``dask.dataframe`` of evaluations across the workers of a cluster.

Needs the ``dask`` extra (``pip install "sklocus[dask]"``); ``import sklocus``
does not import Dask. Each partition of a long table of evaluations (one row per
model, query and score) that holds whole models is embedded by
:meth:`LocusEmbedder.transform <sklocus.LocusEmbedder.transform>` on a worker,
with exactly the checks of :func:`~sklocus.evaluations.from_long`. The fitted
embedder is serialised once, not once per partition: on a distributed cluster it
is scattered and the tasks name it by its key, each worker fetching it from a
peer when its first partition needs it.
"""

from __future__ import annotations

import dask
import dask.dataframe  # noqa: F401  (fails here, not mid-graph, without the extra)
import pandas as pd
from sklearn.utils.validation import check_is_fitted

from sklocus._streaming import MODEL, SIZE, embed_long, embedding_frame
from sklocus.evaluations import _check_long_columns

__all__ = ["check_partitioned_by_model", "embed_dask", "partition_by_model"]


def _client(client):
    """Return ``client``, else the current distributed client, else None."""
    if client is not None:
        return client
    try:
        from distributed import get_client
    except ImportError:  # dask without distributed: the local schedulers
        return None
    try:
        return get_client()
    except ValueError:  # no client: the local schedulers
        return None


def _embed_partition(partition, embedder, columns, duplicates, meta):
    """Embed the models of one partition; the task each worker runs."""
    if columns["model"] not in partition.columns:
        partition = partition.reset_index()  # the model is the index
    if len(partition) == 0:
        return meta
    batch = embed_long(embedder, partition, **columns, duplicates=duplicates)
    frame = embedding_frame(batch)
    frame[MODEL] = frame[MODEL].astype(meta[MODEL].dtype)
    return frame


def _meta(frame, model, embedding_dim):
    names = frame._meta.index if model not in frame.columns else frame._meta[model]
    columns = {
        MODEL: pd.Series([], dtype=names.dtype),
        SIZE: pd.Series([], dtype="int64"),
    }
    for i in range(embedding_dim):
        columns[f"z{i}"] = pd.Series([], dtype="float32")
    return pd.DataFrame(columns)


def check_partitioned_by_model(frame, model="model"):
    """Fail when a model's rows lie in more than one partition of ``frame``.

    Reads the model column alone (one light pass over the data). A frame indexed
    by the model with known divisions (after ``set_index``) needs no pass.

    Read more in the :ref:`User Guide <dask_cluster>`.

    Parameters
    ----------
    frame : dask.dataframe.DataFrame
        A long table of evaluations.
    model : str, default="model"
        The model column (or the name of the index holding the models).

    Raises
    ------
    ValueError
        Naming the first model found in two partitions, and the partitions.

    Examples
    --------
    >>> import dask.dataframe as dd
    >>> import pandas as pd
    >>> from sklocus.dask import check_partitioned_by_model
    >>> table = pd.DataFrame({"model": ["a", "b", "a"], "query": ["q1", "q1", "q2"],
    ...                       "score": [1, 0, 1]})
    >>> frame = dd.from_pandas(table, npartitions=2, sort=False)
    >>> check_partitioned_by_model(frame)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: model 'a' has rows in partitions 0 and 1; each model's rows ...
    """
    if model not in frame.columns:
        if frame.index.name == model and frame.known_divisions:
            return
        names = frame.index.to_series()
    else:
        names = frame[model]
    per_partition = names.map_partitions(
        lambda values: pd.Series(pd.unique(values.to_numpy())),
        meta=pd.Series([], dtype=names.dtype),
    )
    found = {}
    for index, values in enumerate(dask.compute(*per_partition.to_delayed())):
        for name in values:
            if name in found:
                raise ValueError(
                    f"model {name!r} has rows in partitions {found[name]} and "
                    f"{index}; each model's rows must be in one partition: "
                    "repartition with sklocus.dask.partition_by_model(frame)"
                )
            found[name] = index


def partition_by_model(frame, model="model", npartitions=None):
    """Move every model's rows into one partition (a shuffle on the model).

    Read more in the :ref:`User Guide <dask_cluster>`.

    Parameters
    ----------
    frame : dask.dataframe.DataFrame
        A long table of evaluations, partitioned any way.
    model : str, default="model"
        The model column.
    npartitions : int, default=None
        Partitions of the result; ``None`` keeps ``frame``'s number.

    Returns
    -------
    dask.dataframe.DataFrame
        The same rows, each model's in one partition (models hashed to
        partitions, so not in their original order).

    Examples
    --------
    >>> import dask.dataframe as dd
    >>> import pandas as pd
    >>> from sklocus.dask import check_partitioned_by_model, partition_by_model
    >>> table = pd.DataFrame({"model": ["a", "a", "b"], "query": ["q1", "q2", "q1"],
    ...                       "score": [1, 0, 1]})
    >>> frame = partition_by_model(dd.from_pandas(table, npartitions=2))
    >>> check_partitioned_by_model(frame)  # no error
    """
    if model not in frame.columns:
        raise KeyError(
            f"the model column {model!r} is not in the frame; its columns are "
            f"{list(frame.columns)}"
        )
    return frame.shuffle(on=model, npartitions=npartitions)


def embed_dask(
    embedder,
    frame,
    *,
    model="model",
    query="query",
    score="score",
    duplicates="error",
    client=None,
    check_partitions=True,
):
    """Embed the models of a Dask DataFrame of evaluations, partition by partition.

    Each partition goes through :func:`~sklocus.evaluations.from_long` and
    ``embedder.transform`` on a worker. On a distributed cluster (``client``, or
    the current client) the embedder is scattered once (``client.scatter``) and
    each task refers to it by its key, so it is not serialised again per
    partition: a worker fetches it from a peer when its first partition needs
    it. Dask's memory manager may drop a copy a worker no longer needs, to be
    fetched again if more partitions come to it; it never broadcasts a copy to
    workers that run none (``broadcast=True`` would be undone by that manager).
    With Dask's local schedulers the embedder is one shared node of the graph.
    A set's vector does not depend on the other sets embedded with it, so the
    vectors are those of ``embedder.transform`` on all the models in one
    process, up to float32 rounding (the user guide says how close).

    Read more in the :ref:`User Guide <dask_cluster>`.

    Parameters
    ----------
    embedder : LocusEmbedder
        A fitted embedder.
    frame : dask.dataframe.DataFrame
        A long table of evaluations in which each model's rows lie in one
        partition (:func:`partition_by_model` makes one). The model may be a
        column or the index.
    model, query, score : str, default="model", "query", "score"
        Names of the columns holding the model, the query and the score.
    duplicates : {"error", "mean", "majority"}, default="error"
        What to do with several rows for one (model, query) pair.
    client : distributed.Client, default=None
        The cluster to ship the embedder to; ``None`` takes the current client,
        if any.
    check_partitions : bool, default=True
        First check, by one pass over the model column, that no model is spread
        over two partitions (:func:`check_partitioned_by_model`); such a model
        would otherwise come out twice, each time embedded from part of its rows.

    Returns
    -------
    dask.dataframe.DataFrame
        One row per model, in the order of the partitions: ``model``,
        ``n_evaluations`` and ``z0`` to ``z{d-1}`` (float32), the table ``sklocus
        embed`` writes. Compute it, or write it with ``to_parquet``.

    Examples
    --------
    >>> import dask.dataframe as dd
    >>> import pandas as pd
    >>> from sklocus import LocusEmbedder
    >>> from sklocus.dask import embed_dask
    >>> from sklocus.datasets import make_evaluations
    >>> data = make_evaluations(n_models=6, n_queries=40, query_dim=8, random_state=0)
    >>> embedder = LocusEmbedder(query_encoder=data.encoder, embedding_dim=8,
    ...     n_latents=4, n_layers=1, n_heads=2, max_epochs=1, epoch_size=1,
    ...     random_state=0).fit(data.evaluation_sets)
    >>> rows = [(name, q, s) for name, sets in zip(data.model_names,
    ...         data.evaluation_sets) for q, s in sets.items()]
    >>> table = pd.DataFrame(rows, columns=["model", "query", "score"])
    >>> frame = dd.from_pandas(table.set_index("model"), npartitions=3)
    >>> embeddings = embed_dask(embedder, frame).compute()
    >>> embeddings.shape
    (6, 10)
    """
    check_is_fitted(embedder, "net_")
    present = list(frame.columns) + [frame.index.name]
    _check_long_columns(present, model=model, query=query, score=score)
    if check_partitions:
        check_partitioned_by_model(frame, model)
    meta = _meta(frame, model, embedder.embedding_dim)
    client = _client(client)
    if client is not None:
        shipped = client.scatter(embedder, hash=False)
    else:
        shipped = dask.delayed(embedder, pure=True)
    columns = {"model": model, "query": query, "score": score}
    return frame.map_partitions(
        _embed_partition,
        shipped,
        columns,
        duplicates,
        meta,
        meta=meta,
        align_dataframes=False,
        enforce_metadata=False,
    )
