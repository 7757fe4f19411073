"""The markdown of docs/research/score-estimation.md from the JSON lines of
:mod:`research.score_estimation`: one table of RMSE per setting, the ceiling,
interval coverage and onboarding, each cell the mean over seeds with its spread.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

BENCHMARKS = ("arc", "gsm8k", "mmlu", "truthfulqa", "winogrande")
ONBOARDING_STRATEGIES = ("random", "variance", "disagreement", "coverage")


METHOD_ORDER = (
    "item mean",
    "LOCUS, random",
    "IRT 2PL, Fisher",
    "LOCUS, chosen",
)


def _cell(values):
    values = np.asarray(values, dtype=float)
    return f"{values.mean():.2f} ± {values.std():.2f}"


def report(paths):
    """The markdown of docs/research/score-estimation.md from JSON lines."""
    rows = [json.loads(line) for path in paths for line in Path(path).open()]
    commits = sorted({row["commit"] for row in rows})
    dates = sorted({row["date"] for row in rows})
    seeds = sorted({row["seed"] for row in rows})
    lines = [
        "# Estimating leaderboard scores from a few evaluations",
        "",
        "Written by `python -m research.score_estimation --report FILE ...` from "
        "runs of `python -m research.score_estimation DATA_FOLDER` (baselines on "
        "all held-out models), `... --models` and `... --onboarding` (seeds "
        f"{seeds}) at commit(s) {', '.join(commits)} on {', '.join(dates)}. "
        "Protocol: the script's docstring. Each cell is the mean over seeds ± "
        "its standard deviation; RMSE in leaderboard points against the "
        "leaderboard's own full-benchmark scores.",
        "",
        "The tables per setting are over 112 held-out models per seed (the "
        "item mean measured again on them, from the same draws as LOCUS's "
        "random items); 'LOCUS, chosen' spends the setting's total number of "
        "items as the estimator chooses, not n per benchmark. mmlu, truthfulqa "
        "and winogrande have fewer than 100 train items: at 100 per benchmark "
        "every method sees all of mmlu's.",
        "",
    ]
    model_rows = [r for r in rows if r.get("map_models")]
    ceiling = [r["rmse"] for r in rows if r["method"] == "all train items"]
    header = "| method | items | " + " | ".join(BENCHMARKS) + " | mean |"
    rule = "|---|---|" + "---|" * (len(BENCHMARKS) + 1)
    settings = []
    for r in model_rows:
        if (r["mode"], r["n"]) not in settings:
            settings.append((r["mode"], r["n"]))
    for mode, n in settings:
        title = f"{n} per benchmark" if mode == "per benchmark" else f"{n} {mode}"
        lines += [f"## {title}", "", header, rule]
        for method in METHOD_ORDER:
            found = [
                r
                for r in model_rows
                if (r["mode"], r["n"], r["method"]) == (mode, n, method)
            ]
            if not found:
                continue
            table = np.array([r["rmse"] for r in found])
            cells = " | ".join(_cell(table[:, k]) for k in range(table.shape[1]))
            lines.append(f"| {method} | {found[0]['items']} | {cells} |")
        lines.append("")
    if ceiling:
        table = np.array(ceiling)
        cells = " | ".join(_cell(table[:, k]) for k in range(table.shape[1]))
        lines += [
            "## What these items can tell at best",
            "",
            "A ridge regression from all 806 train-item results of a model to "
            "its leaderboard scores, fitted on the training models (all "
            "held-out models, not the subset above):",
            "",
            header,
            rule,
            f"| all train items | 806 | {cells} |",
            "",
        ]
    covered = [r for r in model_rows if "coverage" in r]
    if covered:
        lines += [
            "## Interval coverage",
            "",
            "Share of the 90% intervals of `ScoreEstimator.estimate_scores` "
            "(per model and benchmark, on the held-out models) that hold the "
            "model's mean over the benchmark's train items, the quantity "
            "estimated; `fit` calibrated the intervals on reference models "
            "shown random evaluations.",
            "",
            "| method | setting | coverage |",
            "|---|---|---|",
        ]
        for method in ("LOCUS, random", "LOCUS, chosen"):
            for mode, n in settings:
                found = [
                    r["coverage"]
                    for r in covered
                    if (r["mode"], r["n"], r["method"]) == (mode, n, method)
                ]
                if found:
                    lines.append(f"| {method} | {n} {mode} | {_cell(found)} |")
        lines.append("")
    onboarding = [r for r in rows if r["method"] == "onboarding"]
    if onboarding:
        sizes = sorted({r["n"] for r in onboarding})
        lines += [
            "## Onboarding: embeddings from chosen or random evaluations",
            "",
            "Correctness and routing accuracy on the test queries of the two "
            "pools of 112 held-out models, each model embedded (forward pass) "
            "from n train-query evaluations: at random, or chosen by "
            "`ScoreEstimator.collect_evaluations` in two batches of n/2 with "
            "each strategy.",
            "",
        ]
        for metric in ("correctness", "routing"):
            lines += [
                f"### {metric}",
                "",
                "| strategy | " + " | ".join(f"n={n}" for n in sizes) + " |",
                "|---|" + "---|" * len(sizes),
            ]
            for strategy in ONBOARDING_STRATEGIES:
                cells = []
                for n in sizes:
                    found = [
                        r[metric]
                        for r in onboarding
                        if (r["strategy"], r["n"]) == (strategy, n)
                    ]
                    cells.append(
                        f"{np.mean(found):.3f} ± {np.std(found):.3f}" if found else ""
                    )
                lines.append(f"| {strategy} | " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)
