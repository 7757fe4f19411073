"""The markdown section of ``research/pools.py --report``: verdicts, then tables.

Reads the JSON that ``research/pools.py --out`` writes and replaces the marked
section of docs/research/results.md.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from research import baselines
from sklocus.geometry import DUPLICATE_THRESHOLD, STABLE_DUPLICATE_THRESHOLD

SIZES = (64, 128, 256, 512)
LOCUS = baselines.LOCUS
# openllm_baselines' methods plus the label-free cluster tally and the labelled
# benchmark tally.
LABEL_FREE = (*baselines.LABEL_FREE, "per-cluster accuracy (8 k-means clusters)")
LABELLED = (baselines.LABELS, "per-benchmark accuracy (labels)")

BEGIN = "<!-- pools: written by research/pools.py --report -->"
END = "<!-- end of pools -->"
ROUTING_TARGET, CORRECTNESS_TARGET, PORTFOLIO_TARGET, PEARSON_TARGET = (
    0.87,
    0.73,
    20,
    0.90,
)


def _mean_se(values):
    values = np.asarray(values, dtype=float)
    if len(values) < 2:
        return float(values.mean()), float("nan")
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values)))


def _cell(values):
    mean, se = _mean_se(values)
    return f"{mean:.3f} ± {se:.3f}"


def _by_n(result, metric, method):
    """Array (pools, sizes) of one method's figure."""
    return np.array([pool[metric][method] for pool in result["pools"]])


def _table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return lines


def _verdict(met, gap=None, se=None):
    """'met', or 'not met', noting a miss smaller than one standard error."""
    if met:
        return "met"
    if gap is not None and se is not None and abs(gap) < se:
        return "not met (within one standard error)"
    return "not met"


def _paired(result, metric, method, other, n_index):
    return _mean_se(
        _by_n(result, metric, method)[:, n_index]
        - _by_n(result, metric, other)[:, n_index]
    )


def prediction_section(result):
    methods = list(result["pools"][0]["correctness"])
    sizes = " | ".join(f"n = {n}" for n in SIZES)
    lines = []
    for metric in ("correctness", "routing"):
        lines += [
            "",
            f"{metric.capitalize()} accuracy (mean ± standard error over "
            f"{len(result['pools'])} pools):",
            "",
        ]
        lines += _table(
            ["method", *sizes.split(" | ")],
            [
                [m, *[_cell(_by_n(result, metric, m)[:, i]) for i in range(len(SIZES))]]
                for m in methods
            ],
        )
    lines += ["", "Profile spread (sd of a model's logits over the test queries):", ""]
    lines += _table(
        ["method", *sizes.split(" | ")],
        [
            [
                m,
                *[
                    f"{_mean_se(_by_n(result, 'spread', m)[:, i])[0]:.3f}"
                    for i in range(len(SIZES))
                ],
            ]
            for m in result["pools"][0]["spread"]
        ],
    )
    return lines


def targets_section(result):
    """Issue 17's targets for routing and correctness, and issue 6's restated bar."""
    locus = list(result["pools"][0]["spread"])
    i256 = SIZES.index(256)
    rows = []
    for method in locus:
        mean, se = _mean_se(_by_n(result, "routing", method)[:, i256])
        rows.append(
            [
                f"{method}: routing at n = 256 >= {ROUTING_TARGET}",
                f"{mean:.3f} ± {se:.3f}",
                _verdict(mean >= ROUTING_TARGET, mean - ROUTING_TARGET, se),
            ]
        )
        for n in (256, 512):
            mean, se = _paired(result, "routing", method, LABELLED[0], SIZES.index(n))
            rows.append(
                [
                    f"{method}: routing minus per-subject tally, n = {n}",
                    f"{mean:+.3f} ± {se:.3f}",
                    _verdict(mean >= 0, mean, se),
                ]
            )
        mean, se = _mean_se(_by_n(result, "correctness", method)[:, i256])
        rows.append(
            [
                f"{method}: correctness at n = 256 >= {CORRECTNESS_TARGET}",
                f"{mean:.3f} ± {se:.3f}",
                _verdict(mean >= CORRECTNESS_TARGET, mean - CORRECTNESS_TARGET, se),
            ]
        )
        worst = min(
            (
                _paired(result, "correctness", method, other, i) + (other, n)
                for other in LABEL_FREE
                for i, n in enumerate(SIZES)
            ),
            key=lambda item: item[0],
        )
        rows.append(
            [
                f"{method}: correctness minus the best label-free baseline, "
                f"worst case ({worst[2]}, n = {worst[3]})",
                f"{worst[0]:+.3f} ± {worst[1]:.3f}",
                _verdict(worst[0] > 0, *worst[:2]),
            ]
        )
        for other in LABEL_FREE[:4]:
            if other == LABEL_FREE[1]:
                continue
            worst = min(
                _paired(result, "routing", method, other, SIZES.index(n)) + (n,)
                for n in SIZES
                if n >= 128
            )
            rows.append(
                [
                    f"{method}: routing minus {other}, worst n >= 128 (n = {worst[2]})",
                    f"{worst[0]:+.3f} ± {worst[1]:.3f}",
                    _verdict(worst[0] >= 0, *worst[:2]),
                ]
            )
    lines = [
        "",
        "Targets (paired differences are per pool, then mean ± standard "
        "error; 'met' reads the mean):",
        "",
    ]
    return lines + _table(["target", "figure", "verdict"], rows)


