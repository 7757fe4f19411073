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
from joblib import Parallel, delayed
from sklearn.base import clone
from sklearn.exceptions import NotFittedError, SkipTestWarning
from sklearn.model_selection import KFold, cross_val_score
from sklearn.utils import estimator_checks
from sklearn.utils.estimator_checks import _yield_all_checks, check_estimator
from tiny import TINY_NETWORK, TINY_POOL
from vectors import assert_same_probabilities, assert_same_vectors

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix


@pytest.fixture(scope="module")
def data():
    return make_evaluations(**TINY_POOL)


def _embedder_case(data):
    estimator = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK)
    sets = data.evaluation_sets
    return estimator, (sets,), lambda fitted: fitted.transform(sets[:3])


def _router_case(data):
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    estimator = LocusRouter(LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK))
    return estimator, (queries, Y), lambda fitted: fitted.predict_proba(queries[:5])


CASES = {"LocusEmbedder": _embedder_case, "LocusRouter": _router_case}
# The router's case trains an embedder and fits a router, a second or more a
# check: the quick subset (-m "not slow") keeps the embedder's.
CASE_NAMES = [
    "LocusEmbedder",
    pytest.param("LocusRouter", marks=pytest.mark.slow),
]


def _fitted(case, data):
    estimator, fit_args, outputs = CASES[case](data)
    return estimator.fit(*fit_args), fit_args, outputs


@pytest.mark.parametrize("case", CASE_NAMES)
def test_fit_returns_self_and_leaves_its_parameters_alone(case, data):
    estimator, fit_args, _ = CASES[case](data)
    before = joblib.hash(estimator.get_params(deep=True))
    assert estimator.fit(*fit_args) is estimator
    assert joblib.hash(estimator.get_params(deep=True)) == before


@pytest.mark.parametrize("case", CASE_NAMES)
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
    assert len(names) == TINY_NETWORK["embedding_dim"]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_pickle_round_trip_gives_identical_outputs(case, data):
    fitted, _, outputs = _fitted(case, data)
    restored = pickle.loads(pickle.dumps(fitted))
    np.testing.assert_array_equal(outputs(restored), outputs(fitted))


@pytest.mark.parametrize("case", CASE_NAMES)
def test_refitting_with_the_same_random_state_gives_the_same_model(case, data):
    first, fit_args, outputs = _fitted(case, data)
    second = clone(first).fit(*fit_args)
    np.testing.assert_array_equal(outputs(second), outputs(first))


# -- order, subsets and parallelism ------------------------------------------------------


def _shuffled(case, fit_args, seed):
    """The same training data in another order."""
    rng = np.random.default_rng(seed)
    if case == "LocusEmbedder":
        (sets,) = fit_args
        shuffled = []
        for position in rng.permutation(len(sets)):
            items = list(sets[position].items())
            shuffled.append(dict(items[i] for i in rng.permutation(len(items))))
        return (shuffled,)
    queries, Y = fit_args
    rows, columns = rng.permutation(len(queries)), rng.permutation(Y.shape[1])
    return [queries[i] for i in rows], Y.iloc[rows, columns].reset_index(drop=True)


def _by_model(case, fitted, data):
    """What a fit produces, independent of the order of its models."""
    if case == "LocusEmbedder":
        return fitted.transform(data.evaluation_sets)
    queries = to_matrix(data.evaluation_sets)[1][:20]
    table = pd.DataFrame(fitted.predict_correctness(queries), columns=fitted.classes_)
    return table.sort_index(axis=1).to_numpy()


@pytest.mark.parametrize("case", CASE_NAMES)
def test_fit_on_data_in_another_order_gives_the_same_model(case, data):
    fitted, fit_args, _ = _fitted(case, data)
    reordered = clone(fitted).fit(*_shuffled(case, fit_args, seed=1))
    np.testing.assert_allclose(
        _by_model(case, reordered, data), _by_model(case, fitted, data), atol=1e-6
    )


def _method_inputs(case, data):
    if case == "LocusEmbedder":
        return data.evaluation_sets
    return to_matrix(data.evaluation_sets)[1][:30]


