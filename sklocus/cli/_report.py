"""``sklocus report``: the model map of a pool, as one offline HTML file."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from sklocus._files import write_atomically
from sklocus.cli._common import (
    UserError,
    say,
    status,
)
from sklocus.cli._models import (
    build_router,
    load_embedder,
    routing_line,
    run_settings,
    teach_queries,
)
from sklocus.cli._tables import (
    hold_out,
    per_model,
    per_query,
    read_evaluations,
    require_columns,
)


def run_report(arguments):
    """Write the model map."""
    from sklocus.report import write_map

    output = Path(arguments.output)
    if arguments.color != "cluster" and arguments.color not in (
        arguments.metadata_column
    ):
        raise UserError(
            f"argument --color: {arguments.color!r} is not 'cluster' or one of the "
            f"--metadata-column columns {arguments.metadata_column}"
        )
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise UserError("the map needs plotly: pip install 'sklocus[report]'") from None
    embedder = load_embedder(arguments.model)
    evaluations = read_evaluations(arguments)
    teach_queries(embedder, arguments, evaluations)
    groups = None
    if arguments.group_column is not None:
        groups = per_query(evaluations, arguments.query_column, arguments.group_column)
    metadata = None
    columns = list(dict.fromkeys(arguments.metadata_column))
    if arguments.cost_column is not None:
        # Checked here, so that a missing column is named by its own option.
        require_columns(
            evaluations.model_table,
            {"--cost-column": arguments.cost_column},
            evaluations.source,
        )
        if arguments.cost_column not in columns:
            columns.append(arguments.cost_column)
    if columns:
        metadata = per_model(evaluations, arguments.model_column, columns)
    pool, held = hold_out(arguments, evaluations)
    test_queries = None if held is None else held.queries
    with run_settings(embedder, arguments):
        # The router route builds over the same pool: the map's routing figures
        # are its, so that report and route say the same.
        router = build_router(embedder, pool)
        drawn = partial(
            write_map,
            source=embedder,
            model_names=evaluations.model_names,
            evaluation_sets=evaluations.sets,
            router=router,
            query_groups=groups,
            metadata=metadata,
            color=arguments.color,
            test_queries=test_queries,
            cost=arguments.cost_column,
            n_clusters=arguments.n_clusters or "auto",
            title=arguments.title,
        )
        with status(f"Drawing the map of {len(evaluations.sets)} models"):
            write_atomically(output, drawn)
        measured = None if held is None else routing_line(router, held)
    say(
        f"Wrote the map of {len(evaluations.sets)} models to {output} "
        f"({output.stat().st_size / 2**20:.1f} MiB)."
    )
    if measured is not None:
        say(measured)
    return 0
