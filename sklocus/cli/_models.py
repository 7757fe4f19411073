"""``sklocus fit``, ``embed`` and ``route``: the commands that use a trained model."""

from __future__ import annotations

import contextlib
import copy
import time
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
from sklearn.frozen import FrozenEstimator

from sklocus import LocusEmbedder, LocusRouter
from sklocus._files import write_atomically
from sklocus._persistence import load, save
from sklocus._streaming import embed_parquet
from sklocus.cli._common import (
    PARQUET,
    UserError,
    encoding_cache_folder,
    one_line,
    queries_text_column,
    say,
    status,
)
from sklocus.cli._settings import PYTHON_ONLY, parse_settings
from sklocus.cli._tables import (
    MODEL,
    SIZE,
    Evaluations,
    hold_out,
    per_query,
    read_evaluations,
    read_queries,
    read_query_vectors,
    require_columns,
    table_error,
    write_table,
)
from sklocus.encoders import PrecomputedEncoder, SentenceEncoder
from sklocus.nn.training import FALLING_TOLERANCE, FALLING_WINDOW, recent_fall

# Parameters that the command line sets through options of their own, or that
# hold Python objects a command line cannot give.
_NOT_SETTABLE = {
    **PYTHON_ONLY,
    "query_encoder": "--encoder or --query-vectors",
    "device": "--device",
    "random_state": "--random-state",
    "verbose": "--quiet",
}


def run_fit(arguments):
    """Train and save an embedder."""
    parameters = parse_settings(arguments.set, reserved=_NOT_SETTABLE)
    output = Path(arguments.output)
    evaluations = read_evaluations(arguments)
    encoder = read_query_vectors(arguments) or evaluations.encoder
    if encoder is None:
        encoder = SentenceEncoder(
            model=arguments.encoder, device=arguments.device, texts=evaluations.texts
        )
    else:
        _say_if_texts_unused(arguments, encoder)
    embedder = LocusEmbedder(
        query_encoder=encoder,
        device=arguments.device,
        random_state=arguments.random_state,
        verbose=0 if arguments.quiet else 1,
    ).set_params(**parameters)
    # Bad settings fail now, not after the announcement of a long training.
    embedder.check_params()
    evaluations, held = hold_out(arguments, evaluations)
    n_queries = len({query for evaluation in evaluations.sets for query in evaluation})
    said = "" if held is None else f", {len(held.queries)} held out"
    say(
        f"Training on {len(evaluations.sets)} models and {n_queries} queries "
        f"from {evaluations.source}{said}..."
    )
    start = time.perf_counter()
    with run_settings(embedder, arguments):
        embedder.fit(evaluations.sets)
    elapsed = time.perf_counter() - start
    say(training_summary(embedder, elapsed, hint="--set max_epochs={}"))
    if held is not None:
        # Within the run's settings: the held-out queries' encodings join the
        # cache, where route and report find them.
        with run_settings(embedder, arguments):
            router = build_router(embedder, evaluations)
            said = groups_line(router)
            if said is not None:
                say(said)
            say(routing_line(router, held))
    save_file(embedder, output)
    say(f"Saved the embedder to {output} ({output.stat().st_size / 2**20:.1f} MiB).")
    return 0


def training_summary(embedder, elapsed, hint):
    """Say how long training took, spent where, and why it stopped.

    ``hint`` spells the setting of the most epochs on this command, with ``{}``
    for a value (``"--set max_epochs={}"``): what to try when training stopped
    at the cap while the validation loss still fell.
    """
    history = embedder.history_
    epochs = len(history)
    epoch_time = sum(row["dur"] for row in history)
    rest = max(elapsed - embedder.encoding_time_ - epoch_time, 0.0)
    lines = [
        f"Trained in {elapsed:.0f} s: {embedder.encoding_time_:.0f} s encoding the "
        f"queries, {epoch_time:.0f} s in {epochs} epoch{'s' * (epochs != 1)}, "
        f"{rest:.0f} s on the rest."
    ]
    losses = [row.get("valid_loss") for row in history]
    if any(loss is not None for loss in losses):
        best = int(np.nanargmin([np.nan if v is None else v for v in losses]))
        lines.append(
            f"Best validation loss {losses[best]:.4f} at epoch {best + 1} (kept); "
            f"training loss {history[-1]['train_loss']:.4f} at the last."
        )
    else:
        lines.append(f"Training loss {history[-1]['train_loss']:.4f} at the last.")
    lines.append(_stop_sentence(embedder, epochs, hint))
    return "\n".join(lines)


