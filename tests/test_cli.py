"""The sklocus command, driven as a user drives it: in a subprocess, on files."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from sklearn.frozen import FrozenEstimator
from skorch.history import History
from vectors import assert_same_vectors

from sklocus import LocusRouter, ScoreEstimator, _progress
from sklocus import load as load_model_file
from sklocus import save as sklocus_save
from sklocus.cli import main
from sklocus.cli._models import training_summary
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix
from sklocus.nn import training
from sklocus.nn.training import stop_reason

# Most tests drive the command in fresh processes around a trained model file.
pytestmark = pytest.mark.slow

# A small network, so that fit takes seconds.
TINY = ["--set", "embedding_dim=16", "--set", "n_latents=4", "--set", "max_epochs=1"]
TINY += ["--set", "epoch_size=128", "--random-state", "0", "--quiet"]


def sklocus(*argv, cwd):
    """Run the installed command line in a fresh process."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "sklocus", *map(str, argv)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
    )


def in_process(*argv, cwd, capsys):
    """Run main in this process, as the command line would (the quicker way)."""
    before = os.getcwd()
    os.chdir(cwd)
    try:
        status = main([str(a) for a in argv])
    except SystemExit as stop:
        status = stop.code
    finally:
        os.chdir(before)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, status, captured.out, captured.err)


