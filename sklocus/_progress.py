"""How sklocus reports on long steps: on standard error, drawn or in plain lines.

Standard output is left to the data a command writes. On a terminal a step's
progress is one line redrawn in place; in a log file or a pipe each redraw would
stay as one more line, so there the step writes a few plain lines instead.
"""

from __future__ import annotations

import sys
import time

# In plain lines, a step writes a line when another tenth of it is done, or when
# this many seconds have passed since its last line, whichever comes first: a
# log shows that a long step still moves without filling with lines.
_LINE_FRACTION = 0.1
_LINE_SECONDS = 10.0
# Least seconds between two redraws on a terminal.
_REDRAW_SECONDS = 0.1


def on_terminal():
    """Whether standard error is a terminal, where progress bars are drawn.

    A bar redraws itself with carriage returns; in a log file or a pipe each redraw
    would stay as one more line, so elsewhere sklocus draws none.
    """
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


def say(message):
    """Write one line on standard error, leaving standard output to the data."""
    print(message, file=sys.stderr, flush=True)


class Progress:
    """Report how far a step has come, on standard error; a context manager.

    On a terminal, one line redrawn in place as the work advances, ending with
    the count and the seconds taken. Elsewhere (a log file, a pipe), plain
    lines: one when the step starts, one each time another tenth is done or 10
    seconds have passed since the last, and one at the end with the count and
    the seconds taken. A step that fails or is interrupted ends the terminal's
    line and writes no end.

    Parameters
    ----------
    label : str
        What the step does, such as ``"Encoding query texts"``.
    total : int
        Units of work in the step.
    unit : str
        Their name in the singular, such as ``"text"``; counts other than one
        add an "s".
    delay : float, default=0.0
        Seconds during which nothing is shown: a step done sooner says nothing,
        a longer one starts reporting then.
    enabled : bool, default=True
        ``False`` shows nothing at all, so that callers need no second path.

    Examples
    --------
    >>> from sklocus._progress import Progress
    >>> with Progress("Counting", 3, "number", enabled=False) as progress:
    ...     for number in range(3):
    ...         progress.advance()
    >>> progress.done
    3
    """

    def __init__(self, label, total, unit, *, delay=0.0, enabled=True):
        self.label = label
        self.total = int(total)
        self.unit = unit
        self.delay = delay
        self.enabled = enabled
        self.done = 0

    def __enter__(self):
        self._start = time.monotonic()
        self._shown = False
        self._terminal = on_terminal()
        self._width = 0  # of the terminal's line as last drawn
        self._last_time = self._start
        self._last_done = 0
        if self.enabled and self.delay <= 0:
            self._report(self._start)
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
        now = time.monotonic()
        if not self._shown:
            if now - self._start >= self.delay:
                self._report(now)
        elif self._terminal:
            if now - self._last_time >= _REDRAW_SECONDS:
                self._report(now)
        elif self.done < self.total and (
            self.done - self._last_done >= _LINE_FRACTION * self.total
            or now - self._last_time >= _LINE_SECONDS
        ):
            self._report(now)

    def __exit__(self, kind, error, traceback):
        if not self.enabled:
            return
        now = time.monotonic()
        if kind is not None:
            if self._shown and self._terminal:
                self._write("\n")
            return
        if not self._shown and now - self._start < self.delay:
            return
        end = f"{self.label}: {self._count(self.done)} in {now - self._start:.1f} s."
        if self._terminal:
            self._write(f"\r{end.ljust(self._width)}\n")
        else:
            self._write(end + "\n")

    def _report(self, now):
        elapsed = now - self._start
        percent = 100 * self.done / self.total if self.total else 100.0
        if self._terminal:
            line = (
                f"{self.label}: {self.done:,}/{self._count(self.total)} "
                f"({percent:.0f}%), {elapsed:.0f} s"
            )
            self._write(f"\r{line.ljust(self._width)}")
            self._width = len(line)
        elif not self._shown and not self.done:
            self._write(f"{self.label}: {self._count(self.total)}...\n")
        else:
            self._write(
                f"{self.label}: {self.done:,} of {self._count(self.total)} "
                f"({percent:.0f}%), {elapsed:.0f} s\n"
            )
        self._shown = True
        self._last_time = now
        self._last_done = self.done

    def _count(self, n):
        return f"{n:,} {self.unit}{'s' * (n != 1)}"

    @staticmethod
    def _write(text):
        stream = sys.stderr
        if stream is not None:
            stream.write(text)
            stream.flush()
