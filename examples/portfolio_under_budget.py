"""
A portfolio within a total parameter count
==========================================

Serving every model of a pool is rarely affordable. This example picks a few
models whose parameters add up to at most a chosen total and which between them
cover the pool's behaviour, compares three ways of choosing, and measures how
well a router over each portfolio does on queries no step has seen, against
routing over the whole pool.
"""

# %%
# Embed the pool on training queries
# ----------------------------------
#
# A third of the queries are set aside as test queries: the embedder, the
# selectors and the routers see only the evaluations on the other two thirds.
# The settings train a small network in seconds (the defaults, sized to the
# pool, train for minutes on two cores).
import numpy as np
import pandas as pd
from sklearn.frozen import FrozenEstimator

from sklocus import (
    CoverageGreedySelector,
    KCenterSelector,
    KMedoidsSelector,
    LocusEmbedder,
    LocusRouter,
    to_matrix,
)
from sklocus.datasets import make_evaluations

data = make_evaluations(n_models=120, n_queries=600, random_state=0)
is_test = np.zeros(len(data.query_ids), dtype=bool)
is_test[np.random.default_rng(0).choice(len(is_test), size=200, replace=False)] = True
test_queries = [q for q, test in zip(data.query_ids, is_test) if test]
train_queries = [q for q, test in zip(data.query_ids, is_test) if not test]
scores, _ = to_matrix(data.evaluation_sets, data.query_ids)
Y = pd.DataFrame(scores, index=data.query_ids, columns=data.model_names)
Y_train, Y_test = Y.loc[train_queries], Y.loc[test_queries]
keep = set(train_queries)
train_sets = [
    {query: score for query, score in evaluations.items() if query in keep}
    for evaluations in data.evaluation_sets
]

embedder = LocusEmbedder(
    query_encoder=data.encoder,
    embedding_dim=32,
    n_latents=8,
    encoder_sizes=(8, 128),
    decoder_size=128,
    max_epochs=6,
    epoch_size=512,
    lr=3e-3,
    predictor_lr=1e-2,
    random_state=0,
)
Z = embedder.fit_transform(train_sets)
params_b = data.params_b  # each model's size, in billions of parameters
print(f"{len(Z)} models, {params_b.sum():.0f}B parameters in all")

# %%
# Choose within the total
# -----------------------
#
# :class:`~sklocus.CoverageGreedySelector` adds, while ``max_total_cost``
# allows, the model that covers the most of the pool per billion parameters;
# coverage is how close every model of the pool is to its nearest chosen one.
# The cost arrives as ``fit(Z, cost=...)``. :class:`~sklocus.KCenterSelector` and
# :class:`~sklocus.KMedoidsSelector` know no costs: given as many models as the
# greedy selector chose, they spread them over the embedding space, whatever
# the models weigh.
max_total_cost = 60
greedy = CoverageGreedySelector(max_total_cost=max_total_cost).fit(Z, cost=params_b)
n_selected = len(greedy.selected_indices_)
selectors = {
    "coverage greedy": greedy,
    "k-center": KCenterSelector(n_selected=n_selected).fit(Z),
    "k-medoids": KMedoidsSelector(n_selected=n_selected, random_state=0).fit(Z),
}
print(
    f"max total cost: {max_total_cost}B parameters; "
    f"coverage greedy chose {n_selected} models"
)

# %%
# Route over each portfolio
# -------------------------
#
# Each portfolio gets its own router, fitted on the training queries' scores
# with the frozen embedder (so ``fit`` only embeds). On the test queries,
# ``score`` is the routing accuracy: the mean observed score of the chosen
# model, over the queries that model was evaluated on. The synthetic data also
# give each route's expected accuracy, from the true probabilities, on every
# test query. The best single model (by training accuracy) is the baseline.
true = data.probabilities[is_test]


def evaluate(names):
    router = LocusRouter(FrozenEstimator(embedder)).fit(train_queries, Y_train[names])
    chosen = [data.model_names.index(name) for name in router.predict(test_queries)]
    return {
        "models": len(names),
        "parameters (B)": params_b[[data.model_names.index(n) for n in names]].sum(),
        "routing accuracy": router.score(test_queries, Y_test[names]),
        "expected accuracy": true[np.arange(len(test_queries)), chosen].mean(),
    }


best_single = Y_train.mean().idxmax()
rows = {"whole pool": evaluate(data.model_names)}
for name, selector in selectors.items():
    rows[name] = evaluate([data.model_names[i] for i in selector.selected_indices_])
rows["best single model"] = evaluate([best_single])
print(pd.DataFrame(rows).T.astype({"models": int}).round(3).to_string())
