"""The router thread: where every service computes, in fair turns.

Where the work runs: torch's OpenMP runtime (libgomp) keeps a pool of worker
threads for each thread that calls it, and once a process holds more of those
threads than it has cores, the workers stop spinning between operations and
sleep, so each of the hundreds of small operations of an encoded query waits
for a wake-up. On two cores, a second thread calling torch is enough: routing
one query took 1.3 to 1.5 times as long in ``sklocus serve`` (warmed up on its
main thread, then answering on FastAPI's worker threads) as in process. So
routing, prediction and the warm-up run on one thread, the router thread,
shared by every service of the process and taking one call at a time (a call
already uses every core through torch's own threads); an onboarding computes
on a thread of its own that ends with it, which hands its OpenMP pool back. A
thread that ran torch before serving and lives on (the main thread that fitted
the router, say) keeps its pool, and the router thread's is then a second one;
so ``sklocus serve EMBEDDER EVALS`` builds its router on the router thread.

Who goes next: one thread shared by every client must not be held by one of
them. Work comes as *turns*: a generator whose every ``yield`` is a point where
the thread may turn to someone else (a routing yields between slices of a few
queries). Turns are ordered by start-time fair queueing (Goyal, Vin and Cheng,
1996), by client (an address): each client has a finish tag, the virtual time
at which its turns so far would have ended were the thread shared equally by
the clients with work waiting. A client's next turn starts at the later of its
finish tag and the virtual time (the start of the turn being computed), and
the next turn goes to the client whose turn would end first: its start plus
how long its turns have been taking (for a client not seen of late, as long as
clients' turns have been taking). So a client with work after a pause starts
at the present, neither banking the time it did not use nor paying for time it
used while no one else wanted the thread; a client sending one query now and
then waits for at most the turn being computed, however much others have
queued; and clients that keep the thread busy share it equally, the shorter
turns first. A client's own work is done in the order it came, and work whose
caller has given up (its future cancelled) is dropped at its next turn, never
computed.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import itertools
import os
import threading
import time
from concurrent.futures import Future

# Clients whose finish tags the virtual time has passed are forgotten once
# this many are kept (they would start at the virtual time anyway).
_PRUNE_AT = 1_000
# The weight of each client turn in the typical length of one.
_TYPICAL_WEIGHT = 0.1


def one_turn(function, /, *args, **kwargs):
    """Return turns that compute ``function(*args, **kwargs)`` in one turn."""
    return function(*args, **kwargs)
    yield  # a generator: its one turn ends with its return  # noqa: B901


class _Work:
    """One caller's turns, and the future its answer goes to."""

    __slots__ = ("future", "order", "turns")

    def __init__(self, turns, order):
        self.turns = turns
        self.future = Future()
        self.order = order

    def take_turn(self):
        """Compute the next turn; return True when the work is done."""
        if self.future.cancelled():
            self.turns.close()
            return True
        try:
            next(self.turns)
        except StopIteration as stop:
            if self.future.set_running_or_notify_cancel():
                self.future.set_result(stop.value)
            return True
        except BaseException as error:  # noqa: BLE001 (the caller's to see)
            if self.future.set_running_or_notify_cancel():
                self.future.set_exception(error)
            return True
        return False


