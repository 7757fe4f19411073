"""How much routing there is to win on the Open LLM pools, without fitting LOCUS.

Routing among a pool of 112 models is decided among its few strongest, on 269
test queries; this script measures, over many pools and with cheap baselines
only, how far apart the reachable routing accuracies are and how much they
move from pool to pool. It answers two questions about the bar of
``benchmarks/openllm.py`` (beat each label-free baseline "beyond the spread
across seeds"):

- how much better than the best single model routing can get with subject
  knowledge: per-subject and per-benchmark accuracy (both use labels LOCUS
  never sees) from n train evaluations and from all 806; the same tally over
  8 k-means clusters of the training queries' encodings, which needs no
  labels; and, as a ceiling no method reaches, per-subject accuracy measured
  on the test queries themselves;
- whether those tallies would themselves pass that bar against each model's
  overall accuracy: their paired differences, mean and sd over pools;
- how much of a test query's benchmark its encoding still tells under the
  training noise of ``LocusEmbedder`` (``query_noise``), added in every
  direction or kept off the leading principal directions of the training
  queries (``noise_free_components``): the accuracy of identifying the
  benchmark by the nearest benchmark centroid of the training queries.

With ``--locus LINES.jsonl`` (lines of ``openllm_variants.py``), it also
places LOCUS's routing (each pool's line of ``--variant``) among them, paired
by pool on the same draws.

Each pool is ``OpenLLM.draw_pool(seed)``; figures at n are the mean over
``--draws`` draws of the n evaluations (``openllm.draw_states``), as in
openllm.py. Run::

    python benchmarks/openllm_headroom.py DATA_FOLDER --seeds 0 1 2 3 4 5 6 7
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import openllm_baselines as baselines
from openllm import OpenLLM, draw_states
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from sklocus.evaluations import subsample, to_matrix
from sklocus.metrics import routing_accuracy

SIZES = (64, 128, 256, 512)
ALL = 806
LABELS = ("per-subject accuracy (labels)", "per-benchmark accuracy (labels)")
CLUSTERS = 8
GROUPINGS = (*LABELS, f"per-cluster accuracy ({CLUSTERS} k-means clusters, no labels)")


def pool_figures(data, seed, draws, groups):
    """Routing accuracies of one pool: {name: value}, names ending in ``@n``."""
    pool = data.draw_pool(seed)
    truth = data.test_matrix[pool]
    n_test = len(data.test_ids)
    figures = {
        "oracle (any model right)": float(np.nanmax(truth, axis=0).mean()),
        "best single model on the test queries": float(np.nanmean(truth, 1).max()),
        "per-subject accuracy on the test queries": routing_accuracy(
            truth, baselines.per_subject_accuracy(truth, *[data.test_subjects] * 2)
        ),
    }
    for n in (*SIZES, ALL):
        states = draw_states(seed, draws) if n < ALL else [seed]
        routed = {}
        for state in states:
            drawn = subsample(data.sets(pool), n, random_state=state)
            observed, _ = to_matrix(drawn, queries=data.train_ids)
            routed.setdefault("overall accuracy", []).append(
                routing_accuracy(truth, baselines.overall_accuracy(observed, n_test))
            )
            for label, (train_groups, test_groups) in zip(GROUPINGS, groups):
                p = baselines.per_subject_accuracy(observed, train_groups, test_groups)
                routed.setdefault(label, []).append(routing_accuracy(truth, p))
        for name, values in routed.items():
            figures[f"{name}@{n}"] = float(np.mean(values))
    return figures


def benchmark_identification(data, train_groups, test_groups, noise, kept, seed=0):
    """Nearest-centroid accuracy of a noisy test encoding's benchmark."""
    centroids = {
        g: data.train_vectors[train_groups == g].mean(0) for g in set(train_groups)
    }
    names = np.array(list(centroids))
    stacked = np.stack([centroids[g] for g in names])
    rng = np.random.default_rng(seed)
    blur = rng.standard_normal(data.test_vectors.shape)
    if kept:  # project the noise off the leading principal directions
        centred = data.train_vectors - data.train_vectors.mean(axis=0)
        directions = np.linalg.svd(centred, full_matrices=False)[2][:kept]
        blur -= (blur @ directions.T) @ directions
    noisy = data.test_vectors + noise * blur
    distance = ((noisy[:, None, :] - stacked[None]) ** 2).sum(-1)
    return float((names[distance.argmin(1)] == test_groups).mean())


