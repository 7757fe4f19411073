"""Outcomes per second through POST /feedback, and routing while they are learnt.

    OMP_NUM_THREADS=1 python benchmarks/feedback.py [--out docs/performance.md]

Serves the router of ``serve_hostile.py`` (100 synthetic models, all-MiniLM-L6-v2
queries) with ``sklocus serve --feedback-journal`` (a SQLite journal in a
temporary folder, fsynced at each commit) and ``--fold-interval 1``, then:

1. routes 1,000 new texts once, as a served query is routed before its outcome
   comes back (their encodings are then in the encoder's cache, where a fold
   finds them);
2. throughput: a client process sends outcomes of those texts (random models
   and scores) in batches of 500 from two connections, as fast as they are
   answered, for 10 s: outcomes acknowledged per second, each on disk before its
   answer, while the folding thread learns them;
3. latency: one client routes one new text at a time and is timed: idle; while
   a client process sends 2,000 outcomes per second in batches of 200 (folded
   once a second, each model they touch embedded again with refinement); and
   idle again once every outcome is folded in.

Goals (issue 37): at least 2,000 outcomes per second, and routing p99 under the
feedback load at most 1.5x the idle p99. Writes its section of ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import platform
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import torch
from _sections import write_section
from provenance import commit
from serve import Server, Texts, percentiles
from serve_hostile import build_router, cpu_seconds, route_kept

N_TEXTS = 1_000
THROUGHPUT_SECONDS, THROUGHPUT_BATCH, CONNECTIONS = 10.0, 500, 2
LOAD_RATE, LOAD_BATCH = 2_000, 200


def outcomes(rng, texts, models, n):
    return [
        {
            "query": texts[int(rng.integers(len(texts)))],
            "model": models[int(rng.integers(len(models)))],
            "score": float(rng.integers(2)),
        }
        for _ in range(n)
    ]


def flood(url, texts, models, results):
    """Send outcomes as fast as they are answered; put the count and seconds."""
    counts = [0] * CONNECTIONS

    def connection(index):
        rng = np.random.default_rng(index)
        deadline = time.perf_counter() + THROUGHPUT_SECONDS
        with httpx.Client(base_url=url, timeout=120) as client:
            while time.perf_counter() < deadline:
                batch = outcomes(rng, texts, models, THROUGHPUT_BATCH)
                response = client.post("/feedback", json={"outcomes": batch})
                response.raise_for_status()
                counts[index] += response.json()["accepted"]

    results.put("started")
    start = time.perf_counter()
    threads = [
        threading.Thread(target=connection, args=(i,)) for i in range(CONNECTIONS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put((sum(counts), time.perf_counter() - start))


def steady(url, texts, models, results, stop):
    """Send LOAD_RATE outcomes per second in batches of LOAD_BATCH until stopped."""
    rng = np.random.default_rng(7)
    sent, period = 0, LOAD_BATCH / LOAD_RATE
    results.put("started")
    start = time.perf_counter()
    with httpx.Client(base_url=url, timeout=120) as client:
        while not stop.is_set():
            due = start + (sent // LOAD_BATCH) * period
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            batch = outcomes(rng, texts, models, LOAD_BATCH)
            client.post("/feedback", json={"outcomes": batch}).raise_for_status()
            sent += LOAD_BATCH
    results.put((sent, time.perf_counter() - start))


def learnt(server):
    return sum(m["n_outcomes"] for m in server.client.get("/models").json()["models"])


def drain(server, timeout=600):
    """Wait until every journalled outcome is folded in; return the seconds."""
    start = time.perf_counter()
    while server.client.get("/health").json()["pending_outcomes"]:
        if time.perf_counter() - start > timeout:
            raise RuntimeError("outcomes still pending after 10 minutes")
        time.sleep(0.1)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/performance.md")
    parser.add_argument("--idle-repeats", type=int, default=300)
    parser.add_argument("--load-seconds", type=float, default=20.0)
    arguments = parser.parse_args()
    context = multiprocessing.get_context("spawn")

    with tempfile.TemporaryDirectory() as folder:
        path, _, models = build_router(folder)
        journal = Path(folder) / "feedback.sqlite"
        server = Server(path, "--feedback-journal", journal, "--fold-interval", "1")
        texts = Texts(seed=3)
        served = texts.take(N_TEXTS)
        for start in range(0, N_TEXTS, 250):
            server.route(served[start : start + 250])
        for warm in texts.take(20):
            server.route([warm])
        base = learnt(server)

        results = context.Queue()
        sender = context.Process(
            target=flood, args=(str(server.client.base_url), served, models, results)
        )
        sender.start()
        assert results.get() == "started"
        accepted, seconds = results.get()
        sender.join()
        throughput = accepted / seconds
        print(f"{accepted} outcomes in {seconds:.1f} s: {throughput:.0f}/s", flush=True)
        flood_drain = drain(server)

        idle = [
            route_kept(server, texts.take(1)) for _ in range(arguments.idle_repeats)
        ]
        print("idle", percentiles(idle), flush=True)
        stop = context.Event()
        sender = context.Process(
            target=steady,
            args=(str(server.client.base_url), served, models, results, stop),
        )
        sender.start()
        assert results.get() == "started"
        server_cpu = cpu_seconds(server.process.pid)
        loaded, start = [], time.perf_counter()
        while time.perf_counter() - start < arguments.load_seconds:
            loaded.append(route_kept(server, texts.take(1)))
        stop.set()
        sent, load_seconds = results.get()
        sender.join()
        server_cpu = cpu_seconds(server.process.pid) - server_cpu
        load_drain = drain(server)
        after = [
            route_kept(server, texts.take(1)) for _ in range(arguments.idle_repeats)
        ]
        folded = learnt(server) - base
        server.close()

    idle_p50, idle_p99 = percentiles(idle)
    load_p50, load_p99 = percentiles(loaded)
    after_p50, after_p99 = percentiles(after)
    ratio = load_p99 / idle_p99
    lines = [
        "## Learning from outcomes: feedback throughput, and routing meanwhile",
        "",
        f"Written by `python benchmarks/feedback.py` at commit {commit()} on "
        f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"{torch.get_num_threads()} torch thread(s) "
        f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), torch "
        f"{torch.__version__}. `sklocus serve --feedback-journal FILE "
        "--fold-interval 1` (one process, loopback) with the router of "
        "`serve_hostile.py` (100 models, all-MiniLM-L6-v2 queries, refinement on); "
        f"outcomes name {N_TEXTS:,} texts routed before, random models and scores. "
        "Each answer of `POST /feedback` comes after its batch is committed to the "
        "SQLite journal (WAL, `synchronous=FULL`).",
        "",
        f"Throughput: {CONNECTIONS} connections sending batches of "
        f"{THROUGHPUT_BATCH} as fast as they are answered, from another process: "
        f"{accepted:,} outcomes acknowledged in {seconds:.1f} s, "
        f"**{throughput:,.0f} outcomes per second**; the folding thread had learnt "
        f"them all {flood_drain:.1f} s after the last answer.",
        "",
        "| routing one query | requests | p50 | p99 |",
        "|---|---|---|---|",
        f"| idle | {len(idle)} | {idle_p50:.1f} ms | {idle_p99:.1f} ms |",
        f"| while {LOAD_RATE:,} outcomes per second arrive and are folded in | "
        f"{len(loaded)} | {load_p50:.1f} ms | {load_p99:.1f} ms |",
        f"| idle again, after | {len(after)} | {after_p50:.1f} ms | "
        f"{after_p99:.1f} ms |",
        "",
        f"Under the load: {sent:,} outcomes sent in {load_seconds:.0f} s, folded in "
        f"{load_drain:.1f} s after the last; the server used "
        f"{server_cpu / load_seconds:.2f} cores on average. In all "
        f"{folded:,} outcomes were learnt.",
        "",
        f"Goals: at least 2,000 outcomes per second: {throughput:,.0f} "
        f"({'met' if throughput >= 2000 else '**not met**'}); routing p99 under the "
        f"feedback load within 1.5x the idle p99: {ratio:.2f}x "
        f"({'met' if ratio <= 1.5 else '**not met**'}).",
    ]
    text = "\n".join(lines)
    print(text)
    write_section(arguments.out, "feedback", text)


if __name__ == "__main__":
    main()
