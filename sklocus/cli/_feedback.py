"""``sklocus feedback``: fold a table of outcomes into a router's model file."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from sklocus import LocusRouter
from sklocus._validation import shown
from sklocus.cli._common import UserError, counted, one_line, say, status
from sklocus.cli._models import load_file, run_settings, save_file
from sklocus.cli._tables import check_names, read_table, require_columns, row_name
from sklocus.evaluations import _first_bad_score


def _outcome_table(arguments, router):
    """Read OUTCOMES: the model index, query, score and group of each row."""
    model, query = arguments.model_column, arguments.query_column
    score, group = arguments.score_column, arguments.group_column
    path = Path(arguments.outcomes)
    frame = read_table(path, text_columns=(model, query))
    columns = {"--model-column": model, "--query-column": query}
    columns["--score-column"] = score
    if group is not None:
        columns["--group-column"] = group
    require_columns(frame, columns, path)
    check_names(frame[model], model, path)
    if not len(frame):
        raise UserError(f"{path}: no outcomes (the table has no rows)")
    # Names are read as text, as every command reads them.
    index = {str(name): j for j, name in enumerate(router.classes_.tolist())}
    for row, name in enumerate(frame[model]):
        if name not in index:
            raise UserError(
                f"{path}: {row_name(path, row)} is an outcome of model {shown(name)}, "
                "which the router does not have (add it first: sklocus serve's POST "
                "/models, or LocusRouter.add_models)"
            )
    for row, value in enumerate(frame[query]):
        if pd.isna(value):
            raise UserError(f"{path}: {row_name(path, row)} has no query")
    bad = _first_bad_score(frame[score].to_numpy())
    if bad is not None:
        row = bad[0]
        raise UserError(
            f"{path}: {row_name(path, row)} has score {shown(frame[score].iloc[row])} "
            f"in column {score!r}; an outcome's score is a number in [0, 1]"
        )
    values = frame[score].to_numpy(dtype=np.float64)
    group_of = None
    if group is not None:
        if router.named_groups() is None:
            raise UserError(
                "argument --group-column: the router was fitted without query "
                "groups; leave it out"
            )
        labelled = frame.dropna(subset=[group])
        # Read as text, and matched to the router's groups by their text.
        label = {str(g): g for g in router.groups_.tolist()}
        texts = labelled[group].astype(str)
        group_of = dict(zip(labelled[query], [label.get(t, t) for t in texts]))
    models = router.classes_[[index[name] for name in frame[model]]]
    return models, frame[query].tolist(), values, group_of


def run_feedback(arguments):
    """Fold outcomes into a router file."""
    path = Path(arguments.model)
    router = load_file(path)
    if not isinstance(router, LocusRouter):
        raise UserError(
            f"{path} holds a {type(router).__name__}; feedback folds outcomes into "
            "a LocusRouter's file"
        )
    models, queries, scores, group_of = _outcome_table(arguments, router)
    before = router.evaluation_counts()["n_evaluations"].sum()
    touched = len(set(models.tolist()))
    say(
        f"Folding {counted(len(models), 'outcome')} into {touched} of the router's "
        f"{len(router.classes_)} models, each embedded again from all its "
        "evaluations..."
    )
    start = time.perf_counter()
    try:
        # Saved afterwards: the settings of this run stay out of the file.
        with run_settings(router, arguments), status("Folding the outcomes"):
            router.learn_outcomes(models, queries, scores, group_of)
    except (ValueError, TypeError, KeyError) as error:
        raise UserError(f"{arguments.outcomes}: {one_line(error)}") from None
    elapsed = time.perf_counter() - start
    target = Path(arguments.output) if arguments.output is not None else path
    save_file(router, target)
    new = int(router.evaluation_counts()["n_evaluations"].sum() - before)
    say(
        f"Folded {counted(len(models), 'outcome')} of "
        f"{counted(touched, 'model')} into {target} "
        f"({new:,} on queries new to their model) in {elapsed:.1f} s."
    )
    return 0
