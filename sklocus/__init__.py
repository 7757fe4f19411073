"""sklocus: LOCUS model embeddings for scikit-learn.

Represent every language model as one vector computed from its scored evaluations,
then compare, select and route models with ordinary scikit-learn tools.
"""

import importlib
from typing import TYPE_CHECKING

from sklocus._versioning import SklocusVersionWarning, __version__

# Each public name and the module that defines it. ``import sklocus`` imports none
# of them (torch and scikit-learn take seconds to import, and the command line's
# --help needs neither); the first use of a name imports its module (PEP 562).
_LAZY = {
    "CoverageGreedySelector": "sklocus._selection",
    "EmbeddingBatch": "sklocus._streaming",
    "KCenterSelector": "sklocus._selection",
    "KMedoidsSelector": "sklocus._selection",
    "LocusEmbedder": "sklocus._embedder",
    "LocusRouter": "sklocus._router",
    "ModelFileError": "sklocus._persistence",
    "PrecomputedEncoder": "sklocus.encoders",
    "ScoreEstimator": "sklocus._score_estimation",
    "SentenceEncoder": "sklocus.encoders",
    "check_evaluation_sets": "sklocus.evaluations",
    "embed_parquet": "sklocus._streaming",
    "from_long": "sklocus.evaluations",
    "from_matrix": "sklocus.evaluations",
    "iter_embeddings": "sklocus._streaming",
    "load": "sklocus._persistence",
    "save": "sklocus._persistence",
    "subsample": "sklocus.evaluations",
    "to_long": "sklocus.evaluations",
    "to_matrix": "sklocus.evaluations",
}
# Public submodules reachable as attributes, as after ``import sklocus.geometry``.
_SUBMODULES = ("datasets", "encoders", "evaluations", "geometry", "metrics")

__all__ = [
    "CoverageGreedySelector",
    "EmbeddingBatch",
    "KCenterSelector",
    "KMedoidsSelector",
    "LocusEmbedder",
    "LocusRouter",
    "ModelFileError",
    "PrecomputedEncoder",
    "ScoreEstimator",
    "SentenceEncoder",
    "SklocusVersionWarning",
    "__version__",
    "check_evaluation_sets",
    "embed_parquet",
    "from_long",
    "from_matrix",
    "iter_embeddings",
    "load",
    "save",
    "subsample",
    "to_long",
    "to_matrix",
]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"sklocus.{name}")
    else:
        raise AttributeError(f"module 'sklocus' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted({*globals(), *__all__, *_SUBMODULES})


if TYPE_CHECKING:  # what static tools and IDEs read in place of __getattr__
    from sklocus._embedder import LocusEmbedder
    from sklocus._persistence import ModelFileError, load, save
    from sklocus._router import LocusRouter
    from sklocus._score_estimation import ScoreEstimator
    from sklocus._selection import (
        CoverageGreedySelector,
        KCenterSelector,
        KMedoidsSelector,
    )
    from sklocus._streaming import EmbeddingBatch, embed_parquet, iter_embeddings
    from sklocus.encoders import PrecomputedEncoder, SentenceEncoder
    from sklocus.evaluations import (
        check_evaluation_sets,
        from_long,
        from_matrix,
        subsample,
        to_long,
        to_matrix,
    )
