"""The sklocus command against hostile input and interruptions.

Outputs that are inputs, outputs that cannot be written, Ctrl-C in the middle of
a training or a write, temporaries left by a kill, byte-order marks and control
characters in names. Every command runs in this process, through ``main``.
"""

import os
import struct
import subprocess

import numpy as np
import pandas as pd
import pytest

import sklocus.cli._models
import sklocus.cli._tables
import sklocus.report
from sklocus import LocusEmbedder
from sklocus.cli import main
from sklocus.datasets import make_evaluations

TINY = ["--set", "embedding_dim=8", "--set", "n_latents=2", "--set", "max_epochs=1"]
TINY += ["--set", "epoch_size=32", "--random-state", "0", "--quiet"]
VECTORS = ["--query-vectors", "vectors.npy", "--query-ids", "ids.txt"]


def main_in(folder, argv):
    """Run main in ``folder``; return its status."""
    before = os.getcwd()
    os.chdir(folder)
    try:
        return main([str(a) for a in argv])
    except SystemExit as stop:
        return stop.code
    finally:
        os.chdir(before)


def run(*argv, cwd, capsys):
    """Run main in ``cwd``; return the status and what it printed."""
    status = main_in(cwd, argv)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, status, captured.out, captured.err)


def one_line_error(*argv, cwd, capsys):
    """Run main; return its one line of error after checking its status is 2."""
    result = run(*argv, cwd=cwd, capsys=capsys)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def contents(folder):
    """Every file under ``folder`` with its bytes, hidden ones included."""
    return {
        path.relative_to(folder): path.read_bytes()
        for path in folder.rglob("*")
        if path.is_file()
    }


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Evaluations, query vectors, a trained model file and an embedding table."""
    folder = tmp_path_factory.mktemp("hostile")
    data = make_evaluations(n_models=8, n_queries=40, query_dim=8, random_state=0)
    rows = [
        (name, query, score)
        for name, evaluations in zip(data.model_names, data.evaluation_sets)
        for query, score in evaluations.items()
    ]
    table = pd.DataFrame(rows, columns=["model", "query", "score"])
    table.to_csv(folder / "evals.csv", index=False)
    table.to_parquet(folder / "evals.parquet")
    np.save(folder / "vectors.npy", data.query_vectors)
    (folder / "ids.txt").write_text("\n".join(data.query_ids) + "\n")
    (folder / "queries.txt").write_text("\n".join(data.query_ids[:3]) + "\n")
    fit = ["fit", "evals.csv", "-o", "model.sklocus", *VECTORS, *TINY]
    assert main_in(folder, fit) == 0
    assert (
        main_in(folder, ["embed", "model.sklocus", "evals.csv", "-o", "emb.csv"]) == 0
    )
    return folder, data


@pytest.fixture
def workspace(source, tmp_path):
    """A fresh copy of the source files, which a test may damage."""
    folder, data = source
    for name, raw in contents(folder).items():
        (tmp_path / name).write_bytes(raw)
    return tmp_path, data


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a command reads its inputs or trains."""

    def refuse(*args, **kwargs):
        raise AssertionError("the command started work before checking its outputs")

    monkeypatch.setattr(sklocus.cli._tables, "_existing", refuse)
    monkeypatch.setattr(sklocus.cli._models, "load", refuse)
    monkeypatch.setattr(LocusEmbedder, "fit", refuse)


# -- 11: an output that is an input is refused, naming both --------------------