def report(per_pool):
    """Markdown: each figure's mean and sd over pools, then the paired bar test."""
    names = list(per_pool[0])
    table = np.array([[figures[name] for name in names] for figures in per_pool])
    lines = [
        f"Routing accuracy over {len(per_pool)} pools (mean, sd across pools):",
        "",
        "| figure | mean | sd |",
        "|---|---|---|",
    ]
    for name, column in zip(names, table.T):
        label = name.replace("@", ", n = ")
        lines.append(f"| {label} | {column.mean():.3f} | {column.std(ddof=1):.3f} |")
    lines += [
        "",
        "Each grouped tally minus overall accuracy, paired by pool (the bar's"
        " test: 'beyond the spread' when the mean exceeds the sd):",
        "",
        "| baseline | n | mean | sd | beyond the spread |",
        "|---|---|---|---|---|",
    ]
    for label in GROUPINGS:
        for n in (*SIZES, ALL):
            gap = np.array(
                [f[f"{label}@{n}"] - f[f"overall accuracy@{n}"] for f in per_pool]
            )
            mean, sd = gap.mean(), gap.std(ddof=1)
            beyond = "yes" if mean > sd else "no"
            lines.append(f"| {label} | {n} | {mean:+.3f} | {sd:.3f} | {beyond} |")
    return "\n".join(lines)


def locus_report(per_pool, seeds, variant_lines, variant):
    """Markdown: LOCUS's routing minus each baseline's, paired by pool."""
    rows = {}
    for line in variant_lines:
        if line["variant"] == variant and line["seed"] in seeds:
            rows[line["seed"]] = line["routing"]
    if not rows:
        raise SystemExit(f"no line of variant {variant!r} for seeds {seeds}")
    pools = sorted(rows)
    lines = [
        f"LOCUS ({variant}, {len(pools)} pools: seeds {pools}) routing minus each"
        " baseline's, paired by pool (mean, sd):",
        "",
        "| n | LOCUS | minus overall accuracy | minus per-subject (labels) "
        "| minus per-benchmark (labels) | minus per-cluster (no labels) |",
        "|---|---|---|---|---|---|",
    ]
    by_seed = dict(zip(seeds, per_pool))
    for column, n in enumerate(SIZES):
        locus = np.array([rows[seed][column] for seed in pools])
        cells = [f"{locus.mean():.3f}"]
        for name in ("overall accuracy", *GROUPINGS):
            gap = locus - np.array([by_seed[seed][f"{name}@{n}"] for seed in pools])
            spread = gap.std(ddof=1) if len(gap) > 1 else float("nan")
            cells.append(f"{gap.mean():+.3f} ({spread:.3f})")
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", help="the openllm data folder")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    parser.add_argument("--draws", type=int, default=4)
    parser.add_argument("--encoder", default="all-mpnet-base-v2")
    parser.add_argument("--locus", help="JSON lines of openllm_variants.py")
    parser.add_argument("--variant", default="defaults")
    args = parser.parse_args()
    data = OpenLLM(args.folder, args.encoder)
    kmeans = KMeans(CLUSTERS, n_init=4, random_state=0).fit(data.train_vectors)
    groups = (
        (data.train_subjects, data.test_subjects),
        (data.train_benchmarks, data.test_benchmarks),
        (kmeans.labels_, kmeans.predict(data.test_vectors)),
    )
    agreement = adjusted_rand_score(groups[1][0], groups[2][0])
    print(f"{CLUSTERS} k-means clusters against the 5 benchmarks: ARI {agreement:.2f}")
    per_pool = []
    for seed in args.seeds:
        per_pool.append(pool_figures(data, seed, args.draws, groups))
        print(f"pool {seed} done", flush=True)
    print(report(per_pool))
    if args.locus:
        with open(args.locus) as handle:
            lines = [json.loads(line) for line in handle if line.strip()]
        print()
        print(locus_report(per_pool, args.seeds, lines, args.variant))
    print(
        "\nBenchmark of a test query identified by the nearest training centroid,"
        " under training noise:\n\n| noise per coordinate | in every direction "
        "| off the 16 leading directions |\n|---|---|---|"
    )
    for noise in (0.0, 0.05, 0.10, 0.20):
        every, spared = (
            benchmark_identification(data, *groups[1], noise, kept) for kept in (0, 16)
        )
        print(f"| {noise:.2f} | {every:.3f} | {spared:.3f} |")


if __name__ == "__main__":
    main()
