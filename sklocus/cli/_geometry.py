"""``sklocus neighbors``, ``duplicates``, ``clusters`` and ``select``.

They work on an embedding table written by ``sklocus embed``.
"""

from __future__ import annotations

import pandas as pd

from sklocus import CoverageGreedySelector, KCenterSelector, KMedoidsSelector
from sklocus.cli._common import (
    UserError,
    say,
)
from sklocus.cli._tables import MODEL, per_model_mean, read_embeddings, write_table
from sklocus.geometry import cluster_models, find_duplicates, nearest_models


def run_neighbors(arguments):
    """Write each model's nearest models."""
    _, names, Z = read_embeddings(arguments.embeddings)
    if len(names) < 2:
        raise UserError(f"{arguments.embeddings}: neighbours need at least two models")
    k = arguments.k
    if k > len(names) - 1:
        raise UserError(
            f"argument -k: {k} neighbours asked for, but "
            f"{arguments.embeddings} has only {len(names)} models"
        )
    neighbours, distances = nearest_models(Z, k=k, metric=arguments.metric)
    rows = range(len(names))
    if arguments.model:
        position = {name: i for i, name in enumerate(names)}
        for name in arguments.model:
            if name not in position:
                raise UserError(
                    f"argument --model: {name!r} is not a model of "
                    f"{arguments.embeddings}"
                )
        rows = [position[name] for name in arguments.model]
    frame = pd.DataFrame(
        [
            (names[i], rank + 1, names[neighbours[i, rank]], distances[i, rank])
            for i in rows
            for rank in range(k)
        ],
        columns=[MODEL, "rank", "neighbor", "distance"],
    )
    write_table(frame, arguments.output)
    return 0


def run_duplicates(arguments):
    """Write the pairs of models closer than the threshold."""
    _, names, Z = read_embeddings(arguments.embeddings)
    if arguments.threshold is None and arguments.metric != "euclidean":
        raise UserError(
            f"argument --threshold: required with --metric {arguments.metric}"
        )
    pairs = find_duplicates(Z, arguments.threshold, metric=arguments.metric)
    frame = pd.DataFrame(
        {
            "first": [names[i] for i in pairs["first"]],
            "second": [names[j] for j in pairs["second"]],
            "distance": pairs["distance"].to_numpy(),
        }
    )
    write_table(frame, arguments.output)
    say(f"{len(frame)} pairs of {len(names)} models are closer than the threshold.")
    return 0


def run_clusters(arguments):
    """Write each model's cluster."""
    _, names, Z = read_embeddings(arguments.embeddings)
    if len(names) < 2:
        raise UserError(f"{arguments.embeddings}: clustering needs at least two models")
    if arguments.n_clusters is not None and arguments.n_clusters > len(names):
        raise UserError(
            f"argument --n-clusters: {arguments.n_clusters} clusters asked for, but "
            f"{arguments.embeddings} has only {len(names)} models"
        )
    labels, _ = cluster_models(
        Z,
        arguments.n_clusters,
        distance_threshold=arguments.distance_threshold,
        metric=arguments.metric,
    )
    frame = pd.DataFrame({MODEL: names, "cluster": labels})
    write_table(frame, arguments.output)
    say(f"{len(names)} models in {labels.max() + 1} clusters.")
    return 0


def run_select(arguments):
    """Write the chosen models, in the order chosen."""
    frame, names, Z = read_embeddings(arguments.embeddings)
    method = arguments.method
    cost = None
    if method == "coverage":
        if arguments.max_total_cost is None:
            raise UserError(
                "argument --max-total-cost: required with --method coverage"
            )
        if arguments.n_selected is not None:
            raise UserError(
                "argument --n-selected: not used by --method coverage; "
                "give --max-total-cost"
            )
        if arguments.cost_column is not None:
            cost = per_model_mean(
                frame, MODEL, arguments.cost_column, arguments.embeddings
            ).loc[names]
        selector = CoverageGreedySelector(
            arguments.max_total_cost, metric=arguments.metric
        )
        selector.fit(Z, cost=None if cost is None else cost.to_numpy())
        summary = (
            f"coverage {selector.coverage_:.3f} at total cost {selector.total_cost_:g}"
        )
    else:
        if arguments.n_selected is None:
            raise UserError(f"argument --n-selected: required with --method {method}")
        for option in ("max_total_cost", "cost_column"):
            if getattr(arguments, option) is not None:
                flag = "--" + option.replace("_", "-")
                raise UserError(
                    f"argument {flag}: used by --method coverage only, not {method}"
                )
        kind = KCenterSelector if method == "k-center" else KMedoidsSelector
        selector = kind(arguments.n_selected, metric=arguments.metric).fit(Z)
        summary = (
            f"radius {selector.radius_:.4f}"
            if method == "k-center"
            else f"inertia {selector.inertia_:.4f}"
        )
    chosen = selector.selected_indices_
    out = pd.DataFrame(
        {"rank": range(1, len(chosen) + 1), MODEL: [names[i] for i in chosen]}
    )
    if cost is not None:
        out[arguments.cost_column] = cost.to_numpy()[chosen]
    write_table(out, arguments.output)
    say(f"Chose {len(chosen)} of {len(names)} models by {method}: {summary}.")
    return 0
