"""The model map's HTML page, opened in a real headless Chromium with the network off.

Uses Debian's chromium package driven by Playwright for Python (Playwright cannot
download its own browser here; .ci/run installs the package). Skipped where either
is missing, except on CI, where that is a failure.
"""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from sklearn.neighbors import NearestNeighbors

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
# Software WebGL: the test machines have no GPU, and plotly's 3-D scatter needs WebGL.
CHROMIUM_ARGS = ["--use-gl=swiftshader", "--enable-unsafe-swiftshader"]
# A name that would end the data's script element, and inject markup, if either
# the JSON or the page's script were careless with it.
HOSTILE_NAME = "evil</script><b id='injected'>x</b>"


def make_map_data(n_models, *, random_state=0, k_neighbours=5):
    """A map's data built by hand, following the schema that render_html reads."""
    rng = np.random.default_rng(random_state)
    xyz = rng.normal(size=(n_models, 3))
    xyz[1] = xyz[0]  # model 1 behaves like model 0: a near-duplicate pair
    # Ask for one more than k: each model finds itself (or its twin) among them.
    search = NearestNeighbors(n_neighbors=k_neighbours + 1).fit(xyz)
    found_distances, found = search.kneighbors(xyz)
    models = [f"org-{i % 7}/model-{i}" for i in range(n_models)]
    models[2] = HOSTILE_NAME
    neighbours = [
        [
            [
                int(j),
                float(distance),
                None if j % 4 == 0 else float(rng.random()),
            ]
            for j, distance in zip(found[i], found_distances[i])
            if j != i
        ][:k_neighbours]
        for i in range(n_models)
    ]
    duplicates = [[] for _ in range(n_models)]
    duplicates[0], duplicates[1] = [1], [0]
    groups = ["mmlu", "gsm8k", "arc", "hellaswag"]
    accuracy = rng.random((n_models, len(groups))).tolist()
    accuracy[3][1] = None
    max_k = min(8, n_models)
    orders = {
        "k-center": rng.permutation(n_models)[:max_k].tolist(),
        "coverage": rng.permutation(n_models)[:max_k].tolist(),
    }
    convergence_n = [8, 16, 32, 64, 128]
    convergence = (
        1 / np.sqrt(convergence_n) * rng.uniform(0.5, 2, (n_models, 1))
    ).tolist()
    convergence[4][-2:] = [None, None]  # model 4 has fewer than 32 evaluations
    return {
        "title": "test map",
        "sklocus_version": "9.8.7",
        "models": models,
        "xyz": xyz.tolist(),
        "color": {
            "by": "cluster",
            "values": (np.arange(n_models) % 3).tolist(),
            "labels": ["cluster 0", "cluster 1", "cluster 2"],
        },
        "n_evaluations": rng.integers(20, 2000, n_models).tolist(),
        "metadata": {
            "parameters (B)": rng.uniform(0.1, 70, n_models).round(1).tolist(),
            "family": [name.split("/")[0] for name in models],
        },
        "groups": groups,
        "accuracy": accuracy,
        "neighbors": neighbours,
        "duplicates": duplicates,
        "portfolio": {
            "max_k": max_k,
            "default_k": 3,
            "n_held_out": 1250,
            "orders": orders,
            "routing": {
                "k-center": [None] + [0.5 + 0.03 * k for k in range(1, max_k)],
                "coverage": [0.4 + 0.03 * k for k in range(max_k)],
            },
            "full_pool": 0.81,
            "cost_ladder": {
                "by": "parameters (B)",
                "n_priced": n_models - 1,
                "max_total_cost": [7.0, 14.0, 28.0],
                "selections": [[5], [5, 9], [9, 11, 12]],
                "total_cost": [6.9, 13.5, 27.25],
                "routing": [None, 0.6, 0.7],
            },
        },
        "convergence": {"n": convergence_n, "distance": convergence},
        "reliability": {
            "predicted": [0.1, 0.3, 0.5, 0.7, 0.9],
            "observed": [0.15, 0.3, 0.45, 0.72, 0.85],
            "counts": [40, 60, 80, 60, 40],
            "ece": 0.0312,
        },
    }


