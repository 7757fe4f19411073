"""The chat proxy: OpenAI's client through ``POST /v1/chat/completions``.

Every upstream is a stand-in started by the test (tests/stand_in_upstream.py),
whose answer says which model gave it; the server runs in a thread of this
process, so that its log is captured too.
"""

import logging
import os
import pickle
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from stand_in_upstream import StandIn
from test_serve import Server, _require
from test_serve_limits import TOKEN, Served
from tiny import tiny_priced_router

openai = _require("openai")
import httpx  # noqa: E402

import sklocus  # noqa: E402
from sklocus.serve import (  # noqa: E402
    Upstreams,
)

pytestmark = pytest.mark.slow

KEY = "sk-stand-in-Zq9xKEYNEVERSHOWN"
KEY_VARIABLE = "SKLOCUS_TEST_UPSTREAM_KEY"
PATIENCE = 20.0
# An upstream that hangs is given up on after this long.
TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def pool():
    return tiny_priced_router()


@pytest.fixture()
def stand_ins(pool):
    """A stand-in upstream per model of the router."""
    _, router = pool
    running = {name: StandIn(name) for name in router.classes_.tolist()}
    yield running
    with ThreadPoolExecutor(len(running)) as closing:  # each waits for its loop
        list(closing.map(StandIn.close, running.values()))


def upstreams_of(stand_ins, **settings):
    """Upstreams for the stand-ins: each model named ``served/NAME`` there."""
    models = {
        name: {
            "base_url": stand_in.base_url,
            "model": f"served/{name}",
            "api_key_env": KEY_VARIABLE,
        }
        for name, stand_in in stand_ins.items()
    }
    settings.setdefault("timeout", TIMEOUT_S)
    return Upstreams(models, environ={KEY_VARIABLE: KEY}, **settings)


class Proxy:
    """A served router with upstreams (``Served``), and OpenAI's client for it."""

    def __init__(self, router, upstreams, tmp_path, *, path=None, **limits):
        self.served = Served(router, tmp_path, path=path, upstreams=upstreams, **limits)
        self.service = self.served.service
        self.url = f"http://127.0.0.1:{self.served.port}"
        self.client = openai.OpenAI(
            base_url=self.url + "/v1", api_key=TOKEN, max_retries=0, timeout=PATIENCE
        )

    def ask(self, question, *, model="auto", **request):
        """Return the raw answer to one question (headers, then ``.parse()``)."""
        return self.client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": question}], **request
        )

    def close(self):
        self.client.close()
        self.served.close()


@pytest.fixture()
def proxy(pool, stand_ins, request, tmp_path):
    settings = getattr(request, "param", {})
    running = Proxy(pool[1], upstreams_of(stand_ins, **settings), tmp_path)
    yield running
    running.close()


def ranked(router, question, k=2):
    """The router's best ``k`` models for one question, asked alone."""
    models, _ = router.rank_models([question], k=k)
    return models[0].tolist()


QUESTIONS = [f"q{i:05d}" for i in range(30)]


def test_each_question_goes_to_the_model_the_router_names(proxy, pool, stand_ins):
    _, router = pool
    chosen = []
    for question in QUESTIONS:
        raw = proxy.ask(question)
        models, p = router.rank_models([question], k=1)
        best = router.predict([question])[0]
        assert raw.headers["x-sklocus-model"] == best
        assert float(raw.headers["x-sklocus-p-correct"]) == pytest.approx(
            float(p[0, 0]), abs=1e-5
        )
        assert raw.headers["x-sklocus-fallbacks"] == "0"
        answer = raw.parse()
        assert answer.choices[0].message.content == f"{best} says: {question}"
        # Forwarded under the upstream's own name for the model.
        assert answer.model == f"served/{best}"
        chosen.append(best)
    assert len(set(chosen)) >= 2, "the questions should not all go to one model"
    received = sum(len(stand_in.received) for stand_in in stand_ins.values())
    assert received == len(QUESTIONS)


