"""Estimating a model's leaderboard scores from a few of its evaluations: baselines.

The first part of issue 36's measurement (LOCUS's estimates and an IRT baseline
come next). On the Open LLM data, for each seed:

1. 224 fully observed dense models are held out, drawn as
   :mod:`research.calibration` draws its two pools (``(seed, 17)``), so that an
   embedder fitted there on the other models never saw them; the others with
   every train-split item observed are the *training models*;
2. each held-out model, and each training model, gets its own random draw of
   items from the train split (806 items), either ``n`` items of each benchmark
   (``per benchmark``; capped at the benchmark's train items, of which mmlu,
   truthfulqa and winogrande have fewer than 100) or ``n`` items in all
   (``across``: at random, or stratified by benchmark in proportion to its
   size);
3. each method estimates the leaderboard's full-benchmark score (percent) of
   arc, gsm8k, mmlu, truthfulqa and winogrande, and their mean, and the RMSE over
   the held-out models against the leaderboard's own scores is recorded.

Methods:

- ``item mean``: the mean observed score of the drawn items of the benchmark (in
  ``across``, the model's overall mean where it drew none), mapped to the
  leaderboard's scale by a linear regression fitted on the training models'
  draws of the same size;
- ``all train items`` (once per seed, no draw): a ridge regression (alpha by
  efficient leave-one-out) from all 806 train-item results to each score,
  fitted on the training models: what these items can tell at best with a
  linear read-out.

The items are the 1,075 that metabench chose for being informative, not whole
benchmarks: a score over them is not the leaderboard's score, hence the maps.

Usage::

    python -m research.score_estimation DATA_FOLDER [--seeds 0 1 2]
        [--draws 10] [--out FILE.jsonl]
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.linear_model import LinearRegression, RidgeCV

from benchmarks.provenance import commit
from research import openllm_data

BENCHMARKS = ("arc", "gsm8k", "mmlu", "truthfulqa", "winogrande")
PER_BENCHMARK = (25, 50, 100)
ACROSS = (64, 128, 256)
HELD_OUT = 2 * openllm_data.POOL_SIZE


def split_models(data, scores, seed):
    """Held-out and training models of ``seed`` (indices into the data's models)."""
    rng = np.random.default_rng((seed, 17))
    candidates = np.flatnonzero(data.fully_observed & data.dense)
    held = np.sort(rng.permutation(candidates)[:HELD_OUT])
    known = ~np.isnan(scores).any(axis=1)
    observed = ~np.isnan(data.train_matrix).any(axis=1)
    training = np.setdiff1d(np.flatnonzero(known & observed), held)
    return held[known[held]], training


def draw_means(matrix, benchmarks, n, rng, mode):
    """Each model's mean score per benchmark over its own random draw of items.

    ``mode`` is ``"per benchmark"`` (``n`` items of each), ``"across"`` (``n`` in
    all, at random) or ``"stratified"`` (``n`` in all, in proportion to each
    benchmark's size). Returns ``(n_models, len(BENCHMARKS))``.
    """
    n_models, n_items = matrix.shape
    columns = {b: np.flatnonzero(benchmarks == b) for b in BENCHMARKS}
    chosen = np.zeros((n_models, n_items), dtype=bool)
    rows = np.arange(n_models)[:, None]
    if mode == "across":
        order = np.argsort(rng.random((n_models, n_items)), axis=1)
        chosen[rows, order[:, :n]] = True
    else:
        for items in columns.values():
            k = n if mode == "per benchmark" else round(n * len(items) / n_items)
            k = min(k, len(items))
            order = np.argsort(rng.random((n_models, len(items))), axis=1)
            chosen[rows, items[order[:, :k]]] = True
    drawn = np.where(chosen, matrix, 0.0)
    overall = drawn.sum(axis=1) / chosen.sum(axis=1)
    means = np.empty((n_models, len(BENCHMARKS)))
    for k, b in enumerate(BENCHMARKS):
        count = chosen[:, columns[b]].sum(axis=1)
        total = drawn[:, columns[b]].sum(axis=1)
        means[:, k] = np.where(count > 0, total / np.maximum(count, 1), overall)
    return means


def rmse(estimates, truth):
    """RMSE per benchmark and of the five-benchmark mean, in points."""
    errors = np.c_[estimates - truth, (estimates - truth).mean(axis=1)]
    return np.sqrt(np.mean(errors**2, axis=0))


def item_mean(data, scores, held, training, n, mode, rng):
    """RMSE of the linearly mapped item means, for one draw."""
    matrix, benchmarks = data.train_matrix, data.train_benchmarks
    fit_means = draw_means(matrix[training], benchmarks, n, rng, mode)
    test_means = draw_means(matrix[held], benchmarks, n, rng, mode)
    estimates = np.empty((len(held), len(BENCHMARKS)))
    for k in range(len(BENCHMARKS)):
        line = LinearRegression().fit(fit_means[:, [k]], scores[training, k])
        estimates[:, k] = line.predict(test_means[:, [k]])
    return rmse(estimates, scores[held])


def all_items(data, scores, held, training):
    """RMSE of ridge read-outs of every train item, the linear ceiling."""
    ridge = RidgeCV(alphas=np.logspace(-2, 3, 11))
    ridge.fit(data.train_matrix[training], scores[training])
    return rmse(ridge.predict(data.train_matrix[held]), scores[held])


def measure(data, scores, seed, draws):
    held, training = split_models(data, scores, seed)
    rows = []
    base = {"seed": seed, "held_out": len(held), "training": len(training)}
    figures = all_items(data, scores, held, training)
    rows.append(
        {
            **base,
            "method": "all train items",
            "mode": "all",
            "n": 806,
            "rmse": figures.tolist(),
        }
    )
    settings = [("per benchmark", n) for n in PER_BENCHMARK]
    settings += [(mode, n) for mode in ("across", "stratified") for n in ACROSS]
    for mode, n in settings:
        found = [
            item_mean(
                data,
                scores,
                held,
                training,
                n,
                mode,
                np.random.default_rng((seed, n, draw)),
            )
            for draw in range(draws)
        ]
        rows.append(
            {
                **base,
                "method": "item mean",
                "mode": mode,
                "n": n,
                "rmse": np.mean(found, axis=0).tolist(),
                "draw_sd": np.std(found, axis=0).tolist(),
            }
        )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, help="the Open LLM data folder")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--out", type=Path)
    arguments = parser.parse_args()
    data = openllm_data.OpenLLM(arguments.data, "all-MiniLM-L6-v2")
    board = pd.read_parquet(arguments.data / "leaderboard.parquet")
    scores = board.set_index("model").reindex(data.names)[list(BENCHMARKS)]
    scores = scores.to_numpy(dtype=np.float64)
    stamp = {
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "machine": platform.machine(),
    }
    for seed in arguments.seeds:
        for row in measure(data, scores, seed, arguments.draws):
            row.update(stamp)
            cells = " ".join(f"{value:5.2f}" for value in row["rmse"])
            print(
                f"seed {seed} {row['method']:16s} {row['mode']:13s} "
                f"n={row['n']:4d}  {cells}",
                flush=True,
            )
            if arguments.out is not None:
                with arguments.out.open("a") as out:
                    out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
