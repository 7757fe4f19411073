"""How long sklocus takes to start: importing it, and the command line's first words.

    python benchmarks/startup.py [--repeats 9] [--out docs/performance.md]

Each case runs in a fresh interpreter ``--repeats`` times, the cases interleaved,
and its median wall-clock time is reported (with the fastest and slowest run):

- ``python -c pass``: the interpreter alone, the floor;
- ``import sklocus``: the package (its public names load on first use);
- ``sklocus --version`` and ``sklocus --help``: parsing only;
- ``sklocus neighbors`` on an embedding table of 200 models: a geometry command,
  which runs without torch;
- ``from sklocus import LocusEmbedder``: the estimators, torch and skorch with them.

The commands run as ``python -m sklocus``, which is what the installed ``sklocus``
script runs. The figures mean something only on an otherwise idle machine.
Targets (issue 34): ``--help`` and ``--version`` in at most 0.5 s, ``import sklocus``
in at most 1.5 s. With ``--out``, writes its section of that page.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from _sections import write_section
from provenance import commit

TARGETS = {"import sklocus": 1.5, "sklocus --version": 0.5, "sklocus --help": 0.5}


def cases(folder):
    """Each case's name and the arguments of the interpreter that runs it."""
    python = [sys.executable]
    command = [*python, "-m", "sklocus"]
    embeddings = folder / "embeddings.csv"
    return {
        "python -c pass (the floor)": [*python, "-c", "pass"],
        "import sklocus": [*python, "-c", "import sklocus"],
        "sklocus --version": [*command, "--version"],
        "sklocus --help": [*command, "--help"],
        "sklocus neighbors (200 models)": [*command, "neighbors", str(embeddings)],
        "from sklocus import LocusEmbedder": [
            *python,
            "-c",
            "from sklocus import LocusEmbedder",
        ],
    }


def write_embeddings(path, n_models=200, dim=64):
    vectors = np.random.default_rng(0).normal(size=(n_models, dim))
    table = pd.DataFrame(vectors, columns=[f"z{i}" for i in range(dim)])
    table.insert(0, "model", [f"model-{i}" for i in range(n_models)])
    table.to_csv(path, index=False)


def timed(argv):
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path, help="the page to write the section to")
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        write_embeddings(folder / "embeddings.csv")
        runs = cases(folder)
        for argv in runs.values():  # warm the file cache once
            timed(argv)
        seconds = {case: [] for case in runs}
        for _ in range(arguments.repeats):
            for case, argv in runs.items():
                seconds[case].append(timed(argv))
    rows = ["| what | median | fastest | slowest | target |", "|---|---|---|---|---|"]
    for case, times in seconds.items():
        median = statistics.median(times)
        target = TARGETS.get(case)
        verdict = (
            ""
            if target is None
            else f"at most {target} s: {'met' if median <= target else '**not met**'}"
        )
        rows.append(
            f"| `{case}` | {median:.2f} s | {min(times):.2f} s | {max(times):.2f} s "
            f"| {verdict} |"
        )
    text = "\n".join(
        [
            "## Starting up: import and the command line",
            "",
            f"Written by `python benchmarks/startup.py --repeats {arguments.repeats}` "
            f"at commit {commit()} on {datetime.date.today()}, {platform.machine()}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}. Each case "
            "runs in a fresh interpreter; the cases are interleaved. `import "
            "sklocus` loads none of torch, scikit-learn, SciPy or pandas: the public "
            "names import their modules on first use, and the command line imports "
            "a command's code only after parsing it, so `--help`, `--version` and "
            "usage errors need none of them and the geometry commands "
            "(`neighbors`, `duplicates`, `clusters`, `select`) run without torch "
            "(tests/test_startup.py checks which modules each loads).",
            "",
            *rows,
        ]
    )
    print(text)
    if arguments.out:
        write_section(arguments.out, "startup", text)


if __name__ == "__main__":
    main()