def test_a_stream_is_relayed_event_by_event(proxy, pool):
    _, router = pool
    question = "q00002"
    best = router.predict([question])[0]
    raw = proxy.ask(question, stream=True)
    assert raw.headers["x-sklocus-model"] == best
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = [chunk for chunk in raw.parse() if chunk.choices]
    assert len(chunks) > 3
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text == f"{best} says: {question}"
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_a_stream_may_wait_on_its_upstream_beyond_the_answer_deadline(
    pool, stand_ins, tmp_path
):
    # The client's deadline runs while it takes a part; the upstream's own
    # timeout, not the client's, bounds the wait for the next part.
    _, router = pool
    question = "q00012"
    best = router.predict([question])[0]
    stand_ins[best].behaviour = "slow"  # 0.4 s between parts
    running = Proxy(router, upstreams_of(stand_ins), tmp_path, body_timeout=0.2)
    try:
        start = time.monotonic()
        raw = running.ask(question, stream=True)
        chunks = [c.choices[0].delta.content or "" for c in raw.parse() if c.choices]
        assert time.monotonic() - start > 1.2
        assert "".join(chunks) == f"{best} says: {question}"
    finally:
        running.close()


def test_a_model_named_in_the_request_takes_it(proxy, pool):
    _, router = pool
    question = "q00003"
    pinned = ranked(router, question, k=len(router.classes_))[-1]
    raw = proxy.ask(question, model=pinned)
    assert raw.headers["x-sklocus-model"] == pinned
    assert raw.parse().choices[0].message.content == f"{pinned} says: {question}"


@pytest.mark.parametrize(
    "failure, stream",
    [
        (503, False),
        (429, False),
        (401, False),
        ("hang", False),
        ("gone", False),
        (503, True),
        ("hang", True),
    ],
)
def test_a_failing_upstream_falls_back_to_the_next_ranked_model(
    proxy, pool, stand_ins, failure, stream
):
    _, router = pool
    question = "q00004"
    best, second = ranked(router, question)
    if failure == "gone":
        stand_ins[best].close()
    else:
        stand_ins[best].behaviour = failure
    start = time.monotonic()
    raw = proxy.ask(question, stream=stream)
    assert time.monotonic() - start < TIMEOUT_S + 5
    assert raw.headers["x-sklocus-model"] == second
    assert raw.headers["x-sklocus-fallbacks"] == "1"
    answer = raw.parse()
    if stream:
        text = "".join(c.choices[0].delta.content or "" for c in answer if c.choices)
    else:
        text = answer.choices[0].message.content
    assert text == f"{second} says: {question}"


@pytest.mark.parametrize(
    "failure, status, reason",
    [
        (503, 503, "answered 503: {best} is unwell"),
        (429, 429, "answered 429: {best} is unwell"),
        ("hang", 504, "timed out after 1 s"),
        ("gone", 502, "could not be reached or broke off (ConnectionRefusedError)"),
        # A refused key is this server's fault: a bad gateway, not a 401.
        (401, 502, f"answered 401: refused the key in {KEY_VARIABLE}"),
    ],
)
@pytest.mark.parametrize("proxy", [{"fallbacks": 0}], indirect=True)
def test_without_fallbacks_a_failure_is_answered_clearly(
    proxy, pool, stand_ins, failure, status, reason
):
    _, router = pool
    question = "q00005"
    best = router.predict([question])[0]
    if failure == "gone":
        stand_ins[best].close()
    else:
        stand_ins[best].behaviour = failure
    start = time.monotonic()
    with pytest.raises(openai.APIStatusError) as raised:
        proxy.ask(question)
    assert time.monotonic() - start < TIMEOUT_S + 5
    assert raised.value.status_code == status
    message = raised.value.body["message"]
    assert message.startswith("no upstream answered: ")
    assert f"{best!r} {reason.format(best=best)}" in message
    assert raised.value.body["type"] == "upstream_error"
    if failure == 429:  # when to try again, as the upstream said
        assert raised.value.response.headers["retry-after"] == "7"


def test_when_every_fallback_fails_each_is_named(proxy, pool, stand_ins):
    _, router = pool
    question = "q00006"
    best, second = ranked(router, question)
    stand_ins[best].behaviour = "hang"
    stand_ins[second].behaviour = 500
    with pytest.raises(openai.InternalServerError) as raised:
        proxy.ask(question)
    assert raised.value.body["message"] == (
        f"no upstream answered: {best!r} timed out after 1 s; {second!r} answered "
        f"500: {second} is unwell"
    )


