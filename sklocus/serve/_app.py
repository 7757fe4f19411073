"""The HTTP face of :class:`~sklocus.serve.RouterService`: FastAPI routes and limits.

Every fault in a request is answered as FastAPI answers a validation error, a
4xx whose ``detail`` lists ``{"loc": [...], "msg": ..., "type": ...}`` with the
field named, and without the ``input`` FastAPI would echo: a body is parsed as
strict JSON (:mod:`sklocus.serve._json`) and validated in pydantic's strict
mode (``true`` is not 1).

Routing and prediction are computed on the service's router thread, one request
at a time (see :mod:`sklocus.serve._service` for why), which the event loop
awaits without blocking: health checks, model lists and refusals are answered
meanwhile, and a large body is parsed on a worker thread. Onboarding and removal
are plain functions, which FastAPI runs in its thread pool, so they go on side
by side with routing; the service makes that safe.
"""

from __future__ import annotations

import contextlib
import json
from typing import Annotated

import anyio
from fastapi import Depends, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi_offline import FastAPIOffline
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.routing import Match

from sklocus._validation import has_control_character
from sklocus._versioning import __version__
from sklocus.serve import _json
from sklocus.serve._chat import ChatCompletionRequest
from sklocus.serve._departure import CLIENT_GONE, not_charged, while_connected
from sklocus.serve._gate import UNAUTHORISED, RequestGate, refusal, token_matches
from sklocus.serve._guard import charge_work, client_of
from sklocus.serve._limits import ServerLimits
from sklocus.serve._metrics import RequestCounts, exposition
from sklocus.serve._request import check_item_count
from sklocus.serve._service import RequestError, router_thread

# A query is a question, not a document; longer texts are refused rather than
# encoded (the sentence encoder would truncate them anyway).
MAX_QUERY_CHARS = 20_000
MAX_NAME_CHARS = 512
# A group label names a benchmark or subject, as a model name names a model.
MAX_GROUP_CHARS = MAX_NAME_CHARS


def _printable(name):
    """Refuse a model name that the library would refuse (a newline, blank...)."""
    if not name.strip():
        raise ValueError("a model name may not be blank")
    for position, char in enumerate(name):
        if has_control_character(char):
            raise ValueError(
                f"a model name may not hold control or format characters; found "
                f"U+{ord(char):04X} at position {position}"
            )
    return name


Query = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS)]
ModelName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_NAME_CHARS),
    AfterValidator(_printable),
]
# Compared with the router's labels only, never stored: any text will do.
GroupLabel = Annotated[str, StringConstraints(min_length=1, max_length=MAX_GROUP_CHARS)]
_GROUPS = (
    "each query's group (benchmark, subject...), null for none, in the order of "
    "queries; only for a router fitted with query groups (see GET /health)"
)


class _Strict(BaseModel):
    # An unknown field is a client's typo ("query" for "queries"): name it.
    # Strict: a count is an integer, not true; a score is a number, not "1".
    model_config = ConfigDict(extra="forbid", strict=True)


