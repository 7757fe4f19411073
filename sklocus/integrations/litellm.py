"""A LiteLLM routing plugin that sends each request to the model LOCUS picks.

LiteLLM's ``Router(plugins=[...])`` runs each plugin before it picks a
deployment, on its async calls (``acompletion`` and the like): the plugin reads
the request's messages and the candidate models (each deployment's
``litellm_params.model``) and may narrow them. :class:`LocusRoutingPlugin`
ranks the candidates the router knows for the text of the request's last user
message, by the router's policy (a weight of cost, a threshold or a budget),
and keeps the best ``k`` of them. Candidates the router does not know are kept
too, for LiteLLM's own strategy to weigh: the plugin never removes a model it
cannot judge, and says which it left (``signals["sklocus"]`` and a warning,
once per model).

The router is a fitted :class:`~sklocus.LocusRouter`, a
:class:`~sklocus.serve.RouterService`, the path of a model file, or the URL of
``sklocus serve``. When the router cannot answer (a server that is down, a
policy the router was not fitted for), the candidates are left as they were
and the failure is logged: the gateway goes on routing by its own strategy.

Nothing here imports LiteLLM: a plugin is any object with ``async run(context)``
that reads ``context.structured_messages`` and ``context.candidate_models`` and
writes ``context.candidate_models`` and ``context.signals``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import time
from collections.abc import Mapping

from sklocus._routing import check_policy
from sklocus._validation import check_count
from sklocus.serve._service import RouterService, router_thread
from sklocus.serve._warnings import LogLimit

__all__ = ["LocusRoutingPlugin"]

logger = logging.getLogger(__name__)
# A router that is down would otherwise log a line per request: its failures
# go to a logger of their own, one line of a kind a minute.
_failures = logging.getLogger(__name__ + ".failures")
_failures.addFilter(LogLimit())

# Seconds a served router's list of models is trusted before it is read again.
MODELS_TTL_S = 30.0


class LocusRoutingPlugin:
    """Narrow LiteLLM's candidate models to the ones a LOCUS router ranks best.

    Read more in the :ref:`User Guide <gateway>`.

    Parameters
    ----------
    router : LocusRouter, RouterService, str or path-like
        A fitted router; a :class:`~sklocus.serve.RouterService` (to share one
        with a server or a feedback journal); the path of a model file that
        holds a router (:func:`sklocus.save`); or the URL of ``sklocus serve``
        (``http://`` or ``https://``).
    model_names : mapping of str to str, default=None
        The router's name of each LiteLLM model (a deployment's
        ``litellm_params.model``, such as ``"openai/gpt-4o-mini"``). A model not
        in it keeps its own name; ``None`` maps every model to itself.
    k : int, default=1
        How many of the best candidates to keep; LiteLLM's strategy chooses
        among them (and any candidate the router does not know).
    cost_weight, min_probability, budget : float, default=None
        The routing policy for each request, as in
        :meth:`LocusRouter.predict <sklocus.LocusRouter.predict>`; at most one.
        ``None`` for all three routes by the router's own policy.
    timeout : float, default=10.0
        Seconds to wait for a served router's answer.
    token : str, default=None
        The served router's token, which its ``POST /feedback`` needs
        (:meth:`feedback`); not used in process.

    Attributes
    ----------
    service_ : RouterService or None
        The service that routes in process; None for a served router.
    url_ : str or None
        The served router's URL; None in process.

    Examples
    --------
    >>> from litellm import Router  # doctest: +SKIP
    >>> from sklocus.integrations.litellm import LocusRoutingPlugin
    >>> plugin = LocusRoutingPlugin("router.sklocus")  # doctest: +SKIP
    >>> gateway = Router(model_list=deployments, plugins=[plugin])  # doctest: +SKIP
    >>> await gateway.acompletion(model="auto", messages=messages)  # doctest: +SKIP
    """

    def __init__(
        self,
        router,
        *,
        model_names=None,
        k=1,
        cost_weight=None,
        min_probability=None,
        budget=None,
        timeout=10.0,
        token=None,
    ):
        self.k = check_count(k, "k")
        self.model_names = _check_model_names(model_names)
        self.policy = {
            name: value
            for name, value in [
                ("cost_weight", cost_weight),
                ("min_probability", min_probability),
                ("budget", budget),
            ]
            if value is not None
        }
        self.timeout = timeout
        self.service_, self.url_ = None, None
        if isinstance(router, str) and router.startswith(("http://", "https://")):
            self.url_ = router.rstrip("/")
            self._backend = _Served(self.url_, timeout, token)
            # The server checks the policy against its router; here, the bounds.
            check_policy(cost_weight, min_probability, budget, has_costs=True)
        else:
            self.service_ = _service(router)
            self._backend = _InProcess(self.service_)
            fitted = self.service_.router
            check_policy(
                cost_weight,
                min_probability,
                budget,
                has_costs=fitted.cost_ is not None,
                has_budget_curve=fitted.budget_curve_ is not None,
            )
        self._told_unknown = set()

    def _name(self, candidate):
        return self.model_names.get(candidate, candidate)

    async def run(self, context):
        """Keep the router's best candidates for the request's text.

        Parameters
        ----------
        context : litellm.types.router.RoutingContext
            Read: ``structured_messages`` and ``candidate_models``. Written:
            ``candidate_models`` (the best ``k`` the router knows, best first,
            then those it does not know) and ``signals["sklocus"]``.

        Returns
        -------
        RoutingContext
            ``context``, narrowed.
        """
        candidates = list(context.candidate_models)
        text = _request_text(context.structured_messages)
        if text is None:
            return _left(context, "the request has no user message with text")
        try:
            served = set(await self._backend.models())
        except Exception as error:  # noqa: BLE001 - the gateway routes on
            return self._failed(context, error)
        known = [c for c in candidates if self._name(c) in served]
        unknown = [c for c in candidates if self._name(c) not in served]
        self._tell_unknown(unknown)
        if not known:
            return _left(context, "the router knows none of the candidates", unknown)
        wanted = list(dict.fromkeys(self._name(c) for c in known))
        exclude = sorted(served.difference(wanted))
        try:
            top = await self._backend.rank(text, exclude, len(wanted), self.policy)
        except Exception as error:  # noqa: BLE001 - the gateway routes on
            return self._failed(context, error)
        chosen = [entry["model"] for entry in top[: self.k]]
        context.candidate_models = [
            candidate
            for model in chosen
            for candidate in known
            if self._name(candidate) == model
        ] + unknown
        context.signals["sklocus"] = {
            "routed": True,
            "model": top[0]["model"],
            "p": top[0]["p"],
            "ranked": top,
            "left_to_litellm": unknown,
        }
        return context

    async def feedback(self, query, model, score):
        """Send the router one outcome: how well ``model`` answered ``query``.

        A grader's score or a user's thumbs, for the router to learn from
        (:ref:`learning_from_outcomes`): in process through the service's
        :meth:`~sklocus.serve.RouterService.feedback`, which needs a feedback
        journal; to a served router through ``POST /feedback``, with ``token``.

        Parameters
        ----------
        query : str
            The request's text, as the plugin routed it.
        model : str
            LiteLLM's name of the model that answered (mapped by
            ``model_names``) or the router's.
        score : float
            In [0, 1].

        Returns
        -------
        dict
            The feedback's answer: ``{"accepted", "through",
            "pending_outcomes"}``.
        """
        outcome = {"query": query, "model": self._name(model), "score": score}
        return await self._backend.feedback([outcome])

    def outcome_logger(self, grader):
        """Return a LiteLLM callback that grades each answer and sends the outcome.

        Add it to ``litellm.callbacks``. After each successful call through a
        model the router knows, ``grader(messages, response)`` (a function or a
        coroutine function) scores the answer in [0, 1], or returns None to
        skip it, and the score goes to :meth:`feedback`. A failure to send is
        logged, once a minute at most, and never fails the call.

        Parameters
        ----------
        grader : callable
            ``grader(messages, response) -> float or None``; ``response`` is
            LiteLLM's ``ModelResponse``.

        Returns
        -------
        litellm.integrations.custom_logger.CustomLogger
        """
        from litellm.integrations.custom_logger import CustomLogger

        if not callable(grader):
            raise TypeError(f"grader is a {type(grader).__name__}; give a callable")
        plugin = self

        class Outcomes(CustomLogger):
            async def async_log_success_event(
                self, kwargs, response_obj, start_time, end_time
            ):
                await plugin._send_outcome(grader, kwargs, response_obj)

        return Outcomes()

    async def _send_outcome(self, grader, kwargs, response):
        metadata = (kwargs.get("litellm_params") or {}).get("metadata") or {}
        model, messages = metadata.get("deployment"), kwargs.get("messages")
        query = _request_text(messages)
        try:
            if query is None or self._name(model) not in await self._backend.models():
                return
            score = grader(messages, response)
            if inspect.isawaitable(score):
                score = await score
            if score is not None:
                await self.feedback(query, model, score)
        except Exception as error:  # noqa: BLE001 - never fails the call
            _failures.warning(
                "an outcome was not sent to the router: %s: %s",
                type(error).__name__,
                error,
            )

    def _tell_unknown(self, unknown):
        new = [c for c in unknown if c not in self._told_unknown]
        if new:
            self._told_unknown.update(new)
            logger.warning(
                "the router does not know %s; left to LiteLLM's own strategy (give "
                "model_names to map LiteLLM's names to the router's)",
                ", ".join(map(repr, new)),
            )

    @staticmethod
    def _failed(context, error):
        _failures.warning(
            "the router could not rank the candidates; they are left as they "
            "were: %s: %s",
            type(error).__name__,
            error,
        )
        return _left(context, f"{type(error).__name__}: {error}")


def _request_text(messages):
    """Return the text of the last user message, or None when there is none.

    Parameters
    ----------
    messages : list of dict
        OpenAI chat messages; a message's ``content`` is a string or a list of
        parts, whose ``{"type": "text", "text": ...}`` parts are joined by
        newlines.

    Returns
    -------
    str or None
    """
    for message in reversed(messages or []):
        if not isinstance(message, Mapping) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(
                part.get("text", "")
                for part in content
                if isinstance(part, Mapping) and part.get("type") == "text"
            )
        if isinstance(content, str) and content.strip():
            return content
    return None


def _left(context, reason, unknown=()):
    """Leave the candidates as they are, saying why in the signals."""
    context.signals["sklocus"] = {
        "routed": False,
        "reason": reason,
        "left_to_litellm": list(unknown),
    }
    return context


def _check_model_names(model_names):
    if model_names is None:
        return {}
    if not isinstance(model_names, Mapping):
        raise TypeError(
            f"model_names is a {type(model_names).__name__}; give a mapping from "
            "LiteLLM's model names to the router's"
        )
    for litellm_name, name in model_names.items():
        if not isinstance(litellm_name, str) or not isinstance(name, str):
            raise TypeError(
                f"model_names maps {litellm_name!r} to {name!r}; both must be "
                "strings (LiteLLM's name and the router's)"
            )
    return dict(model_names)


def _service(router):
    """Return a RouterService of a router, a service or a model file's path."""
    from sklocus._persistence import load
    from sklocus._router import LocusRouter

    if isinstance(router, RouterService):
        return router
    if isinstance(router, str | os.PathLike):
        loaded = load(router)
        if not isinstance(loaded, LocusRouter):
            raise TypeError(
                f"{os.fspath(router)} holds a {type(loaded).__name__}; the plugin "
                "routes with a LocusRouter"
            )
        router = loaded
    if not isinstance(router, LocusRouter):
        raise TypeError(
            f"router is a {type(router).__name__}; give a fitted LocusRouter, a "
            "RouterService, the path of a router's model file or the URL of "
            "sklocus serve"
        )
    return RouterService(router)


