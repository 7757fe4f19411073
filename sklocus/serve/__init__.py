"""A router served over HTTP: ``sklocus serve MODEL``, or these pieces in Python.

:class:`RouterService` answers routing, prediction and changes to the pool
without HTTP; :func:`create_app` puts FastAPI in front of it, and :func:`run`
serves that with uvicorn. Those two need the ``serve`` extra
(``pip install "sklocus[serve]"``: FastAPI, fastapi-offline and uvicorn);
:class:`RouterService` needs none of it.

Endpoints: ``POST /route``, ``POST /predict``, ``GET /models``,
``POST /models`` (onboard), ``DELETE /models/{name}``, ``POST /feedback``,
``GET /health``, and the OpenAPI page at ``/docs``. With :class:`Upstreams`
(each model's OpenAI-compatible API), also OpenAI's ``POST
/v1/chat/completions``, routed and forwarded, and ``GET /v1/models``. With a
token, the routes that change the pool or what it learns, and chat
completions, need ``Authorization: Bearer TOKEN``. :class:`ServerLimits` holds
what each client may take: body sizes, connections, deadlines and a rate.
"""

from __future__ import annotations

import contextlib
import gc
import signal
import socket
import threading

from sklocus.serve._limits import ServerLimits
from sklocus.serve._service import RequestError, RouterService
from sklocus.serve._upstreams import Upstream, Upstreams

__all__ = [
    "RequestError",
    "RouterService",
    "ServerLimits",
    "Upstream",
    "Upstreams",
    "create_app",
    "listen",
    "run",
    "server",
]


def _app_module():
    """Import the HTTP layer, which needs the serve extra (RouterService does not)."""
    try:
        from sklocus.serve import _app
    except ImportError as error:  # FastAPI, fastapi-offline or pydantic
        raise ImportError(
            f"sklocus.serve needs the serve extra ({error.name} is missing): "
            "pip install 'sklocus[serve]'"
        ) from error
    return _app


def __getattr__(name):
    if name == "create_app":
        return _app_module().create_app
    raise AttributeError(f"module 'sklocus.serve' has no attribute {name!r}")


def listen(host="127.0.0.1", port=8000):
    """Open the listening socket a server will serve on.

    Parameters
    ----------
    host : str, default="127.0.0.1"
    port : int, default=8000

    Returns
    -------
    socket.socket
        Bound and listening.

    Raises
    ------
    OSError
        When the address cannot be had, with a message that names it (a port
        already in use, say).
    """
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM
        )[0]
        listener = socket.socket(family, kind, protocol)
    except OSError as error:
        raise OSError(f"cannot listen on {host}:{port}: {error}") from None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(_BACKLOG)
    except OSError as error:
        listener.close()
        reason = error.strerror or str(error)
        raise OSError(f"cannot listen on {host}:{port}: {reason.lower()}") from None
    return listener


# The most connections accepted in one turn of the event loop: a flood of new
# connections holds up other work for one batch.
_ACCEPTED_AT_ONCE = 64
# The kernel's queue of connections not yet accepted. A full queue drops a
# newcomer's first packet, which it sends again a second later: with 64,
# clients opening a connection per request waited 1.1 s (p99) while a flood
# opened and closed connections.
_BACKLOG = 1024
# Collections of the middle generation between two full ones (Python's
# default is 10).
_FULL_COLLECTION_EVERY = 1000


def server(service, *, token=None, limits=None, log_level="info", upstreams=None):
    """Build the uvicorn server of :func:`run`, without running it.

    For tests and embedding: ``server.run(sockets=[listener])`` serves (from any
    thread) until ``server.should_exit`` is set.

    Parameters
    ----------
    service : RouterService
    token : str, default=None
    limits : ServerLimits, default=None
    log_level : str, default="info"
    upstreams : Upstreams, default=None
        As :func:`create_app` takes them.

    Returns
    -------
    uvicorn.Server
    """
    import uvicorn

    from sklocus.serve._guard import ConnectionGuard

    limits = ServerLimits() if limits is None else limits
    app = _app_module().create_app(
        service, token=token, limits=limits, upstreams=upstreams
    )
    # One worker process: the service's lock and snapshot live in it, so every
    # change is seen by every later request. Forwarded-for headers are not
    # trusted: limits per client go by the address connections come from.
    config = uvicorn.Config(
        app,
        log_level=log_level,
        workers=1,
        proxy_headers=False,
        server_header=False,
        backlog=_ACCEPTED_AT_ONCE,
        # The guard closes a connection idle past header_timeout; uvicorn's own
        # keep-alive timer (5 s by default) would close one whose next request
        # the guard holds back while its client is over its rate or budget.
        timeout_keep_alive=limits.header_timeout + 1,
    )
    config.load()
    config.http_protocol_class = ConnectionGuard(limits).protocol(
        config.http_protocol_class
    )
    return _with_long_queue(config)