def test_a_fault_in_the_request_is_not_retried_elsewhere(proxy, pool, stand_ins):
    _, router = pool
    question = "q00007"
    best = router.predict([question])[0]
    stand_ins[best].behaviour = 400
    stand_ins[best].error_message = "temperature must be at most 2"
    stand_ins[best].error_fields = {"param": "temperature", "code": "out_of_range"}
    with pytest.raises(openai.BadRequestError) as raised:
        proxy.ask(question, temperature=3.5)
    assert raised.value.body["message"] == (
        f"the upstream of {best!r} answered 400: temperature must be at most 2"
    )
    # What OpenAI's clients act on is kept, and says who answered.
    assert (raised.value.param, raised.value.code) == ("temperature", "out_of_range")
    assert raised.value.response.headers["x-sklocus-model"] == best
    assert [len(s.received) for s in stand_ins.values()].count(1) == 1
    # What the client sent besides the model went upstream as it was.
    assert stand_ins[best].received[0]["body"]["temperature"] == 3.5


def test_a_stream_that_stops_midway_ends_with_an_error(proxy, pool, stand_ins):
    _, router = pool
    question = "q00008"
    best = router.predict([question])[0]
    stand_ins[best].behaviour = "stall"
    start = time.monotonic()
    raw = proxy.ask(question, stream=True)
    received = []
    with pytest.raises(openai.APIError, match=f"upstream of {best!r} stopped mid"):
        for chunk in raw.parse():
            received.append(chunk.choices[0].delta.content)
    assert time.monotonic() - start < TIMEOUT_S + 5
    assert "".join(received) == f"{best} says:"


def test_chat_completions_need_the_token_and_the_model_list_does_not(proxy):
    stranger = openai.OpenAI(
        base_url=proxy.url + "/v1", api_key="not-the-token", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError) as raised:
        stranger.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "q00001"}]
        )
    # Refused before the body is read, in OpenAI's shape all the same.
    assert "Authorization: Bearer TOKEN" in raised.value.body["message"]
    assert raised.value.body["param"] == "Authorization"
    listed = [model.id for model in stranger.models.list()]
    assert listed == ["auto", *proxy.service.router.classes_.tolist()]
    stranger.close()


@pytest.mark.parametrize(
    "body, status, param, message",
    [
        (b"{", 400, None, "the body is not valid JSON"),
        (b"[]", 400, None, "the body must be a JSON object"),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model", "model"),
        ({"model": "auto"}, 400, "messages", "messages must be a non-empty list"),
        (
            {"model": "auto", "messages": [{"role": "system", "content": "be brief"}]},
            400,
            "messages",
            "the last user message has no text",
        ),
        (
            {
                "model": "auto",
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "url": "x"}]}
                ],
            },
            400,
            "messages",
            "the last user message has no text",
        ),
        (
            {
                "model": "auto",
                "messages": [{"role": "user", "content": "hi"}],
                "stream": "yes",
            },
            400,
            "stream",
            "stream must be true or false",
        ),
        (
            {"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]},
            404,
            "model",
            "model 'gpt-9' is not served here; give 'auto' to route",
        ),
        (
            {"model": 7, "messages": [{"role": "user", "content": "hi"}]},
            400,
            "model",
            "model must be 'auto' (to route) or a served model's name",
        ),
        (
            {"model": "auto", "messages": [{"role": "user", "content": "hi"}, "hi"]},
            400,
            "messages",
            "messages[1] is not a chat message",
        ),
        (
            {"model": "auto", "messages": [{"content": "hi"}]},
            400,
            "messages",
            "messages[0] is not a chat message",
        ),
        (
            {"model": "auto", "messages": [{"role": "user", "content": 3}]},
            400,
            "messages",
            "messages[0] is not a chat message",
        ),
    ],
)
def test_bad_chat_requests_are_refused_in_openai_s_shape(
    proxy, stand_ins, body, status, param, message
):
    content = body if isinstance(body, bytes) else None
    answer = httpx.post(
        proxy.url + "/v1/chat/completions",
        content=content,
        json=None if content is not None else body,
        headers={"authorization": f"Bearer {TOKEN}"},
        timeout=PATIENCE,
    )
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error["param"] == param
    assert message in error["message"]
    assert not any(stand_in.received for stand_in in stand_ins.values())


def test_models_without_an_upstream_are_not_routed_to(pool, stand_ins, tmp_path):
    _, router = pool
    question = "q00009"
    best = router.predict([question])[0]
    others = {name: s for name, s in stand_ins.items() if name != best}
    running = Proxy(router, upstreams_of(others), tmp_path)
    try:
        raw = running.ask(question)
        assert raw.headers["x-sklocus-model"] == ranked(router, question)[1]
        with pytest.raises(openai.NotFoundError, match="not served here"):
            running.ask(question, model=best)
        assert best not in [model.id for model in running.client.models.list()]
    finally:
        running.close()