def _stop_sentence(embedder, epochs, hint):
    """Say why training stopped (``embedder.stop_reason_``), and whether more pays.

    More epochs are suggested only when the validation loss still fell clearly
    at the cap (:func:`sklocus.nn.training.still_falling`); otherwise the
    sentence says why the cap was a fine place to stop.
    """
    reason = embedder.stop_reason_
    if reason == "early_stopping":
        patience = embedder.patience
        return (
            f"Stopped early at epoch {epochs}: the validation loss had not improved "
            f"for {patience} epochs (patience={patience})."
        )
    if reason == "callback":
        return f"Stopped at epoch {epochs} by a callback."
    cap = f"Stopped at the epoch cap, {epochs} of {epochs}"
    losses = [row.get("valid_loss") for row in embedder.history_]
    if None in losses:
        return f"{cap}, with no validation loss to tell whether more epochs pay."
    fall = recent_fall(losses)
    if fall is None:
        return f"{cap}."
    window = min(FALLING_WINDOW, epochs - 1)
    over = f"{fall:.2%} an epoch over the last {window}"
    if reason == "max_epochs_improving":
        return (
            f"{cap}, with the validation loss still falling ({over}); "
            f"{hint.format(2 * epochs)} may fit better, at about twice the "
            "training time."
        )
    if min(losses) < losses[-1]:
        return (
            f"{cap}, with the validation loss no longer falling: more epochs "
            "would not pay."
        )
    return (
        f"{cap}, with the validation loss flattening ({over}, under the "
        f"{FALLING_TOLERANCE:.1%} at which more epochs pay): no need for more."
    )


def routing_line(router, held, groups=None, exclude=None):
    """Say the routing accuracy of ``router`` on the held-out queries.

    Every command that measures routing (fit, route, report) says it in these
    words, from :meth:`LocusRouter.score`, which is
    :func:`sklocus.metrics.routing_accuracy` on the routes ``predict`` takes.
    ``exclude`` names models the routes leave out.
    """
    if exclude:
        router = copy.copy(router)
        router.remove_models(exclude)
    query_groups = _groups_of(held.queries, groups)
    scores = held.scores[list(router.classes_)]
    with status(f"Routing the {len(held.queries):,} held-out queries"):
        accuracy = router.score(held.queries, scores, query_groups=query_groups)
    among = "" if not exclude else f" among {len(router.classes_)} models"
    return (
        f"Routing accuracy {accuracy:.1%}{among} on the {len(held.queries):,} "
        f"held-out queries of {held.source}."
    )


def baseline_line(router, held, evaluations, routes, exclude=None):
    """Say what ``routes`` (of the held-out queries) cost and the best model scores.

    The best single model is the one of highest mean score on the pool's other
    evaluations (what one would deploy without a router); its accuracy is on the
    held-out queries, as the routing accuracy is. Costs are the router's.
    """
    names = set(router.classes_) - set(exclude or ())
    means = {
        name: np.mean(list(evaluations.sets[i].values()))
        for i, name in enumerate(evaluations.model_names)
        if name in names and evaluations.sets[i]
    }
    best = max(means, key=means.get)
    accuracy = float(np.nanmean(held.scores[best].to_numpy(dtype=np.float64)))
    line = f"The best single model on the pool, {best}, scores {accuracy:.1%} on them"
    if router.cost_ is None:
        return line + "."
    cost = dict(zip(router.classes_, router.cost_))
    spent = float(np.mean([cost[name] for name in routes]))
    return (
        f"{line} at a cost of {cost[best]:.4g} per query; the routes cost "
        f"{spent:.4g} per query."
    )


def groups_line(router):
    """Say which query groups the router corrects for and why, or None.

    Groups given (``--group-column``) are said with how the others are told;
    clusters, with the held-out losses they were chosen by.
    """
    source, losses = router.group_source_, router.held_out_losses_
    if source == "labels":
        return (
            f"Query groups: the {len(router.groups_)} of the evaluations; a query "
            "routed without a group column takes those its encoding tells."
        )
    if losses is None:
        return None
    if source == "clusters":
        chosen = f"{len(router.groups_)} clusters"
        return (
            f"Query groups: {chosen} of the query encodings, chosen on held-out "
            f"evaluations (log loss {losses[chosen]:.4f}; {losses['none']:.4f} "
            "without groups)."
        )
    return (
        "Query groups: none; no number of clusters of the query encodings beat "
        f"none on held-out evaluations (log loss {losses['none']:.4f})."
    )


