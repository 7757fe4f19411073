"""How long the test suite takes: the whole of it, and the quick subset.

    python benchmarks/suite.py [--out docs/performance.md] [--only quick|full]

Runs, from the repository root, the README's test command ``python -m pytest``
(pyproject's options: one pytest-xdist worker per core, a test file per worker)
and the documented quick subset ``python -m pytest -m "not slow"``, and reports
the wall-clock time with pytest's own count of passed, skipped and deselected
tests. Python's compiled bytecode matters to a run: every worker imports every
module while collecting, and pytest rewrites the tests' asserts. A fresh clone,
as in CI, has none: the whole suite runs cold, after the repository's
``__pycache__`` folders are deleted. A developer runs the quick subset again and
again: it runs warm (with the bytecode the whole suite left) and cold.
Targets (issue 73): the whole suite in at most 5 minutes, cold, and the quick
subset in under 60 s, warm, on an idle machine of 2 cores. The figures mean
something only on an otherwise idle machine. With ``--out``, writes its section
of that page.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from _sections import write_section
from provenance import commit

ROOT = Path(__file__).resolve().parents[1]
# name: (command, its extra arguments, bytecode, target or None)
QUICK = ('`python -m pytest -m "not slow"`', ["-m", "not slow"])
RUNS = {
    "full": ("`python -m pytest`", [], "cold", ("at most", 300)),
    "quick": (*QUICK, "warm", ("under", 60)),
    "quick, cold": (*QUICK, "cold", None),
}
# Where the project's own modules are compiled (an editable install's too).
SOURCES = ("sklocus", "tests", "benchmarks", "examples", "docs")


def clear_bytecode():
    """Delete the project's compiled bytecode, as a fresh clone has none."""
    for folder in SOURCES:
        for cache in (ROOT / folder).rglob("__pycache__"):
            shutil.rmtree(cache)


_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?|xfailed)")


def run(extra):
    """Run pytest with ``extra`` arguments; return seconds and its final counts."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=_environment(),
    )
    seconds = time.perf_counter() - start
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    counts = {kind: int(number) for number, kind in _COUNT.findall(summary)}
    if result.returncode != 0:
        print(result.stdout[-5000:], result.stderr[-2000:], sep="\n")
        raise SystemExit(f"pytest {' '.join(extra)} failed: {summary}")
    return seconds, counts


def _environment():
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    # Bytecode is written, as Python does by default.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", choices=sorted(RUNS))
    arguments = parser.parse_args()
    rows = []
    for name, (command, extra, bytecode, target) in RUNS.items():
        if arguments.only and not name.startswith(arguments.only):
            continue
        if bytecode == "cold":
            clear_bytecode()
        elif not any((ROOT / "tests").glob("__pycache__/*.pyc")):
            # Warm, even when the whole suite did not run first.
            run(["--collect-only"])
        seconds, counts = run(extra)
        tally = ", ".join(f"{counts[kind]} {kind}" for kind in counts)
        if target is None:
            verdict = "(for comparison)"
        else:
            bound, limit = target
            met = seconds <= limit if bound == "at most" else seconds < limit
            verdict = f"{bound} {limit} s: " + ("met" if met else "**not met**")
        rows.append(
            f"| {command} | {bytecode} | {seconds:.1f} s | {tally} | {verdict} |"
        )
        print(rows[-1], flush=True)
    text = "\n".join(
        [
            "## The test suite",
            "",
            f"Written by `python benchmarks/suite.py` at commit {commit()} on "
            f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} cores, "
            f"torch {torch.__version__}: each command once, from the repository "
            "root; cold: with none of the project's compiled bytecode (a fresh "
            "clone, as in CI), warm: with what the run before left. The suite "
            "runs on one pytest-xdist worker per core; each worker keeps a test "
            "file's tests together (so a file's fitted fixtures are "
            "built once) and the examples, each a fresh process, spread over both.",
            "",
            "| command | bytecode | wall clock | tests | target |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    print(text)
    if arguments.out:
        write_section(arguments.out, "suite", text)


if __name__ == "__main__":
    main()
