"""Replicas of one store: outcomes acknowledged, learning lag, and --workers.

    OMP_NUM_THREADS=1 python benchmarks/replicas.py [--out docs/performance.md]

Serves the router of ``serve_hostile.py`` (100 synthetic models, all-MiniLM-L6-v2
queries) as replicas of one store (``sklocus serve --store``), each replica its
own process on its own port, and measures:

1. **outcomes acknowledged per second** through ``POST /feedback`` with one
   SQLite store and one replica, one PostgreSQL store and one replica, and one
   PostgreSQL store and three replicas; clients send batches as fast as they
   are answered, two connections per replica, for ``--seconds`` each, in
   batches of 1 and of 100 outcomes (each answer after its batch is committed:
   SQLite's WAL with ``synchronous=FULL``; PostgreSQL with ``fsync`` and
   ``synchronous_commit`` on);
2. **learning lag**: with PostgreSQL and three replicas (``--fold-interval 1``,
   the default), one batch of 10 outcomes at a time sent to the replicas in
   turn; from its acknowledgement until every replica's ``position`` (in
   ``GET /health``) has passed it, polled every 5 ms;
3. **routing with ``--workers 2`` against 1** (a SQLite store), under 8
   concurrent clients each routing one new text per request for ``--seconds``:
   routed queries per second, and their ratio, in one run.

The PostgreSQL server is a throwaway one started from the installed server
binaries (``sklocus.serve._store._throwaway``). Writes its section of ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import http.client
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch
from _sections import write_section
from feedback import outcomes
from provenance import commit
from serve import Server, Texts, percentiles
from serve_hostile import build_router

from sklocus.serve._store._throwaway import ThrowawayServer

N_TEXTS = 1_000
CONNECTIONS_PER_REPLICA = 2
BATCHES = (1, 100)
LAG_SAMPLES, LAG_BATCH = 60, 10
ROUTING_CLIENTS = 8


def run_for(seconds, threads, stop, counts):
    """Run the client ``threads`` for ``seconds``; return their counts per second."""
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(counts) / (time.perf_counter() - start)


def post(connection, path, body):
    payload = json.dumps(body)
    headers = {"Content-Type": "application/json"}
    try:
        connection.request("POST", path, body=payload, headers=headers)
    except (BrokenPipeError, ConnectionResetError):  # closed while kept idle
        connection.close()  # nothing was sent: send it on a new connection
        connection.request("POST", path, body=payload, headers=headers)
    response = connection.getresponse()
    payload = response.read()
    if response.status != 200:
        raise RuntimeError(f"POST {path}: {response.status} {payload[:200]!r}")
    return json.loads(payload)


@contextlib.contextmanager
def replicas_of(path, store, n):
    """``n`` replicas of ``store``, each ``sklocus serve`` of its own; stopped after."""
    options = ["--store", store, "--log-level", "warning"]
    replicas = []
    try:
        for _ in range(n):
            replicas.append(Server(path, *options))
        yield replicas
    finally:
        for replica in replicas:
            try:
                replica.close()
            except Exception:  # noqa: BLE001 (stop the others all the same)
                replica.process.kill()


def mean_fold_seconds(replicas):
    """The replicas' mean fold duration, from their /metrics."""
    total = count = 0.0
    for replica in replicas:
        text = replica.client.get("/metrics").text
        for line in text.splitlines():
            if line.startswith("sklocus_fold_duration_seconds_sum"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith("sklocus_fold_duration_seconds_count"):
                count += float(line.rsplit(" ", 1)[1])
    return total / count


def warm(replicas, texts):
    """Route the texts through every replica: their encodings are then cached."""
    for replica in replicas:
        for start in range(0, len(texts), 250):
            replica.route(texts[start : start + 250])


def throughput(replicas, texts, models, batch, seconds):
    """Outcomes acknowledged per second, clients on every replica at once."""
    counts, stop = [], threading.Event()

    def client(port, seed):
        rng = np.random.default_rng(seed)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        sent = 0
        while not stop.is_set():
            body = {"outcomes": outcomes(rng, texts, models, batch)}
            sent += post(connection, "/feedback", body)["accepted"]
        counts.append(sent)
        connection.close()

    threads = [
        threading.Thread(target=client, args=(replica.port, 100 * r + c))
        for r, replica in enumerate(replicas)
        for c in range(CONNECTIONS_PER_REPLICA)
    ]
    return run_for(seconds, threads, stop, counts)


def settled(replicas, timeout=600):
    """Wait until every replica has folded all it knows of."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        healths = [replica.health() for replica in replicas]
        if (
            all(h["lag"] == 0 for h in healths)
            and len({h["position"] for h in healths}) == 1
        ):
            return healths[0]["position"]
        time.sleep(0.2)
    raise RuntimeError("the replicas did not settle")


def lag(replicas, texts, models):
    """Seconds from each batch's acknowledgement until every replica learnt it."""
    rng = np.random.default_rng(7)
    connections = [
        http.client.HTTPConnection("127.0.0.1", replica.port, timeout=120)
        for replica in replicas
    ]
    seconds = []
    for sample in range(LAG_SAMPLES):
        sender = connections[sample % len(connections)]
        body = {"outcomes": outcomes(rng, texts, models, LAG_BATCH)}
        through = post(sender, "/feedback", body)["through"]
        acknowledged = time.perf_counter()
        waiting = list(range(len(replicas)))
        while waiting:
            waiting = [r for r in waiting if replicas[r].health()["position"] < through]
            if waiting:
                time.sleep(0.005)
        seconds.append(time.perf_counter() - acknowledged)
        time.sleep(rng.uniform(0.0, 0.5))
    for connection in connections:
        connection.close()
    return seconds


def routed_per_second(server, texts, seconds):
    """Queries routed per second by ROUTING_CLIENTS clients, one new text each."""
    counts, stop, lock = [], threading.Event(), threading.Lock()

    def client():
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        routed = 0
        while not stop.is_set():
            with lock:
                text = texts.take(1)
            post(connection, "/route", {"queries": text, "k": 3})
            routed += 1
        counts.append(routed)
        connection.close()

    threads = [threading.Thread(target=client) for _ in range(ROUTING_CLIENTS)]
    return run_for(seconds, threads, stop, counts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/performance.md")
    parser.add_argument("--seconds", type=float, default=10.0)
    arguments = parser.parse_args()
    rows, lags = [], None
    with tempfile.TemporaryDirectory() as folder, ThrowawayServer(fsync=True) as db:
        path, _, models = build_router(folder)
        texts = Texts(seed=3)
        served = texts.take(N_TEXTS)
        databases = iter(range(100))

        def postgresql():
            import psycopg

            name = f"bench_{next(databases)}"
            with psycopg.connect(db.url, autocommit=True) as admin:
                admin.execute(f"CREATE DATABASE {name}")
            return db.url.rsplit("/", 1)[0] + f"/{name}"

        # The lag first, on replicas that learnt nothing yet: a fold embeds each
        # model it touches again from all it learnt, so it grows with that.
        with replicas_of(path, postgresql(), 3) as replicas:
            warm(replicas, served)
            lags = lag(replicas, served, models)
            fold_seconds = mean_fold_seconds(replicas)
            print("lag", percentiles(lags), "folds", fold_seconds, flush=True)
        for label, make_store, n in [
            ("SQLite", lambda: str(Path(folder) / f"store-{time.time_ns()}.db"), 1),
            ("PostgreSQL", postgresql, 1),
            ("PostgreSQL", postgresql, 3),
        ]:
            rates = []
            with replicas_of(path, make_store(), n) as replicas:
                warm(replicas, served)
                for batch in BATCHES:
                    rate = throughput(
                        replicas, served, models, batch, arguments.seconds
                    )
                    print(f"{label}, {n} replica(s), batch {batch}: {rate:,.0f}/s")
                    rates.append(rate)
                    settled(replicas)
            rows.append((label, n, rates))

        routing = {}
        for workers in (1, 2):
            store = str(Path(folder) / f"routing-{workers}.db")
            server = Server(
                path,
                "--store",
                store,
                "--workers",
                str(workers),
                "--log-level",
                "warning",
            )
            try:
                for warm_text in texts.take(20):
                    server.route([warm_text])
                routing[workers] = routed_per_second(server, texts, arguments.seconds)
            finally:
                server.close()
            print(f"--workers {workers}: {routing[workers]:.1f} queries/s", flush=True)

    lag_p50, lag_p99 = percentiles(lags)
    ratio = routing[2] / routing[1]
    lines = [
        "## Replicas of one store: outcomes, learning lag, and --workers",
        "",
        f"Written by `python benchmarks/replicas.py` at commit {commit()} on "
        f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, torch "
        f"{torch.__version__}, PostgreSQL from `{db.bin}` (fsync on) on the same "
        "machine. Each replica is `sklocus serve --store` in a process of its own "
        "(loopback), serving the router of `serve_hostile.py` (100 models, "
        "all-MiniLM-L6-v2 queries); outcomes name 1,000 texts each replica routed "
        "before. Clients and replicas share the machine's cores.",
        "",
        "Outcomes acknowledged per second (`POST /feedback`, each answer after its "
        f"batch is committed), {CONNECTIONS_PER_REPLICA} connections per replica "
        f"sending as fast as they are answered for {arguments.seconds:g} s:",
        "",
        "| store | replicas | batches of 1 | batches of 100 |",
        "|---|---|---|---|",
        *(
            f"| {label} | {n} | {rates[0]:,.0f} | {rates[1]:,.0f} |"
            for label, n, rates in rows
        ),
        "",
        f"Learning lag, PostgreSQL and 3 new replicas, `--fold-interval 1`: "
        f"{len(lags)} batches of {LAG_BATCH} outcomes, sent to the replicas in "
        "turn; from each acknowledgement until every replica's position passed it "
        "(the fold mark the lease's holder writes once outcomes waited 1 s, read "
        f"by each replica within 0.1 s, then one fold): p50 {lag_p50 / 1000:.2f} s, "
        f"p99 {lag_p99 / 1000:.2f} s (the p99 of {len(lags)} samples is about "
        f"their largest). A fold took {fold_seconds:.2f} s on average (three "
        "replicas folding at once on the two cores); it grows with what the "
        "models it touches have learnt, each embedded again from all of it.",
        "",
        f"Routing, {ROUTING_CLIENTS} clients each routing one new text per request "
        f"for {arguments.seconds:g} s: `--workers 1` {routing[1]:.1f} queries per "
        f"second, `--workers 2` {routing[2]:.1f}: **{ratio:.2f}x** (each worker "
        "with one torch thread; the clients run on the same two cores).",
    ]
    text = "\n".join(lines)
    print(text)
    write_section(arguments.out, "replicas", text)


if __name__ == "__main__":
    main()
