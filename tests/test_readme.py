"""The README's shell block runs top to bottom on the data that ships."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sklocus

README = Path(__file__).resolve().parents[1] / "README.md"


def _shell_block():
    """The first bash block of the README's "From the shell" section."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## From the shell") :]
    start = section.index("```bash\n") + len("```bash\n")
    return section[start : section.index("\n```", start)]


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _routing_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("Routing accuracy")]


@pytest.mark.slow
@pytest.mark.readme
def test_the_readme_shell_block_runs_top_to_bottom(tmp_path):
    block = _shell_block()
    port = str(_free_port())
    # The block's port is the harness's one change: 8000 may be taken here.
    assert block.count("8000") == 3
    script = block.replace("8000", port)
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        SKLOCUS_ENCODING_CACHE=str(tmp_path / "cache"),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    )
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert "Traceback" not in run.stderr
    # fit and report measure the same router on the 500 test questions; route
    # measures its routes within the budget, beside the best single model.
    fit, route, report = _routing_lines(run.stderr)
    assert fit == report and fit.endswith("500 held-out queries of split 'test'.")
    assert route.endswith("500 held-out queries of split 'test'.")
    assert "the routes cost" in run.stderr
    assert len(pd.read_csv(tmp_path / "routes.csv")) == 500
    embeddings = pd.read_parquet(tmp_path / "embeddings.parquet")
    assert len(embeddings) == 9 and embeddings["input_price"].notna().all()
    assert (tmp_path / "model-map.html").stat().st_size > 0
    # curl's answer: one route, to a model of the pool.
    answer = json.loads(run.stdout[run.stdout.index('{"routes"') :].splitlines()[0])
    (routed,) = answer["routes"]
    assert routed["model"] in set(embeddings["model"])
    # The outcome was learnt into the router file that serve saved.
    router = sklocus.load(tmp_path / "router.sklocus")
    counts = dict(zip(router.classes_, np.diff(router.evaluation_offsets_)))
    assert counts["qwen2.5-7b-instruct"] == 6108 + 1
    assert counts["gemma-2-9b-it"] == 6108
