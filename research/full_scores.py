"""A new model's leaderboard scores from a few evaluations, method against method.

Issue 55's measurement, on the held-out protocol of :mod:`research.score_estimation`
(its ``split_models``: 224 fully observed dense models per seed never seen by the
seed's embedder; 112 of them measured, drawn as there). Every method estimates
the leaderboard's full-benchmark score (percent) of arc, gsm8k, mmlu, truthfulqa
and winogrande, and the RMSE over the measured models against the leaderboard's
own scores is recorded per benchmark and for the mean of the five.

Budgets: ``n`` items of each benchmark (25 / 50 / 100, capped at its train
items: mmlu, truthfulqa and winogrande have fewer than 100) or ``n`` in all (64 /
128 / 256), from the 806 train-split items.

Methods (each reads the *training models*: every model outside the held-out
ones with every train item observed and every score):

- ``ridge, random items``: one fixed random draw of items (the budget), a ridge
  regression (alpha by efficient leave-one-out) from their results to each score;
- ``DISCO-like, kNN`` / ``DISCO-like, forest``: the items on which the training
  models disagree most (largest variance of their results; per benchmark at
  ``n`` each), then the 10 nearest training models by their results on them, or a
  random forest (200 trees) on those results;
- ``IRT 2PL, Fisher``: :mod:`research.irt`'s 2PL per benchmark, items chosen by
  Fisher information, its estimated train-item means mapped linearly (fitted on
  the training models' own estimates from the same kind of choice);
- ``item mean``: each benchmark's mean over the random items, mapped linearly;
- ``LOCUS read-out, random`` / ``anchors`` / ``chosen``:
  :class:`sklocus.ScoreEstimator` fitted with the training models' scores (its
  references: the embedder's training models among them, at most
  ``max_reference_models``), estimating from the ridge's random items, from its
  own anchors (``strategy="anchors"``, the same for every model), or from items
  it chooses (``"variance"``: half as anchors, half given those results); the
  budget is the total, the estimator spreads it over the benchmarks. Its 90%
  intervals' coverage of the leaderboard score is recorded.

``--stronger``: the case "Misses the Mark" (arXiv 2506.07673) found every method
failing: new models stronger than every reference. The training models are cut
to those whose leaderboard average is below its 90th percentile among them, and
the measured models are the seed's held-out models above it (the embedder, fitted
before the cut, never saw them). Each row also records each benchmark's mean
error (``bias``): whether the estimates of stronger models fall short.

Usage::

    python -m research.full_scores DATA_FOLDER [--seeds 0 1 2] [--stronger]
        [--cache FOLDER] [--out FILE]
    python -m research.full_scores --report FILE.jsonl ...
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
from sklearn.ensemble import RandomForestRegressor
from sklearn.linear_model import LinearRegression, RidgeCV

from benchmarks.provenance import commit
from research import irt, openllm_data
from research.score_estimation import (
    ACROSS,
    MAP_MODELS,
    PER_BENCHMARK,
    budget,
    embedder_of,
    masked_means,
    rmse,
    split_models,
)
from research.score_estimation_report import BENCHMARKS
from sklocus import ScoreEstimator

SETTINGS = [("per benchmark", n) for n in PER_BENCHMARK] + [
    ("across", n) for n in ACROSS
]
STRONGER_SETTINGS = [("per benchmark", n) for n in PER_BENCHMARK]
NEIGHBOURS = 10
MAX_REFERENCES = 2048


def fixed_items(benchmarks, n, mode, rng):
    """One random draw of item positions for every model."""
    if mode == "across":
        return np.sort(rng.permutation(len(benchmarks))[:n])
    out = []
    for b in BENCHMARKS:
        items = np.flatnonzero(benchmarks == b)
        out.extend(rng.permutation(items)[: min(n, len(items))])
    return np.sort(np.array(out))


def disagreement_items(matrix, benchmarks, n, mode):
    """The items whose results vary most over ``matrix``'s models."""
    variance = matrix.var(axis=0)
    if mode == "across":
        return np.sort(np.argsort(-variance, kind="stable")[:n])
    out = []
    for b in BENCHMARKS:
        items = np.flatnonzero(benchmarks == b)
        out.extend(items[np.argsort(-variance[items], kind="stable")][:n])
    return np.sort(np.array(out))


def ridge_estimates(train_x, train_y, test_x):
    ridge = RidgeCV(alphas=np.logspace(-2, 4, 13)).fit(train_x, train_y)
    return ridge.predict(test_x)


def knn_estimates(train_x, train_y, test_x, k=NEIGHBOURS):
    """Mean score of the ``k`` training models with the most results alike."""
    distance = (
        (test_x**2).sum(1)[:, None] - 2 * test_x @ train_x.T + (train_x**2).sum(1)
    )
    nearest = np.argsort(distance, axis=1, kind="stable")[:, :k]
    return train_y[nearest].mean(axis=1)


