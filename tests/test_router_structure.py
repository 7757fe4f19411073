"""The router's fitted state lives in its stages, and each stage is its own.

Each stage (:mod:`sklocus._router._stage`) is a frozen object built only in its
own module; the router's public fitted attributes are read from the stages, so
no module may assign one, and a stage changes only as a whole new object. The
router's modules stay short enough to read at once.
"""

import ast
import inspect
from pathlib import Path

import pytest

import sklocus
from sklocus._router._exploration import Exploration
from sklocus._router._stages import STAGES, Stages

PACKAGE = Path(sklocus.__file__).parent
ROUTER = PACKAGE / "_router"
MODULES = sorted(PACKAGE.rglob("*.py"))
STAGE_CLASSES = {cls.__name__: cls for cls in [*STAGES.values(), Exploration]}
STAGE_FILES = {
    name: Path(inspect.getsourcefile(cls)) for name, cls in STAGE_CLASSES.items()
}
# Modules that may build a changed copy of a stage (dataclasses.replace): the
# stage's own, and the base and the container that change all of them.
REPLACING = {*STAGE_FILES.values(), ROUTER / "_stage.py", ROUTER / "_stages.py"}
PUBLIC = {public for cls in STAGES.values() for public in cls.ATTRIBUTES}
MAX_LINES = 400


def _where(path, node):
    return f"sklocus/{path.relative_to(PACKAGE)}:{node.lineno}"


def _trees():
    for path in MODULES:
        yield path, ast.parse(path.read_text(encoding="utf-8"))


def _assigned(node):
    """The names an assignment node writes as attributes or ``vars()`` keys."""
    targets = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    for target in targets:
        for part in ast.walk(target):
            if isinstance(part, ast.Attribute):
                yield part.attr
            elif isinstance(part, ast.Subscript) and isinstance(
                part.slice, ast.Constant
            ):
                yield part.slice.value
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
        if len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
            yield node.args[1].value


def test_the_stages_hold_every_fitted_attribute_once():
    names = [public for cls in STAGES.values() for public in cls.ATTRIBUTES]
    # All 26 but the models (classes_) and the 5 kept evaluations' arrays.
    assert len(names) == len(set(names)) == 20
    assert set(Stages(None).to_arrays()) == PUBLIC


def test_no_module_assigns_a_stage_attribute():
    for path, tree in _trees():
        for node in ast.walk(tree):
            for name in _assigned(node):
                assert name not in PUBLIC, (
                    f"{_where(path, node)} assigns {name}, which the router reads "
                    "from its stages"
                )


def test_a_stage_is_built_in_its_own_module_only():
    for path, tree in _trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = getattr(func, "id", None) or getattr(func, "attr", None)
            if called in STAGE_CLASSES:
                assert path == STAGE_FILES[called], (
                    f"{_where(path, node)} builds a {called} outside its module"
                )
            module = getattr(getattr(func, "value", None), "id", None)
            if called == "replace" and module == "dataclasses":
                assert path in REPLACING, (
                    f"{_where(path, node)} changes a copy of a stage outside the "
                    "stages' modules"
                )


def test_the_checks_see_what_they_look_for():
    code = "router.embeddings_ = z\nsetattr(r, 'cost_', c)\nvars(r)['groups_'] = g"
    found = [name for node in ast.walk(ast.parse(code)) for name in _assigned(node)]
    assert {"embeddings_", "cost_", "groups_"} <= set(found)


@pytest.mark.parametrize("path", sorted(ROUTER.glob("*.py")), ids=lambda p: p.stem)
def test_router_modules_are_short(path):
    n_lines = len(path.read_text(encoding="utf-8").splitlines())
    assert n_lines < MAX_LINES, f"sklocus/_router/{path.name}: {n_lines} lines"
