"""Where the time goes on a GPU: transform, predict_correctness, refinement, an epoch.

Runs on a machine with CUDA (``benchmarks/gpu_check.sh`` calls it). Each
operation of ``benchmarks/speed.py``'s pool (112 models x 4,096 evaluations,
768-d queries, the default architecture) is timed stage by stage with CUDA
synchronised between stages, then run once under ``torch.profiler`` with the
top operators by self CPU time and by self CUDA time printed::

    python benchmarks/gpu_profile.py [--out gpu-profile.txt]

``--device cpu --models 8 --evals 256`` runs the same on a CPU, small, to try it.

Stages of ``transform``: checking the dicts (``check_evaluation_sets``), encoding
the queries (the encoder's lookup and its checks), and the network's pass (the
query table to the device, padding, the batches, the copy back). Of
``predict_correctness``: encoding, and ``score_pairs``.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from speed import fitted_embedder
from torch.profiler import ProfilerActivity, profile

from sklocus import LocusEmbedder
from sklocus.datasets import make_evaluations
from sklocus.evaluations import check_evaluation_sets

QUERY_DIM = 768


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(function, repeats=5):
    """Least wall time in ms of ``repeats`` synchronised calls after a warm-up."""
    function()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * min(times)


def profiled(name, function, lines, rows=12):
    """Run ``function`` once under torch.profiler and keep its top operators."""
    function()
    synchronize()
    gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * gpu
    with profile(activities=activities) as prof:
        function()
        synchronize()
    table = prof.key_averages()
    keys = ["self_cpu_time_total"] + ["self_cuda_time_total"] * gpu
    for key in keys:
        lines.append(f"\n### {name}: top operators by {key}\n")
        lines.append(table.table(sort_by=key, row_limit=rows, max_name_column_width=50))


def default_schedule(data, device, max_epochs):
    """An embedder at the default settings, but no validation split."""
    return LocusEmbedder(
        query_encoder=data.encoder,
        max_epochs=max_epochs,
        validation_fraction=None,
        device=device,
        random_state=0,
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-profile.txt")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", type=int, default=112)
    parser.add_argument("--evals", type=int, default=4096)
    arguments = parser.parse_args()
    device, n_models, n_evals = arguments.device, arguments.models, arguments.evals
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    lines = [f"{name}, torch {torch.__version__}, {n_models} models x {n_evals}"]

    data = make_evaluations(
        n_models=n_models,
        n_queries=n_evals,
        evals_per_model=n_evals,
        query_dim=QUERY_DIM,
        random_state=0,
    )
    sets = data.evaluation_sets
    embedder = fitted_embedder(data, device)
    ragged = check_evaluation_sets(sets)
    vectors = embedder._encode(ragged.queries)
    z = embedder.transform(sets)
    queries = list(data.query_ids)

    stages = {
        "transform, whole (dicts)": lambda: embedder.transform(sets),
        "transform, whole (RaggedEvaluations)": lambda: embedder.transform(ragged),
        "  check_evaluation_sets (dicts)": lambda: check_evaluation_sets(sets),
        "  encode the queries": lambda: embedder._encode(ragged.queries),
        "  the network's pass (_embed)": lambda: embedder._embed(ragged, vectors),
        "predict_correctness, whole": lambda: embedder.predict_correctness(z, queries),
        "  encode the queries again": lambda: embedder._encode(queries),
        "  score_pairs (_predict)": lambda: embedder._predict(z, vectors),
    }
    lines.append("\n| stage | ms (least of 5) |\n|---|---|")
    lines += [f"| {name} | {timed(run):.2f} |" for name, run in stages.items()]

    refining = copy.deepcopy(embedder).set_params(refine_steps=50)
    lines.append(
        f"| transform with refine_steps=50 (RaggedEvaluations) "
        f"| {timed(lambda: refining.transform(ragged), repeats=3):.2f} |"
    )

    start = time.perf_counter()
    trained = default_schedule(data, device, max_epochs=2).fit(sets)
    elapsed = time.perf_counter() - start
    epochs = ", ".join(f"{row['dur']:.2f}" for row in trained.history_)
    lines.append(
        f"\nfit, 2 epochs of {trained._schedule(ragged)[2]} model draws: "
        f"{elapsed:.2f} s in all, "
        f"epochs {epochs} s"
    )

    profiled("transform (RaggedEvaluations)", lambda: embedder.transform(ragged), lines)
    profiled(
        "predict_correctness", lambda: embedder.predict_correctness(z, queries), lines
    )
    profiled("refinement, 50 steps", lambda: refining.transform(ragged), lines)

    one_epoch = default_schedule(data, device, max_epochs=1)
    profiled("fit, one epoch", lambda: one_epoch.fit(sets), lines, rows=15)

    text = "\n".join(lines)
    print(text)
    with open(arguments.out, "w") as handle:
        handle.write(text + "\n")


if __name__ == "__main__":
    main()
