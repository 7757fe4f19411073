"""
Onboarding new models without retraining
========================================

A trained embedder embeds a model it has never seen with one forward pass over
that model's evaluations. This example trains on 100 models, then onboards 20
new ones from 128 evaluations each, checks the predictions on the queries they
were not evaluated on, and adds them to a router.
"""

# %%
# Train on some models, hold out the others
# -----------------------------------------
#
# The last 20 models of a synthetic benchmark play the new models; the embedder
# never sees them in training. The settings train a small network in seconds
# (the defaults, sized to the pool, train for minutes on two cores).
import numpy as np
import pandas as pd
from sklearn.frozen import FrozenEstimator

from sklocus import LocusEmbedder, LocusRouter, subsample, to_matrix
from sklocus.datasets import make_evaluations
from sklocus.metrics import (
    correctness_accuracy,
    correctness_brier_score,
    correctness_roc_auc,
)

data = make_evaluations(n_models=120, n_queries=600, random_state=0)
n_train = 100
train_sets, train_names = data.evaluation_sets[:n_train], data.model_names[:n_train]
new_sets, new_names = data.evaluation_sets[n_train:], data.model_names[n_train:]

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
).fit(train_sets)

# %%
# Embed the new models from 128 evaluations
# -----------------------------------------
#
# Each new model was evaluated on 256 queries; :func:`~sklocus.subsample` keeps
# 128 of them, as if that were all we had run. ``transform`` embeds each new
# model from those alone: no training, no change to the embedder.
seen = subsample(new_sets, 128, random_state=0)
Z_new = embedder.transform(seen)
print(f"{len(seen)} new models embedded from {len(seen[0])} evaluations each")

# %%
# Check the predictions on their other queries
# --------------------------------------------
#
# The other 128 evaluations of each new model are held out: the embedding never
# saw them. ``predict_correctness`` predicts them, and :mod:`sklocus.metrics`
# measures those predictions against the held-out scores (a queries x models
# matrix, NaN where there is nothing to check). The baseline knows only each
# model's accuracy on its 128 seen queries and predicts it for every query.
held_out, queries = to_matrix(new_sets, data.query_ids)
for column, evaluations in enumerate(seen):
    held_out[[data.query_ids.index(query) for query in evaluations], column] = np.nan
predicted = embedder.predict_correctness(Z_new, queries)
mean_seen = np.array([np.mean(list(evaluations.values())) for evaluations in seen])
baseline = np.repeat(mean_seen[None, :], len(queries), axis=0)

measures = {
    "accuracy": correctness_accuracy,
    "Brier score (lower is better)": correctness_brier_score,
    "ROC AUC": correctness_roc_auc,
}
report = pd.DataFrame(
    {
        "LOCUS": [measure(held_out, predicted) for measure in measures.values()],
        "per-model mean": [
            measure(held_out, baseline) for measure in measures.values()
        ],
    },
    index=list(measures),
)
print(f"on {int((~np.isnan(held_out)).sum())} held-out evaluations:")
print(report.round(3))

# %%
# Onboard them into a router
# --------------------------
#
# A router over the training models, fitted with the frozen embedder, takes the
# new models with ``add_models``: one forward pass each, the existing
# embeddings untouched. Here the router's expected accuracy (from the
# generator's true probabilities) is measured on every query before and after.
router = LocusRouter(FrozenEstimator(embedder)).fit_evaluations(train_sets, train_names)


def expected_accuracy(router):
    chosen = [data.model_names.index(name) for name in router.predict(queries)]
    return data.probabilities[np.arange(len(queries)), chosen].mean()


before = expected_accuracy(router)
router.add_models(seen, new_names)
after = expected_accuracy(router)
routed_to_new = np.isin(router.predict(queries), new_names).mean()
print(f"router models: {len(router.classes_)}")
print(f"expected accuracy over {len(queries)} queries: {before:.3f} -> {after:.3f}")
print(f"share of queries now routed to a new model: {routed_to_new:.2f}")
