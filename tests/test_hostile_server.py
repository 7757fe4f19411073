"""The served router against hostile or careless clients.

Each test names the fault it guards against: malformed JSON, echoed input,
loose types, oversized onboardings, a cache that grows with the texts' length,
unprintable model names, warnings a client can repeat, missing authentication,
a failed write-back and a port in use.
"""

import copy
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
from hostile_requests import Malformed
from tiny import tiny_priced_router

import sklocus
from sklocus import LocusRouter

pytest.importorskip("fastapi")
pytest.importorskip("httpx")
import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from sklocus.serve import RouterService, ServerLimits, create_app  # noqa: E402

# Most tests start the HTTP server in a process of its own.
pytestmark = pytest.mark.slow

TOKEN = "correct-horse-battery-staple"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def pool():
    return tiny_priced_router()


@pytest.fixture()
def client(pool):
    service = RouterService(pool[1], max_batch=20)
    return TestClient(create_app(service), raise_server_exceptions=False)


def _post(client, path, text):
    return client.post(
        path, content=text.encode("utf-8", "surrogatepass"), headers=JSON
    )


def _faults(response):
    return [(tuple(e["loc"]), e["msg"]) for e in response.json()["detail"]]


# -- 5: malformed JSON, echoed input, loose types --------------------------------


