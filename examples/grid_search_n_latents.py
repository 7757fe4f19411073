"""
Tuning the embedder with GridSearchCV
=====================================

:class:`~sklocus.LocusEmbedder` is a scikit-learn estimator whose samples are
models, so scikit-learn's model selection tools work on a list of evaluation
sets as they do on an array. This example compares two numbers of latents by
cross-validation over models, scored by two measures of how well the
held-out evaluations are predicted.
"""

# %%
# The data and the estimator
# --------------------------
#
# Cross-validation splits the *models*: each fold trains on some models and
# scores the others, which it has never seen. The settings keep each of the
# fits below to a few seconds (the defaults, sized to the pool, train for
# minutes on two cores).
import pandas as pd
from sklearn.model_selection import GridSearchCV, KFold

from sklocus import LocusEmbedder
from sklocus.datasets import make_evaluations
from sklocus.metrics import get_scorer

data = make_evaluations(n_models=90, n_queries=400, random_state=0)
sets = data.evaluation_sets
embedder = LocusEmbedder(
    query_encoder=data.encoder,
    embedding_dim=32,
    encoder_sizes=(8, 128),
    decoder_size=128,
    max_epochs=3,
    epoch_size=256,
    lr=3e-3,
    predictor_lr=1e-2,
    random_state=0,
)

# %%
# Search over ``n_latents``
# -------------------------
#
# By default ``GridSearchCV`` ranks each setting by ``LocusEmbedder.score``:
# each test model is embedded from three quarters of its evaluations, and the
# score is the mean log-likelihood of the other quarter under the predicted
# probabilities (higher is better; predicting 0.5 everywhere earns about
# -0.693). :func:`sklocus.metrics.get_scorer` gives scikit-learn's scorer names
# that meaning for an embedder: ``"neg_log_loss"`` is that same log-likelihood,
# and ``"roc_auc"`` how well the same predictions rank correct answers above
# wrong ones. ``cross_val_score`` and ``cross_validate`` take them too. The
# folds are shuffled because the order of the models is arbitrary.
cv = KFold(n_splits=3, shuffle=True, random_state=0)
scoring = {
    "log_likelihood": get_scorer("neg_log_loss"),
    "roc_auc": get_scorer("roc_auc"),
}
search = GridSearchCV(
    embedder, {"n_latents": [4, 16]}, cv=cv, scoring=scoring, refit="log_likelihood"
).fit(sets)

# %%
# The results
# -----------
#
# ``cv_results_`` holds every fold's scores; ``best_params_`` the setting of
# highest mean log-likelihood, which ``search`` has refitted on every model
# (``best_estimator_``). When the two means lie closer than their fold-to-fold
# spread, the search has not told the settings apart: grow the pool or the
# training before trusting the choice.
results = pd.DataFrame(search.cv_results_).set_index("param_n_latents")
columns = [
    "mean_test_log_likelihood",
    "std_test_log_likelihood",
    "mean_test_roc_auc",
    "mean_fit_time",
]
print(results[columns].round(4).to_string())
print(f"best: {search.best_params_}, log-likelihood {search.best_score_:.4f}")
means = results["mean_test_log_likelihood"]
print(
    f"difference of the means: {abs(means.iloc[0] - means.iloc[1]):.4f}; largest "
    f"fold-to-fold standard deviation: {results['std_test_log_likelihood'].max():.4f}"
)
print(f"refitted on {len(sets)} models: {type(search.best_estimator_).__name__}")
