"""Quality against cost (curve, frontier, AIQ) and calibration measures."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.calibration import calibration_curve

from sklocus.metrics import (
    aiq,
    best_models,
    cost_at_quality,
    cost_quality_curve,
    expected_calibration_error,
    quality_at_cost,
    quality_cost_frontier,
    reliability_curve,
    routing_accuracy,
)

points = st.lists(
    st.tuples(st.floats(0, 100, allow_nan=False), st.floats(0, 1, allow_nan=False)),
    min_size=1,
    max_size=30,
)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(points)
def test_the_frontier_is_a_rising_concave_hull_over_every_point(pairs):
    costs, qualities = (np.array(column) for column in zip(*pairs))
    hull_costs, hull_qualities = quality_cost_frontier(costs, qualities)
    # Vertices are points, by increasing cost, rising, with falling slopes.
    assert set(zip(hull_costs, hull_qualities)) <= set(zip(costs, qualities))
    assert (np.diff(hull_costs) > 0).all()
    assert (np.diff(hull_qualities) > 0).all()
    slopes = np.diff(hull_qualities) / np.diff(hull_costs)
    assert (np.diff(slopes) <= 1e-9 * (1 + np.abs(slopes[:-1]))).all()
    # It starts at the cheapest point, ends at the best, and no point lies above.
    assert hull_costs[0] == costs.min()
    assert hull_qualities[-1] == qualities.max()
    reached = quality_at_cost(costs, qualities, costs)
    assert (reached >= qualities - 1e-9).all()


def test_the_frontier_of_hand_made_points():
    hull = quality_cost_frontier([4, 1, 2, 3, 5, 1], [0.7, 0.4, 0.5, 0.8, 0.8, 0.5])
    # (1, 0.4) lies under (1, 0.5); (2, 0.5) under the chord to (3, 0.8);
    # (4, 0.7) and (5, 0.8) cost more than (3, 0.8) for no more quality.
    np.testing.assert_array_equal(hull[0], [1, 3])
    np.testing.assert_array_equal(hull[1], [0.5, 0.8])


def test_aiq_is_the_mean_height_with_nothing_below_the_cheapest_point():
    # Flat at 0.7 over the whole range.
    assert aiq([1], [0.7], cost_range=(1, 9)) == pytest.approx(0.7)
    # 0 on [0, 2), 0.6 to 0.9 on [2, 4]: area 1.5 over 4.
    assert aiq([2, 4], [0.6, 0.9], cost_range=(0, 4)) == pytest.approx(0.375)
    # Rising over [1, 3], flat at 0.8 on [3, 5].
    assert aiq([1, 3], [0.5, 0.8], cost_range=(1, 5)) == pytest.approx(0.725)
    # A range inside the frontier, and the points' own range by default.
    assert aiq([0, 4], [0.2, 0.6], cost_range=(1, 3)) == pytest.approx(0.4)
    assert aiq([0, 4], [0.2, 0.6]) == pytest.approx(0.4)
    # A frontier that starts beyond the range scores 0.
    assert aiq([5, 6], [0.6, 0.9], cost_range=(0, 4)) == 0
    with pytest.raises(ValueError, match=r"cost_range is \(3.0, 3.0\)"):
        aiq([1, 2], [0.5, 0.6], cost_range=(3, 3))


def test_cost_at_quality_inverts_quality_at_cost():
    costs, qualities = [1, 2, 4, 8], [0.3, 0.6, 0.75, 0.8]
    for budget in (1, 1.5, 3, 6, 8):
        target = quality_at_cost(costs, qualities, budget)
        assert cost_at_quality(costs, qualities, target) == pytest.approx(budget)
    assert cost_at_quality(costs, qualities, 0.1) == 1  # the cheapest reaches it
    assert cost_at_quality(costs, qualities, 0.81) == float("inf")
    assert np.isnan(quality_at_cost(costs, qualities, 0.5))
    assert quality_at_cost(costs, qualities, 100) == 0.8


@pytest.fixture(scope="module")
def pool():
    rng = np.random.default_rng(0)
    truth = rng.uniform(0.1, 0.95, size=(5, 400))
    scores = (rng.uniform(size=truth.shape) < truth).astype(float)
    noisy = np.clip(truth + rng.normal(0, 0.1, truth.shape), 0, 1)
    cost = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    return scores.T, noisy.T, cost  # a row per query, as sklocus.metrics takes


def test_the_curve_runs_from_the_best_guess_to_the_cheapest_model(pool):
    scores, probabilities, cost = pool
    costs, qualities, weights = cost_quality_curve(scores, probabilities, cost)
    assert weights[0] == 0 and np.isinf(weights[-1]) and len(weights) == 63
    # Weight 0 routes as routing_accuracy does; infinity to the cheapest model.
    assert qualities[0] == routing_accuracy(scores, probabilities)
    chosen = best_models(probabilities)
    assert costs[0] == pytest.approx(cost[chosen].mean())
    assert costs[-1] == cost.min()
    assert qualities[-1] == pytest.approx(scores[:, np.argmin(cost)].mean())
    # A heavier weight never picks a dearer model for any query.
    assert (np.diff(costs) <= 1e-12).all()


def test_costs_per_query_and_model(pool):
    scores, probabilities, cost = pool
    per_query = np.repeat(cost[None, :], len(scores), axis=0)
    same = cost_quality_curve(scores, probabilities, per_query)
    np.testing.assert_allclose(
        same[0], cost_quality_curve(scores, probabilities, cost)[0]
    )
    # A model free on half the queries is chosen there once cost counts.
    per_query[::2, 4] = 0.0
    costs, qualities, _ = cost_quality_curve(
        scores, probabilities, per_query, cost_weights=[np.inf]
    )
    chosen = np.where(np.arange(len(scores)) % 2 == 0, 4, 0)
    assert qualities[0] == pytest.approx(scores[np.arange(400), chosen].mean())
    assert costs[0] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "cost, message",
    [
        ([1, 2], r"cost has shape \(2,\); expected one cost per model, \(5,\)"),
        ([1, 2, -1, 4, 5], r"cost of model 2 on query 0 is -1.0; costs must be"),
        ([1, 2, np.nan, 4, 5], r"cost of model 2 on query 0 is nan"),
    ],
)
def test_bad_costs_are_named(pool, cost, message):
    scores, probabilities, _ = pool
    with pytest.raises(ValueError, match=message):
        cost_quality_curve(scores, probabilities, cost)


def test_bad_weights_and_shapes_are_named(pool):
    scores, probabilities, cost = pool
    with pytest.raises(ValueError, match="each at least 0"):
        cost_quality_curve(scores, probabilities, cost, cost_weights=[-1])
    with pytest.raises(ValueError, match=r"both must be \(n_queries, n_models\)"):
        cost_quality_curve(scores, probabilities[:3], cost)


def test_reliability_curve_agrees_with_scikit_learn(pool):
    scores, probabilities, _ = pool
    predicted, observed, counts = reliability_curve(scores, probabilities, n_bins=8)
    true_rate, mean_prediction = calibration_curve(
        scores.ravel(), probabilities.ravel(), n_bins=8
    )
    np.testing.assert_allclose(predicted, mean_prediction)
    np.testing.assert_allclose(observed, true_rate)
    assert counts.sum() == scores.size
    quantile = reliability_curve(scores, probabilities, n_bins=4, strategy="quantile")
    assert np.ptp(quantile[2]) <= 1


def test_expected_calibration_error_is_small_when_calibrated_only():
    rng = np.random.default_rng(1)
    truth = rng.uniform(size=(20, 5000))
    scores = (rng.uniform(size=truth.shape) < truth).astype(float)
    assert expected_calibration_error(scores, truth) < 0.01
    assert expected_calibration_error(scores, truth**3) > 0.1
    # Unobserved pairs are left out, not counted as failures.
    gappy = scores.copy()
    gappy[:, ::2] = np.nan
    assert expected_calibration_error(gappy, truth) < 0.01


def test_calibration_measures_name_bad_settings(pool):
    scores, probabilities, _ = pool
    with pytest.raises(
        ValueError, match="'n_bins' parameter of reliability_curve must be an int"
    ):
        reliability_curve(scores, probabilities, n_bins=0)
    with pytest.raises(
        ValueError, match="'strategy' parameter of expected_calibration_error"
    ):
        expected_calibration_error(scores, probabilities, strategy="equal")
    with pytest.raises(ValueError, match="no score is observed"):
        expected_calibration_error(np.full((2, 2), np.nan), np.zeros((2, 2)))


def test_the_threshold_curve_runs_from_the_cheapest_model_to_the_likeliest(pool):
    scores, probabilities, cost = pool
    costs, qualities, thresholds = cost_quality_curve(
        scores, probabilities, cost, min_probabilities=[0.0, 0.5, 0.9, 1.0]
    )
    np.testing.assert_array_equal(thresholds, [0.0, 0.5, 0.9, 1.0])
    # 0: every model qualifies, the cheapest wins; 1: none does, the likeliest.
    assert costs[0] == cost.min()
    assert qualities[-1] == routing_accuracy(scores, probabilities)
    assert (np.diff(costs) >= -1e-12).all()  # a higher bar never costs less
    with pytest.raises(ValueError, match=r"min_probabilities are \[1.5\]"):
        cost_quality_curve(scores, probabilities, cost, min_probabilities=[1.5])
    with pytest.raises(ValueError, match="not both"):
        cost_quality_curve(
            scores, probabilities, cost, cost_weights=[0], min_probabilities=[0]
        )


def test_the_cost_of_a_route_counts_whether_or_not_it_was_scored():
    # The dear model is scored on one query in ten: its routes' costs still count.
    scores = np.ones((10, 2))
    scores[1:, 1] = np.nan
    probabilities = np.tile([0.5, 0.9], (10, 1))
    costs, qualities, _ = cost_quality_curve(
        scores, probabilities, [1.0, 10.0], cost_weights=[0]
    )
    assert costs[0] == 10.0 and qualities[0] == 1.0


def test_nan_is_named_not_routed():
    with pytest.raises(ValueError, match="utility of model 1 for query 0 is NaN"):
        best_models([[0.1, np.nan]])
    with pytest.raises(ValueError, match="probabilities must be finite"):
        cost_quality_curve([[1.0]], [[np.nan]], [1.0])
    with pytest.raises(ValueError, match="every point costs 1.0; give cost_range"):
        aiq([1], [0.5])
