"""LOCUS against simple baselines on the Open LLM Leaderboard data (onboarding).

A first cut of the issue-6 benchmark: the onboarding setting only, three of the
baselines, one pool. The encoder is trained on the train-query evaluations of every
model outside a pool of 112 fully observed dense models; the pool's models are then
embedded by one forward pass from ``n`` of their train-query evaluations, and every
method predicts their scores on the 269 test queries, which no embedding sees.

Usage::

    python benchmarks/openllm.py ../shared/data/openllm [--max-epochs 10]
        [--n 64 128 256] [--seed 0] [--out docs/results.md]
"""

from __future__ import annotations

import argparse
import ast
import time
from pathlib import Path

import numpy as np

from sklocus import LocusEmbedder
from sklocus.datasets import load_evaluations
from sklocus.evaluations import subsample, to_matrix
from sklocus.metrics import correctness_accuracy, routing_accuracy

POOL_SIZE = 112


def split_data(data, seed):
    """Pool of fully observed dense models, the other models, train/test queries."""
    queries = data.queries
    train_ids = set(queries.loc[queries["split"] == "train", "query_id"])
    test_ids = list(queries.loc[queries["split"] == "test", "query_id"])
    sizes = np.array([len(s) for s in data.evaluation_sets])
    dense = ~data.models["moe"].fillna(False).to_numpy(dtype=bool)
    candidates = np.flatnonzero((sizes == len(queries)) & dense)
    pool = np.sort(
        np.random.default_rng(seed).choice(candidates, POOL_SIZE, replace=False)
    )
    others = np.setdiff1d(np.arange(len(sizes)), pool)

    def train_part(i):
        return {q: s for q, s in data.evaluation_sets[i].items() if q in train_ids}

    training_sets = [train_part(i) for i in others]
    training_sets = [s for s in training_sets if s]
    pool_train = [train_part(i) for i in pool]
    pool_test, _ = to_matrix([data.evaluation_sets[i] for i in pool], queries=test_ids)
    return training_sets, pool_train, pool_test, test_ids


def overall_accuracy(sets, n_test):
    accuracy = np.array([np.mean(list(s.values())) for s in sets])
    return np.repeat(accuracy[:, None], n_test, axis=1)


def per_subject_accuracy(sets, test_ids, subject_of):
    out = np.empty((len(sets), len(test_ids)))
    for i, evaluations in enumerate(sets):
        overall = np.mean(list(evaluations.values()))
        by_subject = {}
        for query, score in evaluations.items():
            by_subject.setdefault(subject_of[query], []).append(score)
        for j, query in enumerate(test_ids):
            scores = by_subject.get(subject_of[query])
            out[i, j] = np.mean(scores) if scores else overall
    return out


def nearest_queries(sets, test_ids, encoder, k=10):
    test_vectors = encoder.transform(test_ids)
    out = np.empty((len(sets), len(test_ids)))
    for i, evaluations in enumerate(sets):
        queries = list(evaluations)
        similarity = test_vectors @ encoder.transform(queries).T
        nearest = np.argsort(-similarity, axis=1)[:, :k]
        scores = np.array([evaluations[q] for q in queries])
        out[i] = scores[nearest].mean(axis=1)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="folder of the Open LLM data")
    parser.add_argument("--encoder", default="all-MiniLM-L6-v2")
    parser.add_argument("--n", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs/results.md")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="LocusEmbedder parameters to change, e.g. --set n_layers=0 lr=1e-3",
    )
    arguments = parser.parse_args()
    overrides = {
        name: ast.literal_eval(value)
        for name, value in (item.split("=", 1) for item in arguments.set)
    }

    data = load_evaluations(arguments.data, encoder=arguments.encoder)
    training_sets, pool_train, pool_test, test_ids = split_data(data, arguments.seed)
    subject_of = dict(zip(data.queries["query_id"], data.queries["subject"]))

    start = time.perf_counter()
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        max_epochs=arguments.max_epochs,
        random_state=arguments.seed,
        verbose=1,
        **overrides,
    ).fit(training_sets)
    fit_seconds = time.perf_counter() - start

    rows = []
    for n in arguments.n:
        drawn = subsample(pool_train, n, random_state=arguments.seed)
        predictions = {
            "LOCUS (onboarded, one forward pass)": embedder.predict_correctness(
                embedder.transform(drawn), test_ids
            ),
            "each model's overall accuracy": overall_accuracy(drawn, len(test_ids)),
            "per-subject accuracy (uses labels)": per_subject_accuracy(
                drawn, test_ids, subject_of
            ),
            "k-nearest queries (k = 10)": nearest_queries(
                drawn, test_ids, data.encoder
            ),
        }
        for method, probabilities in predictions.items():
            rows.append(
                (
                    method,
                    n,
                    correctness_accuracy(pool_test, probabilities),
                    routing_accuracy(pool_test, probabilities),
                )
            )
            print(rows[-1], flush=True)

    oracle = np.nanmax(pool_test, axis=0).mean()
    lines = [
        "# Results on the Open LLM Leaderboard data (preliminary)",
        "",
        "Written by `python benchmarks/openllm.py ../shared/data/openllm "
        f"--max-epochs {arguments.max_epochs} --seed {arguments.seed}`. Onboarding",
        f"setting, one pool of {POOL_SIZE} fully observed dense models (seed "
        f"{arguments.seed}), {arguments.encoder} encodings, 269 test queries. The",
        f"encoder was trained on {len(training_sets)} other models' train-query",
        f"evaluations for at most {arguments.max_epochs} epochs "
        f"({len(embedder.history_)} run, {fit_seconds:.0f} s on this machine),",
        f"parameters changed from the defaults: {overrides or 'none'}.",
        f"Oracle routing: {oracle:.3f}. One seed only: a routing figure has a",
        "standard error of about 2 points.",
        "",
        "| method | n | correctness | routing |",
        "|---|---|---|---|",
    ]
    lines += [f"| {m} | {n} | {c:.3f} | {r:.3f} |" for m, n, c, r in rows]
    Path(arguments.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
