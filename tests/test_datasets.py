import numpy as np
import pytest

from sklocus.datasets import load_evaluations, make_evaluations
from sklocus.encoders import PrecomputedEncoder, SentenceEncoder
from sklocus.evaluations import check_evaluation_sets


@pytest.fixture(scope="module")
def synthetic():
    return make_evaluations(
        n_models=60, n_queries=400, evals_per_model=(50, 120), random_state=3
    )


def test_make_evaluations_is_deterministic():
    first = make_evaluations(
        n_models=30, n_queries=200, random_state=0, evals_per_model=40
    )
    second = make_evaluations(
        n_models=30, n_queries=200, random_state=0, evals_per_model=40
    )
    assert first.evaluation_sets == second.evaluation_sets
    np.testing.assert_array_equal(first.probabilities, second.probabilities)
    np.testing.assert_array_equal(first.query_vectors, second.query_vectors)
    other = make_evaluations(
        n_models=30, n_queries=200, random_state=1, evals_per_model=40
    )
    assert other.evaluation_sets != first.evaluation_sets


def test_make_evaluations_shapes_and_valid_sets(synthetic):
    data = synthetic
    assert len(data.evaluation_sets) == len(data.model_names) == 60
    assert data.probabilities.shape == (400, 60)  # a row per query
    assert data.query_vectors.shape == (400, 64)
    assert data.benchmarks.shape == (400,) and set(data.benchmarks) == set(range(5))
    sizes = [len(s) for s in data.evaluation_sets]
    assert min(sizes) >= 50 and max(sizes) <= 120 and len(set(sizes)) > 1
    ragged = check_evaluation_sets(data.evaluation_sets, data.model_names)
    assert set(np.unique(ragged.scores)) <= {0.0, 1.0}
    assert isinstance(data.encoder, PrecomputedEncoder)
    np.testing.assert_array_equal(
        data.encoder.transform(data.query_ids[:3]), data.query_vectors[:3]
    )
    np.testing.assert_allclose(
        np.linalg.norm(data.query_vectors, axis=1), 1.0, rtol=1e-5
    )


def test_make_evaluations_scores_follow_the_probabilities():
    data = make_evaluations(
        n_models=40, n_queries=300, evals_per_model=None, random_state=0
    )
    row = {q: j for j, q in enumerate(data.query_ids)}
    observed = np.array([[s[q] for s in data.evaluation_sets] for q in data.query_ids])
    assert observed.shape == data.probabilities.shape
    # Mean scores agree with mean probabilities within sampling error (12,000 draws).
    assert abs(observed.mean() - data.probabilities.mean()) < 0.02
    assert row["q00000"] == 0
    # Per-model accuracy tracks the true one.
    assert np.corrcoef(observed.mean(0), data.probabilities.mean(0))[0, 1] > 0.95


def test_make_evaluations_plants_duplicates(synthetic):
    data = synthetic
    copies = np.flatnonzero(data.duplicate_of >= 0)
    assert len(copies) == 6  # duplicate_fraction=0.1 of 60
    for copy in copies:
        source = data.duplicate_of[copy]
        assert data.duplicate_of[source] == -1
        assert data.families[copy] == data.families[source]
        assert data.params_b[copy] == data.params_b[source]
        assert (
            np.abs(data.probabilities[:, copy] - data.probabilities[:, source]).max()
            < 0.05
        )
        # A copy is evaluated on its original's queries and nearly always agrees.
        copy_set, source_set = data.evaluation_sets[copy], data.evaluation_sets[source]
        assert copy_set.keys() == source_set.keys()
        agreement = np.mean([copy_set[q] == source_set[q] for q in copy_set])
        assert agreement > 0.97


def test_make_evaluations_families_share_behaviour(synthetic):
    data = synthetic
    logits = np.log(data.probabilities / (1 - data.probabilities)).T  # per model
    distance = np.linalg.norm(logits[:, None] - logits[None], axis=-1)
    same = data.families[:, None] == data.families[None]
    off_diagonal = ~np.eye(len(distance), dtype=bool)
    assert distance[same & off_diagonal].mean() < 0.7 * distance[~same].mean()
    assert len(np.unique(data.families)) == 8
    for family in np.unique(data.families):
        sizes = data.params_b[data.families == family]
        assert sizes.max() <= 1.05 * sizes.min() + 1e-9
    assert (data.params_b > 0).all()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_models": 0}, "n_models=0 must be a positive integer"),
        ({"evals_per_model": 2000}, "evals_per_model=2000 exceeds n_queries=1000"),
        ({"evals_per_model": (10, 5)}, "must satisfy 1 <= low <= high"),
        ({"duplicate_fraction": 1.0}, "duplicate_fraction=1.0 must lie in"),
    ],
)
def test_make_evaluations_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        make_evaluations(**kwargs)


