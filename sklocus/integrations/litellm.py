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
and the failure is logged: the gateway goes on routing by its own strategy,
and the router is left alone for a while (a circuit breaker), so that a
server that hangs does not add its timeout to every request. The router reads
the first 20,000 characters of a message.

Nothing here imports LiteLLM: a plugin is any object with ``async run(context)``
that reads ``context.structured_messages`` and ``context.candidate_models`` and
writes ``context.candidate_models`` and ``context.signals``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
from collections.abc import Mapping

from sklocus._routing import check_policy
from sklocus._validation import check_count
from sklocus.integrations._backends import InProcess, Served, service_of
from sklocus.integrations._breaker import CircuitBreaker
from sklocus.serve._chat import last_user_text
from sklocus.serve._warnings import LogLimit

__all__ = ["LocusRoutingPlugin"]

logger = logging.getLogger(__name__)
# A router that is down would otherwise log a line per request: its failures
# go to a logger of their own, one line of a kind a minute.
_failures = logging.getLogger(__name__ + ".failures")
_failures.addFilter(LogLimit())
# The longest a failing router is left alone, however often it failed.
_MAX_COOLDOWN = 60.0


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
    cooldown : float, default=5.0
        Seconds the router is left alone after it fails to rank (cannot be
        reached, times out, answers 5xx): requests meanwhile keep their
        candidates, at once. Then one request tries it again; each failure
        in a row doubles the wait, up to 60 s.

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
        cooldown=5.0,
    ):
        self.k = check_count(k, "k")
        self.model_names = _check_model_names(model_names)
        self.timeout = timeout
        self.cooldown = _check_seconds(cooldown, "cooldown")
        self._breaker = CircuitBreaker(self.cooldown, max(self.cooldown, _MAX_COOLDOWN))
        self.service_, self.url_ = None, None
        if isinstance(router, str) and router.startswith(("http://", "https://")):
            if "@" in router.split("://", 1)[1].split("/", 1)[0]:
                raise ValueError(
                    "the router's URL carries credentials, which error messages "
                    "would repeat; give the server's token as token= instead"
                )
            self.url_ = router.rstrip("/")
            self._backend = Served(self.url_, timeout, token)
            # The server checks the policy against its router; here, the bounds.
            facts = {"has_costs": True}
        else:
            self.service_ = service_of(router)
            self._backend = InProcess(self.service_)
            fitted = self.service_.router
            facts = {
                "has_costs": fitted.cost_ is not None,
                "has_budget_curve": fitted.budget_curve_ is not None,
            }
        # The policy given, as each request's POST /route or route() takes it.
        self.policy = check_policy(cost_weight, min_probability, budget, **facts)
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
        text = last_user_text(context.structured_messages)
        if text is None:
            return _unchanged(context, "the last user message has no text")
        resting = self._breaker.wait()
        if resting:
            return _unchanged(
                context,
                f"the router failed {self._breaker.failures} time(s) in a row; it is "
                f"asked again in {resting:.1f} s",
            )
        try:
            served = set(await self._backend.models())
        except Exception as error:  # noqa: BLE001 - the gateway routes on
            return self._failed(context, error)
        known = [c for c in candidates if self._name(c) in served]
        unknown = [c for c in candidates if self._name(c) not in served]
        self._tell_unknown(unknown)
        if not known:
            return _unchanged(
                context, "the router knows none of the candidates", unknown
            )
        wanted = list(dict.fromkeys(self._name(c) for c in known))
        exclude = sorted(served.difference(wanted))
        try:
            top = await self._backend.rank(text, exclude, len(wanted), self.policy)
        except Exception as error:  # noqa: BLE001 - the gateway routes on
            return self._failed(context, error)
        self._breaker.succeeded()
        # A model onboarded since the list was read may rank among them: only
        # the candidates' models can be kept.
        top = [entry for entry in top if entry["model"] in wanted]
        if not top:
            return _unchanged(context, "the router ranked none of the candidates")
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

        Add it to ``litellm.callbacks``; LiteLLM then calls it after every
        successful async call of the process. For an answer of a model the
        router knows, ``grader(messages, response)`` scores it in [0, 1], or
        returns None to skip it, and the score goes to :meth:`feedback`: a
        coroutine function is awaited, a plain function runs on a worker
        thread, off the event loop. A failure to grade or send is logged, once
        a minute at most, and never fails the call. In process, the service
        must keep a feedback journal, or this refuses at once.

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
        if self.service_ is not None and not self.service_.health()["feedback"]:
            raise ValueError(
                "the plugin's RouterService keeps no feedback journal, so it takes "
                "no outcomes; give it one (RouterService(router, "
                "feedback_journal=...))"
            )
        plugin = self

        class Outcomes(CustomLogger):
            """Grade each answer and send the outcome to the plugin's router."""

            async def async_log_success_event(
                self, kwargs, response_obj, start_time, end_time
            ):
                await plugin._send_outcome(grader, kwargs, response_obj)

        return Outcomes()

    async def _send_outcome(self, grader, kwargs, response):
        try:
            metadata = (kwargs.get("litellm_params") or {}).get("metadata") or {}
            model, messages = metadata.get("deployment"), kwargs.get("messages")
            query = last_user_text(messages)
            if query is None or self._name(model) not in await self._backend.models():
                return
            if inspect.iscoroutinefunction(grader):
                score = await grader(messages, response)
            else:
                score = await asyncio.to_thread(grader, messages, response)
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

    def _failed(self, context, error):
        # The log, the operator's, says what failed; the signals, which LiteLLM
        # passes on to its logging integrations, name the error's type alone.
        # A refusal of this request (a ValueError: a policy or a model the
        # server refused) says the router is up; anything else rests it.
        if not isinstance(error, ValueError):
            self._breaker.failed()
        _failures.warning(
            "the router at %s could not rank the candidates; they are left as "
            "they were: %s: %s",
            self.url_ or "this process",
            type(error).__name__,
            error,
        )
        return _unchanged(
            context, f"the router could not rank them ({type(error).__name__})"
        )


def _unchanged(context, reason, unknown=()):
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


def _check_seconds(value, name):
    """Return ``value`` as a float when it is a finite number of seconds >= 0."""
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ValueError(f"{name}={value!r}; expected a number of seconds, at least 0")
    return float(value)
