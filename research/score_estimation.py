"""Estimating a model's leaderboard scores from a few of its evaluations.

Issue 36's measurement. On the Open LLM data, for each seed:

1. 224 fully observed dense models are held out, drawn as
   :mod:`research.calibration` draws its two pools (``(seed, 17)``), so that an
   embedder fitted there on the other models never saw them; the others with
   every train-split item observed and a leaderboard score are the *training
   models*;
2. each held-out model, and each training model, gets its own draw of items
   from the train split (806 items), either ``n`` items of each benchmark
   (``per benchmark``; capped at the benchmark's train items, of which mmlu,
   truthfulqa and winogrande have fewer than 100) or ``n`` items in all
   (``across``: at random, or ``stratified`` by benchmark in proportion to its
   size);
3. each method estimates the leaderboard's full-benchmark score (percent) of
   arc, gsm8k, mmlu, truthfulqa and winogrande, and their mean, and the RMSE over
   the held-out models against the leaderboard's own scores is recorded.

The items are the 1,075 that metabench chose for being informative, not whole
benchmarks: a score over them is not the leaderboard's score, so every method
ends in a linear map per benchmark to the leaderboard's scale, fitted on
training models given the same kind of draw.

Baselines (the default run, every held-out model, ``--draws`` draws):

- ``item mean``: the mean observed score of the drawn items of the benchmark (in
  ``across``, the model's overall mean where it drew none), linearly mapped;
- ``all train items`` (once per seed, no draw): a ridge regression (alpha by
  efficient leave-one-out) from all 806 train-item results to each score: what
  these items can tell at best with a linear read-out.

Model-based methods (``--models``; 112 held-out models and 112 *map models*, a
draw of the training models that fit the maps and are neither reference model
nor IRT training model; one draw per setting):

- ``LOCUS, random``: :class:`sklocus.ScoreEstimator` (its defaults, fitted on
  the embedder's training models but the map models) estimates each benchmark's
  mean over its train items from the random draw; the map reads that estimate
  and the item mean;
- ``LOCUS, chosen``: the same from items the estimator suggests (strategy
  ``"variance"``, the benchmarks as groups), the draw's total in two batches,
  the second given the first's results; per-benchmark counts are the
  estimator's choice, not ``n`` each;
- ``IRT 2PL, Fisher``: a 2PL model per benchmark (:mod:`research.irt`) fitted
  on the training models but the map models; each model's items chosen
  adaptively by Fisher information at its current abilities (``n`` per
  benchmark, or ``n`` in all); the map reads its estimated mean over the
  benchmark's train items and the chosen items' mean.

The embedder of a seed is ``LocusEmbedder`` (defaults, 4 epochs) fitted on every
model but the held-out ones (``--cache`` keeps it). The map models were among
its training models, the held-out models never.

Onboarding (``--onboarding``): the two pools of 112 held-out models are embedded
(one forward pass each) from ``n`` train-query evaluations, drawn at random or
by ``ScoreEstimator.collect_evaluations`` with each strategy (two batches of
``n / 2``, the benchmarks as groups), and measured by correctness and routing
accuracy on the test queries.

Usage::

    python -m research.score_estimation DATA_FOLDER [--seeds 0 1 2]
        [--draws 10] [--models | --onboarding] [--cache FOLDER] [--out FILE]
    python -m research.score_estimation --report FILE.jsonl ...
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.linear_model import LinearRegression, RidgeCV

from benchmarks.provenance import commit
from research import irt, openllm_data
from research.score_estimation_report import (
    BENCHMARKS,
    ONBOARDING_STRATEGIES,
    report,
)
from sklocus import ScoreEstimator
from sklocus.evaluations import subsample
from sklocus.metrics import correctness_accuracy, routing_accuracy

PER_BENCHMARK = (25, 50, 100)
ACROSS = (64, 128, 256)
POOL = openllm_data.POOL_SIZE
HELD_OUT = 2 * POOL


def split_models(data, scores, seed):
    """Held-out and training models of ``seed`` (indices into the data's models)."""
    rng = np.random.default_rng((seed, 17))
    candidates = np.flatnonzero(data.fully_observed & data.dense)
    held = np.sort(rng.permutation(candidates)[:HELD_OUT])
    known = ~np.isnan(scores).any(axis=1)
    observed = ~np.isnan(data.train_matrix).any(axis=0)
    training = np.setdiff1d(np.flatnonzero(known & observed), held)
    return held[known[held]], training


def draw_mask(matrix, benchmarks, n, rng, mode):
    """Each model's own random draw of items, as a boolean mask of ``matrix``.

    ``mode`` is ``"per benchmark"`` (``n`` items of each), ``"across"`` (``n`` in
    all, at random) or ``"stratified"`` (``n`` in all, in proportion to each
    benchmark's size).
    """
    n_models, n_items = matrix.shape
    chosen = np.zeros((n_models, n_items), dtype=bool)
    rows = np.arange(n_models)[:, None]
    if mode == "across":
        order = np.argsort(rng.random((n_models, n_items)), axis=1)
        chosen[rows, order[:, :n]] = True
    else:
        for b in BENCHMARKS:
            items = np.flatnonzero(benchmarks == b)
            k = n if mode == "per benchmark" else round(n * len(items) / n_items)
            k = min(k, len(items))
            order = np.argsort(rng.random((n_models, len(items))), axis=1)
            chosen[rows, items[order[:, :k]]] = True
    return chosen


def masked_means(matrix, benchmarks, chosen):
    """Each model's mean score per benchmark over its chosen items.

    Where it has none of a benchmark, its mean over all its chosen items.
    Returns ``(n_models, len(BENCHMARKS))``.
    """
    drawn = np.where(chosen, matrix, 0.0)
    overall = drawn.sum(axis=1) / chosen.sum(axis=1)
    means = np.empty((len(matrix), len(BENCHMARKS)))
    for k, b in enumerate(BENCHMARKS):
        columns = benchmarks == b
        count = chosen[:, columns].sum(axis=1)
        total = drawn[:, columns].sum(axis=1)
        means[:, k] = np.where(count > 0, total / np.maximum(count, 1), overall)
    return means


def draw_means(matrix, benchmarks, n, rng, mode):
    """Each model's mean score per benchmark over its own random draw of items."""
    return masked_means(matrix, benchmarks, draw_mask(matrix, benchmarks, n, rng, mode))


def rmse(estimates, truth):
    """RMSE per benchmark and of the five-benchmark mean, in points."""
    errors = np.c_[estimates - truth, (estimates - truth).mean(axis=1)]
    return np.sqrt(np.mean(errors**2, axis=0))


def item_mean(data, scores, held, training, n, mode, rng):
    """RMSE of the linearly mapped item means, for one draw."""
    matrix, benchmarks = data.train_matrix.T, data.train_benchmarks  # a row per model
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
    ridge.fit(data.train_matrix[:, training].T, scores[training])
    return rmse(ridge.predict(data.train_matrix[:, held].T), scores[held])


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


# -- model-based estimates: LOCUS's ScoreEstimator and a 2PL IRT baseline ------

# Training models that fit the linear maps of the model-based estimates to the
# leaderboard's scale (and are no reference model), and held-out models measured.
MAP_MODELS = 112
# Where the chosen queries are measured (each model's choice is its own).
CHOSEN = (("per benchmark", 25), ("per benchmark", 50), ("per benchmark", 100))
CHOSEN += (("across", 128),)


def budget(benchmarks, n, mode):
    """How many items a draw of ``mode`` gives each model."""
    if mode == "across":
        return n
    sizes = [int((benchmarks == b).sum()) for b in BENCHMARKS]
    if mode == "per benchmark":
        return sum(min(n, size) for size in sizes)
    return sum(min(round(n * size / len(benchmarks)), size) for size in sizes)


def mapped_rmse(truths, *features):
    """RMSE of a linear map per benchmark from ``features`` to the leaderboard.

    ``truths`` and each feature are pairs ``(map models, held-out models)`` of
    ``(n_models, 5)`` arrays; benchmark ``k``'s map reads column ``k`` of each
    feature, fitted on the map models.
    """
    estimates = np.empty_like(truths[1])
    for k in range(len(BENCHMARKS)):
        fit, test = (np.column_stack([f[s][:, k] for f in features]) for s in (0, 1))
        line = LinearRegression().fit(fit, truths[0][:, k])
        estimates[:, k] = line.predict(test)
    return rmse(estimates, truths[1]).tolist()


def locus_figures(estimator, groups, masks, truths, ids, benchmarks):
    """RMSE of ScoreEstimator's mapped estimates, and its intervals' coverage."""
    means = [masked_means(m, benchmarks, c) for m, c in zip(groups, masks)]
    found = [
        locus_estimates(estimator, m, ids, benchmarks, c) for m, c in zip(groups, masks)
    ]
    return {
        "rmse": mapped_rmse(truths, [f[0] for f in found], means),
        "coverage": float(found[1][1].mean()),
    }


def locus_estimates(estimator, matrix, ids, benchmarks, chosen):
    """ScoreEstimator's estimates per benchmark of the train items, and whether
    each interval holds the model's mean over them."""
    sets = [
        {ids[k]: float(row[k]) for k in np.flatnonzero(mask)}
        for row, mask in zip(matrix, chosen)
    ]
    table = estimator.estimate_scores(sets, ids, benchmarks)
    wide = table.pivot(index="model", columns="group")
    estimates = wide["estimate"][list(BENCHMARKS)].to_numpy()
    lower = wide["lower"][list(BENCHMARKS)].to_numpy()
    upper = wide["upper"][list(BENCHMARKS)].to_numpy()
    truth = np.column_stack(
        [matrix[:, benchmarks == b].mean(axis=1) for b in BENCHMARKS]
    )
    return estimates, (lower <= truth + 1e-12) & (truth <= upper + 1e-12)


def chosen_mask(estimator, matrix, ids, benchmarks, total):
    """Each model's ``total`` items as ScoreEstimator suggests them, in two
    batches: half before any result (the same for every model), then half
    given those results."""
    position = {query: k for k, query in enumerate(ids)}
    first = estimator.suggest_queries({}, ids, total // 2, query_groups=benchmarks)
    first = [position[q] for q in first]
    chosen = np.zeros(matrix.shape, dtype=bool)
    for i, row in enumerate(matrix):
        shown = {ids[k]: float(row[k]) for k in first}
        rest = estimator.suggest_queries(
            shown, ids, total - total // 2, query_groups=benchmarks
        )
        chosen[i, first] = True
        chosen[i, [position[q] for q in rest]] = True
    return chosen


def measure_models(data, scores, seed, embedder, references):
    """Rows of the model-based methods for ``seed``."""
    held, training = split_models(data, scores, seed)
    rng = np.random.default_rng((seed, 36))
    map_models = np.sort(rng.choice(training, MAP_MODELS, replace=False))
    held = np.sort(rng.choice(held, min(MAP_MODELS, len(held)), replace=False))
    references = np.setdiff1d(references, map_models)
    matrix, benchmarks = data.train_matrix.T, data.train_benchmarks  # a row per model
    ids = data.train_ids
    start = time.perf_counter()
    estimator = ScoreEstimator(embedder, random_state=seed).fit(data.sets(references))
    base = {
        "seed": seed,
        "held_out": len(held),
        "map_models": len(map_models),
        "references": len(estimator.reference_indices_),
        "fit_seconds": round(time.perf_counter() - start, 1),
        "calibration_coverage": estimator.coverage_,
    }
    irt_training = np.setdiff1d(training, map_models)
    dims = np.array([BENCHMARKS.index(x) for x in benchmarks])
    a, b = irt.fit_2pl(matrix[irt_training], dims, seed=seed)
    groups = (matrix[map_models], matrix[held])
    truths = (scores[map_models], scores[held])
    rows = []
    settings = [("per benchmark", n) for n in PER_BENCHMARK]
    settings += [(mode, n) for mode in ("across", "stratified") for n in ACROSS]
    for mode, n in settings:
        total = budget(benchmarks, n, mode)
        row = {**base, "mode": mode, "n": n, "items": total}
        draw = np.random.default_rng((seed, n, 36))
        masks = [draw_mask(m, benchmarks, n, draw, mode) for m in groups]
        means = [masked_means(m, benchmarks, c) for m, c in zip(groups, masks)]
        rows.append({**row, "method": "item mean", "rmse": mapped_rmse(truths, means)})
        figures = locus_figures(estimator, groups, masks, truths, ids, benchmarks)
        rows.append({**row, "method": "LOCUS, random", **figures})
        if mode != "stratified":
            quotas = {}
            if mode == "per benchmark":
                quotas = dict.fromkeys(range(len(BENCHMARKS)), n)
            irt_masks = [irt.fisher_items(a, b, dims, m, quotas, total) for m in groups]
            irt_means = [
                masked_means(m, benchmarks, c) for m, c in zip(groups, irt_masks)
            ]
            irt_est = [
                irt.estimated_means(a, b, dims, m, c) for m, c in zip(groups, irt_masks)
            ]
            error = mapped_rmse(truths, irt_est, irt_means)
            rows.append({**row, "method": "IRT 2PL, Fisher", "rmse": error})
        if (mode, n) in CHOSEN:
            start = time.perf_counter()
            chosen = [chosen_mask(estimator, m, ids, benchmarks, total) for m in groups]
            seconds = round((time.perf_counter() - start) / sum(map(len, groups)), 2)
            figures = locus_figures(estimator, groups, chosen, truths, ids, benchmarks)
            rows.append(
                {
                    **row,
                    "method": "LOCUS, chosen",
                    **figures,
                    "seconds_per_model": seconds,
                }
            )
    return rows


# -- onboarding: embeddings from chosen against random evaluations -------------

ONBOARDING_SIZES = (16, 32, 64, 128)


def onboarding_sets(estimator, data, pool, n, strategy, seed):
    """Each pool model's ``n`` train-query evaluations, drawn by ``strategy``."""
    sets = data.sets(pool)
    if strategy == "random":
        return subsample(sets, n, random_state=seed)
    drawn = []
    for evaluations in sets:
        chosen = estimator.collect_evaluations(
            lambda queries, known=evaluations: [known[q] for q in queries],
            data.train_ids,
            n,
            batch_size=max(n // 2, 1),
            query_groups=data.train_benchmarks,
            strategy=strategy,
        )
        drawn.append(chosen)
    return drawn


def measure_onboarding(data, seed, embedder, references):
    """Correctness and routing accuracy on the test queries of the held-out
    models, embedded from ``n`` evaluations chosen by each strategy."""
    rng = np.random.default_rng((seed, 17))
    candidates = np.flatnonzero(data.fully_observed & data.dense)
    order = rng.permutation(candidates)[:HELD_OUT]
    pools = [np.sort(order[:POOL]), np.sort(order[POOL:])]
    estimator = ScoreEstimator(embedder, random_state=seed).fit(data.sets(references))
    rows = []
    for strategy in ONBOARDING_STRATEGIES:
        for n in ONBOARDING_SIZES:
            start = time.perf_counter()
            figures = {"correctness": [], "routing": []}
            for pool in pools:
                drawn = onboarding_sets(estimator, data, pool, n, strategy, seed)
                Z = embedder.transform(drawn)
                p = embedder.predict_correctness(Z, data.test_ids)
                truth = data.test_matrix[:, pool]
                figures["correctness"].append(correctness_accuracy(truth, p))
                figures["routing"].append(routing_accuracy(truth, p))
            rows.append(
                {
                    "seed": seed,
                    "method": "onboarding",
                    "strategy": strategy,
                    "n": n,
                    "pools": len(pools),
                    "correctness": float(np.mean(figures["correctness"])),
                    "routing": float(np.mean(figures["routing"])),
                    "seconds": round(time.perf_counter() - start, 1),
                }
            )
    return rows


def embedder_of(data, seed, arguments):
    """The embedder of ``seed``, fitted on every model but the held-out ones
    (4 epochs), and the models it was fitted on."""
    from research.pools import fitted_embedder

    rng = np.random.default_rng((seed, 17))
    candidates = np.flatnonzero(data.fully_observed & data.dense)
    held = set(rng.permutation(candidates)[:HELD_OUT])
    training = np.array([i for i in range(len(data.train_sets)) if i not in held])
    embedder, _ = fitted_embedder(
        data, training, seed, None, {"max_epochs": 4}, arguments.cache, commit()
    )
    return embedder, training


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, nargs="?", help="the Open LLM data folder")
    parser.add_argument(
        "--report",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="print the markdown report of these JSON-lines files and stop",
    )
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--draws", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--models",
        action="store_true",
        help="measure the model-based estimates (LOCUS, IRT) instead of the "
        "baselines; fits or loads an embedder per seed",
    )
    parser.add_argument(
        "--onboarding",
        action="store_true",
        help="measure onboarding (correctness and routing of the held-out models "
        "embedded from chosen or random evaluations) instead",
    )
    parser.add_argument(
        "--cache", type=Path, help="a folder that keeps the fitted embedders"
    )
    arguments = parser.parse_args()
    if arguments.report:
        print(report(arguments.report))
        return
    if arguments.data is None:
        parser.error("give DATA_FOLDER (or --report)")
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
        if arguments.onboarding:
            rows = measure_onboarding(data, seed, *embedder_of(data, seed, arguments))
        elif arguments.models:
            rows = measure_models(
                data, scores, seed, *embedder_of(data, seed, arguments)
            )
        else:
            rows = measure(data, scores, seed, arguments.draws)
        for row in rows:
            row.update(stamp)
            if "rmse" in row:
                cells = " ".join(f"{value:5.2f}" for value in row["rmse"])
                setting = row["mode"]
            else:
                cells = (
                    f"correctness {row['correctness']:.3f} routing {row['routing']:.3f}"
                )
                setting = row["strategy"]
            print(
                f"seed {seed} {row['method']:16s} {setting:13s} "
                f"n={row['n']:4d}  {cells}",
                flush=True,
            )
            if arguments.out is not None:
                with arguments.out.open("a") as out:
                    out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
