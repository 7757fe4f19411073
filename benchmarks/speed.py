"""How close sklocus runs to this machine's matrix-multiply peak (issue 7).

One command measures everything and writes ``docs/performance.md``::

    python benchmarks/speed.py [--scale-models 100000] [--out docs/performance.md]
        [--devices cpu cuda] [--scale-device cpu] [--skip-encoding]

Figures: the float32 matmul peak; ``transform`` of 112 models x 4,096 evaluations
with 768-d query vectors at the default architecture; ``predict_correctness`` of
4,096 queries x 112 models; training throughput; a streamed ``transform`` of many
models x 256 evaluations with its peak resident memory; ``SentenceEncoder``
throughput with and without its cache; and, where CUDA is available, the first
four on the GPU (``--devices``; ``--scale-device cuda`` streams there too).

Nominal FLOPs are those of the straightforward computation METHOD.md describes,
counted by torch's ``FlopCounterMode`` (2 FLOPs per multiply-add; matrix products
and attention products only) while running that computation on a small batch,
then scaled by the number of models: the tokenizer MLP applied to every (model,
query) pair's full feature vector, every linear layer and attention product of the
encoder; for scoring, the query projection once per query and the predictor MLP on
every pair's concatenated features. So they follow any change of the architecture.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import platform
import resource
import time
from pathlib import Path

import numpy as np
import torch
from _sections import keep_sections, write_section
from provenance import commit
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from sklocus import LocusEmbedder
from sklocus.datasets import make_evaluations
from sklocus.evaluations import check_evaluation_sets, to_matrix
from sklocus.nn.inference import GPU_MAX_TOKENS
from sklocus.nn.training import draws_per_model

N_MODELS, N_EVALS, N_QUERIES, QUERY_DIM = 112, 4096, 4096, 768


def best_time(function, repeats=5):
    """Least wall time of ``repeats`` calls after one warm-up call."""
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def synchronize(device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_peak(device, size=4096):
    """float32 FLOP/s of a large square matrix product."""
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)

    def product():
        a @ b
        synchronize(device)

    return 2 * size**3 / best_time(product)


def straightforward_tokens(network, vectors, scores):
    """The tokenizer MLP on every (model, query) pair's full features."""
    signed = vectors * (2 * scores[..., None] - 1)
    features = torch.cat([vectors, scores[..., None], signed], -1)
    return network.encoder.tokenizer.mlp(features)


def encode_tokens(network, tokens, fold_pooling):
    """Bottleneck layers, pooling and output; pooling folded or as a plain block."""
    encoder = network.encoder
    for layer in encoder.layers:
        tokens = layer(tokens)
    if fold_pooling:
        pooled = encoder.pooling(tokens)
    else:
        seed = encoder.pooling.seed.expand(len(tokens), -1, -1)
        pooled = encoder.pooling.block(seed, tokens)[:, 0]
    return encoder.output(pooled)


def straightforward_embedding(network, vectors, scores):
    """The encoder as METHOD.md writes it: every pair tokenized from its features,
    the pooling block projecting every token to keys and values."""
    tokens = straightforward_tokens(network, vectors, scores)
    return encode_tokens(network, tokens, fold_pooling=False)


