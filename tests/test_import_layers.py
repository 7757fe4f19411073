"""The package's modules import downwards only, and never in a circle.

Each module belongs to a layer; a module may import (at the top of the file or
inside a function) from its own layer and the layers below, never from above.
A new module must be given a layer here, which is the point: where it sits is a
decision, not an accident of what it happened to import.
"""

import ast
from pathlib import Path

import pytest

import sklocus

PACKAGE = Path(sklocus.__file__).parent

# Lowest first. A name stands for the module and, when it is a package, every
# module inside it.
LAYERS = [
    # scikit-learn's private names, imported here alone.
    ["_sklearn_compat"],
    # Checks, versions, files, devices, progress, the cache folder: no other
    # sklocus module but the one above.
    [
        "_validation",
        "_versioning",
        "_repr",
        "_files",
        "_shipped",
        "_file_kinds",
        "_device",
        "_progress",
        "_cache_folder",
        "_encoding_cache",
        "_packaged_models",
        "metrics",
        "_routing",
        "_cost_quality",
        "_model_posterior",
    ],
    # Data, query encoders, the torch network and the pure numerics of routing.
    [
        "evaluations",
        "_kept_evaluations",
        "encoders",
        "nn",
        "_groups",
        "calibration",
        "geometry",
        "_score_readout",
    ],
    # The estimators of models and the ways to feed them.
    ["_embedder", "_selection", "_streaming", "dask", "datasets", "_score_estimation"],
    ["_router"],
    # What is built on the estimators: model files and the model map.
    ["_persistence", "report"],
    ["serve"],
    # Routing inside other tools (LiteLLM), in process or through sklocus serve.
    ["integrations"],
    # The faces: the command line and the package's own namespace.
    ["cli", "__main__", ""],
]


def _modules():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _layer(module):
    for level, names in enumerate(LAYERS):
        for name in names:
            if module == name or (name and module.startswith(name + ".")):
                return level
    raise AssertionError(f"sklocus.{module} has no layer; add it to LAYERS")


def _imports(module, path):
    """Return ``(target, line, at_top)`` for each sklocus module it imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - node.level + 1]
                stem = ".".join([*base, *([node.module] if node.module else [])])
                base = "sklocus" + ("." + stem if stem else "")
            else:
                base = node.module
            # "from package import submodule" imports the submodule.
            names = [
                f"{base}.{alias.name}"
                if f"{base}.{alias.name}".removeprefix("sklocus.") in MODULES
                else base
                for alias in node.names
            ]
        else:
            continue
        for name in names:
            if name != "sklocus" and not name.startswith("sklocus."):
                continue
            target = name.removeprefix("sklocus").removeprefix(".")
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target != module:
                found.append((target, node.lineno, id(node) in top))
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def test_every_module_has_a_layer():
    for module in MODULES:
        _layer(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module):
    for target, line, _ in GRAPH[module]:
        assert _layer(target) <= _layer(module), (
            f"sklocus/{MODULES[module].relative_to(PACKAGE)}:{line} imports "
            f"sklocus.{target}, a layer above sklocus.{module}"
        )


def test_no_import_cycle_at_module_level():
    edges = {
        module: {target for target, _, at_top in found if at_top}
        for module, found in GRAPH.items()
    }
    done, path = set(), []

    def visit(module):
        if module in path:
            cycle = path[path.index(module) :] + [module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        path.append(module)
        for target in sorted(edges[module]):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(edges):
        visit(module)


def test_the_checks_find_what_they_look_for(tmp_path):
    # The parser sees relative, absolute and in-function imports.
    source = tmp_path / "probe.py"
    source.write_text(
        "from . import _validation\n"
        "from sklocus.nn import batching\n"
        "def f():\n"
        "    import sklocus.cli\n",
        encoding="utf-8",
    )
    found = _imports("_router", source)
    assert [(t, top) for t, _, top in found] == [
        ("_validation", True),
        ("nn.batching", True),
        ("cli", False),
    ]
    assert _layer("cli") > _layer("_router")


def test_private_scikit_learn_is_imported_in_one_module():
    # A scikit-learn release that moves a private name is then answered in
    # sklocus/_sklearn_compat.py alone.
    for module, path in MODULES.items():
        if module == "_sklearn_compat":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "sklearn"
            ):
                private = [
                    part
                    for part in [*node.module.split("."), *(a.name for a in node.names)]
                    if part.startswith("_")
                ]
                assert not private, (
                    f"sklocus/{path.relative_to(PACKAGE)}:{node.lineno} imports "
                    f"{private} from {node.module}; take it from sklocus._sklearn_compat"
                )


def test_the_benchmarks_import_neither_the_research_nor_the_tests():
    # A benchmark measures speed and scale of the package as installed, alone.
    root = PACKAGE.parent
    foreign = {"research", "tests", "conftest"} | {
        path.stem for path in (root / "tests").glob("*.py")
    }
    for path in sorted((root / "benchmarks").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in foreign, (
                    f"benchmarks/{path.name}:{node.lineno} imports {name}"
                )


def _top_level_names(tree):
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {
                (alias.asname or alias.name).split(".")[0] for alias in node.names
            }
    return names


def test_the_benchmarks_take_from_each_other_only_what_is_there():
    # benchmarks/feedback.py imported a helper another benchmark had renamed,
    # and nothing ran it until the next measurement.
    root = PACKAGE.parent / "benchmarks"
    trees = {
        path.stem: ast.parse(path.read_text(encoding="utf-8"))
        for path in root.glob("*.py")
    }
    defined = {stem: _top_level_names(tree) for stem, tree in trees.items()}
    for stem, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in trees:
                for alias in node.names:
                    assert alias.name in defined[node.module], (
                        f"benchmarks/{stem}.py:{node.lineno} imports {alias.name} "
                        f"from {node.module}, which has no such name"
                    )
