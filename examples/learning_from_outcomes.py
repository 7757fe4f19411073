"""
Learning from outcomes while routing
====================================

A router in production learns how its answers went: each outcome is one more
evaluation of the model that answered, and
:meth:`~sklocus.LocusRouter.partial_fit` embeds that model again from all of
them. Here a pool of 20 new models starts from 16 evaluations each; queries
arrive, the router picks a model for each and learns only that model's
outcome. A router that always takes its best guess is compared with one that
explores by the uncertainty of each embedding (Thompson sampling).
"""

# %%
# An embedder, and a pool it has never seen
# -----------------------------------------
#
# A synthetic leaderboard of 60 models on 600 queries. The embedder is trained
# on the first 40 models; the last 20 are the pool to route among, whose full
# results stay hidden: the simulation reveals one outcome per routed query.
import numpy as np
import pandas as pd
from sklearn.frozen import FrozenEstimator

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import subsample

data = make_evaluations(
    n_models=60, n_queries=600, evals_per_model=None, random_state=0
)
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
).fit(data.evaluation_sets[:40])
pool, names = data.evaluation_sets[40:], data.model_names[40:]
traffic, test = data.query_ids[:400], data.query_ids[400:]
truth = np.array([[results[q] for q in test] for results in pool])


def routing_accuracy(router):
    """Mean score, on the test queries, of each query's likeliest model."""
    best = router.predict_correctness(test).argmax(axis=1)
    return truth[best, np.arange(len(test))].mean()


# %%
# Start from 16 evaluations per model
# -----------------------------------
#
# ``exploration="thompson"`` routes by logits drawn from the Laplace
# approximation of each refined embedding: a model with few evaluations, or
# none on queries like this one, is uncertain there and sometimes tried.
first = subsample(pool, 16, random_state=0, model_names=names)
routers = {
    "best guess": LocusRouter(FrozenEstimator(embedder)),
    "Thompson": LocusRouter(
        FrozenEstimator(embedder), exploration="thompson", random_state=0
    ),
}
for router in routers.values():
    router.fit_evaluations(first, names)
start = routing_accuracy(routers["best guess"])
print(f"routing accuracy from 16 evaluations per model: {start:.3f}")
print(f"best single model: {truth.mean(axis=1).max():.3f}")
print(f"oracle (the best model of each query): {truth.max(axis=0).mean():.3f}")

# %%
# Route, and learn each outcome
# -----------------------------
#
# 2,000 queries arrive in batches of 250. Each batch is routed, the chosen
# model's outcome on each query comes back (here a lookup in its hidden
# results; in production a grader, a test or a user), and ``partial_fit``
# learns them: only the models that answered are embedded again.
rng = np.random.default_rng(1)
arrivals = rng.choice(traffic, 2000)
for name, router in routers.items():
    for start in range(0, len(arrivals), 250):
        queries = list(arrivals[start : start + 250])
        chosen = router.predict(queries)
        outcomes = pd.DataFrame(
            {
                "query": queries,
                "model": chosen,
                "score": [pool[names.index(m)][q] for q, m in zip(queries, chosen)],
            }
        ).drop_duplicates(["query", "model"])
        table = outcomes.pivot(index="query", columns="model", values="score")
        router.partial_fit(list(table.index), table)
    tried = (router.evaluations().groupby("model")["n_outcomes"].sum() > 16).sum()
    print(
        f"{name}: routing accuracy after 2,000 outcomes "
        f"{routing_accuracy(router):.3f}; models that answered: {tried} of 20"
    )

# %%
# The evaluations travel with the model file
# ------------------------------------------
#
# A saved router keeps every evaluation it learnt, so a loaded one goes on
# learning where the saved one stopped (``sklocus feedback`` folds a table of
# outcomes into a file; ``sklocus serve --feedback-journal`` learns them while
# serving).
sklocus.save(routers["Thompson"], "learning-router.sklocus")
loaded = sklocus.load("learning-router.sklocus")
print(f"evaluations kept in the file: {len(loaded.evaluations()):,}")