def _require_browser():
    """Playwright's sync API, or a skip; on CI anything missing is a failure."""
    missing = []
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing.append("playwright (pip install playwright)")
        sync_playwright = None
    try:
        import plotly  # noqa: F401
    except ImportError:
        missing.append("plotly (pip install plotly)")
    if not os.path.exists(CHROMIUM):
        missing.append(f"{CHROMIUM} (apt-get install chromium)")
    if missing:
        message = "the browser test needs " + " and ".join(missing)
        # .ci/run sets SKLOCUS_NO_BROWSER, with its reason, when it could not
        # install chromium; any other gap on CI is a failure.
        if os.environ.get("CI") and not os.environ.get("SKLOCUS_NO_BROWSER"):
            pytest.fail(f"CI is set but {message}")
        pytest.skip(f"{message} ({os.environ.get('SKLOCUS_NO_BROWSER', 'not CI')})")
    return sync_playwright


@pytest.fixture(scope="module")
def browser():
    sync_playwright = _require_browser()
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()


class OfflinePage:
    """A page in its own context whose every non-file request is aborted and kept."""

    def __init__(self, browser, path):
        self.context = browser.new_context(viewport={"width": 1280, "height": 800})
        self.attempted_requests = []
        self.errors = []
        self.context.route("**/*", self._only_files)
        self.page = self.context.new_page()
        self.page.on(
            "console",
            lambda message: (
                message.type == "error" and self.errors.append(message.text)
            ),
        )
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("body[data-ready='true']", timeout=30_000)

    def _only_files(self, route):
        if route.request.url.startswith("file://"):
            route.continue_()
        else:
            self.attempted_requests.append(route.request.url)
            route.abort()

    def evaluate(self, script, argument=None):
        return self.page.evaluate(script, argument)

    def dataset(self, key):
        return self.evaluate("key => document.body.dataset[key]", key)

    def close(self):
        self.context.close()


