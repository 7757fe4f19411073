"""The grammar of the ``sklocus`` command: every subcommand and its options.

Kept apart from what the commands do, so that parsing (``--help``, ``--version``,
a usage error) imports neither torch nor scikit-learn nor pandas: each parsed
command names its handler as ``"module:function"`` of this package, which
:func:`sklocus.cli.main` imports only then.
"""

from __future__ import annotations

from sklocus._versioning import __version__
from sklocus.cli._common import (
    Parser,
    add_encoding_cache_option,
    add_metric_option,
    add_output_option,
    add_queries_text_option,
    add_table_options,
    add_test_queries_option,
    add_vector_options,
    integer_in,
    non_negative_number,
    open_probability,
    positive_number,
    probability,
)

DESCRIPTION = (
    "LOCUS model embeddings from the shell. 'sklocus fit' trains an embedder on a "
    "long table of evaluations (one row per model, query and score) and saves it; "
    "'embed' and 'route' use it on a pool of models; 'suggest' chooses which "
    "queries to evaluate a new model on and 'estimate' its scores; 'neighbors', "
    "'duplicates', 'clusters' and 'select' work on the embeddings; 'report' "
    "writes the model map; 'serve' serves a router over HTTP and 'feedback' folds "
    "outcomes into a router's file; 'data' gives the path of the data that "
    "ships with sklocus; 'demo' runs the "
    "main job on built-in data. 'sklocus COMMAND --help' lists a command's "
    "options."
)
# --quick: a smaller pool and shorter training, for a first look.
QUICK = {
    "n_models": 120,
    "n_new": 20,
    "n_queries": 800,
    "max_epochs": 3,
    "epoch_size": 1024,
}
# Where ``sklocus serve`` reads its token when no --token-file is given.
TOKEN_VARIABLE = "SKLOCUS_TOKEN"
# Where `sklocus serve --store` reads the store's location when it is not given
# (a PostgreSQL URI may hold a password, which a command line shows to others).
STORE_VARIABLE = "SKLOCUS_STORE"
# LocusRouter's calibration settings, written out: the parser imports no
# estimator, so that --help answers at once (a test holds them equal).
CALIBRATION_CHOICES = ("pool", "isotonic", "sigmoid", "pool+isotonic", "pool+sigmoid")
_EMBEDDINGS_HELP = "an embedding table from sklocus embed (.csv or .parquet)"


