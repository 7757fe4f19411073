"""``sklocus suggest`` and ``estimate``: evaluating new models on a few queries."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from sklocus import ScoreEstimator
from sklocus.cli._common import UserError, queries_text_column, say
from sklocus.cli._models import load_embedder, run_settings, teach_queries
from sklocus.cli._tables import (
    read_evaluations,
    read_queries,
    read_table,
    write_table,
)
from sklocus.encoders import SentenceEncoder


@dataclass
class _Setting:
    """What both commands read: the estimator's parts and the new models."""

    embedder: object
    references: list
    new_models: dict  # name: its evaluations so far (possibly none)
    ids: list
    groups: list | None
    scores: pd.DataFrame | None  # the references' full scores, in their order


def _read(arguments, new_names):
    """Read MODEL, EVALS and QUERIES; split EVALS into references and new models."""
    embedder = load_embedder(arguments.model)
    evaluations = read_evaluations(arguments)
    teach_queries(embedder, arguments, evaluations)
    names = evaluations.model_names
    sets = dict(zip(names, evaluations.sets))
    for name in new_names:
        if name not in sets:
            say(f"{name!r} has no rows in {evaluations.source}: no results yet")
    new = set(new_names)
    references = [s for name, s in zip(names, evaluations.sets) if name not in new]
    reference_names = [name for name in names if name not in new]
    if len(references) < 2:
        raise UserError(
            f"{evaluations.source}: {len(references)} model besides the new ones; "
            "estimates need at least 2 reference models, and are better the more "
            "there are"
        )
    text_column, text_option = queries_text_column(arguments)
    ids, texts, groups = read_queries(
        arguments.queries,
        arguments.query_column,
        text_column,
        arguments.group_column,
        text_option,
    )
    encoder = embedder.query_encoder_
    if text_column is not None and isinstance(encoder, SentenceEncoder):
        encoder.set_params(texts={**(encoder.texts or {}), **dict(zip(ids, texts))})
    new_models = {name: sets.get(name, {}) for name in new_names}
    scores = None
    if arguments.scores is not None:
        scores = _read_scores(arguments.scores, arguments.model_column, reference_names)
        # A file's header is text; a group column may be read as numbers.
        label = {str(g): g for g in groups or () if g is not None}
        scores.columns = [label.get(str(c), c) for c in scores.columns]
    return _Setting(embedder, references, new_models, ids, groups, scores)


def _read_scores(path, model_column, reference_names):
    """Read the references' full scores from a table, in the references' order."""
    frame = read_table(path, text_columns=(model_column,))
    if model_column not in frame.columns:
        raise UserError(
            f"{path}: no column {model_column!r} (--model-column); the columns are "
            f"{', '.join(map(str, frame.columns))}"
        )
    names = frame[model_column]
    twice = names[names.duplicated()]
    if len(twice):
        raise UserError(
            f"{path}: model {twice.iloc[0]!r} has two rows; give one row per model"
        )
    groups = frame.drop(columns=model_column).set_index(names)
    if groups.shape[1] == 0:
        raise UserError(
            f"{path}: no column besides {model_column!r}; give one column of scores "
            "per group"
        )
    for column in groups.columns:
        if not pd.api.types.is_numeric_dtype(groups[column]):
            raise UserError(
                f"{path}: column {column!r} must hold numbers (empty where a model "
                f"has no score); got {groups[column].dtype}"
            )
    found = sum(name in groups.index for name in reference_names)
    say(
        f"Full scores of {found} of the {len(reference_names)} reference models "
        f"from {path}, in {groups.shape[1]} group(s): "
        f"{', '.join(map(str, groups.columns))}."
    )
    return groups.reindex(reference_names).reset_index(drop=True)


def run_suggest(arguments):
    """Suggest the queries to evaluate a new model on."""
    new = arguments.new_model
    setting = _read(arguments, [new])
    so_far = setting.new_models[new]
    estimator = ScoreEstimator(setting.embedder, random_state=arguments.random_state)
    with run_settings(setting.embedder, arguments):
        estimator.fit(setting.references, setting.scores)
        chosen = estimator.suggest_queries(
            so_far,
            setting.ids,
            arguments.n_queries,
            query_groups=setting.groups,
            strategy=arguments.strategy,
        )
    frame = pd.DataFrame({"query": chosen, "order": range(1, len(chosen) + 1)})
    if setting.groups is not None:
        group_of = dict(zip(setting.ids, setting.groups))
        frame["group"] = [group_of[query] for query in chosen]
    write_table(frame, arguments.output)
    say(
        f"Suggested {len(frame)} of {len(setting.ids)} queries for {new!r} "
        f"({len(so_far)} evaluated so far, {len(setting.references)} reference "
        f"models) to {arguments.output}."
    )
    return 0


def run_estimate(arguments):
    """Estimate new models' scores on the groups of QUERIES."""
    names = list(dict.fromkeys(arguments.new_model))
    setting = _read(arguments, names)
    estimator = ScoreEstimator(
        setting.embedder,
        confidence=arguments.confidence,
        random_state=arguments.random_state,
    )
    with run_settings(setting.embedder, arguments):
        estimator.fit(setting.references, setting.scores)
        frame = estimator.estimate_scores(
            list(setting.new_models.values()),
            setting.ids,
            setting.groups,
            model_names=names,
        )
    write_table(frame, arguments.output)
    coverage = f"{estimator.coverage_:.0%}"
    if estimator.score_groups_ is not None:
        coverage = f"{estimator.score_coverage_:.0%} of full scores, {coverage} "
        coverage += "of item means"
    say(
        f"Estimated {len(names)} model(s) on {frame['group'].nunique()} group(s) "
        f"from {len(setting.references)} reference models, at "
        f"{arguments.confidence:.0%} (coverage measured on held-out reference "
        f"models: {coverage}), to {arguments.output}."
    )
    return 0