def geometry_section(result):
    geometry = [pool["geometry"] for pool in result["pools"]]
    smallest = [g["smallest k-center within 1 point"] for g in geometry]
    rows = [
        [
            f"distance-disagreement Pearson, {metric} >= {PEARSON_TARGET}",
            _cell([g["pearson"][metric] for g in geometry]),
            _verdict(
                np.mean([g["pearson"][metric] for g in geometry]) >= PEARSON_TARGET
            ),
        ]
        for metric in ("euclidean", "cosine")
    ]
    rows.append(
        [
            f"smallest k-center portfolio within 1 point of the full pool <= "
            f"{PORTFOLIO_TARGET} (per pool: {', '.join(map(str, smallest))})",
            "{:.1f} ± {:.1f}".format(*_mean_se(smallest)),
            _verdict(np.mean(smallest) <= PORTFOLIO_TARGET),
        ]
    )
    lines = [
        "",
        "Geometry of each pool (its models embedded from all their train "
        "queries; portfolios by `KCenterSelector()` with its default metric, "
        "routed by LOCUS among the chosen models only):",
        "",
    ]
    lines += _table(["target", "figure", "verdict"], rows)
    ks = list(geometry[0]["k-center routing"])
    lines += [
        "",
        "k-center routing accuracy by portfolio size (mean over pools; "
        f"full pool {_cell([g['full pool routing'] for g in geometry])}):",
        "",
    ]
    lines += _table(
        ["k", *ks],
        [
            [
                "routing",
                *[
                    f"{np.mean([g['k-center routing'][k] for g in geometry]):.3f}"
                    for k in ks
                ],
            ]
        ],
    )
    return lines


def duplicates_section(result):
    duplicates = result["duplicates"]
    total, identical = duplicates["pairs"], duplicates["identical pairs"]
    lines = [
        "",
        f"Near-duplicates among all {duplicates['models']:,} models (each "
        f"embedded from its train queries; {duplicates['identical pairs']} pairs "
        "have identical train-query evaluations; disagreement on every query "
        "both have). Defaults: `find_duplicates` "
        f"{DUPLICATE_THRESHOLD:g}, `stable_duplicates` "
        f"{STABLE_DUPLICATE_THRESHOLD:g}.",
        "",
    ]
    rows = []
    for tool, by_threshold in duplicates.items():
        if not isinstance(by_threshold, dict):
            continue
        for threshold, f in by_threshold.items():
            median = f["median disagreement"]
            rows.append(
                [
                    f"`{tool.split(' ')[0]}`",
                    f"{float(threshold):g}",
                    f["flagged"],
                    f"{f['flagged'] / total:.5%}",
                    f"{f['identical pairs flagged']} of {identical}",
                    "" if median is None else f"{median:.3f}",
                    len(f["above 10%"]),
                    f["no common query"],
                ]
            )
    lines += _table(
        [
            "tool",
            "threshold",
            "pairs flagged",
            "of all pairs",
            "identical pairs",
            "median disagreement",
            "above 10%",
            "no query in common",
        ],
        rows,
    )
    default = duplicates["find_duplicates"][str(DUPLICATE_THRESHOLD)]
    if not default["above 10%"]:
        lines += [
            "",
            "`find_duplicates()` flags no pair that disagrees on more than "
            "10% of its common queries.",
        ]
    else:
        lines += [
            "",
            "Pairs `find_duplicates()` flags that disagree on more than "
            "10% of their common queries:",
            "",
        ]
        lines += _table(
            ["model", "model", "disagreement", "common queries", "accuracies"],
            [
                [
                    *p["models"],
                    p["disagreement"],
                    p["common queries"],
                    " / ".join(map(str, p["accuracy"])),
                ]
                for p in default["above 10%"]
            ],
        )
    for threshold, f in duplicates["find_duplicates"].items():
        if float(threshold) <= DUPLICATE_THRESHOLD or not f["above 10%"]:
            continue
        pairs = f["above 10%"]
        low = sum(max(p["accuracy"]) < 0.3 for p in pairs)
        gap = max(abs(p["accuracy"][0] - p["accuracy"][1]) for p in pairs)
        lines += [
            "",
            f"At {float(threshold):g}, {len(pairs)} flagged pairs disagree "
            f"on more than 10%: in {low} both models have a mean accuracy "
            f"below 0.3, and the two accuracies of a pair differ by at most "
            f"{gap:.3f}.",
        ]
        break
    return lines


