import os
from pathlib import Path

import pytest

# The suite never touches the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "openllm"


@pytest.fixture(scope="session")
def openllm_path():
    """The real evaluation data beside the project; required in CI."""
    if not (SHARED_DATA / "responses.parquet").is_file():
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but the shared data is missing at {SHARED_DATA}")
        pytest.skip(f"the shared data is not at {SHARED_DATA}")
    return SHARED_DATA
