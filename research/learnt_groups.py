"""Groups learnt from the queries' text, on the 8-pool protocol (issue 54).

Each pool of :mod:`research.pools` is embedded by ``LocusRouter``'s defaults
from n evaluations per model; on top of LOCUS's logits this script measures
per-model, per-group offsets (:mod:`sklocus._groups`) whose groups are

- the queries' benchmarks, given at fit and at routing time (labels);
- the benchmarks predicted from the test queries' encodings by a logistic
  regression fitted on the pool's evaluated queries (labels at fit only), as
  soft memberships;
- k-means clusters of the pool's evaluated queries (no labels), k fixed or
  chosen on the pool's held-out evaluations (each model embedded from one half
  of its evaluations, offsets fitted on that half and scored on the other);

beside the per-benchmark and per-cluster tallies and a per-model logistic
regression on the encodings. Usage::

    python -m research.learnt_groups DATA_FOLDER --cache CACHE --seed S --out FILE
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from sklearn.cluster import KMeans
from sklearn.frozen import FrozenEstimator
from sklearn.linear_model import LogisticRegression

from benchmarks.provenance import commit
from research import baselines, openllm_data
from research.pools import draw_pools, fitted_embedder
from sklocus import LocusRouter
from sklocus._groups import fit_group_offsets, logits
from sklocus._router._locus import Locus
from sklocus.evaluations import subsample, to_matrix
from sklocus.metrics import correctness_accuracy, routing_accuracy

SIZES = (64, 128, 256, 512)
DEFAULT = "LocusRouter (defaults: clusters by held-out loss)"
LEARNT = "LocusRouter + benchmarks at fit, told from the text"
GIVEN = "LocusRouter + benchmarks at fit and routing (labels)"
BEFORE = "LocusRouter, query_clusters=None (the defaults before)"
CLUSTER_GRID = (2, 4, 8, 16, 32, 60)
SHRINKAGE = 3.0
SHRINKAGES = (0.3, 1.0, 3.0, 10.0, 30.0)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def soft_offsets(base, membership, offsets):
    """LOCUS's logits plus each query's membership-weighted offsets."""
    return base + membership @ offsets.T


def one_hot(codes, n):
    out = np.zeros((len(codes), n))
    out[np.arange(len(codes)), codes] = 1.0
    return out


def log_loss(logit, y):
    p = np.clip(sigmoid(logit), 1e-6, 1 - 1e-6)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())


def listwise_loss(logit, scores, mask):
    """Mean over queries of -log softmax mass on the models that answered.

    Among each query's models where ``mask`` holds, for queries with both a right
    and a wrong answer among them.
    """
    z = np.where(mask, logit, -np.inf)
    z = z - z.max(axis=1, keepdims=True)
    e = np.where(mask, np.exp(z), 0.0)
    right = np.where(mask, np.nan_to_num(scores), 0.0)
    mass = (e * right).sum(axis=1) / e.sum(axis=1)
    n_right = right.sum(axis=1)
    useful = (n_right > 0) & (n_right < mask.sum(axis=1))
    return float(-np.log(np.clip(mass[useful], 1e-12, 1)).mean())


def held_out_loss(half_logits, scores, half, labels, shrinkage):
    """Losses of offsets fitted on one half of each model's evaluations, on the other.

    Returns (log loss, listwise loss).
    """
    total, count, listwise = 0.0, 0, 0.0
    for h in (0, 1):
        train = np.where(half == h, scores, np.nan)
        test = (half == 1 - h) & ~np.isnan(scores)
        if labels is None:
            shifted = half_logits[h]
        else:
            groups, offsets = fit_group_offsets(
                half_logits[h], train, labels, shrinkage
            )
            codes = {g: j for j, g in enumerate(groups)}
            member = np.zeros((len(labels), len(groups)))
            for i, g in enumerate(labels):
                if g in codes:
                    member[i, codes[g]] = 1
            shifted = soft_offsets(half_logits[h], member, offsets)
        rows, cols = np.nonzero(test)
        total += log_loss(shifted[rows, cols], scores[rows, cols]) * len(rows)
        count += len(rows)
        listwise += listwise_loss(shifted, scores, test) / 2
    return total / count, listwise


def cluster_tally(observed, train_codes, test_codes):
    return baselines.per_subject_accuracy(observed, train_codes, test_codes)


def tally_held_out_loss(observed, codes):
    """Held-out log loss of a per-cluster tally: half the queries predict the rest."""
    rng = np.random.default_rng(0)
    fold = rng.integers(0, 2, observed.shape[1])
    total = 0.0
    count = 0
    for f in (0, 1):
        train = np.where(fold == f, observed, np.nan)
        p = baselines.per_subject_accuracy(train, codes, codes)
        cols = fold != f
        o = observed[:, cols]
        q = np.clip(p[:, cols], 0.02, 0.98)
        seen = ~np.isnan(o)
        total += float(
            -(o[seen] * np.log(q[seen]) + (1 - o[seen]) * np.log(1 - q[seen])).sum()
        )
        count += int(seen.sum())
    return total / count


def per_model_logistic(observed, train_vectors, test_vectors, C=1.0):
    out = np.empty((len(observed), len(test_vectors)))
    for m, row in enumerate(observed):
        seen = ~np.isnan(row)
        y = row[seen] > 0.5
        if y.all() or not y.any():
            out[m] = y.mean()
            continue
        model = LogisticRegression(C=C, max_iter=200).fit(train_vectors[seen], y)
        out[m] = model.predict_proba(test_vectors)[:, 1]
    return out


def measure_pool(data, embedder, mf, pool, seed, n, figures):
    truth = data.test_matrix[pool]
    drawn = subsample(data.sets(pool), n, random_state=seed)
    observed, _ = to_matrix(drawn, queries=data.train_ids)
    kept = ~np.isnan(observed).all(axis=0)
    queries = np.array([q for q, k in zip(data.train_ids, kept) if k], dtype=object)
    scores = observed[:, kept].T  # (queries, models)
    vectors = data.train_vectors[kept]
    benchmarks = data.train_benchmarks[kept]
    frozen = FrozenEstimator(embedder)
    p = {}
    start = time.perf_counter()
    default = LocusRouter(frozen).fit(list(queries), scores)
    figures.setdefault("default fit seconds", []).append(time.perf_counter() - start)
    p[DEFAULT] = default.predict_correctness(data.test_ids)
    figures.setdefault("default groups", []).append(
        0 if default.groups_ is None else len(default.groups_)
    )
    labelled = LocusRouter(frozen).fit(list(queries), scores, query_groups=benchmarks)
    p[LEARNT] = labelled.predict_correctness(data.test_ids)
    p[GIVEN] = labelled.predict_correctness(data.test_ids, data.test_benchmarks)
    router = LocusRouter(frozen, query_clusters=None).fit(list(queries), scores)
    base_test = logits(router.predict_correctness(data.test_ids))
    base_train = logits(router.predict_correctness(list(queries)))
    p[BEFORE] = sigmoid(base_test)
    # Labels at fit and routing.
    groups, offsets = fit_group_offsets(base_train, scores, benchmarks, SHRINKAGE)
    codes = {g: j for j, g in enumerate(groups)}
    given = one_hot(np.array([codes[b] for b in data.test_benchmarks]), len(groups))
    p["+ benchmark groups (labels)"] = sigmoid(soft_offsets(base_test, given, offsets))
    # Labels at fit only: predicted benchmarks.
    classifier = LogisticRegression(C=10.0, max_iter=1000).fit(vectors, benchmarks)
    proba = classifier.predict_proba(data.test_vectors)
    order = [codes[c] for c in classifier.classes_]
    member = np.zeros((len(data.test_ids), len(groups)))
    member[:, order] = proba
    p["+ predicted benchmarks (soft)"] = sigmoid(
        soft_offsets(base_test, member, offsets)
    )
    hard = one_hot(member.argmax(axis=1), len(groups))
    p["+ predicted benchmarks (hard)"] = sigmoid(soft_offsets(base_test, hard, offsets))
    figures.setdefault("benchmark accuracy", []).append(
        float((classifier.predict(data.test_vectors) == data.test_benchmarks).mean())
    )
    # Held-out halves for choosing the groups and the shrinkage.
    locus = Locus(router.embedder_, router.refine_steps)
    half, halves = locus.half_embeddings(
        list(queries), scores, router.embeddings_.shape[1]
    )
    half_logits = [logits(locus.probabilities(z, list(queries))) for z in halves]
    losses = {("none", 0): held_out_loss(half_logits, scores, half, None, 1.0)}
    clusterings = {}
    tally_losses = {}
    for k in CLUSTER_GRID:
        if k >= len(queries):
            continue
        km = KMeans(k, n_init=4, random_state=seed).fit(vectors)
        clusterings[k] = km
        tally_losses[k] = tally_held_out_loss(observed[:, kept], km.labels_)
    for shrinkage in SHRINKAGES:
        for k, km in clusterings.items():
            losses[(k, shrinkage)] = held_out_loss(
                half_logits, scores, half, km.labels_.astype(object), shrinkage
            )
        losses[("benchmarks", shrinkage)] = held_out_loss(
            half_logits, scores, half, benchmarks.astype(object), shrinkage
        )
    figures.setdefault("held-out losses", []).append(
        {f"{k}/{s}": [round(v, 5) for v in loss] for (k, s), loss in losses.items()}
    )

    def clustered(k, shrinkage):
        km = clusterings[k]
        labels = km.labels_.astype(object)
        g, off = fit_group_offsets(base_train, scores, labels, shrinkage)
        col = {c: j for j, c in enumerate(g)}
        test = one_hot(
            np.array([col[c] for c in km.predict(data.test_vectors)]), len(g)
        )
        return sigmoid(soft_offsets(base_test, test, off))

    def labelled(shrinkage):
        _, off = fit_group_offsets(base_train, scores, benchmarks, shrinkage)
        return sigmoid(soft_offsets(base_test, member, off))

    for k in (8, 32):
        p[f"+ clusters (k={k})"] = clustered(k, SHRINKAGE)
    for criterion, index in (("log loss", 0), ("listwise", 1)):
        label_free = [key for key in losses if key[0] != "benchmarks"]
        k, shrinkage = min(label_free, key=lambda key: losses[key][index])
        figures.setdefault(f"chosen by {criterion}", []).append(f"{k}/{shrinkage}")
        p[f"+ clusters (k, shrinkage by {criterion})"] = (
            p[BEFORE] if k == "none" else clustered(k, shrinkage)
        )
        with_labels = [key for key in losses if key[0] in ("benchmarks", "none")]
        k, shrinkage = min(with_labels, key=lambda key: losses[key][index])
        figures.setdefault(f"labels chosen by {criterion}", []).append(
            f"{k}/{shrinkage}"
        )
        p[f"+ predicted benchmarks (shrinkage by {criterion})"] = (
            p[BEFORE] if k == "none" else labelled(shrinkage)
        )
    # Tallies.
    obs = observed[:, kept]
    p["per-benchmark tally (labels)"] = baselines.per_subject_accuracy(
        obs, benchmarks, data.test_benchmarks
    ).T
    tally_k = min(tally_losses, key=tally_losses.get)
    figures.setdefault("tally k", []).append(int(tally_k))
    for name, k in (("cluster tally (k by CV)", tally_k), ("cluster tally (k=60)", 60)):
        km = clusterings[k]
        p[name] = cluster_tally(obs, km.labels_, km.predict(data.test_vectors)).T
    p["per-model logistic regression"] = per_model_logistic(
        obs, vectors, data.test_vectors
    ).T
    if mf is not None:
        p["MF (dim 16)"] = mf.predict(observed, data.train_vectors, data.test_vectors)
    for method, probabilities in p.items():
        probabilities = np.asarray(probabilities)
        if probabilities.shape[0] != truth.shape[0]:
            probabilities = probabilities.T
        for metric, score in (
            ("correctness", correctness_accuracy),
            ("routing", routing_accuracy),
        ):
            figures.setdefault(metric, {}).setdefault(method, []).append(
                float(score(truth, probabilities))
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pools", type=int, default=8)
    parser.add_argument("--only", type=int, help="measure the first ONLY pools")
    parser.add_argument("--cache", type=Path, required=True)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--no-mf", action="store_true", help="leave MF out")
    arguments = parser.parse_args()
    code = commit()
    data = openllm_data.OpenLLM(arguments.data, "all-mpnet-base-v2")
    pools = draw_pools(data, arguments.seed, arguments.pools)
    training = np.setdiff1d(np.arange(len(data.names)), np.concatenate(pools))
    embedder, fit = fitted_embedder(
        data, training, arguments.seed, None, {}, arguments.cache, code
    )
    mf = None
    if not arguments.no_mf:
        mf, losses = baselines.tuned_factor_model(
            "mf", data.train_matrix[training], data.train_vectors, arguments.seed
        )
        print(f"mf item penalty {mf.item_decay} (held-out {losses})", flush=True)
    result = {"seed": arguments.seed, "commit": code, "fit": fit, "sizes": {}}
    start = time.perf_counter()
    for n in arguments.sizes:
        figures = {}
        for number, pool in enumerate(pools[: arguments.only]):
            measure_pool(data, embedder, mf, pool, arguments.seed, n, figures)
            print(
                f"n={n} pool {number}: "
                + json.dumps(
                    {m: round(v[-1], 3) for m, v in figures["routing"].items()}
                )
                + f" chosen={figures['chosen by log loss'][-1]}"
                + f" {figures['chosen by listwise'][-1]}",
                flush=True,
            )
        result["sizes"][str(n)] = figures
        arguments.out.write_text(json.dumps(result) + "\n")
    result["seconds"] = round(time.perf_counter() - start)
    arguments.out.write_text(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
