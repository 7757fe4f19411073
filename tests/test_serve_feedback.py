"""POST /feedback: outcomes kept on disk, folded into the served router."""

import os
import signal
import sqlite3
import threading
import time

import numpy as np
import pandas as pd
import pytest
from sklearn.frozen import FrozenEstimator
from test_serve import Server, _errors, _require
from tiny import TINY_NETWORK

import sklocus
from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix

_require("fastapi")
import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from sklocus.serve import RequestError, RouterService, create_app  # noqa: E402
from sklocus.serve._journal import FeedbackJournal, JournalError  # noqa: E402


@pytest.fixture(scope="module")
def pool():
    data = make_evaluations(
        n_models=8, n_queries=160, evals_per_model=(20, 60), query_dim=8, random_state=5
    )
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK).fit(
        data.evaluation_sets
    )
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    router = LocusRouter(FrozenEstimator(embedder), refine_steps=5).fit(queries, Y)
    return data, router


@pytest.fixture()
def router_file(pool, tmp_path):
    path = tmp_path / "router.sklocus"
    sklocus.save(pool[1], path)
    return path


def _outcomes(data, n, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {
            "query": data.query_ids[int(rng.integers(160))],
            "model": data.model_names[int(rng.integers(8))],
            "score": float(rng.integers(2)),
        }
        for _ in range(n)
    ]


def _served(path, journal):
    """A service of the router in ``path`` that writes its changes back there."""
    return RouterService(
        sklocus.load(path), path=path, write_back=True, feedback_journal=journal
    )


def _learnt(router, outcomes):
    """``router`` after partial_fit of ``outcomes``, one table per outcome."""
    for outcome in outcomes:
        Y = pd.DataFrame({outcome["model"]: [outcome["score"]]})
        router.partial_fit([outcome["query"]], Y)
    return router


@pytest.mark.slow
def test_outcomes_are_on_disk_when_answered_and_folded_in_as_partial_fit(
    pool, router_file, tmp_path
):
    data, router = pool
    journal = tmp_path / "feedback.sqlite"
    service = RouterService(router, path=router_file, feedback_journal=journal)
    outcomes = _outcomes(data, 40)
    answer = service.feedback(outcomes)
    assert answer == {"accepted": 40, "through": 40, "pending_outcomes": 40}
    # Another connection sees them: committed, not held in this process.
    with sqlite3.connect(journal) as other:
        assert other.execute("SELECT count(*) FROM outcomes").fetchone() == (40,)
    assert service.router is not None and service.pending_outcomes() == 40
    before = service.router
    assert service.fold() == 40
    assert service.pending_outcomes() == 0 and service.fold() == 0
    expected = _learnt(sklocus.load(router_file), outcomes)
    np.testing.assert_allclose(
        service.router.embeddings_, expected.embeddings_, atol=1e-5
    )
    assert before.evaluation_counts_.sum() == router.evaluation_counts_.sum()
    listed = {m["name"]: m for m in service.models()}
    counts = pd.Series([o["model"] for o in outcomes]).value_counts()
    for name, entry in listed.items():
        initial = len(data.evaluation_sets[data.model_names.index(name)])
        assert entry["n_scores"] == initial + counts.get(name, 0)
        assert entry["n_outcomes"] == counts.get(name, 0)
    assert service.health()["feedback"] is True
    service.close()


@pytest.mark.slow
def test_a_restart_learns_what_the_model_file_does_not_hold(
    pool, router_file, tmp_path
):
    data, _ = pool
    journal = tmp_path / "feedback.sqlite"
    first = RouterService(
        sklocus.load(router_file), path=router_file, feedback_journal=journal
    )
    first.feedback(_outcomes(data, 30))
    first.fold()
    first.feedback(_outcomes(data, 10, seed=1))  # kept, never folded
    first.close()
    # Without write-back the file holds none: all 40 are learnt again.
    again = RouterService(
        sklocus.load(router_file), path=router_file, feedback_journal=journal
    )
    assert again.pending_outcomes() == 0
    expected = _learnt(
        sklocus.load(router_file), _outcomes(data, 30) + _outcomes(data, 10, seed=1)
    )
    np.testing.assert_allclose(
        again.router.embeddings_, expected.embeddings_, atol=1e-5
    )
    again.close()