def build_parser():
    """Build the parser of the whole command line."""
    parser = Parser(
        prog="sklocus",
        description=DESCRIPTION,
        epilog="Steps that take a while report their progress on standard error: "
        "one line redrawn on a terminal, a few plain lines in a log or a pipe.",
    )
    parser.add_argument("--version", action="version", version=f"sklocus {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Subcommand parsers are built by add_parser from the parent's class, so
    # their usage errors are one line too.
    for add in (
        _add_model_commands,
        _add_evaluation_commands,
        _add_geometry_commands,
        _add_report_command,
        _add_serve_command,
        _add_feedback_command,
        _add_demo_command,
        _add_data_command,
    ):
        add(commands)
    return parser


def _add_model_commands(commands):
    """Add ``fit``, ``embed`` and ``route`` to the subcommands."""
    fit = commands.add_parser(
        "fit",
        help="train an embedder on an evaluation table and save it",
        description="Train a LocusEmbedder on the evaluations in EVALS and save it "
        "with sklocus.save, a model file that loads without running code.",
    )
    fit.add_argument("evals", metavar="EVALS", help="the evaluations to train on")
    fit.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="where to write the model file (.sklocus is a good suffix)",
    )
    add_table_options(fit)
    encoding = add_vector_options(fit)
    encoding.add_argument(
        "--encoder",
        default="all-MiniLM-L6-v2",
        metavar="NAME",
        help="sentence-transformers model (name or folder) that encodes query "
        "texts when no vectors are given (default: all-MiniLM-L6-v2, installed "
        "with sklocus)",
    )
    add_encoding_cache_option(fit)
    training = fit.add_argument_group("training")
    training.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a LocusEmbedder parameter, e.g. --set n_latents=32 --set "
        "max_epochs=5 (repeatable; values are Python literals or text)",
    )
    training.add_argument(
        "--device", default="auto", help="auto (CUDA when available), cpu, cuda..."
    )
    training.add_argument(
        "--random-state", type=integer_in(0, 2**32 - 1), metavar="N", help="seed"
    )
    training.add_argument(
        "--quiet", action="store_true", help="print no line per training epoch"
    )
    add_test_queries_option(training, held_out_of="training")
    fit.set_defaults(run="_models:run_fit")

    embed = commands.add_parser(
        "embed",
        help="embed every model of an evaluation table",
        description="Embed each model of EVALS with the trained model in MODEL "
        "(one forward pass per model, no training) and write one row per model: "
        "model, n_evaluations and the vector's components z0, z1, ...",
    )
    embed.add_argument("model", metavar="MODEL", help="a model file from sklocus fit")
    embed.add_argument("evals", metavar="EVALS", help="the evaluations to embed")
    add_output_option(embed, required=True, what="the embedding table")
    add_table_options(embed)
    add_vector_options(embed)
    add_encoding_cache_option(embed)
    embed.add_argument(
        "--cost-column",
        metavar="COL",
        help="also write each model's cost: the mean of this column over its rows",
    )
    streaming = embed.add_argument_group(
        "streaming",
        "For tables that do not fit in memory: EVALS is a Parquet file or a folder "
        "of them, sorted or partitioned by model, read a batch at a time.",
    )
    streaming.add_argument(
        "--stream",
        action="store_true",
        help="embed batch by batch and write the Parquet output as it comes, in "
        "flat memory",
    )
    streaming.add_argument(
        "--batch-models",
        type=integer_in(1),
        default=1024,
        metavar="N",
        help="models embedded and written at a time with --stream (default: 1024)",
    )
    embed.set_defaults(run="_models:run_embed")

    route = commands.add_parser(
        "route",
        help="choose a model from a pool for each query",
        description="Embed the pool of models in EVALS with MODEL, then write for "
        "each query of QUERIES the chosen model and the k best models with their "
        "probability of a correct answer. QUERIES is a CSV or Parquet table with "
        "the query column (and the text column, when given), or a .txt file of one "
        "query per line; without QUERIES, the held-out queries of --test-queries "
        "or --test-split are routed.",
    )
    route.add_argument("model", metavar="MODEL", help="a model file from sklocus fit")
    route.add_argument("evals", metavar="EVALS", help="the pool's evaluations")
    route.add_argument(
        "queries",
        metavar="QUERIES",
        nargs="?",
        help="the queries to route (default: the held-out ones)",
    )
    add_output_option(route, required=True, what="the routes")
    add_queries_text_option(add_table_options(route))
    add_vector_options(route)
    add_encoding_cache_option(route)
    choice = route.add_argument_group("choice")
    choice.add_argument(
        "-k",
        type=integer_in(1),
        default=3,
        metavar="K",
        help="models listed per query (default: 3)",
    )
    choice.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="NAME",
        help="a model that is unavailable (repeatable)",
    )
    choice.add_argument(
        "--cost-column",
        metavar="COL",
        help="each model's cost: the mean of this column over its rows of EVALS",
    )
    choice.add_argument(
        "--group-column",
        metavar="COL",
        help="each query's benchmark, subject or category, a column of EVALS and "
        "of QUERIES: the router corrects each model's predictions per group",
    )
    choice.add_argument(
        "--calibration",
        choices=CALIBRATION_CHOICES,
        metavar="CALIBRATION",
        help="calibrate the router on held-out halves of the pool's evaluations "
        "(LocusRouter's calibration=): 'pool' fits LOCUS's logits to the pool, "
        "'isotonic' and 'sigmoid' map the probabilities (what --min-probability "
        "and --budget read) through a calibrator of that method, 'pool+isotonic' "
        "and 'pool+sigmoid' do both",
    )
    policy = choice.add_mutually_exclusive_group()
    policy.add_argument(
        "--cost-weight",
        type=non_negative_number,
        metavar="W",
        help="probability traded against the most expensive model's cost "
        "(with --cost-column)",
    )
    policy.add_argument(
        "--min-probability",
        type=probability,
        metavar="P",
        help="route to the cheapest model whose probability of a correct answer "
        "is at least P, or to the likeliest when none is (with --cost-column)",
    )
    policy.add_argument(
        "--budget",
        type=non_negative_number,
        metavar="B",
        help="route with the weight of cost that gave the best quality at a mean "
        "cost per query of at most B on held-out evaluations (with --cost-column)",
    )
    add_test_queries_option(choice, held_out_of="the pool")
    route.set_defaults(run="_models:run_route")


