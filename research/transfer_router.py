"""The default router on a benchmark its embedder never saw, calibrated or not.

    python -m research.transfer_router DATA_FOLDER [--folds mmlu gsm8k ...]
        [--settings transfer in-domain] [--pools 0 1 2] [--sizes 32 64 128 256]
        [--draws 2] [--set name=value ...] [--cache DIR] [--out FILE.jsonl]
    python -m research.transfer_router --report FILE.jsonl

The folds, pools and public-pool embedders are those of ``research/transfer.py``
(same ``--set``, same ``--cache`` file names, so either script reuses the other's
fits): each fold leaves one of the five benchmarks out of the public pool's
training. For each pool model, ``n`` evaluations are drawn (``draw_states``), and
``LocusRouter(FrozenEstimator(embedder))`` is fitted on them with its defaults
(refined pool embeddings) once with ``calibration=None`` and once with
``calibration="pool"`` (the pool calibration of
``sklocus._router._pool_calibration``). Both predict the test-split queries,
against each model's overall accuracy on its ``n`` evaluations.

- ``transfer``: the evaluations and test queries are of the left-out benchmark;
- ``in-domain``: they are of the four benchmarks the embedder was trained on.

One JSON line per (setting, fold, pool, n, method): correctness, routing accuracy
and mean held-out log-likelihood (means over the draws), and the fitted slopes.
``--report`` prints, per setting and fold, the mean over pools of each method and
the calibrated router's paired differences.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.frozen import FrozenEstimator

from benchmarks.provenance import commit as current_commit
from research.openllm_data import OpenLLM, draw_states
from research.transfer import Folds, _key, cached_fit
from sklocus import LocusEmbedder, LocusRouter
from sklocus.cli import parse_settings
from sklocus.evaluations import subsample, to_matrix
from sklocus.metrics import (
    correctness_accuracy,
    correctness_log_likelihood,
    routing_accuracy,
)

BENCHMARKS = ("arc", "gsm8k", "mmlu", "truthfulqa", "winogrande")
METRICS = ("correctness", "routing", "log_likelihood")
ROUTERS = {"router": None, "router, calibrated": "pool"}


def queries_of(folds, benchmark, setting):
    """Test query positions (rows of ``test_matrix``), test ids and train ids of a
    fold's setting."""
    data = folds.data
    if setting == "transfer":
        positions, test_ids = folds.queries(benchmark, "test")
        return positions, test_ids, folds.queries(benchmark, "train")[1]
    positions = np.flatnonzero(data.test_benchmarks != benchmark)
    train_ids = [
        q for q, b in zip(data.train_ids, data.train_benchmarks) if b != benchmark
    ]
    return positions, [data.test_ids[c] for c in positions], train_ids


def measure(folds, embedder, benchmark, setting, pool_seed, n, draws):
    """One row per method: each metric's mean over the draws, and the slopes."""
    data = folds.data
    positions, test_ids, _ = queries_of(folds, benchmark, setting)
    pool = folds.pools[pool_seed]
    truth = data.test_matrix[np.ix_(positions, pool)]  # (test queries, models)
    sets = folds.sets(pool, benchmark, setting == "transfer")
    found, slopes = {}, []
    for state in draw_states(pool_seed, draws):
        drawn = subsample(sets, n, random_state=state)
        observed, queries = to_matrix(drawn)
        Y = pd.DataFrame(observed, columns=[f"m{i}" for i in range(len(drawn))])
        predictions = {
            "overall accuracy": np.repeat(
                np.nanmean(observed, axis=0)[None, :], len(test_ids), axis=0
            )
        }
        for label, calibration in ROUTERS.items():
            router = LocusRouter(FrozenEstimator(embedder), calibration=calibration)
            router.fit(queries, Y)
            predictions[label] = router.predict_correctness(test_ids)
            if calibration:
                slopes.append(router.calibration_slope_)
        for label, p in predictions.items():
            found.setdefault(label, []).append(
                [
                    correctness_accuracy(truth, p),
                    routing_accuracy(truth, p),
                    correctness_log_likelihood(truth, p),
                ]
            )
    return [
        dict(zip(METRICS, np.mean(values, axis=0).tolist()), method=label)
        for label, values in found.items()
    ], slopes


