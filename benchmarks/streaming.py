"""Embedding beyond memory (issue 20): models per second and peak memory.

One command measures both paths on a synthetic Parquet dataset and writes its
section of ``docs/performance.md``::

    python benchmarks/streaming.py [--models 100000] [--evals 256]
        [--batch-models 1024] [--out docs/performance.md]

The dataset (made in a temporary folder, removed at the end) is a long table of
``--models`` models x ``--evals`` evaluations each over 4,096 queries with
precomputed 384-d vectors, sorted by model, in files of 10,000 models. The
embedder has the default network sizes, fitted for one epoch on 256 models (the
speed of ``transform`` does not depend on training).

Figures:

- the streaming path (``sklocus.embed_parquet``) in a fresh process of its own:
  models per second and the process's peak resident memory (``ru_maxrss``),
  on the whole dataset and on a tenth of it, so that flat memory shows as the
  same peak for ten times the models;
- the Dask path (``sklocus.dask.embed_dask`` on ``dask.dataframe.read_parquet``
  of the same files, one partition per file, written with ``to_parquet``) on a
  ``LocalCluster`` of 2 worker processes of one thread each: models per second
  and each worker's peak resident memory (``VmHWM`` read through
  ``client.run``), on the same two sizes.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _sections import write_section  # noqa: E402

N_QUERIES, QUERY_DIM, MODELS_PER_FILE = 4096, 384, 10_000


def query_vectors():
    return (
        np.random.default_rng(0)
        .standard_normal((N_QUERIES, QUERY_DIM))
        .astype(np.float32)
    )


def write_dataset(folder, n_models, n_evals):
    """Files of MODELS_PER_FILE models each, rows sorted by model."""
    rng = np.random.default_rng(1)
    queries = np.array([f"q{i:04d}" for i in range(N_QUERIES)])
    # Each model answers each query with its own probability.
    skill = rng.normal(size=n_models)
    difficulty = rng.normal(size=N_QUERIES)
    folder.mkdir()
    for number, first in enumerate(range(0, n_models, MODELS_PER_FILE)):
        count = min(MODELS_PER_FILE, n_models - first)
        picks = np.argsort(rng.random((count, N_QUERIES)), axis=1)[:, :n_evals]
        gap = difficulty[picks] - skill[first : first + count, None]
        chance = 1 / (1 + np.exp(gap))
        scores = (rng.random(picks.shape) < chance).astype(np.float64)
        names = np.array([f"model-{i:06d}" for i in range(first, first + count)])
        table = pa.table(
            {
                "model": np.repeat(names, n_evals),
                "query": queries[picks.ravel()],
                "score": scores.ravel(),
            }
        )
        pq.write_table(table, folder / f"part.{number:04d}.parquet")


def fitted_embedder(path):
    """Default network sizes, one short epoch on 256 of the models."""
    import pandas as pd

    from sklocus import LocusEmbedder, PrecomputedEncoder, save
    from sklocus.evaluations import from_long

    first = pd.read_parquet(path / "part.0000.parquet")
    models = first["model"].unique()[:256]
    sets, _ = from_long(first[first["model"].isin(models)])
    encoder = PrecomputedEncoder(
        [f"q{i:04d}" for i in range(N_QUERIES)], query_vectors()
    )
    embedder = LocusEmbedder(
        query_encoder=encoder,
        max_epochs=1,
        epoch_size=256,
        validation_fraction=None,
        random_state=0,
    ).fit(sets)
    save(embedder, path.parent / "embedder.sklocus")


def streamed(folder, n_files, batch_models):
    """Run in a fresh process: embed the first n_files files, in flat memory."""
    from sklocus import embed_parquet, load

    embedder = load(folder.parent / "embedder.sklocus")
    files = sorted(folder.glob("*.parquet"))[:n_files]
    import pyarrow.dataset as ds

    source = ds.dataset([str(f) for f in files], format="parquet")
    start = time.perf_counter()
    n_models = embed_parquet(
        embedder, source, folder.parent / "streamed.parquet", batch_models=batch_models
    )
    elapsed = time.perf_counter() - start
    return n_models, elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_peak_mib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def on_cluster(folder, n_files):
    """The Dask path on 2 worker processes of one thread (their own peaks)."""
    import dask.dataframe as dd
    from distributed import Client, LocalCluster

    from sklocus import load
    from sklocus.dask import embed_dask

    embedder = load(folder.parent / "embedder.sklocus")
    files = sorted(str(f) for f in folder.glob("*.parquet"))[:n_files]
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            worker_dashboard_address=None,
        ) as cluster,
        Client(cluster) as client,
    ):
        start_peaks = client.run(worker_peak_mib)
        start = time.perf_counter()
        # One partition per file: each file holds whole models.
        frame = dd.read_parquet(files, split_row_groups=False)
        out = folder.parent / "dask-out"
        embed_dask(embedder, frame, check_partitions=False).to_parquet(out)
        elapsed = time.perf_counter() - start
        peaks = client.run(worker_peak_mib)
        n_models = len(dd.read_parquet(out))
    return n_models, elapsed, sorted(start_peaks.values()), sorted(peaks.values())


def in_fresh_process(function, *args):
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=100_000)
    parser.add_argument("--evals", type=int, default=256)
    parser.add_argument("--batch-models", type=int, default=1024)
    parser.add_argument("--out", default="docs/performance.md")
    arguments = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    date = datetime.date.today().isoformat()
    n_files = -(-arguments.models // MODELS_PER_FILE)
    sizes = sorted({max(1, n_files // 10), n_files})
    rows = []
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary) / "evals"
        start = time.perf_counter()
        write_dataset(folder, arguments.models, arguments.evals)
        made = time.perf_counter() - start
        on_disk = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
        print(f"dataset: {made:.0f} s, {on_disk:.0f} MiB", flush=True)
        in_fresh_process(fitted_embedder, folder)
        for files in sizes:
            n, seconds, peak = in_fresh_process(
                streamed, folder, files, arguments.batch_models
            )
            rows.append(("streaming, 1 process", n, seconds, f"{peak:.0f} MiB"))
            print(rows[-1], flush=True)
        for files in sizes:
            n, seconds, before, peaks = on_cluster(folder, files)
            text = " and ".join(f"{p:.0f}" for p in peaks) + " MiB"
            text += " (" + " and ".join(f"{p:.0f}" for p in before) + " MiB idle)"
            rows.append(("Dask, 2 workers x 1 thread", n, seconds, text))
            print(rows[-1], flush=True)
    text = section(arguments, commit, date, on_disk, rows)
    write_section(arguments.out, "streaming", text)
    print(text)


def peak_of(text):
    """The largest MiB figure before any parenthesis: the busiest worker's peak."""
    return max(float(part.split()[0]) for part in text.split(" (")[0].split(" and "))


