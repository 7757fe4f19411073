"""Write the pinned router's inputs and outputs (test_router_pinned.py reads them).

    python tests/pinned_router.py [--embedder-only]

Trains a small embedder on a fixed synthetic pool and saves it
(``embedder.sklocus``), then fits routers over it (``FrozenEstimator``) at the
default settings and with each stage on, and saves what they predict
(``outputs.npz``). Run once, on the commit before a change that must leave
routing as it was; the test then holds every later commit to those outputs.
The reference in this folder was written at commit 1f14cec (2026-12-06), before
the router was split into stages, on an AMD EPYC (Zen 4), one thread.
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


def main():
    torch.set_num_threads(1)
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