def _add_new_model_inputs(parser, *, evals, queries, output, title, groups):
    """Add what ``suggest`` and ``estimate`` both read, and their shared options.

    Returns the argument group of the command's own options, which already
    holds ``--group-column`` (``groups`` says what it does) and
    ``--random-state``.
    """
    parser.add_argument("model", metavar="MODEL", help="a model file from sklocus fit")
    parser.add_argument("evals", metavar="EVALS", help=evals)
    parser.add_argument("queries", metavar="QUERIES", help=queries)
    add_output_option(parser, required=True, what=output)
    add_queries_text_option(add_table_options(parser))
    add_vector_options(parser)
    add_encoding_cache_option(parser)
    group = parser.add_argument_group(title)
    group.add_argument(
        "--group-column",
        metavar="COL",
        help="each query's benchmark, subject or category, a column of QUERIES"
        + groups,
    )
    group.add_argument(
        "--scores",
        metavar="FILE",
        help="the reference models' full scores (a leaderboard), CSV or Parquet: "
        "the model column (as in EVALS) and one column per group; a group named "
        "there is estimated on that scale, read from the evaluations, and the "
        "suggestions aim at those scores",
    )
    group.add_argument(
        "--random-state", type=integer_in(0, 2**32 - 1), metavar="N", help="seed"
    )
    return group


def _add_evaluation_commands(commands):
    """Add ``suggest`` and ``estimate``: evaluating new models on a few queries."""
    suggest = commands.add_parser(
        "suggest",
        help="choose which queries to evaluate a new model on",
        description="Choose the K queries of QUERIES whose results would tell most "
        "about the new model's scores, given the reference models' evaluations in "
        "EVALS and the trained model in MODEL, and write them in the order chosen. "
        "The new model's own rows of EVALS, if any, are what it was evaluated on so "
        "far: those queries are never suggested again. QUERIES is a CSV or Parquet "
        "table with the query column (and the text column, when given), or a .txt "
        "file of one query per line.",
    )
    choice = _add_new_model_inputs(
        suggest,
        evals="the reference models' evaluations",
        queries="the queries it may be evaluated on",
        output="the suggested queries",
        title="choice",
        groups=": the suggestions narrow every group's estimated score alike",
    )
    choice.add_argument(
        "--new-model",
        required=True,
        metavar="NAME",
        help="the model to evaluate: its rows of EVALS (if any) are its results so "
        "far, and it is left out of the reference models",
    )
    choice.add_argument(
        "--n-queries",
        type=integer_in(1),
        default=32,
        metavar="N",
        help="how many queries to suggest (default: 32)",
    )
    choice.add_argument(
        "--strategy",
        choices=("variance", "anchors", "disagreement", "coverage", "random"),
        default="variance",
        help="variance (default): the results expected to narrow the estimated "
        "scores most, given the results so far; anchors: the same choice made "
        "without reading the results, the same queries for every new model; "
        "disagreement: where the models like it disagree most; coverage: spread "
        "over the query encodings; random",
    )
    suggest.set_defaults(run="_estimate:run_suggest")

    estimate = commands.add_parser(
        "estimate",
        help="estimate new models' scores from a few evaluations",
        description="Estimate the score of each model named by --new-model on "
        "each group of QUERIES (a benchmark, a subject; all of them when no "
        "--group-column is given) from its rows of EVALS, the other models of "
        "EVALS being the reference models, and write one row per model and group: "
        "model, group, n_queries, n_evaluated, estimate, std, lower, upper, target. "
        "A group with a column in --scores is estimated on that scale (target "
        "'full score'), any other as the mean over its queries ('item mean'). "
        "QUERIES is read as suggest reads it.",
    )
    choice = _add_new_model_inputs(
        estimate,
        evals="the evaluations, the new models' included",
        queries="every query of the groups to estimate",
        output="the estimates",
        title="estimates",
        groups="",
    )
    choice.add_argument(
        "--new-model",
        required=True,
        action="append",
        metavar="NAME",
        help="a model to estimate, left out of the reference models (repeatable)",
    )
    choice.add_argument(
        "--confidence",
        type=open_probability,
        default=0.9,
        metavar="P",
        help="the intervals' nominal coverage, in (0, 1) (default: 0.9)",
    )
    estimate.set_defaults(run="_estimate:run_estimate")