def section(arguments, commit, date, on_disk, rows):
    """The page's section: the figures, and each against the issue's goals."""
    command = (
        f"python benchmarks/streaming.py --models {arguments.models} "
        f"--evals {arguments.evals} --batch-models {arguments.batch_models}"
    )
    lines = [
        f"## Embedding beyond memory: {arguments.models:,} models x "
        f"{arguments.evals} evaluations",
        "",
        f"Written by `{command}` at commit {commit} on {date}: a sorted Parquet",
        f"dataset of {on_disk:.0f} MiB in files of {MODELS_PER_FILE:,} models, "
        "4,096 queries with 384-d",
        "precomputed vectors, the default network. Goals (issue 20): flat memory,",
        "the same peak however many models; models per second near `transform`'s",
        "on lists of dicts (about 490/s on this machine in the section above).",
        "",
        "| path | models | elapsed | models/s | peak resident memory |",
        "|---|---|---|---|---|",
        *[
            f"| {path} | {n:,} | {s:.0f} s | {n / s:.0f} | {peak} |"
            for path, n, s, peak in rows
        ],
        "",
        f"The streaming path reads {arguments.batch_models:,} models at a time "
        "(`embed_parquet`, peak of the",
        "whole process, interpreter and torch included). The Dask path reads one",
        "file per partition (`dd.read_parquet`) and writes with `to_parquet`; its",
        "peaks are each worker's `VmHWM`, the embedder scattered once and fetched",
        "by each.",
    ]
    for path in dict.fromkeys(row[0] for row in rows):
        mine = [row for row in rows if row[0] == path]
        if len(mine) == 2:
            (_, n_small, _, small), (_, n_large, s_large, large) = mine
            lines += [
                "",
                f"{path}: {n_large // n_small}x the models, peak memory x"
                f"{peak_of(large) / peak_of(small):.2f} (goal: flat); "
                f"{n_large / s_large:.0f} models/s.",
            ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
