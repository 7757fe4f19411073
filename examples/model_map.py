"""
The model map of a pool
=======================

One self-contained HTML file shows a pool of models the way the LOCUS paper's
page does: a 3-D map of their embeddings to rotate and zoom, each model's
accuracy by benchmark, its nearest neighbours (click one to follow it) and
near-duplicates, portfolios of k models (or within a total parameter count) with
their routing accuracy on held-out queries, and how a model's embedding
converges as evaluations are added. It needs plotly
(``pip install "sklocus[report]"``) and opens offline.

This script maps the Open LLM Leaderboard models when the environment variable
``SKLOCUS_OPENLLM`` names a folder of them in ``load_evaluations``' layout, and
synthetic models otherwise.
"""

# %%
# The pool
# --------
#
# Evaluation sets, each query's benchmark, each model's metadata, and a test
# split of the queries, left out of the embeddings and used to measure routing.
import os
import time
from pathlib import Path

import pandas as pd

from sklocus import LocusEmbedder
from sklocus.datasets import load_evaluations, make_evaluations
from sklocus.report import write_map

folder = os.environ.get("SKLOCUS_OPENLLM")
if folder:
    data = load_evaluations(folder)
    names, sets, encoder = data.model_names, data.evaluation_sets, data.encoder
    queries = data.queries
    groups = dict(zip(queries["query_id"], queries["benchmark"]))
    test = queries.loc[queries["split"] == "test", "query_id"].tolist()
    # The leaderboard writes -1 where a model's size is unknown: say so with NaN,
    # which leaves those models out of the portfolios within a total cost.
    metadata = data.models[["params_b", "arch"]]
    metadata = metadata.assign(params_b=metadata["params_b"].where(lambda p: p > 0))
    color = "arch"
else:
    data = make_evaluations(n_models=300, n_queries=800, random_state=0)
    names, sets, encoder = data.model_names, data.evaluation_sets, data.encoder
    groups = {q: f"benchmark {b}" for q, b in zip(data.query_ids, data.benchmarks)}
    test = data.query_ids[640:]
    metadata = pd.DataFrame({"params_b": data.params_b, "family": data.families})
    color = "cluster"
print(f"{len(names)} models, {len(test)} test queries")

# %%
# An embedder
# -----------
#
# Trained on the evaluations outside the test split. A short training keeps
# this example quick; a map for real use deserves the default settings, or an
# embedder trained once and loaded with ``sklocus.load``.
held = set(test)
train = [{q: s for q, s in e.items() if q not in held} for e in sets]
embedder = LocusEmbedder(
    query_encoder=encoder,
    embedding_dim=32,
    n_latents=8,
    encoder_sizes=(8, 128),
    decoder_size=128,
    max_epochs=4,
    epoch_size=512,
    lr=3e-3,
    predictor_lr=1e-2,
    random_state=0,
).fit(train)

# %%
# The map
# -------
#
# ``write_map`` embeds every model on its evaluations outside the test split,
# and computes everything the page shows; opening the file needs no network.
start = time.perf_counter()
path = write_map(
    Path("model-map.html"),
    embedder,
    names,
    sets,
    query_groups=groups,
    metadata=metadata,
    color=color,
    test_queries=test,
    cost="params_b",  # portfolios within a total parameter count, too
    title="A pool of models",
)
seconds = time.perf_counter() - start
print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB) in {seconds:.1f} s")
print("open it in a browser: click a model, follow its neighbours, choose k")
print("or a total parameter count")