def forest_estimates(train_x, train_y, test_x, seed):
    forest = RandomForestRegressor(
        n_estimators=200, min_samples_leaf=3, n_jobs=1, random_state=seed
    )
    return forest.fit(train_x, train_y).predict(test_x)


def fit_irt(matrix, benchmarks, training, seed):
    """A 2PL per benchmark fitted on the training models but the mapping ones."""
    dims = np.array([BENCHMARKS.index(x) for x in benchmarks])
    rng = np.random.default_rng((seed, 55))
    mapping = np.sort(rng.choice(training, MAP_MODELS, replace=False))
    fitting = np.setdiff1d(training, mapping)
    a, b = irt.fit_2pl(matrix[fitting], dims, seed=seed)
    return a, b, dims, mapping


def irt_estimates(matrix, benchmarks, fitted, held, total, quotas):
    """The 2PL's estimates of the mapping and held models, items by Fisher."""
    a, b, dims, mapping = fitted
    found = []
    for models in (mapping, held):
        chosen = irt.fisher_items(a, b, dims, matrix[models], quotas, total)
        found.append(
            np.c_[
                irt.estimated_means(a, b, dims, matrix[models], chosen),
                masked_means(matrix[models], benchmarks, chosen),
            ]
        )
    return found


def mapped(train_features, train_y, test_features):
    """A linear map per benchmark from its own columns (estimate, item mean)."""
    k = len(BENCHMARKS)
    out = np.empty((len(test_features), k))
    for j in range(k):
        columns = [j, j + k] if train_features.shape[1] == 2 * k else [j]
        line = LinearRegression().fit(train_features[:, columns], train_y[:, j])
        out[:, j] = line.predict(test_features[:, columns])
    return out


def locus_table(estimator, sets, ids, benchmarks):
    """Estimates, lower and upper bounds, (n_models, 5) each."""
    table = estimator.estimate_scores(sets, ids, benchmarks)
    wide = table.pivot(index="model", columns="group")
    columns = ("estimate", "lower", "upper")
    return [wide[column][list(BENCHMARKS)].to_numpy() for column in columns]


def chosen_sets(estimator, matrix, ids, benchmarks, total, strategy):
    """Each model's evaluations on ``total`` items chosen by the estimator."""
    first = estimator.suggest_queries(
        {},
        ids,
        total if strategy == "anchors" else total // 2,
        query_groups=benchmarks,
        strategy="anchors",
    )
    position = {q: k for k, q in enumerate(ids)}
    sets = []
    for row in matrix:
        shown = {q: float(row[position[q]]) for q in first}
        if strategy != "anchors":
            rest = estimator.suggest_queries(
                shown, ids, total - len(first), query_groups=benchmarks
            )
            shown.update({q: float(row[position[q]]) for q in rest})
        sets.append(shown)
    return sets


