"""LiteLLM's Router with sklocus's routing plugin, offline (LiteLLM's mock answers).

Each deployment of the gateway answers with its own name (``mock_response``), so
an answer says which model LiteLLM sent the request to.
"""

import asyncio
import importlib
import logging
import os
import time

import httpx
import pytest
from test_serve_limits import TOKEN, Served
from tiny import tiny_priced_router

import sklocus
from sklocus.integrations.litellm import LocusRoutingPlugin
from sklocus.serve import RouterService

pytestmark = pytest.mark.slow


def _litellm(name="litellm"):
    """Import LiteLLM (or one of its modules) when a test runs, not at collection.

    Importing it takes seconds, which every pytest-xdist worker would pay while
    collecting, whether it runs these tests or not.
    """
    # LiteLLM fetches its price list from the network on import unless told not to.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return importlib.import_module(name)


def RoutingContext(**fields):  # noqa: N802 (stands for LiteLLM's class)
    return _litellm("litellm.types.router").RoutingContext(**fields)


@pytest.fixture(scope="module")
def pool():
    return tiny_priced_router()


def deployment(name):
    """A LiteLLM deployment that answers with its own name, offline."""
    return {
        "model_name": "auto",
        "litellm_params": {
            "model": f"openai/{name}",
            "api_key": "x",
            "mock_response": name,
        },
    }


def gateway(names, plugin):
    return _litellm().Router(
        model_list=[deployment(name) for name in names], plugins=[plugin]
    )


async def ask(router, text):
    answer = await router.acompletion(
        model="auto", messages=[{"role": "user", "content": text}]
    )
    return answer.choices[0].message.content


def context(candidates, text="q00001"):
    messages = [{"role": "user", "content": text}] if text is not None else []
    return RoutingContext(
        raw_messages=messages, structured_messages=messages, candidate_models=candidates
    )


def test_each_question_goes_to_the_model_the_router_names(pool):
    data, router = pool
    names = list(router.classes_)
    plugin = LocusRoutingPlugin(router, model_names={f"openai/{n}": n for n in names})
    questions = (data.query_ids * 2)[:200]
    routed = gateway(names, plugin)

    async def asked():
        return [await ask(routed, q) for q in questions]

    # One query at a time, as the plugin ranks them: the same arithmetic.
    assert asyncio.run(asked()) == one_at_a_time(router, questions)
    # The policy goes with each request: with a heavy weight of cost, the
    # cheaper models take more of the questions, as the router sends them.
    cheap = LocusRoutingPlugin(
        router, model_names={f"openai/{n}": n for n in names}, cost_weight=1.0
    )
    thrifty = gateway(names, cheap)

    async def asked_at_once():
        return await asyncio.gather(*[ask(thrifty, q) for q in questions[:40]])

    answered = asyncio.run(asked_at_once())
    assert answered == one_at_a_time(router, questions[:40], cost_weight=1.0)


def test_unknown_models_are_left_to_litellm_and_named_once(pool, caplog):
    data, router = pool
    known = [f"openai/{n}" for n in router.classes_[:4]]
    plugin = LocusRoutingPlugin(
        router, model_names={c: c.removeprefix("openai/") for c in known}, k=2
    )
    candidates = known + ["openai/stranger"]
    with caplog.at_level(logging.WARNING, logger="sklocus.integrations.litellm"):
        for _ in range(3):
            narrowed = asyncio.run(plugin.run(context(candidates)))
    signals = narrowed.signals["sklocus"]
    top, _ = router.rank_models(["q00001"], k=2, exclude=list(router.classes_[4:]))
    assert narrowed.candidate_models == [
        f"openai/{top[0, 0]}",
        f"openai/{top[0, 1]}",
        "openai/stranger",
    ]
    assert signals["routed"] and signals["model"] == top[0, 0]
    assert signals["left_to_litellm"] == ["openai/stranger"]
    assert [entry["model"] for entry in signals["ranked"]] == list(
        router.rank_models(["q00001"], k=4, exclude=list(router.classes_[4:]))[0][0]
    )
    said = [r.getMessage() for r in caplog.records if "stranger" in r.getMessage()]
    assert len(said) == 1 and "left to LiteLLM's own strategy" in said[0]


def test_deployments_of_one_model_stay_together(pool):
    _, router = pool
    best = router.predict(["q00001"])[0]
    other = next(m for m in router.classes_ if m != best)
    # Two deployments of the best model (two regions), one of another.
    names = {"eu/best": best, "us/best": best, "eu/other": other}
    plugin = LocusRoutingPlugin(router, model_names=names)
    narrowed = asyncio.run(plugin.run(context(list(names))))
    assert narrowed.candidate_models == ["eu/best", "us/best"]


