"""
From your own table to a saved router
=====================================

Evaluation harnesses log one row per evaluation: which model, which query, what
score. This example reads such a long table from a CSV file, fits a router on
it, saves the router to one ``.sklocus`` file, and serves it from a fresh Python
process, as a production service would, checking that the routes match.
"""

# %%
# A long table of evaluations
# ---------------------------
#
# Stand-in for your harness's log: the synthetic evaluations of
# :func:`~sklocus.datasets.make_evaluations` as rows of (model, query, score),
# written as CSV into a temporary folder. With your own data, start from your
# file. The queries here are ids with precomputed vectors (``data.encoder``);
# with query texts, leave ``query_encoder`` out and the default sentence encoder
# embeds them.
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd
from sklearn.frozen import FrozenEstimator

import sklocus
from sklocus import LocusEmbedder, LocusRouter, from_long
from sklocus.datasets import make_evaluations

data = make_evaluations(n_models=120, n_queries=600, random_state=0)
rows = [
    (name, query, score)
    for name, evaluations in zip(data.model_names, data.evaluation_sets)
    for query, score in evaluations.items()
]
folder = tempfile.TemporaryDirectory()
csv_path = Path(folder.name) / "evaluations.csv"
pd.DataFrame(rows, columns=["model", "query", "score"]).to_csv(csv_path, index=False)

# %%
# Read it back as evaluation sets
# -------------------------------
#
# :func:`~sklocus.from_long` turns the table into one ``{query: score}`` dict per
# model, and the names of the models. ``model=``, ``query=`` and ``score=`` name
# the columns when yours are called otherwise; repeated (model, query) rows are
# an error unless ``duplicates="mean"`` or ``"majority"`` says how to merge them.
table = pd.read_csv(csv_path)
print(table.head(3))
sets, names = from_long(table)
print(f"{len(table)} rows -> {len(sets)} evaluation sets")

# %%
# Train an embedder, then route with it
# -------------------------------------
#
# The embedder learns from the evaluation sets. The settings train a small
# network in seconds (the defaults, sized to the pool, train for minutes). The
# router takes the same sets, with the models' names. Wrapped in
# ``FrozenEstimator``, the trained embedder is used as it is: the router only
# embeds every model (given a bare embedder, it would train a new one, and
# warn).
embedder = LocusEmbedder(
    query_encoder=data.encoder,
    embedding_dim=32,
    n_latents=8,
    encoder_sizes=(8, 128),
    decoder_size=128,
    max_epochs=6,
    epoch_size=512,
    lr=3e-3,
    predictor_lr=1e-2,
    random_state=0,
).fit(sets)
router = LocusRouter(FrozenEstimator(embedder)).fit_evaluations(sets, names)
incoming = data.query_ids[:8]
routes = router.predict(incoming)
print(pd.Series(routes, index=incoming, name="model"))

# %%
# Save the router
# ---------------
#
# :func:`sklocus.save` writes one safetensors file: weights, embeddings and
# settings, no pickle. The embedder travels in it, frozen, with the query
# encoder's vectors.
model_path = Path(folder.name) / "router.sklocus"
sklocus.save(router, model_path)
print(f"{model_path.name}: {model_path.stat().st_size / 1e6:.2f} MB")

# %%
# Serve it from a fresh process
# -----------------------------
#
# :func:`sklocus.load` rebuilds the router from data alone and runs nothing from
# the file. A new Python process, sharing nothing with this one but the file,
# loads it and routes the same queries.
server = textwrap.dedent(
    """
    import json, sys
    import sklocus

    router = sklocus.load(sys.argv[1])
    queries = json.loads(sys.argv[2])
    print(json.dumps(router.predict(queries).tolist()))
    """
)
served = subprocess.run(
    [sys.executable, "-c", server, str(model_path), json.dumps(incoming)],
    capture_output=True,
    text=True,
    check=True,
)
served_routes = json.loads(served.stdout)
print("routes from the fresh process:", served_routes)
print(f"same routes in both processes: {served_routes == routes.tolist()}")

folder.cleanup()