@pytest.mark.parametrize(
    "argv, output, role",
    [
        (["fit", "evals.csv", "-o", "evals.csv", *VECTORS], "evals.csv", "EVALS"),
        (["fit", "evals.csv", "-o", "ids.txt", *VECTORS], "ids.txt", "--query-ids"),
        (["fit", "evals.csv", "-o", "link.csv", *VECTORS], "link.csv", "EVALS"),
        (
            ["embed", "model.sklocus", "evals.csv", "-o", "evals.csv"],
            "evals.csv",
            "EVALS",
        ),
        (
            ["route", "model.sklocus", "evals.csv", "queries.txt", "-o", "link.csv"],
            "link.csv",
            "EVALS",
        ),
        (
            ["neighbors", "emb.csv", "-o", "sub/../emb.csv"],
            "sub/../emb.csv",
            "EMBEDDINGS",
        ),
        (
            ["clusters", "emb_link.csv", "--n-clusters", "2", "-o", "emb.csv"],
            "emb.csv",
            "EMBEDDINGS",
        ),
        (
            ["report", "model.sklocus", "evals.csv", "-o", "model.sklocus"],
            "model.sklocus",
            "MODEL",
        ),
        (
            ["serve", "model.sklocus", "evals.csv", "--router-file", "evals.csv"],
            "evals.csv",
            "EVALS",
        ),
        # Round 2, N4: state the command keeps (a journal, even one it has yet
        # to create; the token file) is never an output to save over.
        (
            ["serve", "model.sklocus", "evals.csv", "--router-file", "journal.db"]
            + ["--feedback-journal", "journal.db"],
            "journal.db",
            "--feedback-journal",
        ),
        (
            ["serve", "model.sklocus", "evals.csv", "--router-file", "sub/../j.db"]
            + ["--feedback-journal", "j.db"],
            "sub/../j.db",
            "--feedback-journal",
        ),
        (
            ["serve", "model.sklocus", "evals.csv", "--router-file", "tok"]
            + ["--token-file", "tok"],
            "tok",
            "--token-file",
        ),
        (
            ["estimate", "model.sklocus", "evals.csv", "queries.txt", "-o", "b.csv"]
            + ["--new-model", "m", "--scores", "b.csv"],
            "b.csv",
            "--scores",
        ),
    ],
)
def test_an_output_that_is_an_input_is_refused_before_any_work(
    workspace, no_work, argv, output, role, capsys
):
    folder, _ = workspace
    # Other spellings of an input: links to it, a detour through a folder.
    (folder / "link.csv").symlink_to(folder / "evals.csv")
    (folder / "emb_link.csv").symlink_to(folder / "emb.csv")
    (folder / "sub").mkdir()
    # Every input exists: a missing one is reported first, as "no such file".
    (folder / "b.csv").write_text("model,score\nm,0.5\n")
    before = contents(folder)
    line = one_line_error(*argv, cwd=folder, capsys=capsys)
    assert f"{output} is the same file as {role}" in line, line
    assert "expected an output that is not one of the inputs" in line
    assert contents(folder) == before


# -- 12: outputs are replaced whole, or not at all -------------------------------


@pytest.mark.parametrize(
    "argv, output, writer, position",
    [
        (
            ["clusters", "emb.csv", "--n-clusters", "2", "-o", "out.csv"],
            "out.csv",
            (pd.DataFrame, "to_csv"),
            1,
        ),
        (
            ["embed", "model.sklocus", "evals.csv", "-o", "out.parquet"],
            "out.parquet",
            (pd.DataFrame, "to_parquet"),
            1,
        ),
        (
            ["embed", "model.sklocus", "evals.parquet", "-o", "out.parquet"]
            + ["--stream"],
            "out.parquet",
            (sklocus.cli._models, "embed_parquet"),
            2,
        ),
        (
            ["report", "model.sklocus", "evals.csv", "-o", "out.html"],
            "out.html",
            (sklocus.report, "write_map"),
            0,
        ),
    ],
)
def test_ctrl_c_during_a_write_keeps_the_previous_file(
    workspace, monkeypatch, argv, output, writer, position, capsys
):
    folder, _ = workspace
    (folder / output).write_text("the previous output")

    def interrupted(*args, **kwargs):
        # Half the file written (``position`` is where the writer takes its
        # file), then Ctrl-C.
        with open(args[position], "w") as file:
            file.write("half a ta")
        raise KeyboardInterrupt

    monkeypatch.setattr(*writer, interrupted)
    before = set(contents(folder))
    result = run(*argv, cwd=folder, capsys=capsys)
    assert result.returncode == 130
    assert result.stderr.strip().splitlines()[-1] == f"sklocus {argv[0]}: interrupted"
    assert (folder / output).read_text() == "the previous output"
    assert set(contents(folder)) == before, "a temporary was left behind"


