"""The served router, apart from HTTP: what each request does, and its errors.

:class:`RouterService` holds one fitted :class:`~sklocus.LocusRouter` and answers
routing, prediction and changes to the pool. Requests read the router as it was
when they began; a change builds a new router and then publishes it with one
assignment, so a request never sees half of an onboarding. The slow part of an
onboarding (encoding its queries, embedding the model) runs before the change
takes the lock that changes share, so a removal waits only for a publication;
onboardings run one at a time.

Routing, prediction and the warm-up compute on the router thread
(:mod:`sklocus.serve._router_thread`), in turns of a few queries each, so that
one client's large batch holds up another's single query for one turn only;
an onboarding computes on a thread of its own that ends with it, which hands
its OpenMP pool back.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import numbers
import sqlite3
import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from sklearn.utils.validation import check_is_fitted

from sklocus._router import LocusRouter
from sklocus._routing import PolicyError, check_policy, cost_rescaling
from sklocus._validation import check_count
from sklocus.serve._feedback import LearningFromOutcomes
from sklocus.serve._json import shorten
from sklocus.serve._request import RequestError, check_item_count, query_encoder
from sklocus.serve._router_thread import router_thread

__all__ = ["RequestError", "RouterService", "router_thread"]


# A turn on the router thread: at most this many queries, or as many as come
# to this many characters (one, if the first is longer). A query of a few words
# takes a few milliseconds to encode, and one of a few thousand characters (cut
# to the encoder's longest input) some tens.
_TURN_QUERIES = 16
_TURN_CHARACTERS = 2_000


def _turns(queries):
    """Slice ``queries`` into the turns they are computed in, in order."""
    start = 0
    while start < len(queries):
        stop, characters = start + 1, _characters(queries[start])
        while stop < len(queries) and stop - start < _TURN_QUERIES:
            characters += _characters(queries[stop])
            if characters > _TURN_CHARACTERS:
                break
            stop += 1
        yield slice(start, stop)
        start = stop


def _characters(query):
    return len(query) if isinstance(query, str) else 1


def _on_a_thread_of_its_own(function, /, *args, **kwargs):
    """Return ``function(*args, **kwargs)``, computed on a thread that then ends.

    The thread's OpenMP pool ends with it, so the router thread is again the
    only one holding a pool once an onboarding is done.
    """
    with ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="sklocus-onboarding"
    ) as own:
        return own.submit(function, *args, **kwargs).result()


_log = logging.getLogger("sklocus.serve")
# Longest message an error repeats from the library; the rest is the input.
_MESSAGE_CHARS = 400


def _capped(message):
    if len(message) <= _MESSAGE_CHARS:
        return message
    return f"{message[:_MESSAGE_CHARS]}... ({len(message):,} characters)"


def _require_groups(router):
    if router.named_groups() is None:
        raise RequestError(
            ("query_groups",),
            "the router was fitted without query groups; leave query_groups out",
        )


def _check_label(label, field):
    if label is not None and not isinstance(label, str):
        raise RequestError(
            field,
            f"group {shorten(label)} is a {type(label).__name__}; expected a string, "
            "or null for no group",
        )


class RouterService(LearningFromOutcomes):
    """Route queries with a fitted router, and change its pool while serving.

    Parameters
    ----------
    router : LocusRouter
        Fitted. The service works on its own copy.
    path : str or path-like, default=None
        The model file the router came from; changes are saved to it when
        ``write_back`` is True.
    write_back : bool, default=False
        Save the router to ``path`` after each change, atomically (a new file
        then renamed over the old one), before the change is served.
    max_batch : int, default=256
        Most queries (or models) one request may name.
    max_evaluations : int, default=50,000
        Most evaluations one onboarding may give (EmbedLLM's models have
        36,054 each); each new query text is encoded once.
    feedback_journal : str or path-like, default=None
        A SQLite file (created when missing) that keeps the outcomes
        :meth:`feedback` receives, on disk before it answers. The outcomes not
        yet in the router are learnt when the service starts; with
        ``write_back``, each fold is saved to the model file and the journal
        records which outcomes the file holds (:mod:`sklocus.serve._journal`).
        Without a journal, :meth:`feedback` is refused.
    fold_interval : float, default=1.0
        Seconds over which outcomes gather before they are folded into the
        router in one :meth:`~sklocus.LocusRouter.partial_fit`, once
        :meth:`start_folding` has started the folding thread.
    max_feedback : int, default=10,000
        Most outcomes one :meth:`feedback` call may give.

    Notes
    -----
    A router fitted with ``query_groups`` takes each query's group in
    :meth:`route` and :meth:`predict`, and each evaluated query's group in
    :meth:`add_model`, as its methods do; one fitted without them refuses
    ``query_groups`` (:class:`RequestError`), where the library would ignore
    them, so a client never mistakes answers without offsets for answers with
    them. Model names and group labels must be strings, as JSON has them.

    Whichever thread calls them, :meth:`route`, :meth:`predict` and
    :meth:`warm_up` compute on one thread that every service of the process
    shares, a few queries a turn, and :meth:`add_model` on a thread of its own
    that ends with it: torch then keeps one OpenMP thread pool, whose threads
    stay awake between the operations of a query
    (:mod:`sklocus.serve._router_thread`). A server computes
    :meth:`route_in_turns` and :meth:`predict_in_turns` there for each
    client's address, in fair turns.

    Examples
    --------
    >>> from sklocus.serve import RouterService
    >>> service = RouterService(router)  # doctest: +SKIP
    >>> service.route(["What is 2 + 2?"], k=2)  # doctest: +SKIP
    [{'query': 'What is 2 + 2?', 'model': 'a', 'top': [...]}]
    """

    def __init__(
        self,
        router,
        *,
        path=None,
        write_back=False,
        max_batch=256,
        max_evaluations=50_000,
        feedback_journal=None,
        fold_interval=1.0,
        max_feedback=10_000,
    ):
        if not isinstance(router, LocusRouter):
            raise TypeError(
                f"RouterService serves a LocusRouter; got {type(router).__name__}"
            )
        check_is_fitted(router, "embeddings_")
        groups = router.named_groups()
        groups = [] if groups is None else groups.tolist()
        for what, labels in [("model", router.classes_), ("query group", groups)]:
            wrong = [label for label in labels if not isinstance(label, str)]
            if wrong:
                raise ValueError(
                    f"the router's {what}s must be named with text to be served "
                    f"over JSON; {what} {wrong[0]!r} is a {type(wrong[0]).__name__}"
                )
        if write_back and path is None:
            raise ValueError("write_back=True needs the path of the model file")
        for option, value in [
            ("max_batch", max_batch),
            ("max_evaluations", max_evaluations),
            ("max_feedback", max_feedback),
        ]:
            check_count(value, option)
        # Copies share the router's random state of "thompson"'s draws (made
        # at fit and load): each snapshot served draws on from it.
        self._router = copy.copy(router)
        self.path = None if path is None else Path(path)
        self.write_back = bool(write_back)
        self.max_batch = max_batch
        self.max_evaluations = max_evaluations
        self.max_feedback = max_feedback
        self._changing = threading.Lock()  # held to publish a change
        self._onboarding = threading.Lock()  # one change computed at a time
        self._open_journal(feedback_journal, fold_interval)

    @property
    def router(self):
        """LocusRouter: the router that new requests read."""
        return self._router

    # -- checks ---------------------------------------------------------------

    def _check_batch(self, items, field):
        check_item_count(field, items, self.max_batch)

    @staticmethod
    def _check_names(router, names, field):
        known = set(router.classes_.tolist())
        for position, name in enumerate(names):
            if name not in known:
                raise RequestError(
                    (field, position), f"{shorten(name)} is not a model of the router"
                )

    @staticmethod
    def _encoding_error(error, queries, field="queries"):
        """Blame the query an encoder refused, when its message names one.

        A query quoted by the message is cut short, so the answer does not
        repeat the request; evaluations are blamed as a whole.
        """
        message = str(error)
        for position, query in enumerate(queries):
            if repr(query) in message:
                message = _capped(message.replace(repr(query), shorten(query)))
                where = (field,) if field == "evaluations" else (field, position)
                return RequestError(where, message)
        return RequestError((field,), _capped(message))

    @staticmethod
    def _check_query_groups(router, query_groups, queries):
        """Return the groups of ``queries``, one each, checked; or None."""
        if query_groups is None:
            return None
        _require_groups(router)
        if not isinstance(query_groups, (list, tuple)):
            raise RequestError(
                ("query_groups",),
                f"query_groups is a {type(query_groups).__name__}; give a list, one "
                "group per query (null for none)",
            )
        if len(query_groups) != len(queries):
            raise RequestError(
                ("query_groups",),
                f"{len(query_groups)} query_groups for {len(queries)} queries; give "
                "one per query (null for a query with no group)",
            )
        for position, label in enumerate(query_groups):
            _check_label(label, ("query_groups", position))
        return list(query_groups)

    @staticmethod
    def _check_evaluation_groups(router, query_groups, evaluations):
        """Return the groups of evaluated queries, ``{query: group}``; or None."""
        if query_groups is None:
            return None
        _require_groups(router)
        if not isinstance(query_groups, Mapping):
            raise RequestError(
                ("query_groups",),
                f"query_groups is a {type(query_groups).__name__}; give a mapping "
                "from each evaluated query to its group",
            )
        for query, label in query_groups.items():
            if query not in evaluations:
                raise RequestError(
                    ("query_groups", query),
                    f"{shorten(query)} is not a query of evaluations; give the "
                    "groups of evaluated queries only",
                )
            _check_label(label, ("query_groups", query))
        return dict(query_groups)

    # -- reading ----------------------------------------------------------------

    def route(self, queries, **settings):
        """List the best models for each query, best first.

        Parameters
        ----------
        queries : list of str
            Query texts, or ids the router's precomputed encoder knows.
        exclude : list of str, default=None
            Models not to route to.
        cost_weight : float, default=None
            Weight of cost for this request; ``None`` uses the router's policy.
        min_probability : float, default=None
            A threshold for this request: the cheapest model whose probability
            reaches it (:meth:`~sklocus.LocusRouter.rank_models`).
        budget : float, default=None
            A mean cost per query for this request, when the router was fitted
            with a budget. One of ``cost_weight``, ``min_probability`` and
            ``budget`` per request.
        k : int, default=None
            Models listed per query; ``None`` lists up to 3.
        query_groups : list of str or None, default=None
            Each query's group, None for none, when the router was fitted with
            query groups (:meth:`~sklocus.LocusRouter.rank_models`); refused
            otherwise.

        Returns
        -------
        list of dict
            One ``{"query", "model", "top": [{"model", "p"}, ...]}`` per query,
            in order.
        """
        return router_thread.run_turns(self.route_in_turns(queries, **settings))

    def route_in_turns(
        self,
        queries,
        *,
        exclude=None,
        cost_weight=None,
        min_probability=None,
        budget=None,
        k=None,
        query_groups=None,
    ):
        """:meth:`route` as turns for the router thread (``router_thread.wait_turns``).

        A generator: it checks the request, then ranks a few queries a turn.
        """
        router = self._router  # one snapshot for the whole request
        self._check_batch(queries, "queries")
        query_groups = self._check_query_groups(router, query_groups, queries)
        exclude = list(exclude or [])
        self._check_names(router, exclude, "exclude")
        available = len(router.classes_) - len(set(exclude))
        if available < 1:
            raise RequestError(("exclude",), "excludes every model; leave at least one")
        if k is None:
            k = min(3, available)
        elif not 1 <= k <= available:
            raise RequestError(
                ("k",),
                f"k={k}; expected 1 to {available}, the models available",
            )
        try:
            check_policy(
                cost_weight,
                min_probability,
                budget,
                has_costs=router.cost_ is not None,
                has_budget_curve=router.budget_curve_ is not None,
            )
        except PolicyError as error:
            raise RequestError((error.setting,), str(error)) from None
        routes = []
        for turn in _turns(queries):
            if turn.start:
                yield  # another client's turn may come first
            try:
                models, probabilities = router.rank_models(
                    queries[turn],
                    k=k,
                    exclude=exclude or None,
                    cost_weight=cost_weight,
                    min_probability=min_probability,
                    budget=budget,
                    query_groups=None if query_groups is None else query_groups[turn],
                )
            except (ValueError, TypeError, KeyError) as error:
                raise self._encoding_error(error, queries) from None
            routes += [
                {
                    "query": query,
                    "model": str(row[0]),
                    "top": [
                        {"model": str(model), "p": float(p)}
                        for model, p in zip(row, chances)
                    ],
                }
                for query, row, chances in zip(
                    queries[turn], models.tolist(), probabilities
                )
            ]
        return routes

    def predict(self, queries, models=None, query_groups=None):
        """P(correct) of each model on each query.

        The router's :meth:`~sklocus.LocusRouter.predict_correctness`, with the
        columns of ``models``.

        Parameters
        ----------
        queries : list of str
        models : list of str, default=None
            The models to score, each of the router's; ``None`` scores all.
        query_groups : list of str or None, default=None
            Each query's group, as :meth:`route` takes them.

        Returns
        -------
        dict
            ``{"models": [...], "queries": [...], "p": [[...], ...]}``, one row
            of ``p`` per query, one column per model.
        """
        turns = self.predict_in_turns(queries, models, query_groups)
        return router_thread.run_turns(turns)

    def predict_in_turns(self, queries, models=None, query_groups=None):
        """:meth:`predict` as turns for the router thread, a few queries a turn."""
        router = self._router
        self._check_batch(queries, "queries")
        query_groups = self._check_query_groups(router, query_groups, queries)
        if models is None:
            columns = np.arange(len(router.classes_))
        else:
            self._check_batch(models, "models")
            self._check_names(router, models, "models")
            index = {name: j for j, name in enumerate(router.classes_.tolist())}
            columns = np.array([index[name] for name in models])
        rows = []
        for turn in _turns(queries):
            if turn.start:
                yield  # another client's turn may come first
            try:
                # Every model, then the columns asked for: the library's answer
                # for the turn's queries to the bit (scoring a subset of models
                # rounds the matrix product differently).
                probabilities = router.predict_correctness(
                    queries[turn],
                    None if query_groups is None else query_groups[turn],
                )
            except (ValueError, TypeError, KeyError) as error:
                raise self._encoding_error(error, queries) from None
            rows += probabilities[:, columns].astype(np.float64).tolist()
        return {
            "models": [str(name) for name in router.classes_[columns]],
            "queries": list(queries),
            "p": rows,
        }

    def models(self):
        """List the models served, with their costs and what they learnt from.

        Returns
        -------
        list of dict
            ``{"name", "cost", "n_evaluations", "n_scores", "n_outcomes"}`` per
            model, ``cost`` None without costs; ``n_evaluations`` counts the
            distinct queries the model is embedded from, ``n_scores`` the scores
            averaged there (each evaluation the router was given and each
            outcome learnt since, a query answered twice counting twice), and
            ``n_outcomes`` the outcomes that :meth:`feedback` took for it and the
            router has folded in (from the feedback journal: 0 without one, and
            0 before any feedback).
        """
        router = self._router
        costs = [None] * len(router.classes_)
        if router.cost_ is not None:
            costs = router.cost_.astype(np.float64).tolist()
        counts = router.evaluation_counts()
        learnt = self.outcomes_learnt()
        return [
            {
                "name": str(name),
                "cost": cost,
                "n_evaluations": size,
                "n_scores": scores,
                "n_outcomes": learnt.get(name, 0),
            }
            for name, cost, size, scores in zip(
                router.classes_.tolist(),
                costs,
                counts["n_evaluations"].tolist(),
                counts["n_scores"].tolist(),
            )
        ]

    def health(self):
        """Say what the service serves, for a health check.

        Returns
        -------
        dict
            ``{"status", "n_models", "groups", "write_back", "feedback",
            "pending_outcomes", "sklocus_version"}``; ``groups`` lists the query
            groups the router has offsets for, None when it was fitted without
            them; ``feedback`` says whether :meth:`feedback` is open (a journal
            is kept), and ``pending_outcomes`` how many journalled outcomes
            wait to be folded in.
        """
        from sklocus._versioning import __version__

        router = self._router
        groups = router.named_groups()
        return {
            "status": "ok",
            "n_models": int(len(router.classes_)),
            "groups": None if groups is None else [str(g) for g in groups],
            "write_back": self.write_back,
            "feedback": self._journal is not None,
            "pending_outcomes": self.pending_outcomes(),
            "sklocus_version": __version__,
        }

    def warm_up(self):
        """Load the query encoder and run one routing pass before serving.

        The first request would otherwise wait seconds for the sentence encoder
        to load.
        """
        encoder = query_encoder(self._router)
        known = getattr(encoder, "queries", None)
        query = known[0] if known is not None and len(known) else "warm-up"
        # On the router thread, where requests will be answered: warmed up on
        # the caller's thread, torch would hold a second OpenMP pool for good.
        router_thread.call(self._router.rank_models, [query], k=1)

    # -- changing the pool ------------------------------------------------------

    def _publish(self, changed, folded=None):
        """Save ``changed`` if asked, then serve it: one assignment, no tearing.

        ``changed`` holds the journal's outcomes through id ``folded`` (by
        default, those the served router holds).
        """
        folded = self._folded if folded is None else folded
        if self.write_back:
            from sklocus._files import write_atomically
            from sklocus._persistence import serialised

            try:
                content = serialised(changed)
                digest = hashlib.sha256(content).hexdigest()
                if self._journal is not None:
                    self._journal.begin_fold(folded, digest)
                # A new file renamed over the old one.
                write_atomically(self.path, lambda path: path.write_bytes(content))
                if self._journal is not None:
                    self._journal.end_fold(folded, digest)
            except (OSError, ValueError, TypeError, sqlite3.Error) as error:
                _log.error("could not save the router to %s: %s", self.path, error)
                reason = getattr(error, "strerror", None) or str(error)
                raise RequestError(
                    (),
                    f"the change could not be saved to the model file ({reason}), "
                    "so it is not served; the pool is as it was",
                    status=503,
                ) from None
        self._router = changed
        self._folded = folded

    def _change(self, compute, folded=None):
        """Publish a copy of the served router that ``compute(copy)`` changed.

        The slow part, ``compute``, runs on a thread of its own outside the
        publishing lock: requests keep reading the router as it was, and a
        model removed meanwhile is removed from the copy before it is served.
        Changes are computed one at a time. Returns the router published.
        """
        snapshot = self._router
        staged = copy.copy(snapshot)
        _on_a_thread_of_its_own(compute, staged)
        with self._changing:
            removed = set(snapshot.classes_.tolist()) - set(
                self._router.classes_.tolist()
            )
            if removed:
                staged.remove_models(
                    [model for model in snapshot.classes_ if model in removed]
                )
            self._publish(staged, folded)
        return staged

    def add_model(self, name, evaluations, cost=None, query_groups=None):
        """Onboard one model from its evaluations: one forward pass.

        Parameters
        ----------
        name : str
            New to the router.
        evaluations : dict
            ``{query: score}``, scores in [0, 1].
        cost : float, default=None
            Required when the router has costs, refused otherwise.
        query_groups : dict, default=None
            ``{query: group}`` for evaluated queries, and only for them (a
            query left out, or None, has no group), when the router was fitted
            with query groups: the model's offsets for the router's groups are
            fitted on its own evaluations (:meth:`~sklocus.LocusRouter.add_models`).
            Without it the model gets no offsets; groups the router lacks are
            ignored.

        Returns
        -------
        dict
            ``{"model", "n_evaluations", "n_models"}``.
        """
        check_item_count("evaluations", evaluations, self.max_evaluations)
        # The router's groups never change, so any snapshot can check these.
        query_groups = self._check_evaluation_groups(
            self._router, query_groups, evaluations
        )
        with self._onboarding:
            self._check_new(self._router, name, cost)
            try:
                staged = self._change(
                    lambda router: router.add_models(
                        [evaluations],
                        [name],
                        cost=None if cost is None else [cost],
                        query_groups=query_groups,
                    )
                )
            except RequestError:  # the change could not be saved
                raise
            except (ValueError, TypeError, KeyError) as error:
                raise self._encoding_error(error, evaluations, "evaluations") from None
            return {
                "model": name,
                "n_evaluations": len(evaluations),
                "n_models": int(len(staged.classes_)),
            }

    @staticmethod
    def _check_new(router, name, cost):
        if name in set(router.classes_.tolist()):
            raise RequestError(
                ("name",), f"model {shorten(name)} is already served", status=409
            )
        if (cost is None) != (router.cost_ is None):
            message = (
                "the router has costs; give this model's cost"
                if cost is None
                else "the router has no costs; leave cost out"
            )
            raise RequestError(("cost",), message)
        if cost is not None and isinstance(cost, numbers.Real):
            rescaling = cost_rescaling(router.cost_, [cost])
            if rescaling is not None:
                # A warning in the library; here a client would change every
                # other client's routes, and the operator would not know.
                raise RequestError(
                    ("cost",),
                    f"{rescaling[1]}; onboard it with LocusRouter.add_models and "
                    "serve the saved router, if that is meant",
                )

    def remove_model(self, name):
        """Stop serving one model.

        Parameters
        ----------
        name : str

        Returns
        -------
        dict
            ``{"model", "n_models"}``.
        """
        with self._changing:
            router = self._router
            if name not in set(router.classes_.tolist()):
                raise RequestError(("name",), f"no model {shorten(name)}", status=404)
            if len(router.classes_) == 1:
                raise RequestError(
                    ("name",),
                    f"{shorten(name)} is the last model; keep one",
                    status=409,
                )
            changed = copy.copy(router)
            changed.remove_models([name])
            self._publish(changed)
            if self._journal is not None:
                self._journal.record_removal(name)
                self._learnt = None  # its outcomes are no longer counted
            return {"model": name, "n_models": int(len(changed.classes_))}
