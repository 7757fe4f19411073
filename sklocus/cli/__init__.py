"""The ``sklocus`` command: a thin layer over the public Python API."""

from __future__ import annotations

import os
import sys
import warnings

from sklocus._versioning import __version__
from sklocus.cli import _demo, _geometry, _models, _report, _serve
from sklocus.cli._common import Parser, UserError, one_line
from sklocus.cli._tables import check_outputs

__all__ = ["main"]

DESCRIPTION = (
    "LOCUS model embeddings from the shell. 'sklocus fit' trains an embedder on a "
    "long table of evaluations (one row per model, query and score) and saves it; "
    "'embed' and 'route' use it on a pool of models; 'neighbors', 'duplicates', "
    "'clusters' and 'select' work on the embeddings; 'report' writes the model "
    "map; 'serve' serves a router over HTTP; 'demo' runs the main job on built-in "
    "data. 'sklocus COMMAND --help' lists a command's options."
)

# What a user's input can make the library raise: each carries a message that
# names the offending item. Anything else is a bug and keeps its traceback.
_USER_ERRORS = (UserError, ValueError, KeyError, OSError)


def build_parser():
    """Build the parser of the whole command line."""
    parser = Parser(
        prog="sklocus",
        description=DESCRIPTION,
        epilog="Progress bars are drawn only when standard error is a terminal.",
    )
    parser.add_argument("--version", action="version", version=f"sklocus {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Subcommand parsers are built by add_parser from the parent's class, so
    # their usage errors are one line too.
    for module in (_models, _geometry, _report, _serve, _demo):
        module.register(commands)
    return parser


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
        standard error, before any work when it is in an output's name; an
        interruption (Ctrl-C) exits with status 130, every output left as it
        was.
    """
    parser = build_parser()
    arguments = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = _warn_in_one_line
        try:
            check_outputs(arguments)
            return arguments.run(arguments)
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
