"""Connections held to :class:`~sklocus.serve.ServerLimits`, below HTTP.

uvicorn reads each connection with an :class:`asyncio.Protocol`.
:class:`ConnectionGuard` wraps that protocol in a :class:`GuardedConnection`,
which

- admits a connection or refuses it (too many from its address; too many in
  all, when none waits idle to be closed in its place: first one that has
  never sent a request, then the one idle longest);
- gives each phase of a connection a deadline: a request's head within
  ``header_timeout`` of the connection opening or the last answer, its body
  and the sending of each part of its answer within ``body_timeout`` (the
  time the server takes to make a part is its own); a connection past its
  deadline is closed, however slowly it trickles;
- stops reading a client over its rate (:class:`~sklocus.serve._limits.
  ClientBudgets`) until it is within it again, so that a flood costs the
  event loop nothing while it waits.

The HTTP side (:mod:`sklocus.serve._gate`) tells the connection when a request
starts, when its body is in and when its answer is sent, through
:data:`current_connection`, which uvicorn's request task inherits.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import logging

from sklocus.serve._limits import ClientBudgets

logger = logging.getLogger("sklocus.serve")

# The connection whose bytes are being read: set while uvicorn's protocol
# reads them, so the request task it starts carries it.
current_connection = contextvars.ContextVar("sklocus_connection", default=None)


class ConnectionGuard:
    """Connections and rates of one server, held to ``limits``.

    Parameters
    ----------
    limits : ServerLimits
    """

    def __init__(self, limits):
        self.limits = limits
        self.budgets = ClientBudgets(limits.rate, limits.burst)
        self._open = 0
        self._per_client = collections.Counter()
        # Connections waiting for a request, the longest waiting first: those
        # that never sent one apart, as the first to close for a newcomer.
        self._unused = collections.OrderedDict()
        self._idle = collections.OrderedDict()

    def protocol(self, inner):
        """Wrap a protocol class (or factory) so its connections are guarded.

        The inner protocol is made when the first bytes arrive: a connection
        that never sends any costs only its guard.
        """

        def guarded(**kwargs):
            return GuardedConnection(self, functools.partial(inner, **kwargs))

        return guarded

    def admit(self, connection):
        """Count a new connection in, or return False to refuse it."""
        limits, client = self.limits, connection.client
        self.budgets.charge(client)
        if self.budgets.wait(client):
            logger.warning("refused a connection from %s: it is over its rate", client)
            return False
        if self._per_client[client] >= limits.max_client_connections:
            logger.warning(
                "refused a connection from %s: it has %d open, the most one "
                "address may have",
                client,
                limits.max_client_connections,
            )
            self.budgets.charge(client, limits.refusal_cost)
            return False
        if self._open >= limits.max_connections:
            waiting = self._unused or self._idle
            if not waiting:
                logger.warning(
                    "refused a connection from %s: %d are open and busy",
                    client,
                    self._open,
                )
                return False
            longest = next(iter(waiting))
            logger.warning(
                "closed an idle connection from %s to admit one: %d are open",
                longest.client,
                self._open,
            )
            longest.close()
        self._open += 1
        self._per_client[client] += 1
        self._unused[connection] = None
        return True

    def release(self, connection):
        """Count a closed connection out."""
        self.busy(connection)
        self._open -= 1
        self._per_client[connection.client] -= 1
        if not self._per_client[connection.client]:
            del self._per_client[connection.client]

    def busy(self, connection):
        """Mark a connection as answering: it is not closed for a newcomer."""
        self._unused.pop(connection, None)
        self._idle.pop(connection, None)

    def idle(self, connection):
        """Mark a connection as waiting for its next request, the latest to."""
        self._idle[connection] = None


class _ReadControl:
    """The transport uvicorn sees: its pauses of reading kept apart from ours."""

    def __init__(self, transport, connection):
        self._transport = transport
        self._connection = connection

    def pause_reading(self):
        self._connection.paused_by_server = True
        self._transport.pause_reading()

    def resume_reading(self):
        self._connection.paused_by_server = False
        if not self._connection.throttled:
            self._transport.resume_reading()

    def __getattr__(self, name):
        return getattr(self._transport, name)


class GuardedConnection(asyncio.Protocol):
    """One connection, read through uvicorn's protocol within the guard's limits.

    Parameters
    ----------
    guard : ConnectionGuard
    make_inner : callable
        Makes uvicorn's protocol for the connection.
    """

    def __init__(self, guard, make_inner):
        self.guard = guard
        self.make_inner = make_inner
        self.inner = None
        self.client = None
        self.transport = None
        self.admitted = False
        self.throttled = False
        self.paused_by_server = False
        self.requests = 0
        self._held = []
        self._phase = None  # (seconds, what is due) or None while answering
        self._deadline = None
        self._resume = None

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = peer[0] if isinstance(peer, tuple | list) else str(peer)
        if not self.guard.admit(self):
            transport.abort()
            return
        self.admitted = True
        self._expect(self.guard.limits.header_timeout, "no complete request head")

    def data_received(self, data):
        if not self.admitted:
            return
        if self.throttled or self.guard.budgets.wait(self.client):
            self._hold(data)
        else:
            self._read(data)

    def eof_received(self):
        if self.admitted and not self.throttled and self.inner is not None:
            return self.inner.eof_received()
        return None

    def connection_lost(self, exc):
        self._forget(exc)

    def pause_writing(self):
        if self.inner is not None:
            self.inner.pause_writing()

    def resume_writing(self):
        if self.inner is not None:
            self.inner.resume_writing()

    # -- told by the HTTP side ----------------------------------------------------

    def request_started(self, has_body):
        """Count a request in: its body is due now, or nothing while it is answered."""
        self.requests += 1
        self.guard.busy(self)
        self.guard.budgets.charge(self.client)
        due = self.guard.limits.body_timeout if has_body else None
        self._expect(due, "no complete request body")

    def body_received(self):
        self._expect(None)

    def answer_sending(self):
        """Give the client ``body_timeout`` to take the part of the answer sent now."""
        self._expect(self.guard.limits.body_timeout, "its answer not taken")

    def answer_waiting(self):
        """Set no deadline while the server makes the answer's next part.

        A streamed answer (a chat completion relayed from an upstream) may wait
        on its source for longer than a client may take to read a part; the
        source has a timeout of its own.
        """
        self._expect(None)

    def answer_sent(self, refused):
        """Count an answer out: the next request's head is due now.

        ``refused``: the answer refused the client's request (a 4xx of its
        making), charged as ``refusal_cost`` requests.
        """
        if refused:
            self.guard.budgets.charge(self.client, self.guard.limits.refusal_cost)
        if self.admitted:
            self.guard.idle(self)
            self._expect(self.guard.limits.header_timeout, "no complete request head")

    def close(self):
        """Close at once (its deadline passed, or another needs its place)."""
        self._forget(None)
        self.transport.abort()

    # -- inside -------------------------------------------------------------------

    def _forget(self, exc):
        self._expect(None)
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if not self.admitted:
            return
        self.admitted = False
        self.guard.release(self)
        if not self.requests:  # refused by the HTTP parser, or idle
            self.guard.budgets.charge(self.client, self.guard.limits.refusal_cost)
        if self.inner is not None:
            self.inner.connection_lost(exc)

    def _read(self, data):
        if self.inner is None:
            self.inner = self.make_inner()
            self.inner.connection_made(_ReadControl(self.transport, self))
        token = current_connection.set(self)
        try:
            self.inner.data_received(data)
        finally:
            current_connection.reset(token)

    def _hold(self, data):
        self._held.append(data)
        if self.throttled:
            return
        self.throttled = True
        self.transport.pause_reading()
        self._disarm()  # the wait is the server's doing, not a deadline missed
        self._wait_then_read()

    def _wait_then_read(self):
        wait = self.guard.budgets.wait(self.client)
        if wait:
            loop = asyncio.get_running_loop()
            self._resume = loop.call_later(wait, self._wait_then_read)
            return
        self._resume = None
        self.throttled = False
        held, self._held = b"".join(self._held), []
        if not self.paused_by_server:
            self.transport.resume_reading()
        self._arm()
        self._read(held)

    def _expect(self, seconds, what=None):
        """Close the connection unless ``what`` is in within ``seconds``."""
        self._phase = None if seconds is None else (seconds, what)
        self._disarm()
        if not self.throttled:
            self._arm()

    def _arm(self):
        self._disarm()
        if self._phase is not None and self.admitted:
            seconds, what = self._phase
            loop = asyncio.get_running_loop()
            self._deadline = loop.call_later(seconds, self._late, seconds, what)

    def _disarm(self):
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self, seconds, what):
        self._deadline = None
        logger.warning(
            "closed a connection from %s: %s within %g s", self.client, what, seconds
        )
        self.close()
