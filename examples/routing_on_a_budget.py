"""
Nine priced models, routed on a budget
======================================

The LLMRouter data that comes with sklocus holds what most teams have: a handful
of models they serve, each evaluated on thousands of their own questions, and
each model's price. This example fits a router with the library's defaults on
the train questions, then measures on the 500 test questions what matters when
routing saves money: the quality-cost frontier and its AIQ against mixing models
at random, the quality a budget buys, and whether the predicted probabilities
mean what they say.
"""

# %%
# The data, and a router with the defaults
# ----------------------------------------
#
# The example runs in the test suite, so it trains on 1,000 of the 5,608 train
# questions and for 2 epochs where the defaults train 8 (about a minute and a
# half on the whole pool); the questions come encoded by the default encoder,
# MiniLM, with sklocus. Everything else is the defaults: ``LocusRouter``
# trains a ``LocusEmbedder`` sized to the pool, refines each model's embedding
# and, on a pool this small, blends each model's own logistic regression on the
# query encodings with LOCUS (:ref:`query_heads`). The query encoder must
# understand the data's query ids; the budget is explained below.
import numpy as np
import pandas as pd
from sklearn.frozen import FrozenEstimator

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import load_llmrouter
from sklocus.metrics import (
    aiq,
    cost_at_quality,
    cost_quality_curve,
    expected_calibration_error,
    quality_at_cost,
    routing_accuracy,
)

data = load_llmrouter()
split = data.queries.set_index("query_id")["split"]
rng = np.random.default_rng(0)
train_ids = sorted(rng.choice(split.index[split == "train"], 1000, replace=False))
test_ids = list(split.index[split == "test"])
keep = set(train_ids)
train_sets = [{q: s for q, s in e.items() if q in keep} for e in data.evaluation_sets]
price = data.models.set_index("model").loc[data.model_names, "input_price"]

embedder = LocusEmbedder(query_encoder=data.encoder, max_epochs=2, random_state=0)
router = LocusRouter(embedder, budget=0.3)
router.fit_evaluations(train_sets, data.model_names, cost=price)
print(f"query heads' weight against LOCUS: {router.head_blend_:.2f}")

# %%
# Cost against quality on the test questions
# ------------------------------------------
#
# A question's cost is the model's price per million tokens times the
# question's length. Sweeping the weight of cost traces the router's frontier:
# the best mean score it reaches at each mean cost. Mixing models at random
# reaches the straight lines between single models; AIQ is the mean height of a
# frontier between the cheapest and the dearest model's cost.
# A row per question and a column per model, as sklocus.metrics takes them.
scores = np.array([[e[q] for e in data.evaluation_sets] for q in test_ids])
length = data.queries.set_index("query_id").loc[test_ids, "query"].str.len()
cost = length.to_numpy()[:, None] * price.to_numpy()[None, :] / 1e6
probabilities = router.predict_correctness(test_ids)

model_costs, model_qualities = cost.mean(axis=0), scores.mean(axis=0)
span = (model_costs.min(), model_costs.max())
best = int(np.argmax(model_qualities))
costs, qualities, _ = cost_quality_curve(scores, probabilities, cost)
print(f"best single model: {data.model_names[best]}, {model_qualities[best]:.3f}")
print(f"routed quality at cost weight 0: {routing_accuracy(scores, probabilities):.3f}")
print(f"AIQ, router: {aiq(costs, qualities, cost_range=span):.3f}")
print(f"AIQ, random mixing: {aiq(model_costs, model_qualities, cost_range=span):.3f}")
share = cost_at_quality(costs, qualities, model_qualities[best]) / model_costs[best]
print(f"cost share at the best model's quality: {share:.2f}")
print(
    "quality at half the best model's cost: "
    f"{quality_at_cost(costs, qualities, model_costs[best] / 2):.3f}"
)

# %%
# A budget, stated as a mean cost per question
# --------------------------------------------
#
# ``budget=`` asks for the best quality at a mean cost per question of at most
# this much (here in price per million tokens, the router's per-model cost):
# the router fitted above with ``budget=0.3`` chose its weight of cost on
# held-out halves of the pool's own evaluations, and keeps the curve it chose
# from, so each call can ask for a budget of its own.
for budget in (0.15, 0.3, 0.6):
    routes = router.predict(test_ids, budget=budget)
    chosen = pd.Index(data.model_names).get_indexer(routes)
    rows = np.arange(len(test_ids))
    print(
        f"budget {budget}: mean price {price.to_numpy()[chosen].mean():.3f}, "
        f"quality {scores[rows, chosen].mean():.3f}"
    )

# %%
# Do the probabilities mean what they say?
# ----------------------------------------
#
# The expected calibration error is the mean gap between predicted and observed
# success, bin by bin. ``calibration="isotonic"`` maps the router's
# probabilities through an isotonic calibrator fitted on held-out halves of the
# pool's evaluations; routes by the likeliest model stay as they were.
calibrated = LocusRouter(FrozenEstimator(router.embedder_), calibration="isotonic")
calibrated.fit_evaluations(train_sets, data.model_names, cost=price)
after = calibrated.predict_correctness(test_ids)
print(f"ECE before: {expected_calibration_error(scores, probabilities):.3f}")
print(f"ECE after calibration: {expected_calibration_error(scores, after):.3f}")
