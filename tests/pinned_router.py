"""Write the pinned router's inputs and outputs (test_router_pinned.py reads them).

    python tests/pinned_router.py [--embedder-only | --stages]

Trains a small embedder on a fixed synthetic pool and saves it
(``embedder.sklocus``), then fits routers over it (``FrozenEstimator``) at the
default settings and with each stage on, and saves what they predict
(``outputs.npz``). Run once, on the commit before a change that must leave
routing as it was; the test then holds every later commit to those outputs.
The reference in this folder was written at commit 1f14cec (2026-12-06), before
the router was split into stages, on an AMD EPYC (Zen 4), one thread.

``--stages`` writes what the first reference left out (``stages.npz``): clusters
of queries, exploration's routes, a budget's routes and curve, a pool changed
by ``remove_models``, ``add_models`` and ``partial_fit``; and two router files
(``router-groups.sklocus``, ``router-clusters.sklocus``) with what they predict.
Those were written at commit 55f9b0d (2026-12-07), model file format 8, before
the router's stages became objects of their own, on the same kind of machine.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from sklearn.frozen import FrozenEstimator
from tiny import SMALL_NETWORK

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix

HERE = Path(__file__).resolve().parent / "pinned"
EMBEDDER = HERE / "embedder.sklocus"
OUTPUTS = HERE / "outputs.npz"
STAGE_OUTPUTS = HERE / "stages.npz"
# Routers saved as model files, by label of STAGE_SETTINGS.
ROUTER_FILES = {
    "saved_groups": HERE / "router-groups.sklocus",
    "saved_clusters": HERE / "router-clusters.sklocus",
}
# The routers pinned: the defaults (query heads blended at 0.84 with LOCUS on
# this pool), each other stage on, and LOCUS alone, refined and not (settings as
# the sklocus at hand takes them: calibrate and calibration_method before the
# one calibration= of model file format 7).
SETTINGS = {
    "default": {},
    "groups": {},
    "pool_isotonic": {"calibration": "pool+isotonic"},
    "budget": {"budget": 2.0},
    "locus_only": {"query_heads": False},
    "forward_pass": {"query_heads": False, "refine_steps": 0},
}


# Routers of ``--stages``: (settings, fitted with costs, with query groups).
STAGE_SETTINGS = {
    "clusters": ({"query_clusters": 4, "query_heads": False}, False, False),
    "clusters_auto": ({"query_clusters": "auto"}, False, False),
    "ucb": ({"exploration": "ucb", "query_heads": False}, False, False),
    "thompson": ({"exploration": "thompson", "random_state": 0}, False, False),
    "budget_routes": ({"budget": 2.0}, True, False),
    "edited": ({}, False, False),
    "edited_groups": ({}, False, True),
    "saved_groups": (
        {"calibration": "pool+isotonic", "budget": 2.5, "exploration": "ucb"},
        True,
        True,
    ),
    "saved_clusters": ({"query_clusters": 4, "calibration": "sigmoid"}, False, False),
}


def pool():
    """The pool: 10 models, 160 queries, 30% of the pairs unobserved."""
    data = make_evaluations(
        n_models=10, n_queries=160, evals_per_model=None, query_dim=32, random_state=7
    )
    scores, queries = to_matrix(data.evaluation_sets)
    table = scores.copy()
    table[np.random.default_rng(7).random(table.shape) < 0.3] = np.nan
    groups = np.array([f"g{i % 3}" for i in range(len(queries))], dtype=object)
    cost = np.linspace(1.0, 4.0, len(data.model_names))
    frame = pd.DataFrame(table, columns=data.model_names)
    return data, list(queries), frame, groups, cost


def settings(label):
    """``SETTINGS[label]`` for this sklocus's LocusRouter."""
    found = dict(SETTINGS[label])
    if "query_clusters" in LocusRouter().get_params():
        # Pinned before clusters of queries were learnt: routing without them.
        found.setdefault("query_clusters", None)
    if "calibration" not in LocusRouter().get_params() and "calibration" in found:
        pool_part, method = found.pop("calibration").split("+")
        found.update(calibrate=pool_part == "pool", calibration_method=method)
    return found


