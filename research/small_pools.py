"""LOCUS on small pools, trained on the pool itself, against the simple things.

The situation of a team that serves a handful of models: it has each model's scores
on a few thousand of its own questions, fits ``LocusEmbedder`` (defaults plus
``--set``) on those models alone, and wants P(correct) and a route for new
questions to the same models. Pools:

- ``llmrouter``: the 9 priced models of the LLMRouter data (MIT; every model on
  5,608 train and 500 test questions of its own split), query texts encoded with
  the packaged all-MiniLM-L6-v2 (kept in ``--cache``);
- ``openllm-K``: K fully observed dense models of the Open LLM Leaderboard data
  (CC BY-NC-SA 4.0; 806 train and 269 test queries), drawn at random for each
  seed, with the data's precomputed all-MiniLM-L6-v2 encodings.

Both folders are in ``sklocus.datasets.load_evaluations``' layout. Each pool is fit
once per seed (``random_state=seed``, and for ``openllm-K`` the seed also draws the
models) and measured on the test questions against:

- overall accuracy: each model's mean train score;
- k-nearest queries: its mean score on the 10 train queries nearest each test
  query (cosine of the encodings);
- logistic regression: one ``LogisticRegression`` per model on the query
  encodings, its ``C`` chosen by shuffled 5-fold cross-validated log loss from
  0.01-100;
- MF (dim 16): logistic matrix factorisation with item terms linear in the query
  encoding, its item penalty chosen on held-out train queries
  (``openllm_baselines.tuned_factor_model``).

Partial-credit scores (3% of LLMRouter's) count as soft labels for LOCUS and MF,
and as ``score >= 0.5`` for the logistic regression, as the metrics read them.

Usage::

    python -m research.small_pools [--llmrouter DIR] [--openllm DIR]
        [--sizes 10 20 50 100] [--seeds 0 1 2] [--set name=value ...]
        [--cache FOLDER] [--out FILE.json]

``--cache`` keeps the LLMRouter encodings and each fitted embedder (a model
file keyed by pool, seed and settings), reused by the next run; a reused fit
reports the time it took when it was made. Run each invocation with
``OMP_NUM_THREADS`` set when others share the cores: fit times are wall-clock.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.frozen import FrozenEstimator
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import GridSearchCV, KFold

import sklocus
from benchmarks.provenance import commit
from research import baselines
from research.json_lines import read_rows
from sklocus import LocusEmbedder, LocusRouter
from sklocus.cli import parse_settings
from sklocus.datasets import load_evaluations
from sklocus.encoders import PrecomputedEncoder
from sklocus.evaluations import to_matrix
from sklocus.metrics import correctness_accuracy, routing_accuracy

ENCODER = "all-MiniLM-L6-v2"
ROUTER = "LOCUS, router"
LOGISTIC_C = (0.01, 0.1, 1.0, 10.0, 100.0)


class Pool:
    """One pool's train and test matrices (queries x models) and encodings."""

    def __init__(self, name, data, models, vectors_by_id):
        split = data.queries.set_index("query_id")["split"]
        self.name = name
        self.train_ids = [q for q in data.queries["query_id"] if split[q] == "train"]
        self.test_ids = [q for q in data.queries["query_id"] if split[q] == "test"]
        sets = [data.evaluation_sets[i] for i in models]
        self.model_names = [data.model_names[i] for i in models]
        self.params_b = (
            data.models.set_index("model")["params_b"]
            .reindex(self.model_names)
            .to_numpy(dtype=np.float64)
        )
        self.train_sets = [{q: s[q] for q in self.train_ids if q in s} for s in sets]
        self.train, _ = to_matrix(sets, queries=self.train_ids)
        self.test, _ = to_matrix(sets, queries=self.test_ids)
        # Each query's benchmark where the data name one (the Open LLM data).
        groups = data.queries.set_index("query_id").get("benchmark")
        self.train_groups = self.test_groups = None
        if groups is not None:
            self.train_groups = groups.loc[self.train_ids].to_numpy()
            self.test_groups = groups.loc[self.test_ids].to_numpy()
        self.train_vectors = vectors_by_id(self.train_ids)
        self.test_vectors = vectors_by_id(self.test_ids)
        self.encoder = PrecomputedEncoder(
            self.train_ids + self.test_ids,
            np.concatenate([self.train_vectors, self.test_vectors]),
        )


def llmrouter_pool(folder, cache):
    """The 9 LLMRouter models, their query texts encoded once into ``cache``."""
    data = load_evaluations(folder, encoder=ENCODER)
    path = None if cache is None else cache / "llmrouter-minilm.npy"
    if path is not None and path.exists():
        vectors = np.load(path)
    else:
        ids = list(data.queries["query_id"])
        print(f"encoding {len(ids)} LLMRouter questions", flush=True)
        vectors = data.encoder.transform(ids)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, vectors)
    row = {q: i for i, q in enumerate(data.queries["query_id"])}

    def by_id(ids):
        return vectors[[row[q] for q in ids]].astype(np.float32)

    return Pool("llmrouter", data, range(len(data.model_names)), by_id)


