"""Leave a failing router alone for a while: a circuit breaker.

A served router that accepts connections and never answers would otherwise
cost every gateway request the plugin's full timeout. :class:`CircuitBreaker`
remembers failures: after one, the router is not asked again for
``cooldown`` seconds (requests are routed by the gateway's own strategy
meanwhile); then one request tries it, and a further failure doubles the wait,
up to ``max_cooldown``. A success forgets the failures.
"""

from __future__ import annotations

import time


class CircuitBreaker:
    """When a failing service may be tried again.

    Parameters
    ----------
    cooldown : float
        Seconds after a first failure before the service is tried again.
    max_cooldown : float
        Longest wait, however many failures came in a row.
    clock : callable, default=time.monotonic
    """

    def __init__(self, cooldown, max_cooldown, *, clock=time.monotonic):
        self.cooldown = cooldown
        self.max_cooldown = max_cooldown
        self.clock = clock
        self.failures = 0
        self._closed_until = -float("inf")

    def wait(self):
        """Seconds before the service may be asked (0: ask it now).

        A call that is let through after a cool-down is the one trial: others
        wait for its outcome (as long as another cool-down, at most).
        """
        now = self.clock()
        if now < self._closed_until:
            return self._closed_until - now
        if self.failures:
            self._closed_until = now + self._current()
        return 0.0

    def failed(self):
        """Count a failure: the service is left alone for the next cool-down."""
        self.failures += 1
        self._closed_until = self.clock() + self._current()

    def succeeded(self):
        """Forget the failures."""
        self.failures = 0
        self._closed_until = -float("inf")

    def _current(self):
        doublings = max(self.failures - 1, 0)
        return min(self.cooldown * 2.0 ** min(doublings, 30), self.max_cooldown)
