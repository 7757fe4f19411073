"""Reprs stay short: parameters that hold data print as summaries, not as data."""

import pickle

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.frozen import FrozenEstimator
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from tiny import TINY_NETWORK

from sklocus import LocusEmbedder, LocusRouter, PrecomputedEncoder, SentenceEncoder
from sklocus.datasets import make_evaluations

TEXTS = {f"q{i:05d}": f"What is {i} + {i}?" for i in range(1000)}


@pytest.fixture(scope="module")
def data():
    return make_evaluations(n_models=20, n_queries=200, random_state=0)


def assert_holds_no_data(text):
    assert "q00001" not in text  # a query id
    assert "array(" not in text and "[[" not in text  # the encoder's vectors
    assert "<200 queries>" in text and "<200 x 64>" in text  # the encoder's size


def test_the_readme_router_prints_in_a_few_lines(data):
    embedder = LocusEmbedder(query_encoder=data.encoder, max_epochs=5, random_state=0)
    text = repr(LocusRouter(FrozenEstimator(embedder)))
    assert_holds_no_data(text)
    assert len(text.splitlines()) <= 6
    assert text.startswith(
        "LocusRouter(embedder=FrozenEstimator(estimator=LocusEmbedder(max_epochs=5,"
    )


def test_a_router_prints_the_same_after_fit_add_models_and_partial_fit(data):
    sets, names = data.evaluation_sets, data.model_names
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK).fit(sets)
    router = LocusRouter(FrozenEstimator(embedder), refine_steps=0)
    before = repr(router)
    assert_holds_no_data(before)
    router.fit_evaluations(sets, names)
    router.add_models([sets[0]], ["a-new-model"])
    queries = data.query_ids[:2]
    router.partial_fit(queries, pd.DataFrame({"a-new-model": [1.0, 0.0]}))
    assert repr(router) == before
    assert repr(pickle.loads(pickle.dumps(router))) == before


def test_encoders_print_their_size():
    assert repr(SentenceEncoder(texts=TEXTS)) == "SentenceEncoder(texts=<1,000 texts>)"
    encoder = PrecomputedEncoder(list(TEXTS), np.zeros((1000, 32)))
    assert repr(encoder) == (
        "PrecomputedEncoder(queries=<1,000 queries>, vectors=<1,000 x 32>)"
    )


def test_a_summary_prints_as_a_parameter_inside_an_estimator():
    # scikit-learn measures a parameter by repr(value); one that prints shorter
    # than the printer's own form must still print as name=value.
    embedder = LocusEmbedder(SentenceEncoder(texts=TEXTS), n_latents=8)
    assert repr(embedder) == (
        "LocusEmbedder(n_latents=8, query_encoder=SentenceEncoder(texts=<1,000 texts>))"
    )


def test_scikit_learn_meta_estimators_print_the_summary_too(data):
    embedder = LocusEmbedder(query_encoder=data.encoder, n_latents=8)
    text = repr(GridSearchCV(make_pipeline(embedder), {"locusembedder__lr": [0.1]}))
    assert_holds_no_data(text)
    assert "param_grid={'locusembedder__lr': [0.1]}" in text


def test_the_html_diagram_names_the_size_and_lists_no_queries(data):
    embedder = LocusEmbedder(query_encoder=data.encoder, max_epochs=5)
    html = LocusRouter(FrozenEstimator(embedder))._repr_html_()
    assert "PrecomputedEncoder(queries=&lt;200 queries&gt;" in html
    assert "q00010" not in html


@pytest.mark.parametrize(
    "estimator, text",
    [
        (LocusEmbedder(), "LocusEmbedder()"),
        (LocusEmbedder(n_latents=8), "LocusEmbedder(n_latents=8)"),
        (
            LocusEmbedder("all-mpnet-base-v2", encoder_sizes=(8, 32)),
            "LocusEmbedder(encoder_sizes=(8, 32), query_encoder='all-mpnet-base-v2')",
        ),
        (
            LocusRouter(LocusEmbedder(n_latents=8), refine_steps=0),
            "LocusRouter(embedder=LocusEmbedder(n_latents=8), refine_steps=0)",
        ),
        (SentenceEncoder(batch_size=8), "SentenceEncoder(batch_size=8)"),
    ],
)
def test_simple_parameters_print_as_scikit_learn_prints_them(estimator, text):
    assert repr(estimator) == text
    namespace = {"LocusEmbedder": LocusEmbedder, "LocusRouter": LocusRouter}
    namespace["SentenceEncoder"] = SentenceEncoder
    assert repr(eval(text, namespace)) == text


def test_parameters_clone_and_pickle_keep_the_data(data):
    encoder = data.encoder
    params = encoder.get_params()
    assert params["queries"] is encoder.queries
    assert params["vectors"] is encoder.vectors
    copy = clone(LocusEmbedder(query_encoder=encoder)).query_encoder
    assert list(copy.queries) == list(encoder.queries)
    np.testing.assert_array_equal(copy.vectors, encoder.vectors)
    texts = pickle.loads(pickle.dumps(SentenceEncoder(texts=TEXTS))).texts
    assert texts == TEXTS