def _with_long_queue(config):
    """Return uvicorn's server for ``config``, its listeners' queue made long.

    asyncio accepts as many connections in one turn of the event loop as the
    queue it asks the kernel for (``config.backlog``); once serving, the
    queue is made longer, so that a burst of newcomers waits in it rather than
    being dropped, while each turn still accepts a batch.
    """
    import uvicorn

    class Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            for listener in sockets or ():
                listener.listen(_BACKLOG)

    return Server(config)


def run(
    service,
    *,
    host="127.0.0.1",
    port=8000,
    limits=None,
    log_level="info",
    token=None,
    listener=None,
    warning_interval=60.0,
    upstreams=None,
):
    """Serve a router service over HTTP until interrupted.

    Parameters
    ----------
    service : RouterService
    host : str, default="127.0.0.1"
        Address to listen on; ``"0.0.0.0"`` listens on every interface.
    port : int, default=8000
    limits : ServerLimits, default=None
        Body sizes, connections, deadlines and rates the server grants
        (``ServerLimits()`` by default).
    log_level : str, default="info"
        uvicorn's log level.
    token : str, default=None
        Required as ``Authorization: Bearer TOKEN`` by the routes that change
        the pool (see :func:`create_app`).
    listener : socket.socket, default=None
        A socket from :func:`listen` to serve on, in place of ``host`` and
        ``port``.
    warning_interval : float, default=60
        A warning from one place in the code, and a log line of one kind (a
        refused request from one address, a connection closed, a request
        uvicorn could not parse), is written at most once in this many seconds,
        with a count of those held back: a client cannot flood the log.
    upstreams : Upstreams, default=None
        Each model's OpenAI-compatible API, for ``POST /v1/chat/completions``
        (see :func:`create_app`).
    """
    from sklocus.serve._warnings import limited_logs, limited_warnings

    limits = ServerLimits() if limits is None else limits
    _allow_connections(limits.max_connections)
    if listener is None:
        listener = listen(host, port)
    served = server(
        service, token=token, limits=limits, log_level=log_level, upstreams=upstreams
    )
    with (
        limited_warnings(warning_interval),
        limited_logs(warning_interval),
        _collecting_rarely(),
        listener,
    ):
        with _terminated_as_interrupt():
            try:
                served.run(sockets=[listener])
            except KeyboardInterrupt:  # uvicorn re-raises the signal it handled
                pass


@contextlib.contextmanager
def _terminated_as_interrupt():
    """Let SIGTERM end the server the way Ctrl-C does: cleanly, status 0.

    uvicorn shuts down gracefully on SIGTERM, then raises the signal again with
    the handler it found; with Python's default one, the process died there
    (status 143) before anything after the server ran: a feedback journal was
    left unclosed, its ``-wal`` and ``-shm`` files behind. That handler now
    raises KeyboardInterrupt, which :func:`run` takes as the end.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers, and only it gets signals
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _collecting_rarely():
    """Keep Python's garbage collector from pausing the server for long.

    A flood of connections leaves cycles of objects behind, and each full
    collection walks every object in the process (the router, torch, the
    sentence encoder): tens of milliseconds in which nothing is served. What
    exists at start is frozen out of collections, and full ones are made
    rarer (``benchmarks/serve_hostile.py`` measures the effect).
    """
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(thresholds[0], thresholds[1], _FULL_COLLECTION_EVERY)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()


# Files the process needs besides its connections: the listener, the journal,
# the model, libraries, a few sockets accepted before they are refused.
_FILES_BESIDE_CONNECTIONS = 256


def _allow_connections(max_connections):
    """Raise the open-file limit to fit ``max_connections``, or refuse to start.

    Parameters
    ----------
    max_connections : int
    """
    try:
        import resource
    except ImportError:  # not on POSIX: the system decides
        return
    needed = max_connections + _FILES_BESIDE_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
        soft = raised
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise ValueError(
            f"max_connections={max_connections:,} needs {needed:,} open files, but "
            f"this process may open {soft:,} (ulimit -n); lower max_connections or "
            "raise the limit"
        )
