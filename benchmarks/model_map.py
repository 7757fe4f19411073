"""Size and writing time of the model map of the whole Open LLM pool (issue 19).

Writes the map of every model of a data folder with a fitted embedder (training
excluded) and reports the file's size and the seconds it took::

    python benchmarks/model_map.py DATA_FOLDER --embedder FILE
        [--out model-map.html] [--screenshot PNG]

DATA_FOLDER holds the Open LLM Leaderboard data in sklocus's on-disk format
(``responses.parquet``, ``queries.parquet`` with ``benchmark`` and ``split``
columns, ``models.parquet``, precomputed query encodings; see
``sklocus.datasets.load_evaluations``). FILE is an embedder saved with
``sklocus.save``, e.g. by ``sklocus fit DATA_FOLDER -o FILE``. The map colours
models by architecture, groups queries by benchmark, offers portfolios within a
total parameter count, and measures portfolios on the test split. ``--screenshot``
opens the page in headless Chromium (Playwright and Debian's chromium) and saves
what it shows after clicking the first model.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import time
from pathlib import Path

import sklocus
from sklocus.datasets import load_evaluations
from sklocus.report import write_map

CHROMIUM = "/usr/bin/chromium"


def screenshot(page_path, png):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--use-gl=swiftshader", "--enable-unsafe-swiftshader"],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 860})
        start = time.perf_counter()
        page.goto(Path(page_path).resolve().as_uri())
        page.wait_for_function(
            "document.body.dataset.ready === 'true'", timeout=120_000
        )
        loaded = time.perf_counter() - start
        page.evaluate("window.sklocusMap.select(0)")
        page.wait_for_timeout(1500)
        page.screenshot(path=str(png))
        browser.close()
    return loaded


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--embedder", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=Path("model-map.html"))
    parser.add_argument("--screenshot", type=Path)
    arguments = parser.parse_args()

    data = load_evaluations(arguments.data)
    embedder = sklocus.load(arguments.embedder)
    queries = data.queries
    test = queries.loc[queries["split"] == "test", "query_id"].tolist()
    groups = dict(zip(queries["query_id"], queries["benchmark"]))
    # The leaderboard's -1 marks an unknown size: NaN leaves those models out of
    # the portfolios within a total cost instead of failing the cost check.
    metadata = data.models[["params_b", "arch"]]
    metadata = metadata.assign(params_b=metadata["params_b"].where(lambda p: p > 0))

    start = time.perf_counter()
    write_map(
        arguments.out,
        embedder,
        data.model_names,
        data.evaluation_sets,
        query_groups=groups,
        metadata=metadata,
        color="arch",
        test_queries=test,
        cost="params_b",
        title=f"The Open LLM Leaderboard: {len(data.model_names):,} models",
    )
    seconds = time.perf_counter() - start
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    size = arguments.out.stat().st_size
    print(f"commit {commit}, {datetime.date.today()}")
    print(f"models: {len(data.model_names)}, test queries: {len(test)}")
    print(f"wrote {arguments.out} in {seconds:.1f} s: {size / 2**20:.1f} MiB")
    from plotly.offline import get_plotlyjs

    print(f"of which plotly.js: {len(get_plotlyjs().encode()) / 2**20:.1f} MiB")
    if arguments.screenshot is not None:
        loaded = screenshot(arguments.out, arguments.screenshot)
        print(f"loaded in headless Chromium (software WebGL) in {loaded:.1f} s")
        print(f"screenshot: {arguments.screenshot}")


if __name__ == "__main__":
    main()
