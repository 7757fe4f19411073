"""
Substitutes and fallback
========================

When a model goes down, its traffic has to go somewhere. A router knows which
models behave most like it (its substitutes) and can route around any models
that are unavailable. This example takes down the model that gets the most
queries and sees where they go and what that costs.
"""

# %%
# A router over the pool
# ----------------------
#
# An embedder trained on a synthetic pool, frozen, and a router over every model.
# The settings train a small network in seconds (the defaults, sized to the
# pool, train for minutes on two cores).
import numpy as np
import pandas as pd
from sklearn.frozen import FrozenEstimator

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.geometry import nearest_models

data = make_evaluations(n_models=120, n_queries=600, random_state=0)
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
).fit(data.evaluation_sets)
router = LocusRouter(FrozenEstimator(embedder))
router.fit_evaluations(data.evaluation_sets, data.model_names)
queries = data.query_ids

routes = pd.Series(router.predict(queries), index=queries)
print("queries per model:")
print(routes.value_counts().head(5).to_string())

# %%
# The busiest model's substitutes
# -------------------------------
#
# ``substitutes`` lists the models nearest to one model in embedding space, in
# units of a typical distance between two models of the pool: the models that
# answer most like it.
busiest = routes.value_counts().index[0]
substitutes = router.substitutes(busiest, k=3)
print(substitutes.round(4))

# %%
# It goes down
# ------------
#
# ``predict(queries, exclude=[...])`` routes each query to the best model still
# available. The busiest model's queries go elsewhere; the other queries keep
# their routes, as the last line below counts.
fallback = pd.Series(router.predict(queries, exclude=[busiest]), index=queries)
moved = routes == busiest
print(f"{moved.sum()} queries lose {busiest}; they now go to:")
print(fallback[moved].value_counts().head(5).to_string())
nearest_substitute = substitutes.index[0]
share = (fallback[moved] == nearest_substitute).mean()
print(
    f"share of them sent to its nearest substitute, {nearest_substitute}: {share:.2f}"
)
changed = (fallback[~moved] != routes[~moved]).sum()
print(f"queries of other models that changed route: {changed}")

# %%
# What does the outage cost? The synthetic data give the true probability that
# each model answers each query, hence each routing's expected accuracy on
# every query.


def expected_accuracy(names):
    chosen = [data.model_names.index(name) for name in names]
    return data.probabilities[np.arange(len(queries)), chosen].mean()


print(f"expected accuracy with {busiest}:    {expected_accuracy(routes):.3f}")
print(f"expected accuracy without {busiest}: {expected_accuracy(fallback):.3f}")

# %%
# Neighbours across the pool
# --------------------------
#
# :func:`~sklocus.geometry.nearest_models` gives every model's nearest others at
# once, from the router's embeddings; a model whose nearest neighbour is very
# close has a ready stand-in. The synthetic pool plants copies of some models
# (``data.duplicate_of``); their nearest neighbour should be their original.
neighbours, distances = nearest_models(router.embeddings_, k=1)
nearest = pd.DataFrame(
    {
        "nearest": router.classes_[neighbours[:, 0]],
        "distance": distances[:, 0],
        "copy of": [data.model_names[j] if j >= 0 else "" for j in data.duplicate_of],
    },
    index=router.classes_,
)
print(nearest.sort_values("distance").head(8).round(4).to_string())
copies = data.duplicate_of >= 0
found = (neighbours[copies, 0] == data.duplicate_of[copies]).sum()
print(f"copies whose nearest model is their original: {found} of {copies.sum()}")
