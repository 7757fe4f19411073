"""ProbabilityCalibrator, and a router's probabilities calibrated on held-out halves."""

import numpy as np
import pandas as pd
import pytest
from sklearn.frozen import FrozenEstimator
from tiny import TINY_NETWORK

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus.calibration import ProbabilityCalibrator
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix
from sklocus.metrics import expected_calibration_error

SMALL = dict(TINY_NETWORK, max_epochs=2, epoch_size=256, validation_fraction=None)


def _overconfident(n=20_000, seed=0):
    """True probabilities, scores drawn from them, and overconfident predictions."""
    rng = np.random.default_rng(seed)
    truth = rng.uniform(0.05, 0.95, size=n)
    scores = (rng.random(n) < truth).astype(float)
    logit = np.log(truth / (1 - truth))
    return truth, scores, 1.0 / (1.0 + np.exp(-2.5 * logit))


@pytest.mark.parametrize("method", ["isotonic", "sigmoid"])
def test_a_calibrator_undoes_overconfidence_on_new_pairs(method):
    _, scores, predicted = _overconfident()
    truth, new_scores, new_predicted = _overconfident(seed=1)
    calibrator = ProbabilityCalibrator(method).fit(predicted, scores)
    calibrated = calibrator.predict(new_predicted)
    before = expected_calibration_error([new_scores], [new_predicted])
    after = expected_calibration_error([new_scores], [calibrated])
    assert before > 0.05 and after < 0.015
    assert np.abs(calibrated - truth).mean() < 0.03
    assert calibrated.dtype == np.float32 and calibrator.n_pairs_ == 20_000


def test_the_isotonic_map_is_strictly_increasing_between_its_ends():
    _, scores, predicted = _overconfident(n=3000)
    calibrator = ProbabilityCalibrator().fit(predicted, scores)
    assert (np.diff(calibrator.x_thresholds_) > 0).all()
    assert (np.diff(calibrator.y_thresholds_) > 0).all()
    grid = np.linspace(calibrator.x_thresholds_[0], calibrator.x_thresholds_[-1], 999)
    assert (np.diff(calibrator.predict(grid)) > 0).all()


def test_unobserved_pairs_are_left_out_and_shapes_kept():
    _, scores, predicted = _overconfident(n=4000)
    table = scores.reshape(40, 100).copy()
    table[:, :50] = np.nan
    fitted = ProbabilityCalibrator("sigmoid").fit(predicted.reshape(40, 100), table)
    assert fitted.n_pairs_ == 2000
    assert fitted.predict(predicted.reshape(40, 100)).shape == (40, 100)


def test_bad_input_is_refused():
    calibrator = ProbabilityCalibrator().fit([0.2, 0.8, 0.6], [0, 1, 1])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        calibrator.predict([0.5, 1.5])
    with pytest.raises(ValueError, match="method"):
        ProbabilityCalibrator("beta").fit([0.5], [1])
    with pytest.raises(ValueError, match="no score is observed"):
        ProbabilityCalibrator().fit([0.5], [np.nan])


@pytest.fixture(scope="module")
def pool():
    data = make_evaluations(
        n_models=8, n_queries=300, evals_per_model=None, random_state=1
    )
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    embedder = LocusEmbedder(query_encoder=data.encoder, **SMALL)
    return queries, Y, FrozenEstimator(embedder.fit(data.evaluation_sets))


@pytest.mark.slow
@pytest.mark.parametrize("query_heads", [False, True])
def test_a_router_calibrates_on_held_out_halves_and_keeps_its_routes(
    pool, query_heads, tmp_path
):
    queries, Y, frozen = pool
    train, test = queries[:200], queries[200:]
    # The map is the last stage only without group offsets (clusters).
    stages = dict(query_heads=query_heads, query_clusters=None)
    plain = LocusRouter(frozen, **stages).fit(train, Y.iloc[:200])
    calibrated = LocusRouter(frozen, calibration="isotonic", **stages)
    calibrated.fit(train, Y.iloc[:200])
    assert plain.probability_calibrator_ is None
    assert calibrated.probability_calibrator_.n_pairs_ > 1000
    # The map is strictly increasing: the likeliest model stays the likeliest
    # (but where two were within rounding, which the router counts as a tie).
    before = plain.predict_correctness(test)
    top2 = np.sort(before, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-4
    assert clear.mean() > 0.5
    np.testing.assert_array_equal(
        calibrated.predict(test)[clear], plain.predict(test)[clear]
    )
    np.testing.assert_allclose(
        calibrated.predict_correctness(test),
        calibrated.probability_calibrator_.predict(before),
        rtol=1e-6,
    )
    path = tmp_path / "router.skops"
    sklocus.save(calibrated, path)
    np.testing.assert_array_equal(
        sklocus.load(path).predict_correctness(test),
        calibrated.predict_correctness(test),
    )
