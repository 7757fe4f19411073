"""Synthetic evaluations with known ground truth."""

from __future__ import annotations

import numpy as np
from sklearn.utils import Bunch, check_random_state

from sklocus._validation import check_count
from sklocus.encoders import PrecomputedEncoder
from sklocus.evaluations import to_long

# Sizes of model families, in billions of parameters, as seen on model hubs.
_FAMILY_SIZES_B = np.array([0.5, 1.5, 3.0, 7.0, 8.0, 13.0, 34.0, 70.0])


# evals_per_model="auto": about what a model gets in a small leaderboard.
_AUTO_EVALS_PER_MODEL = 256


def _set_sizes(evals_per_model, n_models, n_queries, rng):
    """Draw the number of evaluations of each model."""
    if evals_per_model is None:
        return np.full(n_models, n_queries)
    if isinstance(evals_per_model, str) and evals_per_model == "auto":
        return np.full(n_models, min(_AUTO_EVALS_PER_MODEL, n_queries))
    if isinstance(evals_per_model, tuple):
        low, high = (
            check_count(bound, "evals_per_model bounds", 1) for bound in evals_per_model
        )
        if not low <= high <= n_queries:
            raise ValueError(
                f"evals_per_model={evals_per_model!r} must satisfy 1 <= low <= high <= "
                f"n_queries={n_queries}"
            )
        return rng.randint(low, high + 1, size=n_models)
    size = check_count(evals_per_model, "evals_per_model", 1)
    if size > n_queries:
        raise ValueError(
            f"evals_per_model={size} exceeds n_queries={n_queries}; a model cannot be "
            "evaluated on more queries than exist"
        )
    return np.full(n_models, size)


