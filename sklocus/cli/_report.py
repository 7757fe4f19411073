"""``sklocus report``: the model map of a pool, as one offline HTML file."""

from __future__ import annotations

from pathlib import Path

from sklocus._files import write_atomically
from sklocus.cli._common import (
    UserError,
    say,
)
from sklocus.cli._models import load_embedder, run_settings, teach_queries
from sklocus.cli._tables import (
    per_model,
    per_query,
    read_evaluations,
    read_lines,
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
    test_queries = None
    if arguments.test_queries is not None:
        test_queries = [line.strip() for line in read_lines(arguments.test_queries)]
    with run_settings(embedder, arguments):
        write_atomically(
            output,
            lambda temporary: write_map(
                temporary,
                embedder,
                evaluations.model_names,
                evaluations.sets,
                query_groups=groups,
                metadata=metadata,
                color=arguments.color,
                test_queries=test_queries,
                cost=arguments.cost_column,
                n_clusters=arguments.n_clusters,
                title=arguments.title,
            ),
        )
    say(
        f"Wrote the map of {len(evaluations.sets)} models to {output} "
        f"({output.stat().st_size / 2**20:.1f} MiB)."
    )
    return 0