def test_keys_never_reach_errors_logs_or_the_model_file(
    pool, stand_ins, tmp_path, caplog, capfd
):
    _, router = pool
    question = "q00010"
    best, second = ranked(router, question)
    # The worst upstreams: each quotes the key in its error.
    stand_ins[best].behaviour = 401
    stand_ins[best].error_message = f"Incorrect API key provided: {KEY}"
    stand_ins[second].behaviour = 500
    stand_ins[second].error_message = f"crashed while checking {KEY}"
    path = tmp_path / "router.sklocus"
    sklocus.save(router, path)
    upstreams = upstreams_of(stand_ins)
    caplog.set_level(logging.DEBUG)
    running = Proxy(router, upstreams, tmp_path, path=path)
    try:
        with pytest.raises(openai.InternalServerError) as raised:
            running.ask(question)
        stand_ins[best].behaviour = "stall"
        with pytest.raises(openai.APIError):
            for _ in running.ask(question, stream=True).parse():
                pass
        # A change to the pool writes the model file back.
        removed = httpx.delete(
            f"{running.url}/models/{router.classes_[-1]}",
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        assert removed.status_code == 200
    finally:
        running.close()
    # The key went where it belongs...
    sent = stand_ins[best].received[0]["headers"]
    assert {k.lower(): v for k, v in sent.items()}["authorization"] == f"Bearer {KEY}"
    # ...and nowhere else.
    message = raised.value.body["message"]
    assert f"refused the key in {KEY_VARIABLE}" in message
    assert "crashed while checking [key]" in message
    shown = [message, repr(upstreams), repr(upstreams[best])]
    shown += [record.getMessage() for record in caplog.records]
    output = capfd.readouterr()
    shown += [output.out, output.err]
    assert any("failed" in record.getMessage() for record in caplog.records)
    for text in shown:
        assert KEY not in text
        assert KEY[-8:] not in text
    assert KEY.encode() not in path.read_bytes()
    with pytest.raises(TypeError, match="never pickled"):
        pickle.dumps(upstreams)


def test_sklocus_serve_forwards_to_the_upstreams_file(pool, stand_ins, tmp_path):
    _, router = pool
    path = tmp_path / "router.sklocus"
    sklocus.save(router, path)
    names = router.classes_.tolist()
    lines = []
    for name in [*names[:-1], "not-yet-onboarded"]:
        stand_in = stand_ins.get(name, stand_ins[names[0]])
        lines += [
            f'[models."{name}"]',
            f'base_url = "{stand_in.base_url}"',
            f'api_key_env = "{KEY_VARIABLE}"',
        ]
    (tmp_path / "upstreams.toml").write_text("\n".join(lines) + "\n")
    os.environ[KEY_VARIABLE] = KEY
    try:
        running = Server(
            path,
            "--upstreams",
            "upstreams.toml",
            "--fallbacks",
            "0",
            "--upstream-timeout",
            "2",
            cwd=tmp_path,
        )
    finally:
        del os.environ[KEY_VARIABLE]
    try:
        client = openai.OpenAI(
            base_url=running.url + "/v1", api_key="unused", max_retries=0
        )
        question = "q00011"
        models, _ = router.rank_models([question], k=1, exclude=names[-1:])
        best = models[0, 0]
        stand_ins[best].behaviour = 503
        with pytest.raises(openai.InternalServerError, match="answered 503"):
            client.chat.completions.create(
                model="auto", messages=[{"role": "user", "content": question}]
            )
        stand_ins[best].behaviour = "answer"
        answer = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": question}]
        )
        assert answer.choices[0].message.content == f"{best} says: {question}"
        client.close()
    finally:
        status, stderr = running.stop()
    assert status == 0, stderr
    assert "1 models the router does not serve ('not-yet-onboarded')" in stderr
    assert f"1 of the router's {len(names)} models have no upstream" in stderr
    assert f"forwards to the upstreams of {len(names) - 1} models" in stderr
    assert f"the upstream of {best!r} failed (answered 503" in stderr
    assert "POST /v1/chat/completions" in stderr  # the access log
    assert KEY not in stderr
