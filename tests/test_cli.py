import subprocess
import sys

import pytest

from sklocus.__main__ import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seed", "-1"], "argument --seed: -1 is out of range; expected from 0 to"),
        (["--seed", "abc"], "argument --seed: 'abc' is not an integer"),
        (["--epochs", "0"], "argument --epochs: 0 is out of range; expected from 1"),
        (["--epochs", "1.5"], "argument --epochs: '1.5' is not an integer"),
    ],
)
def test_a_bad_option_is_one_line_and_status_2(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["demo", *argv])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err == f"sklocus demo: error: {message}" + err.split(message, 1)[1]
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_command_line_reports_it_from_a_fresh_process():
    run = subprocess.run(
        [sys.executable, "-m", "sklocus", "demo", "--epochs", "-3"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "sklocus demo: error: argument --epochs: -3 is out of range; expected from 1"
    ]