def succeeded(run):
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    return run


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A long table from make_evaluations, its query vectors, a trained model file
    and an embedding table, made as a user makes them."""
    folder = tmp_path_factory.mktemp("cli")
    data = make_evaluations(n_models=30, n_queries=150, query_dim=16, random_state=0)
    rows = [
        (name, query, score, data.params_b[i])
        for i, (name, evaluations) in enumerate(
            zip(data.model_names, data.evaluation_sets)
        )
        for query, score in evaluations.items()
    ]
    table = pd.DataFrame(rows, columns=["model", "query", "score", "params"])
    table.to_csv(folder / "evals.csv", index=False)
    np.save(folder / "vectors.npy", data.query_vectors)
    (folder / "ids.txt").write_text("\n".join(data.query_ids) + "\n")
    pd.DataFrame({"query": data.query_ids[:25]}).to_csv(
        folder / "queries.csv", index=False
    )
    vectors = ["--query-vectors", "vectors.npy", "--query-ids", "ids.txt"]
    fit = succeeded(
        sklocus("fit", "evals.csv", "-o", "model.sklocus", *vectors, *TINY, cwd=folder)
    )
    embed = succeeded(
        sklocus(
            "embed",
            "model.sklocus",
            "evals.csv",
            "-o",
            "emb.parquet",
            "--cost-column",
            "params",
            cwd=folder,
        )
    )
    return folder, data, fit, embed


def test_fit_saves_a_model_file_and_summarises_training(workspace):
    folder, _, fit, _ = workspace
    assert (folder / "model.sklocus").is_file()
    assert "Training on 30 models and 150 queries" in fit.stderr
    assert "Trained in" in fit.stderr and "s in 1 epoch" in fit.stderr
    assert "s encoding the queries" in fit.stderr
    assert "Stopped at the epoch cap, 1 of 1." in fit.stderr
    assert "Saved the embedder to model.sklocus" in fit.stderr
    embedder = load_model_file(folder / "model.sklocus")
    assert embedder.embedding_dim == 16 and embedder.n_latents == 4


def _capped_fit(valid_losses):
    """What training_summary reads of an embedder stopped at its epoch cap."""
    history = History(
        [
            {"epoch": i + 1, "train_loss": 0.7, "valid_loss": loss, "dur": 1.0}
            for i, loss in enumerate(valid_losses)
        ]
    )
    best = int(np.argmin(valid_losses))
    early = SimpleNamespace(misses_=len(valid_losses) - 1 - best, patience=5)
    net = SimpleNamespace(
        history=history,
        max_epochs=len(valid_losses),
        callbacks_=[("early_stopping", early)],
    )
    return SimpleNamespace(
        history_=history,
        encoding_time_=0.0,
        patience=5,
        stop_reason_=stop_reason(net),
    )


def test_fit_asks_for_more_epochs_only_while_the_loss_falls_clearly():
    # Flattened: each epoch the best, but by 0.07%; no "more epochs" hint.
    flat = training_summary(
        _capped_fit([0.690, 0.600, 0.5900, 0.5895, 0.5890, 0.5887]),
        10.0,
        hint="--set max_epochs={}",
    )
    assert (
        "Stopped at the epoch cap, 6 of 6, with the validation loss flattening" in flat
    )
    assert "0.07% an epoch over the last 3, under the 0.3%" in flat
    assert "max_epochs=" not in flat
    turned = training_summary(
        _capped_fit([0.690, 0.600, 0.580, 0.590]), 10.0, hint="--set max_epochs={}"
    )
    assert "no longer falling" in turned and "max_epochs=" not in turned
    falling = training_summary(
        _capped_fit([0.690, 0.660, 0.630, 0.610, 0.590]),
        10.0,
        hint="--set max_epochs={}",
    )
    assert "with the validation loss still falling (3.95% an epoch" in falling
    assert "--set max_epochs=10 may fit better" in falling


def test_fit_shows_each_epoch_and_says_why_it_stopped(workspace, capsys, monkeypatch):
    folder, _, _, _ = workspace
    monkeypatch.setattr(_progress, "on_terminal", lambda: True)
    monkeypatch.setattr(training, "_EPOCH_DELAY", 0.0)
    vectors = ["--query-vectors", "vectors.npy", "--query-ids", "ids.txt"]
    settings = ["--set", "embedding_dim=16", "--set", "n_latents=4"]
    settings += ["--set", "epoch_size=128", "--random-state", "0"]
    fit = in_process(
        "fit", "evals.csv", "-o", "three.sklocus", *vectors, *settings,
        "--set", "max_epochs=3", cwd=folder, capsys=capsys,
    )  # fmt: skip
    succeeded(fit)
    assert "\rEpoch 1 of 3: 0/" in fit.stderr and "\rEpoch 3 of 3: " in fit.stderr
    stopped = [line for line in fit.stderr.splitlines() if "Stopped" in line]
    assert len(stopped) == 1
    hinted = "--set max_epochs=6 may fit better" in stopped[0]
    assert hinted == ("still falling" in stopped[0])
    assert stopped[0].startswith("Stopped at the epoch cap, 3 of 3, with the valid")


def test_embed_writes_one_row_per_model(workspace):
    folder, data, *_ = workspace
    frame = pd.read_parquet(folder / "emb.parquet")
    assert list(frame.columns[:3]) == ["model", "n_evaluations", "params"]
    assert list(frame.columns[3:]) == [f"z{i}" for i in range(16)]
    assert frame["model"].tolist() == data.model_names
    assert frame["n_evaluations"].tolist() == [len(s) for s in data.evaluation_sets]
    np.testing.assert_allclose(frame["params"], data.params_b)
    embedder = load_model_file(folder / "model.sklocus")
    np.testing.assert_allclose(
        frame[[f"z{i}" for i in range(16)]].to_numpy(),
        embedder.transform(data.evaluation_sets),
        rtol=1e-5,
        atol=1e-6,
    )


def test_route_writes_the_choice_and_the_k_best(workspace):
    folder, data, *_ = workspace
    run = succeeded(
        sklocus(
            "route",
            "model.sklocus",
            "evals.csv",
            "queries.csv",
            "-o",
            "routes.csv",
            "-k",
            "4",
            "--exclude",
            data.model_names[0],
            "--cost-column",
            "params",
            "--cost-weight",
            "0.2",
            cwd=folder,
        )
    )
    assert "Routed 25 queries among 30 models" in run.stderr
    routes = pd.read_csv(folder / "routes.csv")
    assert routes.columns.tolist() == ["query", "model"] + [
        f"{kind}_{k}" for k in range(1, 5) for kind in ("model", "p")
    ]
    assert routes["query"].tolist() == data.query_ids[:25]
    assert (routes["model"] == routes["model_1"]).all()
    listed = routes[[f"model_{k}" for k in range(1, 5)]].to_numpy()
    assert data.model_names[0] not in listed
    assert all(len(set(row)) == 4 for row in listed)
    p = routes[[f"p_{k}" for k in range(1, 5)]].to_numpy()
    assert ((p > 0) & (p < 1)).all()


def test_suggest_writes_what_the_library_suggests(workspace, capsys):
    """The new model's rows of EVALS are its results so far: never suggested
    again, and it is no reference model."""
    folder, data, *_ = workspace
    table = pd.read_csv(folder / "evals.csv", dtype={"model": str, "query": str})
    new = data.model_names[-1]
    so_far = table[table.model == new].head(10)
    pd.concat([table[table.model != new], so_far]).to_csv(
        folder / "partial.csv", index=False
    )
    candidates = pd.DataFrame(
        {"query": data.query_ids, "benchmark": data.benchmarks.astype(str)}
    )
    candidates.to_csv(folder / "candidates.csv", index=False)
    arguments = ["model.sklocus", "partial.csv", "candidates.csv", "-o", "next.csv"]
    arguments += ["--new-model", new, "--n-queries", "6", "--group-column", "benchmark"]
    run = succeeded(
        in_process(
            "suggest", *arguments, "--random-state", "0", cwd=folder, capsys=capsys
        )
    )
    assert "Suggested 6 of 150 queries" in run.stderr
    assert "10 evaluated so far, 29 reference models" in run.stderr
    chosen = pd.read_csv(folder / "next.csv", dtype={"query": str, "group": str})
    assert chosen.columns.tolist() == ["query", "order", "group"]
    assert chosen.order.tolist() == list(range(1, 7))
    assert not set(chosen["query"]) & set(so_far["query"])
    embedder = load_model_file(folder / "model.sklocus")
    estimator = ScoreEstimator(embedder, random_state=0).fit(data.evaluation_sets[:-1])
    expected = estimator.suggest_queries(
        dict(zip(so_far["query"], so_far["score"])),
        data.query_ids,
        6,
        query_groups=data.benchmarks.astype(str),
    )
    assert chosen["query"].tolist() == expected
    benchmark_of = dict(zip(data.query_ids, data.benchmarks.astype(str)))
    assert chosen["group"].tolist() == [benchmark_of[q] for q in expected]

    stranger = succeeded(
        in_process(
            "suggest",
            *arguments[:5],
            "--new-model",
            "nobody",
            "--n-queries",
            "2",
            cwd=folder,
            capsys=capsys,
        )
    )
    assert "'nobody' has no rows in partial.csv" in stranger.stderr
    assert "0 evaluated so far, 30 reference models" in stranger.stderr

    exhausted = in_process(
        "suggest", *arguments[:-4], "--n-queries", "141", cwd=folder, capsys=capsys
    )
    assert exhausted.returncode == 2
    assert "only 140 of the 150 candidates" in exhausted.stderr


def test_estimate_writes_what_the_library_estimates(workspace, capsys):
    folder, data, *_ = workspace
    table = pd.read_csv(folder / "evals.csv", dtype={"model": str, "query": str})
    new = data.model_names[-1]
    so_far = table[table.model == new].head(20)
    pd.concat([table[table.model != new], so_far]).to_csv(
        folder / "first20.csv", index=False
    )
    groups = data.benchmarks.astype(str)
    pd.DataFrame({"query": data.query_ids, "benchmark": groups}).to_csv(
        folder / "benchmark.csv", index=False
    )
    run = succeeded(
        in_process(
            "estimate",
            "model.sklocus",
            "first20.csv",
            "benchmark.csv",
            "-o",
            "estimates.csv",
            "--new-model",
            new,
            "--new-model",
            "nobody",
            "--group-column",
            "benchmark",
            "--random-state",
            "0",
            cwd=folder,
            capsys=capsys,
        )
    )
    assert "'nobody' has no rows in first20.csv" in run.stderr
    assert "Estimated 2 model(s) on 5 group(s) from 29 reference models" in run.stderr
    written = pd.read_csv(folder / "estimates.csv", dtype={"model": str, "group": str})
    embedder = load_model_file(folder / "model.sklocus")
    estimator = ScoreEstimator(embedder, random_state=0).fit(data.evaluation_sets[:-1])
    expected = estimator.estimate_scores(
        [dict(zip(so_far["query"], so_far["score"])), {}],
        data.query_ids,
        groups,
        model_names=[new, "nobody"],
    )
    assert written.columns.tolist() == expected.columns.tolist()
    assert written.model.tolist() == expected.model.tolist()
    assert written.group.tolist() == expected.group.tolist()
    np.testing.assert_allclose(
        written[["estimate", "std", "lower", "upper"]].to_numpy(),
        expected[["estimate", "std", "lower", "upper"]].to_numpy(),
        rtol=1e-6,
    )
    assert written.n_evaluated.sum() == 20


def test_estimate_and_suggest_read_full_scores(workspace, capsys):
    folder, data, *_ = workspace
    groups = data.benchmarks.astype(str)
    pd.DataFrame({"query": data.query_ids, "benchmark": groups}).to_csv(
        folder / "benchmark.csv", index=False
    )
    board = pd.DataFrame(
        {
            g: 20 + 70 * data.probabilities[groups == g].mean(axis=0)
            for g in sorted(set(groups))
        }
    )
    board.insert(0, "model", data.model_names)
    # The new model has no row (its score is what is asked), a stranger has one.
    stranger = pd.DataFrame([["gpt-9", *board.iloc[0, 1:]]], columns=board.columns)
    pd.concat([board.iloc[:-1], stranger]).to_csv(folder / "board.csv", index=False)
    new = data.model_names[-1]
    common = ["--group-column", "benchmark", "--scores", "board.csv"]
    run = succeeded(
        in_process(
            "estimate",
            "model.sklocus",
            "evals.csv",
            "benchmark.csv",
            "-o",
            "full.csv",
            "--new-model",
            new,
            *common,
            "--random-state",
            "0",
            cwd=folder,
            capsys=capsys,
        )
    )
    assert "Full scores of 29 of the 29 reference models from board.csv" in run.stderr
    written = pd.read_csv(folder / "full.csv", dtype={"model": str, "group": str})
    assert set(written["target"]) == {"full score"}
    embedder = load_model_file(folder / "model.sklocus")
    estimator = ScoreEstimator(embedder, random_state=0).fit(
        data.evaluation_sets[:-1], board.iloc[:-1, 1:].reset_index(drop=True)
    )
    expected = estimator.estimate_scores(
        [data.evaluation_sets[-1]], data.query_ids, groups, model_names=[new]
    )
    np.testing.assert_allclose(
        written[["estimate", "std", "lower", "upper"]].to_numpy(),
        expected[["estimate", "std", "lower", "upper"]].to_numpy(),
        rtol=1e-6,
    )
    succeeded(
        in_process(
            "suggest",
            "model.sklocus",
            "evals.csv",
            "benchmark.csv",
            "-o",
            "anchors.csv",
            "--new-model",
            "fresh",
            "--n-queries",
            "12",
            *common,
            "--strategy",
            "anchors",
            "--random-state",
            "0",
            cwd=folder,
            capsys=capsys,
        )
    )
    unknown = board.iloc[:, 1:].copy()
    unknown.iloc[-1] = np.nan  # the new model of estimate: no row in board.csv
    estimator = ScoreEstimator(embedder, random_state=0).fit(
        data.evaluation_sets, unknown
    )
    picks = estimator.suggest_queries(
        {}, data.query_ids, 12, query_groups=groups, strategy="anchors"
    )
    assert pd.read_csv(folder / "anchors.csv")["query"].tolist() == picks
    board["arc"] = "high"
    board.to_csv(folder / "words.csv", index=False)
    run = in_process(
        "estimate",
        "model.sklocus",
        "evals.csv",
        "benchmark.csv",
        "-o",
        "x.csv",
        "--new-model",
        new,
        "--group-column",
        "benchmark",
        "--scores",
        "words.csv",
        cwd=folder,
        capsys=capsys,
    )
    assert run.returncode == 2 and "column 'arc' must hold numbers" in run.stderr


def test_feedback_folds_outcomes_as_partial_fit_does(workspace, capsys):
    folder, data, *_ = workspace
    embedder = load_model_file(folder / "model.sklocus")
    scores, queries = to_matrix(data.evaluation_sets[:10])
    Y = pd.DataFrame(scores, columns=data.model_names[:10])
    router = LocusRouter(FrozenEstimator(embedder), refine_steps=5).fit(queries, Y)
    sklocus_save(router, folder / "router.sklocus")
    # Two outcomes of one query and model: both count.
    rows = [(data.model_names[1], data.query_ids[0], 1.0)] * 2 + [
        (data.model_names[3], query, 0.0) for query in data.query_ids[100:110]
    ]
    pd.DataFrame(rows, columns=["model", "query", "score"]).to_csv(
        folder / "outcomes.csv", index=False
    )
    run = succeeded(
        in_process(
            "feedback",
            "router.sklocus",
            "outcomes.csv",
            "-o",
            "learnt.sklocus",
            cwd=folder,
            capsys=capsys,
        )
    )
    assert "Folded 12 outcomes of 2 models into learnt.sklocus" in run.stderr
    learnt = load_model_file(folder / "learnt.sklocus")
    router.partial_fit(
        data.query_ids[:1], pd.DataFrame({data.model_names[1]: [1.0]})
    ).partial_fit(data.query_ids[:1], pd.DataFrame({data.model_names[1]: [1.0]}))
    router.partial_fit(
        data.query_ids[100:110], pd.DataFrame({data.model_names[3]: [0.0] * 10})
    )
    np.testing.assert_allclose(learnt.embeddings_, router.embeddings_, atol=1e-6)
    pd.testing.assert_frame_equal(learnt.evaluations(), router.evaluations())
    pd.DataFrame(
        [(data.model_names[1], "q00001", 1.0), ("gpt-9", "q00001", 1.0)],
        columns=["model", "query", "score"],
    ).to_csv(folder / "stranger.csv", index=False)
    pd.DataFrame(
        [(data.model_names[1], "q00001", 2.0)], columns=["model", "query", "score"]
    ).to_csv(folder / "too_high.csv", index=False)
    for table, message in [
        ("stranger.csv", "line 3 is an outcome of model 'gpt-9', which the router"),
        ("too_high.csv", "line 2 has score 2.0 in column 'score'"),
    ]:
        run = in_process("feedback", "router.sklocus", table, cwd=folder, capsys=capsys)
        assert run.returncode == 2 and message in run.stderr, run.stderr
    assert load_model_file(folder / "router.sklocus").evaluation_counts_.sum() == (
        sum(len(s) for s in data.evaluation_sets[:10])
    )


def test_suggest_offers_every_strategy_of_the_library():
    from sklocus._score_estimation import STRATEGIES
    from sklocus.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    (strategy,) = [a for a in commands["suggest"]._actions if a.dest == "strategy"]
    assert tuple(strategy.choices) == STRATEGIES


def test_route_with_a_threshold_picks_what_the_library_picks(workspace, capsys):
    folder, data, *_ = workspace
    succeeded(
        in_process(
            "route",
            "model.sklocus",
            "evals.csv",
            "queries.csv",
            "-o",
            "cheap.csv",
            "--cost-column",
            "params",
            "--min-probability",
            "0.6",
            cwd=folder,
            capsys=capsys,
        )
    )
    routes = pd.read_csv(folder / "cheap.csv")
    embedder = load_model_file(folder / "model.sklocus")
    router = LocusRouter(FrozenEstimator(embedder), min_probability=0.6)
    router.fit_evaluations(data.evaluation_sets, data.model_names, cost=data.params_b)
    expected = router.predict(data.query_ids[:25])
    assert routes["model"].tolist() == expected.tolist()
    assert (
        routes["model"].tolist()
        != router.predict(data.query_ids[:25], cost_weight=0.0).tolist()
    )


def test_route_within_a_budget_picks_what_the_library_picks(workspace, capsys):
    folder, data, *_ = workspace
    budget = float(np.median(data.params_b))
    succeeded(
        in_process(
            "route",
            "model.sklocus",
            "evals.csv",
            "queries.csv",
            "-o",
            "budget.csv",
            "--cost-column",
            "params",
            "--budget",
            str(budget),
            cwd=folder,
            capsys=capsys,
        )
    )
    routes = pd.read_csv(folder / "budget.csv")
    embedder = load_model_file(folder / "model.sklocus")
    router = LocusRouter(FrozenEstimator(embedder), budget=budget)
    router.fit_evaluations(data.evaluation_sets, data.model_names, cost=data.params_b)
    assert routes["model"].tolist() == router.predict(data.query_ids[:25]).tolist()


def test_route_with_calibrated_probabilities(workspace, capsys):
    folder, data, *_ = workspace
    succeeded(
        in_process(
            "route",
            "model.sklocus",
            "evals.csv",
            "queries.csv",
            "-o",
            "calibrated.csv",
            "-k",
            "2",
            "--calibration",
            "sigmoid",
            cwd=folder,
            capsys=capsys,
        )
    )
    routes = pd.read_csv(folder / "calibrated.csv")
    embedder = load_model_file(folder / "model.sklocus")
    router = LocusRouter(FrozenEstimator(embedder), calibration="sigmoid")
    router.fit_evaluations(data.evaluation_sets, data.model_names)
    models, probabilities = router.rank_models(data.query_ids[:25], k=2)
    assert routes["model"].tolist() == models[:, 0].tolist()
    np.testing.assert_allclose(routes["p_1"], probabilities[:, 0], rtol=1e-5)


def test_route_reads_a_text_file_of_queries(workspace, capsys):
    folder, data, *_ = workspace
    (folder / "few.txt").write_text("\n".join(data.query_ids[5:8]) + "\n")
    succeeded(
        in_process(
            "route",
            "model.sklocus",
            "evals.csv",
            "few.txt",
            "-o",
            "few.parquet",
            "-k",
            "1",
            cwd=folder,
            capsys=capsys,
        )
    )
    routes = pd.read_parquet(folder / "few.parquet")
    assert routes["query"].tolist() == data.query_ids[5:8]
    assert set(routes["model"]) <= set(data.model_names)


def test_route_with_a_group_column_corrects_per_group(workspace, capsys):
    folder, data, *_ = workspace
    benchmark = {q: f"b{g}" for q, g in zip(data.query_ids, data.benchmarks)}
    table = pd.read_csv(folder / "evals.csv")
    table["benchmark"] = table["query"].map(benchmark)
    table.to_csv(folder / "grouped.csv", index=False)
    queries = data.query_ids[:25]
    pd.DataFrame(
        {"query": queries, "benchmark": [benchmark[q] for q in queries]}
    ).to_csv(folder / "grouped_queries.csv", index=False)
    succeeded(
        in_process(
            "route",
            "model.sklocus",
            "grouped.csv",
            "grouped_queries.csv",
            "-o",
            "grouped_routes.csv",
            "--group-column",
            "benchmark",
            "-k",
            "2",
            cwd=folder,
            capsys=capsys,
        )
    )
    routes = pd.read_csv(folder / "grouped_routes.csv")
    embedder = load_model_file(folder / "model.sklocus")
    scores, pool_queries = to_matrix(data.evaluation_sets)
    router = LocusRouter(FrozenEstimator(embedder)).fit(
        pool_queries,
        pd.DataFrame(scores, columns=data.model_names),
        query_groups=[benchmark[q] for q in pool_queries],
    )
    models, p = router.rank_models(
        queries, k=2, query_groups=[benchmark[q] for q in queries]
    )
    assert routes["model_1"].tolist() == models[:, 0].tolist()
    np.testing.assert_allclose(routes["p_1"], p[:, 0], rtol=1e-5)
    # A text file of queries has no column to read groups from.
    (folder / "plain.txt").write_text("\n".join(queries) + "\n")
    error = one_line_error(
        [
            "route",
            "model.sklocus",
            "grouped.csv",
            "plain.txt",
            "-o",
            "x.csv",
            "--group-column",
            "benchmark",
        ],
        folder,
        capsys,
    )
    assert "a text file has no columns; leave out --group-column" in error


def test_neighbors_duplicates_clusters_on_the_embeddings(workspace):
    folder, data, *_ = workspace
    copy = int(np.flatnonzero(data.duplicate_of >= 0)[0])
    name = data.model_names[copy]
    run = succeeded(
        sklocus("neighbors", "emb.parquet", "-k", "3", "--model", name, cwd=folder)
    )
    from io import StringIO

    neighbours = pd.read_csv(StringIO(run.stdout))
    assert neighbours.columns.tolist() == ["model", "rank", "neighbor", "distance"]
    assert neighbours["rank"].tolist() == [1, 2, 3]
    assert neighbours["distance"].is_monotonic_increasing
    assert name not in set(neighbours["neighbor"])

    succeeded(
        sklocus(
            "duplicates",
            "emb.parquet",
            "--threshold",
            "0.05",
            "-o",
            "pairs.csv",
            cwd=folder,
        )
    )
    pairs = pd.read_csv(folder / "pairs.csv")
    assert pairs.columns.tolist() == ["first", "second", "distance"]
    assert (pairs["distance"] < 0.05).all()

    succeeded(
        sklocus(
            "clusters",
            "emb.parquet",
            "--n-clusters",
            "4",
            "-o",
            "clusters.csv",
            cwd=folder,
        )
    )
    clusters = pd.read_csv(folder / "clusters.csv")
    assert clusters["model"].tolist() == data.model_names
    assert sorted(clusters["cluster"].unique()) == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "options, count, fresh",
    [
        (["--n-selected", "5"], 5, True),
        (["--method", "k-medoids", "--n-selected", "3"], 3, False),
        (["--method", "coverage", "--max-total-cost", "4"], 4, False),
    ],
)
def test_select_writes_the_portfolio(workspace, options, count, fresh, capsys):
    folder, data, *_ = workspace
    argv = ("select", "emb.parquet", *options, "-o", "chosen.csv")
    run = succeeded(
        sklocus(*argv, cwd=folder)
        if fresh
        else in_process(*argv, cwd=folder, capsys=capsys)
    )
    chosen = pd.read_csv(folder / "chosen.csv")
    assert chosen["rank"].tolist() == list(range(1, count + 1))
    assert set(chosen["model"]) <= set(data.model_names)
    assert chosen["model"].is_unique
    assert f"Chose {count} of 30 models" in run.stderr


def test_select_within_a_max_total_cost(workspace, capsys):
    folder, data, *_ = workspace
    max_total_cost = 3 * float(np.median(data.params_b))
    succeeded(
        in_process(
            "select",
            "emb.parquet",
            "--method",
            "coverage",
            "--max-total-cost",
            max_total_cost,
            "--cost-column",
            "params",
            "-o",
            "chosen.csv",
            cwd=folder,
            capsys=capsys,
        )
    )
    chosen = pd.read_csv(folder / "chosen.csv")
    assert chosen["params"].sum() <= max_total_cost
    cost = dict(zip(data.model_names, data.params_b))
    np.testing.assert_allclose(chosen["params"], [cost[m] for m in chosen["model"]])


def test_a_load_evaluations_folder_with_its_encodings(workspace, tmp_path, capsys):
    _, data, *_ = workspace
    rows = [
        (name, query, score)
        for name, evaluations in zip(data.model_names, data.evaluation_sets)
        for query, score in evaluations.items()
    ]
    responses = pd.DataFrame(rows, columns=["model", "query_id", "score"])
    responses.to_parquet(tmp_path / "responses.parquet")
    queries = pd.DataFrame(
        {"query_id": data.query_ids, "query": [f"text {q}" for q in data.query_ids]}
    )
    queries.to_parquet(tmp_path / "queries.parquet")
    np.save(tmp_path / "encodings_all-MiniLM-L6-v2.npy", data.query_vectors)
    fit = in_process(
        "fit", ".", "-o", "model.sklocus", *TINY, cwd=tmp_path, capsys=capsys
    )
    succeeded(fit)
    embed = ("embed", "model.sklocus", ".", "-o", "emb.csv")
    succeeded(in_process(*embed, cwd=tmp_path, capsys=capsys))
    frame = pd.read_csv(tmp_path / "emb.csv")
    assert frame["model"].tolist() == data.model_names
    assert frame.shape == (30, 2 + 16)


def test_query_texts_are_encoded_and_new_ones_routed(workspace, capsys):
    folder, data, *_ = workspace
    table = pd.read_csv(folder / "evals.csv")
    table["prompt"] = "Question " + table["query"] + ": what is the answer?"
    table.to_csv(folder / "texts.csv", index=False)
    new = pd.DataFrame(
        {"query": ["new-1", "new-2"], "prompt": ["Name a prime.", "What is 2 + 2?"]}
    )
    new.to_csv(folder / "new.csv", index=False)
    succeeded(
        in_process(
            "fit",
            "texts.csv",
            "-o",
            "texts.sklocus",
            "--text-column",
            "prompt",
            *TINY,
            cwd=folder,
            capsys=capsys,
        )
    )
    encoder = load_model_file(folder / "texts.sklocus").query_encoder_
    assert encoder.texts[data.query_ids[0]].startswith("Question q00000")
    succeeded(
        in_process(
            "route",
            "texts.sklocus",
            "texts.csv",
            "new.csv",
            "-o",
            "new_routes.csv",
            "--text-column",
            "prompt",
            "-k",
            "2",
            cwd=folder,
            capsys=capsys,
        )
    )
    routes = pd.read_csv(folder / "new_routes.csv")
    assert routes["query"].tolist() == ["new-1", "new-2"]
    assert set(routes["model_2"]) <= set(data.model_names)


def test_texts_that_no_encoder_reads_are_said_to_be_unused(workspace, capsys):
    folder, data, *_ = workspace
    table = pd.read_csv(folder / "evals.csv")
    table["prompt"] = "Question " + table["query"] + "?"
    table.to_csv(folder / "prompted.csv", index=False)
    # The model file looks queries up in its precomputed vectors.
    embed = ("embed", "model.sklocus", "prompted.csv", "-o", "prompted_emb.csv")
    run = in_process(*embed, "--text-column", "prompt", cwd=folder, capsys=capsys)
    succeeded(run)
    assert "--text-column: the queries are looked up by id" in run.stderr
    assert "texts of column 'prompt' are not used" in run.stderr


def test_encoding_cache_keeps_text_encodings_for_later_runs(
    workspace, capsys, monkeypatch
):
    import sqlite3

    from sentence_transformers import SentenceTransformer

    folder, data, *_ = workspace
    table = pd.read_csv(folder / "evals.csv")
    table["prompt"] = "Cached question " + table["query"] + "?"
    table.to_csv(folder / "cached.csv", index=False)
    new = pd.DataFrame({"query": ["n1"], "prompt": ["A question not seen before."]})
    new.to_csv(folder / "cached_new.csv", index=False)
    cache = folder / "encodings"
    common = ["--text-column", "prompt", "--encoding-cache", cache]
    fit = ["fit", "cached.csv", "-o", "cached.sklocus", *common, *TINY]
    succeeded(in_process(*fit, cwd=folder, capsys=capsys))
    texts = set(table["prompt"])

    def cached():
        with sqlite3.connect(cache / "sklocus-encodings.sqlite3") as connection:
            return connection.execute("SELECT COUNT(*) FROM encodings").fetchone()[0]

    assert cached() == len(texts)
    # The folder is this machine's: the model file does not carry it.
    model = load_model_file(folder / "cached.sklocus")
    assert model.query_encoder.cache_dir is None
    assert model.query_encoder_.cache_dir is None
    encoded = []
    encode = SentenceTransformer.encode

    def counted(self, sentences, *args, **kwargs):
        encoded.extend(sentences)
        return encode(self, sentences, *args, **kwargs)

    monkeypatch.setattr(SentenceTransformer, "encode", counted)
    route = ["route", "cached.sklocus", "cached.csv", "cached_new.csv"]
    route += ["-o", "cached_routes.csv", *common]
    succeeded(in_process(*route, cwd=folder, capsys=capsys))
    # The pool's texts came from the cache: only the new query was encoded.
    assert encoded == ["A question not seen before."]
    assert cached() == len(texts) + 1


# -- the encoding cache by default, and progress in logs ---------------------------


@pytest.fixture(scope="module")
def prompts(workspace, tmp_path_factory):
    """The workspace's table with a text per query, a model file fitted on the
    texts (with a cache of its own, so that the default cache starts empty),
    and a table of one new query."""
    folder, *_ = workspace
    table = pd.read_csv(folder / "evals.csv")
    table["prompt"] = "Prompt of " + table["query"] + ": which number is it?"
    table.to_csv(folder / "prompts.csv", index=False)
    pd.DataFrame({"query": ["n1"], "prompt": ["A prompt never seen."]}).to_csv(
        folder / "prompts_new.csv", index=False
    )
    cache = tmp_path_factory.mktemp("fit-cache")
    fit = ["fit", "prompts.csv", "-o", "prompts.sklocus", "--text-column", "prompt"]
    before = os.getcwd()
    os.chdir(folder)
    try:
        assert main([*fit, "--encoding-cache", str(cache), *TINY]) == 0
    finally:
        os.chdir(before)
    return folder, sorted(set(table["prompt"]))


@pytest.fixture
def counted_encodings(monkeypatch):
    """The texts the sentence encoder encodes from here on, in order."""
    from sentence_transformers import SentenceTransformer

    encoded = []
    encode = SentenceTransformer.encode

    def counted(self, sentences, *args, **kwargs):
        encoded.extend(sentences)
        return encode(self, sentences, *args, **kwargs)

    monkeypatch.setattr(SentenceTransformer, "encode", counted)
    return encoded


def cached_texts(folder):
    """How many encodings the cache in ``folder`` holds."""
    import sqlite3

    with sqlite3.connect(folder / "sklocus-encodings.sqlite3") as connection:
        return connection.execute("SELECT COUNT(*) FROM encodings").fetchone()[0]


def test_the_encoding_cache_is_on_by_default_and_off_on_request(
    prompts, tmp_path, capsys, monkeypatch, counted_encodings
):
    from sklocus._cache_folder import user_cache_folder

    folder, texts = prompts
    monkeypatch.delenv("SKLOCUS_ENCODING_CACHE")
    monkeypatch.delenv("SKLOCUS_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    default = user_cache_folder()
    route = ["route", "prompts.sklocus", "prompts.csv", "prompts_new.csv"]
    route += ["-o", "prompt_routes.csv", "--text-column", "prompt"]
    first = succeeded(in_process(*route, cwd=folder, capsys=capsys))
    # Not a terminal: plain lines that say where the texts came from.
    assert f"Query texts: 0 of 150 from the encoding cache in {default}." in (
        first.stderr
    )
    assert "Encoding query texts: 150 texts...\n" in first.stderr
    assert "Encoding query texts: 150 texts in " in first.stderr
    assert "\r" not in first.stderr
    assert sorted(counted_encodings) == sorted([*texts, "A prompt never seen."])
    assert cached_texts(default) == 151
    counted_encodings.clear()
    again = succeeded(in_process(*route, cwd=folder, capsys=capsys))
    assert counted_encodings == []
    assert "Query texts: 150 of 150 from the encoding cache" in again.stderr
    assert "Query texts: 1 of 1 from the encoding cache" in again.stderr
    off = succeeded(
        in_process(*route, "--no-encoding-cache", cwd=folder, capsys=capsys)
    )
    assert len(counted_encodings) == 151
    assert "from the encoding cache" not in off.stderr
    assert cached_texts(default) == 151
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "fresh"))
    succeeded(in_process(*route, "--no-encoding-cache", cwd=folder, capsys=capsys))
    assert not (tmp_path / "fresh").exists()
    refused = in_process(
        *route,
        "--no-encoding-cache",
        "--encoding-cache",
        ".",
        cwd=folder,
        capsys=capsys,
    )
    assert refused.returncode == 2
    assert "not allowed with argument --no-encoding-cache" in refused.stderr


def test_a_cache_folder_that_cannot_be_used(workspace, capsys, monkeypatch):
    folder, *_ = workspace
    (folder / "plain.txt").write_text("a file, not a folder")
    route = ["route", "model.sklocus", "evals.csv", "queries.csv"]
    route += ["-o", "unused_routes.csv"]
    # A folder the user chose: refused before any work.
    line = one_line_error(
        [*route, "--encoding-cache", "plain.txt/cache"], folder, capsys
    )
    assert line == (
        "sklocus route: error: argument --encoding-cache: cannot keep the encoding "
        "cache in plain.txt/cache (plain.txt is not a folder); give a writable "
        "folder, or --no-encoding-cache"
    )
    monkeypatch.setenv("SKLOCUS_ENCODING_CACHE", "plain.txt/cache")
    line = one_line_error(route, folder, capsys)
    assert line.startswith("sklocus route: error: $SKLOCUS_ENCODING_CACHE: cannot ")
    assert not (folder / "unused_routes.csv").exists()
    # The default folder: a warning, and the run goes on without a cache.
    monkeypatch.delenv("SKLOCUS_ENCODING_CACHE")
    monkeypatch.setenv("SKLOCUS_HOME", str(folder / "plain.txt" / "sklocus"))
    run = succeeded(in_process(*route, cwd=folder, capsys=capsys))
    warning = run.stderr.splitlines()[0]
    assert warning.startswith("sklocus: warning: the default encoding cache ")
    assert "cannot be used" in warning and "--no-encoding-cache" in warning
    assert (folder / "unused_routes.csv").is_file()


def test_embedding_and_refinement_report_progress_in_a_log(
    workspace, capsys, monkeypatch
):
    import sklocus._embedder

    folder, *_ = workspace
    # Every step reports, however short (by default, those over a second).
    monkeypatch.setattr(sklocus._embedder, "_PROGRESS_DELAY", 0.0)
    route = ["route", "model.sklocus", "evals.csv", "queries.csv"]
    run = succeeded(
        in_process(*route, "-o", "progress_routes.csv", cwd=folder, capsys=capsys)
    )
    for step in ("Embedding models", "Refining embeddings"):
        # Once per router build: the stages' own embeddings of parts of each
        # model's evaluations (query heads, here) report nothing of their own.
        assert run.stderr.count(f"{step}: 30 models...\n") == 1
        assert run.stderr.count(f"{step}: 30 models in ") == 1
    # Settings of the run: the model file is as it was.
    assert load_model_file(folder / "model.sklocus").verbose == 0


def test_feedback_and_serve_use_the_cache_and_save_none_of_it(
    prompts, tmp_path, capsys, counted_encodings
):
    from sklocus.cli import build_parser
    from sklocus.cli._serve import _load_pool_encodings, _router_from

    folder, texts = prompts
    cache = tmp_path / "cache"
    serve = build_parser().parse_args(
        ["serve", "prompts.sklocus", "prompts.csv", "--text-column", "prompt"]
        + ["--router-file", str(tmp_path / "router.sklocus")]
        + ["--encoding-cache", str(cache)]
    )
    before = os.getcwd()
    os.chdir(folder)
    try:
        _router_from(serve)
    finally:
        os.chdir(before)
    err = capsys.readouterr().err
    assert "Building the router over the 30 models of prompts.csv..." in err
    assert f"Query texts: 0 of 150 from the encoding cache in {cache}." in err
    assert cached_texts(cache) == 150
    router = load_model_file(tmp_path / "router.sklocus")
    encoder = router.embedder_.estimator.query_encoder_
    assert (encoder.cache_dir, encoder.show_progress) == (None, None)
    # A served router with a journal loads the pool's encodings at start.
    counted_encodings.clear()
    _load_pool_encodings(router, serve)
    assert counted_encodings == []
    assert "Query texts: 150 of 150 from the encoding cache" in capsys.readouterr().err
    assert (encoder.cache_dir, encoder.show_progress) == (None, None)

    queries = router.evaluation_queries_.tolist()[:3]
    model = router.classes_[0]
    pd.DataFrame({"model": model, "query": queries, "score": 1.0}).to_csv(
        tmp_path / "outcomes.csv", index=False
    )
    fresh = tmp_path / "fresh"
    run = succeeded(
        in_process(
            "feedback",
            "router.sklocus",
            "outcomes.csv",
            "--encoding-cache",
            fresh,
            cwd=tmp_path,
            capsys=capsys,
        )
    )
    assert "Folding 3 outcomes into 1 of the router's 30 models" in run.stderr
    assert f"from the encoding cache in {fresh}." in run.stderr
    assert cached_texts(fresh) > 0
    learnt = load_model_file(tmp_path / "router.sklocus")
    assert learnt.evaluation_counts_.sum() == router.evaluation_counts_.sum() + 3
    encoder = learnt.embedder_.estimator.query_encoder_
    assert (encoder.cache_dir, encoder.show_progress) == (None, None)
    assert learnt.embedder_.estimator.verbose == 0
    run = succeeded(
        in_process(
            "feedback",
            "router.sklocus",
            "outcomes.csv",
            "--no-encoding-cache",
            cwd=tmp_path,
            capsys=capsys,
        )
    )
    assert "from the encoding cache" not in run.stderr


def test_report_writes_the_model_map(workspace, capsys):
    folder, data, *_ = workspace
    table = pd.read_csv(folder / "evals.csv")
    benchmark = dict(zip(data.query_ids, data.benchmarks))
    table["benchmark"] = table["query"].map(benchmark)
    table.to_csv(folder / "grouped.csv", index=False)
    (folder / "test.txt").write_text("\n".join(data.query_ids[120:]))
    run = succeeded(
        in_process(
            "report",
            "model.sklocus",
            "grouped.csv",
            "-o",
            "map.html",
            "--group-column",
            "benchmark",
            "--metadata-column",
            "params",
            "--color",
            "params",
            "--test-queries",
            "test.txt",
            "--cost-column",
            "params",
            cwd=folder,
            capsys=capsys,
        )
    )
    assert "Wrote the map of 30 models to map.html" in run.stderr
    page = (folder / "map.html").read_text()
    start = page.index('<script type="application/json" id="map-data">')
    raw = page[page.index(">", start) + 1 : page.index("</script>", start)]
    shown = json.loads(raw.replace("<\\/", "</"))
    assert shown["models"] == data.model_names
    assert shown["groups"] == [str(b) for b in range(5)]
    assert shown["color"]["by"] == "params"
    assert shown["portfolio"]["full_pool"] is not None
    ladder = shown["portfolio"]["cost_ladder"]
    assert ladder["by"] == "params" and ladder["n_priced"] == 30
    params = dict(zip(data.model_names, data.params_b))
    for max_total_cost, chosen in zip(ladder["max_total_cost"], ladder["selections"]):
        assert sum(params[shown["models"][i]] for i in chosen) <= max_total_cost


def map_shown(path):
    """The data a map page shows, read back from its HTML."""
    page = path.read_text()
    start = page.index('<script type="application/json" id="map-data">')
    raw = page[page.index(">", start) + 1 : page.index("</script>", start)]
    return json.loads(raw.replace("<\\/", "</"))


def routing_lines(run):
    return [line for line in run.stderr.splitlines() if "Routing accuracy" in line]


def test_fit_route_and_report_say_the_same_routing_accuracy(workspace, capsys):
    folder, data, *_ = workspace
    evaluated = {q for e in data.evaluation_sets for q in e}
    held_out = [q for q in data.query_ids[100:] if q in evaluated]
    (folder / "held.txt").write_text("\n".join(held_out) + "\nnot-a-query\n")
    vectors = ["--query-vectors", "vectors.npy", "--query-ids", "ids.txt"]
    test = ["--test-queries", "held.txt"]
    fit = in_process(
        "fit", "evals.csv", "-o", "held.sklocus", *vectors, *TINY, *test,
        cwd=folder, capsys=capsys,
    )  # fmt: skip
    succeeded(fit)
    assert f"Training on 30 models and {150 - len(held_out)} queries" in fit.stderr
    # The query the file names and EVALS lacks is said, not silently dropped.
    assert f"1 of the {len(held_out) + 1} queries of held.txt" in fit.stderr
    route = ("route", "held.sklocus", "evals.csv", "queries.csv", "-o", "held.csv")
    route = succeeded(in_process(*route, *test, cwd=folder, capsys=capsys))
    # Routes that leave a model out are measured without it too.
    excluded = ("route", "held.sklocus", "evals.csv", "queries.csv", "-o", "ex.csv")
    excluded += ("--exclude", data.model_names[0], *test)
    (line,) = routing_lines(succeeded(in_process(*excluded, cwd=folder, capsys=capsys)))
    assert f"among 29 models on the {len(held_out)} held-out queries" in line
    report = ("report", "held.sklocus", "evals.csv", "-o", "held.html")
    report = succeeded(in_process(*report, *test, cwd=folder, capsys=capsys))
    said = {tuple(routing_lines(run)) for run in (fit, route, report)}
    assert len(said) == 1, said
    (line,) = said.pop()
    assert line.endswith(f"on the {len(held_out)} held-out queries of held.txt.")
    # The page shows that figure for the whole pool, on the same queries.
    portfolio = map_shown(folder / "held.html")["portfolio"]
    assert line.startswith(f"Routing accuracy {portfolio['full_pool']:.1%} on")
    assert portfolio["n_held_out"] == len(held_out)
    # The router of route, scored by the library, says the same.
    embedder = load_model_file(folder / "held.sklocus")
    train = [
        {q: s for q, s in e.items() if q not in set(held_out)}
        for e in data.evaluation_sets
    ]
    router = LocusRouter(FrozenEstimator(embedder)).fit_evaluations(
        train, data.model_names
    )
    held = [{q: e[q] for q in held_out if q in e} for e in data.evaluation_sets]
    scores, _ = to_matrix(held, queries=held_out)
    Y = pd.DataFrame(scores, columns=data.model_names)
    assert line.startswith(f"Routing accuracy {router.score(held_out, Y):.1%} on")


def test_group_options_that_find_no_group_say_so(workspace, tmp_path, capsys):
    folder, data, *_ = workspace
    benchmark = dict(zip(data.query_ids, data.benchmarks))
    rows = [
        (name, query, score)
        for name, evaluations in zip(data.model_names, data.evaluation_sets)
        for query, score in evaluations.items()
    ]
    pd.DataFrame(rows, columns=["model", "query_id", "score"]).to_parquet(
        tmp_path / "responses.parquet"
    )
    pd.DataFrame(
        {
            "query_id": data.query_ids,
            "query": [f"text {q}" for q in data.query_ids],
            "benchmark": [f"b{benchmark[q]}" for q in data.query_ids],
            "unused": None,
        }
    ).to_parquet(tmp_path / "queries.parquet")
    np.save(tmp_path / "encodings_all-MiniLM-L6-v2.npy", data.query_vectors)
    model = folder / "model.sklocus"
    # A folder's query column is its ids, whatever the texts' column is named,
    # so --group-column finds each query's group.
    report = ("report", model, ".", "-o", "map.html", "--group-column", "benchmark")
    succeeded(in_process(*report, cwd=tmp_path, capsys=capsys))
    shown = map_shown(tmp_path / "map.html")
    assert shown["groups"] == [f"b{b}" for b in range(5)]
    assert all(len(row) == 5 for row in shown["accuracy"])
    empty = ("report", model, ".", "-o", "empty.html", "--group-column", "unused")
    line = one_line_error(empty, tmp_path, capsys)
    assert line.startswith("sklocus report: error: argument --group-column: no query")
    assert "column 'unused'" in line
    # Routing by groups that QUERIES names and the pool lacks corrects nothing:
    # route says so.
    table = pd.read_csv(folder / "evals.csv")
    table["benchmark"] = table["query"].map(benchmark)
    table.to_csv(tmp_path / "grouped.csv", index=False)
    pd.DataFrame({"query": data.query_ids[:5], "benchmark": "elsewhere"}).to_csv(
        tmp_path / "others.csv", index=False
    )
    route = ("route", model, "grouped.csv", "others.csv", "-o", "routes.csv")
    run = in_process(*route, "--group-column", "benchmark", cwd=tmp_path, capsys=capsys)
    succeeded(run)
    assert "--group-column: no query of others.csv has a group" in run.stderr
    assert "routed without group corrections" in run.stderr


def test_version_and_plain_help(capsys):
    run = succeeded(sklocus("--version", cwd="."))
    assert run.stdout.startswith("sklocus ")
    for command in [
        "fit",
        "embed",
        "route",
        "neighbors",
        "duplicates",
        "clusters",
        "select",
        "report",
        "serve",
        "demo",
    ]:
        text = succeeded(in_process(command, "--help", cwd=".", capsys=capsys)).stdout
        assert "usage: sklocus " + command in text
        assert "``" not in text and ":class:" not in text


def test_demo_quick_reports_its_table(tmp_path):
    run = succeeded(sklocus("demo", "--quick", "--max-epochs", "1", cwd=tmp_path))
    assert "120 synthetic models" in run.stdout
    assert "LOCUS" in run.stdout and "routing" in run.stdout
    # What each column measures, and why training stopped.
    assert "correctness: the share of the" in run.stdout
    assert "routing: the mean observed score" in run.stdout
    assert "Stopped " in run.stdout and "s in 1 epoch," in run.stdout
    # Not a terminal: no progress bar redraws, no colour codes.
    assert "\r" not in run.stdout + run.stderr
    assert "\x1b[" not in run.stdout + run.stderr


# -- bad input: one line naming the culprit, status 2 -----------------------------


def one_line_error(argv, cwd, capsys):
    """Run main in this process; return its one line of error."""
    run = in_process(*argv, cwd=cwd, capsys=capsys)
    assert run.returncode == 2, run
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    return lines[0]


@pytest.fixture(scope="module")
def bad_files(workspace):
    folder, data, *_ = workspace
    table = pd.read_csv(folder / "evals.csv")
    broken = table.copy()
    broken.loc[7, "score"] = 1.7
    broken.to_csv(folder / "broken.csv", index=False)
    stranger = table.copy()
    stranger.loc[3, "query"] = "q-never-seen"
    stranger.to_csv(folder / "stranger.csv", index=False)
    unpriced = table.copy()
    unpriced.loc[4, "params"] = np.nan
    unpriced.to_csv(folder / "unpriced.csv", index=False)
    (folder / "short_ids.txt").write_text("\n".join(data.query_ids[:10]))
    (folder / "notes.json").write_text("{}")
    emb = pd.read_parquet(folder / "emb.parquet")
    emb.drop(columns=["z3"]).to_csv(folder / "gap.csv", index=False)
    return folder


VECTORS = ["--query-vectors", "vectors.npy", "--query-ids", "ids.txt"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["fit", "missing.csv", "-o", "m.sklocus"], "missing.csv: no such file"),
        (["fit", "notes.json", "-o", "m.sklocus"], "notes.json: unknown file type"),
        (
            ["fit", "evals.csv", "-o", "m.sklocus", "--score-column", "correct"],
            "evals.csv: no column 'correct' (--score-column); its columns are",
        ),
        (
            ["fit", "broken.csv", "-o", "m.sklocus", *VECTORS],
            "broken.csv: line 9 (model 'model-0000') has score 1.7",
        ),
        (
            ["embed", "model.sklocus", "unpriced.csv", "-o", "e.csv"]
            + ["--cost-column", "params"],
            "unpriced.csv: line 6 has no value in column 'params'; costs must be",
        ),
        (
            ["fit", "evals.csv", "-o", "m.sklocus", "--set", "n_latent=4"],
            "--set n_latent: LocusEmbedder has no parameter 'n_latent'",
        ),
        (
            ["fit", "evals.csv", "-o", "m.sklocus", "--set", "max_epochs"],
            "--set 'max_epochs': expected NAME=VALUE",
        ),
        (
            ["fit", "evals.csv", "-o", "m.sklocus", "--set", "query_encoder=x"],
            "--set query_encoder: give it with --encoder or --query-vectors",
        ),
        (
            [
                "fit",
                "evals.csv",
                "-o",
                "m.sklocus",
                *VECTORS,
                "--set",
                "n_latents=many",
            ],
            "'n_latents' parameter of LocusEmbedder must be",
        ),
        (
            ["fit", "evals.csv", "-o", "m.sklocus", "--query-vectors", "vectors.npy"],
            "--query-vectors needs --query-ids",
        ),
        (
            [
                "fit",
                "evals.csv",
                "-o",
                "m.sklocus",
                "--query-vectors",
                "vectors.npy",
                "--query-ids",
                "short_ids.txt",
            ],
            "short_ids.txt lists 10 queries but vectors.npy has 150 rows",
        ),
        (
            ["fit", "evals.csv", "-o", "nowhere/m.sklocus", *VECTORS],
            "the folder nowhere does not exist",
        ),
        (
            ["fit", "evals.csv", "-o", "m.sklocus", "--random-state", "-1"],
            "argument --random-state: -1 is out of range",
        ),
        (
            ["embed", "absent.sklocus", "evals.csv", "-o", "e.csv"],
            "absent.sklocus: no such model file",
        ),
        (["embed", "evals.csv", "evals.csv", "-o", "e.csv"], "evals.csv"),
        (
            ["embed", "model.sklocus", "stranger.csv", "-o", "e.csv"],
            "query 'q-never-seen'",
        ),
        (
            ["embed", "model.sklocus", "evals.csv", "-o", "e.txt"],
            "e.txt: unknown file type",
        ),
        (
            [
                "embed",
                "model.sklocus",
                "evals.csv",
                "-o",
                "e.csv",
                "--cost-column",
                "price",
            ],
            "evals.csv: no column 'price' (--cost-column)",
        ),
        (
            [
                "route",
                "model.sklocus",
                "evals.csv",
                "queries.csv",
                "-o",
                "r.csv",
                "--exclude",
                "gpt-99",
            ],
            "cannot exclude 'gpt-99': the router has no such",
        ),
        (
            [
                "route",
                "model.sklocus",
                "evals.csv",
                "queries.csv",
                "-o",
                "r.csv",
                "-k",
                "31",
            ],
            "k=31 is more than the 30 models",
        ),
        (
            [
                "route",
                "model.sklocus",
                "evals.csv",
                "queries.csv",
                "-o",
                "r.csv",
                "--cost-weight",
                "0.5",
            ],
            "--cost-column goes with --cost-weight, --min-probability or --budget",
        ),
        (
            [
                "route",
                "model.sklocus",
                "evals.csv",
                "queries.csv",
                "-o",
                "r.csv",
                "--cost-column",
                "params",
                "--cost-weight",
                "-1",
            ],
            "argument --cost-weight: -1 is not a finite number of at least 0",
        ),
        (
            [
                "route",
                "model.sklocus",
                "evals.csv",
                "queries.csv",
                "-o",
                "r.csv",
                "--cost-column",
                "params",
                "--min-probability",
                "1.5",
            ],
            "argument --min-probability: 1.5 is not a probability in [0, 1]",
        ),
        (
            [
                "route",
                "model.sklocus",
                "evals.csv",
                "queries.csv",
                "-o",
                "r.csv",
                "--cost-column",
                "params",
                "--cost-weight",
                "0.1",
                "--min-probability",
                "0.5",
            ],
            "argument --min-probability: not allowed with argument --cost-weight",
        ),
        (
            [
                "route",
                "model.sklocus",
                "evals.csv",
                "evals.csv",
                "-o",
                "r.csv",
                "--query-column",
                "prompt",
            ],
            "evals.csv: no column 'prompt'",
        ),
        (
            ["neighbors", "emb.parquet", "-k", "30"],
            "argument -k: 30 neighbours asked for, but emb.parquet has only 30",
        ),
        (
            ["neighbors", "emb.parquet", "--model", "gpt-99"],
            "argument --model: 'gpt-99' is not a model of emb.parquet",
        ),
        (["neighbors", "gap.csv"], "gap.csv: vector columns"),
        (["neighbors", "evals.csv"], "evals.csv: no vector columns z0, z1"),
        (
            ["duplicates", "emb.parquet", "--metric", "cosine"],
            "argument --threshold: required with --metric cosine",
        ),
        (
            ["duplicates", "emb.parquet", "--threshold", "0"],
            "argument --threshold: 0 is not a finite number above 0",
        ),
        (
            ["clusters", "emb.parquet", "--n-clusters", "31"],
            "31 clusters asked for, but emb.parquet has only 30 models",
        ),
        (["clusters", "emb.parquet"], "one of the arguments --n-clusters"),
        (["select", "emb.parquet"], "argument --n-selected: required with --method"),
        (
            ["select", "emb.parquet", "--method", "coverage"],
            "argument --max-total-cost: required with --method coverage",
        ),
        (
            [
                "select",
                "emb.parquet",
                "--method",
                "coverage",
                "--max-total-cost",
                "1",
                "--cost-column",
                "params",
            ],
            "max_total_cost=1.0 is below every model's cost",
        ),
        (
            [
                "select",
                "emb.parquet",
                "--method",
                "coverage",
                "--max-total-cost",
                "3",
                "--cost-column",
                "price",
            ],
            "emb.parquet: no column 'price'",
        ),
        (
            ["select", "emb.parquet", "--n-selected", "3", "--max-total-cost", "3"],
            "argument --max-total-cost: used by --method coverage only",
        ),
        (
            [
                "report",
                "model.sklocus",
                "evals.csv",
                "-o",
                "map.html",
                "--cost-column",
                "price",
            ],
            "evals.csv: no column 'price' (--cost-column)",
        ),
        (
            ["serve", "model.sklocus"],
            "model.sklocus holds a LocusEmbedder, not a LocusRouter; give EVALS too",
        ),
        (
            ["serve", "model.sklocus", "--router-file", "r.sklocus"],
            "argument --router-file: goes with EVALS",
        ),
        (
            ["serve", "model.sklocus", "evals.csv", *VECTORS, "--write-back"],
            "argument --write-back: needs a router file to write to",
        ),
        (["serve", "missing.sklocus"], "missing.sklocus: no such model file"),
        (["demo", "--max-epochs", "0"], "argument --max-epochs: 0 is out of range"),
        (["embedd"], "invalid choice: 'embedd'"),
    ],
)
def test_bad_input_is_one_line_naming_it(workspace, bad_files, argv, message, capsys):
    line = one_line_error(argv, bad_files, capsys)
    assert line.startswith("sklocus")
    assert message in line


def test_a_user_error_in_a_fresh_process_is_one_line_and_status_2(workspace):
    folder, *_ = workspace
    run = sklocus("neighbors", "emb.parquet", "--model", "gpt-99", cwd=folder)
    assert run.returncode == 2
    # A start slower than 10 s (a loaded machine) says so in a log: not an error.
    said = [x for x in run.stderr.splitlines() if not x.startswith("Starting sklocus")]
    assert said == [
        "sklocus neighbors: error: argument --model: 'gpt-99' is not a model of "
        "emb.parquet"
    ], run.stderr


@pytest.fixture(scope="module")
def parquet_evals(workspace):
    """The workspace's table as Parquet (in row groups that split models), and
    the same with one model's row moved to the end."""
    folder, *_ = workspace
    table = pd.read_csv(folder / "evals.csv", dtype={"model": str, "query": str})
    table.to_parquet(folder / "evals.parquet", row_group_size=500)
    moved = pd.concat([table.drop(index=0), table.iloc[[0]]])
    moved.to_parquet(folder / "unsorted.parquet")
    broken = table.copy()
    broken.loc[7, "score"] = 1.7
    broken.to_parquet(folder / "broken.parquet")
    return folder


