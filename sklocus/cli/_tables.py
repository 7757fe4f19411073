"""Read and write the command line's files.

The one reader of evaluation tables, query vectors, embedding tables and costs,
and the one writer of outputs.

Model names and query ids are read as text, whatever the file stores, so that a
query id ``7`` in a CSV file and ``"7"`` in a list of ids are the same query.
"""

from __future__ import annotations

import csv
import gzip
import os
import sys
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from sklocus._file_kinds import describe, file_kind
from sklocus._files import write_atomically
from sklocus._validation import has_control_character, shown
from sklocus.cli._common import (
    UserError,
    encoding_cache_folder,
    one_line,
    say,
    status,
    table_kind,
    unknown_table,
)

# Columns of an embedding table besides the vector's z0, z1, ...
MODEL, SIZE = "model", "n_evaluations"

# The arguments that name files a command reads, and those it writes, with how
# the usage names them.
INPUTS = {
    "model": "MODEL",
    "evals": "EVALS",
    "queries": "QUERIES",
    "embeddings": "EMBEDDINGS",
    "query_vectors": "--query-vectors",
    "query_ids": "--query-ids",
    "test_queries": "--test-queries",
    "outcomes": "OUTCOMES",
    "scores": "--scores",
    # State a command reads and keeps writing: never an output's to overwrite.
    "feedback_journal": "--feedback-journal",
    "token_file": "--token-file",
}
OUTPUTS = {"output": "-o/--output", "router_file": "--router-file"}
# The inputs that must exist when given (state a command keeps writing need not).
_REQUIRED = ("model", "evals", "queries", "embeddings", "query_vectors", "query_ids")
_REQUIRED += ("test_queries", "outcomes", "scores")
# What a missing input is called, where not a plain file.
_MISSING = {"model": "model file", "evals": "file or folder"}
# Inputs read as evaluation tables; of the others, MODEL is a model file.
_TABLES = ("evals", "queries", "embeddings", "outcomes", "scores")


@dataclass
class Evaluations:
    """Evaluation sets read from EVALS, with what came along with them."""

    sets: list
    model_names: list
    source: Path
    texts: dict | None = None
    costs: pd.Series | None = None
    encoder: object = None  # a folder brings its own query encodings
    # Per-query and per-model tables the evaluations came with: the long table's
    # rows, or a folder's queries.parquet and models.parquet.
    query_table: pd.DataFrame | None = None
    model_table: pd.DataFrame | None = None


@dataclass
class HeldOut:
    """The evaluations of the held-out queries that EVALS scores."""

    queries: list
    scores: pd.DataFrame  # one row per query, one column per model of EVALS
    source: object  # what named them: the --test-queries file, or the split


def hold_out(arguments, evaluations):
    """Split EVALS by ``--test-queries`` or ``--test-split``: ``(the rest, HeldOut)``.

    Without either, ``(evaluations, None)``. The queries must include at least one
    of EVALS, and leave every model some evaluations to be embedded from; queries
    a file names that EVALS lacks are said and left out.
    """
    if getattr(arguments, "test_queries", None) is not None:
        option = "--test-queries"
        source = Path(arguments.test_queries)
        listed = list(dict.fromkeys(line.strip() for line in read_lines(source)))
        if not listed:
            raise UserError(f"argument --test-queries: {source} lists no query")
        expected = "expected query ids of EVALS, one per line"
    elif getattr(arguments, "test_split", None) is not None:
        option = "--test-split"
        listed = _split_queries(arguments, evaluations)
        source = f"split {arguments.test_split!r}"
        expected = f"expected queries of EVALS in column {arguments.split_column!r}"
    else:
        return evaluations, None
    from sklocus.evaluations import to_matrix  # see _read_table

    test = set(listed)
    rest = [{q: s for q, s in e.items() if q not in test} for e in evaluations.sets]
    held = [{q: s for q, s in e.items() if q in test} for e in evaluations.sets]
    evaluated = set().union(*held)
    queries = [query for query in listed if query in evaluated]
    if not queries:
        raise UserError(
            f"argument {option}: none of the {len(listed)} queries of "
            f"{source} (such as {listed[0]!r}) is evaluated in {evaluations.source}; "
            f"{expected}"
        )
    for name, kept in zip(evaluations.model_names, rest):
        if not kept:
            raise UserError(
                f"argument {option}: model {name!r} has no evaluation outside "
                f"the queries of {source}, so nothing is left to embed it from"
            )
    if len(queries) < len(listed):
        missing = next(query for query in listed if query not in evaluated)
        say(
            f"{option}: {len(listed) - len(queries)} of the {len(listed)} "
            f"queries of {source} (such as {missing!r}) are not evaluated in "
            f"{evaluations.source}; routing is measured on the other {len(queries)}."
        )
    scores, _ = to_matrix(held, queries=queries)
    frame = pd.DataFrame(scores, columns=evaluations.model_names)
    return replace(evaluations, sets=rest), HeldOut(queries, frame, source)


