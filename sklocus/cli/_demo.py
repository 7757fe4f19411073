"""``sklocus demo``: the main job on built-in synthetic data."""

from __future__ import annotations

import sys
import time

import numpy as np

from sklocus import LocusEmbedder
from sklocus.cli._models import training_summary
from sklocus.cli._parsers import QUICK
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix
from sklocus.geometry import nearest_models
from sklocus.metrics import correctness_accuracy, routing_accuracy


def run_demo(arguments):
    """Run the demo as the options say."""
    settings = dict(QUICK) if arguments.quick else {}
    if arguments.max_epochs is not None:
        settings["max_epochs"] = arguments.max_epochs
    demo(random_state=arguments.random_state, **settings)
    return 0


def _split_sets(evaluation_sets, train_queries):
    """Split each set into its train-query part and its test-query part."""
    train, test = [], []
    for evaluations in evaluation_sets:
        train.append({q: s for q, s in evaluations.items() if q in train_queries})
        test.append({q: s for q, s in evaluations.items() if q not in train_queries})
    return train, test


def _relation(data, i, j):
    """Ground truth about models ``i`` and ``j``, for the report."""
    if data.duplicate_of[i] == j or data.duplicate_of[j] == i:
        return " [copy]"
    if data.families[i] == data.families[j]:
        return " [same family]"
    return ""


def demo(
    n_models=240,
    n_new=40,
    n_queries=1500,
    max_epochs=4,
    epoch_size=4096,
    random_state=0,
    out=sys.stdout,
):
    """Train on synthetic models, onboard new ones, and report how well it works.

    Parameters
    ----------
    n_models : int, default=240
        Models generated, the new ones included.
    n_new : int, default=40
        Models held out of training and onboarded with one forward pass.
    n_queries : int, default=1500
        Queries generated; a fifth are test queries never used to embed.
    max_epochs : int, default=4
        Training epochs; early stopping may end sooner.
    epoch_size : int, default=4096
        Model draws per epoch (the embedder's default).
    random_state : int, default=0
        Seeds the data and the training.
    out : file, default=sys.stdout
        Where the report goes.
    """

    def say(*lines):
        for line in lines:
            print(line, file=out, flush=True)

    data = make_evaluations(
        n_models=n_models,
        n_queries=n_queries,
        evals_per_model=(128, 768),
        random_state=random_state,
    )
    rng = np.random.default_rng(random_state)
    query_ids = np.array(data.query_ids)
    is_test = np.zeros(n_queries, dtype=bool)
    is_test[rng.choice(n_queries, size=n_queries // 5, replace=False)] = True
    train_queries = set(query_ids[~is_test])
    test_queries = list(query_ids[is_test])
    train_sets, test_sets = _split_sets(data.evaluation_sets, train_queries)
    new = np.arange(n_models - n_new, n_models)

    say(
        f"sklocus demo: {n_models} synthetic models ({n_models - n_new} to train on, "
        f"{n_new} new), {n_queries} queries ({len(test_queries)} test queries never "
        "used to build embeddings).",
        "Training the LOCUS set encoder and predictor...",
    )
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        max_epochs=max_epochs,
        epoch_size=epoch_size,
        random_state=random_state,
        verbose=1,
    )
    start = time.perf_counter()
    embedder.fit(train_sets[: n_models - n_new])
    trained = time.perf_counter() - start

    start = time.perf_counter()
    new_embeddings = embedder.transform([train_sets[i] for i in new])
    onboarded = time.perf_counter() - start
    probabilities = embedder.predict_correctness(new_embeddings, test_queries)
    scores, _ = to_matrix([test_sets[i] for i in new], queries=test_queries)

    train_accuracy = np.array([np.mean(list(train_sets[i].values())) for i in new])
    overall = np.repeat(train_accuracy[None, :], len(test_queries), axis=0)
    best_single = np.zeros_like(overall)
    best_single[:, np.argmax(train_accuracy)] = 1.0
    truth = data.probabilities[is_test][:, new]

    say(
        "",
        training_summary(embedder, trained, hint="--max-epochs {}"),
        f"Onboarded {n_new} new models in {1000 * onboarded:.0f} ms with no training.",
        "",
        f"{'New models, test queries':32}{'correctness':>12}{'routing':>10}",
    )
    rows = [
        ("LOCUS", probabilities),
        ("each model's own accuracy", overall),
        ("best single model", best_single),
        ("true probabilities (bound)", truth),
    ]
    for name, predicted in rows:
        correctness = correctness_accuracy(scores, predicted)
        shown = "" if predicted is best_single else f"{correctness:.3f}"
        say(f"  {name:30}{shown:>12}{routing_accuracy(scores, predicted):>10.3f}")
    n_pairs = int((~np.isnan(scores)).sum())
    say(
        f"correctness: the share of the {n_pairs:,} (new model, test query) pairs "
        "where",
        "  P(correct) >= 0.5 agrees with the observed score (>= 0.5);",
        "routing: the mean observed score of the new model each test query is sent to,",
        "  the one of highest P(correct) (sklocus.metrics.routing_accuracy).",
    )
    say(
        "",
        "Nearest neighbours of a few new models (distance, 1 = a typical pair; "
        "ground truth in []):",
    )
    neighbours, distances = nearest_models(embedder.transform(train_sets), k=3)
    shown = [i for i in new if data.duplicate_of[i] >= 0][:2]
    shown += [i for i in new if i not in shown][: 4 - len(shown)]
    for i in shown:
        described = ", ".join(
            f"{data.model_names[j]} {distance:.4f}{_relation(data, i, j)}"
            for j, distance in zip(neighbours[i], distances[i])
        )
        say(f"  {data.model_names[i]}: {described}")
