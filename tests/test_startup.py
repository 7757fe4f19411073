"""What starting sklocus imports: the command line parses, and the geometry
commands run, without loading the libraries they do not need.

Each check runs in a fresh interpreter, since this one has imported everything
already; it asserts which modules were loaded, not how long that took (the
times are measured by benchmarks/startup.py).
"""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import sklocus

HEAVY = ("torch", "sklearn", "scipy", "pandas", "numpy", "skorch")


def loaded_after(code, cwd=None):
    """Which of HEAVY are in ``sys.modules`` after running ``code`` afresh."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=cwd
    )
    assert run.returncode == 0, run.stderr
    return set(json.loads(run.stdout.splitlines()[-1]))


def test_importing_the_package_loads_no_heavy_library():
    assert loaded_after("import sklocus") == set()


@pytest.mark.parametrize(
    "argv",
    [["--version"], ["--help"], ["fit", "--help"], ["serve", "--help"], ["route"]],
    ids=["version", "help", "fit-help", "serve-help", "usage-error"],
)
def test_parsing_the_command_line_loads_no_heavy_library(argv):
    code = (
        "from sklocus.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass"
    )
    assert loaded_after(code) == set()


def test_geometry_commands_run_without_torch(tmp_path):
    names = [f"model-{i}" for i in range(6)]
    vectors = np.random.default_rng(0).normal(size=(6, 3))
    table = pd.DataFrame(vectors, columns=["z0", "z1", "z2"]).assign(model=names)
    table[["model", "z0", "z1", "z2"]].to_csv(tmp_path / "embeddings.csv", index=False)
    code = (
        "from sklocus.cli import main\n"
        "for argv in (['neighbors', 'embeddings.csv', '-k', '2'],\n"
        "             ['duplicates', 'embeddings.csv'],\n"
        "             ['clusters', 'embeddings.csv', '--n-clusters', '2'],\n"
        "             ['select', 'embeddings.csv', '--n-selected', '2']):\n"
        "    assert main(argv) == 0, argv"
    )
    loaded = loaded_after(code, cwd=tmp_path)
    assert "torch" not in loaded and "skorch" not in loaded
    assert {"sklearn", "pandas"} <= loaded  # the commands did run


def test_every_public_name_resolves():
    for name in sklocus.__all__:
        assert getattr(sklocus, name) is not None, name
        assert name in dir(sklocus)
    for module in ("datasets", "encoders", "evaluations", "geometry", "metrics"):
        assert getattr(sklocus, module).__name__ == f"sklocus.{module}"


def test_an_unknown_name_is_an_attribute_error_that_names_it():
    with pytest.raises(AttributeError, match="'no_such_name'"):
        sklocus.no_such_name  # noqa: B018
    with pytest.raises(ImportError, match="no_such_name"):
        from sklocus import no_such_name  # noqa: F401


def test_router_service_imports_without_the_serve_extra():
    # Block FastAPI as if it were not installed: RouterService needs none of the
    # HTTP layer; create_app and the command name the extra to install.
    code = (
        "import sys\n"
        "sys.modules['fastapi'] = None\n"
        "from sklocus.serve import RouterService\n"
        "try:\n"
        "    from sklocus.serve import create_app\n"
        "except ImportError as error:\n"
        "    assert \"pip install 'sklocus[serve]'\" in str(error), error\n"
        "else:\n"
        "    raise AssertionError('create_app imported without FastAPI')\n"
        "from sklocus.cli import main\n"
        "assert main(['serve', 'no-such-model.sklocus']) == 2"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "needs the serve extra (fastapi is missing)" in run.stderr