def _add_geometry_commands(commands):
    """Add the geometry subcommands."""
    neighbors = commands.add_parser(
        "neighbors",
        help="list each model's nearest models",
        description="List each model's k nearest other models, nearest first: its "
        "substitutes.",
    )
    neighbors.add_argument("embeddings", metavar="EMBEDDINGS", help=_EMBEDDINGS_HELP)
    neighbors.add_argument(
        "-k", type=integer_in(1), default=5, help="neighbours per model (default: 5)"
    )
    neighbors.add_argument(
        "--model",
        action="append",
        metavar="NAME",
        help="list only this model's neighbours (repeatable; default: every model)",
    )
    add_metric_option(neighbors)
    add_output_option(neighbors, required=False, what="the neighbours")
    neighbors.set_defaults(run="_geometry:run_neighbors")

    duplicates = commands.add_parser(
        "duplicates",
        help="list pairs of models that behave alike",
        description="List the pairs of models closer than a threshold, closest first.",
    )
    duplicates.add_argument("embeddings", metavar="EMBEDDINGS", help=_EMBEDDINGS_HELP)
    duplicates.add_argument(
        "--threshold",
        type=positive_number,
        metavar="T",
        help="report pairs closer than this (default: 1e-4 for the euclidean "
        "metric, which flags models whose evaluations are identical; required for "
        "cosine)",
    )
    add_metric_option(duplicates)
    add_output_option(duplicates, required=False, what="the pairs")
    duplicates.set_defaults(run="_geometry:run_duplicates")

    clusters = commands.add_parser(
        "clusters",
        help="group models into families",
        description="Cluster the models hierarchically (average linkage).",
    )
    clusters.add_argument("embeddings", metavar="EMBEDDINGS", help=_EMBEDDINGS_HELP)
    cut = clusters.add_mutually_exclusive_group(required=True)
    cut.add_argument("--n-clusters", type=integer_in(1), metavar="K")
    cut.add_argument(
        "--distance-threshold",
        type=positive_number,
        metavar="D",
        help="cut where clusters are farther apart than this",
    )
    add_metric_option(clusters)
    add_output_option(clusters, required=False, what="each model's cluster")
    clusters.set_defaults(run="_geometry:run_clusters")

    select = commands.add_parser(
        "select",
        help="choose a portfolio of models that covers the pool",
        description="Choose a few models that cover the pool: k-center (farthest "
        "first), k-medoids, or coverage-greedy within a largest total cost, with "
        "costs from a column of the embedding table.",
    )
    select.add_argument("embeddings", metavar="EMBEDDINGS", help=_EMBEDDINGS_HELP)
    select.add_argument(
        "--method",
        choices=("k-center", "k-medoids", "coverage"),
        default="k-center",
        help="default: k-center",
    )
    select.add_argument(
        "--n-selected",
        type=integer_in(1),
        metavar="N",
        help="models to choose (k-center, k-medoids)",
    )
    select.add_argument(
        "--max-total-cost",
        type=positive_number,
        metavar="COST",
        help="largest total cost (coverage); with no --cost-column, a number of models",
    )
    select.add_argument(
        "--cost-column",
        metavar="COL",
        help="each model's cost, a column of EMBEDDINGS (coverage)",
    )
    add_metric_option(select)
    add_output_option(select, required=False, what="the chosen models")
    select.set_defaults(run="_geometry:run_select")


def _add_report_command(commands):
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
    add_encoding_cache_option(report)
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
        "--color",
        default="cluster",
        metavar="COL",
        help="colour by cluster (default) or by a --metadata-column",
    )
    page.add_argument(
        "--cost-column",
        metavar="COL",
        help="each model's cost, such as its parameters: the portfolio panel "
        "then also offers coverage within a largest total cost (models with no "
        "value are left out of those portfolios)",
    )
    add_test_queries_option(page, held_out_of="the embeddings and the router")
    page.add_argument(
        "--n-clusters",
        type=integer_in(1),
        metavar="K",
        help="clusters to colour by (default: about the square root of the number "
        "of models, from 2 to 8)",
    )
    page.add_argument("--title", default="Model map", help="the page's title")
    report.set_defaults(run="_report:run_report")


