"""How long the test suite takes: the whole of it, and the quick subset.

    python benchmarks/suite.py [--out docs/performance.md] [--only quick|full]

Runs, from the repository root, the README's test command ``python -m pytest``
(pyproject's options: one pytest-xdist worker per core, a test file per worker)
and the documented quick subset ``python -m pytest -m "not slow"``, each once,
and reports the wall-clock time with pytest's own count of passed, skipped and
deselected tests. Targets (issue 73): the whole suite in at most 5 minutes and
the quick subset in under 60 s, on an idle machine of 2 cores. The figures mean
something only on an otherwise idle machine. With ``--out``, writes its section
of that page.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch
from _sections import write_section
from provenance import commit

ROOT = Path(__file__).resolve().parents[1]
RUNS = {
    "full": ("`python -m pytest`", [], 300),
    "quick": ('`python -m pytest -m "not slow"`', ["-m", "not slow"], 60),
}
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed)")


def run(extra):
    """Run pytest with ``extra`` arguments; return seconds and its final counts."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    seconds = time.perf_counter() - start
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    counts = {kind: int(number) for number, kind in _COUNT.findall(summary)}
    if result.returncode != 0:
        print(result.stdout[-5000:], result.stderr[-2000:], sep="\n")
        raise SystemExit(f"pytest {' '.join(extra)} failed: {summary}")
    return seconds, counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", choices=sorted(RUNS))
    arguments = parser.parse_args()
    rows = []
    for name, (command, extra, target) in RUNS.items():
        if arguments.only and name != arguments.only:
            continue
        seconds, counts = run(extra)
        tally = ", ".join(f"{counts[kind]} {kind}" for kind in counts)
        verdict = "met" if seconds <= target else "**not met**"
        rows.append(
            f"| {command} | {seconds:.0f} s | {tally} | at most {target} s: {verdict} |"
        )
        print(rows[-1], flush=True)
    text = "\n".join(
        [
            "## The test suite",
            "",
            f"Written by `python benchmarks/suite.py` at commit {commit()} on "
            f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
            f"torch {torch.__version__}: each command once, from the repository "
            "root. The suite runs on one pytest-xdist worker per core; each worker "
            "keeps a test file's tests together (so a file's fitted fixtures are "
            "built once) and the examples, each a fresh process, spread over both.",
            "",
            "| command | wall clock | tests | target |",
            "|---|---|---|---|",
            *rows,
        ]
    )
    print(text)
    if arguments.out:
        write_section(arguments.out, "suite", text)


if __name__ == "__main__":
    main()