def run(arguments):
    overrides = parse_settings(arguments.set)
    data = OpenLLM(arguments.data, "all-mpnet-base-v2")
    folds = Folds(data, arguments.pools)
    commit = current_commit()
    for benchmark in arguments.folds:
        public = [s for s in folds.sets(folds.public, benchmark, False) if s]
        embedder, _ = cached_fit(
            arguments.cache,
            f"public_{benchmark}{_key(overrides)}",
            lambda public=public: LocusEmbedder(
                query_encoder=data.encoder, random_state=0, **overrides
            ).fit(public),
        )
        for setting in arguments.settings:
            train_ids = queries_of(folds, benchmark, setting)[2]
            sizes = sorted({min(n, len(train_ids)) for n in arguments.sizes})
            for pool_seed in arguments.pools:
                for n in sizes:
                    rows, slopes = measure(
                        folds,
                        embedder,
                        benchmark,
                        setting,
                        pool_seed,
                        n,
                        arguments.draws,
                    )
                    with Path(arguments.out).open("a") as out:
                        for row in rows:
                            row.update(
                                setting=setting,
                                fold=benchmark,
                                pool=pool_seed,
                                n=n,
                                slopes=slopes,
                                draws=arguments.draws,
                                set=arguments.set,
                                commit=commit,
                            )
                            out.write(json.dumps(row) + "\n")
                    print(benchmark, setting, pool_seed, n, flush=True)


def report(path):
    """Print each setting's and fold's table: mean over pools, paired differences."""
    frame = pd.DataFrame([json.loads(line) for line in open(path) if line.strip()])
    for (setting, fold), part in frame.groupby(["setting", "fold"], sort=False):
        print(f"\n{setting}, {fold} (pools {sorted(part['pool'].unique().tolist())})\n")
        print("| method | n | " + " | ".join(METRICS) + " |")
        print("|---|---|" + "---|" * len(METRICS))
        for (method, n), cell in part.groupby(["method", "n"], sort=False):
            values = " | ".join(
                f"{cell[m].mean():.3f} ± {cell[m].std(ddof=1):.3f}" for m in METRICS
            )
            print(f"| {method} | {n} | {values} |")
        wide = part.pivot_table(index=["pool", "n"], columns="method", values=METRICS)
        for other in ("router", "overall accuracy"):
            for n, rows in wide.groupby(level="n"):
                gaps = [
                    rows[(m, "router, calibrated")] - rows[(m, other)] for m in METRICS
                ]
                text = ", ".join(
                    f"{m} {gap.mean():+.3f} ± {gap.std(ddof=1):.3f}"
                    for m, gap in zip(METRICS, gaps)
                )
                print(f"calibrated minus {other}, n = {n}: {text}")
        slopes = part.loc[part["method"] == "router, calibrated", "slopes"].sum()
        print(
            f"slopes: median {np.median(slopes):.2f}, range {min(slopes):.2f}-"
            f"{max(slopes):.2f}"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", help="folder of the Open LLM data")
    parser.add_argument("--folds", nargs="+", default=list(BENCHMARKS))
    parser.add_argument(
        "--settings", nargs="+", default=["transfer"], choices=["transfer", "in-domain"]
    )
    parser.add_argument("--pools", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--draws", type=int, default=2)
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE")
    parser.add_argument("--cache", default="transfer-cache")
    parser.add_argument("--out", default="transfer-router.jsonl")
    parser.add_argument("--report", metavar="JSONL")
    arguments = parser.parse_args()
    if arguments.report:
        report(arguments.report)
    elif arguments.data:
        run(arguments)
    else:
        sys.exit("give the data folder, or --report FILE")


if __name__ == "__main__":
    main()
