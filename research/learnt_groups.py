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
    python -m research.learnt_groups --report FILE ... [--page PAGE]

The report writes ``docs/research/learnt-groups.md``: a cell is the mean over
every (seed, pool) pair with its standard error; paired rows are one method
minus another, pool by pool; the seed spread is the sd of each seed's mean.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.cluster import KMeans
from sklearn.frozen import FrozenEstimator
from sklearn.linear_model import LogisticRegression

from benchmarks.provenance import commit
from research import baselines, openllm_data
from research.pools import draw_pools, fitted_embedder
from sklocus import LocusRouter
from sklocus._groups import fit_group_offsets, logits
from sklocus.evaluations import subsample, to_matrix
from sklocus.metrics import correctness_accuracy, routing_accuracy

SIZES = (64, 128, 256, 512)
DEFAULT = 'LocusRouter, query_clusters="auto"'
LEARNT = "LocusRouter + benchmarks at fit, told from the text"
GIVEN = "LocusRouter + benchmarks at fit and routing (labels)"
BEFORE = "LocusRouter (defaults)"
# Names of runs made while query_clusters="auto" was the default.
RENAMED = {
    "LocusRouter (defaults: clusters by held-out loss)": DEFAULT,
    "LocusRouter, query_clusters=None (the defaults before)": BEFORE,
}
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


def listwise_offsets(base, scores, labels, shrinkage, weight=1.0):
    """Group offsets fitted on BCE plus ``weight`` times a listwise loss.

    The listwise term is, for each query with right and wrong answers among
    its observed models, -log of the softmax mass (over those models' logits)
    on the models that answered. Returns ``(groups, offsets)`` as
    :func:`~sklocus._groups.fit_group_offsets` does.
    """
    groups, codes = np.unique(labels.astype(str), return_inverse=True)
    observed = ~np.isnan(scores)
    y = torch.as_tensor(np.nan_to_num(scores))
    seen = torch.as_tensor(observed)
    right = seen & (y > 0.5)
    useful = right.any(dim=1) & (seen & (y <= 0.5)).any(dim=1)
    z0 = torch.as_tensor(base)
    index = torch.as_tensor(codes)
    delta = torch.zeros(scores.shape[1], len(groups), dtype=torch.float64)
    delta.requires_grad_(True)
    optimiser = torch.optim.LBFGS([delta], max_iter=100, line_search_fn="strong_wolfe")

    def closure():
        optimiser.zero_grad()
        z = z0 + delta[:, index].T
        bce = torch.nn.functional.binary_cross_entropy_with_logits(
            z[seen], y[seen], reduction="sum"
        )
        every = torch.logsumexp(z.masked_fill(~seen, -torch.inf), dim=1)
        answered = torch.logsumexp(z.masked_fill(~right, -torch.inf), dim=1)
        listwise = (every - answered)[useful].sum()
        loss = bce + weight * listwise + shrinkage / 2 * (delta**2).sum()
        loss.backward()
        return loss

    optimiser.step(closure)
    return groups.astype(object), delta.detach().numpy()


def cluster_tally(observed, train_codes, test_codes):
    return baselines.per_subject_accuracy(observed, train_codes, test_codes)


def tally_held_out_loss(observed, codes):
    """Held-out log loss of a per-cluster tally: half the queries predict the rest.

    ``observed`` is ``(n_queries, n_models)``, ``codes`` each query's cluster.
    """
    rng = np.random.default_rng(0)
    fold = rng.integers(0, 2, len(observed))
    total = 0.0
    count = 0
    for f in (0, 1):
        train = np.where((fold == f)[:, None], observed, np.nan)
        p = baselines.per_subject_accuracy(train, codes, codes)
        rows = fold != f
        o = observed[rows]
        q = np.clip(p[rows], 0.02, 0.98)
        seen = ~np.isnan(o)
        total += float(
            -(o[seen] * np.log(q[seen]) + (1 - o[seen]) * np.log(1 - q[seen])).sum()
        )
        count += int(seen.sum())
    return total / count


def per_model_logistic(observed, train_vectors, test_vectors, C=1.0):
    """P(correct) ``(n_test, n_models)`` of a logistic regression per model.

    Each is fitted on its column of ``observed`` ``(n_train, n_models)``.
    """
    out = np.empty((len(test_vectors), observed.shape[1]))
    for m, column in enumerate(observed.T):
        seen = ~np.isnan(column)
        y = column[seen] > 0.5
        if y.all() or not y.any():
            out[:, m] = y.mean()
            continue
        model = LogisticRegression(C=C, max_iter=200).fit(train_vectors[seen], y)
        out[:, m] = model.predict_proba(test_vectors)[:, 1]
    return out


