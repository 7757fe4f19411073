"""Size and contents of saved embedders fitted on the Open LLM data (issue 16).

One command fits a default ``LocusEmbedder`` on every model's evaluations, saves
it with ``sklocus.save`` and with joblib, checks that neither file holds training
data, and writes its section of ``--out`` (the rest of the page stays)::

    python benchmarks/model_files.py DATA_FOLDER [--out docs/performance.md]
        [--encoder all-MiniLM-L6-v2] [--seed 0] [--set name=value ...]

DATA_FOLDER holds the Open LLM Leaderboard data in sklocus's on-disk format
(``responses.parquet``, ``queries.parquet``, ``models.parquet`` and precomputed
query encodings; see ``sklocus.datasets.load_evaluations``).

Figures: the number of training evaluations; the size of the skorch network's
pickle at the end of training, before ``fit`` releases what only training needs
(measured by a callback, so it is what every pickle carried before that release
existed); the size of ``sklocus.save``'s file and of ``joblib.dump``'s pickle of
the fitted embedder, each split into network weights, the query encoder's lookup
table and the rest.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import io
import os
import pickle
import tempfile
import time
import types
from pathlib import Path

import joblib
import numpy as np
import torch
from _sections import write_section
from provenance import commit
from safetensors import safe_open
from skorch.callbacks import Callback

import sklocus
from sklocus import LocusEmbedder
from sklocus.cli import parse_settings
from sklocus.datasets import load_evaluations


class PickledSizeAtTrainEnd(Callback):
    """Record the size of the network's pickle when training ends."""

    def on_train_end(self, net, **kwargs):
        buffer = io.BytesIO()
        # The callback list holds this callback; leave it out of its own figure.
        pickle.dump(net, buffer, protocol=pickle.HIGHEST_PROTOCOL)
        net.history.record("pickled_bytes_before_release", buffer.tell())


def largest_array(obj):
    """Most elements of any numpy array or torch tensor that obj holds."""
    # Classes, modules and functions lead to the whole interpreter, not to what
    # the object holds.
    skipped = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)
    counts, stack, seen = [0], [obj], set()
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, skipped):
            continue
        seen.add(id(item))
        if isinstance(item, np.ndarray):
            counts.append(item.size)
            continue
        if isinstance(item, torch.Tensor):
            counts.append(item.numel())
            continue
        stack.extend(gc.get_referents(item))
    return max(counts)


def megabytes(n_bytes):
    return f"{n_bytes / 1e6:.2f} MB"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", help="folder of the Open LLM data")
    parser.add_argument("--out", default="docs/performance.md")
    parser.add_argument("--encoder", default="all-MiniLM-L6-v2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="NAME=VALUE",
        help="LocusEmbedder parameters to change (figures then are not the default's)",
    )
    args = parser.parse_args()
    overrides = parse_settings(args.set)
    code = commit()  # the code that runs, whatever is committed meanwhile

    data = load_evaluations(args.data, encoder=args.encoder)
    sets = [s for s in data.evaluation_sets if s]
    n_evaluations = sum(len(s) for s in sets)
    print(f"{len(sets)} models, {n_evaluations} evaluations", flush=True)

    start = time.perf_counter()
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        random_state=args.seed,
        callbacks=[("pickled_size", PickledSizeAtTrainEnd())],
        **overrides,
    ).fit(sets)
    fit_seconds = time.perf_counter() - start
    before = embedder.history_[-1, "pickled_bytes_before_release"]
    print(f"fit {fit_seconds:.0f} s; pickle before release {megabytes(before)}")
    # A model file stores data, not code: the measuring callback goes.
    embedder.set_params(callbacks=None)

    with tempfile.TemporaryDirectory() as folder:
        saved_path = Path(folder) / "embedder.sklocus"
        joblib_path = Path(folder) / "embedder.joblib"
        sklocus.save(embedder, saved_path)
        joblib.dump(embedder, joblib_path)
        saved_bytes = saved_path.stat().st_size
        joblib_bytes = joblib_path.stat().st_size
        with safe_open(saved_path, "np") as file:
            tensors = {key: file.get_tensor(key) for key in file.keys()}
            header_bytes = len(file.metadata()["sklocus"])
        blob = joblib_path.read_bytes()
        reloaded = sklocus.load(saved_path)
        reloaded_joblib = joblib.load(joblib_path)

    # What the files hold: the network, the query encoder's table (the user's
    # own encodings: query ids and vectors) and the centres of the training
    # queries. No array is as large as the training evaluations, and the
    # objects that held them (collators, the ragged table) are gone.
    weights = sum(t.nbytes for k, t in tensors.items() if ".net_." in k)
    encoder_table = sum(t.nbytes for k, t in tensors.items() if "query_encoder" in k)
    other = saved_bytes - weights - encoder_table
    assert set(tensors) == (
        {f"LocusEmbedder.net_.{k}" for k in embedder.net_.module_.state_dict()}
        | {"LocusEmbedder.query_encoder.vectors", "LocusEmbedder.query_centroids_"}
    ), sorted(tensors)
    largest = max(largest_array(reloaded), largest_array(reloaded_joblib))
    assert largest < n_evaluations, largest
    assert b"SetCollator" not in blob and b"RaggedEvaluations" not in blob
    sample = sets[:64]
    assert np.array_equal(reloaded.transform(sample), embedder.transform(sample))
    assert np.array_equal(reloaded_joblib.transform(sample), embedder.transform(sample))

    settings = ", ".join(
        f"{k}={v!r}" for k, v in {"random_state": args.seed, **overrides}.items()
    )
    lines = [
        "## What a fitted embedder weighs",
        "",
        "Generated by `python benchmarks/model_files.py DATA_FOLDER` at commit "
        f"{code} on {datetime.date.today().isoformat()}: "
        f"`LocusEmbedder({settings})` with the precomputed "
        f"{args.encoder} encodings, fitted on every model of the Open LLM "
        f"Leaderboard data ({len(sets)} models, {n_evaluations:,} evaluations) "
        f"in {fit_seconds / 60:.1f} min on {os.cpu_count()} CPU cores.",
        "",
        "| | size |",
        "|---|---:|",
        f"| network pickle at the end of training, before `fit` releases the "
        f"training state | {megabytes(before)} |",
        f"| `sklocus.save` file | {megabytes(saved_bytes)} |",
        f"| of which network weights | {megabytes(weights)} |",
        f"| of which the query encoder's lookup table | {megabytes(encoder_table)} |",
        f"| of which description, history and query ids | {megabytes(other)} "
        f"(JSON header {megabytes(header_bytes)}) |",
        f"| `joblib.dump` pickle | {megabytes(joblib_bytes)} |",
        "",
        "Before the release, every pickle carried the collators that sample "
        "training batches, holding every training model's queries, scores and "
        "query vectors, plus the optimiser's moments and early stopping's copy of "
        f"the best weights: {before / n_evaluations:.1f} bytes per training "
        "evaluation, and anyone holding the file could read the scores back. "
        "Now `fit` keeps only what inference needs (the network, the query "
        "encoder, the settings and the training history). The script checks it: "
        "neither file holds a collator or the ragged table of evaluations, the "
        "largest array in either (the query encoder's table, "
        f"{largest:,} numbers) is smaller than the {n_evaluations:,} training "
        "evaluations, the saved file's arrays are exactly the network's weights, "
        "the encoder's table and the training queries' centres, and both reload "
        "to bit-identical embeddings.",
        "",
    ]
    text = "\n".join(lines)
    write_section(args.out, "model-files", text)
    print(text)


if __name__ == "__main__":
    main()