def _render(data, path):
    from sklocus.report._html import render_html

    path.write_text(render_html(data, title=data["title"]), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def data():
    return make_map_data(40)


@pytest.fixture(scope="module")
def map_page(browser, data, tmp_path_factory):
    path = _render(data, tmp_path_factory.mktemp("map") / "map.html")
    page = OfflinePage(browser, path)
    yield page
    page.close()


def test_page_loads_offline_without_errors(map_page, data):
    assert map_page.page.title() == "test map"
    assert "40 models" in map_page.page.inner_text("#summary")
    assert "cluster" in map_page.page.inner_text("#summary")
    assert "sklocus 9.8.7" in map_page.page.inner_text("footer")
    assert map_page.errors == []
    assert map_page.attempted_requests == []


def test_the_reliability_diagram_shows_its_bins_and_error(map_page, data):
    assert map_page.page.inner_text("#reliability-ece") == "0.031"
    traces = map_page.page.evaluate(
        "document.getElementById('reliability-chart').data.map(t => t.y)"
    )
    assert traces == [[0, 1], data["reliability"]["observed"]]


def test_scatter_holds_one_point_per_model(map_page, data):
    lengths = map_page.evaluate(
        "() => { const trace = document.getElementById('map').data[0];"
        " return [trace.type, trace.x.length, trace.y.length, trace.z.length]; }"
    )
    assert lengths == ["scatter3d", 40, 40, 40]


def test_clicking_a_point_shows_its_neighbours(map_page, data):
    # A mouse click on a WebGL point depends on the camera and the GL picking
    # buffer; emit plotly's own click event instead, so the page's handler runs.
    map_page.evaluate(
        "i => { const map = document.getElementById('map');"
        " map.emit('plotly_click', {points: [{curveNumber: 0, pointNumber: i,"
        " data: map.data[0]}]}); }",
        7,
    )
    assert map_page.dataset("selected") == "7"
    assert map_page.page.inner_text("#model-name") == data["models"][7]
    rows = map_page.page.locator("#neighbours tbody tr")
    expected = [j for j, _, _ in data["neighbors"][7]]
    assert [
        int(rows.nth(r).get_attribute("data-model")) for r in range(rows.count())
    ] == expected
    first = rows.nth(0).locator("td")
    j, distance, disagreement = data["neighbors"][7][0]
    assert first.nth(0).inner_text() == data["models"][j]
    assert first.nth(1).inner_text() == f"{distance:.3f}"
    shown = "—" if disagreement is None else f"{100 * disagreement:.1f}%"
    assert first.nth(2).inner_text() == shown
    # The accuracy bars and the convergence chart are drawn for the selection.
    bars = map_page.evaluate("() => document.getElementById('accuracy').data[0].y")
    assert bars == pytest.approx(data["accuracy"][7])
    curve = map_page.evaluate("() => document.getElementById('convergence').data[0].y")
    assert curve == pytest.approx(data["convergence"]["distance"][7])
    assert map_page.errors == []


def test_clicking_a_neighbour_moves_the_selection(map_page, data):
    map_page.evaluate("i => window.sklocusMap.select(i)", 10)
    j = data["neighbors"][10][2][0]
    map_page.page.click(f"#neighbours tbody tr[data-model='{j}']")
    assert map_page.dataset("selected") == str(j)
    # The highlight trace moved to the neighbour; the main trace is untouched.
    highlighted = map_page.evaluate(
        "() => { const map = document.getElementById('map');"
        " return [map.data[1].customdata, map.data[0].x.length]; }"
    )
    assert highlighted == [[j], 40]
    assert map_page.page.inner_text("#model-name") == data["models"][j]


def test_duplicates_are_listed(map_page, data):
    map_page.evaluate("i => window.sklocusMap.select(i)", 0)
    assert (
        map_page.page.inner_text("#duplicates")
        == f"Near-duplicates: {data['models'][1]}"
    )
    map_page.evaluate("i => window.sklocusMap.select(i)", 5)
    assert map_page.page.inner_text("#duplicates") == "No near-duplicates."


def test_the_portfolio_opens_at_its_default_k_and_names_its_queries(map_page, data):
    orders = data["portfolio"]["orders"]
    assert map_page.page.input_value("#portfolio-k") == "3"
    assert map_page.dataset("portfolio") == ",".join(map(str, orders["k-center"][:3]))
    text = map_page.page.inner_text("#portfolio-queries")
    assert text == "on the 1,250 held-out queries"


def test_changing_k_changes_the_portfolio(map_page, data):
    orders = data["portfolio"]["orders"]
    map_page.page.select_option("#portfolio-method", "k-center")
    map_page.page.fill("#portfolio-k", "3")
    assert map_page.dataset("portfolio") == ",".join(map(str, orders["k-center"][:3]))
    map_page.page.fill("#portfolio-k", "1")
    assert map_page.dataset("portfolio") == str(orders["k-center"][0])
    assert map_page.page.inner_text("#portfolio-routing") == "—"  # null for k=1
    assert map_page.page.inner_text("#portfolio-full") == "81.0%"
    map_page.page.select_option("#portfolio-method", "coverage")
    map_page.page.fill("#portfolio-k", "4")
    assert map_page.dataset("portfolio") == ",".join(map(str, orders["coverage"][:4]))
    assert map_page.page.inner_text("#portfolio-routing") == "49.0%"
    trace = map_page.evaluate(
        "() => { const t = document.getElementById('map').data[2];"
        " return [t.name, t.customdata]; }"
    )
    assert trace == ["portfolio", orders["coverage"][:4]]
    assert map_page.page.locator("#portfolio-list li").count() == 4


def test_choosing_a_total_cost_shows_its_portfolio(map_page, data):
    ladder = data["portfolio"]["cost_ladder"]
    page = map_page.page
    assert page.is_hidden("#portfolio-total-cost-label")
    page.select_option("#portfolio-method", "total-cost")
    assert page.is_hidden("#portfolio-k-label")
    options = page.locator("#portfolio-total-cost option").all_inner_texts()
    assert options == [
        "parameters (B) ≤ 7",
        "parameters (B) ≤ 14",
        "parameters (B) ≤ 28",
    ]
    page.select_option("#portfolio-total-cost", label="parameters (B) ≤ 28")
    assert map_page.dataset("portfolio") == "9,11,12"
    assert page.inner_text("#portfolio-routing") == "70.0%"
    assert page.inner_text("#portfolio-cost") == (
        f"parameters (B) 27.25 of 28, among the {ladder['n_priced']} models whose "
        "parameters (B) is known"
    )
    assert page.locator("#portfolio-list li").count() == 3
    page.select_option("#portfolio-total-cost", label="parameters (B) ≤ 7")
    assert map_page.dataset("portfolio") == "5"
    assert page.inner_text("#portfolio-routing") == "—"
    # Back to a k: the total cost's note goes, and k's portfolio returns.
    page.select_option("#portfolio-method", "k-center")
    assert page.is_visible("#portfolio-k-label")
    assert page.inner_text("#portfolio-cost") == ""


def test_search_selects_the_named_model(map_page, data):
    map_page.page.fill("#search", data["models"][23])
    assert map_page.dataset("selected") == "23"
    map_page.page.fill("#search", "org-1/model-")  # not a full name: no change
    assert map_page.dataset("selected") == "23"
    options = map_page.evaluate(
        "() => document.querySelectorAll('#model-names option').length"
    )
    assert options == 40


def test_names_are_shown_as_text_not_markup(map_page, data):
    map_page.page.fill("#search", HOSTILE_NAME)
    assert map_page.dataset("selected") == "2"
    assert map_page.page.inner_text("#model-name") == HOSTILE_NAME
    assert map_page.page.locator("#injected").count() == 0


def test_screenshot_is_kept_as_an_artefact(map_page, tmp_path):
    map_page.evaluate("i => window.sklocusMap.select(i)", 7)
    path = tmp_path / "model-map.png"
    map_page.page.screenshot(path=str(path))
    assert path.stat().st_size > 10_000
    artefacts = os.environ.get("SKLOCUS_ARTEFACTS")
    if artefacts:
        Path(artefacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(artefacts) / path.name)
    assert map_page.errors == []
    assert map_page.attempted_requests == []


def test_map_data_without_evaluations_opens_cleanly(browser, tmp_path):
    # The page as write_map writes it from embeddings alone: no groups, accuracy,
    # evaluation counts, metadata, convergence or routing, so every optional
    # panel must cope with its data missing.
    from sklocus.report import write_map

    embeddings = np.random.default_rng(1).normal(size=(12, 8))
    names = [f"model-{i}" for i in range(12)]
    path = write_map(tmp_path / "bare.html", embeddings, names, title="bare map")
    page = OfflinePage(browser, path)
    try:
        assert (
            page.evaluate("() => document.getElementById('map').data[0].x.length") == 12
        )
        page.evaluate("i => window.sklocusMap.select(i)", 3)
        assert page.dataset("selected") == "3"
        assert page.page.locator("#neighbours tbody tr").count() > 0
        assert page.evaluate("() => document.getElementById('convergence').hidden")
        assert page.evaluate("() => document.getElementById('accuracy').hidden")
        assert page.page.locator("#facts tr").count() == 0
        page.page.fill("#portfolio-k", "2")
        assert len(page.dataset("portfolio").split(",")) == 2
        assert page.page.inner_text("#portfolio-routing") == "—"
        assert page.page.inner_text("#portfolio-full") == "—"
        assert page.page.inner_text("#portfolio-queries") == "(no held-out queries)"
        assert page.errors == []
        assert page.attempted_requests == []
    finally:
        page.close()