def measure_pool(data, embedder, mf, pool, seed, n, figures):
    truth = data.test_matrix[:, pool]
    drawn = subsample(data.sets(pool), n, random_state=seed)
    observed, _ = to_matrix(drawn, queries=data.train_ids)
    kept = ~np.isnan(observed).all(axis=1)
    queries = np.array([q for q, k in zip(data.train_ids, kept) if k], dtype=object)
    scores = observed[kept]  # (queries, models)
    vectors = data.train_vectors[kept]
    benchmarks = data.train_benchmarks[kept]
    frozen = FrozenEstimator(embedder)
    p = {}
    start = time.perf_counter()
    default = LocusRouter(frozen, query_clusters="auto").fit(list(queries), scores)
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
    locus = router.stages_.locus  # the router's LOCUS, refined as it routes
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
        tally_losses[k] = tally_held_out_loss(scores, km.labels_)
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
    # Offsets fitted on BCE plus a listwise loss (issue 54, part 5).
    g, off = listwise_offsets(base_train, scores, benchmarks, SHRINKAGE)
    col = {c: j for j, c in enumerate(g)}
    soft = np.zeros((len(data.test_ids), len(g)))
    soft[:, [col[c] for c in classifier.classes_]] = proba
    p["+ predicted benchmarks (BCE + listwise offsets)"] = sigmoid(
        soft_offsets(base_test, soft, off)
    )
    if default.group_source_ == "clusters":
        k = len(default.groups_)
        km = clusterings.get(k) or KMeans(k, n_init=4, random_state=0).fit(vectors)
        g, off = listwise_offsets(
            base_train, scores, km.labels_.astype(object), SHRINKAGE
        )
        col = {c: j for j, c in enumerate(g)}
        hard = one_hot(
            np.array([col[str(c)] for c in km.predict(data.test_vectors)]), len(g)
        )
        p["+ clusters as chosen (BCE + listwise offsets)"] = sigmoid(
            soft_offsets(base_test, hard, off)
        )
    else:
        p["+ clusters as chosen (BCE + listwise offsets)"] = p[BEFORE]
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
    p["per-benchmark tally (labels)"] = baselines.per_subject_accuracy(
        scores, benchmarks, data.test_benchmarks
    )
    tally_k = min(tally_losses, key=tally_losses.get)
    figures.setdefault("tally k", []).append(int(tally_k))
    for name, k in (("cluster tally (k by CV)", tally_k), ("cluster tally (k=60)", 60)):
        km = clusterings[k]
        p[name] = cluster_tally(scores, km.labels_, km.predict(data.test_vectors))
    p["per-model logistic regression"] = per_model_logistic(
        scores, vectors, data.test_vectors
    )
    if mf is not None:
        p["MF (dim 16)"] = mf.predict(observed, data.train_vectors, data.test_vectors)
    # Every prediction is (test queries, models), as truth is.
    for method, probabilities in p.items():
        for metric, score in (
            ("correctness", correctness_accuracy),
            ("routing", routing_accuracy),
        ):
            figures.setdefault(metric, {}).setdefault(method, []).append(
                float(score(truth, probabilities))
            )


PAIRED = (
    (DEFAULT, BEFORE),
    (DEFAULT, "cluster tally (k by CV)"),
    (DEFAULT, "per-model logistic regression"),
    (DEFAULT, "MF (dim 16)"),
    (LEARNT, "per-benchmark tally (labels)"),
    (LEARNT, BEFORE),
    (LEARNT, GIVEN),
    (LEARNT, "per-model logistic regression"),
    (GIVEN, "per-benchmark tally (labels)"),
    ("+ predicted benchmarks (BCE + listwise offsets)", LEARNT),
    ("+ clusters as chosen (BCE + listwise offsets)", DEFAULT),
)
SPREAD = (
    DEFAULT,
    LEARNT,
    GIVEN,
    BEFORE,
    "per-benchmark tally (labels)",
    "cluster tally (k by CV)",
)


def _cell(values):
    values = np.asarray(values, dtype=float)
    se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.0
    return f"{values.mean():.3f} ± {se:.3f}"


def clustering_by_default(rows):
    """Whether ``rows`` come from runs whose default router clustered the queries.

    Those runs (at fec24b5) name the router without clusters
    "LOCUS, router, query_clusters=None".
    """
    return "LOCUS, router, query_clusters=None" in rows[0]["methods"]