def make_evaluations(
    n_models=100,
    n_queries=1000,
    *,
    n_benchmarks=5,
    n_families=8,
    duplicate_fraction=0.1,
    evals_per_model="auto",
    query_dim=64,
    n_skills=8,
    random_state=None,
    as_frame=False,
):
    """Generate evaluation sets of synthetic models with known ground truth.

    Queries are unit vectors clustered by benchmark, standing in for sentence
    encodings. Each query has item parameters of a multidimensional logistic (IRT)
    model, mostly determined by its vector: a discrimination vector over ``n_skills``
    latent skills and a difficulty. Models belong to families that share a skill
    profile and a parameter count. A model answers a query correctly with probability
    ``sigmoid(discrimination . skills / sqrt(n_skills) + ability - difficulty)`` and
    is evaluated on its own random subset of the queries.

    A fraction of the models are near-duplicates of others, like a model re-uploaded
    under another name or merged with a trace of another: their skills equal the
    original's to within 1e-2, they are evaluated on the same queries, and since
    their answers share the original's randomness (common random numbers) they
    differ from its answers only where their probabilities straddle it, on well
    under 1% of the queries.

    Read more in the :ref:`User Guide <data_folder>`.

    Parameters
    ----------
    n_models : int, default=100
        Number of models, duplicates included.
    n_queries : int, default=1000
        Number of queries.
    n_benchmarks : int, default=5
        Number of benchmarks (clusters of queries).
    n_families : int, default=8
        Number of model families.
    duplicate_fraction : float, default=0.1
        Fraction of the models that are near-duplicates of another model.
    evals_per_model : int, tuple of (int, int), None or "auto", default="auto"
        Evaluations per model: a number, a ``(low, high)`` range drawn uniformly per
        model, ``None`` for every query, or ``"auto"`` for 256 or every query when
        there are fewer.
    query_dim : int, default=64
        Width of the query vectors (384 for MiniLM, 768 for mpnet).
    n_skills : int, default=8
        Number of latent skills.
    random_state : int, RandomState instance or None, default=None
        Seeds everything; the same seed gives the same data.
    as_frame : bool, default=False
        Also return the evaluations as a long table, ``frame``: what an
        evaluation harness logs, and what ``sklocus fit`` reads.

    Returns
    -------
    data : Bunch
        With the fields:

        evaluation_sets : list of dict
            One ``{query_id: score}`` dict per model, scores 0.0 or 1.0.
        model_names : list of str
            The name of each model, ``"model-0000"`` onwards.
        query_ids : list of str
            The id of each query, ``"q00000"`` onwards.
        query_vectors : ndarray of shape (n_queries, query_dim), float32
            The vector of each query, in the order of ``query_ids``.
        encoder : PrecomputedEncoder
            Maps ``query_ids`` to ``query_vectors``.
        benchmarks : ndarray of shape (n_queries,), int
            Benchmark of each query.
        families : ndarray of shape (n_models,), int
            Family of each model.
        params_b : ndarray of shape (n_models,), float
            Parameter count of each model, in billions.
        duplicate_of : ndarray of shape (n_models,), int
            For a near-duplicate, the index of the model it copies; -1 otherwise.
        probabilities : ndarray of shape (n_queries, n_models), float
            True probability that each model answers each query correctly, a row
            per query as ``predict_correctness`` returns them.
        frame : DataFrame
            With ``as_frame=True`` only: one row per evaluation, columns
            ``model``, ``query``, ``score``, ``benchmark`` (of the query) and
            ``params_b`` (of the model); :func:`sklocus.from_long` reads it back.

    Examples
    --------
    >>> from sklocus.datasets import make_evaluations
    >>> data = make_evaluations(n_models=20, n_queries=100, evals_per_model=50,
    ...                         random_state=0)
    >>> len(data.evaluation_sets), len(data.evaluation_sets[0])
    (20, 50)
    """
    n_models = check_count(n_models, "n_models", 1)
    n_queries = check_count(n_queries, "n_queries", 1)
    n_benchmarks = check_count(n_benchmarks, "n_benchmarks", 1)
    n_families = check_count(n_families, "n_families", 1)
    query_dim = check_count(query_dim, "query_dim", 2)
    n_skills = check_count(n_skills, "n_skills", 1)
    if not 0.0 <= duplicate_fraction < 1.0:
        raise ValueError(
            f"duplicate_fraction={duplicate_fraction!r} must lie in [0, 1)"
        )
    rng = check_random_state(random_state)
    sizes = _set_sizes(evals_per_model, n_models, n_queries, rng)

    # Queries: unit vectors around one centre per benchmark.
    benchmarks = rng.permutation(np.arange(n_queries) % n_benchmarks)
    centres = rng.normal(size=(n_benchmarks, query_dim))
    vectors = centres[benchmarks] + 0.6 * rng.normal(size=(n_queries, query_dim))
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)

    # Item parameters, mostly a function of the query vector so that an encoder can
    # learn them, with some idiosyncratic noise.
    discrimination = 1.5 * vectors @ rng.normal(size=(query_dim, n_skills))
    discrimination += 0.3 * rng.normal(size=discrimination.shape)
    difficulty = vectors @ rng.normal(size=query_dim)
    difficulty += rng.normal(scale=0.5, size=n_benchmarks)[benchmarks]
    difficulty += 0.3 * rng.normal(size=n_queries)

    # Models: families share a skill profile and a size; duplicates copy a model.
    n_duplicates = int(round(duplicate_fraction * n_models))
    n_originals = n_models - n_duplicates
    family_skills = 1.3 * rng.normal(size=(n_families, n_skills))
    family_sizes = rng.choice(_FAMILY_SIZES_B, size=n_families)
    family_ability = 0.3 * rng.normal(size=n_families) + 0.15 * np.log(family_sizes)
    family_ability -= family_ability.mean()
    families = rng.permutation(np.arange(n_originals) % n_families)
    skills = family_skills[families] + 0.25 * rng.normal(size=(n_originals, n_skills))
    ability = family_ability[families] + 0.2 * rng.normal(size=n_originals)
    params_b = family_sizes[families] * rng.choice([1.0, 1.0, 1.0, 1.05], n_originals)

    sources = rng.randint(n_originals, size=n_duplicates)
    copies = skills[sources] + 1e-2 * rng.normal(size=(n_duplicates, n_skills))
    skills = np.vstack([skills, copies])
    ability = np.concatenate([ability, ability[sources]])
    families = np.concatenate([families, families[sources]])
    params_b = np.concatenate([params_b, params_b[sources]])
    duplicate_of = np.concatenate([np.full(n_originals, -1), sources])

    # Shuffle so that duplicates are not all at the end.
    order = rng.permutation(n_models)
    position = np.empty(n_models, dtype=np.int64)
    position[order] = np.arange(n_models)
    skills, ability = skills[order], ability[order]
    families, params_b = families[order], params_b[order]
    duplicate_of = duplicate_of[order]
    duplicate_of = np.where(
        duplicate_of >= 0, position[np.maximum(duplicate_of, 0)], -1
    )

    logits = skills @ discrimination.T / np.sqrt(n_skills) + ability[:, None]
    probabilities = 1.0 / (1.0 + np.exp(-(logits - difficulty[None, :])))

    query_ids = [f"q{j:05d}" for j in range(n_queries)]
    model_names = [f"model-{i:04d}" for i in range(n_models)]
    # Originals draw their queries and the randomness of their answers; a
    # duplicate reuses its original's.
    uniforms = rng.random_sample((n_models, n_queries))
    chosen = [None] * n_models
    for i in np.flatnonzero(duplicate_of < 0):
        chosen[i] = np.sort(rng.choice(n_queries, size=sizes[i], replace=False))
    for i in np.flatnonzero(duplicate_of >= 0):
        chosen[i] = chosen[duplicate_of[i]]
        uniforms[i] = uniforms[duplicate_of[i]]
    correct = uniforms < probabilities
    evaluation_sets = [
        dict(
            zip(
                [query_ids[j] for j in chosen[i]],
                correct[i, chosen[i]].astype(np.float64).tolist(),
            )
        )
        for i in range(n_models)
    ]

    query_vectors = vectors.astype(np.float32)
    data = Bunch(
        evaluation_sets=evaluation_sets,
        model_names=model_names,
        query_ids=query_ids,
        query_vectors=query_vectors,
        encoder=PrecomputedEncoder(query_ids, query_vectors),
        benchmarks=benchmarks,
        families=families,
        params_b=params_b,
        duplicate_of=duplicate_of,
        probabilities=np.ascontiguousarray(probabilities.T),
    )
    if as_frame:
        frame = to_long(evaluation_sets, model_names)
        row = {query: i for i, query in enumerate(query_ids)}
        frame["benchmark"] = benchmarks[[row[q] for q in frame["query"]]]
        frame["params_b"] = np.repeat(params_b, [len(s) for s in evaluation_sets])
        data.frame = frame
    return data