def _add_serve_command(commands):
    """Add ``serve`` to the subcommands."""
    serve = commands.add_parser(
        "serve",
        help="serve a router over HTTP (POST /route, /predict, /models)",
        description="Serve the router in MODEL over HTTP until interrupted: POST "
        "/route routes queries, POST /predict gives P(correct), POST /models "
        "onboards a model from its evaluations and DELETE /models/NAME retires "
        "one, POST /feedback learns from outcomes (with --feedback-journal), GET "
        "/models and GET /health say what is served, and /docs is the "
        "OpenAPI page. With --upstreams, POST /v1/chat/completions takes "
        "OpenAI's chat requests, routes each and forwards it to the chosen "
        "model's API. MODEL is a router saved with sklocus.save, or an embedder "
        "from sklocus fit with EVALS, the pool to route among. Needs the serve "
        "extra (pip install 'sklocus[serve]'). With a token (the environment "
        f"variable {TOKEN_VARIABLE}, or --token-file), onboarding, removal, "
        "feedback and chat completions need the header 'Authorization: Bearer "
        "TOKEN'.",
    )
    serve.add_argument(
        "model", metavar="MODEL", help="a router file, or an embedder file with EVALS"
    )
    serve.add_argument(
        "evals",
        metavar="EVALS",
        nargs="?",
        help="the pool's evaluations, when MODEL is an embedder",
    )
    add_table_options(serve)
    add_vector_options(serve)
    add_encoding_cache_option(
        serve,
        " The server uses it while it builds the router and, with "
        "--feedback-journal, loads the encodings of the pool's queries; routed "
        "queries are not added to it.",
    )
    server = serve.add_argument_group("server")
    server.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1; 0.0.0.0 for every interface)",
    )
    server.add_argument(
        "--port", type=integer_in(0, 65535), default=8000, help="default: 8000"
    )
    server.add_argument(
        "--workers",
        type=integer_in(1),
        default=1,
        metavar="N",
        help="serve with N processes on the one port, each a replica of --store "
        "(required), so that routing uses N cores; a worker that dies is started "
        "again (default: 1, one process)",
    )
    server.add_argument(
        "--write-back",
        action="store_true",
        help="save the router after each onboarding or removal, atomically, to "
        "MODEL (a router file) or to --router-file",
    )
    server.add_argument(
        "--router-file",
        metavar="FILE",
        help="with EVALS: save the router built from MODEL and EVALS here before "
        "serving (and after each change, with --write-back)",
    )
    server.add_argument(
        "--cost-column",
        metavar="COL",
        help="with EVALS: each model's cost, the mean of this column over its rows",
    )
    server.add_argument(
        "--group-column",
        metavar="COL",
        help="with EVALS: each query's benchmark, subject or category, a column of "
        "EVALS, read as text: the router corrects each model's predictions per "
        "group, and requests may give query_groups",
    )
    server.add_argument(
        "--calibration",
        choices=CALIBRATION_CHOICES,
        metavar="CALIBRATION",
        help="with EVALS: calibrate the router on held-out halves of the pool's "
        "evaluations, as route's --calibration says",
    )
    policy = server.add_mutually_exclusive_group()
    policy.add_argument(
        "--cost-weight",
        type=non_negative_number,
        default=0.0,
        metavar="W",
        help="with EVALS: the router's weight of cost (default: 0; a request can "
        "give its own)",
    )
    policy.add_argument(
        "--min-probability",
        type=probability,
        metavar="P",
        help="with EVALS and --cost-column: route to the cheapest model whose "
        "probability of a correct answer is at least P (a request can give its "
        "own policy)",
    )
    policy.add_argument(
        "--budget",
        type=non_negative_number,
        metavar="B",
        help="with EVALS and --cost-column: route within a mean cost per query of "
        "B, the weight of cost chosen on held-out evaluations (a request can give "
        "its own budget)",
    )
    proxy = serve.add_argument_group(
        "chat proxy",
        "OpenAI's POST /v1/chat/completions: each request routed by the text of "
        "its last user message ('model': 'auto') and forwarded to the chosen "
        "model's own API, its answer (or stream) relayed",
    )
    proxy.add_argument(
        "--upstreams",
        metavar="FILE",
        help="a TOML file with a table [models.NAME] per model: base_url (its "
        "OpenAI-compatible API), model (its name there; default NAME) and "
        "api_key_env (the environment variable holding its key, read at start; "
        "never the key itself)",
    )
    proxy.add_argument(
        "--fallbacks",
        type=integer_in(0),
        metavar="N",
        help="with --upstreams: the next-ranked models a request tries when the "
        "chosen one's upstream fails, cannot be reached or times out (default: "
        "1; 0: none)",
    )
    proxy.add_argument(
        "--upstream-timeout",
        type=positive_number,
        metavar="SECONDS",
        help="with --upstreams: seconds an upstream has to connect, and then "
        "for each part of its answer (default: 60)",
    )
    proxy.add_argument(
        "--upstream-deadline",
        type=positive_number,
        metavar="SECONDS",
        help="with --upstreams: seconds a whole call to an upstream may take, "
        "its answer streamed to the end included (default: 600)",
    )
    proxy.add_argument(
        "--max-answer-mb",
        type=positive_number,
        metavar="MB",
        help="with --upstreams: largest answer in MiB read from an upstream, a "
        "stream in all; past it the answer is cut off (default: 16)",
    )
    learning = serve.add_argument_group("learning from outcomes")
    learning.add_argument(
        "--feedback-journal",
        metavar="FILE",
        help="keep the outcomes POST /feedback receives in this SQLite file "
        "(created when missing), on disk before each answer, and fold them into "
        "the router as they arrive; the outcomes the router does not hold yet "
        "are learnt at start. With --write-back each fold is saved to the model "
        "file. Without it, POST /feedback is refused",
    )
    learning.add_argument(
        "--store",
        metavar="LOCATION",
        help="serve as one replica of several that share this store: a SQLite "
        "file (replicas on one machine) or postgresql://USER@HOST/DB (replicas "
        "anywhere; the password from the URI, PGPASSWORD or ~/.pgpass, and never "
        "shown). Outcomes, onboardings and removals sent to any replica go to "
        "the store's log, which every replica folds in the same order; MODEL "
        "starts a store that holds no router yet. Not with --feedback-journal or "
        f"--write-back (default: the environment variable {STORE_VARIABLE})",
    )
    learning.add_argument(
        "--fold-interval",
        type=non_negative_number,
        default=1.0,
        metavar="SECONDS",
        help="seconds over which outcomes gather before they are folded in, each "
        "model they name embedded again once (default: 1)",
    )
    learning.add_argument(
        "--snapshot-interval",
        type=non_negative_number,
        metavar="SECONDS",
        help="with --store: seconds between the snapshots of the router that the "
        "replica holding the store's lease writes there; a replica that starts "
        "loads the latest and folds the log after it (default: 60)",
    )
    learning.add_argument(
        "--exploration",
        choices=("thompson", "ucb", "none"),
        help="how the router explores while it learns from outcomes (see "
        "LocusRouter's exploration); default: as the router was saved",
    )
    server.add_argument(
        "--max-batch",
        type=integer_in(1),
        default=256,
        metavar="N",
        help="most queries or models one request may name (default: 256)",
    )
    server.add_argument(
        "--max-evaluations",
        type=integer_in(1),
        default=50_000,
        metavar="N",
        help="most evaluations one onboarding (POST /models) may give (default: 50000)",
    )
    server.add_argument(
        "--token-file",
        metavar="FILE",
        help="a file holding the token that onboarding, removal, feedback and "
        "(with --upstreams) chat completions require as 'Authorization: Bearer "
        "TOKEN' (default: the environment variable "
        f"{TOKEN_VARIABLE}, if set; no token otherwise). Never give the token "
        "itself on the command line, where other users can read it",
    )
    limits = serve.add_argument_group(
        "limits per client",
        "what anyone who can reach the server may take; a client is an address "
        "connections come from (behind a proxy, keep these limits in the proxy)",
    )
    limits.add_argument(
        "--max-body-mb",
        type=non_negative_number,
        default=8.0,
        metavar="MB",
        help="largest request body in MiB of onboarding and feedback, which "
        "need the token when there is one (default: 8)",
    )
    limits.add_argument(
        "--max-open-body-mb",
        type=non_negative_number,
        default=1.0,
        metavar="MB",
        help="largest request body in MiB of routing and prediction, which "
        "need no token (default: 1)",
    )
    limits.add_argument(
        "--max-connections",
        type=integer_in(1),
        default=1000,
        metavar="N",
        help="connections open at once; a new one closes the one waiting longest "
        "for a request (default: 1000)",
    )
    limits.add_argument(
        "--max-client-connections",
        type=integer_in(1),
        default=64,
        metavar="N",
        help="connections open at once from one address (default: 64)",
    )
    limits.add_argument(
        "--rate-limit",
        type=non_negative_number,
        default=1000.0,
        metavar="N",
        help="requests a second one address may make on average, a refused "
        "request counting as 50; over it, its requests wait (default: 1000; "
        "0: no limit)",
    )
    limits.add_argument(
        "--query-rate-limit",
        type=non_negative_number,
        default=200.0,
        metavar="N",
        help="queries a second one address may have routed or scored on average; "
        "over it, its requests wait (default: 200; 0: no limit)",
    )
    limits.add_argument(
        "--text-rate-limit",
        type=non_negative_number,
        default=200_000.0,
        metavar="N",
        help="characters of query text a second one address may have routed or "
        "scored on average (default: 200000; 0: no limit)",
    )
    server.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        default="info",
        help="uvicorn's log level; 'info' logs each request (default: info)",
    )
    serve.set_defaults(run="_serve:run_serve")


