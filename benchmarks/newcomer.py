"""The README's figures as a newcomer meets them: a fresh clone on this machine.

    python benchmarks/newcomer.py [--out docs/performance.md] [--only STEP ...]
                                  [--keep FOLDER]

Clones the repository's committed HEAD into a temporary folder, installs it in a
new virtual environment with the README's command, and runs there, each once
and one at a time, what the README times: its test command, the quick subset,
the main job (``python -m sklocus demo``), the tour's Python block, and the
command line on the shipped LLMRouter data (fit, route, report and feedback,
with an empty encoding cache, as on a first day). For each it reports the wall
clock and the longest silence: the longest stretch with no byte written to
standard output or error, which is what a newcomer waits through without a
word. The command line runs on a terminal (a pseudo-terminal), as a newcomer
types it, where progress is a line redrawn at least once a second; the other
steps write to a pipe, as in a log, where progress comes as plain lines, one
per tenth of a step or 10 s. Issue 53's targets: every README timing within
10% of these figures, and no silence over 2 s in the command line. Run it on
an otherwise idle machine: the figures mean nothing beside another job.
``pip`` resolves the packages from the index as the README's command does, but
from its local cache where it has one, so the install time is a warm-cache
figure. With ``--out``, writes the ``newcomer`` section of that page.
"""

from __future__ import annotations

import argparse
import datetime
import fcntl
import os
import platform
import pty
import re
import selectors
import shutil
import struct
import subprocess
import sys
import tempfile
import termios
import time
import urllib.request
from pathlib import Path

from _sections import write_section
from provenance import commit

ROOT = Path(__file__).resolve().parents[1]
# The loopback port of the shell step's server.
PORT = 8765
STEPS = ("install", "suite", "quick", "demo", "tour", "shell")
# The shell step's commands on the LLMRouter data folder, as a newcomer types
# them (DATA, the folder; the test split's questions are routed).
SHELL = (
    ("fit", "sklocus fit DATA -o model.sklocus"),
    ("route", "sklocus route model.sklocus DATA test-queries.txt -o routes.csv"),
    ("report", "sklocus report model.sklocus DATA -o model-map.html"),
    (
        "serve",
        f"sklocus serve model.sklocus DATA --router-file router.sklocus --port {PORT}",
    ),
    ("feedback", "sklocus feedback router.sklocus outcomes.csv"),
)
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|errors?)")


def timed(command, cwd, env, ready=None, terminal=False):
    """Run ``command``; return seconds, the longest silence, exit code and output.

    Standard output and error are read as they come, chunk by chunk, so a bar
    redrawn without a newline counts as output as much as a line does. With
    ``ready`` (a function of nothing), a server: it is stopped as soon as
    ``ready()`` is true, and the figures run to that moment. With
    ``terminal``, both go to a pseudo-terminal of 120 columns, not a pipe.
    """
    start = time.perf_counter()
    if terminal:
        reader, writer = pty.openpty()
        size = struct.pack("HHHH", 40, 120, 0, 0)
        fcntl.ioctl(writer, termios.TIOCSWINSZ, size)
        output = error = writer
    else:
        output, error = subprocess.PIPE, subprocess.STDOUT
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=output,
        stderr=error,
        stdin=subprocess.DEVNULL,
    )
    if terminal:
        os.close(writer)
    else:
        reader = process.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(reader, selectors.EVENT_READ)
    chunks, last, silence = [], start, 0.0
    while True:
        if ready is not None and ready():
            process.terminate()
            break
        if not selector.select(timeout=0.5):
            continue
        try:
            chunk = os.read(reader, 65536)
        except OSError:  # a pseudo-terminal whose other end closed
            chunk = b""
        if not chunk:
            break
        now = time.perf_counter()
        silence, last = max(silence, now - last), now
        chunks.append(chunk)
    end = time.perf_counter()
    code = 0 if ready is not None else process.wait()
    process.wait()
    silence = max(silence, end - last)
    return end - start, silence, code, b"".join(chunks).decode(errors="replace")


def answers(url):
    """Whether a GET of ``url`` answers 200 now."""
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status == 200
    except OSError:
        return False


def check(name, code, output):
    if code != 0:
        print(output[-6000:])
        raise SystemExit(f"{name} failed with exit code {code}")


def tour_code():
    """The README's tour: its first Python block after the heading "A tour"."""
    readme = (ROOT / "README.md").read_text()
    tour = readme[readme.index("## A tour") :]
    match = re.search(r"```python\n(.*?)```", tour, re.DOTALL)
    return match.group(1)