def load_file(path):
    """Load the model file at ``path`` (which exists), saying so if it takes long."""
    with status(f"Loading {path}"):
        return load(path)


def save_file(estimator, path):
    """Save ``estimator`` to the model file at ``path``, saying so if it takes long."""
    with status(f"Saving {path}"):
        save(estimator, path)


def load_embedder(path):
    """Load the fitted embedder saved in the model file at ``path``."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such model file")
    return checked_embedder(load_file(path), path)


def checked_embedder(embedder, path):
    """``embedder``, loaded from ``path``, if it is a fitted LocusEmbedder."""
    if not isinstance(embedder, LocusEmbedder):
        raise UserError(
            f"{path} holds a {type(embedder).__name__}; expected a LocusEmbedder "
            "saved by sklocus fit"
        )
    if not hasattr(embedder, "net_"):
        raise UserError(f"{path} holds an embedder that was never fitted")
    return embedder


def _parts(estimator):
    """Return the LocusEmbedders and SentenceEncoders of a router or embedder."""
    found, seen, todo = [], set(), [estimator]
    while todo:
        part = todo.pop()
        if part is None or id(part) in seen:
            continue
        seen.add(id(part))
        if isinstance(part, LocusEmbedder | SentenceEncoder):
            found.append(part)
        # A router's embedders, a FrozenEstimator's estimator, an embedder's
        # query encoders.
        for name in ("embedder", "embedder_", "estimator"):
            todo.append(getattr(part, name, None))
        if isinstance(part, LocusEmbedder):
            todo.extend([part.query_encoder, getattr(part, "query_encoder_", None)])
    return found


@contextlib.contextmanager
def run_settings(estimator, arguments):
    """Let the estimator report progress and use the encoding cache meanwhile.

    Its sentence encoders report how many texts came from the cache and how
    the encoding of the others advances, and keep their encodings in the
    folder of :func:`~sklocus.cli._common.encoding_cache_folder`; its
    embedders report long embeddings and refinements (``verbose=1``, unless
    ``--quiet``). These are this run's and this machine's settings: each is
    put back as it was afterwards (also on an encoder that fitting created),
    so no model file carries them.
    """
    folder = encoding_cache_folder(arguments)
    quiet = getattr(arguments, "quiet", False)

    def wanted(part):
        if isinstance(part, SentenceEncoder):
            return {"cache_dir": folder, "show_progress": True}
        return {} if quiet else {"verbose": 1}

    parts = _parts(estimator)
    before = {
        id(part): {name: getattr(part, name) for name in wanted(part)} for part in parts
    }
    for part in parts:
        part.set_params(**wanted(part))
    try:
        yield
    finally:
        # A part created meanwhile (fit's encoder, when given by name) takes
        # what the first part of its kind had.
        first_of_kind = {}
        for part in reversed(parts):
            first_of_kind[isinstance(part, SentenceEncoder)] = before[id(part)]
        for part in _parts(estimator):
            kind = isinstance(part, SentenceEncoder)
            part.set_params(**before.get(id(part), first_of_kind.get(kind, {})))


def teach_queries(embedder, arguments, evaluations):
    """Let the embedder's encoder encode the queries that came with the input.

    Vectors from ``--query-vectors`` or from a data folder join those of a
    precomputed encoder (new ones win); texts join a sentence encoder's.
    """
    lookup = read_query_vectors(arguments) or evaluations.encoder
    encoder = embedder.query_encoder_
    _say_if_texts_unused(arguments, lookup or encoder)
    if isinstance(lookup, PrecomputedEncoder):
        vectors = np.asarray(lookup.vectors)
        if vectors.shape[1] != embedder.query_dim_:
            source = arguments.query_vectors or evaluations.source
            raise UserError(
                f"{source}: query vectors have {vectors.shape[1]} dimensions but the "
                f"model was trained on {embedder.query_dim_}-dimensional ones"
            )
        if isinstance(encoder, PrecomputedEncoder):
            new = set(lookup.queries)
            kept = [i for i, q in enumerate(encoder.queries) if q not in new]
            lookup = PrecomputedEncoder(
                [encoder.queries[i] for i in kept] + list(lookup.queries),
                np.vstack([np.asarray(encoder.vectors)[kept], vectors]),
            )
        embedder.query_encoder_ = lookup.fit()
    elif isinstance(encoder, SentenceEncoder) and evaluations.texts:
        encoder.set_params(texts={**(encoder.texts or {}), **evaluations.texts})


def _say_if_texts_unused(arguments, encoder):
    """Say so when ``--text-column`` gives texts that no encoder will read."""
    column = getattr(arguments, "text_column", None)
    if column is not None and isinstance(encoder, PrecomputedEncoder):
        say(
            f"--text-column: the queries are looked up by id in precomputed vectors, "
            f"so the texts of column {column!r} are not used."
        )


def run_embed(arguments):
    """Embed every model of a table."""
    if arguments.stream:
        return run_embed_streaming(arguments)
    embedder = load_embedder(arguments.model)
    evaluations = read_evaluations(arguments, cost_column=arguments.cost_column)
    teach_queries(embedder, arguments, evaluations)
    with run_settings(embedder, arguments):
        Z = embedder.transform(evaluations.sets)
    frame = pd.DataFrame(
        {
            MODEL: evaluations.model_names,
            SIZE: [len(evaluation) for evaluation in evaluations.sets],
        }
    )
    if evaluations.costs is not None:
        frame[arguments.cost_column] = evaluations.costs.loc[
            evaluations.model_names
        ].to_numpy()
    vectors = pd.DataFrame(Z, columns=[f"z{i}" for i in range(Z.shape[1])])
    frame = pd.concat([frame, vectors], axis=1)
    write_table(frame, arguments.output)
    say(
        f"Embedded {len(frame)} models in {Z.shape[1]} dimensions to "
        f"{arguments.output}."
    )
    return 0


def build_router(
    embedder,
    evaluations,
    cost_weight=0.0,
    groups=None,
    min_probability=None,
    budget=None,
    calibration=None,
):
    """Build a router over the pool of ``evaluations`` with a trained embedder.

    ``groups`` maps a query of the pool to its group (``LocusRouter``'s
    ``query_groups``); a query it lacks has none. ``calibration`` is the
    router's ``calibration``.
    """
    router = LocusRouter(
        FrozenEstimator(embedder),
        cost_weight=cost_weight,
        min_probability=min_probability,
        budget=budget,
        calibration=calibration,
    )
    with status(f"Fitting the router on the {len(evaluations.sets)} models"):
        return router.fit_evaluations(
            evaluations.sets,
            evaluations.model_names,
            cost=evaluations.costs,
            query_groups=groups,
        )


def run_embed_streaming(arguments):
    """Embed a Parquet dataset batch by batch (``embed --stream``)."""
    for option, given in (
        ("--cost-column", arguments.cost_column),
        ("--text-column", arguments.text_column),
    ):
        if given is not None:
            raise UserError(f"{option} does not go with --stream")
    source = Path(arguments.evals)
    if not source.exists():
        raise UserError(f"{source}: no such file or folder")
    if source.is_file() and not source.name.lower().endswith(PARQUET):
        raise UserError(
            f"{source}: --stream reads Parquet; expected a .parquet or .pq file or "
            "a folder of them"
        )
    output = arguments.output
    if not output.lower().endswith(PARQUET):
        raise UserError(f"{output}: --stream writes Parquet; expected a .parquet file")
    try:
        names = ds.dataset(source, format="parquet", partitioning="hive").schema.names
    except (OSError, ValueError) as error:
        message = one_line(error)
        raise UserError(f"{source}: cannot be read as Parquet: {message}") from None
    columns = {
        "--model-column": arguments.model_column,
        "--query-column": arguments.query_column,
        "--score-column": arguments.score_column,
    }
    require_columns(pd.DataFrame(columns=names), columns, source)
    embedder = load_embedder(arguments.model)
    teach_queries(embedder, arguments, Evaluations([], [], source))
    embed = partial(
        embed_parquet,
        embedder,
        source,
        model=arguments.model_column,
        query=arguments.query_column,
        score=arguments.score_column,
        duplicates=arguments.duplicates,
        batch_models=arguments.batch_models,
    )
    try:
        with run_settings(embedder, arguments):
            n_models = write_atomically(output, embed)
    except (KeyError, ValueError, TypeError, OSError) as error:
        raise table_error(source, error) from None
    say(
        f"Embedded {n_models} models in {embedder.embedding_dim} dimensions to "
        f"{output}, {arguments.batch_models} at a time."
    )
    return 0


def run_route(arguments):
    """Route each query to a model of the pool."""
    policy = any(
        setting is not None
        for setting in (
            arguments.cost_weight,
            arguments.min_probability,
            arguments.budget,
        )
    )
    if (arguments.cost_column is None) == policy:
        raise UserError(
            "--cost-column goes with --cost-weight, --min-probability or --budget: "
            "the costs, and how to route by them"
        )
    embedder = load_embedder(arguments.model)
    evaluations = read_evaluations(arguments, cost_column=arguments.cost_column)
    teach_queries(embedder, arguments, evaluations)
    evaluations, held = hold_out(arguments, evaluations)
    pool_groups = None
    if arguments.group_column is not None:
        pool_groups = per_query(
            evaluations, arguments.query_column, arguments.group_column
        )
    ids, queries, query_groups = _queries_to_route(arguments, held, pool_groups)
    with run_settings(embedder, arguments):
        router = build_router(
            embedder,
            evaluations,
            arguments.cost_weight or 0.0,
            pool_groups,
            arguments.min_probability,
            arguments.budget,
            arguments.calibration,
        )
        if pool_groups is not None:
            _say_if_no_group_is_known(router, query_groups, arguments)
        with status(f"Routing {len(queries):,} queries"):
            models, probabilities = router.rank_models(
                queries,
                k=arguments.k,
                exclude=arguments.exclude or None,
                query_groups=query_groups,
            )
        measured = None
        if held is not None:
            measured = routing_line(router, held, pool_groups, arguments.exclude)
            routes = models[:, 0]
            if arguments.queries is not None:  # routed QUERIES, not the held-out
                routes = router.predict(
                    held.queries,
                    exclude=arguments.exclude or None,
                    query_groups=_groups_of(held.queries, pool_groups),
                )
            measured += "\n" + baseline_line(
                router, held, evaluations, routes, arguments.exclude
            )
    frame = pd.DataFrame({"query": ids, "model": models[:, 0]})
    for rank in range(models.shape[1]):
        frame[f"model_{rank + 1}"] = models[:, rank]
        frame[f"p_{rank + 1}"] = probabilities[:, rank]
    write_table(frame, arguments.output)
    say(
        f"Routed {len(frame)} queries among {len(router.classes_)} models to "
        f"{arguments.output}."
    )
    said = groups_line(router)
    if said is not None:
        say(said)
    if measured is not None:
        say(measured)
    return 0


def _queries_to_route(arguments, held, pool_groups):
    """``(ids, queries, groups)`` of QUERIES, or of the held-out queries without it.

    A held-out query is routed by its id: the embedder's encoder has its text or
    vector from EVALS.
    """
    if arguments.queries is not None:
        text_column, text_option = queries_text_column(arguments)
        return read_queries(
            arguments.queries,
            arguments.query_column,
            text_column,
            arguments.group_column,
            text_option,
        )
    if held is None:
        raise UserError(
            "QUERIES is missing: give the queries to route, or hold some out with "
            "--test-queries or --test-split and route those"
        )
    if arguments.queries_text_column is not None:
        raise UserError(
            "argument --queries-text-column: there is no QUERIES table; the "
            "held-out queries' texts come from EVALS"
        )
    groups = _groups_of(held.queries, pool_groups)
    return list(held.queries), list(held.queries), groups


def _groups_of(queries, groups):
    """Each query's group in ``groups`` (a mapping; None where it has none), or None."""
    return None if groups is None else [groups.get(query) for query in queries]


def _say_if_no_group_is_known(router, query_groups, arguments):
    """Say so when no query of QUERIES has a group the router corrects for.

    The routes are then those without ``--group-column``, which the user would
    otherwise not know.
    """
    known = {str(group) for group in router.groups_}
    given = [group for group in query_groups if group is not None and group == group]
    if any(str(group) in known for group in given):
        return
    found = f"such as {given[0]!r}" if given else "none"
    say(
        f"--group-column: no query of {arguments.queries} has a group of column "
        f"{arguments.group_column!r} that EVALS has (QUERIES has {found}; EVALS has "
        f"{len(known)}, such as {sorted(known)[0]!r}); routed without group "
        "corrections."
    )
