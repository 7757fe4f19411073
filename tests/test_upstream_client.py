"""The chat proxy's HTTP/1.1 client, against the stand-in upstream."""

import asyncio
import json
import socket

import pytest
from stand_in_upstream import StandIn

pytest.importorskip("h11")
from sklocus.serve._upstream_client import (  # noqa: E402
    UpstreamClient,
    UpstreamError,
)

HEADERS = {"content-type": "application/json"}


def chat(model="m", text="hello", stream=False):
    request = {"model": model, "messages": [{"role": "user", "content": text}]}
    return json.dumps({**request, "stream": stream}).encode()


@pytest.fixture()
def stand_in():
    running = StandIn("up")
    yield running
    running.close()


def url_of(stand_in):
    return stand_in.base_url + "/chat/completions"


def test_answers_are_read_and_connections_kept_for_the_next_request(stand_in):
    async def ask_twice():
        client = UpstreamClient(timeout=5)
        first = await client.post(url_of(stand_in), chat(text="one"), HEADERS)
        body = json.loads(await first.read())
        (kept,) = client._idle[("http", "127.0.0.1", first_port(stand_in))]
        second = await client.post(url_of(stand_in), chat(text="two"), HEADERS)
        again = json.loads(await second.read())
        reused = client._idle[("http", "127.0.0.1", first_port(stand_in))] == [kept]
        await client.aclose()
        return first.status, body, again, reused

    status, body, again, reused = asyncio.run(ask_twice())
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "up says: one"
    assert again["choices"][0]["message"]["content"] == "up says: two"
    assert reused
    sent = stand_in.received[0]["headers"]
    assert sent["user-agent"].startswith("sklocus/")
    assert json.loads(chat(text="one")) == stand_in.received[0]["body"]


def first_port(stand_in):
    return int(stand_in.base_url.rsplit(":", 1)[1].split("/")[0])


def test_a_stream_arrives_in_parts_until_the_upstream_closes(stand_in):
    stand_in.behaviour = "slow"  # an event each 0.4 s: each read gets one

    async def stream():
        client = UpstreamClient(timeout=5)
        answer = await client.post(url_of(stand_in), chat(stream=True), HEADERS)
        parts = [part async for part in answer.parts()]
        await client.aclose()
        return answer.headers, parts

    headers, parts = asyncio.run(stream())
    assert headers["content-type"] == "text/event-stream"
    assert len(parts) > 1
    assert b"".join(parts).endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("behaviour", ["hang", "stall"])
def test_a_silent_upstream_times_out(stand_in, behaviour):
    stand_in.behaviour = behaviour

    async def ask():
        client = UpstreamClient(timeout=0.3)
        answer = await client.post(url_of(stand_in), chat(stream=True), HEADERS)
        async for _ in answer.parts():
            pass

    with pytest.raises(UpstreamError) as raised:
        asyncio.run(ask())
    assert raised.value.timed_out
    assert str(raised.value) == "timed out"


def test_an_upstream_that_is_not_there_is_named_by_the_error_alone():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"

    async def ask():
        await UpstreamClient(timeout=5).post(url, chat(), HEADERS)

    with pytest.raises(UpstreamError) as raised:
        asyncio.run(ask())
    assert not raised.value.timed_out
    assert raised.value.reason == "ConnectionRefusedError"
    assert str(port) not in str(raised.value)
