"""An OpenAI-compatible chat endpoint that routes each request, then forwards it.

``POST /v1/chat/completions`` takes OpenAI's chat request. With ``"model":
"auto"`` the router ranks the models that have an upstream
(:class:`~sklocus.serve.Upstreams`) for the text of the last user message; the
request goes to the best one's API, with ``model`` set to its name there, and
its answer comes back as it was sent: a JSON body, or server-sent events
relayed chunk by chunk for ``"stream": true``. A served model's own name pins
the request to it.

When the chosen upstream fails before its answer starts (it cannot be reached,
times out, or answers 401, 403, 404, 408, 429 or 5xx), the request goes to the
next-ranked model, up to ``Upstreams.fallbacks`` of them; any other status
(400, say: the request itself is at fault) comes back at once. The answer names
the model that gave it and its P(correct) in the headers ``x-sklocus-model``,
``x-sklocus-p-correct`` and ``x-sklocus-fallbacks`` (failures before it).
Errors come in OpenAI's shape, ``{"error": {"message", "type", "param",
"code"}}``, naming each model tried and what it did. A stream that stops
mid-answer ends with an ``error`` event, which OpenAI's clients raise.

An upstream's key is sent to it alone: errors, logs and headers never carry
it, and an upstream's refusal of its key is reported without the upstream's
words, which may quote part of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
import weakref

import anyio
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from sklocus.serve import _json
from sklocus.serve._chat import ROUTED, ChatRequestError, check_chat_request
from sklocus.serve._departure import not_charged, while_connected
from sklocus.serve._gate import openai_error
from sklocus.serve._guard import charge_work, client_of
from sklocus.serve._service import RequestError, router_thread
from sklocus.serve._upstream_client import UpstreamClient, UpstreamError

# Limited to a line of a kind a while by sklocus.serve.run (limited_logs).
logger = logging.getLogger("sklocus.serve.proxy")

# Statuses after which another model may well answer: the upstream is down,
# busy, or refuses this server (its key, its model name).
_FALL_BACK_ON = frozenset({401, 403, 404, 408, 429})
# What the client is answered when that was the last failure: a refused key or
# an unknown model name upstream is this server's fault (a bad gateway), not
# the client's; 429 and 5xx are passed on as they came.
_ANSWERED_AS = {401: 502, 403: 502, 404: 502, 408: 504}
_ERROR_CHARS = 300
# What of an upstream's error body is read: enough for OpenAI's error object;
# the rest is never read (an upstream may send an endless one).
_ERROR_BYTES = 4096
# Longest content-type passed on from an upstream.
_MEDIA_TYPE_CHARS = 200
# Printable ASCII but the percent sign, which starts an escape.
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


class _BadRequest(ValueError):
    def __init__(self, param, message):
        super().__init__(message)
        self.param = param
        self.message = message


class _Failure:
    """An upstream that failed where another model might answer."""

    def __init__(self, model, status, reason, retry_after=None):
        self.model = model
        self.status = status
        self.reason = reason
        self.retry_after = retry_after

    def __str__(self):
        return f"{self.model!r} {self.reason}"


class ChatProxy:
    """Route OpenAI chat requests with a service's router, and forward them.

    Parameters
    ----------
    service : RouterService
        What ranks the models.
    upstreams : Upstreams
        Where each model answers, how many fallbacks a request may try and how
        long an upstream may take.
    """

    def __init__(self, service, upstreams):
        self.service = service
        self.upstreams = upstreams
        # One client (and its pool of connections) per event loop: a
        # connection belongs to the loop that opened it.
        self._clients = weakref.WeakKeyDictionary()

    def _client(self):
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = UpstreamClient(self.upstreams.timeout, self.upstreams.deadline)
            self._clients[loop] = client
        return client

    async def aclose(self):
        """Close the connections to upstreams this event loop holds."""
        try:
            client = self._clients.pop(asyncio.get_running_loop(), None)
        except RuntimeError:
            return
        if client is not None:
            await client.aclose()

    def routable(self, served=None):
        """Return the served models that have an upstream, in the router's order.

        ``served`` is the pool's model names, read once by the caller; the
        service's current pool by default.
        """
        if served is None:
            served = self.service.router.classes_.tolist()
        return [name for name in served if name in self.upstreams]

    def models(self):
        """OpenAI's model list: ``auto``, then each model with an upstream."""
        names = [ROUTED, *self.routable()]
        return {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "sklocus"}
                for name in names
            ],
        }

    async def complete(self, request):
        """Answer ``POST /v1/chat/completions``: route, forward, relay.

        Nothing more is done for a client that leaves before its answer
        starts: its routing, if still queued, is not computed, and its
        upstream call is cancelled (its connection closed).

        Parameters
        ----------
        request : starlette.requests.Request

        Returns
        -------
        starlette.responses.Response
        """
        sent = await request.body()
        return await while_connected(request, self._answer(sent, request.scope))

    async def _answer(self, sent, scope):
        large = len(sent) > _json.PARSE_IN_THREAD_BYTES
        try:
            if large:
                body = await anyio.to_thread.run_sync(_parsed, sent)
            else:
                body = _parsed(sent)
        except _BadRequest as fault:
            return openai_error(400, fault.message, param=fault.param)
        try:
            try:
                ranked = await self._ranked(body["model"], body["text"], scope)
            except RequestError as error:
                if error.field[:1] not in (("exclude",), ("k",)):
                    raise
                # A model retired between reading the pool and ranking: the
                # next ranking reads the pool anew.
                ranked = await self._ranked(body["model"], body["text"], scope)
        except _BadRequest as fault:
            status = 404 if fault.param == "model" else 400
            return openai_error(status, fault.message, param=fault.param)
        except RequestError as error:
            param = "messages" if error.field[:1] == ("queries",) else None
            return openai_error(error.status, error.message, param=param)
        request_body = body["request"]
        failures = []
        for position, (model, p) in enumerate(ranked):
            told = {
                "x-sklocus-model": _header_text(model),
                "x-sklocus-p-correct": f"{p:.6f}",
                "x-sklocus-fallbacks": str(position),
            }
            answer = await self._forward(
                model, request_body, body["stream"], told, large
            )
            if not isinstance(answer, _Failure):
                if answer.status_code >= 400:  # the upstream's, passed on
                    not_charged(scope)
                return answer
            failures.append(answer)
            left = ranked[position + 1 :]
            logger.warning(
                "the upstream of %r failed (%s); %s",
                model,
                answer.reason,
                f"trying {left[0][0]!r}" if left else "no fallback left",
            )
        tried = "; ".join(str(failure) for failure in failures)
        last = failures[-1]
        # Upstreams failing are not the client's doing: not charged to its rate.
        not_charged(scope)
        return openai_error(
            last.status,
            f"no upstream answered: {tried}",
            kind="upstream_error",
            headers=None
            if last.retry_after is None
            else {"retry-after": last.retry_after},
        )

    async def _ranked(self, model, text, scope):
        """Return ``[(model, p), ...]``: the models to try, best first.

        Computed as the work of the request's client (``scope``).
        """
        served = self.service.router.classes_.tolist()  # one snapshot
        routable = self.routable(served)
        if model != ROUTED and model not in routable:
            shown = ", ".join(repr(name) for name in routable[:5])
            more = f" and {len(routable) - 5} more" if len(routable) > 5 else ""
            raise _BadRequest(
                "model",
                f"model {_json.shorten(model)} is not served here; give "
                f"{ROUTED!r} to route, or a model with an upstream: {shown}{more} "
                "(GET /v1/models)",
            )
        if not routable:
            raise RequestError(
                (),
                "no model the router serves has an upstream; the pool and the "
                "upstreams file name different models",
                status=503,
            )
        charge_work([text])
        client = client_of(scope)
        if model != ROUTED:
            turns = self.service.predict_in_turns([text], [model])
            scored = await router_thread.wait_turns(turns, client=client)
            return [(model, scored["p"][0][0])]
        exclude = [name for name in served if name not in self.upstreams]
        k = min(1 + self.upstreams.fallbacks, len(routable))
        turns = self.service.route_in_turns([text], exclude=exclude or None, k=k)
        routes = await router_thread.wait_turns(turns, client=client)
        return [(choice["model"], choice["p"]) for choice in routes[0]["top"]]

    async def _forward(self, model, request_body, stream, told, large):
        """Send the request to ``model``'s upstream: its answer, or a _Failure.

        ``told`` are the headers that say which model answers; ``large``
        says the request is large enough to encode off the event loop.
        """
        upstream = self.upstreams[model]
        forwarded = {**request_body, "model": upstream.model}
        if large:
            content = await anyio.to_thread.run_sync(_encoded, forwarded)
        else:
            content = _encoded(forwarded)
        try:
            response = await self._client().post(
                upstream.completions_url, content, upstream.headers()
            )
        except UpstreamError as error:
            return _Failure(model, *self._unreachable(error))
        status = response.status
        media_type = _relayed_media_type(response, upstream)
        limit = self.upstreams.max_answer_bytes
        if stream and status < 400:
            # Closed by the relay when it ends, and by the background task
            # when the client goes first.
            return StreamingResponse(
                _relayed(response, model, upstream, limit),
                status,
                headers=told,
                media_type=media_type,
                background=BackgroundTask(response.close),
            )
        try:
            if status >= 400:
                return await self._refused(model, upstream, response, told)
            answer = await response.read(limit)
        except UpstreamError as error:
            if error.too_large:
                # Not fallen back from: the upstream did answer (and may have
                # billed it); another model would bill again.
                return openai_error(
                    502,
                    f"the upstream of {model!r} answered more than {limit:,} bytes "
                    "(the upstreams' max_answer_bytes); its answer was dropped",
                    kind="upstream_error",
                    headers=told,
                )
            return _Failure(model, *self._unreachable(error))
        finally:
            await response.close()
        if len(answer) > _json.PARSE_IN_THREAD_BYTES:
            answer = await anyio.to_thread.run_sync(upstream.scrubbed_bytes, answer)
        else:
            answer = upstream.scrubbed_bytes(answer)
        return Response(answer, status, headers=told, media_type=media_type)

    async def _refused(self, model, upstream, response, told):
        """Return a _Failure to fall back from, or the answer to an upstream error."""
        status = response.status
        error = await _upstream_error(response, upstream)
        detail = error["message"]
        if status in (401, 403):
            # The upstream's words may quote part of the key.
            variable = upstream.api_key_env
            detail = (
                f"refused the key in {variable} (api_key_env)"
                if variable is not None
                else "refused a request without a key (the upstream has no api_key_env)"
            )
        if status >= 500 or status in _FALL_BACK_ON:
            return _Failure(
                model,
                _ANSWERED_AS.get(status, status),
                f"answered {status}: {detail}",
                _retry_after(response, upstream),
            )
        # The request's own fault: what OpenAI's clients act on (its code,
        # the field) is kept.
        return openai_error(
            status,
            f"the upstream of {model!r} answered {status}: {detail}",
            kind=error["type"] or "upstream_error",
            param=error["param"],
            code=error["code"],
            headers=told,
        )

    def _unreachable(self, error):
        """Return the status and reason of a request that got no answer."""
        if error.timed_out:
            return 504, f"timed out after {self.upstreams.timeout:g} s"
        return 502, f"could not be reached or broke off ({error.reason})"


