"""Command line: ``python -m sklocus demo`` runs the main job on built-in data."""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from sklocus._embedder import LocusEmbedder
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix
from sklocus.geometry import nearest_models
from sklocus.metrics import correctness_accuracy, routing_accuracy


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


def demo(n_models=240, n_new=40, n_queries=1500, max_epochs=4, seed=0, out=sys.stdout):
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
        Training epochs, each of 4,096 model draws (the embedder's default
        ``epoch_size``); early stopping may end sooner.
    seed : int, default=0
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
        random_state=seed,
    )
    rng = np.random.default_rng(seed)
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
        query_encoder=data.encoder, max_epochs=max_epochs, random_state=seed, verbose=1
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
    overall = np.repeat(train_accuracy[:, None], len(test_queries), axis=1)
    best_single = np.zeros_like(overall)
    best_single[np.argmax(train_accuracy)] = 1.0
    truth = data.probabilities[new][:, is_test]

    say(
        "",
        f"Trained in {trained:.0f} s ({len(embedder.history_)} epochs); onboarded "
        f"{n_new} new models in {1000 * onboarded:.0f} ms with no training.",
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


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``--help`` shows the usage)."""

    def error(self, message):
        """Print ``prog: error: message`` and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def _integer_in(low, high):
    """Return an argparse type: an integer in [low, high] (no upper bound if None)."""
    bounds = f"from {low}" if high is None else f"from {low} to {high}"

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not an integer; expected one {bounds}"
            ) from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{value} is out of range; expected {bounds}"
            )
        return value

    return parse


def main(argv=None):
    """Run the command line."""
    parser = _Parser(prog="sklocus", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "demo", help="train, onboard and evaluate on built-in data"
    )
    run.add_argument(
        "--seed", type=_integer_in(0, 2**32 - 1), default=0, help="random seed"
    )
    run.add_argument(
        "--epochs", type=_integer_in(1, None), default=4, help="most training epochs"
    )
    arguments = parser.parse_args(argv)
    if arguments.command == "demo":
        demo(max_epochs=arguments.epochs, seed=arguments.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
