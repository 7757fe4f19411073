"""sklocus: LOCUS model embeddings for scikit-learn.

Represent every language model as one vector computed from its scored evaluations,
then compare, select and route models with ordinary scikit-learn tools.
"""

from importlib.metadata import PackageNotFoundError, version

from sklocus._embedder import LocusEmbedder
from sklocus._router import LocusRouter
from sklocus._selection import (
    CoverageGreedySelector,
    KCenterSelector,
    KMedoidsSelector,
)
from sklocus.encoders import PrecomputedEncoder, SentenceEncoder
from sklocus.evaluations import check_evaluation_sets, from_long, subsample, to_matrix

try:
    __version__ = version("sklocus")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "CoverageGreedySelector",
    "KCenterSelector",
    "KMedoidsSelector",
    "LocusEmbedder",
    "LocusRouter",
    "PrecomputedEncoder",
    "SentenceEncoder",
    "__version__",
    "check_evaluation_sets",
    "from_long",
    "subsample",
    "to_matrix",
]
