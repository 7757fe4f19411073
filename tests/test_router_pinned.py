"""The router's outputs, pinned: what a refactoring must leave as it was.

``tests/pinned/`` holds a small trained embedder and what routers over it
predicted at commit 1f14cec, before the router was split into stages (at the
defaults, with query groups, with both calibrations, with a budget, and LOCUS
alone, refined and not): see ``tests/pinned_router.py``, which wrote
them. On the machine that wrote them the outputs were bit-identical after the
split. Elsewhere refinement's Adam steps and the heads' fits round otherwise
(another BLAS kernel, another CPU), so they are compared within a tolerance far
above that rounding and far below what any change of a stage moves.
"""

import numpy as np
import pytest
from pinned_router import EMBEDDER, OUTPUTS, SETTINGS, fitted, pool

import sklocus

# Probabilities are on a scale of 1. Moving the pinned embedder's weights by a
# relative 1e-6 (far more than another CPU's rounding does) moved these outputs
# by at most 4.8e-7, and the embeddings by 3.6e-6 of their scale (three draws,
# AMD EPYC); the heads applied before the pool calibration instead of after it
# moved a probability by 0.27.
PROBABILITY_ATOL = 1e-4
EMBEDDING_RTOL = 1e-4


@pytest.fixture(scope="module")
def pinned():
    return sklocus.load(EMBEDDER), np.load(OUTPUTS)


@pytest.mark.parametrize("label", list(SETTINGS))
def test_router_predicts_as_pinned(pinned, label):
    embedder, expected = pinned
    data, queries, frame, groups, cost = pool()
    router = fitted(label, embedder, queries, frame, groups, cost)
    test_groups = groups[120:] if label == "groups" else None
    probabilities = router.predict_correctness(queries[120:], test_groups)
    np.testing.assert_allclose(
        probabilities, expected[f"{label}/probabilities"], rtol=0, atol=PROBABILITY_ATOL
    )
    reference = expected[f"{label}/embeddings"]
    scale = np.abs(reference).max()
    np.testing.assert_allclose(
        router.embeddings_, reference, rtol=0, atol=EMBEDDING_RTOL * scale
    )
