"""Embedding a Parquet dataset of evaluations batch by batch, in flat memory.

A hub-scale pool (hundreds of thousands of models, thousands of evaluations each)
does not fit in memory as a list of dicts. When the long table (one row per
model, query and score) is sorted or partitioned by model, each model's rows
follow one another, so the table can be read a record batch at a time, a few
thousand models embedded at once, and the vectors written as they come. Only the
models of one batch and the names of the models seen so far (to refuse a model
whose rows reappear) are ever held.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from sklearn.utils.validation import check_is_fitted

from sklocus._validation import check_count, shown
from sklocus.evaluations import (
    RaggedEvaluations,
    _check_long_columns,
    _row_error,
    from_long,
)

__all__ = ["EmbeddingBatch", "embed_parquet", "iter_embeddings"]

# Columns of an embedding table besides the vector's z0, z1, ... (as `sklocus
# embed` writes them).
MODEL, SIZE = "model", "n_evaluations"


class EmbeddingBatch(NamedTuple):
    """The embeddings of one batch of models, as :func:`iter_embeddings` yields them.

    Read more in the :ref:`User Guide <streaming_parquet>`.

    Attributes
    ----------
    model_names : list
        The models, in the order of the dataset.
    n_evaluations : ndarray of shape (n_models,), dtype int64
        Evaluations of each model (after ``duplicates`` resolved repeats).
    embeddings : ndarray of shape (n_models, embedding_dim), dtype float32
        What ``embedder.transform`` gives for each model.
    """

    model_names: list
    n_evaluations: np.ndarray
    embeddings: np.ndarray


def embed_long(embedder, frame, *, model, query, score, duplicates):
    """Embed every model of one long table held in memory.

    The step that the streaming path runs on each batch and the Dask path on each
    partition: :meth:`RaggedEvaluations.from_long` (the checks and messages of
    ``from_long``) and ``embedder.transform``.

    Returns
    -------
    EmbeddingBatch
    """
    ragged = RaggedEvaluations.from_long(
        frame, model=model, query=query, score=score, duplicates=duplicates
    )
    return EmbeddingBatch(
        list(ragged.model_names), ragged.sizes, embedder.transform(ragged)
    )


def embedding_frame(batch):
    """Return an :class:`EmbeddingBatch` as a table: model, n_evaluations, z0, ..."""
    frame = pd.DataFrame({MODEL: batch.model_names, SIZE: batch.n_evaluations})
    vectors = pd.DataFrame(
        batch.embeddings,
        columns=[f"z{i}" for i in range(batch.embeddings.shape[1])],
    )
    return pd.concat([frame, vectors], axis=1)


def _record_batches(source, columns, batch_rows):
    """Yield the columns of ``source`` as record batches, in their stored order.

    A single file is read row group by row group (``ParquetFile.iter_batches``);
    a folder, or a :class:`pyarrow.dataset.Dataset`, is scanned one fragment
    (file) after another, with no read-ahead, so that memory holds one batch.
    """
    if isinstance(source, ds.Dataset):
        dataset = source
    else:
        path = Path(source)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such Parquet file or folder")
        if path.is_file():
            parquet = pq.ParquetFile(path)
            _check_long_columns(parquet.schema_arrow.names, **columns, where=str(path))
            yield from parquet.iter_batches(
                batch_size=batch_rows, columns=list(columns.values())
            )
            return
        dataset = ds.dataset(path, format="parquet", partitioning="hive")
    _check_long_columns(dataset.schema.names, **columns, where="the dataset")
    for fragment in dataset.get_fragments():
        yield from fragment.to_batches(
            schema=dataset.schema,
            columns=list(columns.values()),
            batch_size=batch_rows,
            batch_readahead=0,
            fragment_readahead=0,
            use_threads=False,
        )


def _model_runs(models):
    """Start of each run of equal values of ``models`` and the run's value."""
    values = models.to_numpy(dtype=object)
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    return starts, values[starts]


