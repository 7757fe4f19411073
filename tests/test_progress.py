"""Progress of long steps: plain lines in a log, one redrawn line on a terminal."""

import pytest

from sklocus import _progress
from sklocus._progress import Progress


def test_in_a_log_a_step_writes_its_start_tenths_and_end(capsys):
    with Progress("Counting", 20, "number") as progress:
        for _ in range(20):
            progress.advance()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "Counting: 20 numbers..."
    # One line per tenth done; none at the last, which the end line says.
    assert lines[1] == "Counting: 2 of 20 numbers (10%), 0 s"
    assert lines[-2] == "Counting: 18 of 20 numbers (90%), 0 s"
    assert len(lines) == 11
    assert lines[-1].startswith("Counting: 20 numbers in ")
    assert lines[-1].endswith(" s.")


def test_one_unit_is_singular(capsys):
    with Progress("Encoding query texts", 1, "text") as progress:
        progress.advance()
    err = capsys.readouterr().err
    assert err.startswith("Encoding query texts: 1 text...\n")
    assert "Encoding query texts: 1 text in " in err


def test_a_step_shorter_than_its_delay_says_nothing(capsys):
    with Progress("Refining embeddings", 4, "model", delay=3600) as progress:
        progress.advance(4)
    assert capsys.readouterr().err == ""


def test_disabled_progress_counts_but_says_nothing(capsys):
    with Progress("Embedding models", 3, "model", enabled=False) as progress:
        progress.advance(3)
    assert progress.done == 3
    assert capsys.readouterr().err == ""


def test_on_a_terminal_one_line_is_redrawn_and_ended(capsys, monkeypatch):
    monkeypatch.setattr(_progress, "on_terminal", lambda: True)
    monkeypatch.setattr(_progress, "_REDRAW_SECONDS", 0.0)
    with Progress("Encoding query texts", 3, "text") as progress:
        for _ in range(3):
            progress.advance()
    err = capsys.readouterr().err
    # Redrawn in place: one line in the end, whatever the redraws.
    assert err.count("\n") == 1 and err.endswith("\n")
    draws = err.split("\r")[1:]
    assert draws[0] == "Encoding query texts: 0/3 texts (0%), 0 s"
    assert draws[1].startswith("Encoding query texts: 1/3 texts (33%)")
    # The end pads over the longer line it replaces.
    assert draws[-1].startswith("Encoding query texts: 3 texts in ")
    assert draws[-1].rstrip().endswith(" s.")
    assert len(draws[-1]) - 1 >= len(draws[-2])


def test_a_failed_step_ends_the_terminal_line_and_says_no_end(capsys, monkeypatch):
    monkeypatch.setattr(_progress, "on_terminal", lambda: True)
    with pytest.raises(KeyboardInterrupt):
        with Progress("Encoding query texts", 3, "text") as progress:
            progress.advance()
            raise KeyboardInterrupt
    err = capsys.readouterr().err
    assert err.endswith("\n") and " in " not in err
    monkeypatch.setattr(_progress, "on_terminal", lambda: False)
    with pytest.raises(KeyboardInterrupt):
        with Progress("Encoding query texts", 3, "text"):
            raise KeyboardInterrupt
    assert capsys.readouterr().err == "Encoding query texts: 3 texts...\n"
