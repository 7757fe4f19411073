"""An upstream that misbehaves at the byte level, on a loopback port, in a thread.

Where ``stand_in_upstream.StandIn`` plays a well-formed OpenAI API that may
answer errors or hang, :class:`HostileUpstream` writes raw HTTP/1.1 to test
what the proxy's client does with an upstream that reads a request and closes,
sends a body that never ends (as JSON or as a stream), a huge error body,
``100 Continue`` heads forever, or its answer a byte at a time. It counts the
requests it read.
"""

import asyncio
import json
import threading

ANSWER = json.dumps(
    {
        "id": "chatcmpl-hostile",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "fine"},
                "finish_reason": "stop",
            }
        ],
    }
).encode()
_PIECE = b"x" * 2**16


class HostileUpstream:
    """One raw upstream, serving until :meth:`close`.

    Attributes
    ----------
    behaviour : str
        ``"answer"`` (a JSON completion, the connection kept), ``"read_and_close"``
        (read the request whole, then close without a word),
        ``"endless_json"`` or ``"endless_stream"`` (a 200 whose chunked body never
        ends), ``"huge_error"`` (a 500 declaring ``error_bytes`` of body and
        sending them, if read), ``"continue_forever"`` (``100 Continue`` heads,
        one each 50 ms), ``"trickle"`` (a 200 whose body comes a byte each 50
        ms) or ``"hang"`` (no answer; the connection closed when the client
        closes it).
    answer_delay : float
        Seconds an ``"answer"`` waits before it is written.
    echo : bytes
        Put in an ``"answer"``'s body (a key it echoes, say), when set.
    requests : int
        Requests read whole.
    connections : int
        Connections accepted.
    open : int
        Connections open now.
    sent_bytes : int
        Bytes written to clients.
    base_url : str
    """

    def __init__(self, error_bytes=512 * 2**20):
        self.behaviour = "answer"
        self.answer_delay = 0.0
        self.echo = None
        self.error_bytes = error_bytes
        self.requests = 0
        self.connections = 0
        self.open = 0
        self.sent_bytes = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)
        self.base_url = f"http://127.0.0.1:{self._port}/v1"

    def _serve(self):
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", 0)
        )
        self._server = server
        self._port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _connection(self, reader, writer):
        self.connections += 1
        self.open += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                await reader.readexactly(length)
                self.requests += 1
                if not await getattr(self, "_" + self.behaviour)(reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self.open -= 1
            writer.transport.abort()

    async def _write(self, writer, data):
        writer.write(data)
        self.sent_bytes += len(data)
        await writer.drain()

    async def _answer(self, reader, writer):
        await asyncio.sleep(self.answer_delay)
        body = (
            ANSWER
            if self.echo is None
            else ANSWER[:-1] + b', "echo": "%s"}' % self.echo
        )
        await self._write(
            writer,
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body),
        )
        return True

    async def _read_and_close(self, reader, writer):
        return False

    async def _hang(self, reader, writer):
        await reader.read()
        return False

    async def _endless(self, writer, media_type, piece):
        await self._write(
            writer,
            b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked"
            b"\r\n\r\n" % media_type,
        )
        chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
        while True:
            await self._write(writer, chunk)

    async def _endless_json(self, reader, writer):
        return await self._endless(writer, b"application/json", _PIECE)

    async def _endless_stream(self, reader, writer):
        event = b'data: {"choices": [{"index": 0, "delta": {"content": "%s"}}]}\n\n'
        return await self._endless(writer, b"text/event-stream", event % _PIECE[:4000])

    async def _huge_error(self, reader, writer):
        await self._write(
            writer,
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json"
            b"\r\ncontent-length: %d\r\n\r\n" % self.error_bytes,
        )
        start = b'{"error": {"message": "'
        await self._write(writer, start)
        left = self.error_bytes - len(start)
        while left > 0:
            piece = _PIECE[: min(left, len(_PIECE))]
            await self._write(writer, piece)
            left -= len(piece)
        return False

    async def _continue_forever(self, reader, writer):
        while True:
            await self._write(writer, b"HTTP/1.1 100 Continue\r\n\r\n")
            await asyncio.sleep(0.05)

    async def _trickle(self, reader, writer):
        await self._write(
            writer,
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(ANSWER),
        )
        for position in range(len(ANSWER)):
            await self._write(writer, ANSWER[position : position + 1])
            await asyncio.sleep(0.05)
        return True

    def close(self):
        async def stop():
            self._server.close()
            tasks = [
                task
                for task in asyncio.all_tasks(self._loop)
                if task is not asyncio.current_task()
            ]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