def test_a_kill_leaves_a_temporary_that_the_next_write_removes(workspace, capsys):
    folder, _ = workspace
    # What a kill in the middle of writing out.csv (or a model file) leaves.
    for name in (".out.csv.0123abcd.partial", ".m.sklocus.4567.partial"):
        (folder / name).write_text("half")
    (folder / ".other.csv.89ef.partial").write_text("another output's")
    argv = ("clusters", "emb.csv", "--n-clusters", "2", "-o", "out.csv")
    assert run(*argv, cwd=folder, capsys=capsys).returncode == 0
    assert pd.read_csv(folder / "out.csv").shape == (8, 2)
    argv = ("fit", "evals.csv", "-o", "m.sklocus", *VECTORS, *TINY)
    assert run(*argv, cwd=folder, capsys=capsys).returncode == 0
    hidden = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    assert hidden == [".other.csv.89ef.partial"]


def test_a_replaced_output_keeps_its_permissions_and_compression(workspace, capsys):
    folder, _ = workspace
    (folder / "out.csv.gz").write_text("old")
    os.chmod(folder / "out.csv.gz", 0o640)
    argv = ("clusters", "emb.csv", "--n-clusters", "2", "-o", "out.csv.gz")
    assert run(*argv, cwd=folder, capsys=capsys).returncode == 0
    assert (folder / "out.csv.gz").stat().st_mode & 0o777 == 0o640
    assert (folder / "out.csv.gz").read_bytes()[:2] == b"\x1f\x8b"  # gzip
    assert pd.read_csv(folder / "out.csv.gz")["cluster"].nunique() == 2


# -- 13: Ctrl-C during fit writes nothing and exits 130 -------------------------


def test_ctrl_c_during_fit_writes_nothing_and_exits_130(workspace, monkeypatch, capsys):
    folder, _ = workspace

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(LocusEmbedder, "fit", interrupted)
    before = contents(folder)
    argv = ["fit", "evals.csv", "-o", "new.sklocus", *VECTORS, *TINY]
    result = run(*argv, cwd=folder, capsys=capsys)
    assert result.returncode == 130
    assert result.stderr.strip().splitlines()[-1] == "sklocus fit: interrupted"
    assert "error" not in result.stderr
    assert contents(folder) == before


# -- 14: every output is checked before any work ---------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["fit", "evals.csv", "-o", "taken", *VECTORS],
            "argument -o/--output: taken is a folder; expected a file",
        ),
        (
            ["fit", "evals.csv", "-o", "nowhere/m.sklocus", *VECTORS],
            "nowhere/m.sklocus: the folder nowhere does not exist",
        ),
        (
            ["fit", "evals.csv", "-o", "locked/m.sklocus", *VECTORS],
            "locked/m.sklocus: cannot write in the folder locked",
        ),
        (
            ["route", "model.sklocus", "evals.csv", "queries.txt", "-o", "r.txt"],
            "argument -o/--output: r.txt: unknown file type; expected a .csv",
        ),
        (
            ["report", "model.sklocus", "evals.csv", "-o", "taken"],
            "argument -o/--output: taken is a folder; expected a file",
        ),
        (
            ["serve", "model.sklocus", "evals.csv", "--router-file", "taken"],
            "argument --router-file: taken is a folder; expected a file",
        ),
        (
            ["select", "emb.csv", "--n-selected", "2", "-o", "taken.csv"],
            "argument -o/--output: taken.csv is a folder; expected a file",
        ),
    ],
)
def test_an_output_that_cannot_be_written_fails_before_any_work(
    workspace, no_work, argv, message, capsys
):
    folder, _ = workspace
    (folder / "taken").mkdir()
    (folder / "taken.csv").mkdir()
    (folder / "locked").mkdir(mode=0o500)
    if "locked" in argv[3] and os.access(folder / "locked", os.W_OK):
        pytest.skip("running as a user who may write anywhere")
    line = one_line_error(*argv, cwd=folder, capsys=capsys)
    assert message in line, line


