"""
A router served over HTTP
=========================

A production router is a process that loads a model file once and answers
routing requests for a long time, while new models are onboarded. ``sklocus
serve`` is that process: this example saves a router, starts the server on the
loopback, routes queries over HTTP (the same routes as in Python), onboards a
model while serving, and shuts the server down. It needs the ``serve`` extra
(``pip install "sklocus[serve]"``) and httpx for the client.
"""

# %%
# A router in a file
# ------------------
#
# A small pool of synthetic models, an embedder trained in seconds, and a router
# that embeds every model with it (``FrozenEstimator``: no second training).
# ``--write-back`` below saves the router after each change, so the file lives
# in a temporary folder here.
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from sklearn.frozen import FrozenEstimator

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations

data = make_evaluations(n_models=60, n_queries=400, random_state=0)
pool, newcomer = data.evaluation_sets[:-1], data.evaluation_sets[-1]
embedder = LocusEmbedder(
    query_encoder=data.encoder,
    embedding_dim=32,
    n_latents=8,
    encoder_sizes=(8, 128),
    decoder_size=128,
    max_epochs=4,
    epoch_size=512,
    lr=3e-3,
    predictor_lr=1e-2,
    random_state=0,
).fit(pool)
router = LocusRouter(FrozenEstimator(embedder))
router.fit_evaluations(pool, data.model_names[:-1])
queries = data.query_ids
folder = tempfile.TemporaryDirectory()
path = Path(folder.name) / "router.sklocus"
sklocus.save(router, path)

# %%
# Start the server
# ----------------
#
# ``sklocus serve MODEL --port PORT`` listens on 127.0.0.1 by default. It loads
# the file, warms the query encoder up, and answers ``GET /health`` once ready.
# (An embedder file serves too, given the pool's evaluation table:
# ``sklocus serve model.sklocus evals.csv``.)
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
server = subprocess.Popen(
    [
        sys.executable,
        "-m",
        "sklocus",
        "serve",
        str(path),
        "--port",
        str(port),
        "--write-back",
        "--log-level",
        "warning",  # no line per request in this example's output
    ],
)
client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
for _ in range(600):
    try:
        if client.get("/health").status_code == 200:
            break
    except httpx.TransportError:
        time.sleep(0.1)
print("health:", client.get("/health").json())

# %%
# Route over HTTP
# ---------------
#
# ``POST /route`` takes the queries (texts, or here the ids that the router's
# precomputed encoder knows) and answers, for each, the chosen model and the
# ``k`` best with their probability of answering correctly.
asked = queries[:5]
routes = client.post("/route", json={"queries": asked, "k": 2}).json()["routes"]
for route in routes[:2]:
    print(route)
in_python = router.predict(asked).tolist()
print("same routes as in Python:", [r["model"] for r in routes] == in_python)

# %%
# Onboard a model while serving
# -----------------------------
#
# ``POST /models`` embeds a new model from its evaluations with one forward
# pass; nothing else changes, and requests served meanwhile see the pool before
# or after, never half of it. With ``--write-back`` the file is replaced
# atomically, so a restart serves the grown pool.
body = {"name": data.model_names[-1], "evaluations": newcomer}
print(client.post("/models", json=body).json())
print("models in the file:", len(sklocus.load(path).classes_))

# %%
# Bad requests name the field
# ---------------------------
#
# A 4xx answer lists each fault with where it lies, as FastAPI's validation
# errors do.
bad = client.post("/route", json={"queries": asked, "exclude": ["no-such-model"]})
print(bad.status_code, bad.json()["detail"])

# %%
# Shut down
# ---------
#
# Ctrl-C (SIGINT), or SIGTERM from a process manager, stops the server cleanly.
client.close()
server.send_signal(signal.SIGINT)
server.wait(timeout=30)
print("server exit status:", server.returncode)
folder.cleanup()
