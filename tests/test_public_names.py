"""The command line, the server and the integrations use the estimators' public API.

What ``sklocus serve``, ``sklocus feedback`` or the LiteLLM router need of an
estimator, a user's own service needs too: so those faces call only what the
estimators offer everyone (learning a batch of outcomes, the counts of the kept
evaluations, the groups a query may be given, checking settings), never a
private method or attribute, nor a private name of the estimators' modules.
"""

import ast
import inspect
from pathlib import Path

import pytest

import sklocus

PACKAGE = Path(sklocus.__file__).parent
FACES = ("cli", "serve", "integrations")
ESTIMATORS = (
    "LocusEmbedder",
    "LocusRouter",
    "ScoreEstimator",
    "KCenterSelector",
    "KMedoidsSelector",
    "CoverageGreedySelector",
)
# The private modules (or packages) that define the estimators.
ESTIMATOR_MODULES = {
    ".".join(inspect.getmodule(getattr(sklocus, name)).__name__.split(".")[:2])
    for name in ESTIMATORS
}


def _private_members():
    """Private (one underscore) attributes and methods of the estimators."""
    found = {}
    for name in ESTIMATORS:
        for member in dir(getattr(sklocus, name)):
            if member.startswith("_") and not member.startswith("__"):
                found.setdefault(member, name)
    return found


PRIVATE = _private_members()
FILES = sorted(path for face in FACES for path in (PACKAGE / face).rglob("*.py"))


def _where(path, node):
    return f"sklocus/{path.relative_to(PACKAGE)}:{node.lineno}"


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.stem)
def test_faces_reach_no_private_member_of_an_estimator(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        # A face's own private names are its own (``self._router``).
        own = isinstance(node, ast.Attribute) and (
            isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
        )
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE and not own:
            raise AssertionError(
                f"{_where(path, node)} uses {node.attr}, private to "
                f"{PRIVATE[node.attr]}"
            )


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.stem)
def test_faces_import_no_private_name_of_an_estimator_module(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        if not any(
            node.module == module or node.module.startswith(module + ".")
            for module in ESTIMATOR_MODULES
        ):
            continue
        for alias in node.names:
            assert not alias.name.startswith("_"), (
                f"{_where(path, node)} imports {alias.name} from {node.module}"
            )


def test_the_checks_see_what_the_faces_once_used():
    assert {"_learn", "_kept", "_validate_params", "_check_params"} <= PRIVATE.keys()
    assert {"sklocus._router", "sklocus._embedder"} <= ESTIMATOR_MODULES
