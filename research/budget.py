"""Quality against cost: LOCUS's routers on a budget, against the field's baselines.

For each pool and seed (the pools and fits of :mod:`research.small_pools`: the 9
priced LLMRouter models on their own train/test split, and dense Open LLM pools of
K models on theirs), every method predicts P(correct) for each model on each test
question; each prediction is then routed over a sweep of cost weights
(``sklocus.metrics.cost_quality_curve``) and scored as RouterBench scores routers:

- AIQ: the mean height of the method's quality-cost frontier between the
  cheapest and the dearest model's mean cost per question;
- quality at the dearest model's cost;
- cost share: the least mean cost at which the frontier reaches the best single
  model's test quality, over that model's cost (inf where it never does);
- ECE: expected calibration error of the predictions on the test questions (10
  equal-width bins), and routing and correctness accuracy at cost weight 0;
- the threshold policy's promise: routed by ``min_probability=t`` for t in
  0.5-0.9, the largest gap, over t, between the mean predicted probability of
  the chosen models and their mean observed score on the test questions.

Costs: LLMRouter's price per million tokens of each model times each question's
length in characters (a per-question cost: long prompts cost more; output
lengths are not in the data); Open LLM: ``params_b``, per model.

Methods: every single model (their frontier is random mixing); overall accuracy;
the per-benchmark tally (each model's mean train score on the question's
benchmark, where the data name benchmarks); k-nearest queries; a logistic
regression and a small MLP per model on the query encodings (RouterBench's
baselines); MF (dim 16); LOCUS's forward pass; the default ``LocusRouter``
(refined pool embeddings and query heads), the same without query heads, with
``calibration="pool"``, with ``calibration="isotonic"``, with
``query_clusters="auto"`` (with and without heads) and, where the data
name benchmarks, with them as ``query_groups`` (given for the test questions
too, or told from their text); and the oracle
(each question's own scores), the ceiling. The fit time is the embedder's and
the default router's together, on encodings computed beforehand.

Usage::

    python -m research.budget [--llmrouter DIR] [--openllm DIR] [--sizes 10]
        [--seeds 0 1 2] [--set name=value ...] [--cache FOLDER] [--out FILE.jsonl]
    python -m research.budget --report FILE.jsonl ... [--page docs/research/budget.md]

Run with ``OMP_NUM_THREADS`` set when others share the cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.frozen import FrozenEstimator
from sklearn.neural_network import MLPClassifier

from benchmarks.provenance import commit
from research import baselines
from research.json_lines import read_rows
from research.small_pools import (
    ENCODER,
    Pool,
    fitted_embedder,
    llmrouter_pool,
    logistic_per_model,
    matrix_factorisation,
)
from sklocus import LocusRouter
from sklocus._routing import check_cost_matrix
from sklocus.cli import parse_settings
from sklocus.datasets import load_evaluations
from sklocus.metrics import (
    aiq,
    best_models,
    correctness_accuracy,
    cost_at_quality,
    cost_quality_curve,
    expected_calibration_error,
    quality_at_cost,
    routing_accuracy,
    threshold_utilities,
)

LOCUS = "LOCUS, router (defaults)"
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9)


def mlp_per_model(pool, seed):
    """P(correct) of one small MLP per model on the query encodings."""
    out = np.empty(pool.test.shape)
    for i, column in enumerate(pool.train.T):
        labels = column >= 0.5
        if labels.all() or not labels.any():
            out[:, i] = float(labels.mean())
            continue
        network = MLPClassifier(
            hidden_layer_sizes=(64,),
            alpha=1e-2,
            early_stopping=True,
            max_iter=300,
            random_state=seed,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            network.fit(pool.train_vectors, labels)
        out[:, i] = network.predict_proba(pool.test_vectors)[:, 1]
    return out


def group_tally(pool):
    """Each model's mean train score on each test question's benchmark."""
    out = np.empty(pool.test.shape)
    overall = np.nanmean(pool.train, axis=0)
    for group in np.unique(pool.test_groups):
        train = pool.train_groups == group
        tally = np.nanmean(pool.train[train], axis=0) if train.any() else overall
        out[pool.test_groups == group] = tally[None, :]
    return out


def threshold_gap(scores, probabilities, cost):
    """Largest |promised - realised| quality of the threshold policy over t."""
    cost = check_cost_matrix(cost, scores.shape)
    gaps = []
    for t in THRESHOLDS:
        chosen = best_models(threshold_utilities(probabilities, cost, t))
        rows = np.arange(len(scores))
        realised = scores[rows, chosen]
        observed = ~np.isnan(realised)
        promised = probabilities[rows, chosen][observed].mean()
        gaps.append(abs(promised - realised[observed].mean()))
    return float(max(gaps))


def priced_openllm_pools(folder, sizes, seed):
    """Dense, fully evaluated Open LLM pools of models with a known ``params_b``."""
    data = load_evaluations(folder, encoder=ENCODER)
    n_queries = len(data.queries)
    models = data.models.set_index("model").reindex(data.model_names)
    full = np.array([len(s) == n_queries for s in data.evaluation_sets])
    dense = ~models["moe"].fillna(False).to_numpy(dtype=bool)
    priced = models["params_b"].notna().to_numpy()
    candidates = np.flatnonzero(full & dense & priced)
    rng = np.random.default_rng((seed, 13))
    for size in sizes:
        chosen = np.sort(rng.choice(candidates, size, replace=False))
        yield Pool(f"openllm-{size}", data, chosen, data.encoder.transform)


def pool_costs(pool, source, folder):
    """Cost of each model on each test question, ``(n_test, n_models)``."""
    if source == "llmrouter":
        models = pd.read_parquet(Path(folder) / "models.parquet").set_index("model")
        queries = pd.read_parquet(Path(folder) / "queries.parquet").set_index(
            "query_id"
        )
        price = models.loc[pool.model_names, "input_price"].to_numpy(np.float64)
        length = queries.loc[pool.test_ids, "query"].str.len().to_numpy(np.float64)
        return price[None, :] * length[:, None] / 1e6
    return np.repeat(pool.params_b[None, :], len(pool.test_ids), axis=0)


def frontier_figures(scores, probabilities, cost, span, target, dearest):
    costs, qualities, _ = cost_quality_curve(scores, probabilities, cost)
    return {
        "aiq": aiq(costs, qualities, cost_range=span),
        "quality at dearest": float(quality_at_cost(costs, qualities, dearest)),
        "cost share": cost_at_quality(costs, qualities, target[0]) / target[1],
    }


def measure(pool, source, folder, seed, cache, overrides):
    embedder, fit_seconds = fitted_embedder(pool, seed, overrides, cache)
    forward = embedder.predict_correctness(
        embedder.transform(pool.train_sets), pool.test_ids
    )
    names = [str(i) for i in range(len(pool.train_sets))]
    frozen = FrozenEstimator(embedder)
    routers = {
        LOCUS: LocusRouter(frozen),
        "LOCUS, router without query heads": LocusRouter(frozen, query_heads=False),
        "LOCUS, router, calibration=pool": LocusRouter(frozen, calibration="pool"),
        "LOCUS, router, isotonic": LocusRouter(frozen, calibration="isotonic"),
        'LOCUS, router, query_clusters="auto"': LocusRouter(
            frozen, query_clusters="auto"
        ),
        'LOCUS, router without query heads, query_clusters="auto"': LocusRouter(
            frozen, query_heads=False, query_clusters="auto"
        ),
    }
    predictions = {
        "overall accuracy": baselines.overall_accuracy(pool.train, len(pool.test_ids)),
        "k-nearest queries (k=10)": baselines.nearest_queries(
            pool.train, pool.train_vectors, pool.test_vectors
        ),
        "logistic regression per model": logistic_per_model(pool),
        "MLP per model": mlp_per_model(pool, seed),
        "MF (dim 16)": matrix_factorisation(pool, seed),
        "LOCUS, forward pass": forward,
    }
    if pool.train_groups is not None:
        predictions["per-benchmark tally"] = group_tally(pool)
        router = LocusRouter(frozen)
        router.fit_evaluations(
            pool.train_sets,
            names,
            query_groups=dict(zip(pool.train_ids, pool.train_groups)),
        )
        predictions["LOCUS, router with benchmark groups"] = router.predict_correctness(
            pool.test_ids, pool.test_groups
        )
        predictions["LOCUS, router with benchmark groups told from the text"] = (
            router.predict_correctness(pool.test_ids)
        )
    router_seconds = {}
    for name, router in routers.items():
        start = time.perf_counter()
        router.fit_evaluations(pool.train_sets, names)
        router_seconds[name] = time.perf_counter() - start
        predictions[name] = router.predict_correctness(pool.test_ids)
    scores = pool.test
    cost = pool_costs(pool, source, folder)
    model_costs = cost.mean(axis=0)
    model_qualities = np.nanmean(scores, axis=0)
    span = (model_costs.min(), model_costs.max())
    best = int(np.argmax(model_qualities))
    target = (model_qualities[best], model_costs[best])
    dearest = model_costs.max()
    row = {
        "pool": pool.name,
        "seed": seed,
        "models": scores.shape[1],
        "fit_seconds": round(fit_seconds + router_seconds[LOCUS], 1),
        "embedder_seconds": round(fit_seconds, 1),
        "best single model": float(model_qualities[best]),
        # How far the test questions move each model's accuracy from the train
        # questions': a shift no calibration fitted on train evaluations sees.
        "accuracy shift": float(
            np.mean(np.abs(np.nanmean(pool.train, axis=0) - model_qualities))
        ),
        "random mixing": {
            "aiq": aiq(model_costs, model_qualities, cost_range=span),
            "quality at dearest": float(
                quality_at_cost(model_costs, model_qualities, dearest)
            ),
            "cost share": cost_at_quality(model_costs, model_qualities, target[0])
            / target[1],
        },
        "oracle": frontier_figures(
            scores, np.nan_to_num(scores), cost, span, target, dearest
        ),
        "methods": {},
    }
    for name, probabilities in predictions.items():
        figures = frontier_figures(scores, probabilities, cost, span, target, dearest)
        figures["ece"] = expected_calibration_error(scores, probabilities)
        figures["routing"] = routing_accuracy(scores, probabilities)
        figures["correctness"] = correctness_accuracy(scores, probabilities)
        figures["threshold gap"] = threshold_gap(scores, probabilities, cost)
        row["methods"][name] = figures
    return row


def _cell(values, digits=3):
    values = np.asarray(values, dtype=np.float64)
    if np.isinf(values).any():
        return f"inf in {int(np.isinf(values).sum())} of {len(values)}"
    spread = values.std(ddof=1) if len(values) > 1 else float("nan")
    return f"{values.mean():.{digits}f} ± {spread:.{digits}f}"


def report(rows, sources):
    """The page docs/research/budget.md, from the JSON lines of runs."""
    commits = sorted({row["commit"] for row in rows})
    dates = sorted({row["date"] for row in rows})
    lines = [
        "# Routing on a budget: quality against cost",
        "",
        f"Written by `python -m research.budget --report "
        f"{' '.join(map(str, sources))}` from runs at commit(s) "
        f"{', '.join(commits)} on {', '.join(dates)}. Protocol: the script's "
        "docstring. A cell is the mean over seeds ± its standard deviation. AIQ "
        "and the quality at the dearest model's cost are test-question mean "
        "scores on the method's frontier; the cost share is the least mean cost "
        "per question at which the frontier reaches the best single model's "
        "quality, over that model's cost (lower is better; inf: never reached); "
        "ECE is on the test questions, before any calibration but the router's "
        "own; the threshold gap is the largest gap, over thresholds 0.5-0.9, "
        "between the probability the threshold policy's choices promise and the "
        "score they realise. Older runs lack the newer methods and columns.",
    ]
    for pool in dict.fromkeys(row["pool"] for row in rows):
        mine = [row for row in rows if row["pool"] == pool]
        lines += [
            "",
            f"## {pool}: {mine[0]['models']} models, seeds "
            f"{[row['seed'] for row in mine]}",
            "",
            f"Best single model {np.mean([r['best single model'] for r in mine]):.3f}"
            f"; the test questions move a model's accuracy from its train accuracy "
            f"by {np.mean([r.get('accuracy shift', np.nan) for r in mine]):.3f} "
            "on average (either way)"
            f"; LOCUS fit (embedder and default router) "
            f"{np.mean([r['fit_seconds'] for r in mine]):.0f} s.",
            "",
            "| method | AIQ | quality at dearest cost | cost share | ECE | "
            "threshold gap | routing | correctness |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name in ("oracle", "random mixing"):
            figures = [row[name] for row in mine]
            lines.append(
                f"| {name} | {_cell([f['aiq'] for f in figures])} | "
                f"{_cell([f['quality at dearest'] for f in figures])} | "
                f"{_cell([f['cost share'] for f in figures], 2)} | | | | |"
            )
        for method in mine[0]["methods"]:
            figures = [row["methods"][method] for row in mine]
            cells = [
                _cell([f["aiq"] for f in figures]),
                _cell([f["quality at dearest"] for f in figures]),
                _cell([f["cost share"] for f in figures], 2),
                _cell([f["ece"] for f in figures]),
                _cell([f.get("threshold gap", np.nan) for f in figures]),
                _cell([f["routing"] for f in figures]),
                _cell([f["correctness"] for f in figures]),
            ]
            lines.append(f"| {method} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llmrouter", type=Path, help="the LLMRouter data folder")
    parser.add_argument("--openllm", type=Path, help="the Open LLM data folder")
    parser.add_argument("--sizes", type=int, nargs="*", default=[10])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--set", nargs="*", default=[], metavar="name=value")
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--out", type=Path, help="JSON lines, one per pool and seed")
    parser.add_argument("--report", nargs="+", type=Path, metavar="JSONL")
    parser.add_argument("--page", type=Path, default=Path("docs/research/budget.md"))
    arguments = parser.parse_args()
    if arguments.report:
        rows = read_rows(arguments.report)
        arguments.page.write_text(report(rows, arguments.report))
        return
    overrides = parse_settings(arguments.set)
    stamp = {
        "commit": commit(),
        "date": str(datetime.date.today()),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "arguments": " ".join(sys.argv[1:]),
    }
    for seed in arguments.seeds:
        pools = []
        if arguments.llmrouter:
            pools.append(
                (
                    "llmrouter",
                    arguments.llmrouter,
                    llmrouter_pool(arguments.llmrouter, arguments.cache),
                )
            )
        if arguments.openllm:
            pools += [
                ("openllm", arguments.openllm, pool)
                for pool in priced_openllm_pools(
                    arguments.openllm, arguments.sizes, seed
                )
            ]
        for source, folder, pool in pools:
            row = measure(pool, source, folder, seed, arguments.cache, overrides)
            row = {**row, **stamp, "settings": overrides}
            line = json.dumps(row, default=float)
            print(line, flush=True)
            if arguments.out:
                with arguments.out.open("a") as file:
                    file.write(line + "\n")


if __name__ == "__main__":
    main()