def _parsed(sent):
    """Check a chat request; return it, its text, whether it streams, its model."""
    try:
        request = _json.loads(sent)
    except json.JSONDecodeError as error:
        raise _BadRequest(None, f"the body is not valid JSON: {error.msg}") from None
    if not isinstance(request, dict):
        raise _BadRequest(None, "the body must be a JSON object, a chat request")
    try:
        text, stream = check_chat_request(request)
    except ChatRequestError as fault:
        raise _BadRequest(fault.param, fault.message) from None
    return {
        "request": request,
        "text": text,
        "stream": stream,
        "model": request["model"],
    }


async def _upstream_error(response, upstream):
    """Return an upstream's error message, short and without its key.

    With its ``type``, ``param`` and ``code``, where it gave them as short text.
    """
    found = {"message": None, "type": None, "param": None, "code": None}
    try:
        raw = await response.first_bytes(_ERROR_BYTES)
    except UpstreamError as error:
        found["message"] = f"its body was cut off ({error.reason})"
        return found
    text = raw.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error", parsed)
        if isinstance(error, dict):
            for field in ("type", "param", "code"):
                value = error.get(field)
                if isinstance(value, str) and len(value) <= 100:
                    found[field] = upstream.scrubbed(value)
            error = error.get("message")
        if isinstance(error, str):
            text = error
    text = upstream.scrubbed(" ".join(text.split()))
    if len(text) > _ERROR_CHARS:
        text = text[:_ERROR_CHARS] + "..."
    found["message"] = text or "(no message)"
    return found


