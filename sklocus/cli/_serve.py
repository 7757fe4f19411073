"""``sklocus serve``: a router over HTTP, from a model file."""

from __future__ import annotations

import ipaddress
import os
import re
import sqlite3
import stat
from pathlib import Path

from sklocus import LocusRouter
from sklocus.cli._common import (
    UserError,
    say,
    status,
)
from sklocus.cli._models import (
    build_router,
    checked_embedder,
    load_file,
    run_settings,
    save_file,
    teach_queries,
)
from sklocus.cli._parsers import STORE_VARIABLE, TOKEN_VARIABLE
from sklocus.cli._tables import per_query, read_evaluations
from sklocus.serve._journal import FeedbackJournal, JournalError
from sklocus.serve._request import query_encoder
from sklocus.serve._service import router_thread


def _router_from(arguments):
    """Return the router to serve, and the file to write its changes back to."""
    path = Path(arguments.model)
    if not path.is_file():
        raise UserError(f"{path}: no such model file")
    loaded = load_file(path)
    if arguments.evals is None:
        for option in (
            "router_file",
            "cost_column",
            "group_column",
            "min_probability",
            "budget",
            "calibration",
        ):
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
    for option in ("min_probability", "budget"):
        if getattr(arguments, option) is not None and arguments.cost_column is None:
            flag = "--" + option.replace("_", "-")
            raise UserError(
                f"argument {flag}: goes with --cost-column, the costs it routes by"
            )
    embedder = checked_embedder(loaded, path)
    if arguments.feedback_journal is not None:
        # A router built afresh holds none of the journal's outcomes: every
        # one is learnt again, whatever file they were once folded into.
        try:
            journal = FeedbackJournal(arguments.feedback_journal)
            journal.forget_folds()
            journal.close()
        except (JournalError, sqlite3.Error) as error:
            raise UserError(_journal_fault(arguments, error)) from None
    evaluations = read_evaluations(arguments, cost_column=arguments.cost_column)
    teach_queries(embedder, arguments, evaluations)
    say(
        f"Building the router over the {len(evaluations.sets)} models of "
        f"{evaluations.source}..."
    )
    # Built on the thread that will route with it: torch keeps a pool of OpenMP
    # threads per calling thread, and a second pool would slow every route.
    with run_settings(embedder, arguments):
        router = router_thread.call(
            build_router,
            embedder,
            evaluations,
            arguments.cost_weight,
            _pool_groups(arguments, evaluations),
            arguments.min_probability,
            arguments.budget,
            arguments.calibration,
        )
    target = None
    if arguments.router_file is not None:
        # Checked with every output before any work (cli.check_outputs).
        target = Path(arguments.router_file)
        save_file(router, target)
        say(f"Saved the router of {len(router.classes_)} models to {target}.")
    return router, target


def _load_pool_encodings(router, arguments):
    """Encode the pool's queries now, from the encoding cache where it has them.

    Learning from an outcome embeds its model again from all its queries.
    Their encodings are kept in memory from here on, so that no fold (at start
    or while serving) encodes them again. The disk cache serves only this
    start: while serving, the router holds no settings of this run, which a
    write-back would save in the model file, and routed queries do not grow
    the cache.
    """
    queries = getattr(router, "evaluation_queries_", None)
    if queries is None:  # a file too old to learn from: the service says so
        return
    encoder = query_encoder(router)
    with run_settings(router, arguments):
        router_thread.call(encoder.transform, queries.tolist())


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
        path = Path(arguments.token_file)
        try:
            token = path.read_text(encoding="utf-8")
            mode = path.stat().st_mode
        except (OSError, UnicodeDecodeError) as error:
            raise UserError(
                f"argument --token-file: cannot read it ({error})"
            ) from None
        if os.name == "posix" and mode & 0o077:
            raise UserError(
                f"argument --token-file: {path} can be read or written by other "
                f"users (mode {stat.S_IMODE(mode):04o}); make it its owner's alone: "
                f"chmod 600 {path}"
            )
        source = f"--token-file {arguments.token_file}"
    if token is None:
        return None
    token = token.strip()
    if not token or any(char.isspace() for char in token):
        raise UserError(f"{source}: the token is empty or holds spaces")
    return token


# The option of serve that sets each of ServerLimits' limits.
_LIMIT_FLAGS = {
    "max_body_bytes": "--max-body-mb",
    "max_open_body_bytes": "--max-open-body-mb",
    "max_connections": "--max-connections",
    "max_client_connections": "--max-client-connections",
    "rate": "--rate-limit",
    "query_rate": "--query-rate-limit",
    "text_rate": "--text-rate-limit",
}


