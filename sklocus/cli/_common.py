"""What every subcommand shares.

User errors, argument types, option groups, and the one way outputs are written.
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

# Re-exported: the commands report as the library reports its long steps.
from sklocus._progress import say as say
from sklocus._progress import status as status

METRICS = ("euclidean", "cosine")
CSV, PARQUET = (".csv", ".csv.gz"), (".parquet", ".pq")


class UserError(Exception):
    """A mistake in the command line or its files, reported in one line."""


def one_line(error):
    """Return an exception's message on one line (a KeyError's unquoted)."""
    text = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
    return " ".join(str(text).split())


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (``--help`` shows the usage)."""

    def error(self, message):
        """Print ``prog: error: message`` and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def integer_in(low, high=None):
    """Return an argparse type: an integer in [low, high] (no upper bound if None)."""
    bounds = f"from {low}" if high is None else f"from {low} to {high}"

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not an integer; expected one {bounds}"
            ) from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{value} is out of range; expected {bounds}"
            )
        return value

    return parse


def number_from(low, *, inclusive):
    """Return an argparse type: a finite number above ``low`` (or equal to it)."""
    bound = f"of at least {low}" if inclusive else f"above {low}"

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a number; expected one {bound}"
            ) from None
        if not (value >= low if inclusive else value > low) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number {bound}")
        return value

    return parse


positive_number = number_from(0, inclusive=False)
non_negative_number = number_from(0, inclusive=True)


def probability(text):
    """Argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number; expected a probability in [0, 1]"
        ) from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is not a probability in [0, 1]")
    return value


def open_probability(text):
    """Argparse type: a number strictly between 0 and 1 (a confidence level)."""
    value = probability(text)
    if value in (0, 1):
        raise argparse.ArgumentTypeError(
            f"{text} is not strictly between 0 and 1; an interval at confidence 0 "
            "holds nothing, at 1 everything"
        )
    return value


def counted(n, noun, plural=None):
    """``"1 model"``, ``"2 models"``, ``"1,000 queries"``: ``n`` and its noun."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def add_table_options(parser):
    """Options that say how to read a long table of evaluations."""
    group = parser.add_argument_group(
        "evaluation table",
        "EVALS is a CSV or Parquet file with one row per evaluation (model, query, "
        "score in [0, 1]), or a folder in load_evaluations' layout (responses.parquet, "
        "queries.parquet and optionally models.parquet and encodings_NAME.npy).",
    )
    group.add_argument(
        "--model-column", default="model", metavar="COL", help="default: model"
    )
    group.add_argument(
        "--query-column", default="query", metavar="COL", help="default: query"
    )
    group.add_argument(
        "--score-column", default="score", metavar="COL", help="default: score"
    )
    group.add_argument(
        "--text-column",
        metavar="COL",
        help="the query's text, which the sentence encoder encodes (default: the "
        "query column is the text, unless vectors are given)",
    )
    group.add_argument(
        "--duplicates",
        choices=("error", "mean", "majority"),
        default="error",
        help="what to do with several rows for one model and query (default: error)",
    )
    return group


# The on-disk cache of query-text encodings when --encoding-cache is not given.
ENCODING_CACHE_VARIABLE = "SKLOCUS_ENCODING_CACHE"


def add_encoding_cache_option(parser, note=""):
    """``--encoding-cache DIR`` and ``--no-encoding-cache``: reuse text encodings.

    ``note`` ends the group's description: what the command uses the cache for.
    """
    group = parser.add_argument_group(
        "encoding cache",
        "The encodings of query texts are kept in one SQLite file, keyed by "
        "encoder and text, and reused in later runs, so that a pool's texts are "
        "encoded once. The folder is --encoding-cache DIR, else "
        f"${ENCODING_CACHE_VARIABLE} if set, else the per-user cache folder "
        "($SKLOCUS_HOME if set, else $XDG_CACHE_HOME/sklocus or ~/.cache/sklocus); "
        "it is never saved in a model file. A folder given that cannot be written "
        "is an error; the default folder, a warning, and no cache." + note,
    )
    choice = group.add_mutually_exclusive_group()
    choice.add_argument(
        "--encoding-cache",
        metavar="DIR",
        help="keep the encodings in DIR (created if missing)",
    )
    choice.add_argument(
        "--no-encoding-cache",
        action="store_true",
        help="encode every query text afresh, reading and writing no cache",
    )


def encoding_cache_folder(arguments):
    """Return the folder of the encoding cache this run uses, or None for none.

    ``--no-encoding-cache``, else ``--encoding-cache``, else
    ``$SKLOCUS_ENCODING_CACHE``, else the per-user cache folder. A folder the
    user named that cannot hold the cache is an error; the default folder, a
    warning, and the run goes on without a cache. Decided once per run.
    """
    decided = getattr(arguments, "_encoding_cache_folder", False)
    if decided is not False:
        return decided
    from sklocus._cache_folder import user_cache_folder
    from sklocus._encoding_cache import folder_problem

    folder, source = None, None
    if getattr(arguments, "no_encoding_cache", False):
        pass
    elif getattr(arguments, "encoding_cache", None):
        folder, source = arguments.encoding_cache, "argument --encoding-cache"
    elif os.environ.get(ENCODING_CACHE_VARIABLE):
        folder = os.environ[ENCODING_CACHE_VARIABLE]
        source = f"${ENCODING_CACHE_VARIABLE}"
    else:
        folder = user_cache_folder()
    problem = None if folder is None else folder_problem(folder)
    if problem is not None:
        if source is not None:
            raise UserError(
                f"{source}: cannot keep the encoding cache in {folder} ({problem}); "
                "give a writable folder, or --no-encoding-cache"
            )
        warnings.warn(
            f"the default encoding cache {folder} cannot be used ({problem}); "
            "encoding without a cache (choose a folder with --encoding-cache DIR, "
            "or turn the cache off with --no-encoding-cache)",
            UserWarning,
            stacklevel=2,
        )
        folder = None
    arguments._encoding_cache_folder = folder
    return folder


def add_test_queries_option(group, *, held_out_of):
    """Add ``--test-queries`` or ``--test-split``: where routing is measured."""
    which = group.add_mutually_exclusive_group()
    which.add_argument(
        "--test-queries",
        metavar="FILE",
        help="held-out queries, one per line: their evaluations are left out of "
        f"{held_out_of}, and the routing accuracy of the pool's router is "
        "measured on them and printed (the figure fit, route and report print "
        "alike, from sklocus.metrics.routing_accuracy)",
    )
    which.add_argument(
        "--test-split",
        metavar="NAME",
        help="hold out, as --test-queries does, the queries whose --split-column "
        "is NAME (a data folder's queries.parquet, or a column of a long table), "
        "e.g. --test-split test",
    )
    group.add_argument(
        "--split-column",
        default="split",
        metavar="COL",
        help="the column that --test-split reads (default: split)",
    )


def add_queries_text_option(parser):
    """``--queries-text-column``: the text column of QUERIES, apart from EVALS'."""
    parser.add_argument(
        "--queries-text-column",
        metavar="COL",
        help="the column of QUERIES that holds each query's text (default: "
        "--text-column's; with a data folder as EVALS, which brings its own "
        "texts, this option alone names it)",
    )


