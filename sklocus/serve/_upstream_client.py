"""The chat proxy's HTTP/1.1 client: keep-alive connections to upstreams, on h11.

The proxy's hop to an upstream is on the path of every chat request. httpx took
about 2 ms a request to a local upstream, where a plain socket takes 0.5 ms
(its client layers, cookies and redirects, and anyio's streams around
asyncio's); this client does only what the proxy needs, on asyncio's streams
and h11 (which uvicorn depends on): post a body, read the status and headers,
then the body whole or part by part. A timeout bounds connecting and each read
(a silence), and every failure is an :class:`UpstreamError` that names its kind
and never the URL.

Connections are kept per upstream (scheme, host and port) and reused while the
upstream keeps them open; a request that finds its reused connection closed
under it (the upstream's keep-alive ran out) is sent once more on a new one.
HTTPS verifies the upstream's certificate against certifi's authorities when
certifi is installed (as httpx does), else the system's, or the file that
``SSL_CERT_FILE`` names. Proxies from the environment (``HTTPS_PROXY``) are not
used.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import urllib.parse

import h11

from sklocus._versioning import __version__

_READ_BYTES = 2**16
# Idle connections kept per upstream; more are closed when released.
_MAX_IDLE = 64


class UpstreamError(Exception):
    """An upstream gave no (complete) answer.

    Parameters
    ----------
    reason : str
        What happened, without the URL: ``"timed out"``, or the error's type.
    timed_out : bool
        Whether the upstream was silent for longer than the timeout.
    """

    def __init__(self, reason, *, timed_out=False):
        super().__init__(reason)
        self.reason = reason
        self.timed_out = timed_out


class _Connection:
    def __init__(self, reader, writer):
        self.reader = reader
        self.writer = writer
        self.protocol = h11.Connection(h11.CLIENT)

    def idle_and_open(self):
        return self.protocol.our_state is h11.IDLE and not self.reader.at_eof()

    def close(self):
        self.writer.transport.abort()


class UpstreamResponse:
    """An upstream's answer: its status and headers, its body still to read.

    Read the body with :meth:`read` or :meth:`parts`, or drop it with
    :meth:`close`; either way the connection goes back to the pool when the
    body was read to its end, and is closed otherwise.
    """

    def __init__(self, client, key, connection, head):
        self._client = client
        self._key = key
        self._connection = connection
        self.status = head.status_code
        headers = {}
        for name, value in head.headers:
            name = name.decode("latin-1")
            value = value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self.headers = headers

    async def parts(self):
        """Yield the body's bytes as they arrive.

        Raises
        ------
        UpstreamError
            When the upstream goes silent or closes before the body's end.
        """
        connection = self._connection
        if connection is None:
            return
        try:
            while True:
                event = await self._client._next_event(connection)
                if isinstance(event, h11.Data):
                    yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:  # the connection closed mid-body
                    raise UpstreamError("RemoteProtocolError")
        except BaseException:
            await self.close()
            raise
        self._connection = None
        self._client._release(self._key, connection)

    async def read(self):
        """Return the whole body (see :meth:`parts`)."""
        return b"".join([part async for part in self.parts()])

    async def close(self):
        """Drop what is left of the body, closing the connection if any is."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class UpstreamClient:
    """Post requests to upstreams over kept-alive HTTP/1.1 connections.

    Parameters
    ----------
    timeout : float
        Seconds to wait for a connection, for a request to be written, and
        then for each read of the answer.
    """

    def __init__(self, timeout):
        self.timeout = timeout
        self._idle = {}  # (scheme, host, port) -> [_Connection]
        self._tls = None

    async def post(self, url, body, headers):
        """Post ``body`` to ``url``; return the answer once its head is in.

        Parameters
        ----------
        url : str
            An http:// or https:// URL.
        body : bytes
        headers : dict of str to str
            Besides ``host``, ``content-length`` and ``user-agent``.

        Returns
        -------
        UpstreamResponse

        Raises
        ------
        UpstreamError
        """
        parts = urllib.parse.urlsplit(url)
        https = parts.scheme == "https"
        port = parts.port or (443 if https else 80)
        key = (parts.scheme, parts.hostname, port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        request = h11.Request(
            method="POST",
            target=target,
            headers=[
                ("host", parts.netloc),
                ("user-agent", f"sklocus/{__version__}"),
                ("content-length", str(len(body))),
                *headers.items(),
            ],
        )
        while True:
            connection, reused = await self._checkout(key)
            try:
                data = connection.protocol.send(request)
                data += connection.protocol.send(h11.Data(data=body))
                data += connection.protocol.send(h11.EndOfMessage())
                connection.writer.write(data)
                await self._in_time(connection.writer.drain())
                head = await self._next_event(connection)
                while isinstance(head, h11.InformationalResponse):
                    head = await self._next_event(connection)
                if not isinstance(head, h11.Response):
                    raise UpstreamError("RemoteProtocolError")
            except BaseException as error:
                connection.close()
                if reused and isinstance(error, UpstreamError) and not error.timed_out:
                    continue  # a kept connection the upstream had closed
                raise
            return UpstreamResponse(self, key, connection, head)

    async def aclose(self):
        """Close every idle connection."""
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    async def _checkout(self, key):
        """Return an open idle connection to ``key``, or a new one, and which."""
        idle = self._idle.get(key, [])
        while idle:
            connection = idle.pop()
            if connection.idle_and_open():
                return connection, True
            connection.close()
        scheme, host, port = key
        tls = self._tls_context() if scheme == "https" else None
        opening = asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls else None
        )
        reader, writer = await self._in_time(opening)
        return _Connection(reader, writer), False

    def _release(self, key, connection):
        protocol = connection.protocol
        if protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
            protocol.start_next_cycle()
            idle = self._idle.setdefault(key, [])
            if len(idle) < _MAX_IDLE:
                idle.append(connection)
                return
        connection.close()

    async def _next_event(self, connection):
        protocol = connection.protocol
        while True:
            try:
                event = protocol.next_event()
            except h11.RemoteProtocolError:
                raise UpstreamError("RemoteProtocolError") from None
            if event is not h11.NEED_DATA:
                return event
            data = await self._in_time(connection.reader.read(_READ_BYTES))
            protocol.receive_data(data)  # b"": the upstream closed

    async def _in_time(self, awaitable):
        """Await within the timeout; an error or a silence is an UpstreamError."""
        try:
            return await asyncio.wait_for(awaitable, self.timeout)
        except asyncio.TimeoutError:
            raise UpstreamError("timed out", timed_out=True) from None
        except (OSError, EOFError, ssl.SSLError) as error:
            raise UpstreamError(type(error).__name__) from None

    def _tls_context(self):
        if self._tls is None:
            cafile = None
            if "SSL_CERT_FILE" not in os.environ:
                try:
                    import certifi

                    cafile = certifi.where()
                except ImportError:
                    pass
            self._tls = ssl.create_default_context(cafile=cafile)
        return self._tls