def _split_queries(arguments, evaluations):
    """Return the queries whose ``--split-column`` is ``--test-split``, in order."""
    name, column = arguments.test_split, arguments.split_column
    table, query = evaluations.query_table, arguments.query_column
    source = evaluations.source
    require_columns(table, {"--split-column": column}, source)
    splits = table[column].astype(str)
    chosen = table.loc[splits == name, query].astype(str)
    if chosen.empty:
        found = sorted(splits[table[column].notna()].unique())
        raise UserError(
            f"argument --test-split: no query of {source} has {column!r} equal to "
            f"{name!r}; the column holds {found[:10]}"
        )
    # A query of a long table is in the split when any of its rows says so.
    return list(dict.fromkeys(chosen))


def _kind(path):
    kind = table_kind(path)
    if kind is None:
        raise UserError(unknown_table(path))
    return kind


def _existing(path, what):
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such {what}")
    return path


def read_lines(path):
    """Return the non-blank lines of a text file: one query (or id) per line.

    A byte-order mark is dropped (it is not part of the first line); lines end
    at newlines only (LF or CR LF), so any other character stays in its query.
    """
    path = _existing(path, "file")
    text = path.read_text(encoding="utf-8-sig")
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    return [line for line in lines if line.strip()]


def row_name(path, row):
    """Name data row ``row`` (from 0, the header not counted) as its file shows it.

    Every message about a row of a table read from a file says where it is
    this way. In a CSV file, the line an editor shows: the header is line 1,
    so data row 0 is line 2 (or further on, where a cell above spans lines). In
    a Parquet file or a folder, ``row N`` counting from 1, as the viewers of
    Parquet number rows.
    """
    row = int(row)
    path = Path(path)
    if path.is_file() and table_kind(path) == "csv":
        return f"line {_csv_line(path, row)}"
    return f"row {row + 1}"


def _csv_line(path, row):
    """Return the line where data row ``row`` of a CSV file starts.

    The file is read again (an error is being reported), its rows counted as
    pandas counts them: blank lines skipped.
    """
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as file:
            reader = csv.reader(file)
            next(reader, None)  # the header
            start, found = reader.line_num + 1, 0
            for record in reader:
                if record:
                    if found == row:
                        return start
                    found += 1
                start = reader.line_num + 1
    except (OSError, UnicodeDecodeError, csv.Error, EOFError):
        pass
    return row + 2  # one line a row, as most CSV files are


def table_error(path, error):
    """Return the UserError for what ``from_long`` raised reading ``path``.

    A row it names is named as the file shows it (:func:`row_name`), and a
    (model, query) pair in several rows names the option ``--duplicates``,
    not the Python keyword.
    """
    detail = getattr(error, "detail", None)
    if detail is None or getattr(error, "row", None) is None:
        return UserError(f"{path}: {one_line(error)}")
    if getattr(error, "keyword", None) == "duplicates":
        rows = [row_name(path, row) for row in error.rows[:3]]
        more = ", ..." if len(error.rows) > 3 else ""
        return UserError(
            f"{path}: {detail} ({', '.join(rows)}{more}); pass --duplicates mean or "
            "--duplicates majority to resolve repeated evaluations"
        )
    return UserError(f"{path}: {row_name(path, error.row)} {one_line(detail)}")