class RouterThread:
    """The one thread on which services compute, one turn at a time.

    See the module's docstring for why one, and who goes next.
    :meth:`submit_turns` queues a client's work and returns its future;
    :meth:`run_turns` waits for it, or runs it at once when already on the
    router thread; :meth:`submit`, :meth:`call` and :meth:`wait` do the same
    for one call, in one turn.
    """

    def __init__(self):
        self._forget()
        if hasattr(os, "register_at_fork"):
            # A forked child has the queues but not the thread: start anew.
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self):
        self._lock = threading.Condition()
        self._thread = None
        self._ident = None
        self._queues = {}  # client -> deque of _Work, the oldest first
        self._virtual = 0.0  # the start tag of the turn being computed
        self._finish = {}  # client -> its finish tag
        self._turn_seconds = {}  # client -> how long its turns take, of late
        self._typical_turn = 0.0  # how long clients' turns take, of late
        self._arrivals = itertools.count()

    # -- queuing ------------------------------------------------------------------

    def submit_turns(self, turns, *, client=None):
        """Queue ``turns`` (a generator) for ``client``; return its future.

        Cancelling the future before the work is done drops the work at its
        next turn. ``client`` is any hashable: the address a request came
        from; None for the process's own work.

        Returns
        -------
        concurrent.futures.Future
        """
        if not inspect.isgenerator(turns):
            raise TypeError(f"turns must be a generator; got {type(turns).__name__}")
        with self._lock:
            work = _Work(turns, next(self._arrivals))
            self._queues.setdefault(client, collections.deque()).append(work)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="sklocus-router", daemon=True
                )
                self._thread.start()
            self._lock.notify()
        return work.future

    def submit(self, function, /, *args, **kwargs):
        """Queue ``function(*args, **kwargs)`` as the process's own, one turn."""
        return self.submit_turns(one_turn(function, *args, **kwargs))

    def run_turns(self, turns, *, client=None):
        """Return what ``turns`` return, computed on the router thread."""
        if threading.get_ident() == self._ident:
            while True:
                try:
                    next(turns)
                except StopIteration as stop:
                    return stop.value
        return self.submit_turns(turns, client=client).result()

    def call(self, function, /, *args, **kwargs):
        """Return ``function(*args, **kwargs)``, computed on the router thread."""
        return self.run_turns(one_turn(function, *args, **kwargs))

    async def wait_turns(self, turns, *, client=None):
        """Await what ``turns`` return, computed on the router thread.

        The event loop goes on meanwhile; under another event loop than
        asyncio's (trio), the wait itself takes a worker thread. Cancelling
        the wait drops the work at its next turn.
        """
        future = self.submit_turns(turns, client=client)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            import anyio

            return await anyio.to_thread.run_sync(future.result)
        return await asyncio.wrap_future(future)

    async def wait(self, function, /, *args, **kwargs):
        """Await ``function(*args, **kwargs)``, computed on the router thread."""
        return await self.wait_turns(one_turn(function, *args, **kwargs))

    # -- the thread ---------------------------------------------------------------

    def _serve(self):
        self._ident = threading.get_ident()
        while True:
            with self._lock:
                while not self._queues:
                    self._lock.wait()
                client = self._next_client()
                work = self._queues[client][0]
                start_tag = self._virtual = self._start_tag(client)
            start = time.perf_counter()
            done = work.take_turn()
            took = time.perf_counter() - start
            with self._lock:
                self._served(client, start_tag, took)
                if done:
                    queue = self._queues[client]
                    queue.popleft()
                    if not queue:
                        del self._queues[client]

    def _start_tag(self, client):
        return max(self._virtual, self._finish.get(client, 0.0))

    def _next_client(self):
        """Return the client whose next turn would end first (oldest on a tie)."""
        typical = self._typical_turn
        return min(
            self._queues,
            key=lambda client: (
                self._start_tag(client) + self._turn_seconds.get(client, typical),
                self._queues[client][0].order,
            ),
        )

    def _served(self, client, start_tag, seconds):
        """Count a turn of ``seconds`` that started at ``start_tag``."""
        self._finish[client] = start_tag + seconds
        typical = self._turn_seconds.get(client, seconds)
        self._turn_seconds[client] = (typical + seconds) / 2
        if client is not None:  # the process's own work (a warm-up) aside
            self._typical_turn += _TYPICAL_WEIGHT * (seconds - self._typical_turn)
        if len(self._finish) > _PRUNE_AT:
            self._finish = {
                key: tag
                for key, tag in self._finish.items()
                if tag > self._virtual or key in self._queues
            }
            self._turn_seconds = {
                key: self._turn_seconds[key]
                for key in self._finish
                if key in self._turn_seconds
            }


router_thread = RouterThread()