def test_make_evaluations_default_size_fits_few_queries():
    few = make_evaluations(n_models=40, n_queries=200, random_state=0)
    assert {len(s) for s in few.evaluation_sets} == {200}
    many = make_evaluations(n_models=5, n_queries=1000, random_state=0)
    assert {len(s) for s in many.evaluation_sets} == {256}


@pytest.mark.slow
def test_load_evaluations_reads_the_shared_data(openllm_path):
    data = load_evaluations(openllm_path)
    assert len(data.evaluation_sets) == len(data.model_names) == 5949
    assert len(data.queries) == 1075
    assert data.queries["split"].value_counts().to_dict() == {"train": 806, "test": 269}
    assert list(data.models["model"]) == data.model_names
    sizes = np.array([len(s) for s in data.evaluation_sets])
    assert (sizes == 1075).sum() == 1601
    assert isinstance(data.encoder, PrecomputedEncoder)
    first_query = data.queries["query_id"].iloc[0]
    assert data.encoder.transform([first_query]).shape == (1, 384)
    mpnet = load_evaluations(openllm_path, encoder="all-mpnet-base-v2")
    assert mpnet.encoder.transform([first_query]).shape == (1, 768)


def _write_folder(folder):
    import pandas as pd

    pd.DataFrame(
        {"model": ["m1", "m1", "m2"], "query_id": ["a", "b", "a"], "score": [1, 0, 1]}
    ).to_parquet(folder / "responses.parquet")
    pd.DataFrame(
        {"query_id": ["a", "b"], "query": ["What is 1 + 1?", "Say hi."]}
    ).to_parquet(folder / "queries.parquet")


def test_load_evaluations_without_encodings_gives_a_sentence_encoder(tmp_path):
    _write_folder(tmp_path)
    data = load_evaluations(tmp_path)
    assert data.model_names == ["m1", "m2"]
    assert data.evaluation_sets == [{"a": 1.0, "b": 0.0}, {"a": 1.0}]
    assert list(data.models.columns) == ["model"]
    assert isinstance(data.encoder, SentenceEncoder)
    assert data.encoder.texts == {"a": "What is 1 + 1?", "b": "Say hi."}


def test_load_evaluations_names_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="lacks responses.parquet"):
        load_evaluations(tmp_path)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        load_evaluations(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "name", ["responses.parquet", "queries.parquet", "models.parquet"]
)
def test_a_damaged_parquet_file_is_named(tmp_path, name):
    import pandas as pd

    _write_folder(tmp_path)
    pd.DataFrame({"model": ["m1", "m2"]}).to_parquet(tmp_path / "models.parquet")
    path = tmp_path / name
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(ValueError, match=rf"{name} is not a readable Parquet file"):
        load_evaluations(tmp_path)


def test_bad_responses_and_repeated_models_are_named(tmp_path):
    import pandas as pd

    _write_folder(tmp_path)
    pd.DataFrame({"model": ["m1", "m2", "m1"]}).to_parquet(tmp_path / "models.parquet")
    with pytest.raises(ValueError, match=r"models.parquet has more than one row for"):
        load_evaluations(tmp_path)
    pd.DataFrame(
        {"model": ["m1", "m1"], "query_id": ["a", "a"], "score": [1, 0]}
    ).to_parquet(tmp_path / "responses.parquet")
    with pytest.raises(ValueError, match=r"responses.parquet: .*'m1'.*'a'"):
        load_evaluations(tmp_path)


def test_make_evaluations_as_frame_gives_the_long_table_of_the_same_data():
    from sklocus.evaluations import from_long

    data = make_evaluations(n_models=6, n_queries=40, random_state=0, as_frame=True)
    frame = data.frame
    assert list(frame.columns) == ["model", "query", "score", "benchmark", "params_b"]
    sets, names = from_long(frame)
    assert (sets, names) == (data.evaluation_sets, data.model_names)
    row = {query: i for i, query in enumerate(data.query_ids)}
    first = frame.iloc[0]
    assert first["benchmark"] == data.benchmarks[row[first["query"]]]
    by_model = frame.groupby("model")["params_b"].agg(["min", "max"])
    assert (by_model["min"] == by_model["max"]).all()
    assert by_model["min"].tolist() == data.params_b.tolist()
    assert "frame" not in make_evaluations(n_models=6, n_queries=40, random_state=0)
