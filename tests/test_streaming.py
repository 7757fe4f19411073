"""Embedding a Parquet dataset batch by batch: the streaming path."""

import copy

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tiny import TINY_NETWORK, long_table
from vectors import assert_same_vectors

from sklocus import LocusEmbedder, embed_parquet, iter_embeddings
from sklocus.datasets import make_evaluations


@pytest.fixture(scope="module")
def trained():
    data = make_evaluations(
        n_models=30,
        n_queries=200,
        evals_per_model=(5, 120),
        query_dim=8,
        random_state=0,
    )
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK)
    embedder.fit(data.evaluation_sets)
    table = long_table(data)
    return data, embedder, table


def clone_fitted(embedder):
    """A copy of a fitted embedder whose parameters can change freely."""
    return copy.deepcopy(embedder)


def write(table, path, row_group_size=None):
    pq.write_table(
        pa.Table.from_pandas(table, preserve_index=False),
        path,
        row_group_size=row_group_size,
    )
    return path


def streamed(embedder, path, **options):
    batches = list(iter_embeddings(embedder, path, **options))
    names = [name for batch in batches for name in batch.model_names]
    return batches, names, np.vstack([batch.embeddings for batch in batches])


@pytest.mark.slow
@pytest.mark.parametrize("refine_steps", [0, 10])
@pytest.mark.parametrize(
    "batch_models, batch_rows", [(1024, 65536), (7, 50), (1, 13), (4, 3)]
)
def test_streaming_equals_transform_of_the_whole_list(
    trained, tmp_path, batch_models, batch_rows, refine_steps
):
    # Read batches of 50, 13 or 3 rows split most models over two or more.
    data, embedder, table = trained
    embedder = clone_fitted(embedder).set_params(refine_steps=refine_steps)
    path = write(table, tmp_path / "evals.parquet", row_group_size=37)
    batches, names, Z = streamed(
        embedder, path, batch_models=batch_models, batch_rows=batch_rows
    )
    assert names == data.model_names
    assert all(len(b.model_names) == batch_models for b in batches[:-1])
    sizes = np.concatenate([batch.n_evaluations for batch in batches])
    assert sizes.tolist() == [len(s) for s in data.evaluation_sets]
    # Refined or not, a set's vector does not depend on its batch-mates beyond
    # float32 rounding (tests/vectors.py).
    assert_same_vectors(Z, embedder.transform(data.evaluation_sets))


def test_a_folder_of_files_and_a_hive_partitioned_dataset(trained, tmp_path):
    data, embedder, table = trained
    folder = tmp_path / "parts"
    folder.mkdir()
    models = table["model"].unique()
    for part, names in enumerate(np.array_split(models, 4)):
        write(table[table["model"].isin(names)], folder / f"part.{part}.parquet")
    _, names, Z = streamed(embedder, folder, batch_models=5)
    assert names == data.model_names
    assert_same_vectors(Z, embedder.transform(data.evaluation_sets))

    hive = tmp_path / "hive"
    pq.write_to_dataset(
        pa.Table.from_pandas(table, preserve_index=False), hive, ["model"]
    )
    _, names, Z = streamed(embedder, hive)
    assert sorted(names) == sorted(data.model_names)
    order = [data.model_names.index(name) for name in names]
    sets = [data.evaluation_sets[i] for i in order]
    assert_same_vectors(Z, embedder.transform(sets))


def test_embed_parquet_writes_the_table_sklocus_embed_writes(trained, tmp_path):
    data, embedder, table = trained
    path = write(table, tmp_path / "evals.parquet", row_group_size=100)
    output = tmp_path / "emb.parquet"
    n_models = embed_parquet(embedder, path, output, batch_models=8, batch_rows=64)
    assert n_models == len(data.model_names)
    frame = pd.read_parquet(output)
    dim = embedder.embedding_dim
    assert frame.columns.tolist() == ["model", "n_evaluations"] + [
        f"z{i}" for i in range(dim)
    ]
    assert frame["model"].tolist() == data.model_names
    assert pq.ParquetFile(output).metadata.num_row_groups == 4  # written as it came
    assert_same_vectors(
        frame.filter(like="z").to_numpy(), embedder.transform(data.evaluation_sets)
    )
    assert {p.name for p in tmp_path.iterdir()} == {"evals.parquet", "emb.parquet"}


