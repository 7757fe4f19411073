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

    python -m research.learning_from_outcomes DATA_FOLDER --cache FOLDER
        [--seeds 0 1 2] [--policies ...] [--strength 1.0] [--out FILE.jsonl]
    python -m research.learning_from_outcomes --report FILE.jsonl ...
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
    p = router.predict_correctness(data.test_ids)
    truth = data.test_matrix[:, pool]
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
    truth = data.train_matrix[:, pool]  # (train queries, models), fully observed
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
                    outcomes = pd.DataFrame(truth[fresh], columns=router.classes_)
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
                    {"query": queries, "model": chosen, "score": truth[chunk, models]}
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


def _cells(table):
    """``mean ± sd (runs)`` per label and checkpoint, as a wide frame."""
    return table.apply(lambda r: f"{r['mean']:.3f} ± {r['std']:.3f}", axis=1).unstack()


def _markdown(wide, runs):
    lines = [
        "| policy | runs | " + " | ".join(f"{q:,}" for q in wide.columns) + " |",
        "|---" * (len(wide.columns) + 2) + "|",
    ]
    return lines + [
        f"| {label} | {runs[label]} | " + " | ".join(wide.loc[label].fillna("")) + " |"
        for label in wide.index
    ]


def _paired(curves, reference, labels, last):
    """Per-run differences at the last checkpoint, against the reference and greedy.

    The policies of a run share its pool and start, so their difference run by
    run is a sharper comparison than the spreads of the cells.
    """
    at_last = curves[curves["queries"] == last].set_index(["seed", "pool", "label"])
    routing = at_last["routing"].unstack("label")
    baseline = reference.set_index(["seed", "pool"])["routing"]
    lines = [
        f"Paired by run, routing at {last:,} queries minus the reference's (and "
        "minus greedy learning's), mean ± sd over the runs:",
        "",
        "| policy | − onboarded from 256 | − greedy |",
        "|---|---|---|",
    ]
    for label in labels:
        if label == "none" or label not in routing:
            continue
        cells = []
        for other in (baseline, routing.get("greedy")):
            if other is None or label == "greedy" and other is not baseline:
                cells.append("")
                continue
            difference = (routing[label] - other.reindex(routing.index)).dropna()
            cells.append(f"{difference.mean():+.3f} ± {difference.std():.3f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def report(paths, figure=None):
    """The page docs/research/learning-from-outcomes.md, and its figure if asked."""
    rows = pd.concat(
        [pd.read_json(p, lines=True, dtype=False) for p in paths],
        ignore_index=True,
    )
    exploring = rows["policy"].isin(["thompson", "ucb"])
    rows["label"] = rows["policy"].where(
        ~exploring, rows["policy"] + " " + rows["strength"].map("{:g}".format)
    )
    is_reference = rows["policy"] == f"onboarded-{REFERENCE}"
    # Each run measured its reference once per file it wrote: once counts.
    reference = rows[is_reference].drop_duplicates(["seed", "pool"])
    curves = rows[~is_reference]
    order = [p for p in POLICIES if p in set(curves["policy"])]
    labels = sorted(
        curves["label"].unique(),
        key=lambda label: (order.index(label.split()[0]), label),
    )
    runs = curves.groupby("label").apply(
        lambda frame: frame[["seed", "pool"]].drop_duplicates().shape[0],
        include_groups=False,
    )
    figures = {}
    for metric in ("routing", "correctness"):
        table = curves.groupby(["label", "queries"])[metric].agg(["mean", "std"])
        figures[metric] = table
    main_runs = runs.max()
    seeds = sorted(curves["seed"].unique())
    ref = reference[["routing", "correctness"]].agg(["mean", "std"])
    last = CHECKPOINTS[-1]
    final = figures["routing"].xs(last, level="queries")
    main = [label for label in labels if runs[label] == main_runs]
    best_explorer = max(
        (label for label in main if label.split()[0] in ("thompson", "ucb")),
        key=lambda label: final.loc[label, "mean"],
        default=None,
    )
    commits = ", ".join(sorted(rows["commit"].unique()))
    dates = ", ".join(sorted(rows["date"].unique()))
    files = " ".join(str(p) for p in paths)
    lines = [
        "# Learning from outcomes: a router taught by its own routes",
        "",
        f"Written by `python -m research.learning_from_outcomes --report {files} "
        "--figure docs/research/images/learning-from-outcomes.png` from runs of "
        f"`python -m research.learning_from_outcomes DATA_FOLDER` at commit "
        f"{commits} ({dates}).",
        "",
        "## Protocol",
        "",
        "- A pool is 112 fully observed dense Open LLM Leaderboard models that the "
        "embedder never saw: the two held-out pools of each seed of "
        "`research/score_estimation.py`, whose embedder (4 epochs, every other "
        "model's train-query evaluations) is the one used here.",
        f"- Each pool model starts from {START} random train-query evaluations; the "
        "router is `LocusRouter(FrozenEstimator(embedder))` with the defaults "
        "(refinement on, no query heads at 112 models).",
        "- Train queries arrive at random, with replacement, in batches of 500. The "
        "router routes each (exploring when its policy does); the outcome of the "
        "chosen model, and of no other, is learnt with `partial_fit`. A query "
        "seen before by that model adds an outcome equal to the first (the data "
        "hold one answer per model and query).",
        "- After each checkpoint the router's best guesses are measured on the 269 "
        "test queries: routing accuracy (mean score of each query's likeliest "
        "model) and correctness (accuracy of P(correct) > 0.5).",
        "- `none` never learns; `greedy` learns from its best guesses' outcomes; "
        "`thompson` and `ucb` route by the router's `exploration` at the "
        "`exploration_strength` named; `full` learns every model's outcome on "
        "every query routed (112 outcomes per query: an upper bound of what "
        "outcomes can teach).",
        f"- The reference: the same router fitted on {REFERENCE} random train-query "
        "evaluations of each model.",
        "",
        f"Cells: mean ± sd over runs ({main_runs} runs: two pools of each of seeds "
        f"{', '.join(map(str, seeds))}; settings with fewer runs ran on fewer "
        "seeds). Columns: queries routed, each bringing one outcome (112 for "
        "`full`).",
        "",
        "## Routing accuracy",
        "",
        *_markdown(_cells(figures["routing"]).loc[labels], runs),
        "",
        f"Onboarded from {REFERENCE} random evaluations per model: "
        f"{ref.loc['mean', 'routing']:.3f} ± {ref.loc['std', 'routing']:.3f}.",
        "",
        "![routing accuracy against queries routed](images/learning-from-outcomes.png)",
        "",
        "## Correctness",
        "",
        *_markdown(_cells(figures["correctness"]).loc[labels], runs),
        "",
        f"Onboarded from {REFERENCE} random evaluations per model: "
        f"{ref.loc['mean', 'correctness']:.3f} ± "
        f"{ref.loc['std', 'correctness']:.3f}.",
        "",
        "## Against the goal",
        "",
    ]
    if best_explorer is not None:
        explorer = final.loc[best_explorer]
        at_last = curves[curves["queries"] == last]
        ran = at_last[at_last["label"] == best_explorer].set_index(["seed", "pool"])
        difference = (
            ran["routing"] - reference.set_index(["seed", "pool"])["routing"]
        ).dropna()
        if difference.mean() >= 0:
            verdict = "**met**"
        elif difference.mean() + difference.std() >= 0:
            verdict = "**level within the spread of the runs**"
        else:
            verdict = "**not met**"
        lines += [
            f"Goal: with exploration, routing after {last:,} outcomes reaches that "
            f"of models onboarded from {REFERENCE} random evaluations each. The "
            f"better exploration, {best_explorer}, routes "
            f"{explorer['mean']:.3f} ± {explorer['std']:.3f} against "
            f"{ref.loc['mean', 'routing']:.3f} ± {ref.loc['std', 'routing']:.3f}, "
            f"{difference.mean():+.3f} ± {difference.std():.3f} run by run: "
            f"{verdict}.",
        ]
    lines += ["", *_paired(curves, reference, main, last)]
    if figure is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.2))
        table = figures["routing"]
        for label in main:
            cells = table.loc[label]
            x = np.maximum(cells.index.to_numpy(), 100)
            ax.errorbar(x, cells["mean"], yerr=cells["std"], label=label, capsize=2)
        ax.axhline(
            ref.loc["mean", "routing"],
            color="k",
            ls="--",
            lw=1,
            label=f"onboarded from {REFERENCE}",
        )
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