def _add_feedback_command(commands):
    """Add ``feedback`` to the subcommands."""
    feedback = commands.add_parser(
        "feedback",
        help="fold outcomes into a router's model file",
        description="Fold the outcomes in OUTCOMES into the router in MODEL, a "
        "router file, and save it (in place, atomically, unless -o is given): each "
        "model with outcomes is embedded again from all its evaluations, as "
        "LocusRouter.partial_fit does, a query seen before counting with the mean "
        "of its outcomes. OUTCOMES is a CSV or Parquet table with one row per "
        "outcome (model, query, score in [0, 1]); a repeated row is one more "
        "outcome.",
    )
    feedback.add_argument("model", metavar="MODEL", help="a router file")
    feedback.add_argument("outcomes", metavar="OUTCOMES", help="the outcomes")
    feedback.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="write the router here instead of over MODEL",
    )
    table = feedback.add_argument_group("outcome table")
    for option, default in [("model", "model"), ("query", "query"), ("score", "score")]:
        table.add_argument(
            f"--{option}-column",
            default=default,
            metavar="COL",
            help=f"default: {default}",
        )
    table.add_argument(
        "--group-column",
        metavar="COL",
        help="each query's group, for a router fitted with query groups: a query "
        "new to the router takes it; another group for a query it knows is an "
        "error",
    )
    add_encoding_cache_option(
        feedback,
        " Each model with outcomes is embedded again from all its queries, whose "
        "texts the router's encoder encodes.",
    )
    feedback.set_defaults(run="_feedback:run_feedback")


