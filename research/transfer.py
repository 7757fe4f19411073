"""LOCUS on a benchmark it never saw: transfer, small pools and fine-tuning (issue 15).

    python -m research.transfer DATA_FOLDER [--folds arc gsm8k ...]
        [--pools 0 1 2] [--sizes 32 64 128 256] [--draws 3] [--set name=value ...]
        [--finetune name=value ...] [--small-pool gsm8k] [--cache DIR]
        [--refine STEPS PENALTY] [--finetune-only] [--out results.jsonl]

``research/transfer_report.py`` turns the JSON lines into tables.

Protocol. Each fold leaves one of the data's five benchmarks (arc, gsm8k, mmlu,
truthfulqa, winogrande) out of training. Three groups of models are kept apart:

- the *pools*: for each seed in ``--pools``, the 112 fully observed dense models of
  the pool that ``openllm_data.OpenLLM.draw_pool`` draws for that seed. They are
  never trained on. Each pool model is embedded from ``n`` of its evaluations on the
  left-out benchmark's train-split queries (``n`` is capped at their number: 76 for
  mmlu, 80 for winogrande, 102 for truthfulqa, 184 for arc, 364 for gsm8k), and
  every method predicts the benchmark's test-split queries; correctness and routing
  accuracy are measured there, each the mean over ``--draws`` draws of the ``n``
  evaluations.
- the *user's models*: 100 other fully observed dense models (a fixed draw), whose
  left-out-benchmark evaluations stand for a user's own small pool: fine-tuning
  uses the first 20, the small-pool fits (``--small-pool``, mmlu by default) the
  first 10, 20, 50 and 100.
- everyone else: the *public pool*, whose train-split evaluations on the other four
  benchmarks pretrain the fold's embedder (``LocusEmbedder`` with ``--set``).

Methods, for each fold and pool (LOCUS rows name their embedder; "refined" is
``refine_steps`` and ``refine_penalty`` from ``--refine STEPS PENALTY``, 50 and 0.1
by default; "forward" the forward pass):

- zero-shot: the public-pool embedder, used as it is;
- fine-tuned: it, continued on the 20 user models (``warm_start=True`` with
  ``--finetune`` parameters);
- from scratch on k user models: ``LocusEmbedder`` defaults on those models'
  left-out-benchmark evaluations alone (k = 20 on every fold; 10, 50, 100 too on
  ``--small-pool``);
- baselines fitted only on the left-out benchmark's evaluations of the pool's
  models (``n`` each): overall accuracy, per-subject accuracy (mmlu, whose
  subjects are labels), k-nearest queries, and MF (dim 16; fitted on the pool's
  ``n``-evaluation matrix, its item penalty chosen on held-out queries of that
  matrix once per fold and pool).

The in-domain rows check what refinement does where the encoder was trained: the
zero-shot embedder embeds each pool model from ``n`` of its train-split
evaluations on the other four benchmarks and predicts their test-split queries.

``--finetune-only`` fits and scores only the zero-shot and fine-tuned embedders on
the left-out benchmark, for a run that tries another fine-tuning recipe; the report
takes the other rows from the full run.

Fitted embedders are cached in ``--cache`` (joblib) under names that include the
fold and the ``--set``/``--finetune`` parameters, so that a rerun that changes only
the evaluation refits nothing. One JSON line per (setting, fold, pool, method, n)
is appended to ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import joblib
import numpy as np

from benchmarks.provenance import commit as current_commit
from research import baselines
from research.openllm_data import OpenLLM, draw_states
from sklocus import LocusEmbedder
from sklocus.cli import parse_settings
from sklocus.evaluations import subsample, to_matrix
from sklocus.metrics import correctness_accuracy, routing_accuracy

BENCHMARKS = ("arc", "gsm8k", "mmlu", "truthfulqa", "winogrande")
USER_MODELS = 100
FINETUNE_MODELS = 20
SMALL_POOLS = (10, 20, 50, 100)
REFINE = (50, 0.1)  # refine_steps, refine_penalty


class Folds:
    """The data split into pools, user models and public pool, per benchmark."""

    def __init__(self, data, pool_seeds):
        self.data = data
        self.pools = {seed: data.draw_pool(seed) for seed in pool_seeds}
        held = np.unique(np.concatenate(list(self.pools.values())))
        candidates = np.flatnonzero(data.fully_observed & data.dense)
        candidates = np.setdiff1d(candidates, held)
        self.user_models = np.random.default_rng(15).choice(
            candidates, USER_MODELS, replace=False
        )
        everyone = np.arange(len(data.names))
        self.public = np.setdiff1d(everyone, np.union1d(held, self.user_models))

    def queries(self, benchmark, split):
        ids = self.data.train_ids if split == "train" else self.data.test_ids
        labels = (
            self.data.train_benchmarks
            if split == "train"
            else self.data.test_benchmarks
        )
        return np.flatnonzero(labels == benchmark), [
            q for q, b in zip(ids, labels) if b == benchmark
        ]

    def sets(self, models, benchmark, inside):
        """Train-query sets of ``models`` on ``benchmark`` (or on all others)."""
        keep = {
            q
            for q, b in zip(self.data.train_ids, self.data.train_benchmarks)
            if (b == benchmark) == inside
        }
        return [
            {q: s for q, s in self.data.train_sets[i].items() if q in keep}
            for i in models
        ]


def cached_fit(cache, name, make):
    path = Path(cache) / f"{name}.joblib"
    if path.exists():
        return joblib.load(path), None
    start = time.perf_counter()
    embedder = make()
    seconds = time.perf_counter() - start
    path.parent.mkdir(parents=True, exist_ok=True)
    joblib.dump(embedder, path)
    print(f"  fit {name}: {seconds:.0f} s", flush=True)
    return embedder, seconds


def _key(overrides):
    return "".join(f"_{k}={v}" for k, v in sorted(overrides.items())).replace(" ", "")


def fold_embedders(folds, benchmark, arguments, overrides, finetune, small_sizes):
    """Every embedder a fold compares, by label, with its fit time (None: cached)."""
    data = folds.data
    user = folds.user_models
    public_sets = [s for s in folds.sets(folds.public, benchmark, False) if s]
    key = _key(overrides)
    pretrained, seconds = cached_fit(
        arguments.cache,
        f"public_{benchmark}{key}",
        lambda: LocusEmbedder(
            query_encoder=data.encoder, random_state=0, **overrides
        ).fit(public_sets),
    )
    fits = {"zero-shot": (pretrained, seconds)}
    own = folds.sets(user[:FINETUNE_MODELS], benchmark, True)

    def tune():
        embedder = copy.deepcopy(pretrained)
        return embedder.set_params(warm_start=True, **finetune).fit(own)

    fits[f"fine-tuned on {FINETUNE_MODELS}"] = cached_fit(
        arguments.cache, f"finetuned_{benchmark}{key}{_key(finetune)}", tune
    )
    for k in small_sizes:
        sets = folds.sets(user[:k], benchmark, True)
        fits[f"scratch on {k}"] = cached_fit(
            arguments.cache,
            f"scratch{k}_{benchmark}",
            lambda sets=sets: LocusEmbedder(
                query_encoder=data.encoder, random_state=0
            ).fit(sets),
        )
    return fits


def novelty_rows(folds, benchmark, embedder):
    """Share of queries whose ``query_novelty`` exceeds 1, known kinds and new.

    Test-split queries of the four trained benchmarks (new queries of known
    kinds), and every query of the left-out benchmark.
    """
    data = folds.data
    groups = {
        "test queries of the trained benchmarks": [
            q for q, b in zip(data.test_ids, data.test_benchmarks) if b != benchmark
        ],
        "queries of the left-out benchmark": folds.queries(benchmark, "train")[1]
        + folds.queries(benchmark, "test")[1],
    }
    rows = []
    for label, queries in groups.items():
        novelty = embedder.query_novelty(queries)
        rows.append(
            dict(
                kind="novelty",
                fold=benchmark,
                queries=label,
                count=len(queries),
                beyond=float((novelty > 1).mean()),
                median=float(np.median(novelty)),
            )
        )
    return rows


def locus_predictions(embedder, drawn, test_ids, refine):
    steps, penalty = int(refine[0]), float(refine[1])
    out = {}
    for label, how in (("forward", 0), ("refined", steps)):
        embedder.set_params(refine_steps=how, refine_penalty=penalty)
        out[label] = embedder.predict_correctness(embedder.transform(drawn), test_ids)
    embedder.set_params(refine_steps=0)
    return out


def evaluate_pool(
    folds, benchmark, pool_seed, fits, sizes, draws, refine, transfer_only=False
):
    """Rows of every method on one fold and pool, transfer and in-domain."""
    data = folds.data
    pool = folds.pools[pool_seed]
    rows = []
    settings = (("transfer", True), ("in-domain", False))
    for setting, inside in settings[:1] if transfer_only else settings:
        if setting == "in-domain":
            positions = np.flatnonzero(data.test_benchmarks != benchmark)
            test_ids = [data.test_ids[c] for c in positions]
            train_ids = [
                q
                for q, b in zip(data.train_ids, data.train_benchmarks)
                if b != benchmark
            ]
            embedders = {"zero-shot": fits["zero-shot"][0]}
        else:
            positions, test_ids = folds.queries(benchmark, "test")
            _, train_ids = folds.queries(benchmark, "train")
            embedders = {label: fit for label, (fit, _) in fits.items()}
        truth = data.test_matrix[np.ix_(positions, pool)]  # (test queries, models)
        sets = folds.sets(pool, benchmark, inside)
        train_vectors = data.encoder.transform(train_ids)
        test_vectors = data.encoder.transform(test_ids)
        subjects = data.train_subjects[np.isin(data.train_ids, train_ids)]
        test_subjects = data.test_subjects[positions]
        mf = None
        for n in sorted({min(n, len(train_ids)) for n in sizes}):
            scores = {}
            for state in draw_states(pool_seed, draws):
                drawn = subsample(sets, n, random_state=state)
                observed, _ = to_matrix(drawn, queries=train_ids)
                predictions = {}
                for label, embedder in embedders.items():
                    found = locus_predictions(embedder, drawn, test_ids, refine)
                    for how, p in found.items():
                        predictions[f"LOCUS {label}, {how}"] = p
                predictions["overall accuracy"] = baselines.overall_accuracy(
                    observed, len(test_ids)
                )
                if len(set(subjects)) > 1:
                    predictions["per-subject accuracy (labels)"] = (
                        baselines.per_subject_accuracy(
                            observed, subjects, test_subjects
                        )
                    )
                predictions["k-nearest queries (k=10)"] = baselines.nearest_queries(
                    observed, train_vectors, test_vectors
                )
                if setting == "transfer":
                    if mf is None:
                        mf, _ = baselines.tuned_factor_model(
                            "mf", observed, train_vectors, pool_seed
                        )
                    model = baselines.EncodedFactorModel(
                        "mf", item_decay=mf.item_decay, seed=pool_seed
                    ).fit(observed, train_vectors)
                    predictions["MF (dim 16)"] = model.predict(
                        observed, train_vectors, test_vectors
                    )
                for method, p in predictions.items():
                    scores.setdefault(method, []).append(
                        (correctness_accuracy(truth, p), routing_accuracy(truth, p))
                    )
            for method, values in scores.items():
                correctness, routing = np.mean(values, axis=0)
                rows.append(
                    dict(
                        setting=setting,
                        fold=benchmark,
                        pool=pool_seed,
                        method=method,
                        n=n,
                        correctness=float(correctness),
                        routing=float(routing),
                        oracle=float(np.nanmax(truth, axis=1).mean()),
                        n_test=len(test_ids),
                    )
                )
    return rows


def run(arguments):
    overrides = parse_settings(arguments.set)
    finetune = parse_settings(arguments.finetune)
    data = OpenLLM(arguments.data, arguments.encoder)
    folds = Folds(data, arguments.pools)
    commit = current_commit()
    out = Path(arguments.out)
    for benchmark in arguments.folds:
        print(f"fold {benchmark}", flush=True)
        if arguments.finetune_only:
            small = ()
        elif benchmark == arguments.small_pool:
            small = SMALL_POOLS
        else:
            small = (FINETUNE_MODELS,)
        fits = fold_embedders(folds, benchmark, arguments, overrides, finetune, small)
        with out.open("a") as lines:
            for label, (embedder, seconds) in fits.items():
                record = dict(
                    kind="fit",
                    fold=benchmark,
                    embedder=label,
                    seconds=seconds,
                    epochs=len(embedder.history_),
                    set=arguments.set,
                    finetune=arguments.finetune,
                    commit=commit,
                )
                lines.write(json.dumps(record) + "\n")
            for row in novelty_rows(folds, benchmark, fits["zero-shot"][0]):
                lines.write(json.dumps(dict(row, commit=commit)) + "\n")
            for pool_seed in arguments.pools:
                rows = evaluate_pool(
                    folds,
                    benchmark,
                    pool_seed,
                    fits,
                    arguments.sizes,
                    arguments.draws,
                    arguments.refine,
                    arguments.finetune_only,
                )
                for row in rows:
                    row.update(
                        kind="score",
                        set=arguments.set,
                        finetune=arguments.finetune,
                        refine=list(arguments.refine),
                        draws=arguments.draws,
                        commit=commit,
                    )
                    lines.write(json.dumps(row) + "\n")
                print(f"  pool {pool_seed}: {len(rows)} rows", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="folder of the Open LLM data")
    parser.add_argument("--encoder", default="all-mpnet-base-v2")
    parser.add_argument("--folds", nargs="+", default=list(BENCHMARKS))
    parser.add_argument("--pools", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 128, 256])
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--finetune",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="parameters changed for fine-tuning (e.g. max_epochs=4)",
    )
    parser.add_argument(
        "--refine",
        nargs=2,
        type=float,
        default=REFINE,
        metavar=("STEPS", "PENALTY"),
        help="refine_steps and refine_penalty of the refined rows",
    )
    parser.add_argument("--small-pool", default="mmlu", choices=BENCHMARKS)
    parser.add_argument(
        "--finetune-only",
        action="store_true",
        help="fit and score only the zero-shot and fine-tuned embedders, transfer only",
    )
    parser.add_argument("--cache", default="transfer-cache")
    parser.add_argument("--out", default="transfer.jsonl")
    arguments = parser.parse_args()
    run(arguments)


if __name__ == "__main__":
    main()