def test_write_back_folds_into_the_file_once(pool, router_file, tmp_path):
    data, _ = pool
    journal = tmp_path / "feedback.sqlite"
    service = _served(router_file, journal)
    service.feedback(_outcomes(data, 25))
    service.fold()
    total = service.router.evaluation_counts_.sum()
    service.close()
    assert sklocus.load(router_file).evaluation_counts_.sum() == total
    restarted = _served(router_file, journal)
    assert restarted.router.evaluation_counts_.sum() == total  # not learnt twice
    restarted.close()
    other = tmp_path / "other.sklocus"
    sklocus.save(pool[1], other)
    with pytest.raises(JournalError, match="into a model file other than"):
        RouterService(pool[1], path=other, write_back=True, feedback_journal=journal)


def test_a_crash_between_the_new_file_and_its_mark_is_settled(
    pool, router_file, tmp_path, monkeypatch
):
    data, _ = pool
    journal = tmp_path / "feedback.sqlite"
    service = _served(router_file, journal)
    service.feedback(_outcomes(data, 12))

    def crash(*args):
        raise KeyboardInterrupt  # the process dies after the file was replaced

    monkeypatch.setattr(FeedbackJournal, "end_fold", crash)
    with pytest.raises(KeyboardInterrupt):
        service.fold()
    monkeypatch.undo()
    in_file = sklocus.load(router_file).evaluation_counts_.sum()
    restarted = _served(router_file, journal)
    assert restarted.router.evaluation_counts_.sum() == in_file  # none twice
    assert restarted.pending_outcomes() == 0
    restarted.close()


def test_bad_feedback_is_refused_whole(pool, tmp_path):
    data, router = pool
    client = TestClient(
        create_app(RouterService(router, feedback_journal=tmp_path / "j.sqlite"))
    )
    good = {"query": data.query_ids[0], "model": data.model_names[0], "score": 1.0}
    cases = [
        (
            {**good, "model": "gpt-9"},
            ("body", "outcomes", 1, "model"),
            "'gpt-9' is not a model of the router",
        ),
        (
            {**good, "score": 1.5},
            ("body", "outcomes", 1, "score"),
            "less than or equal to 1",
        ),
        (
            {**good, "query_group": "mmlu"},
            ("body", "outcomes", 1, "query_group"),
            "fitted without query groups",
        ),
        (
            {**good, "query": "not-a-query"},
            ("body", "outcomes", 1, "query"),
            "precomputed encoder knows",
        ),
        (
            {**good, "extra": 1},
            ("body", "outcomes", 1, "extra"),
            "Extra inputs are not permitted",
        ),
    ]
    for bad, loc, message in cases:
        response = client.post("/feedback", json={"outcomes": [good, bad]})
        assert response.status_code == 422, bad
        (error,) = _errors(response)
        assert error[0] == loc and message in error[1], error
    assert client.get("/health").json()["pending_outcomes"] == 0
    plain = TestClient(create_app(RouterService(router)))
    refused = plain.post("/feedback", json={"outcomes": [good]})
    assert refused.status_code == 409 and "no feedback journal" in refused.text
    guarded = TestClient(
        create_app(
            RouterService(router, feedback_journal=tmp_path / "k.sqlite"),
            token="s3cret",
        )
    )
    assert guarded.post("/feedback", json={"outcomes": [good]}).status_code == 401


