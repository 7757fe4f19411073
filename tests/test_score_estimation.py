"""ScoreEstimator: estimated scores with measured intervals, and suggested queries."""

import numpy as np
import pytest
from marks import slow_fixture

from sklocus import LocusEmbedder, ScoreEstimator
from sklocus._model_posterior import greedy_variance_reduction, posterior_weights
from sklocus.datasets import make_evaluations

N_REFERENCE = 100
STRATEGIES = ("variance", "disagreement", "coverage", "random")


@pytest.fixture(scope="module")
def data():
    """Synthetic models evaluated on every query, with their true P(correct)."""
    return make_evaluations(
        n_models=N_REFERENCE + 40,
        n_queries=150,
        evals_per_model=None,
        query_dim=16,
        random_state=0,
    )


@slow_fixture(scope="module")
def embedder(data):
    # Small, but trained enough that its reference models differ (a network that
    # learnt only the queries' difficulty would make every test of the weights
    # vacuous).
    return LocusEmbedder(
        query_encoder=data.encoder,
        embedding_dim=16,
        n_latents=4,
        encoder_sizes=(8, 64),
        decoder_size=64,
        max_epochs=4,
        epoch_size=512,
        lr=3e-3,
        predictor_lr=1e-2,
        random_state=0,
    ).fit(data.evaluation_sets[:N_REFERENCE])


@pytest.fixture(scope="module")
def estimator(data, embedder):
    return ScoreEstimator(embedder, random_state=0).fit(
        data.evaluation_sets[:N_REFERENCE]
    )


def _shown(data, model, n, seed):
    """``n`` random evaluations of ``model`` (which was evaluated on every query)."""
    rng = np.random.default_rng(seed)
    queries = rng.choice(data.query_ids, n, replace=False)
    return {q: data.evaluation_sets[model][q] for q in queries}


def test_fit_calibrates_on_the_references(data, estimator):
    assert estimator.reference_embeddings_.shape == (N_REFERENCE, 16)
    spread = estimator._reference_predictions(data.query_ids).std(axis=0).mean()
    assert spread > 0.05  # the reference models predict differently
    assert estimator.temperature_ > 0
    assert estimator.interval_scale_ > 0
    assert 0 <= estimator.coverage_ <= 1
    assert estimator.n_calibration_estimates_ > 0


def test_intervals_hold_the_truth_at_their_nominal_rate(data, estimator):
    """On held-out models with known P: each interval at 90% holds the model's
    realised score on the benchmark about 90% of the time."""
    held, truths, inside, widths = range(N_REFERENCE, N_REFERENCE + 40), [], [], []
    for model in held:
        shown = _shown(data, model, 20, model)
        table = estimator.estimate_scores(
            [shown], data.query_ids, data.benchmarks
        ).set_index("group")
        outcomes = np.array([data.evaluation_sets[model][q] for q in data.query_ids])
        for benchmark in np.unique(data.benchmarks):
            truth = outcomes[data.benchmarks == benchmark].mean()
            row = table.loc[benchmark]
            inside.append(row.lower <= truth <= row.upper)
            widths.append(row.upper - row.lower)
            truths.append(truth)
    coverage = np.mean(inside)
    assert 0.8 <= coverage <= 0.98, coverage
    # And the intervals say something: narrower than the spread of the truths.
    assert np.mean(widths) < 4 * np.std(truths)


def test_evaluations_inform_the_queries_not_evaluated(data, estimator):
    """Shown results on half the queries sharpen the estimate on the other
    half, which no result touches: the weights carry what the results say."""
    shown_half, other_half = data.query_ids[::2], data.query_ids[1::2]
    errors = {0: [], 40: []}
    rng = np.random.default_rng(0)
    for model in range(N_REFERENCE, N_REFERENCE + 40):
        truth = np.mean([data.evaluation_sets[model][q] for q in other_half])
        picked = rng.choice(shown_half, 40, replace=False)
        shown = {q: data.evaluation_sets[model][q] for q in picked}
        for n, results in ((0, {}), (40, shown)):
            table = estimator.estimate_scores([results], other_half)
            errors[n].append(table.estimate[0] - truth)
    rmse = {n: np.sqrt(np.mean(np.square(e))) for n, e in errors.items()}
    assert rmse[40] < 0.7 * rmse[0], rmse