def _limits(arguments):
    """Return the server's limits from the command line, checked."""
    from sklocus.serve import ServerLimits, _allow_connections

    try:
        limits = ServerLimits(
            max_body_bytes=int(arguments.max_body_mb * 2**20),
            max_open_body_bytes=int(arguments.max_open_body_mb * 2**20),
            max_connections=arguments.max_connections,
            max_client_connections=arguments.max_client_connections,
            rate=arguments.rate_limit,
            query_rate=arguments.query_rate_limit,
            text_rate=arguments.text_rate_limit,
        )
    except ValueError as error:
        limit = re.search(r"The '(\w+)' parameter", str(error))
        flag = _LIMIT_FLAGS.get(limit[1], limit[1]) if limit else "limits"
        raise UserError(f"{flag}: {error}") from None
    try:
        _allow_connections(limits.max_connections)
    except ValueError as error:
        raise UserError(f"--max-connections: {error}") from None
    return limits


def _store(arguments):
    """Open the store of --store, or of the environment; None without one."""
    location = arguments.store or os.environ.get(STORE_VARIABLE) or None
    if location is None:
        if arguments.snapshot_interval is not None:
            raise UserError("argument --snapshot-interval: goes with --store")
        return None
    source = "--store" if arguments.store else STORE_VARIABLE
    for option in ("feedback_journal", "write_back"):
        if getattr(arguments, option):
            flag = "--" + option.replace("_", "-")
            raise UserError(
                f"argument {flag}: not with {source}; the store keeps the outcomes "
                "and the router's snapshots"
            )
    from sklocus.serve._store import StoreError, open_store

    try:
        return open_store(location)
    except ImportError as error:
        raise UserError(f"{source}: {error}") from None
    except StoreError as error:
        raise UserError(f"{source}: {error}") from None


def _set_exploration(router, arguments):
    if arguments.exploration is not None:
        chosen = arguments.exploration
        router.set_params(exploration=None if chosen == "none" else chosen)


def _prepare(router, arguments):
    """Make a replica's router ready to serve and to learn, before it catches up."""
    _set_exploration(router, arguments)
    _load_pool_encodings(router, arguments)


def _replica(store, seed, arguments, quiet=False):
    """Serve as a replica of ``store``: its latest snapshot, or ``seed`` to start it."""
    from sklocus.serve._replica import ReplicaService
    from sklocus.serve._store import StoreError

    try:
        snapshot = store.latest_snapshot()
        if quiet:
            pass
        elif snapshot is not None:
            say(
                f"The store {store.location} holds a router through log entry "
                f"#{snapshot.through}: serving it, and following the log "
                f"({arguments.model} only starts a store that holds none)..."
            )
        else:
            say(f"Starting the store {store.location} from {arguments.model}...")
        return ReplicaService(
            store,
            seed,
            fold_interval=arguments.fold_interval,
            snapshot_interval=(
                60.0
                if arguments.snapshot_interval is None
                else arguments.snapshot_interval
            ),
            max_batch=arguments.max_batch,
            max_evaluations=arguments.max_evaluations,
            prepare=lambda router: _prepare(router, arguments),
        )
    except StoreError as error:
        store.close()
        raise UserError(f"--store: {error}") from None


def _claim_files(arguments):
    """Claim the files this server writes; refuse those another server writes."""
    from sklocus.serve._owner import OwnedElsewhere, claim

    claimed = []
    files = []
    if arguments.feedback_journal is not None:
        files.append(("--feedback-journal", arguments.feedback_journal, "journal"))
    if arguments.write_back:
        target = arguments.router_file or arguments.model
        files.append(("--write-back", target, "model file"))
    for flag, path, what in files:
        try:
            claimed.append(claim(path, what))
        except OwnedElsewhere as error:
            raise UserError(f"argument {flag}: {error}") from None
        except OSError as error:
            raise UserError(
                f"argument {flag}: cannot claim {path} for this server ({error})"
            ) from None
    return claimed


def _journal_fault(arguments, error):
    """Say what went wrong with the feedback journal (a full disk, say)."""
    if isinstance(error, JournalError):
        return str(error)
    return (
        f"argument --feedback-journal: {arguments.feedback_journal} could not be "
        f"read or written: {error}"
    )


def _upstreams(arguments):
    """Return the chat proxy's upstreams from --upstreams, or None."""
    if arguments.upstreams is None:
        for option in (
            "fallbacks",
            "upstream_timeout",
            "upstream_deadline",
            "max_answer_mb",
        ):
            if getattr(arguments, option) is not None:
                flag = "--" + option.replace("_", "-")
                raise UserError(f"argument {flag}: goes with --upstreams")
        return None
    from sklocus.serve import Upstreams

    settings = {}
    if arguments.fallbacks is not None:
        settings["fallbacks"] = arguments.fallbacks
    if arguments.upstream_timeout is not None:
        settings["timeout"] = arguments.upstream_timeout
    if arguments.upstream_deadline is not None:
        settings["deadline"] = arguments.upstream_deadline
    if arguments.max_answer_mb is not None:
        settings["max_answer_bytes"] = max(1, int(arguments.max_answer_mb * 2**20))
    try:
        return Upstreams.read(arguments.upstreams, **settings)
    except ValueError as error:
        raise UserError(f"argument --upstreams: {error}") from None


