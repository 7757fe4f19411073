"""Latency and throughput of a served router, against the query encoder (issue 20).

    python benchmarks/serve.py [--out docs/performance.md] [--repeats 200]

Builds a router over 1,000 synthetic models whose queries are texts encoded by
all-MiniLM-L6-v2 (an embedder at the default architecture, trained for one short
epoch: speed does not depend on training), then measures on this machine:

- routing one text query end to end (encoding included), p50 and p99, in
  process (``LocusRouter.rank_models``) and over HTTP (``sklocus serve`` in a
  process of its own, on the loopback, through two clients that each hold one
  keep-alive connection, as a user's persistent client does: an
  ``httpx.Client``, and the standard library's ``http.client``, which spends
  about 1.4 ms less per request in the client), beside the encoder alone on the
  same texts, which is the floor, and ``GET /health``, the HTTP round trip with
  nothing computed;
- queries per second at batches of 1, 32 and 256, in process and over HTTP;
- single-query routing among 100 models against among 1,000.

Every query is a text never seen before, so no figure comes from the encoder's
cache. The single-query calls are interleaved, each after a pause of SETTLE_S:
torch's OpenMP threads spin for some milliseconds after a call (about 8 ms on
the 2-core machine of the page), and the client and the server share the cores,
so without the pause the HTTP call would be timed while the client's threads
still spin from its in-process call, and the next in-process call while the
server's spin from the HTTP one; a client that does not run torch itself never
sees either. Writes its section of ``--out`` (the rest of the page stays).
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import torch
from _sections import write_section
from provenance import commit as checked_out_commit
from sklearn.frozen import FrozenEstimator

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus.encoders import SentenceEncoder

N_MODELS, N_QUERIES, EVALS_PER_MODEL = 1000, 400, 128
# Idle time before each timed single-query call, longer than torch's OpenMP
# threads spin after a call (see the module's docstring).
SETTLE_S = 0.03
WORDS = (
    "which what when where how many does the a of in to number river city year "
    "largest smallest first element planet author wrote capital sum product "
    "between after before chemical formula equation solve prime famous war "
    "language speak country border ocean mountain highest oldest"
).split()


class Texts:
    """Question-like texts of 12 to 40 words, each one new."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.count = 0

    def take(self, n):
        out = []
        for _ in range(n):
            self.count += 1
            words = self.rng.choice(WORDS, size=self.rng.integers(12, 41))
            out.append(f"Question {self.count}: " + " ".join(words) + "?")
        return out


def build_router(folder):
    """A router over N_MODELS models, and its 100-model sibling, saved."""
    rng = np.random.default_rng(0)
    queries = Texts(seed=1).take(N_QUERIES)
    skill = rng.normal(size=N_MODELS)
    difficulty = rng.normal(size=N_QUERIES)
    p = 1 / (1 + np.exp(-(skill[:, None] - difficulty[None, :])))
    sets = []
    for i in range(N_MODELS):
        chosen = rng.choice(N_QUERIES, size=EVALS_PER_MODEL, replace=False)
        sets.append({queries[j]: float(rng.random() < p[i, j]) for j in chosen})
    names = [f"model-{i:04d}" for i in range(N_MODELS)]
    embedder = LocusEmbedder(
        query_encoder=SentenceEncoder(), max_epochs=1, epoch_size=256, random_state=0
    ).fit(sets)
    routers = {}
    for n in (100, N_MODELS):
        scores = np.full((N_QUERIES, n), np.nan)
        index = {q: j for j, q in enumerate(queries)}
        for i in range(n):
            for q, s in sets[i].items():
                scores[index[q], i] = s
        Y = pd.DataFrame(scores, columns=names[:n])
        routers[n] = LocusRouter(FrozenEstimator(embedder)).fit(queries, Y)
    path = Path(folder) / "router.sklocus"
    sklocus.save(routers[N_MODELS], path)
    return routers, path


def percentiles(seconds):
    ms = 1000 * np.asarray(seconds)
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def timed(function, argument, settle=0.0):
    if settle:
        time.sleep(settle)
    start = time.perf_counter()
    function(argument)
    return time.perf_counter() - start


