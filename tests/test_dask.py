"""The Dask path: partitions of a long table embedded on the workers of a cluster.

Needs the dask extra; skipped where it is missing, except on CI, where that is a
failure.
"""

import copy
import os

import numpy as np
import pytest
from tiny import TINY_NETWORK, CountingEmbedder, long_table
from vectors import assert_same_vectors

try:
    import dask
    import dask.dataframe as dd
    from distributed import Client, LocalCluster
except ImportError as error:  # pragma: no cover - depends on the environment
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but the dask extra is missing: {error}")
    pytest.skip(f"the dask extra is not installed ({error})", allow_module_level=True)

from sklocus.dask import check_partitioned_by_model, embed_dask, partition_by_model
from sklocus.datasets import make_evaluations
from sklocus.evaluations import from_long

# Starts local Dask clusters of worker processes.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained():
    data = make_evaluations(
        n_models=24,
        n_queries=200,
        evals_per_model=(5, 120),
        query_dim=8,
        random_state=0,
    )
    # Counts its unpickling in each process: the proof of shipping once per worker.
    embedder = CountingEmbedder(query_encoder=data.encoder, **TINY_NETWORK)
    embedder.fit(data.evaluation_sets)
    table = long_table(data)
    return data, embedder, table, embedder.transform(data.evaluation_sets)


def vectors_by_model(frame, names):
    return frame.set_index("model").loc[names].filter(like="z").to_numpy()


# The tests without a cluster come first: once the cluster's client exists, it
# is the current one, and Dask sends every computation to it.
def test_local_scheduler_and_shuffled_partitions(trained):
    data, embedder, table, expected = trained
    frame = dd.from_pandas(table, npartitions=4, sort=False)
    with pytest.raises(ValueError) as error:
        embed_dask(embedder, frame)
    message = str(error.value)
    assert "has rows in partitions" in message
    assert "sklocus.dask.partition_by_model" in message
    shuffled = partition_by_model(frame)
    with dask.config.set(scheduler="synchronous"):
        embeddings = embed_dask(embedder, shuffled).compute()
        rows = shuffled.compute()
    # The shuffle reorders each model's evaluations, and attention sums them in
    # that order; the shuffle computed twice need not order them alike, so the
    # vectors agree up to float32 summation order (a full suite run saw 6.7e-6).
    sets, names = from_long(rows)
    np.testing.assert_allclose(
        vectors_by_model(embeddings, names),
        embedder.transform(sets),
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_allclose(
        vectors_by_model(embeddings, data.model_names), expected, rtol=1e-5, atol=1e-5
    )
    check_partitioned_by_model(partition_by_model(frame, npartitions=3))


def test_bad_columns_and_scores_get_the_library_messages(trained):
    _, embedder, table, _ = trained
    frame = dd.from_pandas(table.set_index("model"), npartitions=2, sort=True)
    with pytest.raises(KeyError, match=r"the score column 'correct' is not in"):
        embed_dask(embedder, frame, score="correct")
    broken = table.copy()
    broken.loc[5, "score"] = 1.7
    frame = dd.from_pandas(broken.set_index("model"), npartitions=2, sort=True)
    with dask.config.set(scheduler="synchronous"):
        with pytest.raises(ValueError, match=r"has score 1.7 for query"):
            embed_dask(embedder, frame).compute()
    with pytest.raises(KeyError, match="the model column 'name' is not in"):
        partition_by_model(frame.reset_index(), model="name")


@pytest.fixture(scope="module")
def client():
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            worker_dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def test_on_two_worker_processes_the_vectors_agree(trained, client):
    data, embedder, table, expected = trained
    # Twelve partitions of two whole models each, sorted by model.
    frame = dd.from_pandas(table.set_index("model"), npartitions=12, sort=True)
    assert frame.npartitions == 12
    embeddings = embed_dask(embedder, frame).compute()
    assert sorted(embeddings["model"]) == sorted(data.model_names)
    assert embeddings["n_evaluations"].dtype == np.int64
    # Workers run torch on one thread, this process on two, and every
    # partition batches other sets together: the same vectors all the same.
    assert_same_vectors(vectors_by_model(embeddings, data.model_names), expected)
    # Shipped in each task, the embedder would be unpickled once per partition.
    # Named by its key, a worker fetches it for its first partition, and again
    # only if Dask's memory manager dropped its copy between two of them.
    loads = client.run(lambda: CountingEmbedder.loads)
    assert 1 <= sum(loads.values()) < frame.npartitions // 2, loads


def test_refined_vectors_on_two_worker_processes_agree(trained, client):
    data, embedder, table, _ = trained
    refining = copy.deepcopy(embedder).set_params(refine_steps=10)
    frame = dd.from_pandas(table.set_index("model"), npartitions=6, sort=True)
    embeddings = embed_dask(refining, frame).compute()
    assert_same_vectors(
        vectors_by_model(embeddings, data.model_names),
        refining.transform(data.evaluation_sets),
    )