def test_requests_the_router_cannot_judge_are_left_as_they_were(pool):
    _, router = pool
    plugin = LocusRoutingPlugin(router)
    candidates = ["openai/a", "openai/b"]
    for ctx, reason in [
        (context(list(router.classes_[:3]), text=None), "has no text"),
        (context(candidates), "knows none of the candidates"),
    ]:
        before = list(ctx.candidate_models)
        after = asyncio.run(plugin.run(ctx))
        assert after.candidate_models == before
        assert not after.signals["sklocus"]["routed"]
        assert reason in after.signals["sklocus"]["reason"]
    # Text in parts is read, the last user message counts.
    messages = [
        {"role": "user", "content": "q00002"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": [{"type": "text", "text": "q00003"}]},
    ]
    ctx = RoutingContext(
        raw_messages=messages,
        structured_messages=messages,
        candidate_models=list(router.classes_),
    )
    assert asyncio.run(plugin.run(ctx)).candidate_models == list(
        router.predict(["q00003"])
    )


def one_at_a_time(router, queries, **policy):
    """The router's choice for each query, predicted alone."""
    return [router.predict([query], **policy)[0] for query in queries]


def test_model_files_and_bad_settings(pool, tmp_path):
    data, router = pool
    sklocus.save(router, tmp_path / "router.sklocus")
    plugin = LocusRoutingPlugin(tmp_path / "router.sklocus")
    narrowed = asyncio.run(plugin.run(context(list(router.classes_))))
    assert narrowed.candidate_models == list(router.predict(["q00001"]))
    sklocus.save(router.embedder_.estimator, tmp_path / "embedder.sklocus")
    with pytest.raises(TypeError, match="holds a LocusEmbedder; the plugin routes"):
        LocusRoutingPlugin(tmp_path / "embedder.sklocus")
    with pytest.raises(TypeError, match="router is a list"):
        LocusRoutingPlugin([router])
    with pytest.raises(ValueError, match="k=0 must be a positive integer"):
        LocusRoutingPlugin(router, k=0)
    with pytest.raises(TypeError, match="model_names maps 'a' to 3"):
        LocusRoutingPlugin(router, model_names={"a": 3})
    with pytest.raises(ValueError, match="fitted without"):
        LocusRoutingPlugin(router, budget=2.0)
    with pytest.raises(ValueError, match="not several"):
        LocusRoutingPlugin(router, cost_weight=0.1, min_probability=0.5)
    with pytest.raises(ValueError, match="URL carries credentials"):
        LocusRoutingPlugin("http://user:secret@127.0.0.1:9/")
    with pytest.raises(ValueError, match="keeps no feedback journal"):
        LocusRoutingPlugin(router).outcome_logger(lambda messages, response: 1.0)


def test_a_served_router_ranks_as_the_router_in_process(pool, caplog, tmp_path):
    data, router = pool
    served = Served(router, tmp_path)
    url = f"http://127.0.0.1:{served.port}"
    try:
        plugin = LocusRoutingPlugin(url, k=3, cost_weight=0.2)
        candidates = list(router.classes_[2:9])
        for query in data.query_ids[:10]:
            narrowed = asyncio.run(plugin.run(context(candidates, query)))
            top, _ = router.rank_models(
                [query],
                k=3,
                exclude=[m for m in router.classes_ if m not in candidates],
                cost_weight=0.2,
            )
            assert narrowed.candidate_models == top[0].tolist()
        # Outcomes go to its POST /feedback, with the token, which no error shows.
        thumbs = LocusRoutingPlugin(url, token=TOKEN)
        answer = asyncio.run(thumbs.feedback("q00004", candidates[0], 1.0))
        assert answer["accepted"] == 1
        assert served.service.health()["pending_outcomes"] == 1
        with pytest.raises(httpx.HTTPStatusError, match="401"):
            asyncio.run(plugin.feedback("q00004", candidates[0], 1.0))
        with pytest.raises(httpx.HTTPStatusError, match="422") as refused:
            asyncio.run(thumbs.feedback("q00004", candidates[0], 2.0))
        assert TOKEN not in str(refused.value)
        # A model retired since the list was read: that request is left to
        # LiteLLM, and the next one reads the list again and is routed.
        retired = router.classes_[0]
        gone = httpx.delete(
            f"{url}/models/{retired}",
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        assert gone.status_code == 200
        stale = asyncio.run(plugin.run(context(candidates)))
        assert stale.candidate_models == candidates
        assert "ValueError" in stale.signals["sklocus"]["reason"]
        assert asyncio.run(plugin.run(context(candidates))).signals["sklocus"]["routed"]
    finally:
        served.close()
    # A server that is gone: the candidates stay, and the failure is logged.
    with caplog.at_level(logging.WARNING, logger="sklocus.integrations.litellm"):
        gone = LocusRoutingPlugin(url)
        after = asyncio.run(gone.run(context(candidates)))
    assert after.candidate_models == candidates
    assert not after.signals["sklocus"]["routed"]
    assert any("left as they were" in r.getMessage() for r in caplog.records)


def test_graded_answers_reach_the_routers_feedback(pool, tmp_path):
    data, router = pool
    names = list(router.classes_)
    service = RouterService(router, feedback_journal=tmp_path / "journal.db")
    plugin = LocusRoutingPlugin(service, model_names={f"openai/{n}": n for n in names})
    graded = []

    async def grade(messages, response):  # awaited (a plain one: the example)
        answered = response.choices[0].message.content
        graded.append((messages[-1]["content"], answered))
        return None if answered == names[0] else 1.0  # None: not sent

    questions = data.query_ids[:12]
    routed = one_at_a_time(router, questions)
    sent = sum(model != names[0] for model in routed)
    routes = gateway(names, plugin)

    async def asked():
        for question in questions:
            await ask(routes, question)
        # LiteLLM runs its callbacks after the call returns.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (
            len(graded) < len(questions) or service.health()["pending_outcomes"] < sent
        ):
            await asyncio.sleep(0.02)

    litellm = _litellm()
    litellm.callbacks = [plugin.outcome_logger(grade)]
    try:
        asyncio.run(asked())
    finally:
        # LiteLLM copies its callbacks into lists of its own.
        litellm.logging_callback_manager._reset_all_callbacks()
    assert sorted(graded) == sorted(zip(questions, routed))
    assert service.health()["pending_outcomes"] == sent
    # A user's thumbs, sent directly, by LiteLLM's name of the model.
    answer = asyncio.run(plugin.feedback("q00009", f"openai/{names[1]}", 0.0))
    assert answer["pending_outcomes"] == sent + 1
    with pytest.raises(TypeError, match="grader is a str"):
        plugin.outcome_logger("grade")


class SilentServer:
    """Accepts connections and reads requests, never answering; counts them."""

    def __init__(self):
        import socket
        import threading

        self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import threading

        while True:
            try:
                connection, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(connection)
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection):
        data = b""
        try:
            while chunk := connection.recv(65536):
                data += chunk
                self.requests += chunk.count(b" HTTP/1.1\r\n")
        except OSError:
            pass

    def close(self):
        self._listener.close()
        for connection in self._held:
            connection.close()


