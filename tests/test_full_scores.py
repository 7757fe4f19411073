"""ScoreEstimator fitted on the references' full scores: estimates on their scale."""

import numpy as np
import pandas as pd
import pytest
from marks import slow_fixture
from sklearn.linear_model import Ridge

from sklocus import LocusEmbedder, ScoreEstimator
from sklocus._score_readout import (
    check_reference_scores,
    conditional_scores,
    greedy_queries,
    weighted_moments,
)
from sklocus.datasets import make_evaluations

N_REFERENCE = 120
N_NEW = 40


@pytest.fixture(scope="module")
def data():
    return make_evaluations(
        n_models=N_REFERENCE + N_NEW,
        n_queries=150,
        evals_per_model=None,
        query_dim=16,
        random_state=1,
    )


def _full_scores(data):
    """Each model's "leaderboard" score per benchmark: not its mean over the items.

    The queries stand for a sample of a larger benchmark, so a model's full
    score is its expected accuracy there, on another scale (percent, offset).
    """
    benchmarks = np.asarray(data.benchmarks)
    columns = {
        b: 20 + 70 * data.probabilities[benchmarks == b].mean(axis=0)
        for b in sorted(set(benchmarks))
    }
    return pd.DataFrame(columns)


@slow_fixture(scope="module")
def fitted(data):
    references = data.evaluation_sets[:N_REFERENCE]
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        embedding_dim=16,
        n_latents=4,
        encoder_sizes=(8, 64),
        decoder_size=64,
        max_epochs=3,
        epoch_size=512,
        lr=3e-3,
        predictor_lr=1e-2,
        random_state=0,
    ).fit(references)
    scores = _full_scores(data).iloc[:N_REFERENCE].reset_index(drop=True)
    return ScoreEstimator(embedder, random_state=0).fit(references, scores)


def _shown(data, model, queries):
    return {q: data.evaluation_sets[model][q] for q in queries}


def test_estimates_are_on_the_full_scores_scale(data, fitted):
    truth = _full_scores(data).to_numpy()[N_REFERENCE:]
    ids, groups = data.query_ids, data.benchmarks
    rng = np.random.default_rng(0)
    sets = [
        _shown(data, N_REFERENCE + i, rng.choice(ids, 40, replace=False))
        for i in range(N_NEW)
    ]
    table = fitted.estimate_scores(sets, ids, groups)
    assert set(table["target"]) == {"full score"}
    wide = table.pivot(index="model", columns="group", values="estimate")
    estimates = wide[list(_full_scores(data).columns)].to_numpy()
    error = np.sqrt(np.mean((estimates - truth) ** 2))
    # Against the references' mean score, what knowing nothing gives.
    prior = _full_scores(data).to_numpy()[:N_REFERENCE].mean(axis=0)
    assert error < 0.6 * np.sqrt(np.mean((truth - prior) ** 2))
    items = fitted.estimate_scores(sets, ids, [f"items of {g}" for g in groups])
    assert set(items["target"]) == {"item mean"}
    assert items["estimate"].between(0, 1).all()  # the other scale, as asked


def test_intervals_hold_the_full_scores(data, fitted):
    truth = _full_scores(data)
    rng = np.random.default_rng(1)
    sets = [
        _shown(data, N_REFERENCE + i, rng.choice(data.query_ids, 30, replace=False))
        for i in range(N_NEW)
    ]
    table = fitted.estimate_scores(sets, data.query_ids, data.benchmarks)
    held = [
        truth.iloc[N_REFERENCE + row.model][row.group] for row in table.itertuples()
    ]
    inside = (table["lower"] <= held) & (held <= table["upper"])
    # 90% intervals over 200 estimates of 40 models: far from 50%, and the
    # calibration's own held-out coverage is reported.
    assert 0.7 <= inside.mean() <= 1.0
    assert 0.7 <= fitted.score_coverage_ <= 1.0
    assert (table["std"] > 0).all()


def test_groups_without_full_scores_keep_the_item_mean(data, fitted):
    groups = [g if g == data.benchmarks[0] else "other" for g in data.benchmarks]
    table = fitted.estimate_scores([{}], data.query_ids, groups)
    target = dict(zip(table["group"], table["target"]))
    assert target == {data.benchmarks[0]: "full score", "other": "item mean"}
    other = table.set_index("group").loc["other"]
    assert 0 <= other["lower"] <= other["estimate"] <= other["upper"] <= 1


def test_without_scores_nothing_is_read(data, fitted):
    estimator = ScoreEstimator(fitted.embedder, random_state=0).fit(
        data.evaluation_sets[:N_REFERENCE]
    )
    assert estimator.score_groups_ is None
    table = estimator.estimate_scores([{}], data.query_ids, data.benchmarks)
    assert set(table["target"]) == {"item mean"}


