import pickle

import joblib
import numpy as np
import pandas as pd
import pytest
from marks import slow_fixture
from sklearn.base import clone

from sklocus._encoding_cache import ShippedEncodings
from sklocus._packaged_models import resolve_model_path
from sklocus._shipped import shipped_folder
from sklocus.encoders import PrecomputedEncoder, SentenceEncoder

QUERIES = ["What is 2 + 2?", "Name the capital of France.", "What is 2 + 2?"]


@slow_fixture(scope="module")
def minilm():
    # Its first encoding loads the model: seconds.
    return SentenceEncoder()


@pytest.mark.slow
def test_sentence_encoder_gives_normalised_float32_rows(minilm):
    vectors = minilm.transform(QUERIES)
    assert vectors.shape == (3, 384)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(vectors[0], vectors[2])
    assert not np.allclose(vectors[0], vectors[1])


def test_sentence_encoder_encodes_each_distinct_text_once(minilm, monkeypatch):
    model = minilm._sentence_transformer()
    seen = []
    original = model.encode

    def counting_encode(texts, **kwargs):
        seen.extend(texts)
        return original(texts, **kwargs)

    monkeypatch.setattr(model, "encode", counting_encode)
    minilm.transform(["a new text", "another new text", "a new text"])
    minilm.transform(["a new text"])
    assert sorted(seen) == ["a new text", "another new text"]


@pytest.mark.slow  # loads MiniLM
def test_sentence_encoder_keeps_the_texts_used_last_in_memory(monkeypatch):
    import sklocus.encoders

    monkeypatch.setattr(sklocus.encoders, "_MEMORY_TEXTS", 3)
    encoder = SentenceEncoder()
    texts = [f"text number {i}" for i in range(5)]
    one_by_one = np.vstack([encoder.transform([text]) for text in texts])
    memory = encoder._state()["memory"]
    assert [text in memory for text in texts] == [False, False, True, True, True]
    encoder.transform([texts[2]])  # used again: now the newest
    encoder.transform([texts[0]])  # so texts[3] is the one to go
    assert [text in memory for text in texts] == [True, False, True, False, True]
    # A batch larger than the cache still comes back whole.
    np.testing.assert_allclose(encoder.transform(texts), one_by_one, atol=1e-6)
    assert len(memory) == 3


def test_sentence_encoder_is_safe_from_threads(minilm):
    from concurrent.futures import ThreadPoolExecutor

    batches = [
        [f"thread text {i}", f"thread text {i + 1}", QUERIES[0]] for i in range(16)
    ]
    with ThreadPoolExecutor(max_workers=8) as pool:
        together = list(pool.map(minilm.transform, batches))
    for batch, vectors in zip(batches, together):
        np.testing.assert_allclose(vectors, minilm.transform(batch), atol=1e-6)


@pytest.mark.slow  # loads MiniLM
def test_sentence_encoder_disk_cache_survives_a_new_process_state(tmp_path):
    from sklocus._encoding_cache import DiskCache

    first = SentenceEncoder(cache_dir=tmp_path)
    vectors = first.transform(QUERIES)
    second = pickle.loads(pickle.dumps(first))  # drops the in-memory cache and model
    assert "_runtime" not in second.__dict__
    found = DiskCache(tmp_path, second.model).lookup(list(dict.fromkeys(QUERIES)))
    assert set(found) == set(QUERIES)
    np.testing.assert_array_equal(second.transform(QUERIES), vectors)


@pytest.mark.slow  # loads MiniLM
def test_sentence_encoder_reports_what_came_from_the_cache(tmp_path, capsys):
    first = SentenceEncoder(cache_dir=tmp_path, show_progress=True)
    first.transform(QUERIES)
    err = capsys.readouterr().err
    assert f"Query texts: 0 of 2 from the encoding cache in {tmp_path}." in err
    assert "Encoding query texts: 2 texts...\n" in err
    assert "Encoding query texts: 2 texts in " in err
    second = SentenceEncoder(cache_dir=tmp_path, show_progress=True)
    second.transform([*QUERIES, "A text not seen before."])
    err = capsys.readouterr().err
    assert "Query texts: 2 of 3 from the encoding cache" in err
    assert "Encoding query texts: 1 text in " in err
    # Texts held in memory are no news; a quiet encoder says nothing.
    second.transform(QUERIES)
    SentenceEncoder(cache_dir=tmp_path, show_progress=False).transform(QUERIES)
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_encodings_do_not_depend_on_batches_or_progress(minilm, capsys):
    texts = [f"Question {i}: " + "how far is it? " * (i % 4) for i in range(7)]
    vectors = minilm.transform(texts)
    shown = SentenceEncoder(show_progress=True).transform(texts)
    np.testing.assert_array_equal(shown, vectors)
    in_pairs = SentenceEncoder(batch_size=2).transform(texts)
    np.testing.assert_allclose(in_pairs, vectors, atol=1e-6)


