"""LOCUS over many disjoint pools of unseen models, from one onboarding fit.

Routing accuracy on 269 test queries moves by about 0.02 from one pool of 112
models to the next, so verdicts need many pools. Fitting one embedder per pool
costs 10-15 minutes on 2 CPU cores each; here one embedder serves them all:

1. ``--pools`` disjoint pools of 112 fully observed dense models are drawn
   (``random_state=seed``) from the data's 1,601 such models;
2. ``LocusEmbedder`` (defaults plus ``--set``, ``random_state=seed``) is fitted
   on the train-query evaluations of every *other* model, partially observed
   ones included, so that no pool model is seen in training (onboarding);
3. each pool is embedded by forward passes from n of its models' train-query
   evaluations (``--draws`` draws) and measured on the test queries.

A cell is the mean over pools with its standard error (sd / sqrt(pools)). The
pools share one fit, so the standard error covers the pool-to-pool spread and
not the spread between training runs (docs/research/tuning.md measured that one: about
0.004 in correctness, less than the pool-to-pool spread in routing).

Usage::

    python -m research.pools DATA_FOLDER [--seed 0] [--pools 8]
        [--draws 3] [--cache FOLDER] [--set name=value ...] [--out FILE]

``--cache`` keeps the fitted embedder as a model file (``sklocus.save``) keyed
by the seed, the pools and the settings, with a note of the commit that fitted
it, and reuses it on the next run.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import sys
import time
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
from sklearn.cluster import KMeans
from sklearn.frozen import FrozenEstimator

import sklocus
from benchmarks.provenance import commit
from research import baselines, openllm_data, pools_report
from research.variants import VARIANTS
from sklocus import KCenterSelector, LocusEmbedder, LocusRouter
from sklocus.cli import parse_settings
from sklocus.evaluations import subsample, to_matrix
from sklocus.geometry import (
    DUPLICATE_THRESHOLD,
    STABLE_DUPLICATE_THRESHOLD,
    disagreement_correlation,
    find_duplicates,
    stable_duplicates,
)
from sklocus.metrics import correctness_accuracy, routing_accuracy

POOL_SIZE = openllm_data.POOL_SIZE
ROUTER = "LocusRouter (defaults)"
SIZES = pools_report.SIZES
PORTFOLIO_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 75, 112)
CLUSTERS = 8
# Thresholds of the duplicate tables: around the defaults, in LocusEmbedder units.
DUPLICATE_THRESHOLDS = tuple(
    sorted({3e-5, DUPLICATE_THRESHOLD, STABLE_DUPLICATE_THRESHOLD, 1e-3, 3e-3})
)
LOCUS, LABEL_FREE, LABELLED = (
    pools_report.LOCUS,
    pools_report.LABEL_FREE,
    pools_report.LABELLED,
)


def draw_pools(data, seed, count):
    """``count`` disjoint pools of fully observed dense models (sorted indices)."""
    candidates = np.flatnonzero(data.fully_observed & data.dense)
    if count * POOL_SIZE > len(candidates):
        raise SystemExit(
            f"--pools {count}: {count * POOL_SIZE} models needed, "
            f"{len(candidates)} fully observed dense models exist"
        )
    order = np.random.default_rng(seed).permutation(candidates)
    return [np.sort(order[i * POOL_SIZE : (i + 1) * POOL_SIZE]) for i in range(count)]


def fitted_embedder(data, training, seed, variant, overrides, cache, code):
    """The onboarding embedder, from ``cache`` when it holds this very fit.

    A variant's custom network is code, which a model file does not hold, so
    variants are cached with joblib (the cache is this script's own).
    """
    key = json.dumps(
        {
            "seed": seed,
            "training": training.tolist(),
            "variant": variant,
            "set": overrides,
        },
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    path = note = None
    save, load = (joblib.dump, joblib.load) if variant else (sklocus.save, sklocus.load)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        path = cache / f"embedder-{variant or 'defaults'}-{digest}.model"
        note = path.with_suffix(".json")
        if path.exists() and note.exists():
            fit = json.loads(note.read_text())
            print(f"embedder from {path} (fitted at {fit['commit']})", flush=True)
            return load(path), fit
    start = time.perf_counter()
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        random_state=seed,
        verbose=1,
        **VARIANTS.get(variant, {}),
        **overrides,
    ).fit(data.sets(training))
    best = min(embedder.history_, key=lambda row: row["valid_loss"])
    fit = {
        "commit": code,
        "date": time.strftime("%Y-%m-%d"),
        "models": int(len(data.sets(training))),
        "seconds": round(time.perf_counter() - start, 1),
        "epochs": len(embedder.history_),
        "best_epoch": int(best["epoch"]),
        "variant": variant,
        "set": {name: repr(value) for name, value in overrides.items()},
    }
    print(f"fit: {fit}", flush=True)
    if path is not None:
        save(embedder.set_params(verbose=0), path)
        note.write_text(json.dumps(fit, indent=1) + "\n")
    return embedder, fit


class Baselines:
    """The two-pool protocol's baselines and the cluster tally, fitted once."""

    def __init__(self, data, training, seed):
        self.data = data
        self.factor_models = {}
        for kind in ("mf", "irt"):
            model, losses = baselines.tuned_factor_model(
                kind, data.train_matrix[:, training], data.train_vectors, seed
            )
            print(
                f"{kind} item penalty {model.item_decay} (held-out {losses})",
                flush=True,
            )
            self.factor_models[kind] = model
        kmeans = KMeans(CLUSTERS, n_init=4, random_state=seed).fit(data.train_vectors)
        self.groups = {
            LABELLED[0]: (data.train_subjects, data.test_subjects),
            LABELLED[1]: (data.train_benchmarks, data.test_benchmarks),
            LABEL_FREE[-1]: (kmeans.labels_, kmeans.predict(data.test_vectors)),
        }

    def predict(self, drawn):
        data = self.data
        observed, _ = to_matrix(drawn, queries=data.train_ids)
        mf, irt = self.factor_models["mf"], self.factor_models["irt"]
        p = {
            LABEL_FREE[0]: baselines.overall_accuracy(observed, len(data.test_ids)),
            LABEL_FREE[1]: baselines.nearest_queries(
                observed, data.train_vectors, data.test_vectors
            ),
            LABEL_FREE[2]: mf.predict(observed, data.train_vectors, data.test_vectors),
            LABEL_FREE[3]: irt.predict(observed, data.train_vectors, data.test_vectors),
        }
        for name, (train_groups, test_groups) in self.groups.items():
            p[name] = baselines.per_subject_accuracy(
                observed, train_groups, test_groups
            )
        return p


def tallies(data):
    """The baselines that need no fit: overall accuracy and the labelled tallies.

    What ``--locus-only`` still measures, so that LocusRouter given query groups
    has the tallies that use the same labels beside it.
    """

    def predict(drawn):
        observed, _ = to_matrix(drawn, queries=data.train_ids)
        return {
            LABEL_FREE[0]: baselines.overall_accuracy(observed, len(data.test_ids)),
            LABELLED[0]: baselines.per_subject_accuracy(
                observed, data.train_subjects, data.test_subjects
            ),
            LABELLED[1]: baselines.per_subject_accuracy(
                observed, data.train_benchmarks, data.test_benchmarks
            ),
        }

    return predict


def profile_spread(probabilities):
    """Mean over models of the sd of a model's logits over the test queries."""
    p = np.clip(probabilities, 1e-6, 1 - 1e-6)
    return float(np.log(p / (1 - p)).std(axis=0).mean())


def router_predictions(data, embedder, drawn, routers):
    """P(correct) of ``LocusRouter`` (its defaults) over the drawn sets.

    ``routers`` maps a method name to ``(groups, shrinkage)``: ``groups`` is
    None (no query groups), "subject" or "benchmark", the labels the router
    is given for the train and test queries.
    """
    observed, _ = to_matrix(drawn, queries=data.train_ids)
    kept = ~np.isnan(observed).all(axis=1)
    queries = [q for q, keep in zip(data.train_ids, kept) if keep]
    Y = pd.DataFrame(observed[kept])
    labels = {
        "subject": (data.train_subjects, data.test_subjects),
        "benchmark": (data.train_benchmarks, data.test_benchmarks),
    }
    out = {}
    for name, (groups, shrinkage) in routers.items():
        router = LocusRouter(FrozenEstimator(embedder), group_shrinkage=shrinkage)
        if groups is None:
            router.fit(queries, Y)
            p = router.predict_correctness(data.test_ids)
        else:
            train_groups, test_groups = labels[groups]
            router.fit(queries, Y, query_groups=train_groups[kept])
            p = router.predict_correctness(data.test_ids, query_groups=test_groups)
        out[name] = p
    return out


def prediction_figures(data, embedders, fitted_baselines, pool, seed, draws, routers):
    """{metric: {method: [value per n]}} for one pool, each the mean over draws."""
    cheap = tallies(data)
    truth = data.test_matrix[:, pool]
    sets = data.sets(pool)
    figures = {}
    for n in SIZES:
        values = {}
        for state in openllm_data.draw_states(seed, draws):
            drawn = subsample(sets, n, random_state=state)
            p = fitted_baselines.predict(drawn) if fitted_baselines else cheap(drawn)
            for name, embedder in embedders.items():
                p[name] = embedder.predict_correctness(
                    embedder.transform(drawn), data.test_ids
                )
                values.setdefault(("spread", name), []).append(profile_spread(p[name]))
            p.update(router_predictions(data, embedders[LOCUS], drawn, routers))
            for method, probabilities in p.items():
                values.setdefault(("correctness", method), []).append(
                    correctness_accuracy(truth, probabilities)
                )
                values.setdefault(("routing", method), []).append(
                    routing_accuracy(truth, probabilities)
                )
        for (metric, method), by_draw in values.items():
            figures.setdefault(metric, {}).setdefault(method, []).append(
                float(np.mean(by_draw))
            )
    return figures


def portfolio_routing(truth, probabilities, selected):
    """Routing accuracy when only the ``selected`` models may be chosen."""
    masked = np.full_like(probabilities, -np.inf)
    masked[:, selected] = probabilities[:, selected]
    return routing_accuracy(truth, masked)


def geometry_figures(data, embedder, pool):
    """Distance-disagreement correlations and k-center portfolios of one pool.

    The pool's models are embedded from all their train queries; portfolios
    are chosen by ``KCenterSelector`` with its default metric and routed by
    LOCUS's predictions among the chosen models only.
    """
    z = embedder.transform(data.sets(pool))
    truth = data.test_matrix[:, pool]
    probabilities = embedder.predict_correctness(z, data.test_ids)
    full = routing_accuracy(truth, probabilities)
    portfolios = {
        k: portfolio_routing(
            truth, probabilities, KCenterSelector(k).fit(z).selected_indices_
        )
        for k in PORTFOLIO_SIZES
    }
    within = [k for k, value in portfolios.items() if value >= full - 0.01]
    return {
        "pearson": {
            metric: disagreement_correlation(z, truth, metric=metric)["pearson"]
            for metric in ("cosine", "euclidean")
        },
        "full pool routing": full,
        "k-center routing": portfolios,
        "smallest k-center within 1 point": min(within),
    }


def disagreement_rates(matrix, pairs):
    """Rate at which two models' scores differ on the queries both have.

    ``matrix`` has a row per model. NaN for a pair with no query in common.
    """
    first, second = matrix[pairs[:, 0]], matrix[pairs[:, 1]]
    both = ~np.isnan(first) & ~np.isnan(second)
    differ = ((first >= 0.5) != (second >= 0.5)) & both
    common = both.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(common > 0, differ.sum(axis=1) / common, np.nan), common


def flagged_figures(data, models, matrix, identical, pairs):
    """What a set of flagged pairs (rows of ``models``) holds."""
    rates, common = disagreement_rates(matrix, pairs)
    found = {(min(a, b), max(a, b)) for a, b in pairs.tolist()}
    over = np.flatnonzero(rates > 0.10)
    return {
        "flagged": len(pairs),
        "identical pairs flagged": len(identical & found),
        "no common query": int((common == 0).sum()),
        "median disagreement": float(np.nanmedian(rates)) if len(pairs) else None,
        "above 10%": [
            {
                "models": [data.names[models[a]] for a in pairs[i]],
                "disagreement": round(float(rates[i]), 3),
                "common queries": int(common[i]),
                "accuracy": [round(float(np.nanmean(matrix[a])), 3) for a in pairs[i]],
            }
            for i in over
        ],
    }


def _pairs(frame):
    return frame[["first", "second"]].to_numpy(dtype=np.int64).reshape(-1, 2)


def duplicate_figures(data, embedder, seed):
    """``find_duplicates`` and ``stable_duplicates`` at their defaults on every model.

    Each model is embedded from its train queries; disagreement is measured on
    every query the two models share, train and test.
    """
    models = np.array([i for i, s in enumerate(data.train_sets) if s])
    sets = [data.train_sets[i] for i in models]
    # A row per model, train queries then test queries, as disagreement_rates reads.
    matrix = np.concatenate([data.train_matrix, data.test_matrix])[:, models].T
    by_content = {}
    for row, evaluations in enumerate(sets):
        by_content.setdefault(frozenset(evaluations.items()), []).append(row)
    identical = {
        (a, b)
        for rows in by_content.values()
        for x, a in enumerate(rows)
        for b in rows[x + 1 :]
    }
    z = embedder.transform(sets)
    result = {
        "models": len(models),
        "pairs": len(models) * (len(models) - 1) // 2,
        "identical pairs": len(identical),
        "find_duplicates": {},
        "stable_duplicates (n_evals=128)": {},
    }
    # Each tool runs once at the loosest threshold; tighter ones filter its pairs.
    found = find_duplicates(z, max(DUPLICATE_THRESHOLDS))
    for threshold in DUPLICATE_THRESHOLDS:
        pairs = _pairs(found[found["distance"] < threshold])
        result["find_duplicates"][threshold] = flagged_figures(
            data, models, matrix, identical, pairs
        )
    stable = stable_duplicates(
        embedder, sets, 128, threshold=max(DUPLICATE_THRESHOLDS), random_state=seed
    )
    for threshold in DUPLICATE_THRESHOLDS:
        pairs = _pairs(stable[stable["distance"] < threshold])
        result["stable_duplicates (n_evals=128)"][threshold] = flagged_figures(
            data, models, matrix, identical, pairs
        )
    return result


def _steps_and_penalty(text):
    steps, _, penalty = text.partition(":")
    try:
        return int(steps), float(penalty)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected STEPS:PENALTY, such as 50:0.1"
        ) from None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", help="the Open LLM data folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pools", type=int, default=8)
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--set", nargs="*", default=[], metavar="name=value")
    parser.add_argument(
        "--variant",
        choices=sorted(VARIANTS),
        help="a network or loss of research/variants.py",
    )
    parser.add_argument(
        "--refine",
        nargs="*",
        default=[],
        type=_steps_and_penalty,
        metavar="STEPS:PENALTY",
        help="also measure the embedder with this test-time refinement",
    )
    parser.add_argument(
        "--router",
        nargs="*",
        default=["none", "subject", "benchmark"],
        choices=["none", "subject", "benchmark"],
        help="also measure LocusRouter's defaults, without query groups (none) "
        "or given the queries' subjects or benchmarks",
    )
    parser.add_argument(
        "--group-shrinkage",
        nargs="*",
        type=float,
        default=[LocusRouter().group_shrinkage],
        help="LocusRouter's group_shrinkage values to measure with query groups",
    )
    parser.add_argument("--out", help="JSON file of every figure")
    parser.add_argument(
        "--locus-only",
        action="store_true",
        help="measure LOCUS's predictions only (no baselines, geometry or "
        "duplicates): enough to compare a variant with a full run, pool by pool",
    )
    parser.add_argument(
        "--no-geometry",
        action="store_true",
        help="measure predictions only, LOCUS's and the baselines' (no geometry "
        "or duplicates)",
    )
    parser.add_argument(
        "--embedder",
        type=Path,
        help="measure this saved embedder (fitted on the same training models) "
        "instead of fitting one",
    )
    parser.add_argument(
        "--report",
        type=Path,
        metavar="JSON",
        help="write the markdown section of this --out file into --markdown",
    )
    parser.add_argument(
        "--against",
        nargs=2,
        action="append",
        default=[],
        metavar=("JSON", "LABEL"),
        help="with --report: another run on the same pools, compared pool by pool",
    )
    parser.add_argument(
        "--markdown", type=Path, default=Path("docs/research/results.md")
    )
    parser.add_argument(
        "--report-router",
        nargs="+",
        type=Path,
        metavar="JSON",
        help="write docs/research/router-results.md from these --out files "
        "(one per seed)",
    )
    arguments = parser.parse_args()
    if arguments.report_router:
        results = [json.loads(path.read_text()) for path in arguments.report_router]
        pools_report.ROUTER_PAGE.write_text(pools_report.router_section(results))
        return
    if arguments.report:
        result = json.loads(arguments.report.read_text())
        others = [
            (label, json.loads(Path(path).read_text()))
            for path, label in arguments.against
        ]
        text = pools_report.report(result, others)
        pools_report.write_report(arguments.markdown, text)
        return
    if arguments.data is None:
        parser.error("DATA_FOLDER is needed to measure (only --report goes without)")
    overrides = parse_settings(arguments.set)
    # The code that measures is the code checked out now, whatever happens to the
    # tree during the run.
    code = commit()
    data = openllm_data.OpenLLM(arguments.data, "all-mpnet-base-v2")
    pools = draw_pools(data, arguments.seed, arguments.pools)
    training = np.setdiff1d(np.arange(len(data.names)), np.concatenate(pools))
    if arguments.embedder:
        embedder = sklocus.load(arguments.embedder)
        note = arguments.embedder.with_suffix(".json")
        fit = json.loads(note.read_text()) if note.exists() else {}
        fit["file"] = arguments.embedder.name
    else:
        embedder, fit = fitted_embedder(
            data,
            training,
            arguments.seed,
            arguments.variant,
            overrides,
            arguments.cache,
            code,
        )
    embedders = {LOCUS: embedder}
    for steps, penalty in arguments.refine:
        refined = copy.deepcopy(embedder).set_params(
            refine_steps=steps, refine_penalty=penalty
        )
        embedders[f"LOCUS, refined ({steps} steps, penalty {penalty:g})"] = refined
    routers = {}
    for groups in arguments.router:
        for shrinkage in arguments.group_shrinkage:
            name = ROUTER if groups == "none" else f"{ROUTER} + {groups} groups"
            if len(arguments.group_shrinkage) > 1 and groups != "none":
                name += f" (shrinkage {shrinkage:g})"
            routers[name] = (None if groups == "none" else groups, shrinkage)
    start = time.perf_counter()
    fitted_baselines = None
    if not arguments.locus_only:
        fitted_baselines = Baselines(data, training, arguments.seed)
    per_pool = []
    for number, pool in enumerate(pools):
        figures = prediction_figures(
            data,
            embedders,
            fitted_baselines,
            pool,
            arguments.seed,
            arguments.draws,
            routers,
        )
        if not (arguments.locus_only or arguments.no_geometry):
            figures["geometry"] = geometry_figures(data, embedder, pool)
        per_pool.append(figures)
        print(f"pool {number}: {json.dumps(figures.get('geometry'))}", flush=True)
    duplicates = None
    if not (arguments.locus_only or arguments.no_geometry):
        duplicates = duplicate_figures(data, embedder, arguments.seed)
    result = {
        "fit": fit,
        "seed": arguments.seed,
        "draws": arguments.draws,
        "evaluation_seconds": round(time.perf_counter() - start),
        "commit": code,
        "date": time.strftime("%Y-%m-%d"),
        "arguments": " ".join(sys.argv[2:]),
        "pools": per_pool,
        "duplicates": duplicates,
    }
    if arguments.out:
        Path(arguments.out).write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