def shell_inputs(folder, python, env):
    """The data folder's path, and the queries and outcomes the shell step uses."""
    script = (
        "from importlib.resources import files\n"
        "import pandas as pd\n"
        "data = files('sklocus.datasets') / 'data' / 'llmrouter'\n"
        "print(data)\n"
        "queries = pd.read_parquet(data / 'queries.parquet')\n"
        "test = queries.loc[queries['split'] == 'test', 'query_id'].astype(str)\n"
        "open('test-queries.txt', 'w').write('\\n'.join(test) + '\\n')\n"
        "answers = pd.read_parquet(data / 'responses.parquet')\n"
        "answers = answers[answers['query_id'].astype(str).isin(set(test[:100]))]\n"
        "answers.rename(columns={'query_id': 'query'}).to_csv(\n"
        "    'outcomes.csv', index=False)\n"
    )
    found = subprocess.run(
        [python, "-c", script], cwd=folder, env=env, capture_output=True, text=True
    )
    check("reading the LLMRouter data", found.returncode, found.stderr)
    return found.stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--only", nargs="+", choices=STEPS, default=list(STEPS))
    parser.add_argument("--keep", type=Path, help="clone here, and keep it")
    arguments = parser.parse_args()
    work = arguments.keep or Path(tempfile.mkdtemp(prefix="sklocus-newcomer-"))
    clone = work / "sklocus"
    rows = []

    def record(step, command, seconds, silence, note=""):
        rows.append(
            f"| {step} | `{command}` | {seconds:.0f} s | {silence:.1f} s | {note} |"
        )
        print(rows[-1], flush=True)

    if not clone.exists():
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    venv = work / "venv"
    python = str(venv / "bin" / "python")
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}",
        # A newcomer's first day: nothing encoded before.
        "XDG_CACHE_HOME": str(work / "cache"),
    }
    env.pop("SKLOCUS_ENCODING_CACHE", None)
    env.pop("VIRTUAL_ENV", None)
    if "install" in arguments.only or not venv.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        argv = [python, "-m", "pip", "install", "-c", "constraints-cpu.txt"]
        seconds, silence, code, output = timed([*argv, "-e", ".[test]"], clone, env)
        check("install", code, output)
        command = 'pip install -c constraints-cpu.txt -e ".[test]"'
        record("install", command, seconds, silence, "pip's cache warm")
    for step, extra in (("suite", []), ("quick", ["-m", "not slow"])):
        if step not in arguments.only:
            continue
        seconds, silence, code, output = timed(
            [python, "-m", "pytest", "-p", "no:cacheprovider", *extra], clone, env
        )
        check(step, code, output)
        tail = output.strip().splitlines()[-1]
        tally = ", ".join(f"{n} {kind}" for n, kind in _COUNT.findall(tail))
        shown = "python -m pytest" + (' -m "not slow"' if extra else "")
        record(step, shown, seconds, silence, tally)
    if "demo" in arguments.only:
        seconds, silence, code, output = timed(
            [python, "-m", "sklocus", "demo"], clone, env
        )
        check("demo", code, output)
        record("demo", "python -m sklocus demo", seconds, silence)
    if "tour" in arguments.only:
        tour = work / "tour"
        tour.mkdir(exist_ok=True)
        (tour / "tour.py").write_text(tour_code())
        seconds, silence, code, output = timed([python, "tour.py"], tour, env)
        check("tour", code, output)
        record("tour", "the README's tour (python)", seconds, silence)
    if "shell" in arguments.only:
        shell = work / "shell"
        shutil.rmtree(shell, ignore_errors=True)
        shell.mkdir()
        data = shell_inputs(shell, python, env)
        health = f"http://127.0.0.1:{PORT}/health"
        if answers(health):
            raise SystemExit(f"something answers on port {PORT} already: stop it")
        for name, command in SHELL:
            argv = command.replace("DATA", data).split()
            ready = (lambda: answers(health)) if name == "serve" else None
            seconds, silence, code, output = timed(
                argv, shell, env, ready, terminal=True
            )
            check(name, code, output)
            note = "until GET /health answers" if ready else ""
            trained = re.search(r"Trained in [^\r\n]*", output)
            if trained:  # fit's own account of where its time went
                note = trained.group(0)
            record(name, command, seconds, silence, note)
            print(output[-1500:], flush=True)
    text = "\n".join(
        [
            "## A newcomer's first hour",
            "",
            f"Written by `python benchmarks/newcomer.py` at commit {commit()} on "
            f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} "
            "cores, Python "
            f"{platform.python_version()}: a fresh clone of the commit, installed "
            "in a new virtual environment by the README's command, each step once "
            "on an idle machine. The longest silence is the longest time with "
            "nothing written to standard output or error: on a terminal for the "
            "shell steps, as a newcomer types them (progress is a line redrawn "
            "at least once a second), in a pipe for the others (as in a log, "
            "where progress comes in plain lines, one per tenth of a step or "
            "10 s). The shell steps run on the shipped LLMRouter data (9 "
            "models, 6,108 questions) with an empty encoding cache, in this "
            "order, so `fit` encodes every question and the later commands find "
            "them cached.",
            "",
            "| step | command | wall clock | longest silence | notes |",
            "|---|---|---|---|---|",
            *rows,
        ]
    )
    print(text)
    if arguments.out:
        write_section(arguments.out, "newcomer", text)
    if arguments.keep is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