class RouteRequest(_Strict):
    """Queries to route."""

    queries: list[Query] = Field(description="query texts, or ids of known queries")
    exclude: list[ModelName] | None = Field(
        default=None, description="models not to route to"
    )
    # The policy's bounds are checked by the router's own rule
    # (sklocus._routing.check_policy), the one definition of them.
    cost_weight: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="weight of cost for this request, at least 0; the router's "
        "by default",
    )
    min_probability: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="in [0, 1]: route to the cheapest model whose probability of a "
        "correct answer is at least this, or to the likeliest when none is; not "
        "with cost_weight",
    )
    budget: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="a mean cost per query, at least 0: route with the weight of "
        "cost the router's held-out curve gives for it (a router fitted with a "
        "budget)",
    )
    k: int | None = Field(
        default=None, ge=1, description="models listed per query (default up to 3)"
    )
    query_groups: list[GroupLabel | None] | None = Field(
        default=None, description=_GROUPS
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
    query_groups: list[GroupLabel | None] | None = Field(
        default=None, description=_GROUPS
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
        ge=0,
        allow_inf_nan=False,
        description="required when the served router has costs; at least 0",
    )
    query_groups: dict[Query, GroupLabel | None] | None = Field(
        default=None,
        description="group of each evaluated query (left out or null: none), to "
        "fit the model's offsets for the router's groups; only for a router "
        "fitted with query groups",
    )


class Outcome(_Strict):
    """How a model did on a query it answered."""

    query: Query
    model: ModelName
    score: float = Field(
        ge=0, le=1, allow_inf_nan=False, description="1 right, 0 wrong, or between"
    )
    query_group: GroupLabel | None = Field(
        default=None,
        description="the query's group, for a router fitted with query groups: "
        "a query new to the router takes it, one it knows keeps its own",
    )


class FeedbackRequest(_Strict):
    """Outcomes of served queries."""

    outcomes: list[Outcome]


class FeedbackResponse(BaseModel):
    """The outcomes kept, on disk."""

    accepted: int
    through: int = Field(description="the journal id of the last outcome kept")
    pending_outcomes: int = Field(
        description="outcomes kept but not yet folded into the router"
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
    n_evaluations: int = Field(
        description="distinct queries the model's embedding is computed from"
    )
    n_scores: int = Field(
        description="scores averaged over those queries: each evaluation the "
        "router was given and each outcome learnt since (a query answered twice "
        "counts twice)"
    )
    n_outcomes: int = Field(
        description="outcomes POST /feedback took for the model and the router "
        "has folded in (0 before any feedback, and without a feedback journal)"
    )


class ModelList(BaseModel):
    """Every model served."""

    n_models: int
    models: list[ServedModel]


class Health(BaseModel):
    """The service is up, and what it serves."""

    status: str
    n_models: int
    groups: list[str] | None = Field(
        description="the query groups requests may name; null when the router "
        "was fitted without them"
    )
    write_back: bool
    feedback: bool = Field(
        description="whether POST /feedback takes outcomes (a journal is kept)"
    )
    pending_outcomes: int = Field(
        description="outcomes kept but not yet folded into the router"
    )
    sklocus_version: str
    position: int | None = Field(
        None,
        description="a replica's position in its store's log: the id of the "
        "last entry it has folded (only with a store)",
    )
    lag: int | None = Field(
        None,
        description="entries of the store's log this replica has seen and not "
        "yet folded (only with a store)",
    )
    lease: bool | None = Field(
        None,
        description="whether this replica holds the store's lease: it writes "
        "the fold marks and snapshots (only with a store)",
    )


class _StrictJSONRequest(Request):
    """A request whose body is parsed as strict JSON, a large one off the loop."""

    async def json(self):
        if not hasattr(self, "_json"):
            body = await self.body()
            if len(body) > _json.PARSE_IN_THREAD_BYTES:
                self._json = await anyio.to_thread.run_sync(_json.loads, body)
            else:
                self._json = _json.loads(body)
        return self._json


class _StrictJSONRoute(APIRoute):
    def get_route_handler(self):
        handler = super().get_route_handler()

        async def strict(request):
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict


def _shown_loc(loc):
    """Return a field's location, with a long key (a query) cut short."""
    return [
        part if not isinstance(part, str) or len(part) <= 40 else _json.shorten(part)
        for part in loc
    ]


async def _validation_error(request, error):
    """FastAPI's 422 without ``input`` and ``ctx``, which repeat the request."""
    detail = []
    for fault in error.errors():
        if fault["type"] == "json_invalid":
            reason = (fault.get("ctx") or {}).get("error", "")
            position = fault["loc"][-1]
            at = f" at character {position:,}" if position else ""
            detail.append(
                {
                    "loc": ["body"],
                    "msg": f"the body is not valid JSON: {reason}{at}",
                    "type": "json_invalid",
                }
            )
        else:
            message = fault["msg"]
            detail.append(
                {
                    "loc": _shown_loc(fault["loc"]),
                    "msg": message if len(message) <= 300 else message[:300] + "...",
                    "type": fault["type"],
                }
            )
    return JSONResponse(status_code=422, content={"detail": detail})


_BEARER = HTTPBearer(
    auto_error=False,
    description="the token the server was started with (SKLOCUS_TOKEN)",
)


def _token_check(token):
    """Return a dependency that lets through requests carrying ``token``, if any.

    :class:`~sklocus.serve._gate.RequestGate` checks the token first, before a
    body is read; this check, the same one, also documents the route as needing
    it on the OpenAPI page.
    """
    expected = None if token is None else token.encode("utf-8")

    # A coroutine: FastAPI would run a plain function on its thread pool, a
    # hop of about a millisecond for every request to a guarded route.
    async def authorised(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
    ):
        if expected is None:
            return
        # Header values arrive decoded as Latin-1: back to the bytes sent.
        sent = request.headers.get("authorization", "").encode("latin-1")
        if not token_matches(sent, expected):
            raise HTTPException(
                401,
                detail=[
                    {
                        "loc": ["header", "Authorization"],
                        "msg": UNAUTHORISED,
                        "type": "unauthorized",
                    }
                ],
                headers={"WWW-Authenticate": "Bearer"},
            )

    return authorised


def _validated(model, sent, field, limit):
    """Parse and validate a body as ``model``, counting ``field`` first.

    Run on a worker thread: a body of thousands of items is refused for its
    count before any is validated, and validating the rest never holds up the
    event loop.
    """
    try:
        payload = _json.loads(sent)
    except json.JSONDecodeError as error:
        raise RequestValidationError(
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", error.pos),
                    "msg": "JSON decode error",
                    "ctx": {"error": error.msg},
                }
            ]
        ) from None
    items = payload.get(field) if isinstance(payload, dict) else None
    if isinstance(items, list | dict):
        check_item_count(field, items, limit)
    try:
        return model.model_validate(payload)
    except ValidationError as error:
        raise RequestValidationError(
            [{**fault, "loc": ("body", *fault["loc"])} for fault in error.errors()]
        ) from None