class Server:
    """``sklocus serve`` on a free loopback port, in a process of its own."""

    def __init__(self, path, *options, log=None):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sklocus",
                "serve",
                str(path),
                "--port",
                str(self.port),
                "--max-batch",
                "256",
                *options,
            ],
            env=dict(os.environ, HF_HUB_OFFLINE="1"),
            # The server's log, to a file object when one is given.
            stdout=subprocess.DEVNULL if log is None else log,
            stderr=subprocess.DEVNULL if log is None else subprocess.STDOUT,
        )
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{self.port}", timeout=120
        )
        self.connection = http.client.HTTPConnection(
            "127.0.0.1", self.port, timeout=120
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.25)
        raise RuntimeError("the server did not start within 180 s")

    def route(self, texts):
        response = self.client.post("/route", json={"queries": texts, "k": 3})
        response.raise_for_status()
        return response.json()

    def health(self, _=None):
        response = self.client.get("/health")
        response.raise_for_status()
        return response.json()

    def _stdlib(self, method, path, body=None):
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.connection.request(method, path, body=body, headers=headers)
        response = self.connection.getresponse()
        payload = response.read()
        if response.status != 200:
            raise RuntimeError(f"{method} {path}: {response.status} {payload[:200]}")
        return json.loads(payload)

    def route_stdlib(self, texts):
        body = json.dumps({"queries": texts, "k": 3})
        return self._stdlib("POST", "/route", body)

    def health_stdlib(self, _=None):
        return self._stdlib("GET", "/health")

    def close(self):
        self.client.close()
        self.connection.close()
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/performance.md")
    parser.add_argument("--repeats", type=int, default=200)
    arguments = parser.parse_args()
    repeats = arguments.repeats
    commit = checked_out_commit()  # the code that runs, before it can change

    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        routers, path = build_router(folder)
        print(f"built the routers in {time.perf_counter() - start:.0f} s", flush=True)
        router = routers[N_MODELS]
        # The floor: the same weights in an encoder of its own, whose cache
        # never holds the texts the router is asked about.
        floor = SentenceEncoder()
        texts = Texts(seed=2)
        for warm in texts.take(20):  # load and warm both
            floor.transform([warm])
            router.rank_models([warm], k=3)
        server = Server(path)
        for warm in texts.take(20):
            server.route([warm])
            server.route_stdlib([warm])

        single = {
            "encoder": [],
            "in process": [],
            "HTTP": [],
            "HTTP, http.client": [],
            "in process, http.client's texts": [],
            "100 models": [],
            "health": [],
            "health, http.client": [],
        }
        small = routers[100]
        in_process = single["in process"]

        def rank(q):
            return router.rank_models(q, k=3)

        for _ in range(repeats):
            # Interleaved, so a slow spell of the machine touches every column.
            # Each text is new to each encoder that meets it (the server's, the
            # floor's, and the one the two routers here share, so the 100-model
            # router gets texts of its own), and HTTP and the in-process call
            # time the same texts: a text's length sets most of its encoding
            # time, so texts drawn apart would move the gap by about a
            # millisecond from run to run.
            a, b, c = texts.take(3)
            single["encoder"].append(timed(floor.transform, [a], SETTLE_S))
            in_process.append(timed(rank, [a], SETTLE_S))
            single["HTTP"].append(timed(server.route, [a], SETTLE_S))
            single["100 models"].append(
                timed(lambda q: small.rank_models(q, k=3), [c], SETTLE_S)
            )
            single["in process, http.client's texts"].append(timed(rank, [b], SETTLE_S))
            single["HTTP, http.client"].append(
                timed(server.route_stdlib, [b], SETTLE_S)
            )
            single["health"].append(timed(server.health, None, SETTLE_S))
            single["health, http.client"].append(
                timed(server.health_stdlib, None, SETTLE_S)
            )
        print({k: percentiles(v) for k, v in single.items()}, flush=True)

        throughput = {}
        for batch in (1, 32, 256):
            rounds = max(3, 256 // batch)
            for name, call in (
                ("encoder", floor.transform),
                ("in process", lambda q: router.rank_models(q, k=3)),
                ("HTTP", server.route),
            ):
                seconds = sum(timed(call, texts.take(batch)) for _ in range(rounds))
                throughput[name, batch] = rounds * batch / seconds
            print(
                batch,
                {k: v for k, v in throughput.items() if k[1] == batch},
                flush=True,
            )
        server.close()

    p50 = {name: percentiles(seconds)[0] for name, seconds in single.items()}
    p99 = {name: percentiles(seconds)[1] for name, seconds in single.items()}

    def verdict(ok):
        return "met" if ok else "**not met**"

    http_gap = p50["HTTP"] - p50["in process"]
    stdlib_gap = p50["HTTP, http.client"] - p50["in process, http.client's texts"]
    over_floor = p50["in process"] / p50["encoder"]
    scale = p50["in process"] / p50["100 models"]
    lines = [
        "## Serving: latency and throughput of a routed query",
        "",
        f"Written by `python benchmarks/serve.py` at commit {commit} on "
        f"{datetime.date.today()}, {platform.machine()}, {torch.get_num_threads()} "
        f"torch threads, torch {torch.__version__}. A router over {N_MODELS:,} "
        "models (default architecture, all-MiniLM-L6-v2 queries); every query is "
        "a new text of 12 to 40 words, so the encoder's cache never answers. "
        "Over HTTP: `sklocus serve` in a process of its own on the loopback, "
        "JSON both ways, the top 3 models per query, through one keep-alive "
        "connection of either client: an `httpx.Client`, or the standard "
        "library's `http.client.HTTPConnection`.",
        "",
        f"Routing one query ({repeats} each, interleaved, each call after "
        f"{1000 * SETTLE_S:.0f} ms idle: torch's OpenMP threads spin for some "
        "milliseconds after a call, and the client and the server share the "
        "cores; a client that does not run torch itself never waits for that "
        "spin). HTTP and the in-process call are timed on the same texts, each "
        "new to the encoder that meets it (the two routers here share one, so "
        "routing among 100 models has texts of its own):",
        "",
        "| path | p50 | p99 |",
        "|---|---|---|",
        f"| the query encoder alone (the floor) | {p50['encoder']:.1f} ms | "
        f"{p99['encoder']:.1f} ms |",
        f"| in process, among 100 models | {p50['100 models']:.1f} ms | "
        f"{p99['100 models']:.1f} ms |",
        f"| in process, among {N_MODELS:,} models | {p50['in process']:.1f} ms | "
        f"{p99['in process']:.1f} ms |",
        f"| over HTTP (httpx), among {N_MODELS:,} models | {p50['HTTP']:.1f} ms | "
        f"{p99['HTTP']:.1f} ms |",
        f"| over HTTP (http.client), among {N_MODELS:,} models | "
        f"{p50['HTTP, http.client']:.1f} ms | {p99['HTTP, http.client']:.1f} ms |",
        f"| over HTTP (httpx), `GET /health` (the round trip alone) | "
        f"{p50['health']:.1f} ms | {p99['health']:.1f} ms |",
        f"| over HTTP (http.client), `GET /health` | "
        f"{p50['health, http.client']:.1f} ms | "
        f"{p99['health, http.client']:.1f} ms |",
        "",
        "Queries per second, by batch:",
        "",
        "| batch | encoder alone | in process | over HTTP (httpx) |",
        "|---|---|---|---|",
        *[
            f"| {batch} | {throughput['encoder', batch]:.0f} | "
            f"{throughput['in process', batch]:.0f} | {throughput['HTTP', batch]:.0f} |"
            for batch in (1, 32, 256)
        ],
        "",
        "Against the goals of issue 20 (two CPU cores):",
        "",
        f"- HTTP adds at most 2 ms at p50 to the in-process call at batch 1: it "
        f"adds {stdlib_gap:.1f} ms through `http.client` "
        f"({verdict(stdlib_gap <= 2)}) and {http_gap:.1f} ms through httpx "
        f"({verdict(http_gap <= 2)}); a `GET /health`, which computes nothing, "
        f"takes {p50['health, http.client']:.1f} ms and {p50['health']:.1f} ms.",
        f"- In-process single-query routing costs at most 1.5x the encoder alone: "
        f"{over_floor:.2f}x ({verdict(over_floor <= 1.5)}).",
        f"- Routing among 1,000 models costs at most 2x routing among 100: "
        f"{scale:.2f}x ({verdict(scale <= 2)}).",
    ]
    text = "\n".join(lines)
    print(text)
    write_section(arguments.out, "serve", text)


if __name__ == "__main__":
    main()
