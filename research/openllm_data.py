"""The Open LLM Leaderboard data as the research scripts read it.

The folder is the layout that :func:`sklocus.datasets.load_evaluations` reads: one
row per model (with ``moe`` and ``params_b``), one per query (with ``split``,
``benchmark`` and ``subject``), the scores, and precomputed query encodings.
Queries are split into train (806) and test (269) by the data's fixed ``split``;
embeddings and baselines only ever see train-query evaluations, and every metric
is on test queries. A pool is 112 fully observed dense (non-MoE) models.

This module kept the data loading of ``benchmarks/openllm.py``, whose two-pool
protocol (issue 6) and report ``openllm_report.py`` were retired when the many-pool
protocol of :mod:`research.pools` superseded them; their last tables are
the two-pool sections of ``docs/research/results.md``, measured at commit 6c23a51.
"""

from __future__ import annotations

import numpy as np

from sklocus.datasets import load_evaluations
from sklocus.evaluations import to_matrix

POOL_SIZE = 112


class OpenLLM:
    """The shared data as matrices over train and test queries.

    ``train_matrix`` is ``(n_train_queries, n_models)`` and ``test_matrix``
    ``(n_test_queries, n_models)``: a row per query and a column per model, as
    :func:`sklocus.evaluations.to_matrix` gives them, NaN where unobserved.
    """

    def __init__(self, folder, encoder):
        data = load_evaluations(folder, encoder=encoder)
        queries = data.queries
        self.names = list(data.models["model"])
        self.train_ids = list(queries.loc[queries["split"] == "train", "query_id"])
        self.test_ids = list(queries.loc[queries["split"] == "test", "query_id"])
        by_id = queries.set_index("query_id")
        self.train_subjects = (
            by_id.loc[self.train_ids, "subject"].to_numpy().astype(str)
        )
        self.test_subjects = by_id.loc[self.test_ids, "subject"].to_numpy().astype(str)
        self.train_benchmarks = (
            by_id.loc[self.train_ids, "benchmark"].to_numpy().astype(str)
        )
        self.test_benchmarks = (
            by_id.loc[self.test_ids, "benchmark"].to_numpy().astype(str)
        )
        self.encoder = data.encoder
        self.train_vectors = data.encoder.transform(self.train_ids)
        self.test_vectors = data.encoder.transform(self.test_ids)
        self.train_matrix, _ = to_matrix(data.evaluation_sets, queries=self.train_ids)
        self.test_matrix, _ = to_matrix(data.evaluation_sets, queries=self.test_ids)
        train = set(self.train_ids)
        self.train_sets = [
            {q: s for q, s in evaluations.items() if q in train}
            for evaluations in data.evaluation_sets
        ]
        sizes = np.array([len(s) for s in data.evaluation_sets])
        self.fully_observed = sizes == len(queries)
        self.dense = ~data.models["moe"].fillna(False).to_numpy(dtype=bool)
        self.params_b = data.models["params_b"].to_numpy(dtype=float)

    def draw_pool(self, seed):
        """The pool of ``seed``: 112 fully observed dense models, sorted."""
        candidates = np.flatnonzero(self.fully_observed & self.dense)
        rng = np.random.default_rng(seed)
        return np.sort(rng.choice(candidates, POOL_SIZE, replace=False))

    def sets(self, models):
        """Train-query evaluation sets of ``models``, empty ones dropped."""
        return [self.train_sets[i] for i in models if self.train_sets[i]]


def draw_states(seed, draws):
    """Random states of the draws of n evaluations for one seed (the first: seed)."""
    return [seed if draw == 0 else 1000 * (seed + 1) + draw for draw in range(draws)]
