"""Warnings a client can provoke, shown at most once a while: no log flooding.

Some warnings are raised by what a request holds: SentenceEncoder warns when
every query of a request looks like an id, and names one of them. A client
could write a warning line (and, with Python's default filter, one entry of a
registry that is never emptied) per request. :class:`WarningLimit` shows a
warning from a given place in the code at most once per ``interval`` seconds,
and says how many it held back.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings

# A warning can quote a query of 20,000 characters; the log gets its start.
_MESSAGE_CHARS = 500


class WarningLimit:
    """A ``warnings.showwarning`` that shows each source at most once a while.

    Warnings from the same place (category, file and line), whatever their
    text, count as repeats: the first is shown, later ones within ``interval``
    seconds are counted, and the next one shown says how many were held back.

    Parameters
    ----------
    interval : float, default=60
        Seconds between two warnings shown from one place.
    show : callable, default=None
        What shows a warning, with the signature of ``warnings.showwarning``;
        the one installed when the limit is built by default.
    clock : callable, default=time.monotonic
    """

    def __init__(self, interval=60.0, *, show=None, clock=time.monotonic):
        self.interval = interval
        self.show = warnings.showwarning if show is None else show
        self.clock = clock
        self._shown = {}  # place -> (when shown, repeats held back since)
        self._lock = threading.Lock()

    def __call__(self, message, category, filename, lineno, file=None, line=None):
        """Show the warning, or count it as a repeat."""
        place = (category, filename, lineno)
        now = self.clock()
        with self._lock:
            when, held = self._shown.get(place, (None, 0))
            if when is not None and now - when < self.interval:
                self._shown[place] = (when, held + 1)
                return
            self._shown[place] = (now, 0)
        text = str(message)
        if len(text) > _MESSAGE_CHARS:
            text = f"{text[:_MESSAGE_CHARS]}... ({len(text):,} characters)"
        if held:
            text += (
                f" [{held:,} more like this in the last {now - when:.0f} s "
                "were not shown]"
            )
        self.show(text, category, filename, lineno, file, line)


@contextlib.contextmanager
def limited_warnings(interval=60.0):
    """Show user warnings at most once per ``interval`` seconds per place.

    Parameters
    ----------
    interval : float, default=60
    """
    with warnings.catch_warnings():
        # "always" rather than the default, which keeps each distinct message
        # in a registry for ever: a leak when messages quote requests.
        warnings.simplefilter("always", UserWarning)
        warnings.showwarning = WarningLimit(interval)
        yield
