"""``sklocus suggest``: which queries to evaluate a new model on next."""

from __future__ import annotations

import pandas as pd

from sklocus._score_estimation import ScoreEstimator
from sklocus.cli._common import UserError, say
from sklocus.cli._models import encoding_cache, load_embedder, teach_queries
from sklocus.cli._tables import read_evaluations, read_queries, write_table
from sklocus.encoders import SentenceEncoder


def run_suggest(arguments):
    """Suggest the queries to evaluate a new model on."""
    embedder = load_embedder(arguments.model)
    evaluations = read_evaluations(arguments)
    teach_queries(embedder, arguments, evaluations)
    new = arguments.new_model
    names = evaluations.model_names
    references = [s for name, s in zip(names, evaluations.sets) if name != new]
    so_far = next((s for name, s in zip(names, evaluations.sets) if name == new), {})
    if not so_far:
        say(f"{new!r} has no rows in {evaluations.source}: a model with no results")
    if len(references) < 2:
        raise UserError(
            f"{evaluations.source}: {len(references)} model besides {new!r}; the "
            "suggestions need at least 2 reference models, and are better the more "
            "there are"
        )
    ids, texts, groups = read_queries(
        arguments.queries,
        arguments.query_column,
        arguments.text_column,
        arguments.group_column,
    )
    encoder = embedder.query_encoder_
    if arguments.text_column is not None and isinstance(encoder, SentenceEncoder):
        encoder.set_params(texts={**(encoder.texts or {}), **dict(zip(ids, texts))})
    estimator = ScoreEstimator(embedder, random_state=arguments.random_state)
    with encoding_cache(embedder, arguments):
        estimator.fit(references)
        chosen = estimator.suggest_queries(
            so_far,
            ids,
            arguments.k,
            query_groups=groups,
            strategy=arguments.strategy,
        )
    frame = pd.DataFrame({"query": chosen, "order": range(1, len(chosen) + 1)})
    if groups is not None:
        group_of = dict(zip(ids, groups))
        frame["group"] = [group_of[query] for query in chosen]
    write_table(frame, arguments.output)
    say(
        f"Suggested {len(frame)} of {len(ids)} queries for {new!r} "
        f"({len(so_far)} evaluated so far, {len(references)} reference models) to "
        f"{arguments.output}."
    )
    return 0