def test_the_app_folds_as_outcomes_arrive_and_counts_them(pool, tmp_path):
    data, router = pool
    service = RouterService(
        router, feedback_journal=tmp_path / "j.sqlite", fold_interval=0.05
    )
    with TestClient(create_app(service)) as client:
        name = data.model_names[2]
        before = next(
            m for m in client.get("/models").json()["models"] if m["name"] == name
        )
        outcomes = [
            {"query": q, "model": name, "score": 1.0} for q in data.query_ids[:20]
        ]
        answer = client.post("/feedback", json={"outcomes": outcomes}).json()
        assert answer["accepted"] == 20
        deadline = time.monotonic() + 60
        while (
            client.get("/health").json()["pending_outcomes"]
            and time.monotonic() < deadline
        ):
            time.sleep(0.05)
        after = next(
            m for m in client.get("/models").json()["models"] if m["name"] == name
        )
    assert after["n_scores"] == before["n_scores"] + 20
    assert (before["n_outcomes"], after["n_outcomes"]) == (0, 20)
    assert after["n_evaluations"] == len(
        set(data.evaluation_sets[2]) | set(data.query_ids[:20])
    )


@pytest.mark.slow
def test_a_killed_server_loses_no_acknowledged_outcome(pool, router_file, tmp_path):
    """SIGKILL while outcomes stream in; the restarted server holds every one it
    acknowledged (and none twice), in a model file that loads."""
    data, router = pool
    journal = tmp_path / "feedback.sqlite"
    argv = (
        router_file,
        "--write-back",
        "--feedback-journal",
        journal,
        "--fold-interval",
        "0.1",
    )
    server = Server(*argv, cwd=tmp_path)
    initial = int(router.evaluation_counts_.sum())
    acknowledged, stop = [], threading.Event()

    def stream():
        seed = 0
        with httpx.Client(base_url=server.url, timeout=30) as session:
            while not stop.is_set():
                batch = _outcomes(data, 50, seed=seed)
                seed += 1
                try:
                    answer = session.post("/feedback", json={"outcomes": batch})
                except httpx.TransportError:
                    return
                assert answer.status_code == 200, answer.text
                acknowledged.append(answer.json()["through"])

    sender = threading.Thread(target=stream)
    sender.start()
    deadline = time.monotonic() + 60
    while len(acknowledged) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(server.process.pid, signal.SIGKILL)
    server.process.wait()
    stop.set()
    sender.join()
    assert len(acknowledged) >= 20
    restarted = Server(*argv, cwd=tmp_path)
    try:
        health = httpx.get(f"{restarted.url}/health").json()
        assert health["pending_outcomes"] == 0
        listed = httpx.get(f"{restarted.url}/models").json()["models"]
        served = sum(m["n_scores"] for m in listed)
        with sqlite3.connect(journal) as db:
            kept = db.execute("SELECT count(*) FROM outcomes").fetchone()[0]
        assert kept >= max(acknowledged)  # every acknowledged outcome was kept
        assert served == initial + kept  # each learnt once
        route = httpx.post(
            f"{restarted.url}/route", json={"queries": data.query_ids[:3]}
        )
        assert route.status_code == 200
    finally:
        restarted.stop()
    assert sklocus.load(router_file).evaluation_counts_.sum() == initial + kept


@pytest.mark.slow
def test_a_terminated_server_exits_cleanly_and_closes_its_journal(
    pool, router_file, tmp_path
):
    """``kill`` (SIGTERM) ends the server as Ctrl-C does: status 0, the journal
    closed, no ``-wal`` or ``-shm`` file left beside it."""
    data, _ = pool
    journal = tmp_path / "feedback.sqlite"
    server = Server(router_file, "--feedback-journal", journal, cwd=tmp_path)
    answer = httpx.post(
        f"{server.url}/feedback", json={"outcomes": _outcomes(data, 5, seed=0)}
    )
    assert answer.status_code == 200, answer.text
    wal, shm = (journal.with_name(journal.name + suffix) for suffix in ("-wal", "-shm"))
    assert wal.exists() and shm.exists()  # open in WAL mode while serving
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=30)
    assert server.process.returncode == 0, server.stderr()
    assert not wal.exists() and not shm.exists()
    with sqlite3.connect(journal) as db:
        assert db.execute("SELECT count(*) FROM outcomes").fetchone()[0] == 5