def test_conditional_mean_is_a_ridge_regression_on_the_seen_queries():
    # With even weights, the conditional mean is the ridge regression of the
    # targets on the seen outcomes (penalty noise * n_rows), whatever they are.
    rng = np.random.default_rng(0)
    outcomes = (rng.random((300, 30)) < rng.random(30)).astype(float)
    targets = outcomes[:, :10] @ rng.random((10, 2)) + rng.normal(size=(300, 2))
    table = np.c_[outcomes, targets]
    seen = np.array([3, 7, 11, 20, 29])
    new = outcomes[0, seen]
    weights = np.full(300, 1 / 300)
    mean, covariance = weighted_moments(table, weights, np.r_[seen, [-2, -1]])
    mean, variance = conditional_scores(mean, covariance, 5, np.arange(5), new, 0.05)
    ridge = Ridge(alpha=0.05 * 300).fit(outcomes[:, seen], targets)
    np.testing.assert_allclose(mean, ridge.predict(new[None])[0], rtol=1e-9)
    # The variance is what the seen outcomes leave of the targets' variance.
    prior = targets.var(axis=0)
    assert np.all(variance < prior) and np.all(variance > 0)
    # No query seen: the references' mean and variance.
    mean0, variance0 = conditional_scores(
        table.mean(axis=0), np.cov(table.T, bias=True), 30, [], [], 0.05
    )
    np.testing.assert_allclose(mean0, targets.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(variance0, prior, rtol=1e-12)


def test_greedy_queries_first_pick_shrinks_the_variance_most():
    rng = np.random.default_rng(2)
    outcomes = (rng.random((400, 12)) < rng.random(12)).astype(float)
    targets = outcomes @ rng.normal(size=(12, 2))
    joined = np.c_[outcomes, targets]
    factor = (joined - joined.mean(axis=0)) / np.sqrt(len(joined))
    covariance = factor.T @ factor
    noise = 0.05
    prior = np.diag(covariance)[12:]
    left = [
        conditional_scores(np.zeros(14), covariance, 12, [q], [0.0], noise)[1]
        for q in range(12)
    ]
    best = int(np.argmin([np.sum(v / prior) for v in left]))
    picks = greedy_queries(covariance, 12, [], np.arange(12), 4, noise)
    assert picks[0] == best
    assert len(set(picks.tolist())) == 4
    # Conditioned on the first pick as seen, the next three are the same.
    again = greedy_queries(covariance, 12, [best], np.arange(12), 4, noise)
    assert again[0] != best and list(again[:3]) == list(picks[1:])


def test_anchors_do_not_depend_on_the_outcomes(data, fitted):
    ids, groups = data.query_ids, data.benchmarks
    first = fitted.suggest_queries({}, ids, 10, query_groups=groups, strategy="anchors")
    assert len(set(first)) == 10
    # Two models with opposite results on the same queries get the same anchors.
    right = dict.fromkeys(first, 1.0)
    wrong = dict.fromkeys(first, 0.0)
    a = fitted.suggest_queries(right, ids, 10, query_groups=groups, strategy="anchors")
    b = fitted.suggest_queries(wrong, ids, 10, query_groups=groups, strategy="anchors")
    assert a == b and not set(a) & set(first)


def test_chosen_queries_beat_random_ones_on_the_full_scores(data, fitted):
    ids, groups = data.query_ids, data.benchmarks
    truth = _full_scores(data).to_numpy()[N_REFERENCE:]
    rng = np.random.default_rng(3)
    errors = {}
    for how in ("anchors", "random"):
        sets = []
        for i in range(N_NEW):
            if how == "random":
                queries = rng.choice(ids, 15, replace=False)
            else:
                queries = fitted.suggest_queries(
                    {}, ids, 15, query_groups=groups, strategy="anchors"
                )
            sets.append(_shown(data, N_REFERENCE + i, queries))
        table = fitted.estimate_scores(sets, ids, groups)
        wide = table.pivot(index="model", columns="group", values="estimate")
        errors[how] = np.sqrt(np.mean((wide.to_numpy() - truth) ** 2))
    assert errors["anchors"] < errors["random"]


@pytest.mark.parametrize(
    "scores, message",
    [
        ({"a": [1.0] * 12}, "must be a pandas DataFrame"),
        (pd.DataFrame({"a": [1.0] * 11}), "11 rows for 12 reference sets"),
        (pd.DataFrame({"a": ["x"] * 12}), "column 'a' must hold numbers"),
        (pd.DataFrame({"a": [1.0] * 11 + [np.inf]}), "column 'a' row 11 is inf"),
        (pd.DataFrame({"a": [1.0] * 3 + [np.nan] * 9}), "only 3 reference sets"),
        (pd.DataFrame(index=range(12)), "no columns"),
        # Issue 70, F20: 1e155 gave NaN intervals (its square overflows), and
        # 100,000 columns a MemoryError.
        (
            pd.DataFrame({"a": [0.5] * 11 + [1e155]}),
            "column 'a' row 11 is 1e\\+155; scores must be finite numbers of "
            "magnitude at most 1e\\+09",
        ),
        (
            pd.DataFrame(np.zeros((12, 100_000))),
            "scores has 100,000 columns; at most 1,000",
        ),
    ],
)
def test_bad_scores_are_refused_by_name(scores, message):
    with pytest.raises((TypeError, ValueError), match=message):
        check_reference_scores(scores, 12)


def test_fit_refuses_scores_of_the_wrong_length(data, fitted):
    references = data.evaluation_sets[:N_REFERENCE]
    scores = _full_scores(data).iloc[: N_REFERENCE - 1]
    with pytest.raises(ValueError, match=f"{N_REFERENCE - 1} rows for"):
        ScoreEstimator(fitted.embedder).fit(references, scores)
