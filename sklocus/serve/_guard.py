"""Connections held to :class:`~sklocus.serve.ServerLimits`, below HTTP.

uvicorn reads each connection with an :class:`asyncio.Protocol`.
:class:`ConnectionGuard` wraps that protocol in a :class:`GuardedConnection`,
which

- admits a connection or refuses it (too many from its address; too many in
  all, when none waits on its client to be closed in its place: one from the
  address that holds the most connections, that never sent a request, then
  one sending a body, then one idle between requests, the longest waiting
  first);
- gives each phase of a connection a deadline: a request's head within
  ``header_timeout`` of the connection opening or the last answer, its body
  within ``body_timeout`` and, past ``header_timeout``, at ``min_body_rate``
  on average, and the sending of each part of its answer within
  ``body_timeout`` (the time the server takes to make a part is its own); a
  connection past its deadline is closed, however slowly it trickles;
- stops reading a client over its rate of requests or of work
  (:class:`~sklocus.serve._limits.ClientBudgets`, :func:`charge_work`) until
  it is within it again, so that a flood costs the event loop nothing while
  it waits; its deadline keeps running meanwhile.

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


def client_of(scope):
    """Return the address a request came from: the key of its fair share."""
    client = scope.get("client")
    return client[0] if client else None


def charge_work(queries):
    """Count the queries a request asks to route or score against its client.

    Called from the request's task; outside a guarded connection (a test
    client), nothing is counted.
    """
    connection = current_connection.get()
    if connection is not None and connection.admitted:
        characters = sum(len(query) for query in queries if isinstance(query, str))
        connection.guard.budgets.charge_work(
            connection.client, len(queries), characters
        )


# Why a connection waits on its client, in the order a newcomer closes them
# (among one address's): it never sent a request, it is sending a body, or it
# is idle between requests.
_UNUSED, _SENDING_BODY, _IDLE = 0, 1, 2


class ConnectionGuard:
    """Connections and rates of one server, held to ``limits``.

    Parameters
    ----------
    limits : ServerLimits
    """

    def __init__(self, limits):
        self.limits = limits
        self.budgets = ClientBudgets(
            limits.rate,
            limits.burst,
            query_rate=limits.query_rate,
            text_rate=limits.text_rate,
        )
        self._open = 0
        self._per_client = {}  # address -> connections open
        # Addresses by how many connections each holds, in the order each
        # came to that many.
        self._holding = collections.defaultdict(dict)
        # Connections waiting on their client (for a request, or the rest of
        # a body) and why: those a newcomer may take the place of. By address
        # and why, the longest waiting first.
        self._waiting = {}
        self._waiting_of = {}

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
        # Over its work budget, a client's new connections wait to be read,
        # as its open ones do; over its rate of requests, they are refused.
        if self.budgets.over_rate(client):
            logger.warning("refused a connection from %s: it is over its rate", client)
            return False
        if self._per_client.get(client, 0) >= limits.max_client_connections:
            logger.warning(
                "refused a connection from %s: it has %d open, the most one "
                "address may have",
                client,
                limits.max_client_connections,
            )
            self.budgets.charge(client, limits.refusal_cost)
            return False
        if self._open >= limits.max_connections:
            making_way = self._making_way()
            if making_way is None:
                logger.warning(
                    "refused a connection from %s: %d are open and busy",
                    client,
                    self._open,
                )
                return False
            logger.warning(
                "closed a connection from %s waiting on its client, to admit one: "
                "%d are open",
                making_way.client,
                self._open,
            )
            making_way.close()
        self._open += 1
        self._count(client, 1)
        self._wait(connection, _UNUSED)
        return True

    def _making_way(self):
        """Return the connection a newcomer closes, or None when all are busy.

        One waiting on its client, from the address that holds the most
        connections (a flood's, rather than a client's kept connection): of
        those, one that never sent a request, then one sending a body, then
        an idle one, the longest waiting first. It takes a step for each
        count of connections an address holds (at most
        ``max_client_connections``), not for each connection: it runs for
        every newcomer while a flood fills the server.
        """
        for count in sorted(self._holding, reverse=True):
            holding = self._holding[count]
            for why in (_UNUSED, _SENDING_BODY, _IDLE):
                for client in holding:
                    waiting = self._waiting_of.get(client)
                    if waiting is not None and waiting[why]:
                        return next(iter(waiting[why]))
        return None

    def release(self, connection):
        """Count a closed connection out."""
        self.busy(connection)
        self._open -= 1
        self._count(connection.client, -1)

    def busy(self, connection):
        """Mark a connection as answering: it is not closed for a newcomer."""
        why = self._waiting.pop(connection, None)
        if why is None:
            return
        waiting = self._waiting_of[connection.client]
        del waiting[why][connection]
        if not any(waiting):
            del self._waiting_of[connection.client]

    def sending_body(self, connection):
        """Mark a connection as waiting for the rest of a request's body."""
        self.busy(connection)
        self._wait(connection, _SENDING_BODY)

    def idle(self, connection):
        """Mark a connection as waiting for its next request, the latest to."""
        self.busy(connection)
        self._wait(connection, _IDLE)

    def _wait(self, connection, why):
        self._waiting[connection] = why
        waiting = self._waiting_of.setdefault(connection.client, ({}, {}, {}))
        waiting[why][connection] = None

    def _count(self, client, change):
        """Count ``change`` connections more from ``client``."""
        count = self._per_client.pop(client, 0)
        if count:
            del self._holding[count][client]
            if not self._holding[count]:
                del self._holding[count]
        count += change
        if count:
            self._per_client[client] = count
            self._holding[count][client] = None


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
        # (when it is due, what is due) or None while the server answers.
        self._phase = None
        # [when its head came, bytes since] while a request's body comes.
        self._body = None
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
        if self._body is not None:
            self._body[1] += len(data)
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
        self.guard.budgets.charge(self.client)
        if has_body:
            self.guard.sending_body(self)
            self._body = [asyncio.get_running_loop().time(), 0]
            self._expect_body()
        else:
            self.guard.busy(self)
            self._expect(None)

    def body_received(self):
        """Count the body in: the server answers now, with no deadline."""
        self._body = None
        self.guard.busy(self)
        self._expect(None)

    def answer_sending(self):
        """Give the client ``body_timeout`` to take the part of the answer sent now."""
        if self._body is not None:  # answered before its body was read
            self._body = None
            self.guard.busy(self)
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
        # The deadline keeps running: a client over its rate gets no more time
        # to send what is due than one within it.
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
        self._read(held)

    def _expect(self, seconds, what=None):
        """Close the connection unless ``what`` is in within ``seconds``."""
        if seconds is None:
            self._phase = None
        else:
            due = asyncio.get_running_loop().time() + seconds
            self._phase = (due, f"{what} within {seconds:g} s")
        self._arm()

    def _expect_body(self):
        """Close the connection unless its body keeps the minimum rate.

        The body is due within ``body_timeout`` of its head, and, past
        ``header_timeout``, at ``min_body_rate`` bytes a second on average.
        """
        limits = self.guard.limits
        started, received = self._body
        due = started + limits.body_timeout
        what = f"no complete request body within {limits.body_timeout:g} s"
        if limits.min_body_rate:
            paced = started + limits.header_timeout + received / limits.min_body_rate
            if paced < due:
                due = paced
                what = (
                    f"a request body slower than {limits.min_body_rate:g} bytes a "
                    "second"
                )
        self._phase = (due, what)
        self._arm()

    def _arm(self):
        self._disarm()
        if self._phase is not None and self.admitted:
            due, _ = self._phase
            self._deadline = asyncio.get_running_loop().call_at(due, self._late)

    def _disarm(self):
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self):
        self._deadline = None
        if self._body is not None:
            self._expect_body()  # the bytes that came since may move it on
            due, _ = self._phase
            if due > asyncio.get_running_loop().time():
                return
        _, what = self._phase
        logger.warning("closed a connection from %s: %s", self.client, what)
        self.close()