def test_a_fold_that_cannot_be_saved_is_not_served_and_is_tried_again(pool, tmp_path):
    data, router = pool
    folder = tmp_path / "models"
    folder.mkdir()
    path = folder / "router.sklocus"
    sklocus.save(router, path)
    service = RouterService(
        sklocus.load(path),
        path=path,
        write_back=True,
        feedback_journal=tmp_path / "feedback.sqlite",
    )
    service.feedback(_outcomes(data, 8))
    before = service.router
    path.unlink()
    folder.rmdir()  # the model file's folder goes away
    with pytest.raises(RequestError, match="could not be saved"):
        service.fold()
    assert service.router is before and service.pending_outcomes() == 8
    folder.mkdir()
    assert service.fold() == 8  # the folder is back: the same outcomes fold in
    assert sklocus.load(path).evaluation_counts_.sum() == (
        router.evaluation_counts_.sum() + 8
    )
    service.close()


def test_outcomes_of_a_model_removed_before_the_fold_are_passed_over(pool, tmp_path):
    data, router = pool
    service = RouterService(router, feedback_journal=tmp_path / "j.sqlite")
    gone, kept = data.model_names[0], data.model_names[1]
    outcomes = [
        {"query": q, "model": name, "score": 1.0}
        for q in data.query_ids[:5]
        for name in (gone, kept)
    ]
    service.feedback(outcomes)
    service.remove_model(gone)
    assert service.fold() == 10 and service.pending_outcomes() == 0
    counts = {m["name"]: m["n_scores"] for m in service.models()}
    assert gone not in counts
    assert counts[kept] == len(data.evaluation_sets[1]) + 5
    service.close()


def test_a_rename_lost_by_a_machine_crash_is_settled(pool, router_file, tmp_path):
    """The journal marked a fold done, but the disk kept the file before it."""
    data, _ = pool
    journal = tmp_path / "feedback.sqlite"
    service = _served(router_file, journal)
    service.feedback(_outcomes(data, 6))
    service.fold()
    before = router_file.read_bytes()
    service.feedback(_outcomes(data, 9, seed=1))
    service.fold()
    total = service.router.evaluation_counts_.sum()
    service.close()
    router_file.write_bytes(before)  # the last rename never reached the disk
    restarted = _served(router_file, journal)
    assert restarted.router.evaluation_counts_.sum() == total  # the 9 learnt again
    restarted.close()


@pytest.mark.slow
def test_a_router_built_afresh_at_each_start_learns_the_journal_again(pool, tmp_path):
    """sklocus serve EMBEDDER EVALS --router-file F --write-back with a journal:
    each start rebuilds F, which then holds none of the outcomes, and learns
    them all again (the journal's marks of the old F are forgotten)."""
    data, router = pool
    rows = [
        (name, query, score)
        for name, evaluations in zip(data.model_names, data.evaluation_sets)
        for query, score in evaluations.items()
    ]
    pd.DataFrame(rows, columns=["model", "query", "score"]).to_csv(
        tmp_path / "evals.csv", index=False
    )
    np.save(tmp_path / "vectors.npy", data.query_vectors)
    (tmp_path / "ids.txt").write_text("\n".join(data.query_ids))
    sklocus.save(router.embedder_.estimator, tmp_path / "embedder.sklocus")
    argv = ("embedder.sklocus", "evals.csv", "--query-vectors", "vectors.npy")
    argv += ("--query-ids", "ids.txt", "--router-file", "built.sklocus")
    argv += ("--write-back", "--feedback-journal", "j.sqlite", "--fold-interval", "0")
    outcomes = _outcomes(data, 30)
    for start in range(2):
        served = Server(*argv, cwd=tmp_path)
        try:
            if start == 0:
                answer = httpx.post(
                    f"{served.url}/feedback", json={"outcomes": outcomes}
                )
                assert answer.status_code == 200, answer.text
                deadline = time.monotonic() + 60
                while httpx.get(f"{served.url}/health").json()["pending_outcomes"]:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            listed = httpx.get(f"{served.url}/models").json()["models"]
        finally:
            served.stop()
        initial = sum(len(s) for s in data.evaluation_sets)
        assert sum(m["n_scores"] for m in listed) == initial + 30, start
        assert sum(m["n_outcomes"] for m in listed) == 30, start


