"""Three replicas and one PostgreSQL, under kills and a database restart.

Three clients stream outcomes to the replicas in turn, each request with an
idempotency key and sent again (to the next replica) until it is acknowledged,
while replicas are SIGKILLed and started again and the database is restarted
once. At the end every acknowledged outcome is in the log exactly once, every
replica has learnt each exactly once, and all rank 200 probe queries alike.
"""

import random
import threading
import time
import uuid

import httpx
import numpy as np
import pandas as pd
import psycopg
import pytest
from sklearn.frozen import FrozenEstimator
from test_serve import Server, _require
from tiny import TINY_NETWORK

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix

_require("fastapi")

pytestmark = pytest.mark.slow

# Each client sends a request every PACE seconds or so: about 20 s of traffic,
# through which the faults come.
CLIENTS, REQUESTS, BATCH, PACE = 3, 40, 5, 0.5


@pytest.fixture(scope="module")
def pool():
    data = make_evaluations(
        n_models=5, n_queries=240, evals_per_model=(20, 60), query_dim=8, random_state=8
    )
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK).fit(
        data.evaluation_sets
    )
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    router = LocusRouter(FrozenEstimator(embedder), refine_steps=2).fit(queries, Y)
    return data, router


class Replicas:
    """Replica processes of one store; any may be killed and started again."""

    def __init__(self, model, store, folder, n):
        self.arguments = [
            model,
            "--store",
            store,
            "--fold-interval",
            "0.2",
            "--snapshot-interval",
            "1",
            "--log-level",
            "warning",
        ]
        self.folder = folder
        self.lock = threading.Lock()
        self.running = [self.start() for _ in range(n)]

    def start(self):
        return Server(*self.arguments, cwd=self.folder)

    def urls(self):
        with self.lock:
            return [server.url for server in self.running]

    def kill_and_restart(self, index):
        """SIGKILL a replica now; start another in its place, in the background."""
        with self.lock:
            killed = self.running.pop(index)
        killed.process.kill()
        killed.process.wait()

        def restart():
            started = self.start()
            with self.lock:
                self.running.append(started)

        thread = threading.Thread(target=restart)
        thread.start()
        return thread

    def stop(self):
        for server in self.running:
            code, stderr = server.stop()
            assert code == 0, stderr


def stream(data, replicas, client, acknowledged, failures):
    """Send REQUESTS batches, each until one replica acknowledges it."""
    rng = random.Random(client)
    for request in range(REQUESTS):
        key = f"client-{client}-request-{request}-{uuid.uuid4().hex[:6]}"
        sent = [
            {
                "query": rng.choice(data.query_ids),
                "model": rng.choice(data.model_names),
                "score": float(rng.random() < 0.5),
            }
            for _ in range(BATCH)
        ]
        turn = client + request
        deadline = time.monotonic() + 120
        while True:
            urls = replicas.urls()
            turn += 1
            try:
                if not urls:  # every replica killed, none started again yet
                    raise httpx.ConnectError("no replica")
                url = urls[turn % len(urls)]
                answer = httpx.post(
                    f"{url}/feedback",
                    json={"outcomes": sent},
                    headers={"Idempotency-Key": key},
                    timeout=10,
                )
                if answer.status_code == 200:
                    acknowledged.append((key, sent, answer.json()["through"]))
                    time.sleep(rng.uniform(0.5, 1.5) * PACE)
                    break
                assert answer.status_code == 503, answer.text
            except httpx.TransportError:
                pass  # a replica killed, or not started yet
            failures.append(key)
            assert time.monotonic() < deadline, f"{key} never acknowledged"
            time.sleep(0.1)


def test_every_acknowledged_outcome_is_learnt_once_everywhere(
    pool, postgresql_server, postgresql_database, tmp_path
):
    data, router = pool
    model = tmp_path / "router.sklocus"
    sklocus.save(router, model)
    replicas = Replicas(model, postgresql_database, tmp_path, 3)
    acknowledged, failures = [], []
    try:
        clients = [
            threading.Thread(
                target=stream, args=(data, replicas, c, acknowledged, failures)
            )
            for c in range(CLIENTS)
        ]
        for thread in clients:
            thread.start()
        time.sleep(2)
        restarts = [replicas.kill_and_restart(0)]  # while outcomes stream in
        time.sleep(2)
        postgresql_server.stop(mode="immediate")  # as a crash would
        during = len(acknowledged)
        time.sleep(1.5)
        postgresql_server.start()
        restarts.append(replicas.kill_and_restart(1))
        time.sleep(3)
        restarts.append(replicas.kill_and_restart(0))
        for thread in clients + restarts:
            thread.join(timeout=300)
            assert not thread.is_alive()
        assert len(acknowledged) == CLIENTS * REQUESTS
        # The faults came while the clients streamed, and cost them answers.
        assert 0 < during < len(acknowledged) and failures

        # In the log: each acknowledged request once, where its answer said.
        with psycopg.connect(postgresql_database) as connection:
            rows = connection.execute(
                "SELECT id, kind, model, query, score, request_key FROM sklocus_log "
                "ORDER BY id"
            ).fetchall()
        by_id = {row[0]: row for row in rows}
        keys = [row[5] for row in rows if row[5] is not None]
        assert len(keys) == len(set(keys)) == len(acknowledged)
        for key, sent, through in acknowledged:
            assert by_id[through][5] == key
            batch = [by_id[through - BATCH + 1 + i] for i in range(BATCH)]
            assert [(r[1], r[2], r[3], r[4]) for r in batch] == [
                ("outcome", o["model"], o["query"], o["score"]) for o in sent
            ]
        outcomes = [row for row in rows if row[1] == "outcome"]
        assert len(outcomes) == CLIENTS * REQUESTS * BATCH

        # Every replica folds through the last mark and has learnt each once.
        last = max(row[0] for row in rows)
        deadline = time.monotonic() + 120
        while True:
            healths = [httpx.get(f"{url}/health").json() for url in replicas.urls()]
            positions = {health["position"] for health in healths}
            if all(health["lag"] == 0 for health in healths) and len(positions) == 1:
                if positions.pop() >= last:
                    break
            assert time.monotonic() < deadline, healths
            time.sleep(0.2)
        per_model = {}
        for row in outcomes:
            per_model[row[2]] = per_model.get(row[2], 0) + 1
        listed = [
            httpx.get(f"{url}/models").json()["models"] for url in replicas.urls()
        ]
        for models in listed:
            assert {m["name"]: m["n_outcomes"] for m in models} == {
                name: per_model.get(name, 0) for name in data.model_names
            }
            assert models == listed[0]  # n_scores too: each learnt once

        # All rank the probes alike.
        probes = {"queries": list(data.query_ids[:200]), "k": 5}
        routes = [
            httpx.post(f"{url}/route", json=probes, timeout=60).json()
            for url in replicas.urls()
        ]
        assert routes[0] == routes[1] == routes[2]
        predicted = [
            np.array(
                httpx.post(
                    f"{url}/predict", json={"queries": probes["queries"]}, timeout=60
                ).json()["p"]
            )
            for url in replicas.urls()
        ]
        np.testing.assert_array_equal(predicted[0], predicted[1])
        np.testing.assert_array_equal(predicted[0], predicted[2])
    finally:
        replicas.stop()
