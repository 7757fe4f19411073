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
import threading

from sklocus.serve._json import shorten

_log = logging.getLogger("sklocus.serve")

_FIELDS = {"query", "model", "score", "query_group"}


def check_outcomes(router, outcomes, request_error):
    """Return journal rows ``(query, model, score, group)`` of checked outcomes.

    ``request_error(field, message)`` builds the error that names the outcome
    at fault.
    """
    known = set(router.classes_.tolist())
    grouped = router.group_offsets_ is not None
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
        if (
            isinstance(score, bool)
            or not isinstance(score, int | float)
            or not math.isfinite(score)
            or not 0 <= score <= 1
        ):
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
    return rows


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