def test_the_service_called_directly_checks_scores_as_the_library_does(pool, tmp_path):
    data, router = pool
    service = RouterService(router, feedback_journal=tmp_path / "j.sqlite")
    good = {"query": data.query_ids[0], "model": data.model_names[0], "score": 1}
    for score in ("1", 1.5, float("nan"), None):
        with pytest.raises(RequestError, match="is not a number in") as refused:
            service.feedback([good, {**good, "score": score}])
        assert refused.value.field == ("outcomes", 1, "score")
    assert service.feedback([good, {**good, "score": True}])["accepted"] == 2
    service.close()


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
def test_the_journal_and_its_write_ahead_files_are_the_owners_alone(tmp_path):
    # Round 2, N10: the journal holds every query text it is sent.
    old = os.umask(0o022)  # what most users have: files readable by all
    try:
        journal = FeedbackJournal(tmp_path / "journal.db")
        journal.append([("some private query", "m", 1.0, None)])
        created = sorted(p.name for p in tmp_path.iterdir())
        modes = {p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir()}
        journal.close()
    finally:
        os.umask(old)
    assert "journal.db-wal" in created, created
    assert all(mode == 0o600 for mode in modes.values()), modes


def test_the_guide_lists_exactly_what_the_token_guards(pool, tmp_path):
    # Round 2, N11: /feedback needs the token too, and the guide and
    # create_app's docstring must say so.
    from pathlib import Path

    _, router = pool
    app = create_app(
        RouterService(router, feedback_journal=tmp_path / "j.sqlite"), token="t0k"
    )
    client = TestClient(app)
    guarded = set()
    for route in app.routes:
        for method in sorted(getattr(route, "methods", None) or ()):
            if method in ("HEAD", "OPTIONS"):
                continue
            path = route.path.replace("{name:path}", "{name}")
            url = route.path.replace("{name:path}", "m0")
            if client.request(method, url, json={}).status_code == 401:
                guarded.add(f"{method} {path}")
    assert guarded == {"POST /models", "DELETE /models/{name}", "POST /feedback"}
    guide = Path(__file__).parents[1] / "docs" / "user_guide" / "serving.rst"
    section = guide.read_text().split("Authentication\n")[1].split("\n\n")[1]
    section = " ".join(section.split())
    docstring = " ".join(create_app.__doc__.split())
    for route in guarded:
        assert f"``{route}``" in section, route
        assert f"``{route}``" in docstring, route


def test_a_new_model_never_learns_the_outcomes_of_a_removed_namesake(
    pool, router_file, tmp_path
):
    # Hostile input round 2, N7: outcomes journalled for a model and not yet
    # folded went to a new model onboarded under its name.
    data, router = pool
    journal = tmp_path / "feedback.sqlite"
    service = RouterService(router, path=router_file, feedback_journal=journal)
    name = data.model_names[5]
    stale = [{"query": q, "model": name, "score": 1.0} for q in data.query_ids[:30]]
    other = [{"query": data.query_ids[0], "model": data.model_names[0], "score": 0.0}]
    service.feedback(stale + other)
    service.remove_model(name)
    fresh = {q: 0.0 for q in data.query_ids[100:110]}
    service.add_model(name, fresh)
    assert service.fold_all() == len(stale) + 1

    def outcomes_of(router):
        return router.evaluations().groupby("model")["n_outcomes"].sum()

    assert outcomes_of(service.router)[name] == len(fresh)
    first = data.model_names[0]
    assert outcomes_of(service.router)[first] == outcomes_of(router)[first] + 1
    # Nor does GET /models count them as the newcomer's (issue 70, F17).
    listed = {model["name"]: model["n_outcomes"] for model in service.models()}
    assert (listed[name], listed[first]) == (0, 1)
    service.close()
    # A restart does not hand them over either: the removal is in the journal.
    again = RouterService(service.router, path=router_file, feedback_journal=journal)
    again.fold_all()
    assert outcomes_of(again.router)[name] == len(fresh)
    # The newcomer's own outcomes are counted from its onboarding on.
    again.feedback([{"query": data.query_ids[0], "model": name, "score": 1.0}])
    again.fold_all()
    assert {m["name"]: m["n_outcomes"] for m in again.models()}[name] == 1
    again.close()