def _method_outputs(case, fitted, inputs):
    if case == "LocusEmbedder":
        return [fitted.transform(inputs)]
    return [fitted.predict_proba(inputs), fitted.predict(inputs)]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_outputs_follow_their_inputs_in_any_order_and_subset(case, data):
    # scikit-learn's check_methods_sample_order_invariance and
    # check_methods_subset_invariance, on ragged input.
    fitted, _, _ = _fitted(case, data)
    inputs = list(_method_inputs(case, data))
    full = _method_outputs(case, fitted, inputs)
    order = np.random.default_rng(0).permutation(len(inputs))
    permuted = _method_outputs(case, fitted, [inputs[i] for i in order])
    subset = _method_outputs(case, fitted, inputs[:4])
    for whole, shuffled, part in zip(full, permuted, subset):
        # Inputs at other places of a batch round otherwise: vectors and
        # probabilities within float32 rounding (tests/vectors.py); routes
        # exactly, as that rounding (1e-7) moves a route only at the very edge
        # of a near-tie (1e-6).
        same = np.testing.assert_array_equal
        if whole.dtype.kind == "f":
            same = (
                assert_same_vectors
                if case == "LocusEmbedder"
                else assert_same_probabilities
            )
        same(shuffled, whole[order])
        same(part, whole[:4])


@pytest.mark.parametrize("case", CASE_NAMES)
def test_threads_sharing_a_fitted_estimator_get_the_serial_outputs(case, data):
    fitted, _, outputs = _fitted(case, data)
    expected = outputs(fitted)
    results = Parallel(n_jobs=4, backend="threading")(
        delayed(outputs)(fitted) for _ in range(8)
    )
    for result in results:
        np.testing.assert_array_equal(result, expected)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASE_NAMES)
def test_cross_validation_in_worker_processes_matches_the_serial_run(case, data):
    estimator, fit_args, _ = CASES[case](data)
    cv = KFold(n_splits=2, shuffle=True, random_state=0)
    serial = cross_val_score(estimator, *fit_args, cv=cv, n_jobs=1)
    parallel = cross_val_score(estimator, *fit_args, cv=cv, n_jobs=2)
    np.testing.assert_allclose(parallel, serial, atol=1e-6)


def test_fit_transform_is_fit_then_transform(data):
    # scikit-learn's check_transformer_general, on ragged input.
    estimator, (sets,), _ = _embedder_case(data)
    np.testing.assert_array_equal(
        clone(estimator).fit_transform(sets), clone(estimator).fit(sets).transform(sets)
    )


@pytest.mark.parametrize("case", CASE_NAMES)
def test_score_takes_y_and_empty_data_is_a_clear_error(case, data):
    # check_fit_score_takes_y and check_estimators_empty_data_messages.
    fitted, fit_args, _ = _fitted(case, data)
    assert np.isfinite(fitted.score(*fit_args))
    if case == "LocusEmbedder":
        with pytest.raises(ValueError, match="at least one evaluation set"):
            clone(fitted).fit([])
    else:
        with pytest.raises(ValueError, match="got 0 queries and 2 models"):
            clone(fitted).fit([], pd.DataFrame(np.zeros((0, 2))))


# -- the stock checks, one by one ---------------------------------------------------------