def test_embed_stream_writes_what_embed_writes(workspace, parquet_evals, capsys):
    folder = parquet_evals
    argv = ["embed", "model.sklocus", "evals.parquet", "-o", "streamed.parquet"]
    run = succeeded(
        in_process(*argv, "--stream", "--batch-models", "7", cwd=folder, capsys=capsys)
    )
    assert "Embedded 30 models in 16 dimensions to streamed.parquet, 7 at a time" in (
        run.stderr
    )
    streamed = pd.read_parquet(folder / "streamed.parquet")
    whole = pd.read_parquet(folder / "emb.parquet").drop(columns="params")
    # The same table, though `embed` ran in a fresh process on all 30 at once:
    # the same names and counts, and vectors within float32 rounding.
    vectors = streamed.filter(like="z").columns
    pd.testing.assert_frame_equal(
        streamed.drop(columns=vectors), whole.drop(columns=vectors), check_exact=True
    )
    assert_same_vectors(streamed[vectors].to_numpy(), whole[vectors].to_numpy())


@pytest.mark.parametrize(
    "options, message",
    [
        (
            ["evals.csv", "-o", "s.parquet"],
            "evals.csv: --stream reads Parquet; expected a .parquet or .pq file",
        ),
        (["evals.parquet", "-o", "s.csv"], "s.csv: --stream writes Parquet"),
        (["missing.parquet", "-o", "s.parquet"], "missing.parquet: no such file"),
        (
            ["evals.parquet", "-o", "s.parquet", "--cost-column", "params"],
            "--cost-column does not go with --stream",
        ),
        (
            ["evals.parquet", "-o", "s.parquet", "--batch-models", "0"],
            "argument --batch-models: 0 is out of range",
        ),
        (
            ["evals.parquet", "-o", "s.parquet", "--score-column", "correct"],
            "evals.parquet: no column 'correct' (--score-column); its columns are",
        ),
        (
            ["unsorted.parquet", "-o", "s.parquet"],
            "starts the rows of model 'model-0000' again, after those of other",
        ),
        (
            ["broken.parquet", "-o", "s.parquet"],
            "broken.parquet: row 8 (model 'model-0000') has score 1.7",
        ),
        (["notes.json", "-o", "s.parquet"], "notes.json: --stream reads Parquet"),
    ],
)
def test_bad_input_to_embed_stream_is_one_line_naming_it(
    parquet_evals, bad_files, options, message, capsys
):
    argv = ["embed", "model.sklocus", *options, "--stream"]
    line = one_line_error(argv, parquet_evals, capsys)
    assert message in line, line
    assert not (parquet_evals / "s.parquet").exists()


def test_parse_settings_is_the_one_grammar_of_set():
    from sklocus.cli import parse_settings

    parsed = parse_settings(["max_epochs=3", "lr = 1e-3", "device=cpu"])
    assert parsed == {"max_epochs": 3, "lr": 1e-3, "device": "cpu"}
    # Python objects cannot come from a command line; a caller reserves more.
    with pytest.raises(ValueError, match="--set module: give it with Python"):
        parse_settings(["module=None"])
    with pytest.raises(ValueError, match="--set device: give it with --device"):
        parse_settings(["device=cpu"], reserved={"device": "--device"})
    with pytest.raises(ValueError, match="--set 'lr': expected NAME=VALUE"):
        parse_settings(["lr"])
    with pytest.raises(ValueError, match="no parameter 'n_latent'; its parameters"):
        parse_settings(["n_latent=4"])
