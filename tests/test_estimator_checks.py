"""scikit-learn's estimator contract, checked on ragged input.

``check_estimator`` feeds 2-D arrays, which neither LocusEmbedder (evaluation sets)
nor LocusRouter (queries and a score matrix) takes, so these checks restate the
stock ones that apply, in the manner of ``parametrize_with_checks``.
"""

import pickle

import joblib
import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix

TINY = dict(
    embedding_dim=8,
    n_latents=4,
    n_layers=1,
    n_heads=2,
    predictor_hidden=8,
    encoder_sizes=(8, 32),
    max_epochs=1,
    epoch_size=1,
    random_state=0,
)


@pytest.fixture(scope="module")
def data():
    return make_evaluations(
        n_models=10,
        n_queries=120,
        evals_per_model=(30, 80),
        query_dim=8,
        random_state=0,
    )


def _embedder_case(data):
    estimator = LocusEmbedder(query_encoder=data.encoder, **TINY)
    sets = data.evaluation_sets
    return estimator, (sets,), lambda fitted: fitted.transform(sets[:3])


def _router_case(data):
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores.T, columns=data.model_names)
    estimator = LocusRouter(LocusEmbedder(query_encoder=data.encoder, **TINY))
    return estimator, (queries, Y), lambda fitted: fitted.predict_proba(queries[:5])


CASES = {"LocusEmbedder": _embedder_case, "LocusRouter": _router_case}


def _fitted(case, data):
    estimator, fit_args, outputs = CASES[case](data)
    return estimator.fit(*fit_args), fit_args, outputs


@pytest.mark.parametrize("case", CASES)
def test_fit_returns_self_and_leaves_its_parameters_alone(case, data):
    estimator, fit_args, _ = CASES[case](data)
    before = joblib.hash(estimator.get_params(deep=True))
    assert estimator.fit(*fit_args) is estimator
    assert joblib.hash(estimator.get_params(deep=True)) == before


@pytest.mark.parametrize("case", CASES)
def test_not_fitted_until_fit_and_a_clone_is_unfitted(case, data):
    estimator, fit_args, outputs = CASES[case](data)
    with pytest.raises(NotFittedError):
        outputs(estimator)
    fitted = estimator.fit(*fit_args)
    with pytest.raises(NotFittedError):
        outputs(clone(fitted))
    assert joblib.hash(clone(fitted).get_params()) == joblib.hash(fitted.get_params())


def test_feature_names_need_a_fit(data):
    estimator, fit_args, _ = _embedder_case(data)
    with pytest.raises(NotFittedError):
        estimator.get_feature_names_out()
    names = estimator.fit(*fit_args).get_feature_names_out()
    assert len(names) == TINY["embedding_dim"]


@pytest.mark.parametrize("case", CASES)
def test_pickle_round_trip_gives_identical_outputs(case, data):
    fitted, _, outputs = _fitted(case, data)
    restored = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(outputs(restored), outputs(fitted))


@pytest.mark.parametrize("case", CASES)
def test_refitting_with_the_same_random_state_gives_the_same_model(case, data):
    first, fit_args, outputs = _fitted(case, data)
    second = clone(first).fit(*fit_args)
    np.testing.assert_array_equal(outputs(second), outputs(first))