def iter_embeddings(
    embedder,
    source,
    *,
    model="model",
    query="query",
    score="score",
    duplicates="error",
    batch_models=1024,
    batch_rows=65536,
):
    """Embed the models of a Parquet dataset of evaluations, batch by batch.

    The dataset is a long table, one row per evaluation, sorted or partitioned by
    model: each model's rows follow one another (a model may straddle two record
    batches or row groups, not two places in the table). It is read
    ``batch_rows`` rows at a time; each time ``batch_models`` models are
    complete, they are checked and embedded as ``from_long`` and
    ``embedder.transform`` would, and yielded. Memory holds one batch of rows and
    models and the names of the models seen, whatever the size of the dataset.

    Read more in the :ref:`User Guide <streaming_parquet>`.

    Parameters
    ----------
    embedder : LocusEmbedder
        A fitted embedder.
    source : str, path or pyarrow.dataset.Dataset
        A Parquet file, a folder of Parquet files (hive partitions allowed, each
        model in one file), or a dataset opened with :func:`pyarrow.dataset.dataset`.
    model, query, score : str, default="model", "query", "score"
        Names of the columns holding the model, the query and the score.
    duplicates : {"error", "mean", "majority"}, default="error"
        What to do with several rows for one (model, query) pair, as in
        :func:`~sklocus.evaluations.from_long`.
    batch_models : int, default=1024
        Models embedded (and yielded) at a time; the last batch may hold fewer.
    batch_rows : int, default=65536
        Rows read from the dataset at a time.

    Yields
    ------
    EmbeddingBatch
        ``(model_names, n_evaluations, embeddings)`` of each batch of models, in
        the order of the dataset.

    Raises
    ------
    ValueError
        If a model's rows reappear after another model's (the message names the
        model and the row), or for any input ``from_long`` refuses: a missing
        model or query, a score outside [0, 1], a repeated (model, query) pair.
        Rows are numbered from 0 over the whole dataset.
    KeyError
        If a column is missing; the message lists the dataset's columns.

    See Also
    --------
    embed_parquet : Write the embeddings to a Parquet file as they come.
    sklocus.dask.embed_dask : The same across the workers of a Dask cluster.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import pandas as pd
    >>> from sklocus import LocusEmbedder, iter_embeddings
    >>> from sklocus.datasets import make_evaluations
    >>> data = make_evaluations(n_models=6, n_queries=40, query_dim=8, random_state=0)
    >>> embedder = LocusEmbedder(query_encoder=data.encoder, embedding_dim=8,
    ...     n_latents=4, n_layers=1, n_heads=2, max_epochs=1, epoch_size=1,
    ...     random_state=0).fit(data.evaluation_sets)
    >>> rows = [(name, q, s) for name, sets in zip(data.model_names,
    ...         data.evaluation_sets) for q, s in sets.items()]
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "evals.parquet"
    >>> pd.DataFrame(rows, columns=["model", "query", "score"]).to_parquet(path)
    >>> [len(b.model_names) for b in iter_embeddings(embedder, path, batch_models=4)]
    [4, 2]
    """
    check_is_fitted(embedder, "net_")
    check_count(batch_models, "batch_models")
    check_count(batch_rows, "batch_rows")
    columns = {"model": model, "query": query, "score": score}
    settings = dict(columns, duplicates=duplicates)
    pending = []  # complete models' rows, waiting for a batch to fill
    n_pending = 0
    carried, carried_name = [], None  # the last model read, which may go on
    seen = set()  # the complete models
    n_rows = 0
    for record_batch in _record_batches(source, columns, batch_rows):
        if record_batch.num_rows == 0:
            continue
        chunk = record_batch.to_pandas()
        # Rows numbered over the whole dataset, for from_long's messages.
        chunk.index = pd.RangeIndex(n_rows, n_rows + len(chunk))
        n_rows += len(chunk)
        missing = chunk[model].isna().to_numpy()
        if missing.any():
            # from_long names the row as it does for a table in memory.
            from_long(chunk[missing], **settings)
        starts, names = _model_runs(chunk[model])
        if carried and names[0] == carried_name:
            if len(starts) == 1:
                carried.append(chunk)
                continue
            carried.append(chunk.iloc[: starts[1]])
            starts, names = starts[1:], names[1:]
        if carried:  # it ended where this chunk's next model begins
            pending.extend(carried)
            n_pending += 1
            seen.add(carried_name)
        _check_runs(names, starts, chunk.index, seen, model)
        last = starts[-1]
        if len(starts) > 1:
            pending.append(chunk.iloc[starts[0] : last])
            n_pending += len(starts) - 1
            seen.update(names[:-1])
        carried, carried_name = [chunk.iloc[last:]], names[-1]
        while n_pending >= batch_models:
            rows = pd.concat(pending)
            starts, _ = _model_runs(rows[model])
            cut = starts[batch_models] if len(starts) > batch_models else len(rows)
            yield embed_long(embedder, rows.iloc[:cut], **settings)
            pending = [rows.iloc[cut:]] if cut < len(rows) else []
            n_pending -= batch_models
    pending.extend(carried)
    if pending:
        rows = pd.concat(pending)
        # The last pieces hold at most batch_models + 1 models.
        starts, _ = _model_runs(rows[model])
        for first in range(0, len(starts), batch_models):
            stop = first + batch_models
            end = starts[stop] if stop < len(starts) else len(rows)
            yield embed_long(embedder, rows.iloc[starts[first] : end], **settings)
    else:
        raise ValueError("the dataset has no rows; expected one row per evaluation")