def check_names(values, column, path):
    """Fail on the first model name of a column that holds a control character."""
    for row, name in enumerate(values):
        if isinstance(name, str) and has_control_character(name):
            raise UserError(
                f"{path}: {row_name(path, row)} has model {shown(name)} in column "
                f"{column!r}; model names must not hold control characters such "
                "as newlines"
            )


def check_output(path, option=None):
    """Fail now, before any work, when the file ``path`` cannot be written."""
    path = Path(path)
    where = f"argument {option}: " if option else ""
    if path.is_dir():
        raise UserError(f"{where}{path} is a folder; expected a file")
    if not path.parent.is_dir():
        raise UserError(f"{where}{path}: the folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UserError(f"{where}{path}: cannot write in the folder {path.parent}")
    return path


def check_outputs(arguments):
    """Fail before any work when an output cannot be written or is an input.

    An input is the same file however it is spelled: through a link, or a
    detour through another folder.
    """
    if hasattr(arguments, "no_encoding_cache"):
        # The cache is written as the run goes: a bad folder fails now too.
        encoding_cache_folder(arguments)
    for name, option in OUTPUTS.items():
        output = getattr(arguments, name, None)
        if output is None:
            continue
        check_output(output, option)
        for argument, role in INPUTS.items():
            given = getattr(arguments, argument, None)
            # `neighbors --model NAME` is a list of names, not a file.
            if isinstance(given, str) and _same_file(given, output):
                raise UserError(
                    f"argument {option}: {output} is the same file as {role} "
                    f"{given}; expected an output that is not one of the inputs"
                )


def check_inputs(arguments):
    """Fail before any work when an input is missing or is the wrong kind of file.

    Called before the command's module is imported, which takes seconds for
    PyTorch: a mistyped name is reported at once. A model file given where a
    table is expected (or a table for MODEL, as when the two are swapped) is
    named for what its first bytes say it is.
    """
    for name in _REQUIRED:
        given = getattr(arguments, name, None)
        if isinstance(given, str) and not Path(given).exists():
            raise UserError(f"{given}: no such {_MISSING.get(name, 'file')}")
    model = getattr(arguments, "model", None)
    # `neighbors --model NAME` is a list of names, not a file.
    if isinstance(model, str) and Path(model).is_file():
        check_model_file(model, arguments)
    for name in _TABLES:
        given = getattr(arguments, name, None)
        if isinstance(given, str) and Path(given).is_file():
            check_table_file(given, INPUTS[name])


def check_model_file(path, arguments=None):
    """Fail when ``path`` does not look like a model file (a safetensors file)."""
    kind = file_kind(path)
    if kind == "safetensors":
        return
    message = (
        f"MODEL {path} is not a model file: it looks like {describe(kind)}; "
        "expected a model file from sklocus fit"
    )
    evals = getattr(arguments, "evals", None)
    if (
        isinstance(evals, str)
        and Path(evals).is_file()
        and file_kind(evals) == "safetensors"
    ):
        message += (
            f" (EVALS {evals} looks like one: MODEL comes first, as in "
            f"sklocus {arguments.command} MODEL EVALS ...)"
        )
    raise UserError(message)


def check_table_file(path, role=None):
    """Fail when ``path``'s first bytes are not those of the table its name says.

    A CSV file (``.csv``) is text, or gzip for ``.csv.gz``; a Parquet file
    starts with ``PAR1``. A model file, pickle or archive is named as such. A
    file whose name is not a table's is refused only when it is a model file
    (given for a table, as when MODEL and EVALS are swapped): a text file may
    be QUERIES, and the readers say what else they expect.
    """
    expected = table_kind(path)
    kind = file_kind(path)
    where = f"{role} " if role else ""
    if expected is None:
        if kind == "safetensors":
            raise UserError(
                f"{where}{path} is not a table: it looks like a model file "
                "(safetensors), such as sklocus fit writes; expected a .csv or "
                ".parquet table"
            )
        return
    if expected == "csv":
        fits = {"csv", "text", "empty"}
        if str(path).lower().endswith(".gz"):
            fits.add("compressed")
    else:
        fits = {"parquet"}
    if kind in fits:
        return
    shown_kind = describe(kind)
    if kind == "safetensors":
        shown_kind = "a model file (safetensors), such as sklocus fit writes"
    raise UserError(
        f"{where}{path} is not {describe(expected)}, as its name says: it looks "
        f"like {shown_kind}"
    )


def _same_file(a, b):
    """Say whether two paths name one file.

    The same file if both exist (links and detours resolved), else the same
    resolved path (a file one of them would create).
    """
    a, b = Path(a), Path(b)
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def read_table(path, *, text_columns=()):
    """Read a CSV or Parquet file; ``text_columns`` are read as text."""
    path = _existing(path, "file")
    if path.is_dir():
        raise UserError(f"{path} is a folder; expected a .csv or .parquet file")
    kind = _kind(path)
    check_table_file(path)
    try:
        if kind == "csv":
            frame = pd.read_csv(path, dtype={c: str for c in text_columns})
        else:
            frame = pd.read_parquet(path)
    except (OSError, ValueError, pd.errors.ParserError) as error:
        raise UserError(f"{path}: cannot be read as {kind.upper()}: {error}") from None
    for column in text_columns:
        if column in frame.columns:
            values = frame[column]
            frame[column] = values.where(values.isna(), values.astype(str))
    return frame


def require_columns(frame, columns, path):
    """Fail with the table's columns when one of ``columns`` is missing."""
    for option, column in columns.items():
        if column not in frame.columns:
            raise UserError(
                f"{path}: no column {column!r} ({option}); its columns are "
                f"{list(frame.columns)}"
            )


# What a spreadsheet takes for the start of a formula in a CSV cell.
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(frame):
    """Return ``frame`` with each text that a spreadsheet would run quoted.

    A cell (or column name) starting with ``=``, ``+``, ``-``, ``@``, a tab or
    a carriage return gets a leading ``'``, which spreadsheets show as text
    (OWASP's advice on CSV injection); numbers are left alone. Also returns
    how many texts were quoted.
    """

    def risky(value):
        return isinstance(value, str) and value.startswith(_FORMULA_STARTS)

    quoted = 0
    safe = frame
    for position, column in enumerate(frame.columns):
        if frame[column].dtype != object and not pd.api.types.is_string_dtype(
            frame[column]
        ):
            continue
        flags = frame[column].map(risky).to_numpy(dtype=bool)
        if flags.any():
            if safe is frame:
                safe = frame.copy()
            safe.iloc[flags, position] = "'" + frame[column][flags].astype(str)
            quoted += int(flags.sum())
    names = [f"'{name}" if risky(name) else name for name in frame.columns]
    if names != list(frame.columns):
        safe = safe.set_axis(names, axis=1)
        quoted += sum(map(risky, frame.columns))
    return safe, quoted


def write_table(frame, path):
    """Write ``frame`` as CSV or Parquet by the suffix of ``path``, or CSV to stdout.

    In CSV, a text a spreadsheet would run as a formula (``=1+1``) is written
    with a leading ``'``, and standard error says how many were; Parquet holds
    every value as it is. Returns the path written, or None for standard
    output.
    """
    if path is None or _kind(Path(path)) == "csv":
        frame, quoted = spreadsheet_safe(frame)
        if quoted:
            say(
                f"{quoted} text(s) starting with =, +, -, @, a tab or a carriage "
                "return were written with a leading ' so that spreadsheets do not "
                "run them; write Parquet (.parquet) to keep them exactly."
            )
    if path is None:
        frame.to_csv(sys.stdout, index=False)
        return None
    if _kind(Path(path)) == "csv":
        # Said, not guessed from the suffix: the temporary's is .partial.
        compression = "gzip" if str(path).lower().endswith(".gz") else None
        write = partial(frame.to_csv, index=False, compression=compression)
    else:
        write = partial(frame.to_parquet, index=False)
    write_atomically(path, write)
    return Path(path)


def per_model_mean(frame, model_column, column, path):
    """Mean of a numeric ``column`` over each model's rows, as a Series by model."""
    values = _costs(frame, column, path, lambda row: row_name(path, row))
    return values.groupby(frame[model_column], sort=False).mean()


def _costs(frame, column, path, name_row):
    """``frame[column]`` as numbers, each a cost: finite and at least 0.

    ``name_row(position)`` names the row of a bad value (its line, its model).
    """
    require_columns(frame, {"--cost-column": column}, path)
    values = pd.to_numeric(frame[column], errors="coerce")
    bad = values.isna() | ~np.isfinite(values) | (values < 0)
    if bad.any():
        row = int(np.argmax(bad.to_numpy()))
        given = frame[column].iloc[row]
        found = (
            f"no value in column {column!r}"
            if pd.isna(given)
            else f"{column}={shown(given)}"
        )
        raise UserError(
            f"{path}: {name_row(row)} has {found}; costs must be finite numbers "
            "of at least 0"
        )
    return values


def read_evaluations(arguments, *, cost_column=None):
    """Read EVALS as the table options of ``arguments`` say."""
    path = _existing(arguments.evals, "file or folder")
    with status(f"Reading {path}"):
        if path.is_dir():
            return _read_folder(path, arguments, cost_column)
        return _read_table(path, arguments, cost_column)


def _read_table(path, arguments, cost_column):
    # Imported here, not with the module: it brings scikit-learn, which the
    # checks that main runs first (check_inputs) must not wait for.
    from sklocus.evaluations import from_long

    model, query = arguments.model_column, arguments.query_column
    frame = read_table(path, text_columns=(model, query))
    columns = {"--model-column": model, "--query-column": query}
    columns["--score-column"] = arguments.score_column
    if arguments.text_column is not None:
        columns["--text-column"] = arguments.text_column
    require_columns(frame, columns, path)
    check_names(frame[model], model, path)
    try:
        sets, names = from_long(
            frame,
            model=model,
            query=query,
            score=arguments.score_column,
            duplicates=arguments.duplicates,
        )
    except (KeyError, ValueError, TypeError) as error:
        raise table_error(path, error) from None
    evaluations = Evaluations(sets, names, path, query_table=frame, model_table=frame)
    if arguments.text_column is not None:
        evaluations.texts = _texts(frame, query, arguments.text_column, path)
    if cost_column is not None:
        evaluations.costs = per_model_mean(frame, model, cost_column, path)
    return evaluations


def _read_folder(path, arguments, cost_column):
    if arguments.text_column is not None:
        raise UserError(
            f"{path} is a folder, whose queries.parquet gives the texts; leave out "
            "--text-column (--queries-text-column names the texts of QUERIES)"
        )
    # The encoders import torch, which the geometry commands never need.
    from sklocus.datasets import load_evaluations
    from sklocus.encoders import PrecomputedEncoder

    encoder = getattr(arguments, "encoder", None) or "all-MiniLM-L6-v2"
    try:
        data = load_evaluations(path, encoder=encoder)
    except (KeyError, ValueError, OSError) as error:
        raise UserError(one_line(error)) from None
    names = [str(name) for name in data.model_names]
    check_names(names, "model", path)
    sets = [
        {str(query): score for query, score in evaluations.items()}
        for evaluations in data.evaluation_sets
    ]
    texts = dict(zip(data.queries["query_id"].astype(str), data.queries["query"]))
    encoder = data.encoder
    if isinstance(encoder, PrecomputedEncoder):
        encoder = PrecomputedEncoder(
            [str(q) for q in encoder.queries], np.asarray(encoder.vectors)
        )
    # The query column of the per-query table holds the ids, whatever
    # --query-column says; the texts, already in ``texts``, go, so that a
    # column "query" (the folder's texts) does not stand beside the ids under the
    # same name when --query-column is its default, "query".
    queries = data.queries.drop(columns="query").assign(
        query_id=data.queries["query_id"].astype(str)
    )
    models = data.models.assign(model=data.models["model"].astype(str))
    evaluations = Evaluations(
        sets,
        names,
        path,
        texts=texts,
        encoder=encoder,
        query_table=queries.rename(columns={"query_id": arguments.query_column}),
        model_table=models.rename(columns={"model": arguments.model_column}),
    )
    if cost_column is not None:
        evaluations.costs = _folder_costs(models, cost_column, path)
    return evaluations


def _folder_costs(models, column, folder):
    """Each model's cost, a column of the folder's models.parquet."""
    source = folder / "models.parquet"
    if not source.is_file():
        raise UserError(
            f"argument --cost-column: {folder} has no models.parquet, the table "
            "of a folder that gives each model's cost; expected one row per model "
            f"with a column {column!r}"
        )
    names = models["model"]
    values = _costs(
        models, column, source, lambda row: f"model {shown(names.iloc[row])}"
    )
    return pd.Series(values.to_numpy(), index=names, name=column)


def _texts(frame, query, text, path):
    """Each query's text; one query must not carry two texts."""
    pairs = frame[[query, text]].dropna(subset=[text]).drop_duplicates()
    repeated = pairs[query].duplicated()
    if repeated.any():
        name = pairs[query][repeated].iloc[0]
        raise UserError(
            f"{path}: query {name!r} has more than one text in column {text!r}"
        )
    return dict(zip(pairs[query], pairs[text].astype(str)))


def read_query_vectors(arguments):
    """Return the lookup of --query-vectors and --query-ids, or None if not given."""
    vectors_path, ids_path = arguments.query_vectors, arguments.query_ids
    if vectors_path is None and ids_path is None:
        return None
    if vectors_path is None or ids_path is None:
        given, missing = (
            ("--query-vectors", "--query-ids")
            if ids_path is None
            else ("--query-ids", "--query-vectors")
        )
        raise UserError(f"{given} needs {missing}: the query of each row")
    vectors_path = _existing(vectors_path, "file")
    try:
        vectors = np.load(vectors_path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise UserError(
            f"{vectors_path}: not an array saved with numpy.save ({error})"
        ) from None
    if vectors.ndim != 2 or vectors.dtype.kind not in "iuf":
        raise UserError(
            f"{vectors_path}: holds a {vectors.dtype} array of shape {vectors.shape}; "
            "expected a 2-D array of numbers, one row per query"
        )
    ids = read_lines(ids_path)
    if len(ids) != len(vectors):
        raise UserError(
            f"{ids_path} lists {len(ids)} queries but {vectors_path} has "
            f"{len(vectors)} rows; give one query per row"
        )
    from sklocus.encoders import PrecomputedEncoder  # imports torch: see _read_folder

    try:
        encoder = PrecomputedEncoder(ids, vectors).fit()
    except ValueError as error:
        raise UserError(f"{ids_path}: {one_line(error)}") from None
    return encoder


def read_embeddings(path):
    """Read an embedding table written by ``sklocus embed``.

    Returns ``(frame, names, Z)``: the table, its model names and its vectors.
    """
    frame = read_table(path, text_columns=(MODEL,))
    require_columns(frame, {"the embedding table": MODEL}, path)
    vector = [c for c in frame.columns if _is_vector_column(c)]
    if not vector:
        raise UserError(
            f"{path}: no vector columns z0, z1, ...; expected a table written by "
            "sklocus embed"
        )
    vector.sort(key=lambda c: int(c[1:]))
    if vector != [f"z{i}" for i in range(len(vector))]:
        raise UserError(
            f"{path}: vector columns {vector[:3]}... skip a number; expected z0 to "
            f"z{len(vector) - 1}"
        )
    if len(frame) == 0:
        raise UserError(f"{path}: the table has no rows; expected one per model")
    names = frame[MODEL]
    if names.isna().any():
        row = row_name(path, np.argmax(names.isna()))
        raise UserError(f"{path}: {row} has no model")
    check_names(names, MODEL, path)
    if not names.is_unique:
        raise UserError(f"{path}: model {names[names.duplicated()].iloc[0]!r} repeats")
    try:
        Z = frame[vector].to_numpy(dtype=np.float64)
    except ValueError as error:
        raise UserError(
            f"{path}: the vector columns must hold numbers ({error})"
        ) from None
    if not np.isfinite(Z).all():
        row = int(np.argmax(~np.isfinite(Z).all(axis=1)))
        raise UserError(
            f"{path}: the vector of model {names.iloc[row]!r} is not finite"
        )
    return frame, names.tolist(), Z


def _is_vector_column(column):
    return isinstance(column, str) and column[:1] == "z" and column[1:].isdigit()


def read_queries(
    path, query_column, text_column, group_column=None, text_option="--text-column"
):
    """Read the queries to route: a table, or a text file of one query per line.

    Returns ``(ids, queries, groups)``: what identifies each query in the output,
    what the encoder is given (its text when a text column is named, else its
    id), and each query's group (None without a group column; a missing value
    is no group). ``text_option`` is the option that named ``text_column``.
    """
    path = _existing(path, "file")
    if path.name.lower().endswith(".txt") and not path.is_dir():
        for option, given in (
            (text_option, text_column),
            ("--group-column", group_column),
        ):
            if given is not None:
                raise UserError(
                    f"{path}: a text file has no columns; leave out {option}"
                )
        queries = read_lines(path)
        if not queries:
            raise UserError(f"{path}: no queries; expected one per line")
        return queries, queries, None
    frame = read_table(path, text_columns=(query_column,))
    columns = {"--query-column": query_column}
    if text_column is not None:
        columns[text_option] = text_column
    require_columns(frame, columns, path)
    if len(frame) == 0:
        raise UserError(f"{path}: the table has no rows; expected one per query")
    for column in columns.values():
        missing = frame[column].isna().to_numpy()
        if missing.any():
            raise UserError(
                f"{path}: {row_name(path, np.argmax(missing))} has no value in "
                f"column {column!r}"
            )
    groups = None
    if group_column is not None:
        require_columns(frame, {"--group-column": group_column}, path)
        groups = frame[group_column].tolist()
    ids = frame[query_column].tolist()
    texts = ids if text_column is None else frame[text_column].astype(str).tolist()
    return ids, texts, groups


def per_query(evaluations, query_column, column, option="--group-column"):
    """Each query's value of ``column`` (its first), as a dict.

    Fails when no query of the pool has a value there: an option that finds
    nothing to act on says so rather than doing nothing.
    """
    table = evaluations.query_table
    require_columns(table, {option: column}, evaluations.source)
    first = table.dropna(subset=[column]).drop_duplicates(subset=[query_column])
    found = dict(zip(first[query_column], first[column]))
    evaluated = {query for evaluation in evaluations.sets for query in evaluation}
    if not evaluated & found.keys():
        raise UserError(
            f"argument {option}: no query of {evaluations.source} has a value in "
            f"column {column!r} ({len(first)} rows have one, none for an evaluated "
            "query); expected a group for the queries of EVALS"
        )
    return found


def per_model(evaluations, model_column, columns):
    """Each model's values of ``columns`` (its first), one row per model."""
    table = evaluations.model_table
    for column in columns:
        require_columns(table, {"--metadata-column": column}, evaluations.source)
    first = table.drop_duplicates(subset=[model_column]).set_index(model_column)
    return first.loc[evaluations.model_names, list(columns)].reset_index(drop=True)