async def _answered_off_the_loop(request, model, counted, answer):
    """Read the body, then validate it as ``model`` and ``answer`` it on a thread.

    ``counted`` is ``(field, limit)``: the field's items are counted before any
    is validated (:func:`_validated`).
    """
    sent = await request.body()

    def answered():
        return answer(_validated(model, sent, *counted))

    return await anyio.to_thread.run_sync(answered)


async def _computed(request, queries, turns):
    """Await ``turns`` on the router thread, as the request's client's work.

    The queries count against the client's work budget; its turns take their
    place among other clients' (:mod:`sklocus.serve._router_thread`); a client
    gone before they are done has them dropped, and a 499 is returned.
    """
    charge_work(queries)
    waiting = router_thread.wait_turns(turns, client=client_of(request.scope))
    return await while_connected(request, waiting)


def _body_of(model):
    """Return the OpenAPI request body of a route that validates ``model`` itself."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": schema}},
        }
    }


def _document_bodies(app, models):
    """Add ``models`` to the OpenAPI schemas that :func:`_body_of` refers to."""
    schema_of = app.openapi

    def openapi():
        if app.openapi_schema is None:
            schemas = schema_of().setdefault("components", {})
            schemas = schemas.setdefault("schemas", {})
            for model in models:
                definition = model.model_json_schema(
                    ref_template="#/components/schemas/{model}"
                )
                schemas.update(definition.pop("$defs", {}))
                schemas[model.__name__] = definition
        return app.openapi_schema

    app.openapi = openapi


# A replica keeps a feedback request sent again with the same key once.
_IDEMPOTENCY_HEADER = "idempotency-key"
_LONGEST_KEY = 200


def _idempotency(request, service):
    """Return ``{"key": ...}`` for a replica's feedback when the client gave one."""
    key = request.headers.get(_IDEMPOTENCY_HEADER)
    if key is None or not hasattr(service, "store"):
        return {}
    if not key or len(key) > _LONGEST_KEY:
        raise RequestError(
            (),
            f"the Idempotency-Key header holds 1 to {_LONGEST_KEY} characters; "
            f"this one holds {len(key)}",
        )
    return {"key": key}