def test_a_router_that_never_answers_is_left_alone_for_a_while():
    """F9: a served router that accepts and never answers added the full
    timeout to every gateway request."""
    silent = SilentServer()
    plugin = LocusRoutingPlugin(silent.url, timeout=0.5, cooldown=30.0)
    candidates = ["openai/a", "openai/b"]

    async def run_five():
        return [await plugin.run(context(list(candidates))) for _ in range(5)]

    try:
        routed = asyncio.run(run_five())
    finally:
        silent.close()
    assert silent.requests == 1
    assert all(c.candidate_models == candidates for c in routed)
    first, *rest = (c.signals["sklocus"] for c in routed)
    assert "the router could not rank them" in first["reason"]
    for signal in rest:
        assert not signal["routed"]
        assert "failed 1 time(s) in a row; it is asked again in" in signal["reason"]


def test_the_breaker_doubles_its_wait_and_forgets_on_success():
    from sklocus.integrations._breaker import CircuitBreaker

    now = [0.0]
    breaker = CircuitBreaker(5.0, 60.0, clock=lambda: now[0])
    assert breaker.wait() == 0.0
    waits = []
    for _ in range(6):
        breaker.failed()
        waits.append(breaker.wait())
        now[0] += waits[-1]
        assert breaker.wait() == 0.0  # the one trial
        assert breaker.wait() > 0  # the others wait for it
    assert waits == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0]
    breaker.succeeded()
    assert breaker.wait() == 0.0
    assert breaker.wait() == 0.0


def test_a_huge_message_is_routed_by_its_start(pool):
    """F10: in process a 10 MB message held the router thread for 11 s."""
    _, router = pool
    service = RouterService(router)
    seen = []
    route_in_turns = service.route_in_turns

    def recorded(queries, **kwargs):
        seen.append(len(queries[0]))
        return route_in_turns(queries, **kwargs)

    service.route_in_turns = recorded
    plugin = LocusRoutingPlugin(service)
    candidates = list(router.classes_)
    huge = "q00001" + "x" * 10_000_000
    # The tiny router's encoder knows query ids only: the cut text is refused
    # as unknown, after it reached the router at its cut length.
    narrowed = asyncio.run(plugin.run(context(list(candidates), text=huge)))
    assert seen == [20_000]
    assert narrowed.candidate_models == candidates
