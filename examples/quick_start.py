"""
Quick start
===========

Embed every model of a synthetic benchmark as one vector, predict which queries
each model answers correctly, find models that behave alike, and route each query
to the model most likely to answer it. The synthetic data come with the truth
they were drawn from (each model's probability of answering each query, and
which models copy another), so every step can be checked against it.
"""

# %%
# Synthetic evaluations
# ---------------------
#
# :func:`~sklocus.datasets.make_evaluations` draws models from a few families and
# evaluates each on its own random subset of the queries. A model's evaluations
# are a ``{query: score}`` dict; the sets are ragged (models need not share
# queries). The queries here are ids with precomputed vectors, encoded by
# ``data.encoder``, so nothing is downloaded.
import numpy as np
import pandas as pd
from sklearn.frozen import FrozenEstimator
from sklearn.metrics import adjusted_rand_score

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.geometry import cluster_models, find_duplicates, nearest_models

data = make_evaluations(n_models=120, n_queries=600, random_state=0)
sets = data.evaluation_sets
print(f"{len(sets)} models, {len(data.query_ids)} queries")
print(f"model 0 has {len(sets[0])} evaluations, e.g. {list(sets[0].items())[:3]}")

# %%
# Train the embedder
# ------------------
#
# ``fit`` trains a set encoder (evaluation set to vector) and a predictor (vector
# and query to probability of a correct answer) together. The defaults size the
# training to the pool (how many models, how many evaluations) and train for
# minutes on two cores; these settings train a narrow network with larger
# learning steps for a few seconds, enough to show each step.
settings = dict(
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
embedder = LocusEmbedder(query_encoder=data.encoder, **settings)
Z = embedder.fit_transform(sets)
print(f"embeddings: {Z.shape}")

# %%
# Predict correctness
# -------------------
#
# ``predict_correctness`` gives P(correct) for any embeddings and queries, also
# queries a model was never evaluated on. Here it is compared with the true
# probabilities the generator drew the answers from.
probabilities = embedder.predict_correctness(Z, data.query_ids)
shown = probabilities[:5, :3]  # a row per query, a column per model
print(pd.DataFrame(shown, index=data.query_ids[:5], columns=data.model_names[:3]))
correlation = np.corrcoef(probabilities.ravel(), data.probabilities.ravel())[0, 1]
print(f"correlation of predicted and true P(correct): {correlation:.2f}")

# %%
# Models that behave alike
# ------------------------
#
# Embeddings come in units of a typical distance between two training models.
# About one model in ten here re-uploads another (``data.duplicate_of``): it
# answers alike on all but a few queries. ``find_duplicates`` reports the pairs
# closer than 1e-4, and ``nearest_models`` gives each model's nearest others.
duplicates = find_duplicates(Z)
planted = {(min(i, j), max(i, j)) for i, j in enumerate(data.duplicate_of) if j >= 0}
found = set(zip(duplicates["first"], duplicates["second"]))
print(
    f"pairs closer than 1e-4: {len(found)}, of which planted copies: "
    f"{len(found & planted)} (of {len(planted)} planted)"
)

neighbours, distances = nearest_models(Z, k=3)
copies = np.flatnonzero(data.duplicate_of >= 0)
first = copies[0]
print(
    f"{data.model_names[first]} copies {data.model_names[data.duplicate_of[first]]}; "
    f"its nearest models: {[data.model_names[j] for j in neighbours[first]]} "
    f"at {np.round(distances[first], 4).tolist()}"
)
hits = neighbours[copies, 0] == data.duplicate_of[copies]
print(f"copies whose nearest model is their original: {hits.sum()} of {len(copies)}")

labels, _ = cluster_models(Z, n_clusters=8)
print(
    f"agreement of 8 clusters with the 8 true families (adjusted Rand index): "
    f"{adjusted_rand_score(data.families, labels):.2f}"
)

# %%
# Route queries
# -------------
#
# A :class:`~sklocus.LocusRouter` is a classifier whose samples are queries and
# whose classes are models; ``fit_evaluations`` takes the pool's evaluation sets
# as the embedder does. Wrapping the fitted embedder in
# :class:`~sklearn.frozen.FrozenEstimator` makes it embed the models without
# training again.
router = LocusRouter(FrozenEstimator(embedder))
router.fit_evaluations(sets, data.model_names)
queries = data.query_ids
print("routes of the first five queries:", list(router.predict(queries[:5])))

# %%
# How good are the routes? The true probabilities give each route's expected
# accuracy; compare it with sending every query to the single best model, and
# with an oracle that knows the best model for each query.
true = data.probabilities  # a row per query, a column per model
chosen = [data.model_names.index(name) for name in router.predict(queries)]
routed = true[np.arange(len(queries)), chosen].mean()
print(f"expected accuracy, routed:     {routed:.3f}")
print(f"expected accuracy, best model: {true.mean(axis=0).max():.3f}")
print(f"expected accuracy, oracle:     {true.max(axis=1).mean():.3f}")