def fitted(label, embedder, queries, frame, groups, cost):
    """The router ``label`` fitted on the first 120 queries."""
    router = LocusRouter(FrozenEstimator(embedder), **settings(label))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return router.fit(
            queries[:120],
            frame.iloc[:120],
            cost=cost if label == "budget" else None,
            query_groups=groups[:120] if label == "groups" else None,
        )


def outputs(embedder):
    """Every pinned router's probabilities and routes on the 40 test queries."""
    data, queries, frame, groups, cost = pool()
    found = {}
    for label in SETTINGS:
        router = fitted(label, embedder, queries, frame, groups, cost)
        test_groups = groups[120:] if label == "groups" else None
        found[f"{label}/probabilities"] = router.predict_correctness(
            queries[120:], test_groups
        )
        found[f"{label}/embeddings"] = router.embeddings_
    return found


def stage_router(label, embedder, queries, frame, groups, cost):
    """The router ``STAGE_SETTINGS[label]`` fitted on the first 120 queries."""
    found, priced, grouped = STAGE_SETTINGS[label]
    router = LocusRouter(FrozenEstimator(embedder), **found)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        router.fit(
            queries[:120],
            frame.iloc[:120],
            cost=cost if priced else None,
            query_groups=groups[:120] if grouped else None,
        )
        if label.startswith("edited"):
            edit(router, queries, frame, groups if grouped else None)
    return router


def edit(router, queries, frame, groups):
    """Change the pool: two models out, one back, outcomes of the test queries.

    Model 3 comes back from its evaluations of the first 80 queries; models 0
    and 1 learn their outcomes of test queries 120-139.
    """
    names = list(frame.columns)
    router.remove_models([names[2], names[3]])
    column = frame[names[3]].iloc[:80]
    evaluations = {q: s for q, s in zip(queries[:80], column) if s == s}
    group_of = None if groups is None else dict(zip(queries[:80], groups[:80]))
    router.add_models([evaluations], [names[3]], query_groups=group_of)
    later = frame[names[:2]].iloc[120:140]
    later.index = range(len(later))
    router.partial_fit(
        queries[120:140],
        later,
        query_groups=None if groups is None else groups[120:140],
    )


def stage_outputs(embedder):
    """What the ``STAGE_SETTINGS`` routers predict and route on the test queries."""
    data, queries, frame, groups, cost = pool()
    test = queries[120:]
    found = {}
    for label in STAGE_SETTINGS:
        router = stage_router(label, embedder, queries, frame, groups, cost)
        found[f"{label}/probabilities"] = router.predict_correctness(test)
        found[f"{label}/embeddings"] = router.embeddings_
        ranked, _ = router.rank_models(test, k=3)
        column = {name: j for j, name in enumerate(router.classes_.tolist())}
        found[f"{label}/routes"] = np.vectorize(column.get)(ranked)
        if router.budget_curve_ is not None:
            found[f"{label}/budget_curve"] = router.budget_curve_
        if router.held_out_losses_ is not None:
            losses = router.held_out_losses_
            found[f"{label}/held_out_losses"] = np.array(list(losses.values()))
        if label in ROUTER_FILES:
            sklocus.save(router, ROUTER_FILES[label])
    return found


def main():
    torch.set_num_threads(1)
    if "--stages" in sys.argv:
        np.savez(STAGE_OUTPUTS, **stage_outputs(sklocus.load(EMBEDDER)))
        return
    if not EMBEDDER.exists():
        data = pool()[0]
        network = dict(SMALL_NETWORK, epoch_size=128, max_epochs=6)
        embedder = LocusEmbedder(query_encoder=data.encoder, **network)
        embedder.fit(data.evaluation_sets)
        sklocus.save(embedder, EMBEDDER)
    if "--embedder-only" in sys.argv:
        return
    np.savez(OUTPUTS, **outputs(sklocus.load(EMBEDDER)))


if __name__ == "__main__":
    main()
