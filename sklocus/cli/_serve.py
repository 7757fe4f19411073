"""``sklocus serve``: a router over HTTP, from a model file."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from sklocus._persistence import load, save
from sklocus._router import LocusRouter
from sklocus.cli._common import (
    UserError,
    add_table_options,
    add_vector_options,
    integer_in,
    non_negative_number,
)
from sklocus.cli._models import build_router, checked_embedder, say, teach_queries
from sklocus.cli._tables import per_query, read_evaluations

TOKEN_VARIABLE = "SKLOCUS_TOKEN"


def register(commands):
    """Add ``serve`` to the subcommands."""
    serve = commands.add_parser(
        "serve",
        help="serve a router over HTTP (POST /route, /predict, /models)",
        description="Serve the router in MODEL over HTTP until interrupted: POST "
        "/route routes queries, POST /predict gives P(correct), POST /models "
        "onboards a model from its evaluations and DELETE /models/NAME retires "
        "one, GET /models and GET /health say what is served, and /docs is the "
        "OpenAPI page. MODEL is a router saved with sklocus.save, or an embedder "
        "from sklocus fit with EVALS, the pool to route among. Needs the serve "
        "extra (pip install 'sklocus[serve]'). With a token (the environment "
        f"variable {TOKEN_VARIABLE}, or --token-file), onboarding and removal "
        "need the header 'Authorization: Bearer TOKEN'.",
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
        "--cost-weight",
        type=non_negative_number,
        default=0.0,
        metavar="W",
        help="with EVALS: the router's weight of cost (default: 0; a request can "
        "give its own)",
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
        help="a file holding the token that onboarding and removal require as "
        f"'Authorization: Bearer TOKEN' (default: the environment variable "
        f"{TOKEN_VARIABLE}, if set; no token otherwise). Never give the token "
        "itself on the command line, where other users can read it",
    )
    server.add_argument(
        "--max-body-mb",
        type=non_negative_number,
        default=8.0,
        metavar="MB",
        help="largest request body in MiB (default: 8)",
    )
    server.add_argument(
        "--log-level",
        choices=["critical", "error", "warning", "info", "debug"],
        default="info",
        help="uvicorn's log level; 'info' logs each request (default: info)",
    )
    serve.set_defaults(run=run_serve)


def _router_from(arguments):
    """Return the router to serve, and the file to write its changes back to."""
    path = Path(arguments.model)
    if not path.is_file():
        raise UserError(f"{path}: no such model file")
    loaded = load(path)
    if arguments.evals is None:
        for option in ("router_file", "cost_column", "group_column"):
            if getattr(arguments, option) is not None:
                flag = "--" + option.replace("_", "-")
                raise UserError(f"argument {flag}: goes with EVALS, the pool to build")
        if not isinstance(loaded, LocusRouter):
            raise UserError(
                f"{path} holds a {type(loaded).__name__}, not a LocusRouter; give "
                "EVALS too, the pool to route among"
            )
        return loaded, path
    if isinstance(loaded, LocusRouter):
        raise UserError(f"{path} holds a router already; leave out EVALS")
    embedder = checked_embedder(loaded, path)
    evaluations = read_evaluations(arguments, cost_column=arguments.cost_column)
    teach_queries(embedder, arguments, evaluations)
    router = build_router(
        embedder,
        evaluations,
        arguments.cost_weight,
        _pool_groups(arguments, evaluations),
    )
    target = None
    if arguments.router_file is not None:
        # Checked with every output before any work (cli.check_outputs).
        target = Path(arguments.router_file)
        save(router, target)
        say(f"Saved the router of {len(router.classes_)} models to {target}.")
    return router, target


def _pool_groups(arguments, evaluations):
    """Each pool query's group from --group-column, as text (JSON's labels)."""
    if arguments.group_column is None:
        return None
    groups = per_query(evaluations, arguments.query_column, arguments.group_column)
    return {query: str(group) for query, group in groups.items()}


def _token(arguments):
    """Return the token from --token-file or the environment, or None."""
    if arguments.token_file is None:
        token, source = os.environ.get(TOKEN_VARIABLE), TOKEN_VARIABLE
    else:
        try:
            token = Path(arguments.token_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise UserError(
                f"argument --token-file: cannot read it ({error})"
            ) from None
        source = f"--token-file {arguments.token_file}"
    if token is None:
        return None
    token = token.strip()
    if not token or any(char.isspace() for char in token):
        raise UserError(f"{source}: the token is empty or holds spaces")
    return token


def _is_loopback(host):
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def run_serve(arguments):
    """Serve a router until interrupted."""
    try:
        from sklocus.serve import RouterService, listen, run
    except ImportError as error:
        raise UserError(str(error)) from None
    token = _token(arguments)
    router, target = _router_from(arguments)
    if arguments.write_back and target is None:
        raise UserError(
            "argument --write-back: needs a router file to write to; give "
            "--router-file, or serve a router file"
        )
    service = RouterService(
        router,
        path=target,
        write_back=arguments.write_back,
        max_batch=arguments.max_batch,
        max_evaluations=arguments.max_evaluations,
    )
    try:  # before the warm-up: a port in use is known at once
        listener = listen(arguments.host, arguments.port)
    except OSError as error:
        raise UserError(str(error)) from None
    service.warm_up()
    if token is None and not _is_loopback(arguments.host):
        say(
            f"Warning: listening on {arguments.host}, beyond the loopback, with no "
            "token: anyone who can reach this port can onboard and remove models. "
            f"Set {TOKEN_VARIABLE} or give --token-file."
        )
    groups = (
        "" if router.groups_ is None else f" with {len(router.groups_)} query groups"
    )
    say(
        f"Serving {len(router.classes_)} models{groups} on http://{arguments.host}:"
        f"{listener.getsockname()[1]} (OpenAPI page at /docs"
        + (f"; changes are saved to {target}" if arguments.write_back else "")
        + ("; changes need the token" if token is not None else "")
        + ")."
    )
    run(
        service,
        listener=listener,
        token=token,
        max_body_bytes=int(arguments.max_body_mb * 2**20),
        log_level=arguments.log_level,
    )
    return 0
