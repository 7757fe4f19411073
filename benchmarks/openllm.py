"""LOCUS against baselines on the Open LLM Leaderboard data (issue 6).

One command reruns everything and writes ``docs/results.md`` with its plots::

    python benchmarks/openllm.py DATA_FOLDER [--seeds 0 1]
        [--settings onboarding pool] [--draws 3] [--tables-only]
        [--out docs/results.md] [--set name=value ...]

Protocol (METHOD.md): queries are split into train (806) and test (269) by the
data's fixed ``split``; embeddings and baseline fits only ever see train-query
evaluations; every metric is on test queries. For each seed, a pool of 112 fully
observed dense (non-MoE) models is drawn.

Queries are encoded by the data's precomputed all-mpnet-base-v2 encodings (the
paper's encoder; ``--encoder all-MiniLM-L6-v2`` for the smaller one) for LOCUS and
every baseline that reads encodings.

- *onboarding*: ``LocusEmbedder`` (defaults, ``random_state=seed``) is fitted on the
  train-query evaluations of every model outside the pool, partially observed ones
  included; the pool's models are then embedded by one forward pass from ``n`` of
  their train-query evaluations, with no retraining.
- *pool*: the same, but the fit also sees the pool's models (all their train
  queries); the pool is then embedded from ``n`` evaluations.

The factor baselines (MF, IRT) are fitted on the same training rows as LOCUS and
fit each pool model's factors on its ``n`` evaluations; the L2 penalty on their
item weights is chosen per seed on held-out training queries (never test
queries) by ``openllm_baselines.tuned_factor_model``. The geometry, stability and
query-set sections use the onboarding embedder of the first seed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import openllm_baselines as baselines
import openllm_report as report
from overrides import parse_overrides

from sklocus import KCenterSelector, KMedoidsSelector, LocusEmbedder
from sklocus._selection import CoverageGreedySelector
from sklocus.datasets import load_evaluations
from sklocus.evaluations import subsample, to_matrix
from sklocus.geometry import disagreement_correlation, find_duplicates, nearest_models
from sklocus.metrics import correctness_accuracy, routing_accuracy

POOL_SIZE = 112
SAMPLE_SIZES = (16, 32, 64, 128, 256, 512, 806)
TABLE_SIZES = (64, 128, 256, 512)
PORTFOLIO_SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 50, 112)
# Budgets of coverage-greedy, in billions of parameters.
PORTFOLIO_BUDGETS = (7, 15, 30, 60, 120, 250, 500)

LOCUS, LABEL_FREE, LABELS = baselines.LOCUS, baselines.LABEL_FREE, baselines.LABELS
METHODS = (LOCUS, *LABEL_FREE, LABELS)


class OpenLLM:
    """The shared data as matrices over train and test queries."""

    def __init__(self, folder, encoder):
        data = load_evaluations(folder, encoder=encoder)
        queries = data.queries
        self.names = list(data.models["model"])
        self.train_ids = list(queries.loc[queries["split"] == "train", "query_id"])
        self.test_ids = list(queries.loc[queries["split"] == "test", "query_id"])
        by_id = queries.set_index("query_id")
        self.train_subjects = (
            by_id.loc[self.train_ids, "subject"].to_numpy().astype(str)
        )
        self.test_subjects = by_id.loc[self.test_ids, "subject"].to_numpy().astype(str)
        self.train_benchmarks = (
            by_id.loc[self.train_ids, "benchmark"].to_numpy().astype(str)
        )
        self.test_benchmarks = (
            by_id.loc[self.test_ids, "benchmark"].to_numpy().astype(str)
        )
        self.encoder = data.encoder
        self.train_vectors = data.encoder.transform(self.train_ids)
        self.test_vectors = data.encoder.transform(self.test_ids)
        self.train_matrix, _ = to_matrix(data.evaluation_sets, queries=self.train_ids)
        self.test_matrix, _ = to_matrix(data.evaluation_sets, queries=self.test_ids)
        train = set(self.train_ids)
        self.train_sets = [
            {q: s for q, s in evaluations.items() if q in train}
            for evaluations in data.evaluation_sets
        ]
        sizes = np.array([len(s) for s in data.evaluation_sets])
        self.fully_observed = sizes == len(queries)
        self.dense = ~data.models["moe"].fillna(False).to_numpy(dtype=bool)
        self.params_b = data.models["params_b"].to_numpy(dtype=float)

    def draw_pool(self, seed):
        candidates = np.flatnonzero(self.fully_observed & self.dense)
        rng = np.random.default_rng(seed)
        return np.sort(rng.choice(candidates, POOL_SIZE, replace=False))

    def sets(self, models):
        """Train-query evaluation sets of ``models``, empty ones dropped."""
        return [self.train_sets[i] for i in models if self.train_sets[i]]


def fit_embedder(data, models, seed, overrides):
    start = time.perf_counter()
    embedder = LocusEmbedder(
        query_encoder=data.encoder, random_state=seed, **overrides
    ).fit(data.sets(models))
    seconds = time.perf_counter() - start
    print(f"  LOCUS fit on {len(models)} models: {seconds:.0f} s", flush=True)
    return embedder, seconds


def predict_all(data, embedder, factor_models, drawn):
    """Every method's P(correct) of the drawn pool models on the test queries."""
    observed, _ = to_matrix(drawn, queries=data.train_ids)
    z = embedder.transform(drawn)
    return {
        LOCUS: embedder.predict_correctness(z, data.test_ids),
        "overall accuracy": baselines.overall_accuracy(observed, len(data.test_ids)),
        "k-nearest queries (k=10)": baselines.nearest_queries(
            observed, data.train_vectors, data.test_vectors
        ),
        "MF (dim 16)": factor_models["mf"].predict(
            observed, data.train_vectors, data.test_vectors
        ),
        "IRT (2PL)": factor_models["irt"].predict(
            observed, data.train_vectors, data.test_vectors
        ),
        LABELS: baselines.per_subject_accuracy(
            observed, data.train_subjects, data.test_subjects
        ),
    }


