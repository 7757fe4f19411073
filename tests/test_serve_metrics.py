"""GET /metrics: a served router's figures in Prometheus's text format."""

import os
import re

import pandas as pd
import pytest
from sklearn.frozen import FrozenEstimator
from test_serve import _require
from tiny import TINY_NETWORK

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix

_require("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from sklocus.serve import RouterService, create_app  # noqa: E402
from sklocus.serve._replica import ReplicaService  # noqa: E402
from sklocus.serve._store import open_store  # noqa: E402

# A sample line of the text format: a name, labels in braces, a number.
SAMPLE = re.compile(r'^[a-z_]+\{(?:[a-z_]+="(?:[^"\\]|\\.)*",?)*\} -?[0-9.e+-]+$')


@pytest.fixture(scope="module")
def pool():
    data = make_evaluations(
        n_models=4, n_queries=60, evals_per_model=(10, 30), query_dim=8, random_state=3
    )
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK).fit(
        data.evaluation_sets
    )
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    return data, LocusRouter(FrozenEstimator(embedder), refine_steps=1).fit(queries, Y)


def samples(text):
    """``{(name, frozenset(labels)): value}`` of the exposition, its lines checked."""
    found = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-z_]+ .+$", line), line
            continue
        assert SAMPLE.match(line), line
        head, value = line.rsplit(" ", 1)
        name, labels = head.split("{", 1)
        pairs = frozenset(re.findall(r'([a-z_]+)="((?:[^"\\]|\\.)*)"', labels))
        found[name, pairs] = float(value)
    return found


def value(found, name, **labels):
    wanted = {(key, str(v)) for key, v in labels.items()}
    matches = [v for (n, pairs), v in found.items() if n == name and wanted <= pairs]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def test_requests_and_folds_are_counted(pool, tmp_path):
    data, router = pool
    service = RouterService(router, feedback_journal=tmp_path / "j.db")
    with TestClient(create_app(service)) as client:
        client.post("/route", json={"queries": [data.query_ids[0]]})
        client.post("/route", json={"queries": 5})
        for path in ("/no/such/path/1", "/no/such/path/2"):
            client.get(path)
        outcome = {"query": data.query_ids[0], "model": data.model_names[0], "score": 1}
        client.post("/feedback", json={"outcomes": [outcome]})
        service.fold()
        answer = client.get("/metrics")
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    found = samples(answer.text)
    process = os.getpid()
    assert value(found, "sklocus_requests_total", route="/route", status=200) == 1
    assert value(found, "sklocus_requests_total", route="/route", status=422) == 1
    # Paths no route knows share one series: a client cannot make series.
    assert value(found, "sklocus_requests_total", route="unmatched", status=404) == 2
    assert value(found, "sklocus_models", process=process) == 4
    assert value(found, "sklocus_pending_outcomes") == 0
    assert value(found, "sklocus_fold_duration_seconds_count") == 1
    assert value(found, "sklocus_fold_duration_seconds_sum") > 0
    assert not any(name == "sklocus_log_position" for name, _ in found)


def test_a_replica_says_its_position_lag_and_lease(pool, tmp_path):
    data, router = pool
    service = ReplicaService(open_store(tmp_path / "store.db"), router, fold_interval=0)
    with TestClient(create_app(service)) as client:
        outcome = {"query": data.query_ids[1], "model": data.model_names[1], "score": 0}
        client.post("/feedback", json={"outcomes": [outcome] * 3})
        found = samples(client.get("/metrics").text)
        assert (
            value(found, "sklocus_log_lag") + value(found, "sklocus_log_position") >= 3
        )
        service.fold()
        found = samples(client.get("/metrics").text)
    assert value(found, "sklocus_log_position") == 4  # 3 outcomes, then a mark
    assert value(found, "sklocus_log_lag") == 0
    assert value(found, "sklocus_lease") == 1
    assert value(found, "sklocus_fold_duration_seconds_count") >= 1