def test_estimate_table(data, estimator):
    model = N_REFERENCE
    everything = data.evaluation_sets[model]
    first = data.query_ids[:50]
    groups = np.where(np.arange(150) < 50, "first", "rest").astype(object)
    groups[-10:] = None  # in no group
    table = estimator.estimate_scores(
        [{q: everything[q] for q in first}, {}],
        data.query_ids,
        groups,
        model_names=["evaluated", "new"],
    )
    assert table.model.tolist() == ["evaluated", "evaluated", "new", "new"]
    assert table.group.tolist() == ["first", "rest"] * 2
    assert table.n_queries.tolist() == [50, 90, 50, 90]
    assert table.n_evaluated.tolist() == [50, 0, 0, 0]
    # A group evaluated in full is known exactly.
    exact = table.iloc[0]
    observed = np.mean([everything[q] for q in first])
    assert exact.estimate == pytest.approx(observed)
    assert exact["std"] == pytest.approx(0, abs=1e-9)
    assert exact.lower == pytest.approx(observed) and exact.upper == pytest.approx(
        observed
    )
    assert (table.lower <= table.estimate + 1e-12).all()
    assert (table.estimate <= table.upper + 1e-12).all()
    assert ((table.lower >= 0) & (table.upper <= 1)).all()


def test_nothing_given_is_changed(data, estimator):
    shown = _shown(data, N_REFERENCE, 10, 0)
    before = dict(shown)
    queries = list(data.query_ids)
    estimator.estimate_scores([shown], queries)
    estimator.suggest_queries(shown, queries, 3)
    assert shown == before and queries == list(data.query_ids)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_suggestions_are_deterministic_new_and_distinct(data, embedder, strategy):
    references = data.evaluation_sets[:N_REFERENCE]
    one = ScoreEstimator(embedder, random_state=3).fit(references)
    two = ScoreEstimator(embedder, random_state=3).fit(references)
    shown = _shown(data, N_REFERENCE + 1, 12, 1)
    first = one.suggest_queries(shown, data.query_ids, 15, strategy=strategy)
    assert first == two.suggest_queries(shown, data.query_ids, 15, strategy=strategy)
    assert len(set(first)) == 15
    assert not set(first) & set(shown)
    assert set(first) <= set(data.query_ids)


def test_one_at_a_time_never_repeats(data, estimator):
    model = data.evaluation_sets[N_REFERENCE + 2]
    evaluated = {}
    for _ in range(6):
        (query,) = estimator.suggest_queries(
            evaluated, data.query_ids, query_groups=data.benchmarks
        )
        assert query not in evaluated
        evaluated[query] = model[query]
    assert len(evaluated) == 6


def test_variance_strategy_spreads_over_the_groups(data, estimator):
    # Ten queries at random miss one of the five groups half the time.
    chosen = estimator.suggest_queries(
        {}, data.query_ids, 10, query_groups=data.benchmarks
    )
    benchmark_of = dict(zip(data.query_ids, data.benchmarks))
    assert len({benchmark_of[q] for q in chosen}) == len(np.unique(data.benchmarks))


def test_variance_strategy_with_candidates_in_no_group(data, estimator):
    groups = data.benchmarks.astype(object)
    groups[::3] = None
    chosen = estimator.suggest_queries({}, data.query_ids, 6, query_groups=groups)
    assert len(set(chosen)) == 6
    with pytest.raises(ValueError, match="no query a group"):
        estimator.suggest_queries(
            {}, data.query_ids, 1, query_groups=[None] * len(data.query_ids)
        )


def test_predictions_are_the_same_without_the_cache(data, estimator, monkeypatch):
    shown = _shown(data, N_REFERENCE + 4, 15, 4)
    kept = estimator.estimate_scores([shown], data.query_ids, data.benchmarks)
    picks = estimator.suggest_queries(shown, data.query_ids, 5)
    # A cache too small for any query: every call predicts afresh.
    monkeypatch.setattr("sklocus._score_estimation._CACHE_BYTES", 16)
    fresh = estimator.estimate_scores([shown], data.query_ids, data.benchmarks)
    np.testing.assert_allclose(fresh.estimate, kept.estimate, rtol=1e-6)
    assert estimator.suggest_queries(shown, data.query_ids, 5) == picks


def test_exhausted_candidates_are_an_error(data, estimator):
    candidates = data.query_ids[:5]
    evaluated = {q: data.evaluation_sets[0][q] for q in candidates[:3]}
    assert len(estimator.suggest_queries(evaluated, candidates, 2)) == 2
    with pytest.raises(ValueError, match="only 2 of the 5 candidates"):
        estimator.suggest_queries(evaluated, candidates, 3)


