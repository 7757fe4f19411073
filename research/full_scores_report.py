"""The markdown report of :mod:`research.full_scores`' JSON-lines files."""

from __future__ import annotations

import json

import numpy as np

from research.score_estimation_report import BENCHMARKS

METHODS = (
    "item mean",
    "IRT 2PL, Fisher",
    "ridge, random items",
    "DISCO-like, kNN",
    "DISCO-like, forest",
    "LOCUS read-out, random",
    "LOCUS read-out, anchors",
    "LOCUS read-out, chosen",
)


def _cell(values):
    """Mean ± standard error over seeds."""
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return f"{values.mean():.2f}"
    return f"{values.mean():.2f} ± {values.std(ddof=1) / np.sqrt(len(values)):.2f}"


def report(paths):
    rows = [json.loads(line) for path in paths for line in open(path) if line.strip()]
    commits = sorted({row["commit"] for row in rows})
    dates = sorted({row["date"] for row in rows})
    seeds = sorted({row["seed"] for row in rows})
    lines = [
        "# A new model's benchmark scores, on the benchmark's own scale",
        "",
        f"Written by `python -m research.full_scores --report FILE ...` from runs "
        f"of `python -m research.full_scores DATA_FOLDER` (and `--stronger`) at "
        f"commit(s) {', '.join(commits)} on {', '.join(dates)}, seeds {seeds}. "
        "Protocol: the script's docstring. Each cell is the mean over seeds ± its "
        "standard error (standard deviation over seeds / sqrt(seeds)); RMSE in "
        "leaderboard points against the leaderboard's own full-benchmark scores. "
        "'per bench' is the RMSE per benchmark averaged over the five; 'mean of "
        "five' the RMSE of the five scores' mean; coverage, of the 90% intervals, "
        "over every model and benchmark.",
        "",
    ]
    for case in ("held out", "stronger"):
        chosen = [row for row in rows if row.get("case", "held out") == case]
        if not chosen:
            continue
        if case == "stronger":
            held = sorted({(row["seed"], row["held_out"]) for row in chosen})
            lines += [
                "## Stronger than every reference",
                "",
                "The training models cut below the 90th percentile of their "
                "leaderboard average; measured: the held-out models above it "
                f"({', '.join(f'seed {s}: {n}' for s, n in held)}).",
                "",
            ]
        settings = sorted(
            {(row["mode"], row["n"]) for row in chosen},
            key=lambda s: (s[0] != "per benchmark", s[1]),
        )
        for mode, n in settings:
            title = f"{n} per benchmark" if mode == "per benchmark" else f"{n} in all"
            lines += [
                f"{'###' if case == 'stronger' else '##'} {title}",
                "",
                "| method | items | "
                + " | ".join(BENCHMARKS)
                + " | per bench | mean of five | coverage |",
                "|---" * (len(BENCHMARKS) + 5) + "|",
            ]
            if case == "stronger":
                lines[-2] = lines[-2].replace(
                    "| coverage |", "| coverage | mean error |"
                )
                lines[-1] += "---|"
            for method in METHODS:
                found = [
                    row
                    for row in chosen
                    if row["method"] == method and (row["mode"], row["n"]) == (mode, n)
                ]
                if not found:
                    continue
                errors = np.array([row["rmse"] for row in found])
                cells = [_cell(errors[:, k]) for k in range(len(BENCHMARKS))]
                cells.append(_cell(errors[:, : len(BENCHMARKS)].mean(axis=1)))
                cells.append(_cell(errors[:, len(BENCHMARKS)]))
                coverage = [row["coverage"] for row in found if "coverage" in row]
                cells.append(_cell(coverage) if coverage else "")
                if case == "stronger":
                    bias = [np.mean(row["bias"]) for row in found if "bias" in row]
                    cells.append(_cell(bias) if bias else "")
                lines.append(
                    f"| {method} | {found[0]['items']} | " + " | ".join(cells) + " |"
                )
            lines.append("")
    return "\n".join(lines)