def queries_text_column(arguments):
    """Return the text column of QUERIES and its option, or ``(None, None)``."""
    if arguments.queries_text_column is not None:
        return arguments.queries_text_column, "--queries-text-column"
    if arguments.text_column is not None:
        return arguments.text_column, "--text-column"
    return None, None


def add_vector_options(parser):
    """Options that give precomputed query vectors."""
    group = parser.add_argument_group(
        "precomputed query vectors",
        "Instead of encoding query texts, look each query up in a matrix of vectors.",
    )
    group.add_argument(
        "--query-vectors",
        metavar="FILE.npy",
        help="a 2-D array saved with numpy.save, one row per query",
    )
    group.add_argument(
        "--query-ids",
        metavar="FILE",
        help="the query of each row of --query-vectors, one per line",
    )
    return group


def table_kind(path):
    """Return ``"csv"`` or ``"parquet"`` by the suffix of ``path``, else None."""
    name = Path(path).name.lower()
    if name.endswith(CSV):
        return "csv"
    if name.endswith(PARQUET):
        return "parquet"
    return None


def unknown_table(path):
    """Return the message for a file that is neither CSV nor Parquet."""
    return f"{path}: unknown file type; expected a .csv, .csv.gz, .parquet or .pq file"


def table_file(text):
    """Check, as an argparse type, that ``text`` names a CSV or Parquet file."""
    if table_kind(text) is None:
        raise argparse.ArgumentTypeError(unknown_table(text))
    return text


def add_output_option(parser, *, required, what):
    """``-o/--output``: a CSV or Parquet file, chosen by its suffix."""
    parser.add_argument(
        "-o",
        "--output",
        type=table_file,
        required=required,
        metavar="FILE",
        help=f"where to write {what} (.csv or .parquet)"
        + ("" if required else "; default: CSV on standard output"),
    )


def add_metric_option(parser):
    """``--metric``: how distances between embeddings are measured."""
    parser.add_argument(
        "--metric",
        choices=METRICS,
        default="euclidean",
        help="distance between embeddings (default: euclidean, in units of a "
        "typical pair of training models)",
    )