def test_unknown_candidate_is_named(data, estimator):
    with pytest.raises(ValueError, match="q-nobody-knows"):
        estimator.suggest_queries({}, [*data.query_ids[:5], "q-nobody-knows"], 2)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda e, q: e.suggest_queries({}, [*q[:3], q[0]], 1), "appears twice"),
        (lambda e, q: e.suggest_queries({}, [], 1), "candidates is empty"),
        (lambda e, q: e.suggest_queries({}, q, 0), "positive integer"),
        (lambda e, q: e.suggest_queries({}, q, 1, strategy="best"), "'variance'"),
        (lambda e, q: e.suggest_queries({q[0]: 1.5}, q, 1), "1.5"),
        (lambda e, q: e.suggest_queries([q[0]], q, 1), "mapping"),
        (lambda e, q: e.estimate_scores({q[0]: 1.0}, q), "wrap a single"),
        (lambda e, q: e.estimate_scores([{}], q, [None] * len(q)), "no query a group"),
        (lambda e, q: e.estimate_scores([{}], q, ["a"]), "query_groups"),
        (lambda e, q: e.estimate_scores([{}], q, model_names=["a", "b"]), "2 names"),
    ],
)
def test_bad_input_is_a_clear_error(data, estimator, call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call(estimator, list(data.query_ids))


def test_fit_needs_two_references(embedder, data):
    with pytest.raises(ValueError, match="at least 2"):
        ScoreEstimator(embedder).fit(data.evaluation_sets[:1])


def test_unfitted_embedder_is_refused(data):
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        ScoreEstimator(LocusEmbedder()).fit(data.evaluation_sets[:5])


# -- the numerical core ---------------------------------------------------------


def test_fit_reports_as_its_embedder_does(data, embedder, capsys, monkeypatch):
    import copy

    from sklocus import _progress

    monkeypatch.setattr(_progress, "on_terminal", lambda: True)
    monkeypatch.setattr(_progress, "_STATUS_DELAY", 0.0)
    references = data.evaluation_sets[:N_REFERENCE]
    ScoreEstimator(embedder, random_state=0).fit(references)
    assert capsys.readouterr().err == ""  # verbose=0: quiet
    loud = copy.copy(embedder).set_params(verbose=1)
    ScoreEstimator(loud, random_state=0).fit(references)
    err = capsys.readouterr().err
    assert f"\rCalibrating the estimates on {N_REFERENCE} reference models..." in err


def test_posterior_weights_follow_the_likelihood():
    predictions = np.array([[0.9, 0.9], [0.1, 0.1], [0.5, 0.5]])
    w = posterior_weights(predictions, np.array([1.0, 1.0]), temperature=1.0)
    assert w.sum() == pytest.approx(1) and np.argmax(w) == 0 and np.argmin(w) == 1
    flat = posterior_weights(predictions[:, :0], np.array([]), temperature=1.0)
    np.testing.assert_allclose(flat, 1 / 3)


def test_greedy_variance_reduction_skips_what_it_already_knows():
    """A near-certain query and its twin: once one is chosen, the other tells
    nothing new, and the second pick is a query about another skill."""
    rng = np.random.default_rng(0)
    skill_a, skill_b = rng.normal(size=(2, 400))
    a = 1 / (1 + np.exp(-20 * skill_a))  # outcomes all but certain given the model
    b = 1 / (1 + np.exp(-20 * skill_b))
    predictions = np.column_stack([a, a, b])
    target = (1.2 * a + b)[:, None]
    w = np.full(400, 1 / 400)
    first, second = greedy_variance_reduction(w, predictions, target, 2)
    assert first == 0 and second == 2


def test_collect_evaluations_runs_the_onboarding_loop(data, estimator):
    model = data.evaluation_sets[N_REFERENCE + 3]
    calls = []

    def evaluate(queries):
        calls.append(list(queries))
        return [model[q] for q in queries]

    given = {data.query_ids[0]: model[data.query_ids[0]]}
    collected = estimator.collect_evaluations(
        evaluate, data.query_ids, 20, batch_size=8, evaluations=given
    )
    assert [len(batch) for batch in calls] == [8, 8, 4]
    assert len(collected) == 21 and given == {
        data.query_ids[0]: model[data.query_ids[0]]
    }
    assert all(collected[q] == model[q] for q in collected)
    assert data.query_ids[0] not in {q for batch in calls for q in batch}


def test_collect_evaluations_refuses_before_evaluating_anything(data, estimator):
    def evaluate(queries):
        raise AssertionError("evaluated although the candidates run out")

    with pytest.raises(ValueError, match="only 5 of the 5 candidates"):
        estimator.collect_evaluations(evaluate, data.query_ids[:5], 6, batch_size=2)


def test_a_bad_score_names_its_set(data, estimator):
    sets = [{}, {data.query_ids[0]: 1.0}, {data.query_ids[1]: 2.0}]
    with pytest.raises(ValueError, match=r"X\[2\] has score 2.0"):
        estimator.estimate_scores(sets, data.query_ids)


def test_collect_evaluations_checks_what_evaluate_returns(data, estimator):
    with pytest.raises(ValueError, match="returned 1 scores for 4 queries"):
        estimator.collect_evaluations(lambda q: [1.0], data.query_ids, 4, batch_size=4)
    with pytest.raises(ValueError, match="1.5"):
        estimator.collect_evaluations(
            lambda q: [1.5] * len(q), data.query_ids, 4, batch_size=4
        )