def draw_states(seed, draws):
    """Random states of the draws of n evaluations for one seed (the first: seed)."""
    return [seed if draw == 0 else 1000 * (seed + 1) + draw for draw in range(draws)]


# Item-weight penalty of each (factor baseline, seed), chosen on the first setting
# run and reused by the second (the choice takes ~1.5 min per model and seed).
_ITEM_DECAYS = {}


def factor_model(data, kind, training, seed):
    """The MF or IRT baseline on ``training``'s rows, its penalty tuned once a seed."""
    observed = data.train_matrix[training]
    if (kind, seed) not in _ITEM_DECAYS:
        model, losses = baselines.tuned_factor_model(
            kind, observed, data.train_vectors, seed
        )
        _ITEM_DECAYS[kind, seed] = model.item_decay
        print(f"  {kind} item decay {model.item_decay} (held-out loss {losses})")
        return model
    return baselines.EncodedFactorModel(
        kind, item_decay=_ITEM_DECAYS[kind, seed], seed=seed
    ).fit(observed, data.train_vectors)


def run_setting(data, setting, seed, overrides, draws=1):
    """Fit every method for one setting and seed; score each n. Returns rows.

    Each figure is the mean over ``draws`` random draws of the n evaluations of
    every pool model (the first draw uses ``random_state=seed``), so that the
    spread across seeds is not mostly the luck of one draw.
    """
    pool = data.draw_pool(seed)
    others = np.setdiff1d(np.arange(len(data.names)), pool)
    training = others if setting == "onboarding" else np.arange(len(data.names))
    print(f"{setting}, seed {seed}", flush=True)
    embedder, seconds = fit_embedder(data, training, seed, overrides)
    factor_models = {
        kind: factor_model(data, kind, training, seed) for kind in ("mf", "irt")
    }
    truth = data.test_matrix[pool]
    pool_sets = data.sets(pool)
    rows = []
    for n in SAMPLE_SIZES:
        scores = {}
        for state in draw_states(seed, draws):
            drawn = subsample(pool_sets, n, random_state=state)
            for method, probabilities in predict_all(
                data, embedder, factor_models, drawn
            ).items():
                scores.setdefault(method, []).append(
                    (
                        correctness_accuracy(truth, probabilities),
                        routing_accuracy(truth, probabilities),
                    )
                )
        for method, values in scores.items():
            correctness, routing = np.mean(values, axis=0)
            rows.append(
                dict(
                    setting=setting,
                    seed=seed,
                    method=method,
                    n=n,
                    correctness=float(correctness),
                    routing=float(routing),
                )
            )
    fit = dict(
        setting=setting,
        seed=seed,
        models=len(data.sets(training)),
        epochs=len(embedder.history_),
        seconds=seconds,
        oracle=float(np.nanmax(truth, axis=0).mean()),
        mean_accuracy=float(np.nanmean(truth)),
        item_decays={kind: model.item_decay for kind, model in factor_models.items()},
    )
    return rows, fit, embedder, pool