def _header_text(name):
    """Return a model's name as a header may carry it.

    Percent-encoded UTF-8 where it is not printable ASCII, or is ``%``
    (``urllib.parse.unquote`` reads it back).
    """
    return urllib.parse.quote(name, safe=_HEADER_SAFE)


def _encoded(request_body):
    """Return the request as forwarded: JSON in UTF-8."""
    return json.dumps(request_body, ensure_ascii=False).encode("utf-8")


def _relayed_media_type(response, upstream):
    """Return the upstream's content-type, if short, printable and keyless."""
    media_type = response.headers.get("content-type")
    if (
        media_type is None
        or len(media_type) > _MEDIA_TYPE_CHARS
        or not media_type.isprintable()
        or upstream.scrubbed(media_type) != media_type
    ):
        return None
    return media_type


def _retry_after(response, upstream):
    """Return the upstream's ``retry-after`` if it is seconds or a date, keyless."""
    value = response.headers.get("retry-after")
    if (
        value is None
        or len(value) > 40
        or not value.isascii()
        or not value.replace(" ", "").replace(",", "").replace(":", "").isalnum()
        or upstream.scrubbed(value) != value
    ):
        return None
    return value


async def _relayed(response, model, upstream, limit):
    """Relay a streamed answer's bytes; end with an error event if it breaks.

    Each part is scrubbed of the upstream's key before it goes out, and the
    stream is cut after ``limit`` bytes.
    """
    scrubber = upstream.stream_scrubber()
    between_events = True
    try:
        try:
            async for chunk in response.parts(limit):
                if scrubber is not None:
                    chunk = scrubber.feed(chunk)
                if chunk:
                    between_events = chunk.endswith((b"\n\n", b"\r\n\r\n"))
                    yield chunk
        finally:
            held = b"" if scrubber is None else scrubber.end()
        if held:
            yield held
    except UpstreamError as error:
        reason = error.reason
        logger.warning("the upstream of %r stopped mid-answer (%s)", model, reason)
        event = {
            "error": {
                "message": f"the upstream of {model!r} stopped mid-answer ({reason})",
                "type": "upstream_error",
                "param": None,
                "code": None,
            }
        }
        # An event cut off midway (or the bytes held back to scrub) is ended
        # first, so the error reads as one.
        if held:
            between_events = False
            yield held
        start = "" if between_events else "\n\n"
        yield f"{start}data: {json.dumps(event)}\n\n".encode()
    finally:
        await response.close()
