"""Correctness measures and the scorers that carry scikit-learn's names."""

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import KFold, cross_val_score, cross_validate
from tiny import TINY_NETWORK

from sklocus import KCenterSelector, LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix
from sklocus.metrics import (
    best_models,
    correctness_accuracy,
    correctness_brier_score,
    correctness_log_likelihood,
    correctness_roc_auc,
    get_scorer,
    routing_accuracy,
)

NAN = float("nan")


@pytest.fixture(scope="module")
def data():
    return make_evaluations(
        n_models=12,
        n_queries=120,
        evals_per_model=(30, 80),
        query_dim=8,
        random_state=0,
    )


def test_brier_and_roc_auc_count_observed_pairs_only():
    scores = [[1.0, 0.0, NAN], [0.0, 1.0, 1.0]]
    probabilities = [[0.8, 0.4, 0.0], [0.1, 0.7, 0.3]]
    expected = np.mean([0.2**2, 0.4**2, 0.1**2, 0.3**2, 0.7**2])
    assert correctness_brier_score(scores, probabilities) == pytest.approx(expected)
    # Correct pairs get 0.8, 0.7, 0.3; incorrect ones 0.4, 0.1: 5 of 6 orderings.
    assert correctness_roc_auc(scores, probabilities) == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match="on one side of 0.5"):
        correctness_roc_auc([[1.0, 1.0]], [[0.2, 0.3]])
    with pytest.raises(ValueError, match="no score is observed; the Brier score"):
        correctness_brier_score([[NAN]], [[0.5]])


def test_embedder_scorers_by_scikit_learn_names(data):
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK)
    names = ("neg_log_loss", "neg_brier_score", "roc_auc", "accuracy")
    cv = KFold(2, shuffle=True, random_state=0)
    results = cross_validate(
        embedder,
        data.evaluation_sets,
        cv=cv,
        scoring={name: get_scorer(name) for name in names},
    )
    default = cross_validate(embedder, data.evaluation_sets, cv=cv)["test_score"]
    # neg_log_loss is the default score: the held-out log-likelihood.
    np.testing.assert_allclose(results["test_neg_log_loss"], default, rtol=1e-6)
    assert (-1 <= results["test_neg_brier_score"]).all()
    assert (results["test_neg_brier_score"] <= 0).all()
    for name in ("roc_auc", "accuracy"):
        assert ((0 <= results[f"test_{name}"]) & (results[f"test_{name}"] <= 1)).all()


@pytest.mark.slow
def test_router_scorers_compare_predictions_with_observed_scores(data):
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    router = LocusRouter(LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK))
    router.fit(queries, Y)
    predicted = router.predict_correctness(queries)
    assert get_scorer("neg_brier_score")(router, queries, Y) == pytest.approx(
        -correctness_brier_score(Y.to_numpy(), predicted)
    )
    assert get_scorer("neg_log_loss")(router, queries, Y) == pytest.approx(
        correctness_log_likelihood(Y.to_numpy(), predicted)
    )
    assert get_scorer("accuracy")(router, queries, Y) == pytest.approx(
        correctness_accuracy(Y.to_numpy(), predicted)
    )
    with pytest.raises(ValueError, match="needs Y"):
        get_scorer("accuracy")(router, queries)


def test_scorer_misuse_is_named():
    with pytest.raises(
        ValueError,
        match="'name' parameter of get_scorer must be a str among .*'neg_log_loss'",
    ):
        get_scorer("f1")
    selector = KCenterSelector(n_selected=1).fit(np.eye(2))
    with pytest.raises(TypeError, match="scores a LocusEmbedder or a LocusRouter"):
        get_scorer("roc_auc")(selector, np.eye(2))


def test_best_models_sends_near_ties_to_the_model_listed_first():
    utilities = np.array(
        [
            [0.5, 0.2, -np.inf, 0.7],
            [0.5 + 5e-7, 0.2 + 2e-6, 0.1, 0.7 - 5e-7],
        ]
    ).T  # a row per query
    np.testing.assert_array_equal(best_models(utilities), [0, 1, 1, 0])
    # routing_accuracy routes the same way: the tie at query 0 goes to model 0.
    scores = np.array([[1.0, 0.0, NAN, 1.0], [0.0, 1.0, 1.0, 0.0]]).T
    assert routing_accuracy(scores, utilities) == 1.0
    with pytest.raises(ValueError, match=r"shape \(3,\); expected \(n_queries"):
        best_models([0.1, 0.2, 0.3])


@pytest.mark.slow
def test_the_router_predicts_what_best_models_chooses(data):
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK)
    router = LocusRouter(embedder).fit(queries, Y)
    # Two exact copies of model 0 (the copy listed last): every tie between
    # them must go to model 0, in predict and in routing_accuracy alike.
    router.add_models([data.evaluation_sets[0]], ["copy-of-0"])
    probabilities = router.predict_correctness(queries)
    chosen = router.classes_[best_models(probabilities)]
    np.testing.assert_array_equal(router.predict(queries), chosen)
    assert "copy-of-0" not in set(chosen)


def test_routing_accuracy_weighs_the_queries_it_can_score():
    scores = [[1.0, 0.0], [0.0, 0.5], [NAN, 1.0]]
    probabilities = [[0.9, 0.1], [0.8, 0.2], [0.9, 0.1]]
    # Query 2 goes to model 0, which has no score there: it is left out.
    assert routing_accuracy(scores, probabilities) == 0.5
    weighted = routing_accuracy(scores, probabilities, sample_weight=[3, 1, 100])
    assert weighted == pytest.approx(0.75)
    with pytest.raises(ValueError, match=r"sample_weight has shape \(2,\)"):
        routing_accuracy(scores, probabilities, sample_weight=[1, 2])


@pytest.mark.slow
def test_the_router_scores_by_routing_accuracy(data):
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK)
    router = LocusRouter(embedder).fit(queries, Y)
    weights = np.arange(len(queries)) % 3
    probabilities = router.predict_correctness(queries)
    assert router.score(queries, Y, sample_weight=weights) == routing_accuracy(
        scores, probabilities, sample_weight=weights
    )


@pytest.mark.slow
def test_scikit_learn_roc_auc_scores_a_router_per_model_on_a_full_table():
    # scikit-learn's "roc_auc" reads a complete 0/1 Y as multilabel targets, a
    # column per model, and the router's decision_function as their scores: the
    # ROC AUC of each model's predicted correctness, averaged over the models.
    data = make_evaluations(
        n_models=6, n_queries=80, evals_per_model=(80, 80), query_dim=8, random_state=0
    )
    scores, queries = to_matrix(data.evaluation_sets)
    assert not np.isnan(scores).any()
    Y = pd.DataFrame(scores, columns=data.model_names)
    router = LocusRouter(
        LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK), refine_steps=0
    )
    cv = KFold(2, shuffle=True, random_state=0)
    found = cross_val_score(
        router, queries, Y, scoring="roc_auc", cv=cv, error_score="raise"
    )
    for (train, test), score in zip(cv.split(queries), found):
        fitted = clone(router).fit([queries[i] for i in train], Y.iloc[train])
        predicted = fitted.predict_correctness([queries[i] for i in test])
        per_model = [
            roc_auc_score(Y.iloc[test, j], predicted[:, j]) for j in range(Y.shape[1])
        ]
        assert score == pytest.approx(np.mean(per_model))
