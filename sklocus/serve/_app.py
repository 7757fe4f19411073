"""The HTTP face of :class:`~sklocus.serve.RouterService`: FastAPI routes and limits.

Every fault in a request is answered as FastAPI answers a validation error, a
4xx whose ``detail`` lists ``{"loc": [...], "msg": ...}`` with the field named.
Handlers are plain functions, which FastAPI runs in its thread pool, so
requests are served side by side; the service makes that safe.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Request
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from sklocus._versioning import __version__
from sklocus.serve._service import RequestError

# A query is a question, not a document; longer texts are refused rather than
# encoded (the sentence encoder would truncate them anyway).
MAX_QUERY_CHARS = 20_000
MAX_NAME_CHARS = 512

Query = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS)]
ModelName = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME_CHARS)]


class _Strict(BaseModel):
    # An unknown field is a client's typo ("query" for "queries"): name it.
    model_config = ConfigDict(extra="forbid")


class RouteRequest(_Strict):
    """Queries to route."""

    queries: list[Query] = Field(description="query texts, or ids of known queries")
    exclude: list[ModelName] | None = Field(
        default=None, description="models not to route to"
    )
    cost_weight: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="weight of cost for this request; the router's by default",
    )
    top_k: int | None = Field(
        default=None, ge=1, description="models listed per query (default up to 3)"
    )


class Choice(BaseModel):
    """One model listed for a query."""

    model: str
    p: float = Field(description="probability that the model answers correctly")


class Route(BaseModel):
    """Where one query goes."""

    query: str
    model: str = Field(description="the chosen model: top[0]")
    top: list[Choice]


class RouteResponse(BaseModel):
    """One route per query, in the order of the request."""

    routes: list[Route]


class PredictRequest(_Strict):
    """Queries to score against models."""

    queries: list[Query]
    models: list[ModelName] | None = Field(
        default=None, description="models to score; every model by default"
    )


class PredictResponse(BaseModel):
    """P(correct): one row per query, one column per model."""

    models: list[str]
    queries: list[str]
    p: list[list[float]]


class NewModel(_Strict):
    """A model to onboard from its scored evaluations."""

    name: ModelName
    evaluations: dict[Query, Annotated[float, Field(allow_inf_nan=False)]] = Field(
        description="score of each evaluated query, in [0, 1]"
    )
    cost: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="required when the served router has costs",
    )


class Onboarded(BaseModel):
    """What onboarding did."""

    model: str
    n_evaluations: int
    n_models: int


class Removed(BaseModel):
    """What removal did."""

    model: str
    n_models: int


class ServedModel(BaseModel):
    """A model the service routes to."""

    name: str
    cost: float | None


class ModelList(BaseModel):
    """Every model served."""

    n_models: int
    models: list[ServedModel]


class Health(BaseModel):
    """The service is up, and what it serves."""

    status: str
    n_models: int
    write_back: bool
    sklocus_version: str


def _error(status, loc, message):
    return JSONResponse(
        status_code=status,
        content={"detail": [{"loc": list(loc), "msg": message, "type": "value_error"}]},
    )


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with 413, before reading them whole.

    Parameters
    ----------
    app : ASGI application
    max_bytes : int
    """

    def __init__(self, app, max_bytes):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit():
            if int(declared) > self.max_bytes:
                return await self._refuse(scope, receive, send)
        seen, refused = 0, False

        async def counted():
            # A body of no declared length is counted as it arrives: past the
            # limit, answer 413 at once and tell the application the client has
            # gone, so it stops reading (an exception here would become 400).
            nonlocal seen, refused
            message = await receive()
            if message["type"] == "http.request" and not refused:
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    refused = True
                    await self._refuse(scope, receive, send)
                    return {"type": "http.disconnect"}
            return message

        async def unless_refused(message):
            if not refused:
                await send(message)

        return await self.app(scope, counted, unless_refused)

    async def _refuse(self, scope, receive, send):
        response = _error(
            413, ["body"], f"the request body is over {self.max_bytes:,} bytes"
        )
        await response(scope, receive, send)


def create_app(service, *, max_body_bytes=8 * 2**20):
    """Build the HTTP application around a router service.

    Parameters
    ----------
    service : RouterService
        What the application serves.
    max_body_bytes : int, default=8 MiB
        Largest request body; a larger one is answered 413 unread.

    Returns
    -------
    fastapi.FastAPI
        The application, with its OpenAPI page at ``/docs`` (served from the
        package, not a CDN). Run it with uvicorn, or test it with
        ``fastapi.testclient.TestClient``.

    Examples
    --------
    >>> from sklocus.serve import RouterService, create_app
    >>> app = create_app(RouterService(router))  # doctest: +SKIP
    """
    app = FastAPIOffline(
        title="sklocus router",
        version=__version__,
        description="Route queries to the language model most likely to answer "
        "them, with LOCUS model embeddings; onboard and retire models while "
        "serving.",
    )

    @app.exception_handler(RequestError)
    def request_error(request: Request, error: RequestError):
        where = "path" if request.method == "DELETE" else "body"
        return _error(error.status, [where, *error.field], error.message)

    @app.post("/route", response_model=RouteResponse)
    def route(body: RouteRequest):
        """Route each query to its best model, listing the top ``top_k``."""
        routes = service.route(
            body.queries,
            exclude=body.exclude,
            cost_weight=body.cost_weight,
            top_k=body.top_k,
        )
        return {"routes": routes}

    @app.post("/predict", response_model=PredictResponse)
    def predict(body: PredictRequest):
        """Probability that each model answers each query correctly."""
        return service.predict(body.queries, body.models)

    @app.get("/models", response_model=ModelList)
    def list_models():
        """Every model served, with its cost."""
        models = service.models()
        return {"n_models": len(models), "models": models}

    @app.post("/models", response_model=Onboarded, status_code=201)
    def onboard(body: NewModel):
        """Onboard a model from its evaluations (one forward pass)."""
        return service.add_model(body.name, body.evaluations, body.cost)

    @app.delete("/models/{name:path}", response_model=Removed)
    def remove(name: str):
        """Stop routing to a model."""
        return service.remove_model(name)

    @app.get("/health", response_model=Health)
    def health():
        """Whether the service is up, and how many models it serves."""
        return service.health()

    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    return app