def test_a_journal_that_cannot_be_written_is_answered_503_with_the_reason(
    pool, tmp_path, monkeypatch
):
    # Hostile input round 2, N5: a full disk gave a bare 500, and the next
    # request on the connection was reset.
    data, router = pool
    service = RouterService(router, feedback_journal=tmp_path / "j.sqlite")
    client = TestClient(create_app(service))

    def full(rows):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(service._journal, "append", full)
    answer = client.post("/feedback", json={"outcomes": _outcomes(data, 3)})
    assert answer.status_code == 503, answer.text
    assert "database or disk is full" in answer.text
    assert "nothing of this request was kept" in answer.text
    assert client.get("/health").status_code == 200  # the same connection goes on
    assert service.pending_outcomes() == 0
    service.close()


def test_health_never_waits_on_the_journal(pool, tmp_path):
    # Hostile input round 2, N6: GET /health is answered on the event loop; it
    # waited on the journal's lock while a write sat in SQLite's busy wait.
    data, router = pool
    service = RouterService(router, feedback_journal=tmp_path / "j.sqlite")
    service.feedback(_outcomes(data, 4))
    answered = []
    with service._journal._lock:  # a write holds the journal
        worker = threading.Thread(target=lambda: answered.append(service.health()))
        worker.start()
        worker.join(timeout=10)
        finished = not worker.is_alive()
    worker.join()
    assert finished, "health waited on the journal's lock"
    assert answered[0]["pending_outcomes"] == 4
    service.close()


def test_a_full_disk_is_reported_as_itself_not_as_the_rollback(tmp_path):
    """Round 3, F13: the rollback's own error hid the real one."""
    journal = FeedbackJournal(tmp_path / "journal.db")
    journal.append([("q", "m", 1.0, None)])
    # SQLite's own cap on the file's pages: the disk is full at this size.
    pages = journal._db.execute("PRAGMA page_count").fetchone()[0]
    journal._db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        journal.append([("q" * 5000, "m", 1.0, None)] * 50)
    assert journal.last_id() == 1
    journal.close()


@pytest.mark.skipif(os.name != "posix", reason="file modes are POSIX")
@pytest.mark.parametrize("loose", ["journal.db", "journal.db-wal", "journal.db-shm"])
def test_a_journal_others_may_read_or_write_is_refused(tmp_path, loose):
    """Round 3, F12: a 0666 journal gave 0666 -wal and -shm files."""
    path = tmp_path / "journal.db"
    FeedbackJournal(path).close()
    (tmp_path / loose).touch()
    os.chmod(tmp_path / loose, 0o666)
    with pytest.raises(
        JournalError, match=rf"{loose} may be read or written by others \(mode 0666\)"
    ):
        FeedbackJournal(path)


@pytest.mark.skipif(os.name != "posix", reason="links and modes are POSIX")
def test_a_link_to_nowhere_is_not_followed(tmp_path):
    """Round 3, F12: SQLite created the journal wherever a dangling link pointed."""
    target = tmp_path / "elsewhere" / "journal.db"
    target.parent.mkdir()
    link = tmp_path / "journal.db"
    link.symlink_to(target)
    with pytest.raises(JournalError, match="which does not exist"):
        FeedbackJournal(link)
    assert not target.exists()
