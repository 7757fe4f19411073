"""How sklocus reports on long steps: on standard error, drawn or in plain lines.

Standard output is left to the data a command writes. On a terminal the step in
progress is one line redrawn in place, at least once a second, so that nothing
sits still for long even while one unit of work lasts; in a log file or a pipe
each redraw would stay as one more line, so there a step writes a few plain
lines instead. Steps nest: the innermost one running draws, and when it ends
its outer step takes up the line again.
"""

from __future__ import annotations

import os
import sys
import threading
import time

# In plain lines, a step writes a line when another tenth of it is done, or when
# nothing has been written for this many seconds, whichever comes first: a log
# shows that a long step still moves without filling with lines.
_LINE_FRACTION = 0.1
_LINE_SECONDS = 10.0
# Least seconds between two redraws on a terminal.
_REDRAW_SECONDS = 0.1
# On a terminal, the line of the step in progress is redrawn with its time when
# nothing has been written for this many seconds, however long a unit lasts.
_TICK_SECONDS = 1.0
# How often the thread that keeps the line moving looks at it.
_TICKER_SECONDS = 0.2
# A status (a step with no count) shows on a terminal once it has lasted this
# long; in plain lines, once it has lasted _LINE_SECONDS.
_STATUS_DELAY = 0.5


def on_terminal():
    """Whether standard error is a terminal, where progress bars are drawn.

    A bar redraws itself with carriage returns; in a log file or a pipe each redraw
    would stay as one more line, so elsewhere sklocus draws none.
    """
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


class _Screen:
    """What the steps in progress share: standard error's last line, and a ticker.

    ``steps`` are the running steps, innermost last; ``width`` is that of the
    line drawn on a terminal and not yet ended (0 when none is); ``last`` is
    when anything was last written.
    """

    def __init__(self):
        self.lock = threading.RLock()
        self.steps = []
        self.width = 0
        self.last = time.monotonic()
        self.ticker = None

    def write(self, text):
        stream = sys.stderr
        if stream is not None:
            stream.write(text)
            stream.flush()
        self.last = time.monotonic()

    def draw(self, line):
        """Draw ``line`` over the terminal's line in progress."""
        self.write(f"\r{line.ljust(self.width)}")
        self.width = len(line)

    def end(self, line=None, *, keep=False):
        """End the terminal's line: ``line`` written over it, kept, or cleared."""
        if line is not None:
            self.write(f"\r{line.ljust(self.width)}\n")
        elif keep:
            self.write("\n")
        elif self.width:
            self.write(f"\r{' ' * self.width}\r")
        self.width = 0

    def start_ticker(self):
        if self.ticker is None:
            self.ticker = threading.Thread(
                target=self._tick, name="sklocus-progress", daemon=True
            )
            self.ticker.start()

    def _tick(self):
        while True:
            time.sleep(_TICKER_SECONDS)
            with self.lock:
                now = time.monotonic()
                # The innermost step showing keeps the line moving; one still
                # within its delay leaves that to the step around it.
                for step in reversed(self.steps):
                    if step._tick(now):
                        break


_screen = _Screen()


def _after_fork():
    # A child process starts with no ticker, and with a lock no thread holds.
    global _screen
    _screen = _Screen()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def say(message):
    """Write one line on standard error, leaving standard output to the data.

    A step's line drawn on a terminal is cleared first; the step draws it again
    below.
    """
    with _screen.lock:
        _screen.end()
        _screen.write(f"{message}\n")