def _named(names):
    shown = ", ".join(repr(name) for name in names[:3])
    return shown + ("..." if len(names) > 3 else "")


def _check_upstreams(upstreams, router, quiet=False):
    """Refuse upstreams that name no model of the router; say what is left out.

    Returns
    -------
    int
        The router's models that have an upstream.
    """
    served = router.classes_.tolist()
    served_names = set(served)
    known = [name for name in served if name in upstreams]
    unknown = [name for name in upstreams if name not in served_names]
    if not known:
        raise UserError(
            f"argument --upstreams: names none of the router's {len(served)} "
            f"models (it names {_named(unknown)})"
        )
    if quiet:
        return len(known)
    if unknown:
        say(
            f"Note: --upstreams names {len(unknown)} models the router does not "
            f"serve ({_named(unknown)}); chat requests go to them once they are "
            "onboarded."
        )
    if len(known) < len(served):
        say(
            f"Note: {len(served) - len(known)} of the router's {len(served)} models "
            f"have no upstream; chat requests are routed among the other "
            f"{len(known)}."
        )
    return len(known)


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
        # create_app is imported only to fail now, before the model loads, when
        # the serve extra is missing.
        from sklocus.serve import RouterService, create_app, listen, run  # noqa: F401
    except ImportError as error:
        raise UserError(str(error)) from None
    token = _token(arguments)
    limits = _limits(arguments)
    upstreams = _upstreams(arguments)
    # Refused before the router is built, which may take minutes.
    if (
        arguments.write_back
        and arguments.evals is not None
        and arguments.router_file is None
    ):
        raise UserError(
            "argument --write-back: needs a router file to write to; give "
            "--router-file, or serve a router file"
        )
    if arguments.workers > 1:
        from sklocus.cli._workers import run_workers

        return run_workers(arguments, token)
    store = _store(arguments)
    claims = _claim_files(arguments)  # noqa: F841 (held while serving)
    router, target = _router_from(arguments)
    if store is None and upstreams is not None:
        routable = _check_upstreams(upstreams, router)
    _set_exploration(router, arguments)
    before = router.evaluation_counts_.sum()
    if arguments.feedback_journal is not None:
        _load_pool_encodings(router, arguments)
        say(
            f"Learning the outcomes of {arguments.feedback_journal} that the "
            "router does not hold yet..."
        )
    if store is not None:
        service = _replica(store, router, arguments)
        router = service.router
        if upstreams is not None:
            routable = _check_upstreams(upstreams, router)
    else:
        try:
            service = RouterService(
                router,
                path=target,
                write_back=arguments.write_back,
                max_batch=arguments.max_batch,
                max_evaluations=arguments.max_evaluations,
                feedback_journal=arguments.feedback_journal,
                fold_interval=arguments.fold_interval,
            )
        except (JournalError, sqlite3.Error) as error:
            raise UserError(_journal_fault(arguments, error)) from None
        learnt = int(service.router.evaluation_counts_.sum() - before)
        if learnt:
            say(f"Learnt {learnt:,} outcomes from {arguments.feedback_journal}.")
        elif arguments.feedback_journal is not None:
            say("The router held them all already.")
        router = service.router
    try:  # before the warm-up: a port in use is known at once
        listener = listen(arguments.host, arguments.port)
    except OSError as error:
        raise UserError(str(error)) from None
    with status("Warming up the router"):
        service.warm_up()
    if token is None and not _is_loopback(arguments.host):
        say(
            f"Warning: listening on {arguments.host}, beyond the loopback, with no "
            "token: anyone who can reach this port can onboard and remove models, "
            "send outcomes"
            + (" and spend the upstreams' keys" if upstreams is not None else "")
            + f". Set {TOKEN_VARIABLE} or give --token-file."
        )
    groups = ""
    if router.groups_ is not None:
        kind = "groups" if router.named_groups() is not None else "clusters"
        groups = f" with {len(router.groups_)} query {kind}"
    say(
        f"Serving {len(router.classes_)} models{groups} on http://{arguments.host}:"
        f"{listener.getsockname()[1]} (OpenAPI page at /docs"
        + (f"; changes are saved to {target}" if arguments.write_back else "")
        + (
            f"; POST /feedback keeps outcomes in {arguments.feedback_journal}"
            if arguments.feedback_journal is not None
            else ""
        )
        + (
            f"; POST /v1/chat/completions forwards to the upstreams of {routable} "
            "models"
            if upstreams is not None
            else ""
        )
        + ("; changes need the token" if token is not None else "")
        + ")."
    )
    try:
        run(
            service,
            listener=listener,
            token=token,
            limits=limits,
            log_level=arguments.log_level,
            upstreams=upstreams,
        )
    finally:
        # The journal's -wal and -shm files go with its last connection.
        service.close()
    return 0