def embedding_variants(network, table, codes, scores, batch, device):
    """Each optimisation added in turn, on the same sets: the last in chunks of
    ``batch`` sets, the others in the large batches transform used before."""
    tokenizer = network.encoder.tokenizer

    def chunks(step, size):
        def run():
            with torch.inference_mode():
                projected = tokenizer.project_queries(table)
                for first in range(0, len(codes), size):
                    part = slice(first, first + size)
                    step(projected, codes[part], scores[part])
            synchronize(device)

        return run

    # The batches transform used on every device before CPU batches were sized to
    # the cache (GPUs still use them).
    large = max(GPU_MAX_TOKENS // codes.shape[1], 1)
    encoder = network.encoder.embed_projected
    return {
        f"straightforward (every pair tokenized from its 2 x 768 + 1 features; "
        f"pooling projects every token), batches of {large} sets": chunks(
            lambda _, c, s: straightforward_embedding(network, table[c], s), large
        ),
        "+ each distinct query projected once by the tokenizer's first layer": chunks(
            lambda p, c, s: encode_tokens(network, tokenizer(p, c, s), False), large
        ),
        "+ pooling without key and value projections": chunks(encoder, large),
        f"+ batches of {batch} sets ({batch * codes.shape[1]:,} tokens; on a GPU "
        "they stay large) (the current encoder)": chunks(encoder, batch),
    }


def straightforward_scores(network, embeddings, vectors):
    """The predictor MLP on every (model, query) pair's ``[z, u, z * u]``."""
    predictor = network.predictor
    u = predictor.project_query(vectors)[None].expand(len(embeddings), -1, -1)
    z = embeddings[:, None].expand_as(u)
    return predictor.mlp(torch.cat([z, u, z * u], -1))


def _attention_flops(query_shape, key_shape, value_shape, *args, **kwargs):
    """Both attention products (scores and weighted values), as torch counts them."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


# torch's counter knows the CUDA attention kernels but not the CPU one.
_CUSTOM_FLOPS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _attention_flops
}


def count_flops(function, *args):
    """FLOPs of matrix and attention products (the counter needs autograd on)."""
    with FlopCounterMode(display=False, custom_mapping=_CUSTOM_FLOPS) as counter:
        function(*args)
    return counter.get_total_flops()


def nominal_embedding_flops(network, n_models, n_evals):
    """Count on two models and scale: the computation is per model."""
    vectors = torch.randn(2, n_evals, network.encoder.tokenizer.query_dim)
    scores = torch.randint(0, 2, (2, n_evals)).float()
    return count_flops(straightforward_embedding, network, vectors, scores) * (
        n_models / 2
    )


def nominal_scoring_flops(network, n_models, n_queries):
    width = network.predictor.project_query.in_features
    embeddings = torch.randn(2, network.predictor.project_query.out_features)
    vectors = torch.randn(n_queries, width)
    per_two = count_flops(straightforward_scores, network, embeddings, vectors)
    projection = 2 * n_queries * width * network.predictor.project_query.out_features
    return (per_two - projection) * (n_models / 2) + projection


def fitted_embedder(data, device):
    """An embedder at the default architecture; one short epoch is enough to time."""
    return LocusEmbedder(
        query_encoder=data.encoder,
        max_epochs=1,
        epoch_size=32,
        validation_fraction=None,
        device=device,
        random_state=0,
    ).fit(data.evaluation_sets)


def rate_row(name, seconds, flops, peak):
    rate = flops / seconds
    return (
        f"| {name} | {seconds * 1e3:.1f} ms | {flops / 1e9:.1f} GFLOP "
        f"| {rate / 1e9:.1f} GFLOP/s | {rate / peak:.0%} |"
    )


def measure_device(device, data, queries):
    """Embedding and scoring against the peak on one device."""
    peak = matmul_peak(device)
    embedder = fitted_embedder(data, device)
    network = embedder.net_.module_.cpu()
    embed_flops = nominal_embedding_flops(network, N_MODELS, N_EVALS)
    score_flops = nominal_scoring_flops(network, N_MODELS, len(queries))
    network.to(device)
    sets = data.evaluation_sets

    def embed():
        embedder.transform(sets)
        synchronize(device)

    z = embedder.transform(sets)
    table = torch.as_tensor(data.query_vectors, device=device)
    codes = torch.arange(N_EVALS, device=device).expand(N_MODELS, -1)
    scores, _ = to_matrix(sets, queries=data.query_ids)
    # A row of evaluations per model, as the encoder reads them.
    scores = torch.as_tensor(scores.T.copy(), dtype=torch.float32, device=device)
    query_table = torch.as_tensor(
        embedder.query_encoder_.transform(queries), device=device
    )
    z_tensor = torch.as_tensor(z, device=device)

    def straightforward_score():
        with torch.inference_mode():
            for first in range(0, N_MODELS, 16):
                straightforward_scores(
                    network, z_tensor[first : first + 16], query_table
                )
        synchronize(device)

    variants = [
        rate_row(name, best_time(run, repeats=2), embed_flops, peak)
        for name, run in embedding_variants(
            network, table, codes, scores, embedder._max_tokens() // N_EVALS, device
        ).items()
    ]

    def score():
        embedder.predict_correctness(z, queries)
        synchronize(device)

    precision_rows = []
    for precision in ("bfloat16", "float16"):
        embedder.set_params(inference_precision=precision)
        seconds = best_time(embed, repeats=1)
        z_low = embedder.transform(sets)
        deviation = np.linalg.norm(z_low - z, axis=1) / np.linalg.norm(z, axis=1)
        precision_rows.append(
            f"| {precision} | {seconds * 1e3:.1f} ms | {deviation.max():.2e} |"
        )
    embedder.set_params(inference_precision="float32")
    return (
        peak,
        precision_rows,
        [
            *variants,
            rate_row(
                f"transform: embed {N_MODELS} models x {N_EVALS} evaluations",
                best_time(embed),
                embed_flops,
                peak,
            ),
            rate_row(
                "score, straightforward (the MLP on every pair's [z, u, z * u])",
                best_time(straightforward_score, repeats=2),
                score_flops,
                peak,
            ),
            rate_row(
                f"predict_correctness: {len(queries)} queries x {N_MODELS} models",
                best_time(score),
                score_flops,
                peak,
            ),
        ],
    )


def training_throughput(device):
    """Model draws per second of ``fit`` at the default settings."""
    data = make_evaluations(
        n_models=400,
        n_queries=2000,
        evals_per_model=1000,
        query_dim=384,
        random_state=0,
    )
    # No validation split, so that an epoch's duration is training alone.
    embedder = LocusEmbedder(
        query_encoder=data.encoder,
        max_epochs=3,
        validation_fraction=None,
        device=device,
        random_state=0,
    ).fit(data.evaluation_sets)
    # An epoch draws every model until it has at least epoch_size draws
    # ("auto" resolved by the pool's size, as fit resolves it).
    n_models = len(data.evaluation_sets)
    epoch_size = embedder._schedule(check_evaluation_sets(data.evaluation_sets))[2]
    draws = n_models * draws_per_model(n_models, epoch_size)
    durations = [row["dur"] for row in embedder.history_[1:]]
    return draws / np.mean(durations), draws


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def streamed_scale(n_models, device, batch=2000, n_evals=256):
    """Stream ``n_models`` random models through ``transform`` in batches."""
    data = make_evaluations(
        n_models=64,
        n_queries=4096,
        evals_per_model=n_evals,
        query_dim=384,
        random_state=0,
    )
    embedder = fitted_embedder(data, device)
    ids = np.array(data.query_ids)
    rng = np.random.default_rng(0)
    out = np.empty((n_models, embedder.embedding_dim), dtype=np.float32)
    checkpoints = []
    start = time.perf_counter()
    for first in range(0, n_models, batch):
        size = min(batch, n_models - first)
        sets = [
            dict(
                zip(
                    ids[rng.choice(len(ids), n_evals, replace=False)].tolist(),
                    rng.integers(0, 2, n_evals).astype(float).tolist(),
                )
            )
            for _ in range(size)
        ]
        out[first : first + size] = embedder.transform(sets)
        done = first + size
        if done in (n_models // 10, n_models) or done == batch:
            gpu = (
                torch.cuda.max_memory_allocated() / 2**20
                if device.startswith("cuda")
                else None
            )
            checkpoints.append((done, time.perf_counter() - start, peak_rss_mib(), gpu))
    return checkpoints


def encoding_throughput(n_texts=500):
    from sklocus import SentenceEncoder

    texts = [
        f"Question {i}: what is {i} times {i + 7}, in words?" for i in range(n_texts)
    ]
    encoder = SentenceEncoder()
    encoder.transform(["Load the model before the clock starts."])
    start = time.perf_counter()
    encoder.transform(texts)
    first = time.perf_counter() - start
    start = time.perf_counter()
    encoder.transform(texts)
    second = time.perf_counter() - start
    return n_texts / first, n_texts / second


def input_checks():
    """Time check_evaluation_sets on 112 x 4,096 evaluations, from each form.

    That is what ``transform`` and ``fit`` do to their input before any network
    runs: validate every score and query, and flatten the sets into arrays.
    """
    rng = np.random.default_rng(0)
    queries = [f"q{i:05d}" for i in range(N_EVALS)]
    dense = [
        dict(zip(queries, rng.integers(0, 2, N_EVALS).astype(float).tolist()))
        for _ in range(N_MODELS)
    ]
    # Each model's queries in an order of its own: no two sets share a sequence.
    shuffled = [
        {queries[j]: evaluations[queries[j]] for j in rng.permutation(N_EVALS)}
        for evaluations in dense
    ]
    ragged = check_evaluation_sets(shuffled)
    rows = [
        ("dicts, every model on the same queries in the same order", dense),
        ("dicts, each model's queries in an order of its own", shuffled),
        ("the ragged form (RaggedEvaluations)", ragged),
    ]
    lines = [
        "## Checking the input: 112 models x 4,096 evaluations",
        "",
        f"Written by `python benchmarks/speed.py --only-input` at commit {commit()} on "
        f"{datetime.date.today()}: the least of 7 calls of `check_evaluation_sets`, "
        "which `transform` and `fit` run on their input (validating every score "
        "and query and flattening the sets into arrays). Goals of issue 21: at "
        "most 30 ms from dicts, at most 5 ms from the columnar input.",
        "",
        "| input | time |",
        "|---|---|",
    ]
    for label, given in rows:
        seconds = best_time(lambda given=given: check_evaluation_sets(given), 7)
        lines.append(f"| {label} | {1000 * seconds:.1f} ms |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale-models", type=int, default=100_000)
    parser.add_argument("--out", default="docs/performance.md")
    parser.add_argument(
        "--devices",
        nargs="+",
        default=["cpu"] + (["cuda"] if torch.cuda.is_available() else []),
        help="devices to measure embedding, scoring and training on",
    )
    parser.add_argument("--scale-device", default="cpu")
    parser.add_argument(
        "--skip-encoding",
        action="store_true",
        help="leave out SentenceEncoder (which needs all-MiniLM-L6-v2 installed)",
    )
    parser.add_argument(
        "--only-input",
        action="store_true",
        help="measure only the checking of input (its own section of --out)",
    )
    arguments = parser.parse_args()
    write_section(arguments.out, "input", input_checks())
    if arguments.only_input:
        return

    data = make_evaluations(
        n_models=N_MODELS,
        n_queries=N_EVALS,
        evals_per_model=None,
        query_dim=QUERY_DIM,
        random_state=0,
    )
    queries = data.query_ids[:N_QUERIES]
    command = " ".join(
        [
            f"--scale-models {arguments.scale_models}",
            f"--devices {' '.join(arguments.devices)}",
            f"--scale-device {arguments.scale_device}",
            *(["--skip-encoding"] if arguments.skip_encoding else []),
        ]
    )
    on_gpu = any(device.startswith("cuda") for device in arguments.devices)
    gpu_name = f", {torch.cuda.get_device_name()}" if on_gpu else ""
    lines = [
        "# Performance",
        "",
        f"Written by `python benchmarks/speed.py {command}` at commit {commit()} on "
        f"{datetime.date.today()}, {platform.machine()}, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}"
        f"{gpu_name}.",
        "Every figure comes from that run; nominal FLOPs and the peak are defined in",
        "the script's docstring. A rate above 100% of the peak means faster than the",
        "straightforward computation could run at the machine's matmul peak.",
    ]
    for device in arguments.devices:
        peak, precision_rows, rows = measure_device(device, data, queries)
        print(device, peak, rows, flush=True)
        lines += [
            "",
            f"## {device}: embedding and scoring",
            "",
            f"float32 matmul peak (4096 x 4096 product): {peak / 1e9:.1f} GFLOP/s.",
            "",
            "| operation | time | nominal FLOPs | effective rate | of peak |",
            "|---|---|---|---|---|",
            *rows,
            "",
            f"`transform` of the same {N_MODELS} models with `inference_precision` "
            "(autocast),",
            "and the largest relative change of an embedding against float32:",
            "",
            "| precision | time | largest relative change |",
            "|---|---|---|",
            *precision_rows,
        ]
        throughput, draws = training_throughput(device)
        lines += [
            "",
            f"Training throughput (fit at the default settings but no validation "
            f"split, 384-d queries, epochs of {draws} model draws): "
            f"{throughput:.0f} model sets per second.",
        ]
    if not on_gpu:
        lines += [
            "",
            "No GPU measured in this run: `bash benchmarks/gpu_check.sh OUTDIR` on a",
            "machine with one writes the GPU figures (docs/performance-cuda.md).",
        ]
    # In a fresh process, so that its peak memory is the streaming's alone.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        checkpoints = pool.apply(
            streamed_scale, (arguments.scale_models, arguments.scale_device)
        )
    lines += [
        "",
        f"## Scale: {arguments.scale_models:,} models x 256 evaluations, streamed "
        f"({arguments.scale_device})",
        "",
        "Batches of 2,000 random models (384-d queries) through `transform`, in a",
        "process of their own; its peak resident memory so far (input included):",
        "",
        "| models embedded | elapsed | peak RSS | peak GPU memory allocated |",
        "|---|---|---|---|",
        *[
            f"| {n:,} | {s:.0f} s | {m:.0f} MiB | "
            f"{'-' if g is None else f'{g:.0f} MiB'} |"
            for n, s, m, g in checkpoints
        ],
    ]
    if arguments.skip_encoding:
        Path(arguments.out).write_text(keep_sections(arguments.out, "\n".join(lines)))
        return
    first_pass, cached = encoding_throughput()
    lines += [
        "",
        "## Query encoding (SentenceEncoder, all-MiniLM-L6-v2)",
        "",
        f"First pass: {first_pass:.0f} queries/s; second pass (in-memory cache): "
        f"{cached:.0f} queries/s.",
    ]
    # Other scripts' sections of the page (benchmarks/serve.py's) stay.
    Path(arguments.out).write_text(keep_sections(arguments.out, "\n".join(lines)))


if __name__ == "__main__":
    main()
