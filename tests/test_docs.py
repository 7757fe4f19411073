"""The documentation site builds with warnings as errors and has its pages.

The build renders the example gallery without running the examples
(``-D plot_gallery=0``); the examples are run by their own tests.
"""

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import sklocus

# Builds the whole documentation with Sphinx.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Modules whose public names the API reference documents, beside sklocus itself.
MODULES = (
    "geometry",
    "metrics",
    "encoders",
    "evaluations",
    "datasets",
    "report",
    "cli",
)
USER_GUIDE = (
    "data",
    "encoders",
    "training",
    "onboarding",
    "score-estimation",
    "choosing-an-embedder",
    "routing",
    "learning-from-outcomes",
    "geometry",
    "persistence",
    "report",
    "cli",
)


def _require(module):
    """Import a documentation dependency: skip without it, but fail on CI."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    for module in ("sphinx", "numpydoc", "sphinx_gallery", "myst_parser"):
        _require(module)
    out = tmp_path_factory.mktemp("docs")
    command = [
        sys.executable,
        "-m",
        "sphinx",
        "-W",
        "--keep-going",
        "-q",
        "-b",
        "html",
        "-D",
        "plot_gallery=0",
        "-d",
        str(out / "doctrees"),
        str(DOCS),
        str(out / "html"),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, (
        f"the documentation build failed (status {result.returncode}):\n"
        f"{result.stdout}\n{result.stderr}"
    )
    return out / "html"


def test_key_pages_exist(site):
    pages = [
        "index",
        "api",
        "method",
        "generated/sklocus.LocusEmbedder",
        "generated/sklocus.LocusRouter",
        "user_guide/index",
        *(f"user_guide/{page}" for page in USER_GUIDE),
        "research/index",
        "research/results",
        "auto_examples/index",
    ]
    missing = [page for page in pages if not (site / f"{page}.html").is_file()]
    assert not missing, f"pages missing from the site: {missing}"


def test_every_markdown_report_is_in_the_site(site):
    reports = sorted(
        path.relative_to(DOCS).with_suffix("").as_posix()
        for path in DOCS.rglob("*.md")
        if not path.is_relative_to(DOCS / "_build")
    )
    assert "research/results" in reports
    missing = [name for name in reports if not (site / f"{name}.html").is_file()]
    assert not missing, f"Markdown pages missing from the site: {missing}"


def test_every_example_is_in_the_gallery(site):
    examples = sorted(path.stem for path in (ROOT / "examples").glob("*.py"))
    gallery = site / "auto_examples"
    missing = [name for name in examples if not (gallery / f"{name}.html").is_file()]
    assert not missing, f"examples missing from the gallery: {missing}"


def test_every_public_name_has_a_page(site):
    generated = site / "generated"
    names = [("sklocus", name, getattr(sklocus, name)) for name in sklocus.__all__]
    for short in MODULES:
        module = importlib.import_module(f"sklocus.{short}")
        names += [
            (module.__name__, name, getattr(module, name)) for name in module.__all__
        ]
    missing = []
    for module, name, obj in names:
        pages = [f"{module}.{name}"]
        # A name re-exported by sklocus is documented once, at the top level.
        if module != "sklocus" and getattr(sklocus, name, None) is obj:
            pages.append(f"sklocus.{name}")
        if not any((generated / f"{page}.html").is_file() for page in pages):
            missing.append(f"{module}.{name}")
    assert not missing, f"public names without an API page: {missing}"


# A commit's short hash (with a digit in it) after "commit", "at", "since"...,
# or alone in brackets.
_COMMIT = re.compile(
    r"(\b(?:commits?|at|since|predate|before|after)\s+|\()(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"
)


def test_the_user_guide_and_docstrings_name_no_commit():
    # They say what holds now; what was measured at which commit is recorded in
    # docs/research and the performance pages.
    places = [
        ROOT / "README.md",
        *sorted((DOCS / "user_guide").glob("*.*")),
        *sorted((ROOT / "sklocus").rglob("*.py")),
    ]
    for path in places:
        lines = path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            assert not _COMMIT.search(line), (
                f"{path.relative_to(ROOT)}:{number} names a commit: {line.strip()[:120]}"
            )


# Options every command that reads evaluations shares: cli.rst lists them once.
_SHARED_OPTIONS = {
    "--help",
    "--model-column",
    "--query-column",
    "--score-column",
    "--text-column",
    "--queries-text-column",
    "--duplicates",
    "--query-vectors",
    "--query-ids",
    "--encoding-cache",
    "--no-encoding-cache",
}


def test_the_command_lines_synopsis_lists_every_option():
    from sklocus.cli import build_parser

    text = (DOCS / "user_guide" / "cli.rst").read_text(encoding="utf-8")
    synopsis = text[: text.index("A session\n")]
    commands = next(a for a in build_parser()._actions if a.dest == "command")
    missing = {}
    for name, parser in commands.choices.items():
        # A command's line, and the lines that go on with it (indented, "[").
        lines = synopsis.splitlines()
        first = next(
            (
                i
                for i, line in enumerate(lines)
                if line.split()[:2] == ["sklocus", name]
            ),
            None,
        )
        assert first is not None, f"cli.rst's synopsis has no line for {name}"
        shown = lines[first]
        for line in lines[first + 1 :]:
            if not line.strip().startswith("["):
                break
            shown += line
        for action in parser._actions:
            options = set(action.option_strings) - _SHARED_OPTIONS
            long = [option for option in options if option.startswith("--")]
            if not long or any(re.search(rf"{o}\b", shown) for o in options):
                continue
            missing.setdefault(name, []).extend(long)
    assert not missing, f"options missing from cli.rst's synopsis: {missing}"
