"""The README's figures as a newcomer meets them: a fresh clone on this machine.

    python benchmarks/newcomer.py [--out docs/performance.md] [--only STEP ...]
                                  [--keep FOLDER]

Clones the repository's committed HEAD into a temporary folder, installs it in a
new virtual environment with the README's command, and runs there, each once
and one at a time, what the README times: its test command, the quick subset,
the main job (``python -m sklocus demo``), the tour's Python block, and the
README's shell block on the shipped LLMRouter data (data, fit, embed, route,
report, serve and feedback, with an empty encoding cache, as on a first day).
For each it reports the wall clock and the longest silence: the longest
stretch with no byte written to standard output or error, which is what a
newcomer waits through without a word. The demo, the tour and the command line
run on a terminal (a pseudo-terminal), as a newcomer runs them, where progress
is a line redrawn at least once a second; the install and the test commands
write to a pipe, as in a log. The targets: every README timing within 10% of
these figures, and no silence over 2 s in the demo, the tour or the command
line. Run it on
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
import shlex
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
# The shell step's commands, as the README's shell block gives them (a check
# holds them to it): on the shipped LLMRouter folder, "$DATA".
SHELL = (
    ("data", "sklocus data llmrouter"),
    ("fit", 'sklocus fit "$DATA" --test-split test -o model.sklocus'),
    (
        "embed",
        'sklocus embed model.sklocus "$DATA" -o embeddings.parquet '
        "--cost-column input_price",
    ),
    (
        "route",
        'sklocus route model.sklocus "$DATA" --test-split test -o routes.csv -k 3 '
        "--cost-column input_price --budget 0.3",
    ),
    (
        "report",
        'sklocus report model.sklocus "$DATA" --test-split test -o model-map.html',
    ),
    (
        "serve",
        'sklocus serve model.sklocus "$DATA" --router-file router.sklocus --port 8000',
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


def shell_block():
    """The README's shell block, each command on one line, without comments."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## From the shell") :]
    match = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    lines = match.group(1).replace("\\\n", " ").splitlines()
    return [" ".join(line.split("  #")[0].split()) for line in lines]


def check_shell_steps():
    """Fail unless every shell step is a command of the README's block."""
    block = shell_block()
    for _, command in SHELL:
        if not any(command in line for line in block):
            raise SystemExit(f"the README's shell block no longer runs {command!r}")


def shell_argv(command, data):
    """``command`` as the README types it, with its folder and this port."""
    command = command.replace("--port 8000", f"--port {PORT}")
    return [data if word == "$DATA" else word for word in shlex.split(command)]


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
            [python, "-m", "sklocus", "demo"], clone, env, terminal=True
        )
        check("demo", code, output)
        record("demo", "python -m sklocus demo", seconds, silence)
    if "tour" in arguments.only:
        tour = work / "tour"
        tour.mkdir(exist_ok=True)
        (tour / "tour.py").write_text(tour_code())
        seconds, silence, code, output = timed(
            [python, "tour.py"], tour, env, terminal=True
        )
        check("tour", code, output)
        record("tour", "the README's tour (python)", seconds, silence)
    if "shell" in arguments.only:
        shell = work / "shell"
        shutil.rmtree(shell, ignore_errors=True)
        shell.mkdir()
        check_shell_steps()
        found = subprocess.run(
            ["sklocus", "data", "llmrouter"], env=env, capture_output=True, text=True
        )
        check("sklocus data", found.returncode, found.stderr)
        data = found.stdout.strip()
        # The outcome the README's printf line writes.
        (shell / "outcomes.csv").write_text(
            "model,query,score\n"
            "qwen2.5-7b-instruct,What is the derivative of x squared?,1\n"
        )
        health = f"http://127.0.0.1:{PORT}/health"
        if answers(health):
            raise SystemExit(f"something answers on port {PORT} already: stop it")
        for name, command in SHELL:
            argv = shell_argv(command, data)
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
            "demo, the tour and the shell steps, as a newcomer runs them "
            "(progress is a line redrawn at least once a second), in a pipe for "
            "the install and the test commands (as in a log). The shell steps "
            "are the README's shell block on the shipped LLMRouter data (9 "
            "models, 6,108 questions, `DATA=$(sklocus data llmrouter)`) with an "
            "empty encoding cache, in its order, so `fit` encodes every question "
            "and the later commands find them cached; `serve` is timed until "
            "GET /health answers.",
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
