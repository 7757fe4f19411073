"""A served router that follows a store's log: one replica among several.

:class:`ReplicaService` is a :class:`~sklocus.serve.RouterService` whose changes
(outcomes, onboardings, removals) are not made in place but appended to a
:mod:`store <sklocus.serve._store>`'s log, which every replica folds in id
order, the same way:

- an outcome waits, read but not learnt, for the next *fold mark*; at a mark
  the outcomes since the previous one are learnt in one
  :meth:`~sklocus.LocusRouter.partial_fit`;
- an onboarding or a removal is applied where it stands; one that cannot be
  (a name already served, the last model) is passed over, by every replica
  alike, and the replica that appended it answers its client with the reason;
- a removal also drops the waiting outcomes of the model it removes: a model
  onboarded later under the name never learns them.

So the router a replica serves is a function of the first snapshot and the
entries through :attr:`ReplicaService.position`: two replicas at one position
rank every query alike (on the same sklocus, torch and kind of CPU).

The replica that holds the store's lease writes a fold mark once outcomes have
waited ``fold_interval`` seconds, and a snapshot every ``snapshot_interval``
seconds; every replica reads the log every ``poll_interval`` seconds. An
outcome acknowledged at time t is learnt everywhere by about t +
``fold_interval`` + ``poll_interval`` + one fold.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import tempfile
import threading
import time
from pathlib import Path

from sklocus.serve._feedback import check_outcomes, learn_outcomes
from sklocus.serve._json import shorten
from sklocus.serve._request import RequestError, check_item_count
from sklocus.serve._service import RouterService, _on_a_thread_of_its_own
from sklocus.serve._store import LogEntry, StoreError, StoreUnavailable

_log = logging.getLogger("sklocus.serve")

# Most entries one reading of the log takes.
_READ_AT_ONCE = 10_000


def router_from_snapshot(snapshot):
    """Load the router a snapshot holds, with every check of sklocus.load."""
    from sklocus._persistence import load

    with tempfile.TemporaryDirectory(prefix="sklocus-snapshot-") as folder:
        path = Path(folder) / f"snapshot-{snapshot.through}.sklocus"
        path.write_bytes(snapshot.content)
        return load(path)


class _Refused(Exception):
    """An entry that cannot be applied: every replica passes it over."""


class ReplicaService(RouterService):
    """Serve a router that follows a store's log (see the module's docstring).

    Parameters
    ----------
    store : Store
        From :func:`~sklocus.serve._store.open_store`; the service closes it.
    seed : LocusRouter, default=None
        The router to start the store from when it holds no snapshot yet (the
        first replica's model file); ignored otherwise.
    fold_interval : float, default=1.0
        Seconds outcomes gather before the lease's holder marks a fold.
    snapshot_interval : float, default=60.0
        Seconds between the lease holder's snapshots.
    poll_interval : float, default=0.1
        Seconds between readings of the log.
    change_timeout : float, default=60.0
        Seconds an onboarding or removal waits for this replica to fold it.
    prepare : callable, default=None
        Called with the router loaded from the snapshot, before the replica
        folds the entries after it (to set its exploration, or encode its
        pool's queries ahead).
    **limits
        ``max_batch``, ``max_evaluations`` and ``max_feedback``, as
        :class:`~sklocus.serve.RouterService` takes them.
    """

    def __init__(
        self,
        store,
        seed=None,
        *,
        fold_interval=1.0,
        snapshot_interval=60.0,
        poll_interval=0.1,
        change_timeout=60.0,
        prepare=None,
        **limits,
    ):
        for option, value, least in [
            ("fold_interval", fold_interval, 0),
            ("snapshot_interval", snapshot_interval, 0),
            ("poll_interval", poll_interval, 1e-3),
            ("change_timeout", change_timeout, 1e-3),
        ]:
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not least <= value < math.inf
            ):
                raise ValueError(f"{option}={value!r} must be a number >= {least:g}")
        self.store = store
        snapshot = store.latest_snapshot()
        if snapshot is None:
            if seed is None:
                raise StoreError(
                    f"the store {store.location} holds no router yet; give the "
                    "model file to start it from"
                )
            from sklocus._persistence import serialised

            snapshot = store.seed_snapshot(serialised(seed))
        router = router_from_snapshot(snapshot)
        if prepare is not None:
            prepare(router)
        super().__init__(router, **limits)
        self.fold_interval = fold_interval
        self.snapshot_interval = snapshot_interval
        self.poll_interval = poll_interval
        self.change_timeout = change_timeout
        self.position = snapshot.through  # the last entry folded
        self._read = snapshot.through  # the last entry read
        self._waiting = []  # outcomes read and not yet learnt
        self._last_id = snapshot.through  # the log's last id, as last seen
        self._snapshot_at = (snapshot.through, time.monotonic())
        self._learnt = dict(snapshot.state.get("learnt", {}))  # model -> outcomes
        self._waiting_since = None  # when outcomes began to wait for a mark
        self._refusals = {}  # id -> why, for entries this replica awaits
        self._awaited = set()
        self._following = threading.Lock()  # one reading of the log at a time
        self._moved = threading.Condition()  # notified when position moves
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = None
        self.follow()

    # -- reading the log ---------------------------------------------------------

    def follow(self):
        """Fold the log's new entries; return how many were read.

        The lease's holder also writes the fold marks and snapshots.
        """
        with self._following:
            read = 0
            leading = self._lead()
            while True:
                entries = self.store.entries_after(self._read, _READ_AT_ONCE)
                if not entries:
                    break
                read += len(entries)
                self._fold(entries)
                if len(entries) < _READ_AT_ONCE:
                    break
            if leading and self._waiting:
                if self._waiting_since is None:
                    self._waiting_since = time.monotonic()
                if self._due(self._waiting_since, self.fold_interval):
                    read += self._mark()
            if leading:
                self._snapshot_if_due()
            return read

    def _mark(self):
        """Append a fold mark and fold through it; return the entries read."""
        self.store.append([LogEntry("fold")])
        return self._fold(self.store.entries_after(self._read, _READ_AT_ONCE))

    @staticmethod
    def _due(since, interval):
        return time.monotonic() - since >= interval

    def _lead(self):
        try:
            return self.store.try_lease()
        except StoreError as error:
            _log.warning("could not take the store's lease: %s", error)
            return False

    def _fold(self, entries):
        """Apply ``entries`` in order to a copy of the router, then serve it."""
        if not entries:
            return 0
        staged, position, refusals = None, self.position, {}
        waiting, learnt = list(self._waiting), dict(self._learnt)

        def apply(router):
            nonlocal position, waiting
            for entry in entries:
                if entry.kind == "outcome":
                    waiting.append(entry)
                    continue
                try:
                    waiting = self._apply(router, entry, waiting, learnt)
                except _Refused as refusal:
                    refusals[entry.id] = str(refusal)
                    _log.warning("log entry #%d passed over: %s", entry.id, refusal)
                position = entry.id

        boundary = any(entry.kind != "outcome" for entry in entries)
        if boundary:
            staged = copy.copy(self._router)
            start = time.perf_counter()
            _on_a_thread_of_its_own(apply, staged)
            self.fold_times.record(time.perf_counter() - start)
        else:
            waiting += entries
        with self._changing:
            if staged is not None:
                self._router = staged
            self._waiting, self._learnt = waiting, learnt
            if not waiting:
                self._waiting_since = None
            self._read = entries[-1].id
            self._last_id = max(self._last_id, self._read)
            self.position = position
        with self._moved:
            self._refusals.update(
                (id_, why) for id_, why in refusals.items() if id_ in self._awaited
            )
            self._moved.notify_all()
        return len(entries)

    def _apply(self, router, entry, waiting, learnt):
        """Apply one change to ``router``; return the outcomes still waiting.

        ``learnt`` (model -> outcomes learnt) is kept up to date.
        """
        if entry.kind == "fold":
            outcomes = [(o.query, o.model, o.score, o.query_group) for o in waiting]
            learn_outcomes(router, outcomes)
            served = set(router.classes_.tolist())
            for outcome in waiting:
                if outcome.model in served:
                    learnt[outcome.model] = learnt.get(outcome.model, 0) + 1
            return []
        if entry.kind == "removal":
            names = set(router.classes_.tolist())
            if entry.model not in names:
                raise _Refused(f"no model {shorten(entry.model)}")
            if len(names) == 1:
                raise _Refused(f"{shorten(entry.model)} is the last model; keep one")
            router.remove_models([entry.model])
            learnt.pop(entry.model, None)
            return [outcome for outcome in waiting if outcome.model != entry.model]
        body = json.loads(entry.body)
        try:
            self._check_new(router, entry.model, body["cost"])
        except RequestError as error:
            raise _Refused(error.message) from None
        try:
            router.add_models(
                [body["evaluations"]],
                [entry.model],
                cost=None if body["cost"] is None else [body["cost"]],
                query_groups=body["query_groups"],
            )
        except (ValueError, TypeError, KeyError) as error:
            raise _Refused(
                self._encoding_error(error, body["evaluations"], "evaluations").message
            ) from None
        return waiting

    def _snapshot_if_due(self):
        through, at = self._snapshot_at
        if self.position == through or not self._due(at, self.snapshot_interval):
            return
        for _ in range(3):
            if not any(outcome.id < self.position for outcome in self._waiting):
                break
            # Outcomes before the position wait for a mark: a replica starting
            # from this snapshot would never read them. Mark, then snapshot.
            self._mark()
        else:  # changes keep coming between outcomes: try at the next reading
            return
        from sklocus._persistence import serialised

        with self._changing:
            router, position, learnt = self._router, self.position, dict(self._learnt)
        try:
            self.store.save_snapshot(serialised(router), position, {"learnt": learnt})
        except StoreError as error:  # the previous snapshot stays the latest
            _log.warning("could not save a snapshot through #%d: %s", position, error)
            return
        self._snapshot_at = (position, time.monotonic())

    # -- the folding thread ---------------------------------------------------------

    def start_folding(self):
        """Start reading the log every ``poll_interval`` seconds."""
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(
                target=self._run, name="sklocus-replica", daemon=True
            )
            self._thread.start()

    def stop_folding(self):
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self):
        while not self._stopping.is_set():
            self._wake.wait(self.poll_interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                self.follow()
            except StoreUnavailable as error:
                _log.warning("%s; routing goes on from memory", error)
            except Exception:  # the next reading tries again; the log keeps all
                _log.exception("following the store's log failed")

    def fold(self, max_outcomes=None):
        """Fold what the log holds now (a reading, without the thread)."""
        return self.follow()

    fold_all = fold

    def close(self):
        self.stop_folding()
        self.store.close()

    # -- changes, through the log ---------------------------------------------------

    def _appended(self, entries, key=None):
        try:
            return self.store.append(entries, key=key)
        except StoreUnavailable as error:
            raise RequestError(
                (),
                f"{error}; nothing of this request was kept, send it again later",
                status=503,
            ) from None

    def _await(self, entry_id):
        """Wait until this replica has folded ``entry_id``; raise its refusal."""
        with self._moved:
            self._awaited.add(entry_id)
        self._wake.set()
        deadline = time.monotonic() + self.change_timeout
        try:
            with self._moved:
                while self.position < entry_id:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise RequestError(
                            (),
                            f"the change is kept in the store's log (#{entry_id}) "
                            "and will be served; this replica has not folded it "
                            f"within {self.change_timeout:g} s",
                            status=504,
                        )
                    if self._thread is None:  # no thread: fold here
                        self._moved.release()
                        try:
                            self.follow()
                        finally:
                            self._moved.acquire()
                        continue
                    self._moved.wait(min(left, self.poll_interval))
                return self._refusals.pop(entry_id, None)
        finally:
            with self._moved:
                self._awaited.discard(entry_id)
                self._refusals.pop(entry_id, None)

    def feedback(self, outcomes, key=None):
        """Keep outcomes in the store's log; every replica learns them.

        As :meth:`RouterService.feedback`; ``key`` (an idempotency key) keeps
        a retried request once.
        """
        if not isinstance(outcomes, list | tuple):
            raise RequestError(
                ("outcomes",), f"outcomes is a {type(outcomes).__name__}; give a list"
            )
        check_item_count("outcomes", outcomes, self.max_feedback)
        rows = check_outcomes(self._router, outcomes, RequestError)
        through = self._appended([LogEntry.outcome(*row) for row in rows], key=key)
        self._last_id = max(self._last_id, through)
        return {
            "accepted": len(rows),
            "through": through,
            "pending_outcomes": self.pending_outcomes(),
        }

    def add_model(self, name, evaluations, cost=None, query_groups=None):
        check_item_count("evaluations", evaluations, self.max_evaluations)
        query_groups = self._check_evaluation_groups(
            self._router, query_groups, evaluations
        )
        self._check_new(self._router, name, cost)
        body = json.dumps(
            {"evaluations": evaluations, "cost": cost, "query_groups": query_groups}
        )
        entry_id = self._appended([LogEntry("model", model=name, body=body)])
        refusal = self._await(entry_id)
        if refusal is not None:
            raise RequestError(("evaluations",), refusal, status=409)
        return {
            "model": name,
            "n_evaluations": len(evaluations),
            "n_models": int(len(self._router.classes_)),
        }

    def remove_model(self, name):
        router = self._router
        if name not in set(router.classes_.tolist()):
            raise RequestError(("name",), f"no model {shorten(name)}", status=404)
        if len(router.classes_) == 1:
            raise RequestError(
                ("name",), f"{shorten(name)} is the last model; keep one", status=409
            )
        entry_id = self._appended([LogEntry("removal", model=name)])
        refusal = self._await(entry_id)
        if refusal is not None:
            raise RequestError(("name",), refusal, status=409)
        return {"model": name, "n_models": int(len(self._router.classes_))}

    # -- what it says of itself -------------------------------------------------

    def outcomes_learnt(self):
        """Return ``{model: count}`` of the outcomes the served router learnt."""
        return self._learnt

    def pending_outcomes(self):
        """How many entries this replica knows of and has not folded.

        The outcomes it read that wait for a fold mark, and the entries
        appended (through this replica, or seen) that it has not read yet.
        """
        return len(self._waiting) + max(0, self._last_id - self._read)

    def health(self):
        answer = super().health()
        answer.update(
            feedback=True,
            position=self.position,
            lag=self.pending_outcomes(),
            lease=self.store.holds_lease,
        )
        return answer
