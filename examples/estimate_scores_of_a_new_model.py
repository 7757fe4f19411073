"""
Evaluating a new model on a few queries
=======================================

A full benchmark run per new model is the cost this example cuts.
:class:`~sklocus.ScoreEstimator` says which queries to evaluate a new model on,
estimates its score on every benchmark from those few results, with an interval
whose coverage was measured, and the results then onboard the model into a
router. Here 20 new models are evaluated on 40 of 500 queries each, and the
estimates are checked against their full-benchmark scores.
"""

# %%
# Reference models and an embedder
# --------------------------------
#
# A synthetic leaderboard: 180 models evaluated on every one of 500 queries of
# five benchmarks. The first 160 are the reference models the embedder is
# trained on; the last 20 play new models, whose full results are kept aside as
# the truth. The settings train a small network in seconds.
import numpy as np
import pandas as pd
from sklearn.frozen import FrozenEstimator

from sklocus import LocusEmbedder, LocusRouter, ScoreEstimator
from sklocus.datasets import make_evaluations

data = make_evaluations(
    n_models=180, n_queries=500, evals_per_model=None, random_state=0
)
references, reference_names = data.evaluation_sets[:160], data.model_names[:160]
new_models = data.evaluation_sets[160:]
benchmarks = np.array([f"benchmark {b}" for b in data.benchmarks], dtype=object)

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
).fit(references)

# %%
# Fit the estimator
# -----------------
#
# ``fit`` embeds the reference models, then hides most evaluations of some of
# them, estimates their scores from the rest and scales the intervals so that
# 90% hold the truth on half of those models; the other half measure it.
estimator = ScoreEstimator(embedder, confidence=0.9, random_state=0).fit(references)
print(f"interval coverage on held-out reference models: {estimator.coverage_:.2f}")

# %%
# Evaluate one new model on 40 suggested queries
# ----------------------------------------------
#
# ``collect_evaluations`` runs the onboarding loop: it suggests a batch of
# queries, the harness (here a lookup in the model's hidden results; in
# practice, run the model and grade its answers) scores them, and the next
# batch takes those results into account.
new = new_models[0]


def harness(queries):
    return [new[query] for query in queries]


results = estimator.collect_evaluations(
    harness, data.query_ids, 40, batch_size=10, query_groups=benchmarks
)
table = estimator.estimate_scores([results], data.query_ids, benchmarks)
truth = pd.Series([new[q] for q in data.query_ids]).groupby(benchmarks).mean()
table["true score"] = truth.loc[table["group"]].to_numpy()
columns = ["group", "n_evaluated", "estimate", "lower", "upper", "true score"]
print(table[columns].round(3).to_string(index=False))

# %%
# How good are the estimates?
# ---------------------------
#
# For each of the 20 new models, 40 evaluations at random or as suggested, and
# the estimated score per benchmark against the plain mean of the results on
# that benchmark. The error is the root mean square over models and
# benchmarks, in points of accuracy.
rng = np.random.default_rng(0)
errors = {"random, plain mean": [], "random, estimate": [], "chosen, estimate": []}
inside = []
for model in new_models:
    full = pd.Series([model[q] for q in data.query_ids]).groupby(benchmarks).mean()
    drawn = rng.choice(len(data.query_ids), 40, replace=False)
    random_results = {data.query_ids[i]: model[data.query_ids[i]] for i in drawn}
    chosen_results = estimator.collect_evaluations(
        lambda queries, model=model: [model[q] for q in queries],
        data.query_ids,
        40,
        batch_size=10,
        query_groups=benchmarks,
    )
    for name, drawn_results in (
        ("random", random_results),
        ("chosen", chosen_results),
    ):
        found = estimator.estimate_scores([drawn_results], data.query_ids, benchmarks)
        table = found.set_index("group")
        errors[f"{name}, estimate"] += list(table["estimate"] - full.loc[table.index])
        inside += list(
            (table["lower"] <= full.loc[table.index])
            & (full.loc[table.index] <= table["upper"])
        )
    observed = pd.Series(random_results)
    plain = observed.groupby(
        pd.Series(dict(zip(data.query_ids, benchmarks))).loc[observed.index]
    ).mean()
    plain = plain.reindex(full.index).fillna(observed.mean())
    errors["random, plain mean"] += list(plain - full)
for name, found in errors.items():
    rmse = 100 * np.sqrt(np.mean(np.square(found)))
    print(f"RMSE per benchmark, {name}: {rmse:.1f} points")
print(f"90% intervals that hold the true score: {np.mean(inside):.2f}")

# %%
# On a leaderboard's scale
# ------------------------
#
# A leaderboard scores a model on the whole benchmark, of which these queries
# are a sample, and often on another scale. Here each model's leaderboard score
# is its expected accuracy on its benchmark's queries in percent, read from its
# true P(correct). Given the reference models' scores, ``fit`` learns to read
# them from any few results, and ``estimate_scores`` answers on that scale
# (``target`` "full score"); the anchors are the same 40 queries for every new
# model.
board = pd.DataFrame(
    {
        b: 100 * data.probabilities[benchmarks == b].mean(axis=0)
        for b in sorted(set(benchmarks))
    }
)
on_scale = ScoreEstimator(embedder, random_state=0).fit(references, board[:160])
print(f"full-score interval coverage: {on_scale.score_coverage_:.2f}")
anchors = on_scale.suggest_queries(
    {}, data.query_ids, 40, query_groups=benchmarks, strategy="anchors"
)
sets = [{q: model[q] for q in anchors} for model in new_models]
found = on_scale.estimate_scores(sets, data.query_ids, benchmarks)
truth = board[160:].reset_index(drop=True)
found["leaderboard"] = [truth.loc[r.model, r.group] for r in found.itertuples()]
print(found[["group", "estimate", "lower", "upper", "leaderboard"]].head().round(1))
error = np.sqrt(np.mean((found["estimate"] - found["leaderboard"]) ** 2))
held = (found["lower"] <= found["leaderboard"]) & (
    found["leaderboard"] <= found["upper"]
)
print(f"RMSE per benchmark on the leaderboard's scale: {error:.1f} points")
print(f"90% intervals that hold the leaderboard score: {held.mean():.2f}")

# %%
# Onboard the model into a router
# -------------------------------
#
# The results that estimated its scores also embed it: ``add_models`` adds it
# to a router over the reference models, with one forward pass.
router = LocusRouter(FrozenEstimator(embedder)).fit_evaluations(
    references, reference_names
)
router.add_models([results], ["new-model"])
print(f"router models: {len(router.classes_)}")
routed = router.predict(data.query_ids) == "new-model"
print(f"queries routed to the new model: {routed.sum()} of {len(routed)}")
