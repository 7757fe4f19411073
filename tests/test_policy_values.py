"""Booleans and text are not numbers: costs, policies and scores refuse them.

Hostile input round 2, N9: ``LocusRouter(budget=True)`` and ``cost=[True] * n``
fitted, and ``partial_fit`` took the score ``"1"``.
"""

import numpy as np
import pandas as pd
import pytest
from tiny import TINY_NETWORK

from sklocus import LocusEmbedder, LocusRouter
from sklocus._validation import check_costs
from sklocus.datasets import make_evaluations


@pytest.fixture(scope="module")
def pool():
    data = make_evaluations(
        n_models=4, n_queries=60, evals_per_model=None, query_dim=8, random_state=0
    )
    table = pd.DataFrame(
        {
            name: [evaluations[q] for q in data.query_ids]
            for name, evaluations in zip(data.model_names, data.evaluation_sets)
        }
    )
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK)
    return data, table, embedder


@pytest.mark.parametrize(
    "params",
    [
        {"budget": True},
        {"min_probability": True, "cost_weight": 0.0},
        {"cost_weight": True},
        {"group_shrinkage": True},
        {"exploration_strength": False},
    ],
)
def test_a_boolean_policy_setting_is_refused(pool, params):
    data, table, embedder = pool
    router = LocusRouter(embedder, refine_steps=0, **params)
    name = next(iter(params))
    with pytest.raises(ValueError, match=f"'{name}' parameter"):
        router.fit(data.query_ids, table)


@pytest.mark.parametrize("value", [True, np.bool_(False), "1", b"2"])
def test_a_cost_that_is_not_a_number_is_refused_by_name(value):
    costs = [1.0, value, 3.0]
    with pytest.raises(TypeError, match=r"model 'b' has cost .*costs must be numbers"):
        check_costs(costs, ["a", "b", "c"])


def test_a_router_refuses_boolean_costs(pool):
    data, table, embedder = pool
    router = LocusRouter(embedder, refine_steps=0, cost_weight=0.5)
    with pytest.raises(TypeError, match="costs must be numbers, not bool"):
        router.fit(data.query_ids, table, cost=[True] * table.shape[1])


def test_a_score_given_as_text_is_refused_by_partial_fit(pool):
    data, table, embedder = pool
    router = LocusRouter(embedder, refine_steps=0).fit(data.query_ids, table)
    outcomes = pd.DataFrame({data.model_names[1]: ["1"]}, dtype=object)
    before = router.evaluations().copy()
    with pytest.raises(TypeError, match=r"query 'q00000' is '1', text"):
        router.partial_fit(data.query_ids[:1], outcomes)
    pd.testing.assert_frame_equal(router.evaluations(), before)