def _check_runs(names, starts, index, seen, column):
    """Refuse a model whose rows are in two places of the table."""
    repeated = pd.Index(names).duplicated()
    again = np.flatnonzero(
        repeated | np.fromiter((name in seen for name in names), bool, len(names))
    )
    if len(again):
        name = names[again[0]]
        row = index[starts[again[0]]]
        raise _row_error(
            ValueError,
            row,
            f"starts the rows of model {shown(name)} again, after those of other "
            f"models; the data must be sorted or partitioned by model (column "
            f"{column!r}), each model's rows together",
        )


def embed_parquet(
    embedder,
    source,
    output,
    *,
    model="model",
    query="query",
    score="score",
    duplicates="error",
    batch_models=1024,
    batch_rows=65536,
):
    """Embed the models of a Parquet dataset and write the vectors as they come.

    Reads ``source`` as :func:`iter_embeddings` does and appends each batch of
    embeddings to the Parquet file ``output``, in flat memory: one row per model
    with the columns ``model``, ``n_evaluations`` and ``z0`` to ``z{d-1}``, the
    table ``sklocus embed`` writes.

    Read more in the :ref:`User Guide <streaming_parquet>`.

    Parameters
    ----------
    embedder : LocusEmbedder
        A fitted embedder.
    source : str, path or pyarrow.dataset.Dataset
        The evaluations, sorted or partitioned by model (see :func:`iter_embeddings`).
    output : str or path
        The Parquet file to write. It is written whole or not at all: rows go to
        a temporary file beside it, renamed to ``output`` at the end.
    model, query, score : str, default="model", "query", "score"
        Names of the columns holding the model, the query and the score.
    duplicates : {"error", "mean", "majority"}, default="error"
        What to do with several rows for one (model, query) pair.
    batch_models : int, default=1024
        Models embedded and written at a time.
    batch_rows : int, default=65536
        Rows read from the dataset at a time.

    Returns
    -------
    int
        The number of models written.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> import pandas as pd
    >>> from sklocus import LocusEmbedder, embed_parquet
    >>> from sklocus.datasets import make_evaluations
    >>> data = make_evaluations(n_models=6, n_queries=40, query_dim=8, random_state=0)
    >>> embedder = LocusEmbedder(query_encoder=data.encoder, embedding_dim=8,
    ...     n_latents=4, n_layers=1, n_heads=2, max_epochs=1, epoch_size=1,
    ...     random_state=0).fit(data.evaluation_sets)
    >>> rows = [(name, q, s) for name, sets in zip(data.model_names,
    ...         data.evaluation_sets) for q, s in sets.items()]
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> pd.DataFrame(rows, columns=["model", "query", "score"]).to_parquet(
    ...     folder / "evals.parquet")
    >>> embed_parquet(embedder, folder / "evals.parquet", folder / "emb.parquet")
    6
    >>> pd.read_parquet(folder / "emb.parquet").columns[:4].tolist()
    ['model', 'n_evaluations', 'z0', 'z1']
    """
    output = Path(output)
    partial = output.with_name(output.name + ".partial")
    batches = iter_embeddings(
        embedder,
        source,
        model=model,
        query=query,
        score=score,
        duplicates=duplicates,
        batch_models=batch_models,
        batch_rows=batch_rows,
    )
    writer, n_models = None, 0
    try:
        for batch in batches:
            table = pa.Table.from_pandas(embedding_frame(batch), preserve_index=False)
            if writer is None:
                writer = pq.ParquetWriter(partial, table.schema)
            writer.write_table(table.cast(writer.schema))
            n_models += len(batch.model_names)
        writer.close()
        writer = None
        partial.replace(output)
    finally:
        if writer is not None:
            writer.close()
        partial.unlink(missing_ok=True)
    return n_models