def small_pools_section(rows):
    """Markdown of ``research.budget`` JSON lines: the routers on small pools.

    Runs made while ``query_clusters="auto"`` was the default name that router
    "LOCUS, router (defaults)" and the one without clusters
    "LOCUS, router, query_clusters=None".
    """
    clustered = clustering_by_default(rows)
    names = {
        "LOCUS, router (defaults)": (
            "router, query heads + clusters (auto)"
            if clustered
            else "router, query heads (the defaults)"
        ),
        "LOCUS, router without query heads": (
            "router, clusters (auto), no heads" if clustered else "router, no heads"
        ),
        "LOCUS, router, query_clusters=None": "router, query heads (the defaults)",
        'LOCUS, router, query_clusters="auto"': "router, query heads + clusters (auto)",
        'LOCUS, router without query heads, query_clusters="auto"': (
            "router, clusters (auto), no heads"
        ),
        "LOCUS, router with benchmark groups": "router, benchmarks given",
        "LOCUS, router with benchmark groups told from the text": (
            "router, benchmarks at fit, told from the text"
        ),
        "per-benchmark tally": "per-benchmark tally (labels)",
        "logistic regression per model": "logistic regression per model",
        "MF (dim 16)": "MF (dim 16)",
        "overall accuracy": "overall accuracy",
    }
    commits = sorted({row["commit"] for row in rows})
    lines = [
        "## Small pools",
        "",
        "Written by `python -m research.budget --llmrouter DIR --openllm DIR "
        "--sizes 20 --seeds 0 1 2` at "
        f"{', '.join(commits)} ({rows[0]['date']}), raw lines in "
        "`research/results/budget-clusters.jsonl`: the 9 priced LLMRouter "
        "models on their own train/test split, and pools of 20 Open LLM models "
        "(on their split), each seed its own embedder; a cell is the mean over "
        "seeds ± their sd. Query heads are on for these pools (under 100 "
        "models).",
        "",
    ]
    for pool in dict.fromkeys(row["pool"] for row in rows):
        found = [row for row in rows if row["pool"] == pool]
        seeds = ", ".join(str(row["seed"]) for row in found)
        fit = np.mean([row["fit_seconds"] for row in found])
        lines += [
            f"{pool} ({found[0]['models']} models, seeds {seeds}; LOCUS fit, "
            f"embedder and router, {fit:.0f} s on one core shared with another "
            "run):",
            "",
            "| method | routing | correctness | AIQ |",
            "|---|---|---|---|",
        ]
        for key, label in names.items():
            if key not in found[0]["methods"]:
                continue
            cells = []
            for metric in ("routing", "correctness", "aiq"):
                values = [row["methods"][key][metric] for row in found]
                cells.append(f"{np.mean(values):.3f} ± {np.std(values):.3f}")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def report(results):
    """The markdown page of ``--out`` files, one per seed."""
    for result in results:
        for figures in result["sizes"].values():
            for metric in ("routing", "correctness"):
                figures[metric] = {
                    RENAMED.get(name, name): values
                    for name, values in figures[metric].items()
                }
    sizes = list(results[0]["sizes"])
    methods = list(results[0]["sizes"][sizes[0]]["routing"])
    seeds = ", ".join(str(r["seed"]) for r in results)
    commits = sorted({r["commit"] for r in results})
    fits = "; ".join(
        f"seed {r['seed']}: {r['fit'].get('models')} models, "
        f"{r['fit'].get('seconds', 0) / 60:.1f} min at {r['fit'].get('commit')}"
        for r in results
    )
    pairs = sum(len(r["sizes"][sizes[0]]["routing"][methods[0]]) for r in results)
    lines = [
        "# Groups learnt, not given: LocusRouter on pools of unseen models",
        "",
        "Written by `python -m research.learnt_groups DATA_FOLDER --cache CACHE "
        f"--seed S --out FILE` at seeds {seeds} (commits {', '.join(commits)}, "
        f"{results[0].get('date', '')}), then `--report` of those files. The "
        "protocol is that of [router-results.md](router-results.md): each seed "
        f"fits its own embedder on the models outside its pools ({fits}) and "
        "draws its own 8 pools of 112 unseen fully observed models; one draw of "
        "n train-query evaluations per model (the seed's); 269 test queries. A "
        f"cell is the mean over the {pairs} (seed, pool) pairs ± its standard "
        "error.",
        "",
        f"- *{DEFAULT}*: no labels at fit or routing; k-means clusters of the "
        "pool's queries, k in 2-32 or none chosen by held-out log loss.",
        f"- *{LEARNT}*: `query_groups` = benchmarks at fit only; at routing a "
        "logistic regression on the encodings weighs each benchmark's offsets.",
        f"- *{GIVEN}*: benchmarks at fit and routing.",
        f"- *{BEFORE}*: `LocusRouter(FrozenEstimator(embedder))`, LOCUS's "
        "refined logits alone on these pools of 112 (no query heads).",
        "- *+ ...*: prototype variants on the logits of the one before: "
        "predicted benchmarks soft (probabilities) or hard (argmax); clusters "
        "at a fixed k; k and `group_shrinkage` (0.3-30) chosen by held-out log "
        "loss or by a listwise loss (each held-out query's softmax over the "
        "models' logits, mass on the models that answered).",
        "- Tallies: each model's mean train score on the query's benchmark "
        "(labels) or k-means cluster (k in 2-60 chosen by a held-out log loss "
        "over half the queries, or k = 60); a logistic regression per model "
        "on the encodings (C = 1); MF (dim 16, the item penalty tuned on the "
        "training models).",
        "- *BCE + listwise offsets*: the group offsets fitted on their log loss "
        "plus a listwise loss (each query's softmax over its observed models' "
        "logits, -log of the mass on those that answered), on the benchmarks "
        'told from the text or on the clusters query_clusters="auto" chose.',
        "",
    ]
    for metric in ("routing", "correctness"):
        lines += [
            f"{metric.capitalize()} accuracy:",
            "",
            "| method | " + " | ".join(f"n = {n}" for n in sizes) + " |",
            "|---|" + "---|" * len(sizes),
        ]
        for method in methods:
            cells = [
                _cell([v for r in results for v in r["sizes"][n][metric][method]])
                for n in sizes
            ]
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "Paired by pool:",
        "",
        "| comparison | metric | " + " | ".join(f"n = {n}" for n in sizes) + " |",
        "|---|---|" + "---|" * len(sizes),
    ]
    for first, second in PAIRED:
        if second not in methods:
            continue
        for metric in ("routing", "correctness"):
            cells = []
            for n in sizes:
                a = [v for r in results for v in r["sizes"][n][metric][first]]
                b = [v for r in results for v in r["sizes"][n][metric][second]]
                d = np.subtract(a, b)
                se = d.std(ddof=1) / np.sqrt(len(d))
                cells.append(f"{d.mean():+.3f} ± {se:.3f}")
            lines.append(
                f"| {first} minus {second} | {metric} | " + " | ".join(cells) + " |"
            )
    lines += [
        "",
        "Spread between seeds (sd of each seed's mean over its pools):",
        "",
        "| method | metric | " + " | ".join(f"n = {n}" for n in sizes) + " |",
        "|---|---|" + "---|" * len(sizes),
    ]
    for method in SPREAD:
        for metric in ("routing", "correctness"):
            means = [
                [np.mean(r["sizes"][n][metric][method]) for r in results] for n in sizes
            ]
            cells = [f"{np.std(m, ddof=1):.3f}" if len(m) > 1 else "-" for m in means]
            lines.append(f"| {method} | {metric} | " + " | ".join(cells) + " |")
    lines += ["", f"Clusters {DEFAULT} chose (pools, all seeds):", ""]
    for n in sizes:
        counts = {}
        for r in results:
            for k in r["sizes"][n]["default groups"]:
                counts[k] = counts.get(k, 0) + 1
        chosen = ", ".join(
            f"{'none' if k == 0 else k}: {c}" for k, c in sorted(counts.items())
        )
        seconds = [v for r in results for v in r["sizes"][n]["default fit seconds"]]
        accuracy = [v for r in results for v in r["sizes"][n]["benchmark accuracy"]]
        lines.append(
            f"- n = {n}: {chosen}; its fit took "
            f"{np.mean(seconds):.1f} s a pool (one core); the benchmark classifier "
            f"told {np.mean(accuracy):.1%} of the test queries' benchmarks."
        )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?")
    parser.add_argument("--report", nargs="+", type=Path, metavar="JSON")
    parser.add_argument(
        "--page", type=Path, default=Path("docs/research/learnt-groups.md")
    )
    parser.add_argument(
        "--budget",
        type=Path,
        metavar="JSONL",
        help="with --report: research.budget lines of the small pools",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pools", type=int, default=8)
    parser.add_argument("--only", type=int, help="measure the first ONLY pools")
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--no-mf", action="store_true", help="leave MF out")
    arguments = parser.parse_args()
    if arguments.report:
        results = [json.loads(path.read_text()) for path in arguments.report]
        text = report(results)
        if arguments.budget:
            lines = arguments.budget.read_text().splitlines()
            text += "\n" + small_pools_section([json.loads(x) for x in lines])
        arguments.page.write_text(text)
        return
    if arguments.data is None or arguments.cache is None or arguments.out is None:
        parser.error("DATA_FOLDER, --cache and --out are needed to measure")
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
            "mf", data.train_matrix[:, training], data.train_vectors, arguments.seed
        )
        print(f"mf item penalty {mf.item_decay} (held-out {losses})", flush=True)
    result = {
        "seed": arguments.seed,
        "commit": code,
        "date": time.strftime("%Y-%m-%d"),
        "fit": fit,
        "sizes": {},
    }
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
