"""Property-based tests: any input either works or is refused with a named culprit."""

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sklocus import LocusEmbedder
from sklocus.datasets import make_evaluations
from sklocus.evaluations import check_evaluation_sets

# Derandomised: CI runs the same examples every time, so a failure reproduces.
FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

keys = st.one_of(
    st.text(max_size=6),
    st.integers(-3, 3),
    st.none(),
    st.just(float("nan")),
    st.floats(allow_nan=False, width=32),
    st.tuples(st.text(max_size=2), st.integers(0, 2)),
)
values = st.one_of(
    st.floats(),
    st.integers(-2, 2),
    st.booleans(),
    st.text(max_size=3),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
sets = st.one_of(
    st.dictionaries(keys, values, max_size=6),
    st.text(max_size=3),
    st.integers(),
    st.none(),
)


@FUZZ
@given(st.lists(sets, max_size=4))
@example([{"": None, None: []}])  # once raised numpy's inhomogeneous-shape error
def test_evaluation_sets_are_accepted_or_refused_by_name(evaluation_sets):
    try:
        ragged = check_evaluation_sets(evaluation_sets)
    except (TypeError, ValueError) as error:
        message = str(error)
        assert message
        if evaluation_sets and all(isinstance(s, dict) for s in evaluation_sets):
            # Every set is a mapping, so the fault lies in one set: name it.
            assert "evaluation set" in message
        return
    assert ragged.n_sets == len(evaluation_sets)
    assert ragged.sizes.tolist() == [len(s) for s in evaluation_sets]
    assert ((ragged.scores >= 0) & (ragged.scores <= 1)).all()
    for i, evaluation_set in enumerate(evaluation_sets):
        expected = [float(v) for v in evaluation_set.values()]
        assert ragged.set_scores(i).tolist() == expected
        assert all(not math.isnan(v) for v in expected)


@pytest.fixture(scope="module")
def embedder_and_data():
    data = make_evaluations(
        n_models=12, n_queries=80, evals_per_model=(20, 60), query_dim=8, random_state=0
    )
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        embedding_dim=8,
        n_latents=4,
        n_layers=1,
        n_heads=2,
        predictor_hidden=8,
        encoder_sizes=(8, 32),
        max_epochs=1,
        epoch_size=1,
        random_state=0,
    ).fit(data.evaluation_sets)
    return embedder, data


def _evaluation_set(data):
    return st.lists(
        st.tuples(st.sampled_from(data.query_ids), st.sampled_from([0.0, 0.5, 1.0])),
        min_size=1,
        max_size=40,
        unique_by=lambda pair: pair[0],
    ).map(dict)


@FUZZ
@given(st.data())
def test_transform_is_permutation_invariant_batch_independent_and_type_blind(
    embedder_and_data, draw
):
    embedder, data = embedder_and_data
    evaluation_set = draw.draw(_evaluation_set(data))
    other = draw.draw(_evaluation_set(data))
    items = list(evaluation_set.items())
    shuffled = dict(draw.draw(st.permutations(items)))
    alone = embedder.transform([evaluation_set])
    np.testing.assert_allclose(embedder.transform([shuffled]), alone, atol=1e-5)
    in_a_batch = embedder.transform([other, evaluation_set, other])[1:2]
    np.testing.assert_allclose(in_a_batch, alone, atol=1e-5)
    as_series = embedder.transform([pd.Series(evaluation_set)])
    np.testing.assert_array_equal(as_series, alone)