def paired_section(result, others):
    """Each other run's LOCUS minus this run's, pool by pool (same pools, draws)."""
    rows = []
    for label, other in others:
        for method in other["pools"][0]["spread"]:
            if method not in result["pools"][0]["spread"]:
                continue
            for metric in ("correctness", "routing"):
                differences = _by_n(other, metric, method) - _by_n(
                    result, metric, method
                )
                cells = [
                    "{:+.3f} ± {:.3f}".format(*_mean_se(differences[:, i]))
                    for i in range(len(SIZES))
                ]
                rows.append([label, method, metric, *cells])
    lines = [
        "",
        "Other fits on the same pools and draws, minus this one (paired by pool):",
        "",
    ]
    header = ["fit", "method", "metric", *[f"n = {n}" for n in SIZES]]
    lines += _table(header, rows)
    for label, other in others:
        fit = other["fit"]
        lines += [
            "",
            f"{label}: `research/pools.py DATA_FOLDER {other.get('arguments', '')}` "
            f"at {other['commit']}; fitted at {fit.get('commit')} in "
            f"{fit.get('seconds', 0) / 60:.1f} min ({fit.get('epochs')} epochs, best "
            f"{fit.get('best_epoch')}).",
        ]
    return lines


def report(result, others=()):
    fit = result["fit"]
    lines = [
        BEGIN,
        f"## {len(result['pools'])} pools of unseen models, one onboarding fit",
        "",
        f"Written by `python -m research.pools DATA_FOLDER "
        f"{result.get('arguments', '')}` at commit {result['commit']} on "
        f"{result.get('date', '')}; the embedder was fitted at {fit.get('commit')} on "
        f"{fit.get('models')} models in {fit.get('seconds', 0) / 60:.1f} min "
        f"({fit.get('epochs')} epochs, best {fit.get('best_epoch')}) and measured in "
        f"{result['evaluation_seconds'] / 60:.1f} min on 2 CPU cores. "
        f"Protocol: the script's docstring; {result['draws']} draws of the n "
        "evaluations per pool; a cell is the mean over pools ± its standard error. "
        "The per-cluster tally is the label-free baseline of docs/research/tuning.md "
        "(8 k-means clusters of the training queries' encodings). The sections "
        "after this one come from the retired `benchmarks/openllm.py` (commit "
        "6c23a51), two pools with a fit "
        "each, at the commit and defaults their first paragraph names; they show "
        "what this one does not (the pool setting, sample efficiency, stability, "
        "fallbacks, training on partially observed models).",
    ]
    lines += targets_section(result)
    lines += geometry_section(result)
    lines += duplicates_section(result)
    lines += prediction_section(result)
    if others:
        lines += paired_section(result, others)
    return "\n".join([*lines, END]) + "\n"


def place_section(text, section):
    """``text`` with ``section`` in place of its marked one, or after its title."""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        return head + section.rstrip("\n") + rest.split(END, 1)[1]
    title, _, body = text.partition("\n")
    return f"{title}\n\n{section.rstrip()}\n\n{body.lstrip()}"


