"""``sklocus report``: the model map of a pool, as one offline HTML file."""

from __future__ import annotations

from pathlib import Path

from sklocus._files import write_atomically
from sklocus.cli._common import (
    UserError,
    add_table_options,
    add_vector_options,
    integer_in,
)
from sklocus.cli._models import load_embedder, say, teach_queries
from sklocus.cli._tables import (
    per_model,
    per_query,
    read_evaluations,
    read_lines,
    require_columns,
)


def register(commands):
    """Add ``report`` to the subcommands."""
    report = commands.add_parser(
        "report",
        help="write an interactive map of a pool of models (one HTML file)",
        description="Embed the models of EVALS with MODEL and write the model map: "
        "one self-contained HTML file, working offline, with a 3-D map of the "
        "embeddings, each model's accuracy by group, neighbours and "
        "near-duplicates, portfolios with their routing accuracy on held-out "
        "queries, and how an embedding converges as evaluations are added. "
        "Needs plotly (pip install 'sklocus[report]').",
    )
    report.add_argument("model", metavar="MODEL", help="a model file from sklocus fit")
    report.add_argument("evals", metavar="EVALS", help="the pool's evaluations")
    report.add_argument(
        "-o", "--output", required=True, metavar="FILE.html", help="the page to write"
    )
    add_table_options(report)
    add_vector_options(report)
    page = report.add_argument_group("the map")
    page.add_argument(
        "--group-column",
        metavar="COL",
        help="each query's group (benchmark, subject...), for accuracy by group",
    )
    page.add_argument(
        "--metadata-column",
        action="append",
        default=[],
        metavar="COL",
        help="a per-model column to show, such as parameters or family (repeatable)",
    )
    page.add_argument(
        "--colour",
        default="cluster",
        metavar="COL",
        help="colour by cluster (default) or by a --metadata-column",
    )
    page.add_argument(
        "--cost-column",
        metavar="COL",
        help="each model's cost, such as its parameters: the portfolio panel "
        "then also offers coverage within a budget (models with no value are "
        "left out of those portfolios)",
    )
    page.add_argument(
        "--test-queries",
        metavar="FILE",
        help="held-out queries, one per line: left out of the embeddings, and "
        "where the portfolios' routing accuracy is measured",
    )
    page.add_argument(
        "--n-clusters", type=integer_in(1), default=8, metavar="K", help="default: 8"
    )
    page.add_argument("--title", default="Model map", help="the page's title")
    report.set_defaults(run=run_report)


def run_report(arguments):
    """Write the model map."""
    from sklocus.report import write_map

    output = Path(arguments.output)
    if arguments.colour != "cluster" and arguments.colour not in (
        arguments.metadata_column
    ):
        raise UserError(
            f"argument --colour: {arguments.colour!r} is not 'cluster' or one of the "
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
    write_atomically(
        output,
        lambda temporary: write_map(
            temporary,
            embedder,
            evaluations.model_names,
            evaluations.sets,
            query_groups=groups,
            metadata=metadata,
            colour=arguments.colour,
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
