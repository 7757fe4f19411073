"""Compare variants of LOCUS's recipe over several pools, paired by seed.

Routing accuracy on 269 test queries moves by about 0.02 from one fit to the
next (a new pool, a new training run), so a change to the network or the recipe
can only be judged over several seeds, against the defaults fitted on the same
pools. This script fits the onboarding embedder of ``benchmarks/openllm.py`` for
each (variant, seed), measures correctness, routing and profile spread (the sd
of a model's logits over the test queries) on that seed's pool, mean over
``--draws`` draws of the n evaluations, appends one JSON line per fit to
``--out``, and prints each variant's mean and its difference from ``--against``
paired by seed. Fits run ``--jobs`` at a time (worth it on a GPU, whose small
training steps leave it idle; on 2 CPU cores use 1).

A variant is ``NAME`` or ``NAME:name=value,name=value``: ``defaults`` (today's
``LocusEmbedder``), or one of the changes in ``PATCHES`` that are not part of
the library (tried and not kept; docs/tuning.md), with ``LocusEmbedder``
parameters after the colon::

    python benchmarks/openllm_variants.py DATA_FOLDER \\
        --variants defaults defaults:prior_tokens=1 count \\
        --seeds 0 1 2 3 [--mf] [--device cuda --jobs 8] --out variants.jsonl
    python benchmarks/openllm_variants.py --summary variants.jsonl \\
        [--against defaults]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import multiprocessing
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
import openllm  # noqa: E402
import openllm_baselines as baselines  # noqa: E402
from overrides import parse_overrides  # noqa: E402

from sklocus import LocusEmbedder  # noqa: E402
from sklocus.evaluations import subsample, to_matrix  # noqa: E402
from sklocus.metrics import correctness_accuracy, routing_accuracy  # noqa: E402
from sklocus.nn import set_encoder, training  # noqa: E402
from sklocus.nn.network import LocusNetwork  # noqa: E402

SIZES = (64, 128, 256, 512)


@contextlib.contextmanager
def _patched(owner, name, replacement):
    original = getattr(owner, name)
    setattr(owner, name, replacement(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def count_feature():
    """Add a learned function of log(1 + set size) to the pooled vector."""
    encoder = set_encoder.SetEncoder

    def init(original):
        def __init__(self, query_dim, embedding_dim, *args, **kwargs):
            original(self, query_dim, embedding_dim, *args, **kwargs)
            self.count = nn.Linear(1, embedding_dim)
            nn.init.zeros_(self.count.weight)
            nn.init.zeros_(self.count.bias)

        return __init__

    def embed(original):
        def embed_projected(self, projected, codes, scores, mask=None):
            tokens = self.tokenizer(projected, codes, scores)
            sizes = torch.full((len(tokens),), tokens.shape[1], device=tokens.device)
            if mask is not None:
                sizes = mask.sum(dim=1)
            tokens, mask = self._with_prior(tokens, mask)
            for layer in self.layers:
                tokens = layer(tokens, mask)
            count = torch.log1p(sizes.to(tokens.dtype))[:, None]
            return self.output(self.pooling(tokens, mask) + self.count(count))

        return embed_projected

    stack = contextlib.ExitStack()
    stack.enter_context(_patched(encoder, "__init__", init))
    stack.enter_context(_patched(encoder, "embed_projected", embed))
    return stack


def clean_encoder():
    """Training noise on the predictor's query encodings only, not the encoder's."""

    def forward(original):
        def forward(
            self,
            query_table,
            encoder_codes,
            encoder_scores,
            encoder_mask,
            decoder_codes,
        ):
            query_table = query_table.flatten(0, -2)
            embeddings = self.encoder(
                query_table, encoder_codes, encoder_scores, encoder_mask
            )
            return self.predictor(embeddings, self._noisy(query_table), decoder_codes)

        return forward

    return _patched(LocusNetwork, "forward", forward)


def pairwise_loss(weight=1.0):
    """Add a ranking term: on each decoder query that models of a batch share, a
    model that answered right should score above one that answered wrong
    (logistic loss on the difference of their logits, mean over such pairs)."""
    last = {}

    def forward(original):
        def forward(self, decoder_codes, **inputs):
            last["codes"] = decoder_codes
            return original(self, decoder_codes=decoder_codes, **inputs)

        return forward

    def loss(original):
        def forward(self, logits, targets):
            base = original(self, logits, targets)
            if not torch.is_grad_enabled():  # the validation loss stays plain BCE
                return base
            real = ~torch.isnan(targets)
            rows = torch.arange(len(logits), device=logits.device)[:, None]
            rows, codes = rows.expand_as(targets)[real], last["codes"][real]
            width = int(codes.max()) + 1
            grid = logits.new_zeros(len(logits), width)
            answers = logits.new_full((len(logits), width), float("nan"))
            grid = grid.index_put((rows, codes), logits[real])
            answers = answers.index_put((rows, codes), targets[real])
            right, wrong = answers == 1, answers == 0
            shared = right.any(0) & wrong.any(0)
            if not shared.any():
                return base
            grid, right, wrong = grid[:, shared], right[:, shared], wrong[:, shared]
            pairs = right[:, None] & wrong[None, :]
            margin = (grid[:, None] - grid[None, :])[pairs]
            return base + weight * nn.functional.softplus(-margin).mean()

        return forward

    stack = contextlib.ExitStack()
    stack.enter_context(_patched(LocusNetwork, "forward", forward))
    stack.enter_context(_patched(training.MaskedBCEWithLogitsLoss, "forward", loss))
    return stack


def _before_build(hook):
    """Patch ``LocusEmbedder._build_net`` to call ``hook(ragged, vectors, seed)`` first.

    How a patch sees the data a fit trains on (its queries' encodings, its
    models' scores) before the network is built.
    """

    def build(original):
        def _build_net(self, ragged, vectors, seed):
            hook(ragged, vectors, seed)
            return original(self, ragged, vectors, seed)

        return _build_net

    return _patched(LocusEmbedder, "_build_net", build)


def strong_models():
    """Draw the stronger half of the training models twice an epoch.

    Routing is decided among the strongest models of a pool, so this spends
    more of training on telling strong models apart. An epoch grows by half;
    run it with ``max_epochs=8`` for the defaults' number of steps.
    """
    rates = {}

    def hook(ragged, vectors, seed):
        rates["mean"] = np.array(
            [ragged.set_scores(i).mean() for i in range(ragged.n_sets)]
        )

    def split(original):
        def __call__(self, dataset, y=None, **fit_params):
            train, valid = original(self, dataset, y, **fit_params)
            models = np.asarray(train.models)
            strong = models[rates["mean"][models] >= np.median(rates["mean"][models])]
            train.models = np.sort(np.concatenate([models, strong]))
            return train, valid

        return __call__

    stack = contextlib.ExitStack()
    stack.enter_context(_before_build(hook))
    stack.enter_context(_patched(training.ModelSplit, "__call__", split))
    return stack


def coarse_noise(components):
    """Training noise only outside the top principal directions of the queries.

    Isotropic noise of 0.2 per coordinate hides even which benchmark a query
    comes from, which is what per-benchmark routing uses: nearest-centroid
    identification of a test query's benchmark falls from 0.981 to 0.710,
    and stays at 0.963 with the noise kept off the 16 leading principal
    directions of the training queries (openllm_headroom.py). This keeps
    those directions noise-free and blurs the rest, where a single query's
    identity lives.
    """
    basis = {}

    def hook(ragged, vectors, seed):
        centred = vectors - vectors.mean(axis=0)
        _, _, directions = np.linalg.svd(centred, full_matrices=False)
        basis["cpu"] = torch.as_tensor(directions[:components].copy())

    def noisy(original):
        def _noisy(self, query_vectors):
            if not (self.training and self.query_noise > 0):
                return query_vectors
            device = query_vectors.device
            if device not in basis:
                basis[device] = basis["cpu"].to(device, query_vectors.dtype)
            top = basis[device]
            noise = torch.randn_like(query_vectors)
            noise = noise - (noise @ top.T) @ top
            return query_vectors + self.query_noise * noise

        return _noisy

    stack = contextlib.ExitStack()
    stack.enter_context(_before_build(hook))
    stack.enter_context(_patched(LocusNetwork, "_noisy", noisy))
    return stack


def cluster_rates(clusters=8):
    """Give the encoder each model's smoothed accuracy per query cluster.

    The training queries' encodings are clustered by k-means (no labels); a
    set's rate on each cluster, shrunk towards 1/2 by one pseudo-answer each
    way, and the log of its count there, pass through a learned map (zero at
    the start) into the pooled vector. Per-benchmark accuracy routes far
    better than LOCUS (openllm_headroom.py); this hands the encoder the
    label-free version of that tally.
    """
    from sklearn.cluster import KMeans

    state = {}
    encoder = set_encoder.SetEncoder

    def assign(vectors):
        centroids = state["centroids"].to(vectors.device, vectors.dtype)
        return torch.cdist(vectors, centroids).argmin(dim=1)

    def hook(ragged, vectors, seed):
        kmeans = KMeans(clusters, n_init=4, random_state=seed).fit(vectors)
        state["centroids"] = torch.as_tensor(kmeans.cluster_centers_).float()

    def init(original):
        def __init__(self, query_dim, embedding_dim, *args, **kwargs):
            original(self, query_dim, embedding_dim, *args, **kwargs)
            self.rates = nn.Linear(2 * clusters, embedding_dim)
            nn.init.zeros_(self.rates.weight)
            nn.init.zeros_(self.rates.bias)

        return __init__

    def network_forward(original):
        def forward(self, query_table, *args, **kwargs):
            self.encoder.assigned = assign(query_table.flatten(0, -2))
            return original(self, query_table, *args, **kwargs)

        return forward

    def embed_sets(original):
        def _embed(self, ragged, vectors):
            table = torch.as_tensor(vectors, device=self.device_)
            self.net_.module_.encoder.assigned = assign(table)
            return original(self, ragged, vectors)

        return _embed

    def embed(original):
        def embed_projected(self, projected, codes, scores, mask=None):
            z = original(self, projected, codes, scores, mask)
            weight = torch.ones_like(scores) if mask is None else mask.to(z.dtype)
            member = nn.functional.one_hot(self.assigned[codes], clusters).to(z.dtype)
            member = member * weight[..., None]
            counts = member.sum(dim=1)
            rights = (member * scores.to(z.dtype)[..., None]).sum(dim=1)
            rates = (rights + 1.0) / (counts + 2.0) - 0.5
            features = torch.cat([rates, torch.log1p(counts)], dim=1)
            return z + self.rates(features)

        return embed_projected

    stack = contextlib.ExitStack()
    stack.enter_context(_before_build(hook))
    stack.enter_context(_patched(LocusEmbedder, "_embed", embed_sets))
    stack.enter_context(_patched(LocusNetwork, "forward", network_forward))
    stack.enter_context(_patched(encoder, "__init__", init))
    stack.enter_context(_patched(encoder, "embed_projected", embed))
    return stack


PATCHES = {
    "defaults": contextlib.nullcontext,
    "clusters": cluster_rates,
    "strong": strong_models,
    "coarse16": functools.partial(coarse_noise, 16),
    "count": count_feature,
    "clean": clean_encoder,
    "pairwise": pairwise_loss,
}


def parse_variant(text):
    name, _, settings = text.partition(":")
    if name not in PATCHES:
        raise SystemExit(f"unknown variant {name!r}; expected one of {list(PATCHES)}")
    # Split at the commas that start a new name=, not those inside a tuple.
    items = filter(None, re.split(r",(?=\s*\w+=)", settings))
    return name, parse_overrides(items)


def _logit(p):
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def _figures(truth, p):
    logits = _logit(p)
    spread = (logits - logits.mean(axis=1, keepdims=True)).std(axis=1)
    return (
        ("correctness", correctness_accuracy(truth, p)),
        ("routing", routing_accuracy(truth, p)),
        ("profile spread", spread.mean()),
    )


def measure(data_folder, variant, seed, draws, device, threads, mf):
    """Fit one (variant, seed) and measure it; returns one JSON-able row.

    With ``mf``, the MF baseline of ``benchmarks/openllm.py`` (its item penalty
    chosen on held-out training queries) is fitted on the same training models
    and measured on the same draws, as ``MF correctness`` and ``MF routing``.
    """
    torch.set_num_threads(threads)
    data = openllm.OpenLLM(data_folder, "all-mpnet-base-v2")
    name, overrides = parse_variant(variant)
    overrides = {"device": device, **overrides}
    pool = data.draw_pool(seed)
    training_models = np.setdiff1d(np.arange(len(data.names)), pool)
    if mf:
        factor_model, _ = baselines.tuned_factor_model(
            "mf", data.train_matrix[training_models], data.train_vectors, seed
        )
    with PATCHES[name]():
        embedder, seconds = openllm.fit_embedder(data, training_models, seed, overrides)
        truth = data.test_matrix[pool]
        figures = {}
        for n in SIZES:
            for state in openllm.draw_states(seed, draws):
                drawn = subsample(data.sets(pool), n, random_state=state)
                p = embedder.predict_correctness(
                    embedder.transform(drawn), data.test_ids
                )
                results = list(_figures(truth, p))
                if mf:
                    observed, _ = to_matrix(drawn, queries=data.train_ids)
                    p = factor_model.predict(
                        observed, data.train_vectors, data.test_vectors
                    )
                    results += [
                        (f"MF {metric}", value)
                        for metric, value in _figures(truth, p)[:2]
                    ]
                for metric, value in results:
                    figures.setdefault(metric, {}).setdefault(n, []).append(value)
    best = min(embedder.history_, key=lambda row: row["valid_loss"])
    if mf:
        figures["MF item penalty"] = {n: [factor_model.item_decay] for n in SIZES}
    return {
        "variant": variant,
        "seed": seed,
        "device": str(embedder.device_),
        "fit_s": round(seconds),
        "epochs": len(embedder.history_),
        "best_epoch": best["epoch"],
        **{
            metric: [round(float(np.mean(by_n[n])), 4) for n in SIZES]
            for metric, by_n in figures.items()
        },
    }


def _load(path):
    by = {}
    for line in Path(path).read_text().splitlines():
        row = json.loads(line)
        by.setdefault(row["variant"], {})[row["seed"]] = row
    return by


def _paired(seeds, reference, metric, reference_metric=None):
    """Mean and sd over the common seeds of ``metric`` minus the reference's."""
    other = reference_metric or metric
    common = sorted(
        s
        for s in seeds
        if s in reference and metric in seeds[s] and other in reference[s]
    )
    if len(common) < 2:
        return None
    differences = np.array(
        [np.subtract(seeds[s][metric], reference[s][other]) for s in common]
    )
    return differences.mean(axis=0), differences.std(axis=0, ddof=1), common


def _cells(values):
    return " / ".join(f"{v:.3f}" for v in values)


def _signed(paired):
    mean, sd, _ = paired
    return " / ".join(f"{m:+.3f} ({s:.3f})" for m, s in zip(mean, sd))


def summary(path, against):
    """Print each variant's means and its differences from ``against``."""
    by = _load(path)
    print(f"n = {' / '.join(map(str, SIZES))}; paired differences against {against}")
    for variant, seeds in by.items():
        print(f"\n{variant} (seeds {sorted(seeds)})")
        for metric in ("correctness", "routing", "profile spread"):
            values = np.array([seeds[s][metric] for s in sorted(seeds)])
            print(f"  {metric:15s} {_cells(values.mean(axis=0))}")
            paired = _paired(seeds, by.get(against, {}), metric)
            if variant != against and paired and metric != "profile spread":
                print(
                    f"  {'  minus it (sd)':15s} {_signed(paired)}   seeds {paired[2]}"
                )
        for metric in ("correctness", "routing"):
            paired = _paired(seeds, seeds, metric, f"MF {metric}")
            if paired:
                penalties = sorted(
                    {seeds[s].get("MF item penalty", [1e-4])[0] for s in paired[2]}
                )
                print(
                    f"  {metric} minus MF (sd) {_signed(paired)}   seeds {paired[2]}"
                    f", MF item penalty {penalties}"
                )


def markdown(path, against):
    """The summary as a markdown table (for docs/tuning.md)."""
    by = _load(path)
    print(
        "| variant | pools | correctness | minus the reference (sd) | routing "
        "| minus the reference (sd) | profile spread |"
    )
    print("|---|---|---|---|---|---|---|")
    for variant, seeds in by.items():
        mean = {
            metric: _cells(np.mean([seeds[s][metric] for s in seeds], axis=0))
            for metric in ("correctness", "routing", "profile spread")
        }
        differences = {
            metric: _paired(seeds, by.get(against, {}), metric)
            for metric in ("correctness", "routing")
        }
        shown = {
            metric: "reference"
            if variant == against
            else (_signed(d) if d else "one pool")
            for metric, d in differences.items()
        }
        print(
            f"| `{variant}` | {len(seeds)} | {mean['correctness']} "
            f"| {shown['correctness']} | {mean['routing']} | {shown['routing']} "
            f"| {mean['profile spread']} |"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?")
    parser.add_argument("--variants", nargs="+", default=["defaults"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--draws", type=int, default=4)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", default="variants.jsonl")
    parser.add_argument(
        "--mf", action="store_true", help="also measure the MF baseline per seed"
    )
    parser.add_argument("--summary", metavar="JSONL")
    parser.add_argument(
        "--markdown", action="store_true", help="print the summary as a table"
    )
    parser.add_argument("--against", default="defaults")
    arguments = parser.parse_args()
    if arguments.summary:
        show = markdown if arguments.markdown else summary
        show(arguments.summary, arguments.against)
        return
    for variant in arguments.variants:
        parse_variant(variant)  # fail before any fit
    tasks = [(v, s) for s in arguments.seeds for v in arguments.variants]
    threads = max(1, (os.cpu_count() or 1) // arguments.jobs)
    # spawn, not fork: a forked child cannot use CUDA.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(arguments.jobs, mp_context=context) as pool:
        futures = [
            pool.submit(
                measure,
                arguments.data,
                variant,
                seed,
                arguments.draws,
                arguments.device,
                threads,
                arguments.mf,
            )
            for variant, seed in tasks
        ]
        for future in futures:
            row = future.result()
            print(json.dumps(row), flush=True)
            with open(arguments.out, "a") as out:
                out.write(json.dumps(row) + "\n")
    summary(arguments.out, arguments.against)


if __name__ == "__main__":
    main()
