"""Time and memory of sklocus.load on hostile model files (issue 33).

Saves a small router (12 synthetic models, a file of well under 1 MB), then
loads hand-made attacks and seeded random mutations of it: edits of the JSON
description (a value replaced by another of any type, a key removed) with a
valid checksum, and edits of the tensors (a value, a shape, a dtype, an array
dropped). Each file must be refused with a ``ValueError`` (``ModelFileError``)
or load as a router whose probabilities are finite. Writes the slowest load and
the growth of the process's peak memory over all loads into the section
``hostile-files`` of docs/performance.md::

    OMP_NUM_THREADS=1 python benchmarks/hostile_files.py [--mutations 1000]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import gc
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _sections import write_section
from provenance import commit
from safetensors import safe_open
from safetensors.numpy import save_file

import sklocus
import sklocus._persistence
from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix

# The smallest network and pool that exercise every part of a model file:
# what is attacked is the file, not what the network learnt.
TINY_NETWORK = dict(
    embedding_dim=8,
    n_latents=4,
    n_layers=1,
    n_heads=2,
    predictor_hidden=8,
    encoder_sizes=(8, 32),
    max_epochs=1,
    epoch_size=1,
    random_state=0,
)
TINY_POOL = dict(
    n_models=12, n_queries=120, evals_per_model=(30, 80), query_dim=8, random_state=0
)

ODD_VALUES = [None, True, -1, 0, 2**62, 1e308, -0.5, "", "x" * 40, [1, 2], {}]


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def save_router(folder):
    data = make_evaluations(**TINY_POOL)
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    router = LocusRouter(LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK))
    router.fit(queries, Y, cost=np.arange(1.0, Y.shape[1] + 1))
    path = folder / "router.sklocus"
    sklocus.save(router, path)
    with safe_open(path, "np") as file:
        arrays = {key: file.get_tensor(key) for key in file.keys()}
        header = json.loads(file.metadata()["sklocus"])
    return path, header, arrays, queries[:8]


def places(node, prefix=()):
    """Every path into a JSON document."""
    if prefix:
        yield prefix
    if isinstance(node, dict | list):
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            yield from places(value, (*prefix, key))


def mutate(header, arrays, rng):
    header, arrays = copy.deepcopy(header), dict(arrays)
    for _ in range(rng.integers(1, 4)):
        paths = list(places(header))
        path = paths[rng.integers(len(paths))]
        node = header
        for step in path[:-1]:
            node = node[step]
        if rng.random() < 0.2:
            del node[path[-1]]
        else:
            node[path[-1]] = ODD_VALUES[rng.integers(len(ODD_VALUES))]
    if rng.random() < 0.5:
        key = sorted(arrays)[rng.integers(len(arrays))]
        array, kind = arrays[key], rng.integers(4)
        if kind == 0 and array.dtype.kind == "f" and array.size:
            array = array.copy()
            array.flat[0] = [np.nan, np.inf, 1e30][rng.integers(3)]
            arrays[key] = array
        elif kind == 1:
            arrays[key] = np.concatenate([array.ravel(), array.ravel()[:1]])
        elif kind == 2:
            arrays[key] = array.astype(np.float64 if array.dtype.kind != "f" else "i1")
        else:
            arrays.pop(key)
    return header, arrays


def attacks(header, arrays):
    """The hand-made attacks of issue 33, each as (name, header, arrays, padding)."""
    for name, value in [("n_layers", 10_000), ("embedding_dim", 4_000_000)]:
        edited = copy.deepcopy(header)
        net = edited["estimator"]["fitted"]["embedder_"]["estimator"]["fitted"]
        for pair in net["net_"]["network"]["module_params"]["dict"]:
            if pair[0] == name:
                pair[1] = value
        yield f"{name} = {value:,}", edited, arrays, None
    poisoned = dict(arrays)
    poisoned["LocusRouter.embeddings_"] = arrays["LocusRouter.embeddings_"] * np.nan
    yield "NaN embeddings", header, poisoned, None
    yield "a 57 MB header", header, arrays, 57 * 2**20


def write(path, header, arrays, padding=None):
    try:
        header = dict(
            header,
            sha256=sklocus._persistence._checksum(header.get("estimator"), arrays),
        )
    except (TypeError, ValueError, AttributeError):
        pass
    metadata = {"sklocus": json.dumps(header)}
    if padding:
        metadata["padding"] = " " * padding
    save_file(arrays, path, metadata=metadata)


def load_once(path, queries):
    """Return what happened and the seconds it took; anything else is a finding."""
    start = time.perf_counter()
    try:
        router = sklocus.load(path)
    except ValueError:
        return "refused", time.perf_counter() - start
    try:
        proba = router.predict_proba(queries)
    except ValueError:  # an edited encoder that no longer knows the queries
        return "loaded, queries refused", time.perf_counter() - start
    if not np.isfinite(proba).all():
        raise AssertionError(f"{path} loaded and gives non-finite probabilities")
    return "loaded", time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutations", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="docs/performance.md")
    arguments = parser.parse_args()
    folder = Path(tempfile.mkdtemp())
    original, header, arrays, queries = save_router(folder)
    # Every file is written before the memory baseline: writing a 57 MB header
    # takes memory that loading must not be charged with.
    files = {}
    for i, (name, edited, edited_arrays, padding) in enumerate(attacks(header, arrays)):
        files[name] = folder / f"attack-{i}.sklocus"
        write(files[name], edited, edited_arrays, padding)
    rng = np.random.default_rng(arguments.seed)
    mutated = []
    for i in range(arguments.mutations):
        mutated.append(folder / f"mutated-{i}.sklocus")
        write(mutated[-1], *mutate(header, arrays, rng))
    load_once(original, queries)  # imports and first-call costs
    gc.collect()
    baseline = peak_rss_mb()
    rows = []
    for name, path in files.items():
        outcome, seconds = load_once(path, queries)
        rows.append(
            f"| {name} | {path.stat().st_size / 2**20:.2f} MB | {outcome} | "
            f"{seconds * 1000:.1f} ms |"
        )
    outcomes = {"refused": 0, "loaded": 0, "loaded, queries refused": 0}
    slowest, largest = 0.0, 0
    for path in mutated:
        largest = max(largest, path.stat().st_size)
        outcome, seconds = load_once(path, queries)
        outcomes[outcome] += 1
        slowest = max(slowest, seconds)
        gc.collect()
    growth = peak_rss_mb() - baseline
    text = "\n".join(
        [
            "## Hostile model files",
            "",
            f"Generated by `python benchmarks/hostile_files.py` at commit {commit()} "
            f"on {datetime.date.today()}, one thread. A router of 12 synthetic "
            f"models saved with `sklocus.save` ({original.stat().st_size / 1024:.0f} "
            "KB), then loaded after each attack below, and after "
            f"{arguments.mutations:,} random mutations (seed {arguments.seed}) of its "
            "description and tensors, each with a valid checksum.",
            "",
            "| attack | file | outcome | load |",
            "|---|---:|---|---:|",
            *rows,
            "",
            f"Random mutations (files up to {largest / 2**20:.2f} MB): "
            f"{outcomes['refused']:,} refused with `ModelFileError`, "
            f"{outcomes['loaded']:,} loaded and routed with finite probabilities, "
            f"{outcomes['loaded, queries refused']:,} loaded with an edited query "
            "table that refused the test queries with a `ValueError` naming one, "
            "none failed otherwise. The slowest load (with routing 8 queries) took "
            f"{slowest * 1000:.0f} ms; the process's peak memory grew by "
            f"{growth:.0f} MB over all loads (an upper bound for any one of them). "
            "The goal was at most 2 s and 200 MB per file under 1 MB.",
        ]
    )
    write_section(arguments.out, "hostile-files", text)
    print(text)


if __name__ == "__main__":
    main()
