"""A router that learns from the outcomes of its own routes, on the Open LLM data.

Live traffic, simulated per seed:

1. The pools are research/score_estimation.py's two held-out pools of the
   seed, of 112 fully observed dense models each, which its embedder never saw.
   The embedder is that script's (``--cache`` shares it), fitted on every other
   model's train-query evaluations. Each pool is one run.
2. Each pool model starts from 16 random train-query evaluations:
   ``LocusRouter(FrozenEstimator(embedder), exploration=...)`` is fitted on them.
3. Queries of the train split arrive, drawn at random with replacement. In
   batches of ``--batch`` queries the router routes each (exploring, when its
   policy does) and learns, with ``partial_fit``, the outcome of the model it
   chose, and only that one.
4. After 0, 500, 1,000, 2,000, 5,000, 10,000 and 20,000 queries, the router's
   best guesses (``predict_correctness``) are measured on the 269 test queries:
   routing accuracy (the mean score of each query's likeliest model) and
   correctness (accuracy of P(correct) > 0.5).

The policies: ``none`` (never learns), ``greedy`` (learns from its best guesses'
outcomes), ``thompson`` and ``ucb`` (the router's ``exploration``), and ``full``
(learns every model's outcome on every query routed: an upper bound, with 112
outcomes per query). The reference is the same router fitted on 256 random
train-query evaluations of each model (``onboarded-256``).

Usage::

    python -m benchmarks.learning_from_outcomes DATA_FOLDER --cache FOLDER
        [--seeds 0 1 2] [--policies ...] [--strength 1.0] [--out FILE.jsonl]
    python -m benchmarks.learning_from_outcomes --report FILE.jsonl ...
        [--figure PNG]

``--report`` prints the markdown table (mean and sd over runs, two per seed) of
docs/research/learning-from-outcomes.md and draws its figure.
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
from sklearn.frozen import FrozenEstimator

from benchmarks.provenance import commit
from research import openllm_data
from research.score_estimation import POOL, embedder_of
from sklocus import LocusRouter
from sklocus.evaluations import subsample
from sklocus.metrics import correctness_accuracy, routing_accuracy

START = 16
REFERENCE = 256
CHECKPOINTS = (0, 500, 1000, 2000, 5000, 10000, 20000)
POLICIES = ("none", "greedy", "thompson", "ucb", "full")


def pools_of(data, seed):
    """The two held-out pools of ``seed`` (sorted model indices)."""
    rng = np.random.default_rng((seed, 17))
    candidates = np.flatnonzero(data.fully_observed & data.dense)
    order = rng.permutation(candidates)[: 2 * POOL]
    return [np.sort(order[:POOL]), np.sort(order[POOL:])]


def router_on(embedder, data, pool, n, seed, **params):
    """A router of ``pool`` fitted on ``n`` random train evaluations per model."""
    names = [data.names[i] for i in pool]
    sets = subsample(data.sets(pool), n, random_state=seed)
    router = LocusRouter(FrozenEstimator(embedder), random_state=seed, **params)
    return router.fit_evaluations(sets, names)


def measured(router, data, pool):
    p = router.predict_correctness(data.test_ids).T
    truth = data.test_matrix[pool]
    return {
        "routing": float(routing_accuracy(truth, p)),
        "correctness": float(correctness_accuracy(truth, p)),
    }


def simulate(embedder, data, pool, seed, policy, strength, batch):
    """Rows of figures at each checkpoint of one policy's traffic in ``pool``."""
    exploration = policy if policy in ("thompson", "ucb") else None
    router = router_on(
        embedder,
        data,
        pool,
        START,
        seed,
        exploration=exploration,
        exploration_strength=strength,
    )
    truth = data.train_matrix[pool]  # (models, train queries), fully observed
    rng = np.random.default_rng((seed, int(pool[0]), 23))
    arrivals = rng.integers(0, len(data.train_ids), CHECKPOINTS[-1])
    rows, served, learnt, seconds, seen = [], 0, 0, 0.0, set()
    for checkpoint in CHECKPOINTS:
        while served < checkpoint:
            chunk = arrivals[served : min(served + batch, checkpoint)]
            queries = [data.train_ids[i] for i in chunk]
            start = time.perf_counter()
            if policy == "full":
                # A query seen before brings the same outcomes again, whose mean
                # is what the router holds: learning it again would change the
                # counts only, not the router's predictions, so it is skipped.
                fresh = [i for i in dict.fromkeys(chunk.tolist()) if i not in seen]
                seen.update(fresh)
                if fresh:
                    outcomes = pd.DataFrame(truth[:, fresh].T, columns=router.classes_)
                    router.partial_fit([data.train_ids[i] for i in fresh], outcomes)
                learnt += len(chunk) * len(pool)
            elif policy != "none":
                chosen = router.predict(queries, explore=policy != "greedy")
                column = {name: j for j, name in enumerate(router.classes_)}
                models = np.array([column[name] for name in chosen])
                # A query routed twice to one model in a batch has one outcome
                # in the table; the data's outcomes repeat exactly, so their
                # mean is the same.
                outcomes = pd.DataFrame(
                    {"query": queries, "model": chosen, "score": truth[models, chunk]}
                ).drop_duplicates(["query", "model"])
                table = outcomes.pivot(index="query", columns="model", values="score")
                router.partial_fit(list(table.index), table)
                learnt += len(chunk)
            seconds += time.perf_counter() - start
            served += len(chunk)
        rows.append(
            {
                "seed": seed,
                "pool": int(pool[0]),
                "policy": policy,
                "strength": strength if exploration else None,
                "queries": checkpoint,
                "outcomes": learnt,
                "seconds": round(seconds, 1),
                **measured(router, data, pool),
            }
        )
        print(
            f"seed {seed} {policy:8s} queries {checkpoint:6d} outcomes {learnt:8d} "
            f"routing {rows[-1]['routing']:.4f} correctness "
            f"{rows[-1]['correctness']:.4f} ({seconds:.0f} s)",
            flush=True,
        )
    return rows