def _add_demo_command(commands):
    """Add ``demo`` to the subcommands."""
    demo_parser = commands.add_parser(
        "demo",
        help="train, onboard and evaluate on built-in data",
        description="Train an embedder on synthetic evaluations, onboard held-out "
        "models with one forward pass each, and report their held-out correctness "
        "and routing accuracy beside simple baselines, and a few models' nearest "
        "neighbours (about three and a half minutes on two CPU cores; --quick is "
        "a smaller, shorter run).",
    )
    demo_parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK['n_models']} models, {QUICK['n_queries']} queries and at most "
        f"{QUICK['max_epochs']} epochs",
    )
    demo_parser.add_argument(
        "--random-state",
        type=integer_in(0, 2**32 - 1),
        default=0,
        metavar="N",
        help="seed of the data and the training (default: 0)",
    )
    demo_parser.add_argument(
        "--max-epochs",
        type=integer_in(1),
        metavar="N",
        help="most training epochs (default: 4)",
    )
    demo_parser.set_defaults(run="_demo:run_demo")


def _add_data_command(commands):
    """Add ``data`` to the subcommands."""
    data = commands.add_parser(
        "data",
        help="print the path of a data folder that ships with sklocus",
        description="Print the path of the evaluation folder NAME that ships with "
        "sklocus, for EVALS of any command (DATA=$(sklocus data llmrouter)); "
        "without NAME, list them with what they hold.",
    )
    data.add_argument("name", metavar="NAME", nargs="?", help="e.g. llmrouter")
    data.set_defaults(run="_data:run_data")
