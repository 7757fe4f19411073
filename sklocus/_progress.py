"""When to draw progress bars."""

import sys


def on_terminal():
    """Whether standard error is a terminal, where progress bars are drawn.

    A bar redraws itself with carriage returns; in a log file or a pipe each redraw
    would stay as one more line, so elsewhere sklocus draws none.
    """
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()