def report(paths, figure=None):
    """The markdown table of results files, and the figure when asked."""
    rows = pd.concat([pd.read_json(p, lines=True) for p in paths], ignore_index=True)
    rows["label"] = rows["policy"].where(
        rows["strength"].isna(),
        rows["policy"] + " " + rows["strength"].map("{:g}".format, na_action="ignore"),
    )
    reference = rows[rows["policy"] == f"onboarded-{REFERENCE}"]
    curves = rows[rows["policy"] != f"onboarded-{REFERENCE}"]
    table = curves.groupby(["label", "queries"])["routing"].agg(["mean", "std"])
    wide = table.apply(lambda r: f"{r['mean']:.3f} ± {r['std']:.3f}", axis=1).unstack()
    lines = [
        "| policy | " + " | ".join(f"{q:,}" for q in wide.columns) + " |",
        "|---" * (len(wide.columns) + 1) + "|",
    ]
    lines += [
        f"| {label} | " + " | ".join(wide.loc[label]) + " |" for label in wide.index
    ]
    seeds = sorted(curves["seed"].unique())
    ref = reference["routing"]
    lines += [
        "",
        f"Onboarded from {REFERENCE} random evaluations per model: routing "
        f"{ref.mean():.3f} ± {ref.std():.3f}. Mean ± sd over {len(ref)} runs, "
        f"two pools of each of seeds {', '.join(map(str, seeds))}; "
        f"commit {', '.join(sorted(rows['commit'].unique()))}, "
        f"{', '.join(sorted(rows['date'].unique()))}.",
    ]
    if figure is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.2))
        for label in wide.index:
            cells = table.loc[label]
            x = np.maximum(cells.index.to_numpy(), 100)
            ax.errorbar(x, cells["mean"], yerr=cells["std"], label=label, capsize=2)
        ax.axhline(ref.mean(), color="k", ls="--", lw=1, label="onboarded from 256")
        ax.set_xscale("log")
        ax.set_xlabel("queries routed (0 drawn at 100)")
        ax.set_ylabel("routing accuracy, test queries")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(figure, dpi=120)
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path, nargs="?", help="the Open LLM data folder")
    parser.add_argument("--report", type=Path, nargs="+", metavar="FILE")
    parser.add_argument("--figure", type=Path)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--policies", nargs="*", default=list(POLICIES))
    parser.add_argument("--strength", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--out", type=Path)
    arguments = parser.parse_args()
    if arguments.report:
        print(report(arguments.report, arguments.figure))
        return
    if arguments.data is None:
        parser.error("give DATA_FOLDER (or --report)")
    data = openllm_data.OpenLLM(arguments.data, "all-MiniLM-L6-v2")
    stamp = {
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "machine": platform.machine(),
    }
    for seed in arguments.seeds:
        embedder, _ = embedder_of(data, seed, arguments)
        for pool in pools_of(data, seed):
            reference = router_on(embedder, data, pool, REFERENCE, seed)
            rows = [
                {
                    "seed": seed,
                    "pool": int(pool[0]),
                    "policy": f"onboarded-{REFERENCE}",
                    "strength": None,
                    "queries": 0,
                    "outcomes": 0,
                    **measured(reference, data, pool),
                }
            ]
            for policy in arguments.policies:
                rows += simulate(
                    embedder,
                    data,
                    pool,
                    seed,
                    policy,
                    arguments.strength,
                    arguments.batch,
                )
            if arguments.out is not None:
                with arguments.out.open("a") as out:
                    for row in rows:
                        out.write(json.dumps({**row, **stamp}) + "\n")


if __name__ == "__main__":
    main()
