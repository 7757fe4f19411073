"""sklocus: LOCUS model embeddings for scikit-learn.

Represent every language model as one vector computed from its scored evaluations,
then compare, select and route models with ordinary scikit-learn tools.
"""

from sklocus._embedder import LocusEmbedder
from sklocus._persistence import ModelFileError, load, save
from sklocus._router import LocusRouter
from sklocus._selection import (
    CoverageGreedySelector,
    KCenterSelector,
    KMedoidsSelector,
)
from sklocus._streaming import EmbeddingBatch, embed_parquet, iter_embeddings
from sklocus._versioning import SklocusVersionWarning, __version__
from sklocus.encoders import PrecomputedEncoder, SentenceEncoder
from sklocus.evaluations import check_evaluation_sets, from_long, subsample, to_matrix

__all__ = [
    "CoverageGreedySelector",
    "EmbeddingBatch",
    "KCenterSelector",
    "KMedoidsSelector",
    "LocusEmbedder",
    "LocusRouter",
    "ModelFileError",
    "PrecomputedEncoder",
    "SentenceEncoder",
    "SklocusVersionWarning",
    "__version__",
    "check_evaluation_sets",
    "embed_parquet",
    "from_long",
    "iter_embeddings",
    "load",
    "save",
    "subsample",
    "to_matrix",
]