def openllm_pools(folder, sizes, seed):
    data = load_evaluations(folder, encoder=ENCODER)
    n_queries = len(data.queries)
    full = np.array([len(s) == n_queries for s in data.evaluation_sets])
    dense = ~data.models["moe"].fillna(False).to_numpy(dtype=bool)
    candidates = np.flatnonzero(full & dense)
    rng = np.random.default_rng((seed, 11))
    for size in sizes:
        models = np.sort(rng.choice(candidates, size, replace=False))
        yield Pool(f"openllm-{size}", data, models, data.encoder.transform)


def logistic_per_model(pool):
    """P(correct) of one cross-validated logistic regression per model."""
    out = np.empty(pool.test.shape)
    for i, column in enumerate(pool.train.T):
        labels = column >= 0.5
        if labels.all() or not labels.any():
            out[:, i] = float(labels.mean())
            continue
        search = GridSearchCV(
            LogisticRegression(max_iter=2000),
            {"C": LOGISTIC_C},
            scoring="neg_log_loss",
            # The train questions come ordered by source: unshuffled folds would
            # each hold out whole sources and choose C for a shift test sets lack.
            cv=KFold(5, shuffle=True, random_state=0),
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            search.fit(pool.train_vectors, labels)
        out[:, i] = search.predict_proba(pool.test_vectors)[:, 1]
    return out


def matrix_factorisation(pool, seed):
    model, _ = baselines.tuned_factor_model("mf", pool.train, pool.train_vectors, seed)
    with torch.no_grad():
        logits = model._logits(model.factors_, pool.test_vectors)  # (models, test)
    return torch.sigmoid(logits).numpy().T


def fitted_embedder(pool, seed, overrides, cache):
    """The pool's embedder and its fit time, from ``cache`` when it holds this fit."""
    key = json.dumps([pool.name, seed, overrides], sort_keys=True, default=str)
    path = None
    if cache is not None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        path = cache / f"embedder-{pool.name}-{digest}.model"
        if path.exists() and path.with_suffix(".json").exists():
            fit = json.loads(path.with_suffix(".json").read_text())
            return sklocus.load(path), fit["seconds"]
    start = time.perf_counter()
    embedder = LocusEmbedder(
        query_encoder=pool.encoder, random_state=seed, **overrides
    ).fit(pool.train_sets)
    seconds = time.perf_counter() - start
    if path is not None:
        sklocus.save(embedder, path)
        path.with_suffix(".json").write_text(
            json.dumps({"key": key, "seconds": seconds, "commit": commit()})
        )
    return embedder, seconds


def measure(pool, seed, overrides, cache):
    embedder, fit_seconds = fitted_embedder(pool, seed, overrides, cache)
    forward = embedder.predict_correctness(
        embedder.transform(pool.train_sets), pool.test_ids
    )
    frame = pd.DataFrame(pool.train)
    router = LocusRouter(FrozenEstimator(embedder))
    router.fit(pool.train_ids, frame)
    routed = router.predict_correctness(pool.test_ids)
    predictions = {
        "overall accuracy": baselines.overall_accuracy(pool.train, len(pool.test_ids)),
        "k-nearest queries (k=10)": baselines.nearest_queries(
            pool.train, pool.train_vectors, pool.test_vectors
        ),
        "logistic regression per model": logistic_per_model(pool),
        "MF (dim 16)": matrix_factorisation(pool, seed),
        "LOCUS, forward pass": forward,
        ROUTER: routed,
    }
    epochs = len(embedder.history_)
    return {
        "pool": pool.name,
        "seed": seed,
        "models": pool.train.shape[1],
        "fit_seconds": round(fit_seconds, 1),
        "epochs": epochs,
        "correctness": {
            name: correctness_accuracy(pool.test, p) for name, p in predictions.items()
        },
        "routing": {
            name: routing_accuracy(pool.test, p) for name, p in predictions.items()
        },
        "best single model": float(np.nanmean(pool.test, axis=0).max()),
        "oracle": float(np.nanmax(pool.test >= 0.5, axis=1).mean()),
    }


def _command(arguments):
    """A run's arguments with its folders named by role, not by this machine's paths."""
    for flag, role in (
        ("--llmrouter", "LLMROUTER_FOLDER"),
        ("--openllm", "OPENLLM_FOLDER"),
        ("--cache", "CACHE"),
        ("--out", "FILE"),
    ):
        arguments = re.sub(rf"{flag} \S+", f"{flag} {role}", arguments)
    return re.sub(r"--seeds( \d+)+", "--seeds ...", arguments)


def _threads(rows):
    """How the runs used the cores, as the report's note on fit times says it."""
    threads = sorted({row.get("threads") for row in rows}, key=str)
    if threads == [None]:
        return (
            "one thread per process, several processes sharing them, so they "
            "overstate an idle machine's"
        )
    return f"{' or '.join(map(str, threads))} thread(s) per process"


def report(rows, sources):
    """docs/research/small-pools.md from the JSON lines of runs (``sources``)."""
    pools = list(dict.fromkeys(row["pool"] for row in rows))
    methods = list(rows[0]["correctness"])
    commits = sorted({row["commit"] for row in rows})
    dates = sorted({row["date"] for row in rows})
    commands = " and ".join(
        f"`python -m research.small_pools {_command(arguments)}`"
        for arguments in dict.fromkeys(row["arguments"] for row in rows)
    )
    lines = [
        "# Small pools: LOCUS fitted on the pool itself",
        "",
        f"Written by `python -m research.small_pools --report "
        f"{' '.join(map(str, sources))}` from runs of {commands} (one per group "
        f"of seeds) at commit(s) {', '.join(commits)} on {', '.join(dates)}. "
        "Protocol: the script's docstring. Each seed fits `LocusEmbedder()` "
        "(defaults) on the pool's train questions; a cell is the mean over seeds "
        "± its standard deviation. 'LOCUS, router' is "
        "`LocusRouter(FrozenEstimator(embedder))` with its defaults (refined "
        "pool embeddings); the baselines do not depend on the seed for LLMRouter "
        "(the same 9 models each time), and do for Open LLM pools (other models). "
        f"Fit times are wall-clock on 2 CPU cores, {_threads(rows)}.",
    ]
    for pool in pools:
        mine = [row for row in rows if row["pool"] == pool]
        seeds = [row["seed"] for row in mine]
        fit = np.array([row["fit_seconds"] for row in mine])
        epochs = [row["epochs"] for row in mine]
        lines += [
            "",
            f"## {pool}: {mine[0]['models']} models, seeds {seeds}",
            "",
            f"Fit {fit.mean():.0f} s (from {fit.min():.0f} to {fit.max():.0f}), "
            f"epochs {epochs}; best single model "
            f"{np.mean([row['best single model'] for row in mine]):.3f}, oracle "
            f"{np.mean([row['oracle'] for row in mine]):.3f}.",
            "",
            "| method | correctness | routing |",
            "|---|---|---|",
        ]
        for method in methods:
            cells = []
            for metric in ("correctness", "routing"):
                values = np.array([row[metric][method] for row in mine])
                spread = values.std(ddof=1) if len(values) > 1 else float("nan")
                cells.append(f"{values.mean():.3f} ± {spread:.3f}")
            lines.append(f"| {method} | {' | '.join(cells)} |")
        lines += [
            "",
            f"{ROUTER} minus each other method, paired by seed (mean ± sd):",
            "",
            "| method | correctness | routing |",
            "|---|---|---|",
        ]
        for method in methods:
            if method == ROUTER:
                continue
            cells = []
            for metric in ("correctness", "routing"):
                gaps = np.array(
                    [row[metric][ROUTER] - row[metric][method] for row in mine]
                )
                spread = gaps.std(ddof=1) if len(gaps) > 1 else float("nan")
                cells.append(f"{gaps.mean():+.3f} ± {spread:.3f}")
            lines.append(f"| {method} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llmrouter", type=Path, help="the LLMRouter data folder")
    parser.add_argument("--openllm", type=Path, help="the Open LLM data folder")
    parser.add_argument("--sizes", type=int, nargs="*", default=[10, 20, 50, 100])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--set", nargs="*", default=[], metavar="name=value")
    parser.add_argument("--cache", type=Path)
    parser.add_argument("--out", type=Path, help="JSON lines, one per pool and seed")
    parser.add_argument(
        "--report",
        nargs="+",
        type=Path,
        metavar="JSONL",
        help="write docs/research/small-pools.md from these --out files",
    )
    arguments = parser.parse_args()
    if arguments.report:
        rows = read_rows(arguments.report)
        Path("docs/research/small-pools.md").write_text(report(rows, arguments.report))
        return
    overrides = parse_settings(arguments.set)
    code = commit()
    for seed in arguments.seeds:
        pools = []
        if arguments.llmrouter:
            pools.append(llmrouter_pool(arguments.llmrouter, arguments.cache))
        if arguments.openllm:
            pools.extend(openllm_pools(arguments.openllm, arguments.sizes, seed))
        for pool in pools:
            row = measure(pool, seed, overrides, arguments.cache)
            row.update(
                threads=torch.get_num_threads(),
                commit=code,
                date=time.strftime("%Y-%m-%d"),
                arguments=_command(" ".join(sys.argv[1:])),
            )
            print(json.dumps(row), flush=True)
            if arguments.out:
                with arguments.out.open("a") as out:
                    out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