# Where each of scikit-learn's estimator checks stands for these estimators: a ragged
# equivalent in this module (or the one named), a stock check that runs as it is, or
# the reason it cannot apply. scikit-learn's check_estimator stops after its first
# check on input that is not a 2-D array; this table says what replaces the rest.
NOT_2D = "feeds a 2-D numeric array; the input is ragged evaluation sets or queries"
RAGGED = "ragged equivalent: "
STOCK = "runs as it is: test_stock_checks_that_need_no_data"
EXPECTED_FAILED_CHECKS = {
    "check_array_api_input": NOT_2D,
    "check_complex_data": NOT_2D + " (scores are real numbers in [0, 1])",
    "check_dict_unchanged": NOT_2D,
    "check_dtype_object": NOT_2D,
    "check_estimator_sparse_array": NOT_2D,
    "check_estimator_sparse_matrix": NOT_2D,
    "check_estimator_sparse_tag": "sparse input is not accepted at all",
    "check_estimators_dtypes": NOT_2D,
    "check_estimators_nan_inf": NOT_2D + " (bad scores are refused by "
    "tests/test_fuzzing.py and tests/test_evaluations.py)",
    "check_f_contiguous_array_estimator": NOT_2D,
    "check_fit1d": NOT_2D,
    "check_fit2d_1feature": NOT_2D,
    "check_fit2d_1sample": NOT_2D,
    "check_fit2d_predict1d": NOT_2D,
    "check_n_features_in": "no n_features_in_: sets are ragged; query_dim_ fixes the "
    "query encoding's width and a mismatched encoder is refused by name",
    "check_n_features_in_after_fitting": "as check_n_features_in",
    "check_positive_only_tag_during_fit": NOT_2D,
    "check_readonly_memmap_input": NOT_2D,
    "check_requires_y_none": "fit needs Y, and says so when it is missing",
    "check_transformer_data_not_an_array": NOT_2D,
    "check_transformer_n_iter": "no n_iter_: the epochs trained are rows of history_",
    "check_transformer_preserve_dtypes": "embeddings are float32 whatever the "
    "scores' dtype",
    "check_pipeline_consistency": RAGGED + "tests/test_embedder.py pipelines and "
    "test_refitting_with_the_same_random_state_gives_the_same_model",
}
COVERED_CHECKS = {
    "check_estimators_fit_returns_self": RAGGED
    + "test_fit_returns_self_and_leaves_its_parameters_alone",
    "check_dont_overwrite_parameters": RAGGED
    + "test_fit_returns_self_and_leaves_its_parameters_alone",
    "check_estimators_overwrite_params": RAGGED
    + "test_fit_returns_self_and_leaves_its_parameters_alone",
    "check_estimators_unfitted": RAGGED
    + "test_not_fitted_until_fit_and_a_clone_is_unfitted",
    "check_transformers_unfitted": RAGGED
    + "test_not_fitted_until_fit_and_a_clone_is_unfitted",
    "check_fit_check_is_fitted": RAGGED
    + "test_not_fitted_until_fit_and_a_clone_is_unfitted",
    "check_estimators_pickle": RAGGED
    + "test_pickle_round_trip_gives_identical_outputs",
    "check_fit_idempotent": RAGGED
    + "test_refitting_with_the_same_random_state_gives_the_same_model",
    "check_methods_sample_order_invariance": RAGGED
    + "test_outputs_follow_their_inputs_in_any_order_and_subset",
    "check_methods_subset_invariance": RAGGED
    + "test_outputs_follow_their_inputs_in_any_order_and_subset",
    "check_transformer_general": RAGGED + "test_fit_transform_is_fit_then_transform",
    "check_fit_score_takes_y": RAGGED
    + "test_score_takes_y_and_empty_data_is_a_clear_error",
    "check_estimators_empty_data_messages": RAGGED
    + "test_score_takes_y_and_empty_data_is_a_clear_error",
    "check_do_not_raise_errors_in_init_or_set_params": STOCK,
    "check_estimator_repr": STOCK,
    "check_estimator_tags_renamed": STOCK,
    "check_get_params_invariance": STOCK,
    "check_mixin_order": STOCK,
    "check_no_attributes_set_in_init": STOCK,
    "check_parameters_default_constructible": STOCK,
    "check_set_params": STOCK,
    "check_valid_tag_types": STOCK,
}


def _stock_check_names(estimator):
    """The checks scikit-learn would run were the estimator's input a 2-D array."""

    class TwoDimensional(type(estimator)):
        def __sklearn_tags__(self):
            tags = super().__sklearn_tags__()
            tags.input_tags.two_d_array = True
            return tags

    stand_in = TwoDimensional(**estimator.get_params(deep=False))
    return {
        getattr(check, "func", check).__name__
        for check in _yield_all_checks(stand_in, legacy=True)
    }


@pytest.mark.parametrize("case", CASE_NAMES)
def test_every_stock_check_is_replaced_run_or_explained(case, data):
    estimator, _, _ = CASES[case](data)
    unaccounted = _stock_check_names(estimator) - (
        EXPECTED_FAILED_CHECKS.keys() | COVERED_CHECKS.keys()
    )
    assert not unaccounted, f"decide how to check {sorted(unaccounted)}"
    # What check_estimator itself runs passes, with the rest declared.
    with pytest.warns(SkipTestWarning, match="Can't test estimator"):
        results = check_estimator(
            estimator, expected_failed_checks=EXPECTED_FAILED_CHECKS, on_fail=None
        )
    assert results and all(r["status"] != "failed" for r in results)


@pytest.mark.parametrize("case", CASE_NAMES)
@pytest.mark.parametrize(
    "check", sorted(name for name, how in COVERED_CHECKS.items() if how == STOCK)
)
def test_stock_checks_that_need_no_data(case, check, data):
    estimator, _, _ = CASES[case](data)
    getattr(estimator_checks, check)(type(estimator).__name__, estimator)