def write_report(path, section):
    """Put ``section`` into the results page at ``path``."""
    path = Path(path)
    path.write_text(place_section(path.read_text(), section))


ROUTER_PAGE = Path("docs/research/router-results.md")


def router_section(results):
    """LocusRouter's defaults, with and without query groups, over several seeds.

    ``results`` are ``research/pools.py --out`` files of one protocol at several
    seeds (each seed its own fit and its own pools). A cell is the mean over every
    (seed, pool) with its standard error; "paired" rows are a method minus the
    label tally it competes with, pool by pool.
    """
    first = results[0]
    methods = list(first["pools"][0]["correctness"])
    pools = [pool for result in results for pool in result["pools"]]
    merged = {"pools": pools}
    seeds = ", ".join(str(result["seed"]) for result in results)
    fits = "; ".join(
        f"seed {r['seed']}: {r['fit'].get('models')} models, "
        f"{r['fit'].get('seconds', 0) / 60:.1f} min at {r['fit'].get('commit')}"
        for r in results
    )
    command = first.get("arguments", "")
    for option, role in (("--seed", "S"), ("--cache", "CACHE"), ("--out", "FILE")):
        command = re.sub(rf"{option} \S+", f"{option} {role}", command)
    runs = ", ".join(dict.fromkeys(result["commit"] for result in results))
    dates = ", ".join(dict.fromkeys(result.get("date", "") for result in results))
    lines = [
        "# LocusRouter on pools of unseen models",
        "",
        f"Written by `python -m research.pools DATA_FOLDER {command}` "
        f"at seeds S = {seeds} (measured at commits {runs} on {dates}), then "
        "`--report-router` of those files. "
        f"Each seed fits its own embedder on every model outside its pools "
        f"({fits}) and draws its own {len(first['pools'])} pools of 112 unseen "
        f"fully observed models; {first['draws']} draw(s) of the n train-query "
        "evaluations per model; 269 test queries. Fit times are wall-clock on 2 "
        "CPU cores shared with other runs. A cell is the mean over all "
        f"{len(pools)} (seed, pool) pairs ± its standard error. 'LocusRouter "
        "(defaults)' is `LocusRouter(FrozenEstimator(embedder))` as it is "
        "(refine_steps=50); '+ subject groups' or '+ benchmark groups' passes the "
        "queries' subjects or benchmarks as `query_groups` to fit and predict, "
        "the labels the per-subject or per-benchmark tally uses.",
    ]
    for metric in ("correctness", "routing"):
        lines += ["", f"{metric.capitalize()} accuracy:", ""]
        lines += _table(
            ["method", *[f"n = {n}" for n in SIZES]],
            [
                [m, *[_cell(_by_n(merged, metric, m)[:, i]) for i in range(len(SIZES))]]
                for m in methods
            ],
        )
    pairs = [
        (m, tally)
        for m in methods
        for groups, tally in (("subject", LABELLED[0]), ("benchmark", LABELLED[1]))
        if m.endswith(f"{groups} groups") and tally in methods
    ]
    if pairs:
        lines += [
            "",
            "Paired by pool, the router with groups minus the tally of the "
            "same labels:",
            "",
        ]
        rows = []
        for method, tally in pairs:
            for metric in ("correctness", "routing"):
                rows.append(
                    [
                        f"{method} minus {tally}",
                        metric,
                        *[
                            "{:+.3f} ± {:.3f}".format(
                                *_paired(merged, metric, method, tally, i)
                            )
                            for i in range(len(SIZES))
                        ],
                    ]
                )
        lines += _table(["comparison", "metric", *[f"n = {n}" for n in SIZES]], rows)
    if len(results) > 1:
        lines += [
            "",
            "Spread between seeds (sd of each seed's mean over its pools):",
            "",
        ]
        rows = []
        for m in methods:
            for metric in ("correctness", "routing"):
                per_seed = np.array([_by_n(r, metric, m).mean(axis=0) for r in results])
                rows.append(
                    [m, metric, *[f"{v:.3f}" for v in per_seed.std(axis=0, ddof=1)]]
                )
        lines += _table(["method", "metric", *[f"n = {n}" for n in SIZES]], rows)
    return "\n".join(lines) + "\n"