class Progress:
    """Report how far a step has come, on standard error; a context manager.

    On a terminal, one line redrawn in place as the work advances, and with the
    time taken at least once a second while it lasts, ending with the count
    and the seconds taken. Elsewhere (a log file, a pipe), plain lines: one
    when the step starts, one each time another tenth is done or nothing was
    written for 10 seconds, and one at the end with the count and the seconds
    taken. A step that fails or is interrupted ends the terminal's line and
    writes no end.

    Parameters
    ----------
    label : str
        What the step does, such as ``"Encoding query texts"``.
    total : int
        Units of work in the step.
    unit : str
        Their name in the singular, such as ``"text"``; counts other than one
        add an "s" ("es" after s, x, ch and sh: ``"batch"``, ``"batches"``).
    delay : float, default=0.0
        Seconds during which nothing is shown: a step done sooner says nothing,
        a longer one starts reporting then.
    log_delay : float or None, default=None
        The same in plain lines, where ``None`` is ``delay``: a step repeated
        many times (an epoch) may be worth a redrawn line on a terminal, which
        leaves no trace, but not a few lines in a log each time.
    says_end : bool, default=True
        ``False`` leaves the end to what follows (a table row that says the
        time): the terminal's line is cleared, and a log gets no end line.
    enabled : bool, default=True
        ``False`` shows nothing at all, so that callers need no second path.

    See Also
    --------
    status : A step that counts nothing, only its time.

    Examples
    --------
    >>> from sklocus._progress import Progress
    >>> with Progress("Counting", 3, "number", enabled=False) as progress:
    ...     for number in range(3):
    ...         progress.advance()
    >>> progress.done
    3
    """

    def __init__(
        self,
        label,
        total,
        unit,
        *,
        delay=0.0,
        log_delay=None,
        says_end=True,
        enabled=True,
    ):
        self.label = label
        self.total = int(total)
        self.unit = unit
        self.delay = delay
        self.log_delay = log_delay
        self.says_end = says_end
        self.enabled = enabled
        self.done = 0

    def __enter__(self):
        self._start = time.monotonic()
        self._shown = False
        self._terminal = on_terminal()
        self._last_time = self._start
        self._last_done = 0
        if self.enabled:
            with _screen.lock:
                _screen.steps.append(self)
                if self._delay() <= 0:
                    self._report(self._start)
            _screen.start_ticker()
        return self

    def advance(self, n=1):
        """Count ``n`` more units done, and report if it is time to.

        Parameters
        ----------
        n : int, default=1
        """
        self.done += int(n)
        if not self.enabled:
            return
        with _screen.lock:
            now = time.monotonic()
            if not self._shown:
                if now - self._start >= self._delay():
                    self._report(now)
            elif self._terminal:
                if now - self._last_time >= _REDRAW_SECONDS:
                    self._report(now)
            elif self.done < self.total and (
                self.done - self._last_done >= _LINE_FRACTION * self.total
                or now - _screen.last >= _LINE_SECONDS
            ):
                self._report(now)

    def __exit__(self, kind, error, traceback):
        if not self.enabled:
            return
        with _screen.lock:
            if self in _screen.steps:
                _screen.steps.remove(self)
            now = time.monotonic()
            if kind is not None:
                if self._terminal:
                    # How far it came stays on the screen, above the error.
                    _screen.end(keep=self._shown)
                return
            if not self._shown:
                return
            end = self._end_line(now - self._start)
            if self._terminal:
                _screen.end(end)
            elif end is not None:
                _screen.write(end + "\n")

    def _delay(self):
        if self.log_delay is None or self._terminal:
            return self.delay
        return self.log_delay

    def _tick(self, now):
        """Report if the step has been still too long; the ticker calls it.

        Returns whether the step shows, so that steps around it need not.
        """
        if not self._shown:
            if now - self._start >= self._delay():
                self._report(now)
        elif now - _screen.last >= (_TICK_SECONDS if self._terminal else _LINE_SECONDS):
            self._report(now)
        return self._shown

    def _report(self, now):
        elapsed = now - self._start
        if self._terminal:
            _screen.draw(self._drawn_line(elapsed))
        elif not self._shown:
            _screen.write(self._start_line() + "\n")
        else:
            _screen.write(self._log_line(elapsed) + "\n")
        self._shown = True
        self._last_time = now
        self._last_done = self.done

    def _drawn_line(self, elapsed):
        percent = 100 * self.done / self.total if self.total else 100.0
        return (
            f"{self.label}: {self.done:,}/{self._count(self.total)} "
            f"({percent:.0f}%), {elapsed:.0f} s"
        )

    def _start_line(self):
        if self.done:
            return self._log_line(time.monotonic() - self._start)
        return f"{self.label}: {self._count(self.total)}..."

    def _log_line(self, elapsed):
        percent = 100 * self.done / self.total if self.total else 100.0
        return (
            f"{self.label}: {self.done:,} of {self._count(self.total)} "
            f"({percent:.0f}%), {elapsed:.0f} s"
        )

    def _end_line(self, elapsed):
        if not self.says_end:
            return None
        return f"{self.label}: {self._count(self.done)} in {elapsed:.1f} s."

    def _count(self, n):
        if n == 1:
            return f"{n:,} {self.unit}"
        plural = "es" if self.unit.endswith(("s", "x", "ch", "sh")) else "s"
        return f"{n:,} {self.unit}{plural}"


class _Status(Progress):
    """A step that counts nothing: its label and its time (see :func:`status`)."""

    def __init__(self, label, enabled=True):
        super().__init__(label, 0, "", enabled=enabled)

    def _delay(self):
        return _STATUS_DELAY if self._terminal else _LINE_SECONDS

    def _drawn_line(self, elapsed):
        return f"{self.label}... {elapsed:.0f} s"

    def _start_line(self):
        return f"{self.label}..."

    def _log_line(self, elapsed):
        return f"{self.label}... {elapsed:.0f} s"

    def _end_line(self, elapsed):
        # On a terminal the line is cleared: what follows says what came of it.
        return None if self._terminal else f"{self.label}: done in {elapsed:.1f} s."


def status(label, *, enabled=True):
    """Show that a step with nothing to count is under way, if it lasts.

    A context manager. On a terminal, once the step has lasted half a second,
    ``"label... 3 s"`` is drawn and redrawn each second, and cleared at the
    end; in plain lines, a step that lasts 10 seconds writes ``"label..."``,
    then its time every 10 seconds, and the time it took at the end. A step
    inside it (a :class:`Progress`) draws over its line while it runs.

    Parameters
    ----------
    label : str
        What the step does, such as ``"Loading model.sklocus"``.
    enabled : bool, default=True
        ``False`` shows nothing.

    Examples
    --------
    >>> from sklocus._progress import status
    >>> with status("Thinking", enabled=False):
    ...     answer = 6 * 7
    """
    return _Status(label, enabled=enabled)
