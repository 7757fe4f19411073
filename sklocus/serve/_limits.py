"""What a server grants each client: connections, time, bytes, a rate and work.

A server open to a network meets clients that would exhaust it: many idle
connections, headers or bodies sent a byte at a time, large bodies without a
token, floods of requests it must refuse, batches of long texts that hold the
router. :class:`ServerLimits` says what each client may take;
:class:`ClientBudgets` keeps its rate of requests and of work, by the address
the connection comes from (never a header the client writes, such as
``X-Forwarded-For``).

A rate is kept as a debt in time (the "generic cell rate" scheme): each request
moves its client's due time ``1 / rate`` seconds on, each refusal (a 4xx, or a
connection that made no request) ``refusal_cost`` times that, and a client
whose due time lies more than ``burst / rate`` seconds ahead waits: the server
reads nothing more from it until then. A client that keeps within the rate
never waits; a flood waits in the kernel's buffers, costing the server nothing.
Work is a second debt: the queries a request asks to route or score move its
client's work due time on by the longer of ``queries / query_rate`` and
``characters / text_rate``, and a client more than a second's worth ahead
waits the same way.
"""

from __future__ import annotations

import dataclasses
import numbers
import time

from sklocus._sklearn_compat import Interval, validate_parameter_constraints

# A client's debt is capped, so that one that stops is soon served again.
_MAX_DEBT_SECONDS = 30.0
# Paid-up clients are forgotten once this many are kept.
_PRUNE_AT = 10_000
# Seconds of its work budget a client may ask for at once.
_WORK_BURST_SECONDS = 1.0
# What each limit may be: a count, a time or a size above 0, a rate of at
# least 0 (0: no limit); all finite.
_COUNT = Interval(numbers.Integral, 1, None, closed="left")
_ABOVE_ZERO = Interval(numbers.Real, 0, None, closed="neither")
_RATE = Interval(numbers.Real, 0, None, closed="left")


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """Limits a server keeps per request, per connection and per client.

    A client is an address connections come from: behind a proxy, every
    request comes from the proxy's address, so put the per-client limits in the
    proxy (and raise or turn off ``rate`` here).

    Parameters
    ----------
    max_body_bytes : int, default=8 MiB
        Largest body of a request to a route that changes the pool or what it
        learns (``POST /models``, ``POST /feedback``), which needs the token
        when the server has one; a larger one is answered 413 unread.
    max_open_body_bytes : int, default=1 MiB
        Largest body of a request to any other route (``POST /route``,
        ``POST /predict``): what anyone who can reach the server can make it
        read and parse.
    max_connections : int, default=1000
        Connections open at once. A new one over the limit closes a
        connection that waits on its client (for a request, or for the rest
        of a body) from the address that holds the most connections, the one
        that has waited longest; it is refused when every connection is busy.
    max_client_connections : int, default=64
        Connections open at once from one address; more are refused.
    header_timeout : float, default=10
        Seconds a connection has to send a request's head, from when it opens
        or its last answer was sent; it is closed then.
    body_timeout : float, default=60
        Seconds a request has to send its whole body, and the client to take
        each part of its answer as it is sent (a streamed answer, such as a
        chat completion relayed from an upstream, may last longer).
    min_body_rate : float, default=1024
        Bytes a second a request's body must come at, on average, once
        ``header_timeout`` seconds have passed since its head: a body sent a
        byte at a time (or announced with ``Expect: 100-continue`` and never
        sent) is cut off long before ``body_timeout``. 0 for no minimum.
    rate : float, default=1000
        Requests a second one address may make on average; 0 for no limit.
    query_rate : float, default=200
        Queries a second one address may have routed or scored on average
        (``POST /route``, ``POST /predict``, a chat completion's routing); 0
        for no limit.
    text_rate : float, default=200,000
        Characters of query text a second one address may have routed or
        scored on average; 0 for no limit. With ``query_rate``, one second's
        worth may come at once.
    burst : float, default=200
        Requests over the rate one address may make at once before it waits.
    refusal_cost : float, default=50
        How many requests a refused one (a 4xx of the client's making; not an
        upstream's error passed on) counts as: a client sending faults is
        slowed far sooner than one sending work.
    """

    max_body_bytes: int = 8 * 2**20
    max_open_body_bytes: int = 2**20
    max_connections: int = 1000
    max_client_connections: int = 64
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    min_body_rate: float = 1024.0
    rate: float = 1000.0
    query_rate: float = 200.0
    text_rate: float = 200_000.0
    burst: float = 200.0
    refusal_cost: float = 50.0

    # scikit-learn's constraints, as an estimator's parameters are checked.
    _parameter_constraints = {
        **dict.fromkeys(
            (
                "max_body_bytes",
                "max_open_body_bytes",
                "max_connections",
                "max_client_connections",
            ),
            [_COUNT],
        ),
        **dict.fromkeys(("header_timeout", "body_timeout", "burst"), [_ABOVE_ZERO]),
        # 0 turns these off.
        **dict.fromkeys(("min_body_rate", "rate", "query_rate", "text_rate"), [_RATE]),
        # A refusal counts as at least one request.
        "refusal_cost": [Interval(numbers.Real, 1, None, closed="left")],
    }

    def __post_init__(self):
        validate_parameter_constraints(
            self._parameter_constraints,
            dataclasses.asdict(self),
            caller_name=type(self).__name__,
        )


class ClientBudgets:
    """The rate and the work each client address has spent, as due times.

    Parameters
    ----------
    rate : float
        Requests a second; 0 keeps no budget of requests.
    burst : float
    query_rate : float, default=0
        Queries a second; 0 for no limit.
    text_rate : float, default=0
        Characters of query text a second; 0 for no limit.
    clock : callable, default=time.monotonic
    """

    def __init__(self, rate, burst, *, query_rate=0, text_rate=0, clock=time.monotonic):
        self.rate = rate
        self.burst = burst
        self.query_rate = query_rate
        self.text_rate = text_rate
        self.clock = clock
        self._requests = _Debts(burst / rate if rate else 0.0, clock)
        self._work = _Debts(_WORK_BURST_SECONDS, clock)

    def charge(self, client, requests=1.0):
        """Count ``requests`` (a refusal counts as several) against ``client``."""
        if self.rate:
            self._requests.add(client, requests / self.rate)

    def charge_work(self, client, queries, characters):
        """Count ``queries`` of ``characters`` in all against ``client``."""
        seconds = max(
            queries / self.query_rate if self.query_rate else 0.0,
            characters / self.text_rate if self.text_rate else 0.0,
        )
        if seconds:
            self._work.add(client, seconds)

    def over_rate(self, client):
        """Whether ``client`` is over its rate of requests (its work aside)."""
        return self._requests.wait(client) > 0

    def wait(self, client):
        """Seconds ``client`` must wait before it is read again (0: none)."""
        return max(self._requests.wait(client), self._work.wait(client))


class _Debts:
    """Each client's due time, and how far ahead of the clock it may be."""

    def __init__(self, tolerance, clock):
        self.tolerance = tolerance
        self.clock = clock
        self._due = {}

    def add(self, client, seconds):
        now = self.clock()
        due = max(self._due.get(client, now), now) + seconds
        self._due[client] = min(due, now + _MAX_DEBT_SECONDS)
        if len(self._due) > _PRUNE_AT:
            self._due = {key: when for key, when in self._due.items() if when > now}

    def wait(self, client):
        due = self._due.get(client)
        if due is None:
            return 0.0
        return max(0.0, due - self.clock() - self.tolerance)
