"""The router's outputs, pinned: what a refactoring must leave as it was.

``tests/pinned/`` holds a small trained embedder and what routers over it
predicted at commit 1f14cec, before the router was split into stages (at the
defaults, with query groups, with both calibrations, with a budget, and LOCUS
alone, refined and not), and at commit 55f9b0d, before the stages became
objects of their own (clusters of queries, exploration, a budget's routes, a
pool changed after ``fit``, and two routers saved in model file format 8):
see ``tests/pinned_router.py``, which wrote them. On the machine that wrote them the outputs were bit-identical after the
split. Elsewhere refinement's Adam steps and the heads' fits round otherwise
(another BLAS kernel, another CPU), so they are compared within a tolerance far
above that rounding and far below what any change of a stage moves.
"""

import numpy as np
import pytest
from pinned_router import (
    EMBEDDER,
    OUTPUTS,
    ROUTER_FILES,
    SETTINGS,
    STAGE_OUTPUTS,
    STAGE_SETTINGS,
    fitted,
    pool,
    stage_router,
)

import sklocus

# Probabilities are on a scale of 1. Moving the pinned embedder's weights by a
# relative 1e-6 (far more than another CPU's rounding does) moved these outputs
# by at most 4.8e-7, and the embeddings by 3.6e-6 of their scale (three draws,
# AMD EPYC); the heads applied before the pool calibration instead of after it
# moved a probability by 0.27.
PROBABILITY_ATOL = 1e-4
EMBEDDING_RTOL = 1e-4
# Routes are indices, which rounding moves only where two models' utilities lie
# within it: on these 40 queries, never on the machine that wrote them. A stage
# applied wrongly moves many.
ROUTES_AGREEING = 0.95


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


@pytest.fixture(scope="module")
def stage_outputs():
    return np.load(STAGE_OUTPUTS)


def assert_as_pinned(router, expected, label):
    """``router``'s outputs on the test queries are those pinned for ``label``."""
    queries = pool()[1]
    np.testing.assert_allclose(
        router.predict_correctness(queries[120:]),
        expected[f"{label}/probabilities"],
        rtol=0,
        atol=PROBABILITY_ATOL,
    )
    reference = expected[f"{label}/embeddings"]
    np.testing.assert_allclose(
        router.embeddings_,
        reference,
        rtol=0,
        atol=EMBEDDING_RTOL * np.abs(reference).max(),
    )
    ranked, _ = router.rank_models(queries[120:], k=3)
    column = {name: j for j, name in enumerate(router.classes_.tolist())}
    routes = np.vectorize(column.get)(ranked)
    agreeing = (routes == expected[f"{label}/routes"]).all(axis=1).mean()
    assert agreeing >= ROUTES_AGREEING, (label, agreeing)
    if f"{label}/budget_curve" in expected.files:
        curve = expected[f"{label}/budget_curve"]
        np.testing.assert_allclose(
            router.budget_curve_, curve, rtol=0, atol=PROBABILITY_ATOL * curve.max()
        )
    if f"{label}/held_out_losses" in expected.files:
        np.testing.assert_allclose(
            list(router.held_out_losses_.values()),
            expected[f"{label}/held_out_losses"],
            rtol=0,
            atol=PROBABILITY_ATOL,
        )


@pytest.mark.parametrize("label", list(STAGE_SETTINGS))
def test_stages_route_as_pinned(pinned, stage_outputs, label):
    """Clusters, exploration, budgets and edited pools, fitted today."""
    embedder, _ = pinned
    _, queries, frame, groups, cost = pool()
    router = stage_router(label, embedder, queries, frame, groups, cost)
    assert_as_pinned(router, stage_outputs, label)


@pytest.mark.parametrize("label", list(ROUTER_FILES))
def test_router_files_of_format_8_route_as_pinned(stage_outputs, label):
    """A router saved in model file format 8 loads, and routes as it did."""
    router = sklocus.load(ROUTER_FILES[label])
    assert_as_pinned(router, stage_outputs, label)


@pytest.mark.parametrize("label", list(ROUTER_FILES))
def test_router_files_of_format_8_save_again_as_they_route(
    stage_outputs, label, tmp_path
):
    router = sklocus.load(ROUTER_FILES[label])
    path = tmp_path / "again.sklocus"
    sklocus.save(router, path)
    assert_as_pinned(sklocus.load(path), stage_outputs, label)
