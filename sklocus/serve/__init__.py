"""A router served over HTTP: ``sklocus serve MODEL``, or these pieces in Python.

:class:`RouterService` answers routing, prediction and changes to the pool
without HTTP; :func:`create_app` puts FastAPI in front of it, and :func:`run`
serves that with uvicorn. Those two need the ``serve`` extra
(``pip install "sklocus[serve]"``: FastAPI, fastapi-offline and uvicorn);
:class:`RouterService` needs none of it.

Endpoints: ``POST /route``, ``POST /predict``, ``GET /models``,
``POST /models`` (onboard), ``DELETE /models/{name}``, ``GET /health``, and the
OpenAPI page at ``/docs``. With a token, the two that change the pool need
``Authorization: Bearer TOKEN``.
"""

from __future__ import annotations

import socket

from sklocus.serve._service import RequestError, RouterService

__all__ = ["RequestError", "RouterService", "create_app", "listen", "run"]


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
        listener.listen(2048)
    except OSError as error:
        listener.close()
        reason = error.strerror or str(error)
        raise OSError(f"cannot listen on {host}:{port}: {reason.lower()}") from None
    return listener


def run(
    service,
    *,
    host="127.0.0.1",
    port=8000,
    max_body_bytes=8 * 2**20,
    log_level="info",
    token=None,
    listener=None,
    warning_interval=60.0,
):
    """Serve a router service over HTTP until interrupted.

    Parameters
    ----------
    service : RouterService
    host : str, default="127.0.0.1"
        Address to listen on; ``"0.0.0.0"`` listens on every interface.
    port : int, default=8000
    max_body_bytes : int, default=8 MiB
        Largest request body.
    log_level : str, default="info"
        uvicorn's log level.
    token : str, default=None
        Required as ``Authorization: Bearer TOKEN`` by the routes that change
        the pool (see :func:`create_app`).
    listener : socket.socket, default=None
        A socket from :func:`listen` to serve on, in place of ``host`` and
        ``port``.
    warning_interval : float, default=60
        A warning from one place in the code is logged at most once in this
        many seconds, with a count of those held back: a client cannot flood
        the log by sending requests that warn.
    """
    import uvicorn

    from sklocus.serve._warnings import limited_warnings

    if listener is None:
        listener = listen(host, port)
    app = _app_module().create_app(service, max_body_bytes=max_body_bytes, token=token)
    # One worker process: the service's lock and snapshot live in it, so every
    # change is seen by every later request.
    config = uvicorn.Config(app, log_level=log_level, workers=1)
    with limited_warnings(warning_interval), listener:
        try:
            uvicorn.Server(config).run(sockets=[listener])
        except KeyboardInterrupt:  # uvicorn re-raises the signal it handled
            pass
