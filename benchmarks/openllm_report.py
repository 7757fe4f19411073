"""Tables and plots of benchmarks/openllm.py: writes docs/results.md and its PNGs."""

from __future__ import annotations

import os
import platform
import shlex

import matplotlib
import numpy as np
import pandas as pd

matplotlib.use("Agg")
import openllm_pools_report  # noqa: E402
from matplotlib import pyplot as plt  # noqa: E402
from openllm_transfer_report import keep_section  # noqa: E402
from provenance import commit  # noqa: E402


def _mean_spread(values):
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return f"{values.mean():.3f}"
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}"


def _main_table(frame, setting, sizes, methods):
    part = frame[frame["setting"] == setting]
    lines = [
        "| method | " + " | ".join(f"n = {n}" for n in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for metric in ("correctness", "routing"):
        lines.append(f"| **{metric} accuracy** |" + " |" * len(sizes))
        for method in methods:
            cells = [
                _mean_spread(
                    part[(part["method"] == method) & (part["n"] == n)][metric]
                )
                for n in sizes
            ]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return lines


def _bar_verdict(frame, sizes, label_free, locus, labels_method):
    """Whether LOCUS beats each label-free baseline beyond the spread (onboarding)."""
    part = frame[frame["setting"] == "onboarding"]
    lines = []
    for n in sorted(part["n"].unique()):
        if n not in sizes:
            continue
        at_n = part[part["n"] == n]
        for metric in ("correctness", "routing"):
            if metric == "routing" and n < 128:
                continue
            ours = at_n[at_n["method"] == locus][metric].to_numpy()
            for method in (*label_free, labels_method):
                theirs = at_n[at_n["method"] == method][metric].to_numpy()
                if method == labels_method and n < 256:
                    continue
                difference = ours - theirs  # paired by seed
                spread = difference.std(ddof=1) if len(difference) > 1 else np.nan
                if method != labels_method and len(difference) < 2:
                    verdict = "one seed: no spread measured"
                elif method == labels_method:
                    verdict = (
                        "matches or beats" if difference.mean() >= -0.0025 else "below"
                    )
                elif len(difference) > 1 and difference.mean() > spread:
                    verdict = "beats (beyond spread)"
                elif difference.mean() > 0:
                    verdict = "ahead, within spread"
                else:
                    verdict = "NOT ahead"
                lines.append(
                    f"| {n} | {metric} | {method} | {difference.mean():+.3f} "
                    f"| {spread:.3f} | {verdict} |"
                )
    return [
        "| n | metric | against | LOCUS minus it (mean over seeds) | spread (sd) "
        "| verdict |",
        "|---|---|---|---|---|---|",
        *lines,
    ]


def _plot_sample_efficiency(frame, methods, path):
    part = frame[frame["setting"] == "onboarding"]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for metric, axis in zip(("correctness", "routing"), axes):
        for method in methods:
            curve = part[part["method"] == method].groupby("n")[metric].mean()
            axis.plot(curve.index, curve.values, marker="o", label=method)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("evaluations per model (n)")
        axis.set_ylabel(f"{metric} accuracy (test queries)")
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    figure.suptitle("Onboarding: accuracy against n (mean over seeds)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_stability(stability, path):
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    n, mean, spread = zip(*stability["by_n"])
    axes[0].errorbar(n, mean, yerr=spread, marker="o")
    axes[0].set_xscale("log", base=2)
    axes[0].set_xlabel("evaluations per model (n)")
    axes[0].set_ylabel("distance to full embedding\n(/ median inter-model)")
    overlap, distance = zip(*stability["by_overlap"])
    axes[1].plot(overlap, distance, marker="o")
    axes[1].set_xlabel("overlap with the reference subset (n = 128)")
    axes[1].set_ylabel("distance to reference embedding")
    for axis in axes:
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_portfolios(portfolios, path):
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, curve in portfolios["by_k"].items():
        k, accuracy = zip(*curve)
        axes[0].plot(k, accuracy, marker="o", label=name)
    axes[0].axhline(portfolios["full"], color="gray", linestyle="--", label="full pool")
    axes[0].set_xscale("log")
    axes[0].set_xlabel("portfolio size k")
    axes[0].set_ylabel("routing accuracy (test queries)")
    axes[0].legend(fontsize=8)
    budget, _, accuracy = zip(*portfolios["coverage"])
    axes[1].plot(budget, accuracy, marker="o", label="coverage-greedy")
    axes[1].axhline(portfolios["full"], color="gray", linestyle="--", label="full pool")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("parameter budget (billions)")
    axes[1].legend(fontsize=8)
    for axis in axes:
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _matching_n(frame, methods, locus):
    """Smallest n at which each method's correctness reaches LOCUS's at n = 128."""
    part = frame[frame["setting"] == "onboarding"]
    target = part[(part["method"] == locus) & (part["n"] == 128)]["correctness"].mean()
    lines = [
        f"LOCUS correctness at n = 128 (onboarding, mean): {target:.3f}.",
        "",
        "| method | smallest n reaching it |",
        "|---|---|",
    ]
    for method in methods:
        curve = part[part["method"] == method].groupby("n")["correctness"].mean()
        reached = curve[curve >= target]
        cell = (
            str(int(reached.index.min())) if len(reached) else "not reached (n ≤ 806)"
        )
        lines.append(f"| {method} | {cell} |")
    return lines


def write(path, rows, fits, extra, arguments, overrides, protocol):
    """Write the results page and its figures next to it.

    ``protocol`` names the methods and sizes: a dict with ``locus``, ``label_free``,
    ``labels``, ``methods``, ``table_sizes``, ``n_train`` and ``n_test``.
    """
    LOCUS, LABEL_FREE = protocol["locus"], protocol["label_free"]
    METHODS, TABLE_SIZES = protocol["methods"], protocol["table_sizes"]
    n_test = protocol["n_test"]
    frame = pd.DataFrame(rows)
    routing = frame[frame["method"] == LOCUS]["routing"].mean()
    standard_error = np.sqrt(routing * (1 - routing) / n_test)
    figures = path.parent / "results"
    figures.mkdir(parents=True, exist_ok=True)
    seeds = " ".join(str(s) for s in arguments.seeds)
    command = (
        f"python benchmarks/openllm.py DATA_FOLDER --seeds {seeds} "
        f"--settings {' '.join(arguments.settings)} --encoder {arguments.encoder} "
        f"--draws {arguments.draws}{' --tables-only' * arguments.tables_only} "
        f"--out {arguments.out}"
    )
    if overrides:
        command += " --set " + " ".join(
            shlex.quote(f"{k}={v!r}") for k, v in overrides.items()
        )
    lines = [
        "# Results on the Open LLM Leaderboard data",
        "",
        "## A fit for each pool",
        "",
        f"Written by `{command}` at commit {commit()} in "
        f"{extra['seconds'] / 60:.0f} minutes on "
        f"{platform.machine()} with {os.cpu_count()} CPU cores; every figure below",
        "comes from that run. Protocol: benchmarks/openllm.py's docstring.",
        f"Encoder: {arguments.encoder}. Seeds (one pool of 112 fully observed dense",
        f"models each): {seeds}; each seed's figure is the mean over "
        f"{arguments.draws} draws of",
        "the n evaluations, and a cell is the mean over seeds ± their standard",
        f"deviation. Test queries: {n_test}; one routing figure has a standard",
        f"error of about {standard_error:.3f} (binomial, at LOCUS's mean routing). "
        f"LocusEmbedder parameters changed from the defaults: {overrides or 'none'}.",
        "Changes to the recipe tried along the way, and what they did:",
        "[tuning.md](tuning.md).",
        "",
        "## Training",
        "",
        "Oracle routing is the accuracy of routing each test query to a pool model",
        "that answers it right when one does; mean accuracy is that of a random",
        "pool model. The MF and IRT baselines' L2 penalty on item weights is",
        "chosen per seed on held-out training queries (openllm_baselines.py).",
        "",
        "| setting | seed | models | epochs run | fit time | oracle routing "
        "| mean accuracy | MF / IRT item penalty |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {f['setting']} | {f['seed']} | {f['models']} | {f['epochs']} "
            f"| {f['seconds'] / 60:.1f} min | {f['oracle']:.3f} "
            f"| {f['mean_accuracy']:.3f} "
            f"| {f['item_decays']['mf']:g} / {f['item_decays']['irt']:g} |"
            for f in fits
        ],
    ]
    for setting in arguments.settings:
        lines += [
            "",
            f"## Routing and correctness: {setting} setting",
            "",
            *_main_table(frame, setting, TABLE_SIZES, METHODS),
        ]
    if "onboarding" in arguments.settings:
        lines += [
            "",
            "## The bar (onboarding)",
            "",
            "LOCUS minus each baseline, paired by seed; 'beyond spread' means the mean",
            "difference exceeds its standard deviation across seeds.",
            *(
                [
                    "With few seeds that standard deviation is itself a rough",
                    "guess: docs/tuning.md compares LOCUS with the baselines over",
                    "4 to 8 pools (sections 'Tuned baselines' and 'Where the",
                    "routing is to be won'), where some verdicts below do not hold.",
                ]
                if len(arguments.seeds) < 4
                else []
            ),
            "",
            *_bar_verdict(frame, TABLE_SIZES, LABEL_FREE, LOCUS, protocol["labels"]),
            "",
            "## Sample efficiency (onboarding)",
            "",
            "![accuracy against n](results/sample_efficiency.png)",
            "",
            *_matching_n(frame, METHODS[1:], LOCUS),
        ]
        _plot_sample_efficiency(frame, METHODS, figures / "sample_efficiency.png")
    if "stability" in extra:
        stability = extra["stability"]
        lines += [
            "",
            "## Stability (onboarding embedder, first seed)",
            "",
            "Distance from the embedding of n evaluations (5 draws) to the embedding",
            f"of all {protocol['n_train']} train queries, divided by the median "
            "distance between two",
            f"pool models' full embeddings ({stability['scale']:.3f}); then, at",
            "n = 128, distance to a reference subset's embedding against the",
            "fraction of the reference's queries shared.",
            "",
            "![stability](results/stability.png)",
            "",
            "| n | relative distance |",
            "|---|---|",
            *[f"| {n} | {m:.3f} ± {s:.3f} |" for n, m, s in stability["by_n"]],
            "",
            "| overlap | relative distance |",
            "|---|---|",
            *[f"| {f:.2f} | {d:.3f} |" for f, d in stability["by_overlap"]],
        ]
        _plot_stability(stability, figures / "stability.png")
    if "geometry" in extra:
        geometry = extra["geometry"]
        portfolios = geometry["portfolios"]
        lines += [
            "",
            "## Geometry (onboarding embedder, first seed)",
            "",
            "The pool's models are embedded from all their train queries.",
            "",
            "Distance between two models' embeddings against the rate at which",
            "their test-query scores differ:",
            "",
            "| metric | Pearson | Spearman | Kendall |",
            "|---|---|---|---|",
            *[
                f"| {metric} | {c['pearson']:.3f} | {c['spearman']:.3f} "
                f"| {c['kendall']:.3f} |"
                for metric, c in geometry["correlation"].items()
            ],
            "",
            "Fallback: routing accuracy when every routed model is replaced.",
            "",
            "| routed to | routing accuracy |",
            "|---|---|",
            *[f"| {k} | {v:.3f} |" for k, v in geometry["fallback"].items()],
            "",
            "Portfolios: routing among the selected models only (LOCUS",
            f"predictions); the full pool routes at {portfolios['full']:.3f}.",
            "",
            "![portfolios](results/portfolios.png)",
            "",
            "| k | k-center | k-medoids |",
            "|---|---|---|",
            *[
                f"| {k} | {a:.3f} | {b:.3f} |"
                for (k, a), (_, b) in zip(
                    portfolios["by_k"]["k-center"], portfolios["by_k"]["k-medoids"]
                )
            ],
        ]
        for name, curve in portfolios["by_k"].items():
            matching = [k for k, a in curve if a >= portfolios["full"] - 0.01]
            lines.append(
                f"\nSmallest {name} portfolio within 1 point of the full pool: "
                f"k = {min(matching)}."
            )
        lines += [
            "",
            "Coverage-greedy under a budget of parameters (unknown sizes set to the",
            "pool's median):",
            "",
            "| budget (B) | models | routing accuracy |",
            "|---|---|---|",
            *[f"| {b} | {m} | {a:.3f} |" for b, m, a in portfolios["coverage"]],
            "",
            f"Near-duplicates among all {geometry['n_models']:,} models (embedded",
            "from their train queries): "
            f"{geometry['identical_pairs']:,} pairs have identical train-query",
            "evaluations (so identical embeddings: re-uploads and results scraped",
            "twice). The closest pairs whose evaluations differ, with the rate at",
            "which their scores differ on the queries both have:",
            "",
            "| model | model | cosine distance | common queries | disagreement |",
            "|---|---|---|---|---|",
            *[
                f"| {a} | {b} | {d:.2e} | {c} | {r:.3f} |"
                for a, b, d, c, r in geometry["duplicates"]
            ],
        ]
        _plot_portfolios(portfolios, figures / "portfolios.png")
    if "query_sets" in extra:
        query_rows, seconds = extra["query_sets"]
        lines += [
            "",
            "## Varying query sets (onboarding, first seed)",
            "",
            "The embedder trained on every non-pool model against one trained only",
            f"on the fully observed ones (fit {seconds / 60:.1f} min).",
            "",
            "| training models | count | n | correctness | routing |",
            "|---|---|---|---|---|",
            *[
                f"| {a} | {m} | {n} | {c:.3f} | {r:.3f} |"
                for a, m, n, c, r in query_rows
            ],
        ]
    old = path.read_text() if path.exists() else ""
    new = keep_section(old, "\n".join(lines) + "\n")
    path.write_text(openllm_pools_report.keep_section(old, new))