def relative_distance(a, b, scale):
    return np.linalg.norm(a - b, axis=1) / scale


def stability(data, embedder, pool, seed):
    """Distance to the full-evaluation embedding against n and against overlap."""
    sets = data.sets(pool)
    full = embedder.transform(sets)
    scale = np.median(
        np.linalg.norm(full[:, None] - full[None], axis=2)[
            np.triu_indices(len(full), 1)
        ]
    )
    by_n = []
    for n in SAMPLE_SIZES[:-1]:
        distances = [
            relative_distance(
                embedder.transform(subsample(sets, n, random_state=1000 * seed + r)),
                full,
                scale,
            ).mean()
            for r in range(5)
        ]
        by_n.append((n, float(np.mean(distances)), float(np.std(distances))))
    n, rng = 128, np.random.default_rng(seed)
    by_overlap = []
    orders = [rng.permutation(list(s)) for s in sets]
    reference = [{q: s[q] for q in order[:n]} for s, order in zip(sets, orders)]
    z_reference = embedder.transform(reference)
    for fraction in (0.0, 0.25, 0.5, 0.75, 1.0):
        shared = int(round(fraction * n))
        other = [
            {q: s[q] for q in [*order[:shared], *order[n : 2 * n - shared]]}
            for s, order in zip(sets, orders)
        ]
        distance = relative_distance(embedder.transform(other), z_reference, scale)
        by_overlap.append((fraction, float(distance.mean())))
    return dict(by_n=by_n, by_overlap=by_overlap, scale=float(scale))


def routed_accuracy(truth, probabilities, allowed=None):
    """Routing accuracy when only the ``allowed`` models may be chosen."""
    if allowed is not None:
        masked = np.full_like(probabilities, -np.inf)
        masked[allowed] = probabilities[allowed]
        probabilities = masked
    return routing_accuracy(truth, probabilities)


def geometry(data, embedder, pool):
    """Correlations, fallback, portfolios and near-duplicates."""
    sets = data.sets(pool)
    z = embedder.transform(sets)
    truth = data.test_matrix[pool]
    probabilities = embedder.predict_correctness(z, data.test_ids)
    out = {
        "correlation": {
            metric: disagreement_correlation(z, truth, metric=metric)
            for metric in ("cosine", "euclidean")
        }
    }
    chosen = probabilities.argmax(axis=0)
    columns = np.arange(truth.shape[1])
    neighbour, _ = nearest_models(z, k=1)
    random_other = (
        chosen + np.random.default_rng(0).integers(1, len(z), len(chosen))
    ) % len(z)
    out["fallback"] = {
        "routed": float(truth[chosen, columns].mean()),
        "nearest neighbour": float(truth[neighbour[chosen, 0], columns].mean()),
        "random other model": float(truth[random_other, columns].mean()),
    }
    full = routed_accuracy(truth, probabilities)
    portfolios = {"k-center": [], "k-medoids": []}
    for k in PORTFOLIO_SIZES:
        for name, selector in (
            ("k-center", KCenterSelector),
            ("k-medoids", KMedoidsSelector),
        ):
            selected = selector(n_selected=k, metric="cosine").fit(z).selected_indices_
            portfolios[name].append(
                (k, routed_accuracy(truth, probabilities, selected))
            )
    cost = data.params_b[pool]
    cost = np.where(np.isfinite(cost) & (cost > 0), cost, np.nanmedian(cost))
    coverage = []
    for budget in PORTFOLIO_BUDGETS:
        selector = CoverageGreedySelector(budget=budget, metric="cosine").fit(
            z, cost=cost
        )
        selected = selector.selected_indices_
        coverage.append(
            (budget, len(selected), routed_accuracy(truth, probabilities, selected))
        )
    out["portfolios"] = dict(full=full, by_k=portfolios, coverage=coverage)

    everyone = embedder.transform(data.sets(np.arange(len(data.names))))
    named = [i for i in range(len(data.names)) if data.train_sets[i]]
    pairs = find_duplicates(everyone, threshold=1e-3, metric="cosine")
    duplicates, identical = [], 0
    for first, second, distance in pairs[["first", "second", "distance"]].itertuples(
        index=False
    ):
        a, b = data.train_matrix[named[first]], data.train_matrix[named[second]]
        if np.array_equal(a, b, equal_nan=True):
            identical += 1
            continue
        if len(duplicates) < 10:
            common = ~np.isnan(a) & ~np.isnan(b)
            duplicates.append(
                (
                    data.names[named[first]],
                    data.names[named[second]],
                    float(distance),
                    int(common.sum()),
                    float((a[common] != b[common]).mean()) if common.any() else np.nan,
                )
            )
    out["n_models"] = len(named)
    out["identical_pairs"] = identical
    out["duplicates"] = duplicates
    return out


