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


@pytest.mark.slow
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


def _error_and_loaded(argv, cwd):
    """Run main(argv) afresh: its status, its standard error, and which of HEAVY
    it had loaded when it returned."""
    code = (
        "import contextlib, io, json, sys\n"
        "from sklocus.cli import main\n"
        "stderr = io.StringIO()\n"
        "with contextlib.redirect_stderr(stderr):\n"
        f"    status = main({argv!r})\n"
        f"loaded = [m for m in {HEAVY!r} if m in sys.modules]\n"
        "print(json.dumps([status, stderr.getvalue(), loaded]))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd
    )
    assert run.returncode == 0, run.stderr
    status, stderr, loaded = json.loads(run.stdout.splitlines()[-1])
    return status, stderr, set(loaded)


@pytest.fixture
def inputs(tmp_path):
    """A long table, a safetensors file named as a model file, and a joblib file."""
    from safetensors.numpy import save_file

    frame = pd.DataFrame({"model": ["a", "b"], "query": ["q1", "q1"], "score": [1, 0]})
    frame.to_csv(tmp_path / "evals.csv", index=False)
    save_file({"x": np.zeros(2, np.float32)}, tmp_path / "model.sklocus")
    (tmp_path / "model.joblib").write_bytes(b"\x80\x04\x95" + bytes(16))
    return tmp_path


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["embed", "missing.sklocus", "missing.csv", "-o", "x.parquet"],
            "sklocus embed: error: missing.sklocus: no such model file",
        ),
        (
            ["fit", "missing.csv", "-o", "m.sklocus"],
            "sklocus fit: error: missing.csv: no such file or folder",
        ),
        (
            ["route", "model.sklocus", "evals.csv", "missing.txt", "-o", "r.csv"],
            "sklocus route: error: missing.txt: no such file",
        ),
        (
            ["embed", "evals.csv", "model.sklocus", "-o", "x.csv"],
            "MODEL evals.csv is not a model file: it looks like a CSV table; "
            "expected a model file from sklocus fit (EVALS model.sklocus looks like "
            "one: MODEL comes first, as in sklocus embed MODEL EVALS ...)",
        ),
        (
            ["embed", "model.joblib", "evals.csv", "-o", "x.csv"],
            "MODEL model.joblib is not a model file: it looks like a pickle",
        ),
        (
            ["fit", "model.sklocus", "-o", "m.sklocus"],
            "EVALS model.sklocus is not a table: it looks like a model file",
        ),
    ],
    ids=[
        "missing-model",
        "missing-evals",
        "missing-queries",
        "swapped",
        "joblib",
        "model-for-evals",
    ],
)
@pytest.mark.slow
def test_a_missing_or_wrong_input_is_reported_before_torch_is_imported(
    inputs, argv, message
):
    # The command's module imports PyTorch, which took seconds before a
    # mistyped name was reported.
    status, stderr, loaded = _error_and_loaded(argv, inputs)
    assert status == 2, stderr
    assert message in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not loaded & {"torch", "skorch", "sklearn"}, loaded


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


@pytest.mark.slow
def test_router_service_imports_without_the_serve_extra(inputs):
    # Block FastAPI as if it were not installed: RouterService needs none of the
    # HTTP layer; create_app and the command name the extra to install (given a
    # model file: a missing one is reported first).
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
        "assert main(['serve', 'model.sklocus']) == 2"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=inputs
    )
    assert run.returncode == 0, run.stderr
    assert "needs the serve extra (fastapi is missing)" in run.stderr
