"""Calibrated P(correct) on models an embedder never saw, from 256 evaluations each.

For each seed, on the Open LLM data (:mod:`research.openllm_data`):

1. two disjoint pools of 112 fully observed dense models are drawn
   (``random_state=seed``): a *calibration* pool and an *evaluation* pool;
2. ``LocusEmbedder`` (defaults plus ``--set``, ``random_state=seed``) is fitted on
   the train-query evaluations of every other model (:func:`research.pools.
   fitted_embedder`, cached in ``--cache``);
3. every model of both pools is embedded from 256 of its train-query
   evaluations, drawn at random, by the forward pass and by refinement (50 steps,
   a router's default), and predicted on the 269 test queries;
4. a :class:`sklocus.calibration.ProbabilityCalibrator` (isotonic, and sigmoid)
   is fitted on the calibration pool's (prediction, score) pairs, and the
   evaluation pool's expected calibration error (10 equal-width bins) is
   measured before and after.

The evaluation pool's models and the test queries are never seen by the
embedder or the calibrator. Cells are means over seeds with their standard
deviation; each seed is its own fit.

Usage::

    python -m research.calibration DATA_FOLDER [--seeds 0 1 2]
        [--set name=value ...] [--cache FOLDER] [--out FILE.jsonl]
    python -m research.calibration --report FILE.jsonl
        [--page docs/research/calibration.md]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
from pathlib import Path

import numpy as np

from benchmarks.provenance import commit
from research import openllm_data
from research.json_lines import read_rows
from research.pools import fitted_embedder
from sklocus.calibration import ProbabilityCalibrator
from sklocus.cli import parse_settings
from sklocus.evaluations import subsample
from sklocus.metrics import correctness_accuracy, expected_calibration_error

ENCODER = "all-MiniLM-L6-v2"
CONTEXT = 256
REFINE_STEPS = 50


def predictions(data, embedder, models, seed):
    """Return P(correct) of ``models`` on the test queries, from 256 evaluations."""
    sets = [data.train_sets[i] for i in models]
    context = subsample(sets, CONTEXT, random_state=seed)
    return embedder.predict_correctness(embedder.transform(context), data.test_ids)


def measure(data, seed, overrides, cache):
    rng = np.random.default_rng((seed, 17))
    candidates = np.flatnonzero(data.fully_observed & data.dense)
    order = rng.permutation(candidates)
    size = openllm_data.POOL_SIZE
    calibration, evaluation = np.sort(order[:size]), np.sort(order[size : 2 * size])
    held = set(calibration) | set(evaluation)
    training = np.array([i for i in range(len(data.train_sets)) if i not in held])
    embedder, fit = fitted_embedder(
        data, training, seed, None, overrides, cache, commit()
    )
    row = {"seed": seed, "fit_seconds": fit["seconds"], "models": len(training)}
    for name, steps in (("forward pass", 0), ("refined", REFINE_STEPS)):
        current = copy.copy(embedder)
        current.refine_steps = steps
        fitted_p = predictions(data, current, calibration, seed)
        test_p = predictions(data, current, evaluation, seed)
        fitted_y = data.test_matrix[:, calibration]
        test_y = data.test_matrix[:, evaluation]
        figures = {
            "ece before": expected_calibration_error(test_y, test_p),
            "correctness": correctness_accuracy(test_y, test_p),
        }
        for method in ("isotonic", "sigmoid"):
            calibrator = ProbabilityCalibrator(method).fit(fitted_p, fitted_y)
            figures[f"ece after {method}"] = expected_calibration_error(
                test_y, calibrator.predict(test_p)
            )
        row[name] = figures
    return row


def _cell(values):
    values = np.asarray(values, dtype=np.float64)
    spread = values.std(ddof=1) if len(values) > 1 else float("nan")
    return f"{values.mean():.3f} ± {spread:.3f}"


def report(rows, sources):
    """The page docs/research/calibration.md, from the JSON lines of runs."""
    commits = sorted({row["commit"] for row in rows})
    dates = sorted({row["date"] for row in rows})
    settings = sorted({json.dumps(row["settings"], sort_keys=True) for row in rows})
    lines = [
        "# Calibrated probabilities on models the embedder never saw",
        "",
        f"Written by `python -m research.calibration --report "
        f"{' '.join(map(str, sources))}` from runs at commit(s) "
        f"{', '.join(commits)} on {', '.join(dates)}, embedder settings "
        f"{', '.join(settings)} (defaults otherwise). Protocol: the script's "
        "docstring: 112 unseen models, each embedded from 256 train-query "
        "evaluations, predicted on the 269 test queries; the calibrator is fitted "
        "on another 112 unseen models. A cell is the mean over seeds "
        f"{[row['seed'] for row in rows]} ± its standard deviation; each seed is "
        "its own fit.",
        "",
        "| embedding | ECE before | ECE after isotonic | ECE after sigmoid "
        "| correctness |",
        "|---|---|---|---|---|",
    ]
    for name in ("forward pass", "refined"):
        figures = [row[name] for row in rows]
        cells = [
            _cell([f[key] for f in figures])
            for key in ("ece before", "ece after isotonic", "ece after sigmoid")
        ]
        cells.append(_cell([f["correctness"] for f in figures]))
        lines.append(f"| {name} | {' | '.join(cells)} |")
    fit = np.mean([row["fit_seconds"] for row in rows])
    lines += ["", f"Mean fit {fit:.0f} s on {rows[0]['models']} models."]
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?", help="the Open LLM data")
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--set", nargs="*", default=[], metavar="name=value")
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", nargs="+", type=Path, metavar="JSONL")
    parser.add_argument(
        "--page", type=Path, default=Path("docs/research/calibration.md")
    )
    arguments = parser.parse_args()
    if arguments.report:
        rows = read_rows(arguments.report)
        arguments.page.write_text(report(rows, arguments.report))
        return
    overrides = parse_settings(arguments.set)
    data = openllm_data.OpenLLM(arguments.folder, ENCODER)
    for seed in arguments.seeds:
        row = measure(data, seed, overrides, arguments.cache)
        row.update(commit=commit(), date=str(datetime.date.today()), settings=overrides)
        line = json.dumps(row, default=float)
        print(line, flush=True)
        if arguments.out:
            with arguments.out.open("a") as file:
                file.write(line + "\n")


if __name__ == "__main__":
    main()