class _InProcess:
    """Ranks on the process's router thread, which every service shares."""

    def __init__(self, service):
        self.service = service

    async def models(self):
        return self.service.router.classes_.tolist()

    async def feedback(self, outcomes):
        return await asyncio.to_thread(self.service.feedback, outcomes)

    async def rank(self, text, exclude, k, policy):
        routes = await asyncio.wrap_future(
            router_thread.submit(
                self.service.route, [text], exclude=exclude or None, k=k, **policy
            )
        )
        return routes[0]["top"]


class _Served:
    """Ranks through ``sklocus serve``'s POST /route."""

    def __init__(self, url, timeout, token):
        self.url = url
        self.timeout = timeout
        self.headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        self._client, self._loop = None, None
        self._models, self._read_at = None, -float("inf")

    def _http(self):
        """Return the client of the running event loop (a client is bound to one)."""
        import httpx

        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop:
            self._client = httpx.AsyncClient(base_url=self.url, timeout=self.timeout)
            self._loop = loop
        return self._client

    async def models(self):
        if time.monotonic() - self._read_at > MODELS_TTL_S:
            response = await self._http().get("/models")
            response.raise_for_status()
            self._models = [model["name"] for model in response.json()["models"]]
            self._read_at = time.monotonic()
        return self._models

    async def rank(self, text, exclude, k, policy):
        body = {"queries": [text], "exclude": exclude, "k": k, **policy}
        response = await self._http().post("/route", json=body)
        if response.status_code == 422:
            # A model retired since the list was read: read it again next time.
            self._read_at = -float("inf")
        response.raise_for_status()
        return response.json()["routes"][0]["top"]

    async def feedback(self, outcomes):
        response = await self._http().post(
            "/feedback", json={"outcomes": outcomes}, headers=self.headers
        )
        response.raise_for_status()
        return response.json()
