"""Outcomes sent to a served router: checked, journalled, then folded in.

``POST /feedback`` takes a batch of ``{"query", "model", "score"}`` outcomes
(and a ``query_group`` for a router with groups). :func:`check_outcomes` checks
each against the router being served; the service writes the batch to its
:class:`~sklocus.serve._journal.FeedbackJournal` and answers once it is on disk.
A :class:`Folder` thread then folds what has arrived into the router at most
once per ``interval`` seconds: one :meth:`~sklocus.LocusRouter.partial_fit`
for all the outcomes of that time, so that each model touched is embedded
again once, not once per request. Routing reads the router served before the
fold until the folded one is published whole.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time

import numpy as np

from sklocus.evaluations import _first_bad_score
from sklocus.serve._journal import FeedbackJournal
from sklocus.serve._json import shorten
from sklocus.serve._metrics import FoldTimes
from sklocus.serve._request import RequestError, check_item_count, query_encoder

_log = logging.getLogger("sklocus.serve")

_FIELDS = {"query", "model", "score", "query_group"}


def check_outcomes(router, outcomes, request_error):
    """Return journal rows ``(query, model, score, group)`` of checked outcomes.

    ``request_error(field, message)`` builds the error that names the outcome
    at fault.
    """
    known = set(router.classes_.tolist())
    grouped = router.named_groups() is not None
    rows = []
    for position, outcome in enumerate(outcomes):
        where = ("outcomes", position)
        if not isinstance(outcome, dict) or not {"query", "model", "score"} <= set(
            outcome
        ):
            raise request_error(where, 'an outcome is {"query", "model", "score"}')
        extra = sorted(set(outcome) - _FIELDS)
        if extra:
            raise request_error(
                (*where, extra[0]), f"an outcome has no field {extra[0]!r}"
            )
        query, model, score = outcome["query"], outcome["model"], outcome["score"]
        group = outcome.get("query_group")
        if not isinstance(query, str) or not query:
            raise request_error((*where, "query"), "a query is a non-empty string")
        if model not in known:
            raise request_error(
                (*where, "model"), f"{shorten(model)} is not a model of the router"
            )
        if _first_bad_score(np.array([score], dtype=object)) is not None:
            raise request_error(
                (*where, "score"), f"score {shorten(score)} is not a number in [0, 1]"
            )
        if group is not None:
            if not grouped:
                raise request_error(
                    (*where, "query_group"),
                    "the router was fitted without query groups; leave query_group out",
                )
            if not isinstance(group, str):
                raise request_error(
                    (*where, "query_group"), "a query_group is a string, or null"
                )
        rows.append((query, model, float(score), group))
    known = getattr(query_encoder(router), "queries", None)
    if known is not None:  # a precomputed encoder encodes only its own ids
        table = set(known)
        for position, (query, *_) in enumerate(rows):
            if query not in table:
                raise request_error(
                    ("outcomes", position, "query"),
                    f"{shorten(query)} is not a query the router's precomputed "
                    "encoder knows",
                )
    return rows


def learn_outcomes(router, outcomes):
    """Learn ``(query, model, score, group)`` outcomes in one partial fit.

    Models are found by name in ``router``: outcomes of a model it does not
    serve (removed since they were sent) are passed over.
    """
    known = set(router.classes_.tolist())
    kept = [outcome for outcome in outcomes if outcome[1] in known]
    group_of = {query: group for query, _, _, group in kept if group is not None}
    router.learn_outcomes(
        [outcome[1] for outcome in kept],
        [outcome[0] for outcome in kept],
        [outcome[2] for outcome in kept],
        group_of or None,
        group_conflicts="ignore",
    )


class Folder:
    """The thread that folds journalled outcomes into a service's router.

    Parameters
    ----------
    fold : callable
        Folds what has arrived; returns the number of outcomes it folded.
    interval : float
        Seconds between folds while outcomes keep arriving.
    """

    def __init__(self, fold, interval):
        self._fold = fold
        self.interval = interval
        self._arrived = threading.Event()
        self._stopping = threading.Event()
        self._thread = None

    def start(self):
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(
                target=self._run, name="sklocus-feedback", daemon=True
            )
            self._thread.start()

    def stop(self):
        self._stopping.set()
        self._arrived.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def arrived(self):
        """Say that outcomes arrived."""
        self._arrived.set()

    def _run(self):
        while not self._stopping.is_set():
            self._arrived.wait()
            # Gather what arrives meanwhile: one fold per interval at most.
            if self._stopping.wait(self.interval):
                return
            self._arrived.clear()
            try:
                self._fold()
            except Exception:  # the next arrival tries again; the journal keeps all
                _log.exception("folding outcomes into the router failed")


class LearningFromOutcomes:
    """What a :class:`~sklocus.serve.RouterService` does with outcomes.

    A mixin: the service gives it ``_router``, ``_onboarding``, ``_changing``,
    ``_change`` and ``path``, and keeps ``_journal`` and ``_folded`` in step
    when it publishes a change (:meth:`RouterService._publish`).
    """

    def _open_journal(self, path, fold_interval):
        if (
            isinstance(fold_interval, bool)
            or not isinstance(fold_interval, int | float)
            or not 0 <= fold_interval < math.inf
        ):
            raise ValueError(f"fold_interval={fold_interval!r} must be a number >= 0")
        self._journal = None
        self._learnt = None  # (folded, {model: outcomes}), see outcomes_learnt
        self._folded = 0  # the id through which the router holds the journal's
        # The journal's last id, kept here so that /health never waits on the
        # journal's lock (held by a write through SQLite's busy wait).
        self._journalled = 0
        self._folder = Folder(self.fold_all, fold_interval)
        self.fold_times = FoldTimes()  # GET /metrics
        if path is not None:
            self._journal = FeedbackJournal(path)
            self._journalled = self._journal.last_id()
            if self.path is not None and self.path.is_file():
                self._folded = self._journal.settle(self.path)
            # Learn what the journal holds and the router does not yet.
            self.fold_all()

    def feedback(self, outcomes):
        """Keep outcomes of served queries, to be learnt by the models they name.

        Returns once they are on disk in the feedback journal; the folding
        thread (:meth:`start_folding`), or :meth:`fold`, then learns them.

        Parameters
        ----------
        outcomes : list of dict
            ``{"query", "model", "score"}`` each, the score in [0, 1], and
            ``"query_group"`` (a string or None) for a router with groups: a
            query new to the router takes it, one it knows keeps its own.

        Returns
        -------
        dict
            ``{"accepted", "through", "pending_outcomes"}``: how many outcomes
            were kept, the journal id of the last, and how many wait to be
            folded in.
        """
        if self._journal is None:
            raise RequestError(
                (),
                "this service keeps no feedback journal, so it takes no outcomes; "
                "start it with one (sklocus serve --feedback-journal FILE)",
                status=409,
            )
        if not isinstance(outcomes, list | tuple):
            raise RequestError(
                ("outcomes",), f"outcomes is a {type(outcomes).__name__}; give a list"
            )
        check_item_count("outcomes", outcomes, self.max_feedback)
        rows = check_outcomes(self._router, outcomes, RequestError)
        try:
            through = self._journal.append(rows)
        except sqlite3.Error as error:  # disk full, file size limit, I/O error
            raise RequestError(
                ("outcomes",),
                f"the feedback journal cannot be written ({error}); nothing of this "
                "request was kept, send it again later",
                status=503,
            ) from None
        self._journalled = max(self._journalled, through)
        self._folder.arrived()
        return {
            "accepted": len(rows),
            "through": through,
            "pending_outcomes": through - self._folded,
        }

    def outcomes_learnt(self):
        """Return ``{model: count}`` of the journalled outcomes the router holds.

        Counted once per fold (a journal may hold millions) and kept until the
        next.
        """
        if self._journal is None:
            return {}
        folded = self._folded
        cached = self._learnt
        if cached is None or cached[0] != folded:
            cached = (folded, self._journal.counts_through(folded))
            self._learnt = cached
        return cached[1]

    def pending_outcomes(self):
        """How many journalled outcomes the served router does not hold yet."""
        if self._journal is None:
            return 0
        return self._journalled - self._folded

    def fold(self, max_outcomes=100_000):
        """Learn the journalled outcomes the router does not hold yet.

        Up to ``max_outcomes`` of them, oldest first: the models they name are
        embedded again in one :meth:`~sklocus.LocusRouter.partial_fit` (on a
        thread of its own, while requests read the router as it was), then the
        result is published (and saved, with ``write_back``). Outcomes of models
        no longer served are passed over. When learning or saving fails, nothing
        is published and the same outcomes are tried again at the next fold.

        Returns
        -------
        int
            How many journalled outcomes this fold read (0 when none waited).
        """
        if self._journal is None:
            return 0
        with self._onboarding:
            rows = self._journal.since(self._folded, max_outcomes)
            if not rows:
                return 0
            through = rows[-1][0]
            # Outcomes of a model since removed stay its own, whoever is later
            # onboarded under its name.
            removed = self._journal.removals()
            own = [row[1:] for row in rows if row[0] > removed.get(row[2], 0)]
            # Learnt by name in the copy: a model removed since the journal
            # was read is passed over.
            start = time.perf_counter()
            self._change(lambda router: learn_outcomes(router, own), folded=through)
            self.fold_times.record(time.perf_counter() - start)
            return len(rows)

    def fold_all(self, max_outcomes=100_000):
        """Fold until no journalled outcome waits; return how many were read."""
        total = 0
        while True:
            read = self.fold(max_outcomes)
            total += read
            if read < max_outcomes:
                return total

    def start_folding(self):
        """Start the thread that folds outcomes in as they arrive."""
        if self._journal is not None:
            self._folder.start()

    def stop_folding(self):
        """Stop the folding thread, after the fold it is computing, if any."""
        self._folder.stop()

    def close(self):
        """Stop folding and close the journal (what is journalled stays)."""
        self._folder.stop()
        if self._journal is not None:
            self._journal.close()