def test_a_byte_order_mark_is_not_part_of_the_first_id(workspace, capsys):
    folder, data = workspace
    queries = data.query_ids[:3]
    (folder / "bom.txt").write_text("\n".join(queries) + "\n", encoding="utf-8-sig")
    argv = ("route", "model.sklocus", "evals.csv", "bom.txt", "-o", "r.csv")
    result = run(*argv, cwd=folder, capsys=capsys)
    assert result.returncode == 0, result.stderr
    assert pd.read_csv(folder / "r.csv")["query"].tolist() == queries
    assert sklocus.cli._tables.read_lines(folder / "bom.txt") == queries


@pytest.mark.parametrize(
    "make, argv, message",
    [
        (
            "evals",
            ["embed", "model.sklocus", "bad.csv", "-o", "e.csv"],
            "bad.csv: line 2 has model 'bad\\nname' in column 'model'; model names "
            "must not hold control characters such as newlines",
        ),
        (
            "embeddings",
            ["neighbors", "bad.csv"],
            "bad.csv: line 3 has model 'tab\\tname' in column 'model'",
        ),
    ],
)
def test_control_characters_in_names_are_refused(
    workspace, make, argv, message, capsys
):
    folder, data = workspace
    if make == "evals":
        table = pd.read_csv(folder / "evals.csv")
        table.loc[table["model"] == table["model"][0], "model"] = "bad\nname"
        table.to_csv(folder / "bad.csv", index=False)
    else:
        table = pd.read_csv(folder / "emb.csv")
        table.loc[1, "model"] = "tab\tname"
        table.to_csv(folder / "bad.csv", index=False)
    line = one_line_error(*argv, cwd=folder, capsys=capsys)
    assert message in line, line
    assert not (folder / "e.csv").exists() and not (folder / "r.csv").exists()


# -- errors a person can read: where the row is, what its value is -------------

LONG_QUESTION = "What is " + "very " * 250 + "long?"


def _bad_table(folder, name, rows, columns=("model", "query", "score")):
    """Write ``rows`` as a CSV or Parquet table by ``name``'s suffix."""
    frame = pd.DataFrame(rows, columns=list(columns))
    if name.endswith(".csv"):
        frame.to_csv(folder / name, index=False)
    else:
        frame.to_parquet(folder / name)
    return name


@pytest.mark.parametrize(
    "name, where", [("bad.csv", "line 5"), ("bad.parquet", "row 4")]
)
def test_a_bad_score_names_the_row_as_the_file_shows_it_and_cuts_the_query(
    tmp_path, name, where, capsys
):
    # The line quoted the whole question (1,400 characters) and called CSV line
    # 5 (data row 3) "row 3".
    rows = [("a", "q1", 1), ("a", "q2", 0), ("b", "q1", 1), ("b", LONG_QUESTION, 1.7)]
    _bad_table(tmp_path, name, rows)
    line = one_line_error("fit", name, "-o", "m.sklocus", cwd=tmp_path, capsys=capsys)
    assert f"{name}: {where} (model 'b') has score 1.7 for query 'What is very" in line
    assert f"…' ({len(LONG_QUESTION):,} characters); scores must be" in line
    assert len(line) < 250, line


def test_a_csv_line_counts_the_lines_a_cell_above_spans(tmp_path, capsys):
    text = 'model,query,score\na,"two\nlines",1\n\nb,q1,2\n'
    (tmp_path / "bad.csv").write_text(text)
    line = one_line_error(
        "fit", "bad.csv", "-o", "m.sklocus", cwd=tmp_path, capsys=capsys
    )
    assert "bad.csv: line 5 (model 'b') has score 2" in line, line


