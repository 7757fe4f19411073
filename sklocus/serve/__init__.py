"""A router served over HTTP: ``sklocus serve MODEL``, or these pieces in Python.

:class:`RouterService` answers routing, prediction and changes to the pool
without HTTP; :func:`create_app` puts FastAPI in front of it, and :func:`run`
serves that with uvicorn. Needs the ``serve`` extra
(``pip install "sklocus[serve]"``): FastAPI, fastapi-offline and uvicorn.

Endpoints: ``POST /route``, ``POST /predict``, ``GET /models``,
``POST /models`` (onboard), ``DELETE /models/{name}``, ``GET /health``, and the
OpenAPI page at ``/docs``.
"""

from __future__ import annotations

try:
    from sklocus.serve._app import create_app
except ImportError as error:  # FastAPI, fastapi-offline or pydantic
    raise ImportError(
        f"sklocus.serve needs the serve extra ({error.name} is missing): "
        "pip install 'sklocus[serve]'"
    ) from error
from sklocus.serve._service import RequestError, RouterService

__all__ = ["RequestError", "RouterService", "create_app", "run"]


def run(
    service, *, host="127.0.0.1", port=8000, max_body_bytes=8 * 2**20, log_level="info"
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
    """
    import uvicorn

    app = create_app(service, max_body_bytes=max_body_bytes)
    # One worker process: the service's lock and snapshot live in it, so every
    # change is seen by every later request.
    uvicorn.run(app, host=host, port=port, log_level=log_level, workers=1)
