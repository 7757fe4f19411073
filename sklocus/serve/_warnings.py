"""Warnings and log lines a client can provoke, shown at most once a while.

Some warnings are raised by what a request holds: SentenceEncoder warns when
every query of a request looks like an id, and names one of them. A client
could write a warning line (and, with Python's default filter, one entry of a
registry that is never emptied) per request. :class:`WarningLimit` shows a
warning from a given place in the code at most once per ``interval`` seconds,
and says how many it held back.

Log lines too: uvicorn logs each request it cannot parse, asyncio each failed
``accept``, the access log each refused request, the connection guard each
connection it closes. :class:`LogLimit` lets through one line of a kind a while
(of a kind: the same message from the same logger; for the access log, the
same client address and status), so that a flood writes a few lines a minute.
"""

from __future__ import annotations

import contextlib
import logging
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


# Loggers a client can make write: uvicorn's parser and access log, asyncio's
# accept loop, the connection guard.
_CLIENT_LOGGERS = (
    "uvicorn.error",
    "uvicorn.access",
    "asyncio",
    "sklocus.serve",
    # An upstream that is down would log a line per chat request.
    "sklocus.serve.proxy",
)
_MAX_KINDS = 10_000


class LogLimit(logging.Filter):
    """A logging filter that lets through one record of a kind per ``interval``.

    A record's kind is its logger, level and message template (its first line,
    for messages that carry a varying tail); for the access log, the client's
    address and the status, and only answers of 400 or more are limited. A
    record let through after others of its kind were held back says how many.

    Parameters
    ----------
    interval : float, default=60
        Seconds between two records of one kind.
    clock : callable, default=time.monotonic
    """

    def __init__(self, interval=60.0, *, clock=time.monotonic):
        super().__init__()
        self.interval = interval
        self.clock = clock
        self._shown = {}  # kind -> (when shown, records held back since)
        self._lock = threading.Lock()

    def filter(self, record):
        """Let the record through, or count it as a repeat."""
        kind = self._kind(record)
        if kind is None:
            return True
        now = self.clock()
        with self._lock:
            when, held = self._shown.get(kind, (None, 0))
            if when is not None and now - when < self.interval:
                self._shown[kind] = (when, held + 1)
                return False
            if len(self._shown) >= _MAX_KINDS:
                self._shown = {
                    key: seen
                    for key, seen in self._shown.items()
                    if now - seen[0] < self.interval
                }
            self._shown[kind] = (now, 0)
        if held:
            note = (
                f" [{held:,} more like this in the last {now - when:.0f} s were "
                "not logged]"
            )
            if record.name == "uvicorn.access":
                # Its formatter unpacks the arguments: the note goes in the path.
                client, method, path, version, status = record.args
                record.args = (client, method, path + note, version, status)
            else:
                record.msg = record.getMessage() + note
                record.args = None
        return True

    @staticmethod
    def _kind(record):
        if record.name == "uvicorn.access":
            arguments = record.args
            if not isinstance(arguments, tuple) or len(arguments) != 5:
                return None
            client, status = str(arguments[0]), arguments[4]
            if not isinstance(status, int) or status < 400:
                return None
            return (record.name, client.rsplit(":", 1)[0], status)
        first_line = str(record.msg).split("\n", 1)[0][:200]
        return (record.name, record.levelno, first_line)


@contextlib.contextmanager
def limited_logs(interval=60.0, loggers=_CLIENT_LOGGERS):
    """Let through one record of a kind per ``interval`` from ``loggers``.

    Parameters
    ----------
    interval : float, default=60
    loggers : sequence of str
        Names of the loggers to limit (a filter acts on its own logger's
        records only, not its children's).
    """
    limit = LogLimit(interval)
    targets = [logging.getLogger(name) for name in loggers]
    for logger in targets:
        logger.addFilter(limit)
    try:
        yield limit
    finally:
        for logger in targets:
            logger.removeFilter(limit)
