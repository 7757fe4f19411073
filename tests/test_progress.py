"""Progress of long steps: plain lines in a log, one redrawn line on a terminal."""

import time

import pytest

from sklocus import _progress
from sklocus._progress import Progress, say, status


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


def _until(condition, seconds=20.0):
    """Wait for ``condition()`` (the ticker thread runs meanwhile), at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the ticker never reported"
        time.sleep(0.01)


@pytest.fixture
def terminal(monkeypatch):
    monkeypatch.setattr(_progress, "on_terminal", lambda: True)
    monkeypatch.setattr(_progress, "_TICK_SECONDS", 0.05)
    monkeypatch.setattr(_progress, "_TICKER_SECONDS", 0.01)
    monkeypatch.setattr(_progress, "_STATUS_DELAY", 0.0)


def test_on_a_terminal_a_still_step_is_redrawn_with_its_time(capsys, terminal):
    # One unit that lasts: the line moves all the same, drawn again and again.
    with Progress("Encoding query texts", 2, "text") as progress:
        _until(lambda: capsys.readouterr().err.count("\r") >= 1)
        _until(lambda: capsys.readouterr().err.count("\r") >= 1)
        progress.advance(2)
    assert "Encoding query texts: 2 texts in " in capsys.readouterr().err


def test_a_status_is_drawn_then_cleared_on_a_terminal(capsys, terminal):
    with status("Loading model.sklocus"):
        _until(lambda: "Loading model.sklocus... " in capsys.readouterr().err)
    err = capsys.readouterr().err
    # Cleared: blanks over the line, and the cursor back at its start.
    assert err.endswith("\r") and not err.strip()


def test_a_short_status_says_nothing_in_a_log(capsys):
    with status("Loading model.sklocus"):
        pass
    assert capsys.readouterr().err == ""


def test_a_long_status_writes_plain_lines_in_a_log(capsys, monkeypatch):
    monkeypatch.setattr(_progress, "_LINE_SECONDS", 0.05)
    monkeypatch.setattr(_progress, "_TICKER_SECONDS", 0.01)
    with status("Fitting the router"):
        _until(lambda: "Fitting the router... " in capsys.readouterr().err)
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1].startswith("Fitting the router: done in ")
    assert "\r" not in "".join(lines)


def test_an_inner_step_draws_over_its_outer_one(capsys, terminal):
    with status("Fitting the router"):
        _until(lambda: "Fitting the router" in capsys.readouterr().err)
        with Progress("Refining embeddings", 3, "model") as progress:
            progress.advance(3)
        _until(lambda: "Fitting the router" in capsys.readouterr().err)
    err = capsys.readouterr().err
    assert err.endswith("\r")


def test_say_clears_the_drawn_line_first(capsys, terminal):
    with Progress("Encoding query texts", 3, "text") as progress:
        progress.advance()
        say("Query texts: 1 of 3 from the encoding cache.")
        progress.advance(2)
    err = capsys.readouterr().err
    drawn = "Encoding query texts: 0/3 texts (0%), 0 s"
    cleared = f"\r{' ' * len(drawn)}\r"
    assert err.startswith(f"\r{drawn}{cleared}Query texts: 1 of 3 from the encoding")


def test_a_step_may_wait_longer_in_a_log_and_leave_its_end_to_what_follows(
    capsys, monkeypatch
):
    # An epoch: drawn at once on a terminal, silent in a log unless it lasts,
    # and ended by the table row that follows rather than a line of its own.
    def epoch():
        with Progress(
            "Epoch 1 of 3", 10, "batch", log_delay=3600, says_end=False
        ) as progress:
            progress.advance(10)

    epoch()
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(_progress, "on_terminal", lambda: True)
    epoch()
    err = capsys.readouterr().err
    assert err.startswith("\rEpoch 1 of 3: 0/10 batches (0%), 0 s")
    assert err.endswith("\r") and "\n" not in err
