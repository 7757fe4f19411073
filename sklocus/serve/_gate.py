"""What a request must pass before the application reads a byte of its body.

:class:`RequestGate` is ASGI middleware in front of the FastAPI application.
For each request it

- checks the token of a guarded route (one that changes the pool or what it
  learns, or spends the upstreams' keys), from the headers alone: without it
  the answer is 401, whatever the body holds or would hold;
- refuses a body over the route's limit (the guarded routes may take larger
  ones than the open routes) with 413, by its declared length or while it
  arrives;
- tells the request's connection (:mod:`sklocus.serve._guard`) when the
  request starts, when its body is in and when its answer is sent, so that
  deadlines and the client's rate follow it; only a 4xx of the client's own
  making is charged to its rate as a refusal.

A refusal made before the body is read closes the connection: the unread body
would otherwise be taken for the next request.
"""

from __future__ import annotations

import hmac

from fastapi.responses import JSONResponse

from sklocus.serve._departure import NOT_CHARGED
from sklocus.serve._guard import current_connection
from sklocus.serve._metrics import UNMATCHED

UNAUTHORISED = (
    "this route changes the pool, what it learns, or spends the upstreams' keys; "
    "it needs the header 'Authorization: Bearer "
    "TOKEN' with the server's token"
)


def token_matches(authorization, expected):
    """Whether an ``Authorization`` header value carries the bearer token.

    Parameters
    ----------
    authorization : bytes or None
        The header's value as sent.
    expected : bytes
        The token.

    Returns
    -------
    bool
    """
    scheme, _, given = (authorization or b"").strip().partition(b" ")
    if scheme.lower() != b"bearer":
        given = b""
    return hmac.compare_digest(given.strip(), expected)


# OpenAI's API (and so the chat proxy) lives under this prefix: its errors
# come in OpenAI's shape, which its clients read.
OPENAI_PREFIX = "/v1/"


def openai_error(status, message, *, kind=None, param=None, code=None, headers=None):
    """Return a 4xx or 5xx answer in OpenAI's shape, ``{"error": {...}}``.

    Parameters
    ----------
    status : int
    message : str
    kind : str, default=None
        The error's ``type``: ``"invalid_request_error"`` for a 4xx and
        ``"server_error"`` for a 5xx by default.
    param : str, default=None
        The request field at fault.
    code : str, default=None
    headers : dict, default=None
    """
    if kind is None:
        kind = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse(
        status_code=status,
        content={
            "error": {"message": message, "type": kind, "param": param, "code": code}
        },
        headers=headers,
    )


def refusal(status, loc, message, *, close=False, path=""):
    """Return a 4xx or 5xx answer in the shape of FastAPI's validation errors.

    Under OpenAI's prefix (``path``), in OpenAI's shape, the field as ``param``.
    """
    headers = {"connection": "close"} if close else None
    if status == 401:
        headers = {**(headers or {}), "www-authenticate": "Bearer"}
    if path.startswith(OPENAI_PREFIX):
        param = ".".join(str(part) for part in loc[1:]) or None
        return openai_error(status, message, param=param, headers=headers)
    return JSONResponse(
        status_code=status,
        content={"detail": [{"loc": list(loc), "msg": message, "type": "value_error"}]},
        headers=headers,
    )


class RequestGate:
    """Token and body limits checked from the head, and the connection told.

    Parameters
    ----------
    app : ASGI application
    limits : ServerLimits
    guarded : callable
        ``guarded(scope)`` says whether the request is for one of the token's
        routes.
    token : str or None
        The server's token; None: no route needs one.
    requests : RequestCounts, default=None
        Counts each request answered, by route and status (``GET /metrics``).
    """

    def __init__(self, app, *, limits, guarded, token=None, requests=None):
        self.app = app
        self.limits = limits
        self.guarded = guarded
        self.token = None if token is None else token.encode("utf-8")
        self.requests = requests

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.requests is None:
            return await self._gate(scope, receive, send)
        status = "none"  # no answer began: the client left first

        async def noted(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self._gate(scope, receive, noted)
        finally:
            route = getattr(scope.get("route"), "path", UNMATCHED)
            self.requests.count(route, status)

    async def _gate(self, scope, receive, send):
        connection = current_connection.get()
        headers = dict(scope["headers"])
        declared = headers.get(b"content-length")
        has_body = b"transfer-encoding" in headers or declared not in (None, b"0")
        if connection is not None:
            connection.request_started(has_body)
            send = _told_when_sent(connection, send, scope)
        guarded = self.guarded(scope)
        if guarded and self.token is not None:
            if not token_matches(headers.get(b"authorization"), self.token):
                answer = refusal(
                    401,
                    ["header", "Authorization"],
                    UNAUTHORISED,
                    close=has_body,
                    path=scope["path"],
                )
                return await answer(scope, receive, send)
        limit = (
            self.limits.max_body_bytes if guarded else self.limits.max_open_body_bytes
        )
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return await _too_large(limit, scope)(scope, receive, send)
        seen, refused = 0, False

        async def counted():
            # A body of no declared length is counted as it arrives: past the
            # limit, answer 413 at once and tell the application the client has
            # gone, so it stops reading (an exception here would become 400).
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                seen += len(message.get("body", b""))
                if seen > limit:
                    refused = True
                    await _too_large(limit, scope)(scope, receive, send)
                    return {"type": "http.disconnect"}
                if connection is not None and not message.get("more_body"):
                    connection.body_received()
            return message

        async def unless_refused(message):
            if not refused:
                await send(message)

        return await self.app(scope, counted, unless_refused)


def _too_large(limit, scope):
    return refusal(
        413,
        ["body"],
        f"the request body is over {limit:,} bytes",
        close=True,
        path=scope["path"],
    )


def _told_when_sent(connection, send, scope):
    """Wrap ``send`` to tell ``connection`` when the answer starts and ends.

    An answer is charged to the client's rate as a refusal when it is a 4xx
    of the client's making: not one that passes on an upstream's (a 429 from
    a busy upstream), which the application marks (``not_charged``), nor a
    5xx, the server's or an upstream's fault.
    """
    status = 500

    async def told(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        # The client's deadline runs while a part is being sent (while a
        # client that does not read holds ``send`` back), not while the
        # application makes the next part.
        connection.answer_sending()
        await send(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            charged = 400 <= status < 500 and not scope.get(NOT_CHARGED)
            connection.answer_sent(charged)
        else:
            connection.answer_waiting()

    return told