def create_app(service, *, token=None, limits=None, upstreams=None):
    """Build the HTTP application around a router service.

    Parameters
    ----------
    service : RouterService
        What the application serves.
    token : str, default=None
        When given, the routes that change the pool or what it learns
        (``POST /models``, ``DELETE /models/{name}``, ``POST /feedback``, and so
        the write-back) answer 401 unless the request carries
        ``Authorization: Bearer TOKEN``, checked before any of the body is
        read. Reading routes are open.
    limits : ServerLimits, default=None
        Body limits per route (``ServerLimits()`` by default): a larger body
        is answered 413 unread. The limits on connections and rates are kept
        by :func:`~sklocus.serve.run`, which serves the application.
    upstreams : Upstreams, default=None
        Where each model answers: with them, ``POST /v1/chat/completions``
        routes OpenAI chat requests and forwards them to the chosen model's
        API (:mod:`sklocus.serve._proxy`), and ``GET /v1/models`` lists what
        it may be asked for. With a token, chat completions need it too: they
        spend the upstreams' keys.

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
    proxy = None
    if upstreams is not None:
        from sklocus.serve._proxy import ChatProxy
        from sklocus.serve._upstreams import Upstreams

        if not isinstance(upstreams, Upstreams):
            raise TypeError(
                f"upstreams is a {type(upstreams).__name__}; give Upstreams or None"
            )
        proxy = ChatProxy(service, upstreams)

    @contextlib.asynccontextmanager
    async def folding(app):
        # Outcomes are folded in while the application serves.
        service.start_folding()
        try:
            yield
        finally:
            try:
                if proxy is not None:
                    await proxy.aclose()
            finally:
                await anyio.to_thread.run_sync(service.stop_folding)

    app = FastAPIOffline(
        lifespan=folding,
        title="sklocus router",
        version=__version__,
        description="Route queries to the language model most likely to answer "
        "them, with LOCUS model embeddings; onboard and retire models while "
        "serving.",
    )
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise ValueError("token must be a non-empty string, or None for no token")
    if limits is None:
        limits = ServerLimits()
    elif not isinstance(limits, ServerLimits):
        raise TypeError(
            f"limits is a {type(limits).__name__}; give a ServerLimits or None"
        )
    app.router.route_class = _StrictJSONRoute
    authorised = [Depends(_token_check(token))]

    # Handlers are coroutines, answered on the event loop: a plain function
    # would cost each refused request a trip through the thread pool.
    @app.exception_handler(RequestError)
    async def request_error(request: Request, error: RequestError):
        path = request.url.path
        if error.status >= 500:
            return refusal(error.status, [], error.message, path=path)
        where = "path" if request.method == "DELETE" else "body"
        return refusal(
            error.status,
            _shown_loc([where, *error.field]),
            error.message,
            path=path,
        )

    app.exception_handler(RequestValidationError)(_validation_error)

    @app.exception_handler(ClientDisconnect)
    async def client_gone(request: Request, error: ClientDisconnect):
        # The client left while sending its body: nothing to answer, and
        # nothing for the log to explain.
        not_charged(request.scope)
        return Response(status_code=CLIENT_GONE)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, error: Exception):
        # The traceback goes to the server's log (uvicorn logs the exception,
        # raised again after this answer), never to the client.
        return refusal(
            500,
            [],
            "the server failed to answer; its log says why",
            path=request.url.path,
        )

    @app.post("/route", response_model=RouteResponse)
    async def route(body: RouteRequest, request: Request):
        """Route each query to its best model, listing the top ``k``."""
        turns = service.route_in_turns(
            body.queries,
            exclude=body.exclude,
            cost_weight=body.cost_weight,
            min_probability=body.min_probability,
            budget=body.budget,
            k=body.k,
            query_groups=body.query_groups,
        )
        routes = await _computed(request, body.queries, turns)
        return routes if isinstance(routes, Response) else {"routes": routes}

    @app.post("/predict", response_model=PredictResponse)
    async def predict(body: PredictRequest, request: Request):
        """Probability that each model answers each query correctly."""
        turns = service.predict_in_turns(body.queries, body.models, body.query_groups)
        return await _computed(request, body.queries, turns)

    @app.get("/models", response_model=ModelList)
    async def list_models():
        """Every model served, with its cost."""
        models = service.models()
        return {"n_models": len(models), "models": models}

    @app.post(
        "/models",
        response_model=Onboarded,
        status_code=201,
        dependencies=authorised,
        openapi_extra=_body_of(NewModel),
    )
    async def onboard(request: Request):
        """Onboard a model from its evaluations (one forward pass)."""
        return await _answered_off_the_loop(
            request,
            NewModel,
            ("evaluations", service.max_evaluations),
            lambda body: service.add_model(
                body.name, body.evaluations, body.cost, body.query_groups
            ),
        )

    @app.delete("/models/{name:path}", response_model=Removed, dependencies=authorised)
    def remove(name: str):
        """Stop routing to a model."""
        return service.remove_model(name)

    @app.post(
        "/feedback",
        response_model=FeedbackResponse,
        dependencies=authorised,
        openapi_extra=_body_of(FeedbackRequest),
    )
    async def feedback(request: Request):
        """Keep outcomes of served queries; answered once they are on disk."""
        return await _answered_off_the_loop(
            request,
            FeedbackRequest,
            ("outcomes", service.max_feedback),
            lambda body: service.feedback(
                [outcome.model_dump(exclude_none=True) for outcome in body.outcomes],
                **_idempotency(request, service),
            ),
        )

    requests = RequestCounts()

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics():
        """Count requests, folds, pending outcomes, log position (Prometheus text)."""
        return PlainTextResponse(
            exposition(service, requests),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    @app.get("/health", response_model=Health, response_model_exclude_unset=True)
    async def health():
        """Whether the service is up, how many models it serves, and its groups."""
        return service.health()

    documented = [NewModel, FeedbackRequest]
    if proxy is not None:

        @app.post(
            "/v1/chat/completions",
            dependencies=authorised,
            openapi_extra=_body_of(ChatCompletionRequest),
            responses={200: {"description": "the upstream's answer, as it sent it"}},
        )
        async def chat_completions(request: Request):
            """Route an OpenAI chat request and forward it (OpenAI's API)."""
            return await proxy.complete(request)

        @app.get("/v1/models")
        async def chat_models():
            """List what chat completions may name: 'auto', then each routable model."""
            return proxy.models()

        documented.append(ChatCompletionRequest)
    _document_bodies(app, documented)
    check = authorised[0].dependency
    guarded_routes = [
        route
        for route in app.routes
        if isinstance(route, APIRoute)
        and any(depends.dependency is check for depends in route.dependencies)
    ]

    def guarded(scope):
        return any(route.matches(scope)[0] is Match.FULL for route in guarded_routes)

    app.add_middleware(
        RequestGate, limits=limits, guarded=guarded, token=token, requests=requests
    )
    return app
