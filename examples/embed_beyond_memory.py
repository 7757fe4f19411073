"""
Embedding a pool that does not fit in memory
============================================

A hub of hundreds of thousands of models, each with thousands of evaluations,
does not fit in memory as a list of dicts. Kept as a Parquet dataset sorted by
model (one row per model, query and score), it can be embedded a batch of
models at a time in flat memory, or partition by partition on a Dask cluster.
Both give the vectors ``transform`` gives on the whole list: a model's vector
does not depend on the models embedded with it, beyond float32 rounding.
"""

# %%
# A trained embedder and a long table on disk
# -------------------------------------------
#
# A small network trained in seconds on synthetic models; the table is written
# in row groups of 1,000 rows, so most models straddle two of them.
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from sklocus import LocusEmbedder, embed_parquet, iter_embeddings
from sklocus.datasets import make_evaluations

data = make_evaluations(n_models=300, n_queries=500, random_state=0)
embedder = LocusEmbedder(
    query_encoder=data.encoder,
    embedding_dim=32,
    n_latents=8,
    max_epochs=2,
    epoch_size=512,
    random_state=0,
).fit(data.evaluation_sets)

rows = [
    (name, query, score)
    for name, evaluations in zip(data.model_names, data.evaluation_sets)
    for query, score in evaluations.items()
]
table = pd.DataFrame(rows, columns=["model", "query", "score"])
folder = Path(tempfile.mkdtemp())
table.to_parquet(folder / "evals.parquet", row_group_size=1000)
print(f"{len(table):,} evaluations of {table['model'].nunique()} models on disk")


def largest_difference(vectors, reference):
    """Largest coordinate difference, relative to its reference vector's scale."""
    scale = np.abs(reference).max(axis=1, keepdims=True)
    return float((np.abs(vectors - reference) / scale).max())


# %%
# Streaming: a batch of models at a time
# --------------------------------------
#
# :func:`~sklocus.iter_embeddings` reads the file a record batch at a time and
# yields the embeddings of ``batch_models`` models at once; memory holds one
# batch, whatever the size of the file. :func:`~sklocus.embed_parquet` writes
# them to a Parquet file as they come, the table ``sklocus embed`` writes.
batches = list(iter_embeddings(embedder, folder / "evals.parquet", batch_models=64))
print("batches of", [len(batch.model_names) for batch in batches], "models")
streamed = np.vstack([batch.embeddings for batch in batches])
whole = embedder.transform(data.evaluation_sets)
# Among other batch-mates, a set can be rounded differently in its last bits
# (the user guide's "Embedding beyond memory" says why): within 2e-6 of its
# largest coordinate, where float32 resolves 6e-8.
gap = largest_difference(streamed, whole)
print(f"streamed vectors against transform's, largest difference: {gap:.1e}")

n_models = embed_parquet(embedder, folder / "evals.parquet", folder / "emb.parquet")
print(pd.read_parquet(folder / "emb.parquet").iloc[:3, :5])

# %%
# Dask: partitions embedded on workers
# ------------------------------------
#
# :func:`sklocus.dask.embed_dask` maps ``transform`` over the partitions of a
# ``dask.dataframe`` whose partitions hold whole models, with the embedder
# scattered once and fetched by each worker that needs it. This cluster runs
# its workers as threads of this process, which suits a script; on a real
# cluster they are processes on other machines, and the vectors are the same.
import dask.dataframe as dd  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

from sklocus.dask import embed_dask  # noqa: E402

with (
    LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster,
    Client(cluster),
):
    # Sorted by model into 4 partitions: no model is split between two.
    frame = dd.read_parquet(folder / "evals.parquet").set_index("model", npartitions=4)
    embeddings = embed_dask(embedder, frame).compute()

on_cluster = embeddings.set_index("model").loc[data.model_names].filter(like="z")
gap = largest_difference(on_cluster.to_numpy(), whole)
print(f"dask vectors against transform's, largest difference: {gap:.1e}")

# %%
# The files were only for this example.
import shutil  # noqa: E402

shutil.rmtree(folder)
