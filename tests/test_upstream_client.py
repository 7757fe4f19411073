"""The chat proxy's client for upstreams: sent once, read with caps and deadlines."""

import asyncio
import json
import socket
import time

import pytest
from hostile_upstream import HostileUpstream
from stand_in_upstream import StandIn

pytest.importorskip("aiohttp")
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


@pytest.fixture()
def hostile():
    running = HostileUpstream()
    yield running
    running.close()


def url_of(upstream):
    return upstream.base_url + "/chat/completions"


def test_answers_are_read_and_connections_kept_for_the_next_request(stand_in):
    async def ask_twice():
        client = UpstreamClient(timeout=5, deadline=30)
        first = await client.post(url_of(stand_in), chat(text="one"), HEADERS)
        body = json.loads(await first.read(2**20))
        second = await client.post(url_of(stand_in), chat(text="two"), HEADERS)
        again = json.loads(await second.read(2**20))
        await client.aclose()
        return first.status, body, again

    status, body, again = asyncio.run(ask_twice())
    assert status == 200
    assert body["choices"][0]["message"]["content"] == "up says: one"
    assert again["choices"][0]["message"]["content"] == "up says: two"
    first, second = stand_in.received
    assert first["peer"] == second["peer"], "the second request took a new connection"
    assert first["headers"]["user-agent"].startswith("sklocus/")
    assert json.loads(chat(text="one")) == first["body"]


@pytest.mark.slow
def test_a_stream_arrives_in_parts_until_the_upstream_closes(stand_in):
    stand_in.behaviour = "slow"  # an event each 0.4 s: each read gets one

    async def stream():
        client = UpstreamClient(timeout=5, deadline=30)
        answer = await client.post(url_of(stand_in), chat(stream=True), HEADERS)
        parts = [part async for part in answer.parts(2**20)]
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
        client = UpstreamClient(timeout=0.3, deadline=30)
        try:
            answer = await client.post(url_of(stand_in), chat(stream=True), HEADERS)
            async for _ in answer.parts(2**20):
                pass
        finally:
            await client.aclose()

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
        client = UpstreamClient(timeout=5, deadline=30)
        try:
            await client.post(url, chat(), HEADERS)
        finally:
            await client.aclose()

    with pytest.raises(UpstreamError) as raised:
        asyncio.run(ask())
    assert not raised.value.timed_out
    assert raised.value.reason == "ConnectionRefusedError"
    assert str(port) not in str(raised.value)


def test_a_request_the_upstream_read_is_never_sent_again(hostile):
    """An upstream that reads and closes, with 64 kept connections to it: once."""
    hostile.answer_delay = 0.2  # so that 64 requests overlap, on 64 connections

    async def ask():
        client = UpstreamClient(timeout=5, deadline=30)
        try:

            async def one():
                answer = await client.post(url_of(hostile), chat(), HEADERS)
                return await answer.read(2**20)

            await asyncio.gather(*(one() for _ in range(64)))
            assert hostile.connections == 64
            hostile.behaviour = "read_and_close"
            before = hostile.requests
            with pytest.raises(UpstreamError) as raised:
                await client.post(url_of(hostile), chat(), HEADERS)
            await asyncio.sleep(0.2)  # anything sent again would be read by now
            return hostile.requests - before, raised.value
        finally:
            await client.aclose()

    received, error = asyncio.run(ask())
    assert received == 1
    assert not error.timed_out


@pytest.mark.parametrize("behaviour", ["endless_json", "endless_stream"])
def test_an_endless_body_is_cut_at_the_cap(hostile, behaviour):
    hostile.behaviour = behaviour

    async def ask():
        client = UpstreamClient(timeout=5, deadline=30)
        try:
            answer = await client.post(url_of(hostile), chat(), HEADERS)
            seen = 0
            with pytest.raises(UpstreamError) as raised:
                async for part in answer.parts(2**20):
                    seen += len(part)
            return seen, raised.value
        finally:
            await client.aclose()

    seen, error = asyncio.run(ask())
    assert error.too_large
    assert "1,048,576 bytes" in error.reason
    assert seen == 2**20


def test_an_error_body_is_read_no_further_than_asked(hostile):
    hostile.behaviour = "huge_error"  # 512 MiB declared, and sent if read

    async def ask():
        client = UpstreamClient(timeout=5, deadline=30)
        try:
            answer = await client.post(url_of(hostile), chat(), HEADERS)
            return answer.status, await answer.first_bytes(4096)
        finally:
            await client.aclose()

    status, start = asyncio.run(ask())
    assert status == 500
    assert len(start) == 4096
    assert start.startswith(b'{"error": {"message": "xxx')
    time.sleep(0.2)
    # The connection was closed unread: the upstream could write no more
    # than what the sockets' buffers hold.
    assert hostile.sent_bytes < 64 * 2**20


@pytest.mark.slow
@pytest.mark.parametrize("behaviour", ["continue_forever", "trickle"])
def test_the_whole_call_has_a_deadline_whatever_arrives(hostile, behaviour):
    """Bytes every 50 ms (a 100 Continue, or one byte of the body) never let the
    silence timeout run out; the deadline ends the call."""
    hostile.behaviour = behaviour

    async def ask():
        client = UpstreamClient(timeout=0.5, deadline=1.5)
        try:
            answer = await client.post(url_of(hostile), chat(), HEADERS)
            await answer.read(2**20)
        finally:
            await client.aclose()

    started = time.monotonic()
    with pytest.raises(UpstreamError) as raised:
        asyncio.run(ask())
    assert raised.value.timed_out
    # A ceiling that only a missing deadline can cross: the trickle alone
    # would take len(ANSWER) * 50 ms, over 10 s.
    assert time.monotonic() - started < 8


def test_a_compressed_body_is_decoded_and_capped_decoded(hostile):
    """An upstream that compresses despite ``accept-encoding: identity``."""
    import gzip

    body = json.dumps({"pad": "x" * 3_000_000}).encode()
    packed = gzip.compress(body)
    hostile.behaviour = "answer"

    async def fixed(reader, writer):
        await hostile._write(
            writer,
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s"
            % (len(packed), packed),
        )
        return True

    hostile._answer = fixed

    async def ask(cap):
        client = UpstreamClient(timeout=5, deadline=30)
        try:
            answer = await client.post(url_of(hostile), chat(), HEADERS)
            return await answer.read(cap)
        finally:
            await client.aclose()

    assert asyncio.run(ask(2**23)) == body
    with pytest.raises(UpstreamError) as raised:
        asyncio.run(ask(2**20))  # the packed body is far smaller than the cap
    assert raised.value.too_large
