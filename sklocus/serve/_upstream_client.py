"""The chat proxy's client for upstreams, on aiohttp's connection pool.

An upstream bills per call, so what this client guarantees is about money and
memory rather than speed (aiohttp's client is as fast here as a hand-built one
was: about 0.3-0.5 ms a request to a local upstream):

- **A request is sent once.** A POST is never sent again by the client, on a
  new connection or a kept one: once any byte of it may have reached the
  upstream, a second send could be a second billed completion (aiohttp retries
  only idempotent methods). A kept connection the upstream closed while idle
  is seen as closed before it is reused; one closed in the instant between is
  a failure the proxy may fall back from, to another model.
- **Every read has a cap and two deadlines.** A body is read part by part, and
  no more than the caller's cap; ``timeout`` bounds each silence (connecting,
  and waiting for the next bytes) and ``deadline`` the whole call, head and
  body, so an upstream that trickles or sends ``100 Continue`` forever is cut.
- **Failures name their kind, never the URL** (an :class:`UpstreamError`).

A body sent compressed despite ``accept-encoding: identity`` is decoded (and
its cap counts decoded bytes). HTTPS verifies the upstream's certificate
against certifi's authorities when certifi is installed, else the system's, or
the file that ``SSL_CERT_FILE`` names. Proxies from the environment
(``HTTPS_PROXY``) are not used.
"""

from __future__ import annotations

import asyncio
import os
import ssl

import aiohttp

from sklocus._versioning import __version__

_READ_BYTES = 2**16
# Seconds an idle kept connection waits for its next request before the client
# closes it: below the keep-alive of common servers (uvicorn's 5 s, nginx's
# 75 s), so that a connection is rarely reused just as its upstream closes it.
_KEEP_IDLE_S = 4.0


class UpstreamError(Exception):
    """An upstream gave no (complete, or acceptable) answer.

    Parameters
    ----------
    reason : str
        What happened, without the URL: ``"timed out"``, the error's type, or
        that the body passed its cap.
    timed_out : bool
        Whether a silence or the whole call outran its time.
    too_large : bool
        Whether the body passed the cap it was read with.
    """

    def __init__(self, reason, *, timed_out=False, too_large=False):
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out
        self.too_large = too_large


class UpstreamResponse:
    """An upstream's answer: its status and headers, its body still to read.

    Read the body with :meth:`read` or :meth:`parts`, each with a cap, or its
    start with :meth:`first_bytes`, or drop it with :meth:`close`. A body read
    to its end gives its connection back to the pool; one dropped before
    closes it, so that nothing more is read.
    """

    def __init__(self, response):
        self._response = response
        self.status = response.status
        headers = {}
        for name, value in response.headers.items():
            name = name.lower()
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self.headers = headers

    async def parts(self, max_bytes):
        """Yield the body's bytes as they arrive, at most ``max_bytes`` in all.

        Raises
        ------
        UpstreamError
            When the upstream goes silent, closes before the body's end, the
            call outruns its deadline, or the body passes ``max_bytes`` (its
            first ``max_bytes`` have been yielded).
        """
        response = self._response
        seen = 0
        try:
            while True:
                part = await _failing_as_upstream(response.content.readany())
                if not part:
                    break
                seen += len(part)
                if seen > max_bytes:
                    yield part[: len(part) - (seen - max_bytes)]
                    raise UpstreamError(
                        f"its answer passed {max_bytes:,} bytes", too_large=True
                    )
                yield part
        finally:
            await self.close()

    async def read(self, max_bytes):
        """Return the whole body, at most ``max_bytes`` (see :meth:`parts`)."""
        return b"".join([part async for part in self.parts(max_bytes)])

    async def first_bytes(self, max_bytes):
        """Return the body's first ``max_bytes`` (or all of a shorter one).

        The rest is never read: the connection is closed unless the body ended.
        """
        content = self._response.content
        pieces, seen = [], 0
        try:
            while seen < max_bytes:
                part = await _failing_as_upstream(content.read(max_bytes - seen))
                if not part:
                    break
                pieces.append(part)
                seen += len(part)
        finally:
            await self.close()
        return b"".join(pieces)

    async def close(self):
        """Be done with the answer, its body read or not.

        Its connection goes back to the pool when the body was read to its
        end, and is closed otherwise, the rest unread.
        """
        response = self._response
        if response.content.at_eof():
            response.release()
        else:
            response.close()


class UpstreamClient:
    """Post requests to upstreams over a pool of kept-alive connections.

    Make and use it inside one event loop (its connections belong to it).

    Parameters
    ----------
    timeout : float
        Seconds to wait for a connection, and then for each read.
    deadline : float
        Seconds the whole call may take, from connecting to the body's end.
    """

    def __init__(self, timeout, deadline):
        self.timeout = timeout
        self.deadline = deadline
        self._session = None

    def _open_session(self):
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0,  # the server's own connection limit bounds these
                keepalive_timeout=_KEEP_IDLE_S,
                ssl=_tls_context(),
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=self.deadline,
                    sock_connect=self.timeout,
                    sock_read=self.timeout,
                ),
                headers={"user-agent": f"sklocus/{__version__}"},
                skip_auto_headers=("content-type",),
                trust_env=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=True,
                raise_for_status=False,
            )
        return self._session

    async def post(self, url, body, headers):
        """Post ``body`` to ``url``, once; return the answer once its head is in.

        Parameters
        ----------
        url : str
            An http:// or https:// URL.
        body : bytes
        headers : dict of str to str

        Returns
        -------
        UpstreamResponse

        Raises
        ------
        UpstreamError
        """
        session = self._open_session()
        response = await _failing_as_upstream(
            session.post(url, data=body, headers=headers, allow_redirects=False)
        )
        return UpstreamResponse(response)

    async def aclose(self):
        """Close every connection of the pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _failing_as_upstream(awaitable):
    """Await; a network error or an outrun timeout is an UpstreamError."""
    try:
        return await awaitable
    except asyncio.TimeoutError:  # a silence, or the whole call's deadline
        raise UpstreamError("timed out", timed_out=True) from None
    except aiohttp.ClientConnectorError as error:
        cause = error.os_error
        raise UpstreamError(type(cause).__name__) from None
    except (aiohttp.ClientError, OSError, ValueError) as error:
        raise UpstreamError(type(error).__name__) from None


_tls = None


def _tls_context():
    """Return the TLS context that checks upstreams' certificates (one, shared)."""
    global _tls
    if _tls is None:
        cafile = None
        if "SSL_CERT_FILE" not in os.environ:
            try:
                import certifi

                cafile = certifi.where()
            except ImportError:
                pass
        _tls = ssl.create_default_context(cafile=cafile)
    return _tls