def _shipped_questions():
    folder = shipped_folder("llmrouter")
    texts = pd.read_parquet(folder / "queries.parquet")["query"].tolist()
    vectors = np.load(folder / "encoded_all-MiniLM-L6-v2.npy")
    return texts, vectors


def test_the_shipped_questions_come_encoded(tmp_path, monkeypatch, capsys):
    texts, vectors = _shipped_questions()
    assert vectors.shape == (len(texts), 384) and vectors.dtype == np.float32
    rows = [0, 2500, 6107]
    encoder = SentenceEncoder(cache_dir=tmp_path, show_progress=True)

    def no_model():
        raise AssertionError("the shipped questions were encoded again")

    monkeypatch.setattr(encoder, "_sentence_transformer", no_model)
    got = encoder.transform([texts[row] for row in rows])
    np.testing.assert_array_equal(got, vectors[rows])
    assert "3 come encoded with sklocus" in capsys.readouterr().err
    # The prefixed name is the same model; another model has none of them.
    prefixed = SentenceEncoder("sentence-transformers/all-MiniLM-L6-v2")
    monkeypatch.setattr(prefixed, "_sentence_transformer", no_model)
    np.testing.assert_array_equal(prefixed.transform(texts[:2]), vectors[:2])
    assert ShippedEncodings("all-mpnet-base-v2").lookup(texts[:2]) == {}


def test_shipped_and_new_texts_mix_in_one_call(minilm):
    texts, vectors = _shipped_questions()
    batch = ["A text that ships with nothing.", texts[7], texts[7]]
    got = minilm.transform(batch)
    np.testing.assert_array_equal(got[1], vectors[7])
    np.testing.assert_array_equal(got[2], vectors[7])
    np.testing.assert_allclose(got[0], minilm.transform(batch[:1])[0], atol=1e-6)


@pytest.mark.slow
def test_the_shipped_encodings_are_what_the_model_gives():
    # The weights' folder reads no shipped file: a fresh encoding of a sample,
    # which on any CPU agrees with the file's to float rounding (unit vectors;
    # another question's vector is 0.1 or more away in some component).
    texts, vectors = _shipped_questions()
    rows = np.random.default_rng(0).choice(len(texts), 24, replace=False)
    fresh = SentenceEncoder(model=resolve_model_path("all-MiniLM-L6-v2"))
    assert ShippedEncodings(fresh.model).lookup(texts[:1]) == {}
    np.testing.assert_allclose(
        fresh.transform([texts[row] for row in rows]), vectors[rows], atol=1e-4
    )


@pytest.mark.parametrize("unusable", ["a file, not a folder", "not SQLite"])
def test_an_unusable_disk_cache_warns_and_encodes_all_the_same(
    minilm, tmp_path, unusable
):
    if unusable == "not SQLite":
        folder = tmp_path
        (folder / "sklocus-encodings.sqlite3").write_bytes(b"not a database" * 100)
    else:
        folder = tmp_path / "file.txt"
        folder.write_text("a file")
    encoder = SentenceEncoder(cache_dir=folder)
    with pytest.warns(UserWarning, match="the encoding cache in .* cannot be used"):
        vectors = encoder.transform(QUERIES)
    np.testing.assert_array_equal(vectors, minilm.transform(QUERIES))


