"""The ``sklocus`` command: a thin layer over the public Python API."""

from __future__ import annotations

import importlib
import os
import sys
import warnings

from sklocus.cli._common import UserError, one_line, status
from sklocus.cli._parsers import build_parser
from sklocus.cli._settings import parse_settings

__all__ = ["build_parser", "main", "parse_settings"]

# What a user's input can make the library raise: each carries a message that
# names the offending item. Anything else is a bug and keeps its traceback.
_USER_ERRORS = (UserError, ValueError, KeyError, OSError)


def _handler(arguments):
    """Import and return the parsed command's function (see _parsers: not sooner)."""
    module, name = arguments.run.split(":")
    return getattr(importlib.import_module(f"sklocus.cli.{module}"), name)


def _warn_in_one_line(message, category, filename, lineno, file=None, line=None):
    print(f"sklocus: warning: {one_line(message)}", file=file or sys.stderr)


def main(argv=None):
    """Run the command line; return its exit status.

    Parameters
    ----------
    argv : list of str, default=None
        The arguments; ``None`` reads ``sys.argv[1:]``.

    Returns
    -------
    int
        0 on success; a user error exits with status 2 after one line on
        standard error, before any work (and before PyTorch is imported) when
        an input is missing or of the wrong kind, or it is in an output's name; an
        interruption (Ctrl-C) exits with status 130, every output left as it
        was.
    """
    parser = build_parser()
    arguments = parser.parse_args(argv)

    with warnings.catch_warnings():
        warnings.showwarning = _warn_in_one_line
        try:
            # Importing PyTorch and scikit-learn takes seconds on a cold start.
            with status(f"Starting sklocus {arguments.command}"):
                from sklocus.cli._tables import check_inputs, check_outputs

                # Before the command's module, which imports PyTorch.
                check_inputs(arguments)
                check_outputs(arguments)
                handler = _handler(arguments)
            return handler(arguments)
        except BrokenPipeError:
            # The reader of standard output left (as `| head` does): stop
            # quietly, and keep Python from reporting the pipe again at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
        except _USER_ERRORS as error:
            print(
                f"sklocus {arguments.command}: error: {one_line(error)}",
                file=sys.stderr,
            )
            return 2
        except KeyboardInterrupt:
            print(f"sklocus {arguments.command}: interrupted", file=sys.stderr)
            return 130
        except MemoryError:
            print(
                f"sklocus {arguments.command}: error: out of memory; this input "
                "needs more than the machine has (give fewer models, queries or "
                "score columns)",
                file=sys.stderr,
            )
            return 1