def test_rows_of_a_model_that_reappear_are_refused_naming_it(trained, tmp_path):
    data, embedder, table = trained
    first = table[table["model"] == data.model_names[0]]
    # The first model's last row moved to the end, after every other model's.
    moved = pd.concat([table.drop(first.index[-1]), first.iloc[[-1]]])
    path = write(moved, tmp_path / "unsorted.parquet")
    for batch_rows in (65536, 16):
        with pytest.raises(ValueError) as error:
            list(iter_embeddings(embedder, path, batch_rows=batch_rows))
        message = str(error.value)
        assert f"model {data.model_names[0]!r}" in message
        assert f"row {len(table) - 1} starts the rows of model" in message
        assert "sorted or partitioned by model" in message
    # The same within one record batch.
    a, b = data.model_names[:2]
    interleaved = pd.DataFrame(
        {"model": [a, b, a], "query": ["q1", "q1", "q2"], "score": [1, 0, 1]}
    )
    path = write(interleaved, tmp_path / "interleaved.parquet")
    with pytest.raises(
        ValueError, match=rf"row 2 starts the rows of model {a!r} again"
    ):
        list(iter_embeddings(embedder, path))
    # A failed write leaves no output behind.
    output = tmp_path / "emb.parquet"
    with pytest.raises(ValueError, match="starts the rows of model"):
        embed_parquet(embedder, path, output)
    assert not output.exists()
    assert not list(tmp_path.glob("*.partial"))


def test_a_missing_column_names_it_and_lists_the_columns(trained, tmp_path):
    _, embedder, table = trained
    path = write(table.rename(columns={"score": "correct"}), tmp_path / "e.parquet")
    with pytest.raises(KeyError, match=r"the score column 'score' is not in .*"):
        list(iter_embeddings(embedder, path))
    batches = list(iter_embeddings(embedder, path, score="correct"))
    assert sum(len(batch.model_names) for batch in batches) == 30
    with pytest.raises(KeyError, match=r"'model', 'query', 'correct'"):
        list(iter_embeddings(embedder, tmp_path, model="name", score="correct"))


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"score": [0.0, 1.7]}, ValueError, r"row 1 \(model 'a'\) has score 1.7"),
        ({"score": [0.0, np.nan]}, ValueError, r"row 1 \(model 'a'\) has no score"),
        ({"score": ["1", "0"]}, TypeError, r"row 0 \(model 'a'\) has score '1'"),
        ({"model": ["a", None]}, ValueError, r"row 1 has no model"),
        ({"query": ["q1", None]}, ValueError, r"row 1 has no query"),
        ({"query": ["q1", "q1"]}, ValueError, r"model 'a' has 2 rows for query"),
    ],
)
def test_bad_rows_get_the_messages_of_from_long(
    trained, tmp_path, change, error, message
):
    _, embedder, _ = trained
    rows = {"model": ["a", "a"], "query": ["q1", "q2"], "score": [1.0, 0.0]}
    path = write(pd.DataFrame({**rows, **change}), tmp_path / "bad.parquet")
    with pytest.raises(error, match=message):
        list(iter_embeddings(embedder, path))


def test_repeated_rows_resolved_and_bad_settings_refused(trained, tmp_path):
    data, embedder, _ = trained
    q1, q2 = data.query_ids[:2]
    rows = {"model": ["a", "a", "a"], "query": [q1, q1, q2], "score": [1, 0, 1]}
    path = write(pd.DataFrame(rows), tmp_path / "repeats.parquet")
    (batch,) = iter_embeddings(embedder, path, duplicates="mean")
    assert batch.n_evaluations.tolist() == [2]
    np.testing.assert_array_equal(
        batch.embeddings, embedder.transform([{q1: 0.5, q2: 1.0}])
    )
    for name in ("batch_models", "batch_rows"):
        with pytest.raises(ValueError, match=rf"{name}=0 must be a positive integer"):
            list(iter_embeddings(embedder, path, **{name: 0}))
    with pytest.raises(FileNotFoundError, match="no such Parquet file"):
        list(iter_embeddings(embedder, tmp_path / "missing.parquet"))
    empty = write(pd.DataFrame(rows).iloc[:0], tmp_path / "empty.parquet")
    with pytest.raises(ValueError, match="has no rows"):
        list(iter_embeddings(embedder, empty))
    with pytest.raises(Exception, match="not fitted"):
        list(iter_embeddings(LocusEmbedder(), path))