@pytest.mark.slow  # loads MiniLM
def test_an_interrupted_encoding_keeps_the_batches_done(tmp_path, monkeypatch):
    from sklocus._encoding_cache import DiskCache

    encoder = SentenceEncoder(cache_dir=tmp_path, batch_size=1)
    model = encoder._sentence_transformer()
    original = model.encode
    calls = []

    def interrupted_encode(texts, **kwargs):
        calls.append(texts)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(texts, **kwargs)

    monkeypatch.setattr(model, "encode", interrupted_encode)
    texts = ["short", "a longer text", "the longest text of the three"]
    with pytest.raises(KeyboardInterrupt):
        encoder.transform(texts)
    # Longest first, one batch done and kept.
    assert calls[0] == ["the longest text of the three"]
    found = DiskCache(tmp_path, encoder.model).lookup(texts)
    assert list(found) == ["the longest text of the three"]


def test_sentence_encoder_maps_ids_through_texts(minilm):
    by_id = SentenceEncoder(texts={"id-1": QUERIES[0], 7: QUERIES[1]})
    np.testing.assert_allclose(
        by_id.transform(["id-1", 7]), minilm.transform(QUERIES[:2]), atol=1e-6
    )
    with pytest.raises(TypeError, match=r"query 1 is 8 \(int\) and it is not a key"):
        by_id.transform(["id-1", 8])


def test_sentence_encoder_rejects_non_text_and_bare_strings(minilm):
    with pytest.raises(TypeError, match=r"query 1 is None \(NoneType\)"):
        minilm.transform(["fine", None])
    with pytest.raises(TypeError, match="got a single str"):
        minilm.transform("a bare string")


def test_sentence_encoder_is_clonable_and_validates_params():
    encoder = SentenceEncoder(batch_size=8, device="cpu")
    assert clone(encoder).get_params() == encoder.get_params()
    with pytest.raises(ValueError, match="batch_size"):
        SentenceEncoder(batch_size=0).transform(["x"])


def test_sentence_encoder_joblib_round_trip(tmp_path, minilm):
    path = tmp_path / "encoder.joblib"
    joblib.dump(minilm, path)
    # The copy loads without the in-memory cache and encodes QUERIES' two texts
    # together; minilm answers from its cache, filled by whichever test first
    # encoded each, perhaps among other texts (the threads' test): the same
    # vectors, within the rounding that another batch may bring.
    np.testing.assert_allclose(
        joblib.load(path).transform(QUERIES), minilm.transform(QUERIES), atol=1e-6
    )


def test_precomputed_encoder_looks_up_rows():
    vectors = np.arange(6, dtype=np.float64).reshape(3, 2)
    encoder = PrecomputedEncoder(["a", 5, ("t", 1)], vectors)
    out = encoder.transform([("t", 1), "a", "a"])
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, vectors[[2, 0, 0]])
    restored = pickle.loads(pickle.dumps(encoder))
    np.testing.assert_array_equal(restored.transform([5]), vectors[[1]])
    np.testing.assert_array_equal(clone(encoder).transform([5]), vectors[[1]])


def test_precomputed_encoder_names_unknown_queries_and_bad_tables():
    encoder = PrecomputedEncoder(["a", "b"], np.eye(2))
    with pytest.raises(
        ValueError, match=r"query 'zz' \(position 1\) is not one of the 2"
    ):
        encoder.transform(["a", "zz"])
    with pytest.raises(ValueError, match="got 2 queries but 3 rows"):
        PrecomputedEncoder(["a", "b"], np.eye(3)).fit()
    with pytest.raises(ValueError, match="query 'a' appears twice"):
        PrecomputedEncoder(["a", "a"], np.eye(2)).fit()
    with pytest.raises(
        ValueError, match=r"the vector of query 'b' \(row 1\) is not finite"
    ):
        PrecomputedEncoder(["a", "b"], [[0.0, 1.0], [np.nan, 0.0]]).fit()


def test_precomputed_encoder_follows_set_params():
    encoder = PrecomputedEncoder(["a"], [[1.0]])
    encoder.transform(["a"])
    encoder.set_params(queries=["b"])
    np.testing.assert_array_equal(encoder.transform(["b"]), [[1.0]])


def test_query_ids_given_as_texts_warn(minilm):
    with pytest.warns(UserWarning, match=r"look like ids.*'q00012'.*Precomputed"):
        minilm.transform(["q00012", "q00013"])


@pytest.mark.filterwarnings("error")
def test_sentences_and_mapped_ids_do_not_warn(minilm):
    minilm.transform(QUERIES)
    SentenceEncoder(texts={"q1": QUERIES[0], "q2": QUERIES[1]}).transform(["q1", "q2"])