def measure(data, scores, seed, embedder, embedder_training, stronger=False):
    held, training = split_models(data, scores, seed)
    if not stronger:
        rng = np.random.default_rng((seed, 36))
        held = np.sort(rng.choice(held, min(MAP_MODELS, len(held)), replace=False))
    else:
        average = scores.mean(axis=1)
        line = np.quantile(average[training], 0.9)
        training = training[average[training] < line]
        held = held[average[held] >= line]
    # A row per model (train queries as columns): the samples of the regressions.
    matrix, benchmarks, ids = data.train_matrix.T, data.train_benchmarks, data.train_ids
    references = np.intersect1d(embedder_training, training)
    start = time.perf_counter()
    frame = pd.DataFrame(scores[references], columns=list(BENCHMARKS))
    estimator = ScoreEstimator(
        embedder, max_reference_models=MAX_REFERENCES, random_state=seed
    ).fit(data.sets(references), frame)
    base = {
        "seed": seed,
        "case": "stronger" if stronger else "held out",
        "held_out": len(held),
        "training": len(training),
        "references": len(estimator.reference_indices_),
        "fit_seconds": round(time.perf_counter() - start, 1),
        "noise": estimator.score_noise_,
        "calibration_coverage": estimator.score_coverage_,
    }
    truth = scores[held]
    train_y = scores[training]
    two_pl = None if stronger else fit_irt(matrix, benchmarks, training, seed)
    rows = []
    for mode, n in STRONGER_SETTINGS if stronger else SETTINGS:
        total = budget(benchmarks, n, mode)
        row = {**base, "mode": mode, "n": n, "items": total}

        def record(method, estimates, bounds=None, row=row, **extra):
            out = {**row, "method": method, "rmse": rmse(estimates, truth).tolist()}
            out["bias"] = np.mean(estimates - truth, axis=0).tolist()
            if bounds is not None:
                lower, upper = bounds
                out["coverage"] = float(np.mean((lower <= truth) & (truth <= upper)))
            rows.append({**out, **extra})

        items = fixed_items(benchmarks, n, mode, np.random.default_rng((seed, n, 55)))
        train_x, test_x = matrix[np.ix_(training, items)], matrix[np.ix_(held, items)]
        record("ridge, random items", ridge_estimates(train_x, train_y, test_x))
        chosen = np.zeros(matrix.shape[1], dtype=bool)
        chosen[items] = True
        means = masked_means(matrix, benchmarks, np.broadcast_to(chosen, matrix.shape))
        record("item mean", mapped(means[training], train_y, means[held]))
        tough = disagreement_items(matrix[training], benchmarks, n, mode)
        dx, dtx = matrix[np.ix_(training, tough)], matrix[np.ix_(held, tough)]
        record("DISCO-like, kNN", knn_estimates(dx, train_y, dtx))
        record("DISCO-like, forest", forest_estimates(dx, train_y, dtx, seed))
        if not stronger:
            quotas = (
                dict.fromkeys(range(len(BENCHMARKS)), n)
                if mode == "per benchmark"
                else {}
            )
            fit_f, test_f = irt_estimates(
                matrix, benchmarks, two_pl, held, total, quotas
            )
            record("IRT 2PL, Fisher", mapped(fit_f, scores[two_pl[3]], test_f))
        random_sets = [{ids[k]: float(matrix[h, k]) for k in items} for h in held]
        estimate, lower, upper = locus_table(estimator, random_sets, ids, benchmarks)
        record("LOCUS read-out, random", estimate, (lower, upper))
        for strategy in ("anchors", "variance"):
            start = time.perf_counter()
            sets = chosen_sets(
                estimator, matrix[held], ids, benchmarks, total, strategy
            )
            seconds = (time.perf_counter() - start) / len(held)
            estimate, lower, upper = locus_table(estimator, sets, ids, benchmarks)
            name = "anchors" if strategy == "anchors" else "chosen"
            record(
                f"LOCUS read-out, {name}",
                estimate,
                (lower, upper),
                seconds_per_model=round(seconds, 3),
            )
        yield from rows  # a setting at a time, so that a long run shows progress
        rows.clear()


def example(data, scores, seed, embedder, embedder_training, total=125):
    """One held-out model's five scores from ``total`` chosen items, with the truth.

    The user guide's example: the first of the seed's measured models, its
    items chosen by ``collect_evaluations`` in batches of 25.
    """
    held, training = split_models(data, scores, seed)
    rng = np.random.default_rng((seed, 36))
    model = np.sort(rng.choice(held, min(MAP_MODELS, len(held)), replace=False))[0]
    references = np.intersect1d(embedder_training, training)
    frame = pd.DataFrame(scores[references], columns=list(BENCHMARKS))
    estimator = ScoreEstimator(
        embedder, max_reference_models=MAX_REFERENCES, random_state=seed
    ).fit(data.sets(references), frame)
    row = data.train_matrix[:, model]
    position = {q: k for k, q in enumerate(data.train_ids)}
    results = estimator.collect_evaluations(
        lambda queries: [float(row[position[q]]) for q in queries],
        data.train_ids,
        total,
        batch_size=25,
        query_groups=data.train_benchmarks,
    )
    table = estimator.estimate_scores(
        [results], data.train_ids, data.train_benchmarks, [data.names[model]]
    )
    table["leaderboard"] = scores[model, [BENCHMARKS.index(g) for g in table.group]]
    return table.drop(columns=["model", "n_queries"])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, nargs="?", help="the Open LLM data folder")
    parser.add_argument("--report", type=Path, nargs="+", metavar="FILE")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--stronger", action="store_true")
    parser.add_argument(
        "--example",
        action="store_true",
        help="print one held-out model's estimated scores next to the leaderboard",
    )
    parser.add_argument("--cache", type=Path, help="a folder keeping the embedders")
    parser.add_argument("--out", type=Path)
    arguments = parser.parse_args()
    if arguments.report:
        from research.full_scores_report import report

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
        embedder, training = embedder_of(data, seed, arguments)
        if arguments.example:
            table = example(data, scores, seed, embedder, training)
            print(table.to_string(index=False, float_format="%.2f"))
            continue
        for row in measure(data, scores, seed, embedder, training, arguments.stronger):
            row.update(stamp)
            cells = " ".join(f"{value:5.2f}" for value in row["rmse"])
            print(
                f"seed {seed} {row['method']:24s} {row['mode']:13s} n={row['n']:4d} "
                f"{cells}  avg {np.mean(row['rmse'][:5]):.2f}"
                + (f" cov {row['coverage']:.2f}" if "coverage" in row else ""),
                flush=True,
            )
            if arguments.out is not None:
                with arguments.out.open("a") as out:
                    out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
