import os
import sys
from pathlib import Path

import pytest
from marks import uses_a_slow_fixture

# The suite never touches the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# pytest-xdist runs the suite in several worker processes (pyproject's addopts):
# each takes its share of the cores, so that two workers on two cores do not each
# start two threads per operation. Processes the tests start inherit the share.
_WORKERS = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
if _WORKERS:
    _SHARE = str(max(1, (os.cpu_count() or 1) // int(_WORKERS)))
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, _SHARE)
    if "torch" in sys.modules:  # imported before this file: set it directly
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(scope="session", autouse=True)
def _encoding_cache_in_a_temporary_folder(tmp_path_factory):
    """Keep the command line's default encoding cache out of the user's own.

    Every command that encodes texts uses the cache by default; the tests, and
    the commands they start (which inherit the environment), use a folder of
    the session's. A test of the default itself sets its own variables.
    """
    folder = tmp_path_factory.mktemp("encoding-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SKLOCUS_ENCODING_CACHE", str(folder))
        yield folder


SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openllm"


@pytest.fixture(scope="session")
def openllm_path():
    """The real evaluation data beside the project; required in CI."""
    if not (SHARED_DATA / "responses.parquet").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the shared data is missing at {SHARED_DATA}")
        pytest.skip(f"the shared data is not at {SHARED_DATA}")
    return SHARED_DATA


def _is_example(nodeid):
    return nodeid.startswith("tests/test_examples.py::")


# Docstring examples that take seconds: this one loads MiniLM.
SLOW_DOCTESTS = {"sklocus.encoders.SentenceEncoder"}


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marks
def pytest_collection_modifyitems(config, items):
    """Mark slow the tests of slow fixtures, and run the examples first.

    The examples are the longest tests (see the scheduler below).
    """
    for item in items:
        if uses_a_slow_fixture(item) or item.name in SLOW_DOCTESTS:
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: not _is_example(item.nodeid))


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook
def pytest_xdist_make_scheduler(config, log):
    """Send each test file to one xdist worker, so module fixtures fit once.

    The examples are the exception: each runs in a fresh process of its own and
    shares nothing, so each is a unit of its own and they spread over the
    workers, in collection order (``--no-loadscope-reorder``: examples first,
    while the other files fill in around them). xdist's own ``loadgroup`` does
    not group on pytest 9, whose node ids it can no longer rename.
    """
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            return nodeid if _is_example(nodeid) else nodeid.split("::", 1)[0]

    return FileScheduling(config, log)


@pytest.fixture(scope="session")
def postgresql_server():
    """A throwaway PostgreSQL server for the session; required in CI.

    Started from the installed server binaries, which .ci/run installs where
    they are missing.
    """
    from sklocus.serve._store._throwaway import ThrowawayServer, binaries

    if binaries() is None:
        message = "no PostgreSQL server binaries (apt-get install postgresql)"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but there are {message}")
        pytest.skip(f"there are {message}")
    server = ThrowawayServer(fsync=False).start()
    yield server
    server.remove()


@pytest.fixture
def postgresql_database(postgresql_server):
    """The URI of a new, empty database on the session's PostgreSQL server."""
    import secrets

    import psycopg

    name = f"test_{secrets.token_hex(6)}"
    with psycopg.connect(postgresql_server.url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield postgresql_server.url.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(postgresql_server.url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
