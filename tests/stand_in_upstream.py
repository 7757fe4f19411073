"""A stand-in for an OpenAI-compatible chat API, on a loopback port, in threads.

Each :class:`StandIn` answers ``POST /v1/chat/completions`` with ``"<its name>
says: <the last user message>"``, as one JSON body or as server-sent events,
and keeps what it received. ``behaviour`` makes it misbehave: answer an error
status, hang before answering, or stop mid-stream.
"""

import http.server
import json
import threading
import time

_HANG_S = 30.0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Buffered, so that an answer's head and body leave in one write: as two
    # small writes, Nagle's algorithm would hold the body back until the
    # client acknowledges the head (40 ms where the client delays its ACK).
    wbufsize = -1

    def log_message(self, *args):  # quiet
        pass

    def handle(self):
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):  # the proxy gave up
            pass

    def do_POST(self):  # noqa: N802 - http.server's name
        stand_in = self.server.stand_in
        length = int(self.headers.get("content-length", 0))
        body = json.loads(self.rfile.read(length))
        stand_in.received.append(
            {"headers": dict(self.headers), "body": body, "peer": self.client_address}
        )
        behaviour = stand_in.behaviour
        if behaviour == "hang":
            stand_in.released.wait(_HANG_S)
            return self._json(500, {"error": {"message": "released"}})
        if isinstance(behaviour, int):
            message = stand_in.error_message or f"{stand_in.name} is unwell"
            error = {"message": message, **stand_in.error_fields}
            headers = {"retry-after": "7"} if behaviour == 429 else {}
            headers.update(stand_in.error_headers)
            return self._json(behaviour, {"error": error}, headers)
        text = f"{stand_in.name} says: {body['messages'][-1]['content']}"
        if behaviour == "echo":
            text = f"{stand_in.name} was sent: {self.headers.get('authorization')}"
        if body.get("stream"):
            return self._stream(body["model"], text, stall=behaviour == "stall")
        return self._json(200, _completion(body["model"], text))

    def _json(self, status, payload, headers=None):
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, model, text, stall):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        words = text.split(" ")
        for position, word in enumerate(words):
            piece = word if position == 0 else " " + word
            self._event(_chunk(model, {"content": piece}))
            if self.server.stand_in.behaviour == "slow":
                time.sleep(0.4)
            if stall and position == 1:
                self.server.stand_in.released.wait(_HANG_S)
                return
        self._event(_chunk(model, {}, finish_reason="stop"))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

    def _event(self, payload):
        self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
        self.wfile.flush()


def _completion(model, text):
    return {
        "id": "chatcmpl-stand-in",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _chunk(model, delta, finish_reason=None):
    return {
        "id": "chatcmpl-stand-in",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


class StandIn:
    """One stand-in upstream, serving until :meth:`close`.

    Parameters
    ----------
    name : str
        What its answers say they come from.

    Attributes
    ----------
    behaviour : str or int
        ``"answer"`` (the default), an HTTP status to answer with,
        ``"hang"`` (answer nothing until closed), ``"stall"`` (stream two
        words, then nothing), ``"slow"`` (stream a word each 0.4 s) or
        ``"echo"`` (answer with the ``Authorization`` header it was sent).
    error_message : str or None
        The message of an error status (the default names the stand-in).
    error_fields : dict
        More fields of an error (``code``, ``param``...); a 429 also says
        ``retry-after: 7``.
    error_headers : dict
        Headers of an error answer (over ``retry-after: 7``).
    received : list of dict
        Each request's ``headers``, JSON ``body`` and ``peer`` (the client's
        address and port: one per connection).
    base_url : str
    """

    def __init__(self, name):
        self.name = name
        self.behaviour = "answer"
        self.error_message = None
        self.error_fields = {}
        self.error_headers = {}
        self.received = []
        self.released = threading.Event()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.stand_in = self
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    def close(self):
        self.released.set()
        self._server.shutdown()
        self._server.server_close()