def test_an_empty_score_cell_is_said_to_be_missing(tmp_path, capsys):
    (tmp_path / "gap.csv").write_text("model,query,score\na,q1,1\na,q2,\n")
    line = one_line_error(
        "fit", "gap.csv", "-o", "m.sklocus", cwd=tmp_path, capsys=capsys
    )
    assert "gap.csv: line 3 (model 'a') has no score for query 'q2'" in line, line
    assert "nan" not in line


def test_a_repeated_pair_names_the_option_not_the_keyword(tmp_path, capsys):
    rows = [("a", "q1", 1), ("b", "q1", 1), ("a", "q1", 0)]
    _bad_table(tmp_path, "twice.csv", rows)
    line = one_line_error(
        "fit", "twice.csv", "-o", "m.sklocus", cwd=tmp_path, capsys=capsys
    )
    assert (
        "twice.csv: model 'a' has 2 rows for query 'q1' (line 2, line 4); pass "
        "--duplicates mean or --duplicates majority" in line
    ), line
    assert "duplicates='mean'" not in line


def test_csv_cells_a_spreadsheet_would_run_are_quoted(workspace, capsys):
    """Issue 70, F20: a model named ``=1+1`` was written raw into a CSV."""
    folder, data = workspace
    table = pd.read_csv(folder / "evals.csv")
    first = table["model"][0]
    table.loc[table["model"] == first, "model"] = "=1+1"
    table.to_csv(folder / "formula.csv", index=False)
    result = run(
        "embed",
        "model.sklocus",
        "formula.csv",
        "-o",
        "e.csv",
        cwd=folder,
        capsys=capsys,
    )
    assert result.returncode == 0, result.stderr
    assert "1 text(s) starting with =, +, -, @" in result.stderr
    written = pd.read_csv(folder / "e.csv")["model"].tolist()
    assert "'=1+1" in written and "=1+1" not in written
    exact = run(
        "embed",
        "model.sklocus",
        "formula.csv",
        "-o",
        "e.parquet",
        cwd=folder,
        capsys=capsys,
    )
    assert exact.returncode == 0, exact.stderr
    assert "=1+1" in pd.read_parquet(folder / "e.parquet")["model"].tolist()


def test_quoting_for_spreadsheets_leaves_numbers_and_plain_text():
    frame = pd.DataFrame(
        {"model": ["a", "-b", "@c", "d=e"], "score": [-1.0, 2.0, 3.0, 4.0]}
    )
    safe, quoted = sklocus.cli._tables.spreadsheet_safe(frame)
    assert safe["model"].tolist() == ["a", "'-b", "'@c", "d=e"]
    assert safe["score"].tolist() == [-1.0, 2.0, 3.0, 4.0]
    assert quoted == 2
    assert frame["model"].tolist() == ["a", "-b", "@c", "d=e"]  # the caller's own
    renamed, quoted = sklocus.cli._tables.spreadsheet_safe(pd.DataFrame({"=x": [1]}))
    assert (list(renamed.columns), quoted) == (["'=x"], 1)


# -- round 2, N10: what the server keeps is its owner's alone --------------------


def test_a_token_file_others_may_read_is_refused(tmp_path, capsys):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    token.chmod(0o644)
    # The token is checked before the model is read: a file that only starts
    # as a model file does is enough (a missing one is reported first).
    (tmp_path / "m.sklocus").write_bytes(struct.pack("<Q", 2) + b"{}")
    line = one_line_error(
        "serve", "m.sklocus", "--token-file", "token", cwd=tmp_path, capsys=capsys
    )
    assert "can be read or written by other users (mode 0644)" in line, line
    assert "chmod 600" in line


@pytest.mark.parametrize("level", ["0", "1"])
def test_an_interval_at_confidence_0_or_1_is_refused_by_the_parser(
    tmp_path, level, capsys
):
    line = one_line_error(
        "estimate",
        "m.sklocus",
        "e.csv",
        "q.txt",
        "-o",
        "out.csv",
        "--new-model",
        "m",
        "--confidence",
        level,
        cwd=tmp_path,
        capsys=capsys,
    )
    assert "is not strictly between 0 and 1" in line, line