def query_set_ablation(data, pool, seed, overrides, embedder_all):
    """Onboarding with and without the partially observed models in training."""
    others = np.setdiff1d(np.arange(len(data.names)), pool)
    full_only = others[data.fully_observed[others]]
    embedder_full, seconds = fit_embedder(data, full_only, seed, overrides)
    truth = data.test_matrix[pool]
    rows = []
    for n in TABLE_SIZES:
        drawn = subsample(data.sets(pool), n, random_state=seed)
        for label, embedder, models in (
            ("fully observed models only", embedder_full, len(full_only)),
            ("all models (partially observed included)", embedder_all, len(others)),
        ):
            p = embedder.predict_correctness(embedder.transform(drawn), data.test_ids)
            rows.append(
                (
                    label,
                    models,
                    n,
                    correctness_accuracy(truth, p),
                    routing_accuracy(truth, p),
                )
            )
    return rows, seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="folder of the Open LLM data")
    parser.add_argument(
        "--encoder",
        default="all-mpnet-base-v2",
        help="precomputed query encodings to use (the paper's all-mpnet-base-v2, "
        "or all-MiniLM-L6-v2)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument(
        "--settings",
        nargs="+",
        default=["onboarding", "pool"],
        choices=["onboarding", "pool"],
    )
    parser.add_argument(
        "--draws",
        type=int,
        default=3,
        help="random draws of each pool model's n evaluations, averaged per seed",
    )
    parser.add_argument(
        "--tables-only",
        action="store_true",
        help="skip stability, geometry and query sets (for trying a recipe)",
    )
    parser.add_argument("--out", default="docs/results.md")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="LocusEmbedder parameters to change, e.g. --set n_layers=0",
    )
    arguments = parser.parse_args()
    overrides = parse_overrides(arguments.set)
    start = time.perf_counter()
    data = OpenLLM(arguments.data, arguments.encoder)
    rows, fits = [], []
    first = None
    for seed in arguments.seeds:
        for setting in arguments.settings:
            setting_rows, fit, embedder, pool = run_setting(
                data, setting, seed, overrides, arguments.draws
            )
            rows += setting_rows
            fits.append(fit)
            if first is None and setting == "onboarding":
                first = (embedder, pool, seed)
    extra = {}
    if first is not None and not arguments.tables_only:
        embedder, pool, seed = first
        print("stability, geometry, query sets", flush=True)
        extra["stability"] = stability(data, embedder, pool, seed)
        extra["geometry"] = geometry(data, embedder, pool)
        extra["query_sets"] = query_set_ablation(data, pool, seed, overrides, embedder)
    extra["seconds"] = time.perf_counter() - start
    protocol = dict(
        locus=LOCUS,
        label_free=LABEL_FREE,
        labels=LABELS,
        methods=METHODS,
        table_sizes=TABLE_SIZES,
        n_train=len(data.train_ids),
        n_test=len(data.test_ids),
    )
    report.write(Path(arguments.out), rows, fits, extra, arguments, overrides, protocol)


if __name__ == "__main__":
    main()