@pytest.mark.parametrize(
    "text, said",
    [
        ('{"queries": ["q00001"], "cost_weight": NaN}', "NaN is not a JSON number"),
        ('{"queries": ["q00001"], "cost_weight": Infinity}', "Infinity is not"),
        ('{"queries": ["q00001"], "cost_weight": -Infinity}', "-Infinity is not"),
        ('{"queries": ["q00001"], "cost_weight": 1e400}', "'1e400' overflows a float"),
        ('{"queries": ["q00001"], "k": 1' + "0" * 5000 + "}", "at most 20"),
        ('{"queries": ["\\ud800"]}', "lone surrogate \\ud800"),
        ('{"queries": ["q00001"], "\\udfffx": 1}', "lone surrogate \\udfff"),
        ('{"queries": ["q1"], "queries": ["q2"]}', "'queries' appears twice"),
        ('{"queries": ["q00001"]', "Expecting ',' delimiter at character 22"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_json_python_would_take_is_refused_with_a_422(client, text, said):
    response = _post(client, "/route", text)
    assert response.status_code == 422
    [(loc, message)] = _faults(response)
    assert loc == ("body",) and message.startswith("the body is not valid JSON: ")
    assert said in message


def test_a_body_that_is_not_utf8_is_refused(client):
    response = client.post("/route", content=b'{"queries": ["\xff"]}', headers=JSON)
    assert response.status_code == 422
    assert "the body is not UTF-8 (byte 14)" in _faults(response)[0][1]


def test_surrogate_pairs_are_text_and_pass(client, pool):
    # An emoji escaped as a pair is Unicode; it is refused only as unknown.
    response = _post(client, "/route", '{"queries": ["\\ud83d\\ude00"]}')
    assert response.status_code == 422 and "is not one of" in _faults(response)[0][1]


def test_errors_do_not_echo_the_request(client):
    secret = "s3cret" * 1000
    bodies = [
        {"queries": secret},  # FastAPI's default would echo it as "input"
        {"queries": [secret]},  # an unknown query, quoted by the encoder
        {"queries": ["q00001"], secret: 1},  # an unknown field, named by loc
        {"queries": ["q00001"], "exclude": [secret[:500]]},
        {"queries": ["q00001"], "query_groups": [secret]},  # over 512 characters
        {"name": "x", "evaluations": {secret: 1.0}, "cost": 1},
    ]
    for body in bodies:
        path = "/models" if "name" in body else "/route"
        response = client.post(path, json=body)
        assert response.status_code == 422, response.text
        assert "input" not in response.json()["detail"][0]
        assert secret[:45] not in response.text and len(response.text) < 1000


@pytest.mark.parametrize(
    "body, loc",
    [
        ({"queries": ["q00001"], "k": True}, ("body", "k")),
        ({"queries": ["q00001"], "k": 2.0}, ("body", "k")),
        ({"queries": ["q00001"], "k": "2"}, ("body", "k")),
        ({"queries": ["q00001"], "cost_weight": True}, ("body", "cost_weight")),
        ({"queries": ["q00001"], "cost_weight": "0.5"}, ("body", "cost_weight")),
    ],
)
def test_types_are_strict(client, body, loc):
    response = client.post("/route", json=body)
    assert response.status_code == 422
    assert [where for where, _ in _faults(response)] == [loc]


def test_strict_types_still_take_integers_as_numbers(client):
    body = {"queries": ["q00001"], "cost_weight": 1, "k": 2}
    assert client.post("/route", json=body).status_code == 200
    scored = {"name": "x", "evaluations": {"q00001": True}, "cost": 1}
    assert client.post("/models", json=scored).status_code == 422


def test_random_malformed_requests_all_get_a_short_4xx(pool):
    """1,500 requests, each breaking one rule: each a 4xx, no traceback, no echo."""
    data, router = pool
    service = RouterService(router, max_batch=20, max_evaluations=30)
    client = TestClient(
        create_app(service, limits=ServerLimits(max_open_body_bytes=100_000)),
        raise_server_exceptions=False,
    )
    malformed = Malformed(
        data.query_ids, data.model_names, max_batch=20, max_evaluations=30, seed=7
    )
    statuses = {}
    for _ in range(1500):
        method, path, content, headers, echoes = malformed.request()
        response = client.request(method, path, content=content, headers=headers)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        context = f"{method} {path} {(content or b'')[:200]!r} -> {response.text[:300]}"
        assert 400 <= response.status_code < 500, context
        assert "Traceback" not in response.text, context
        assert all(echo[:45] not in response.text for echo in echoes), context
        assert len(response.content) < 2000, context
    assert service.router.classes_.tolist() == data.model_names  # nothing changed
    assert set(statuses) >= {404, 409, 413, 422}


def test_a_fault_of_the_server_is_a_short_500_without_traceback(pool, monkeypatch):
    service = RouterService(pool[1])
    client = TestClient(create_app(service), raise_server_exceptions=False)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug with a secret in its message")

    monkeypatch.setattr(service, "route_in_turns", broken)
    response = client.post("/route", json={"queries": ["q00001"]})
    assert response.status_code == 500
    assert _faults(response) == [((), "the server failed to answer; its log says why")]
    assert "secret" not in response.text and "Traceback" not in response.text


# -- 6: onboarding is bounded and computed outside the lock ------------------------


def test_an_onboarding_gives_at_most_max_evaluations(pool):
    data, router = pool
    client = TestClient(create_app(RouterService(router, max_evaluations=30)))
    body = {"name": "big", "evaluations": dict.fromkeys(data.query_ids, 1.0), "cost": 1}
    response = client.post("/models", json=body)
    assert response.status_code == 422
    assert _faults(response) == [
        (("body", "evaluations"), "120 evaluations in one request; at most 30")
    ]
    with pytest.raises(ValueError, match="max_evaluations=0 must be a positive"):
        RouterService(pool[1], max_evaluations=0)


def test_routing_and_removal_go_on_while_a_model_is_onboarded(pool, monkeypatch):
    data, router = pool
    service = RouterService(router)
    embedding, started, release = (
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    add_models = LocusRouter.add_models

    def slow_add_models(self, *args, **kwargs):
        started.set()
        assert release.wait(60)
        embedding.set()
        return add_models(self, *args, **kwargs)

    monkeypatch.setattr(LocusRouter, "add_models", slow_add_models)
    evaluations = dict.fromkeys(data.query_ids[:20], 1.0)
    onboarding = threading.Thread(
        target=service.add_model, args=("newcomer", evaluations, 2.0)
    )
    onboarding.start()
    assert started.wait(60)
    # While the onboarding computes, the pool is the old one, whole, and a
    # removal (which needs the lock that publishes changes) goes through.
    assert service.health()["n_models"] == 12
    assert len(service.route(data.query_ids[:3])) == 3
    remover = threading.Thread(target=service.remove_model, args=("model-0003",))
    remover.start()
    remover.join(30)
    assert not remover.is_alive(), "the removal waited for the onboarding"
    assert not embedding.is_set()
    assert service.health()["n_models"] == 11
    release.set()
    onboarding.join(60)
    names = service.router.classes_.tolist()
    assert names == [n for n in data.model_names if n != "model-0003"] + ["newcomer"]
    assert service.router.cost_[-1] == 2.0
    assert service.router.embeddings_.shape == (12, router.embeddings_.shape[1])


def test_a_free_model_onboards_and_a_negative_cost_is_named(pool, client):
    # Costs follow one rule everywhere a router takes them (at least 0): a model
    # the team already runs for free fits a router, so it onboards over HTTP too.
    data, _ = pool
    body = {"name": "free", "evaluations": data.evaluation_sets[0], "cost": 0}
    response = client.post("/models", json=body)
    assert response.status_code == 201, response.text
    listed = client.get("/models").json()["models"][-1]
    assert listed == {
        "name": "free",
        "cost": 0.0,
        "n_evaluations": len(data.evaluation_sets[0]),
        "n_scores": len(data.evaluation_sets[0]),
        "n_outcomes": 0,
    }
    body = {"name": "dear", "evaluations": data.evaluation_sets[0], "cost": -1}
    response = client.post("/models", json=body)
    assert response.status_code == 422
    assert [loc for loc, _ in _faults(response)] == [("body", "cost")]


def test_a_cost_far_over_the_dearest_is_refused_on_the_server_and_warned_in_python(
    pool, client
):
    # N8 of round 2: one onboarding with cost 1e6 rescaled every cost, so that a
    # budget of 0.5 then routed at a mean cost of 2.83.
    data, router = pool
    dearest = float(router.cost_.max())
    before = client.post(
        "/route", json={"queries": data.query_ids[:20], "cost_weight": 1}
    )
    for cost in [1e6, 1e308, 10.5 * dearest]:
        body = {"name": "dear", "evaluations": data.evaluation_sets[0], "cost": cost}
        response = client.post("/models", json=body)
        assert response.status_code == 422, cost
        ((where, message),) = _faults(response)
        assert where == ("body", "cost") and "times the dearest model's" in message
    body = {"name": "dear", "evaluations": data.evaluation_sets[0], "cost": 9 * dearest}
    assert client.post("/models", json=body).status_code == 201
    assert client.delete("/models/dear").status_code == 200
    after = client.post(
        "/route", json={"queries": data.query_ids[:20], "cost_weight": 1}
    )
    assert after.json() == before.json()
    with pytest.warns(UserWarning, match=r"model 'dear': cost 1e\+06 is [\d,]+ times"):
        copy.deepcopy(router).add_models(
            [data.evaluation_sets[0]], ["dear"], cost=[1e6]
        )


# -- 7: the encoder's memory is bounded in bytes -----------------------------------


class _FakeSentenceModel:
    def encode(self, texts, **_):
        return np.ones((len(texts), 384), dtype=np.float32)

    def get_sentence_embedding_dimension(self):
        return 384


def test_the_encoder_cache_is_bounded_in_bytes(monkeypatch):
    import sklocus.encoders
    from sklocus.encoders import SentenceEncoder

    monkeypatch.setattr(sklocus.encoders, "_MEMORY_BYTES", 2**20)
    encoder = SentenceEncoder()
    encoder._state()["model"] = _FakeSentenceModel()  # no weights to load
    long_texts = [f"{i} " + "long words " * 2000 for i in range(200)]  # 22 kB each
    for start in range(0, 200, 50):
        encoder.transform(long_texts[start : start + 50])
    memory = encoder._state()["memory"]
    held = memory.lookup(long_texts)
    assert len(held) == len(memory)
    counted = sum(sys.getsizeof(text) + sys.getsizeof(v) for text, v in held.items())
    assert counted <= memory.nbytes <= 2**20
    assert 20 < len(memory) < 60  # the newest texts, as many as fit
    assert long_texts[-1] in memory and long_texts[0] not in memory
    # Each vector owns its memory: no row keeps a whole batch alive.
    assert all(vector.base is None for vector in held.values())


# -- 8: unprintable model names ------------------------------------------------------


@pytest.mark.parametrize(
    "name, code",
    [
        ("a\nb", "U+000A at position 1"),
        ("nul\x00", "U+0000 at position 3"),
        ("\u202eevil", "U+202E at position 0"),
        ("zero\u200bwidth", "U+200B at position 4"),
        ("line\u2028break", "U+2028 at position 4"),
    ],
)
def test_model_names_with_control_characters_are_refused(client, name, code):
    body = {"name": name, "evaluations": {"q00001": 1.0}, "cost": 1}
    response = client.post("/models", json=body)
    assert response.status_code == 422
    [(loc, message)] = _faults(response)
    assert loc == ("body", "name") and code in message
    assert "control or format characters" in message
    assert len(client.get("/models").json()["models"]) == 12


@pytest.mark.parametrize("name", [" ", "   "])
def test_a_blank_model_name_is_blamed_on_the_name(client, name):
    # N11 of round 2: it was blamed on the evaluations.
    body = {"name": name, "evaluations": {"q00001": 1.0}, "cost": 1}
    response = client.post("/models", json=body)
    assert response.status_code == 422
    [(loc, message)] = _faults(response)
    assert loc == ("body", "name") and "may not be blank" in message


# -- 9: warnings a client can repeat -------------------------------------------------


def test_warnings_from_one_place_are_shown_once_a_while():
    from sklocus.encoders import _warn_if_ids
    from sklocus.serve._warnings import WarningLimit

    shown, now = [], [0.0]

    def show(message, category, filename, lineno, file=None, line=None):
        shown.append(str(message))

    limit = WarningLimit(60, show=show, clock=lambda: now[0])
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = limit
        for i in range(1000):  # as many requests, each of two id-like queries
            _warn_if_ids([f"q{i}", f"r{i}"])
        now[0] = 61.0
        _warn_if_ids(["last", "one"])
    assert len(shown) == 2
    assert "'q0'" in shown[0] and "'last'" in shown[1]
    assert shown[1].endswith("[999 more like this in the last 61 s were not shown]")


def test_the_served_warning_filter_keeps_no_registry_of_messages():
    from sklocus.encoders import _warn_if_ids
    from sklocus.serve._warnings import limited_warnings

    shown = []
    with warnings.catch_warnings():
        warnings.showwarning = lambda message, *_: shown.append(message)
        with limited_warnings(60):
            for i in range(100):
                _warn_if_ids([f"q{i}", f"r{i}"])
            registry = sys._getframe().f_globals.get("__warningregistry__", {})
            assert not [key for key in registry if "q1" in str(key)]
    assert len(shown) == 1


# -- 10: the token, the write-back and the port --------------------------------------


def test_changes_need_the_token_and_reading_does_not(pool):
    data, router = pool
    client = TestClient(create_app(RouterService(router), token=TOKEN))
    body = {"name": "guest", "evaluations": {"q00001": 1.0}, "cost": 1}
    for headers in [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}]:
        for response in [
            client.post("/models", json=body, headers=headers),
            client.delete("/models/model-0001", headers=headers),
        ]:
            assert response.status_code == 401
            assert response.headers["www-authenticate"] == "Bearer"
            assert _faults(response)[0][0] == ("header", "Authorization")
    assert client.get("/health").json()["n_models"] == 12
    assert client.post("/route", json={"queries": ["q00001"]}).status_code == 200
    good = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post("/models", json=body, headers=good).status_code == 201
    assert client.delete("/models/guest", headers=good).status_code == 200
    with pytest.raises(ValueError, match="token must be a non-empty string"):
        create_app(RouterService(router), token=" ")


def test_a_failed_write_back_is_a_503_and_changes_nothing(pool, tmp_path):
    data, router = pool
    folder = tmp_path / "models"
    folder.mkdir()
    path = folder / "router.sklocus"
    sklocus.save(router, path)
    service = RouterService(sklocus.load(path), path=path, write_back=True)
    client = TestClient(create_app(service), raise_server_exceptions=False)
    # The folder goes away (a read-only folder would do, but tests run as root).
    path.unlink()
    folder.rmdir()
    body = {"name": "lost", "evaluations": {"q00001": 1.0}, "cost": 1}
    for response in [
        client.post("/models", json=body),
        client.delete("/models/model-0001"),
    ]:
        assert response.status_code == 503
        [(loc, message)] = _faults(response)
        assert loc == () and "could not be saved to the model file" in message
        assert "not served" in message
    assert service.router.classes_.tolist() == data.model_names


def _sklocus(*argv, cwd, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "sklocus", *map(str, argv)],
        cwd=cwd,
        env=dict(os.environ, HF_HUB_OFFLINE="1", **(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_port_in_use_is_a_usage_error(pool, tmp_path):
    sklocus.save(pool[1], tmp_path / "router.sklocus")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _sklocus("serve", "router.sklocus", "--port", port, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    # A start slower than 10 s (a loaded machine) says so in a log: not an error.
    said = [x for x in done.stderr.splitlines() if not x.startswith("Starting sklocus")]
    errors = [x for x in said if "error" in x]
    assert errors == [
        f"sklocus serve: error: cannot listen on 127.0.0.1:{port}: address already "
        "in use"
    ], done.stderr


def test_an_empty_token_file_is_a_usage_error(pool, tmp_path):
    (tmp_path / "token").write_text("\n")
    (tmp_path / "token").chmod(0o600)
    # The token is read before the model: a file that only starts as a model
    # file does is enough (a missing one is reported first).
    (tmp_path / "m.sklocus").write_bytes(struct.pack("<Q", 2) + b"{}")
    done = _sklocus("serve", "m.sklocus", "--token-file", "token", cwd=tmp_path)
    assert done.returncode == 2
    assert "--token-file token: the token is empty" in done.stderr


def test_the_server_warns_beyond_the_loopback_and_takes_a_token(pool, tmp_path):
    """One real server on every interface, with its token from the environment
    and a bound on evaluations from the command line."""
    from test_serve import Server

    data, router = pool
    sklocus.save(router, tmp_path / "router.sklocus")
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "token").chmod(0o600)
    server = Server(
        "router.sklocus",
        "--host",
        "0.0.0.0",
        "--max-evaluations",
        "5",
        "--token-file",
        "token",
        cwd=tmp_path,
    )
    try:
        body = {"name": "x", "evaluations": {"q00001": 1.0}, "cost": 1}
        url = f"{server.url}/models"
        assert httpx.post(url, json=body).status_code == 401
        good = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.post(url, json=body, headers=good).status_code == 201
        big = dict(body, name="y", evaluations=dict.fromkeys(data.query_ids[:6], 1.0))
        refused = httpx.post(url, json=big, headers=good)
        assert refused.status_code == 422 and "at most 5" in refused.text
        nan = httpx.post(
            f"{server.url}/route",
            content=b'{"queries": ["q00001"], "cost_weight": NaN}',
            headers=JSON,
        )
        assert nan.status_code == 422 and "Traceback" not in nan.text
    finally:
        status, stderr = server.stop()
    assert status == 0, stderr
    assert "changes need the token" in stderr
    assert "beyond the loopback" not in stderr
    unguarded = Server("router.sklocus", "--host", "0.0.0.0", cwd=tmp_path)
    status, stderr = unguarded.stop()
    assert "Warning: listening on 0.0.0.0, beyond the loopback, with no token" in (
        stderr
    )


def test_json_module_refusals_are_decode_errors():
    from sklocus.serve._json import loads

    assert loads(b'{"a": [1, 2.5, "\\ud83d\\ude00"]}') == {"a": [1, 2.5, "\U0001f600"]}
    with pytest.raises(json.JSONDecodeError, match="appears twice"):
        loads(b'{"a": 1, "a": 2}')
