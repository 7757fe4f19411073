"""Replicas of a served router that follow one store's log (sklocus.serve._replica).

Each test runs on a SQLite store and on a database of its own on a throwaway
PostgreSQL server (``conftest.postgresql_server``).
"""

import os
import signal
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest
from sklearn.frozen import FrozenEstimator
from tiny import TINY_NETWORK

from sklocus import LocusEmbedder, LocusRouter
from sklocus.datasets import make_evaluations
from sklocus.evaluations import to_matrix
from sklocus.serve import RequestError
from sklocus.serve._replica import ReplicaService
from sklocus.serve._store import LogEntry, StoreError, StoreUnavailable, open_store

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool():
    data = make_evaluations(
        n_models=6, n_queries=120, evals_per_model=(20, 50), query_dim=8, random_state=3
    )
    embedder = LocusEmbedder(query_encoder=data.encoder, **TINY_NETWORK).fit(
        data.evaluation_sets
    )
    scores, queries = to_matrix(data.evaluation_sets)
    Y = pd.DataFrame(scores, columns=data.model_names)
    router = LocusRouter(FrozenEstimator(embedder), refine_steps=3).fit(queries, Y)
    return data, router


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    return request.getfixturevalue("postgresql_database")


def replica(location, seed=None, **options):
    """A replica that folds when asked (no thread), marking at once."""
    options = {"fold_interval": 0.0, "snapshot_interval": 3600.0, **options}
    return ReplicaService(open_store(location), seed, **options)


def outcomes(data, n, seed=0):
    rng = np.random.default_rng(seed)
    return [
        {
            "query": data.query_ids[int(rng.integers(len(data.query_ids)))],
            "model": data.model_names[int(rng.integers(len(data.model_names)))],
            "score": float(rng.integers(2)),
        }
        for _ in range(n)
    ]


def probabilities(service, data):
    return service.router.predict_correctness(data.query_ids[:60])


def test_replicas_that_folded_through_one_id_agree_bit_for_bit(pool, location):
    data, router = pool
    one, two = replica(location, router), replica(location)
    try:
        before = probabilities(two, data)
        np.testing.assert_array_equal(before, probabilities(one, data))
        answer = one.feedback(outcomes(data, 30))
        assert answer["accepted"] == 30 and answer["through"] == 30
        two.feedback(outcomes(data, 20, seed=1))
        one.follow()  # the lease's holder marks the fold
        two.follow()
        assert one.position == two.position == 51  # 50 outcomes, then the mark
        after = probabilities(two, data)
        np.testing.assert_array_equal(after, probabilities(one, data))
        assert not np.array_equal(after, before)
        learnt = one.outcomes_learnt()
        assert sum(learnt.values()) == 50 and learnt == two.outcomes_learnt()
        assert one.pending_outcomes() == two.pending_outcomes() == 0
        health = two.health()
        assert health["position"] == 51 and health["lag"] == 0
        assert one.health()["lease"] and not health["lease"]
    finally:
        one.close()
        two.close()


def test_outcomes_wait_for_the_mark_of_the_lease_holder(pool, location):
    data, router = pool
    leader, follower = replica(location, router), replica(location)
    try:
        follower.feedback(outcomes(data, 10))
        follower.follow()  # read, not learnt: no mark yet
        assert follower.position == 0 and follower.pending_outcomes() == 10
        leader.follow()
        follower.follow()
        assert follower.position == leader.position == 11
    finally:
        leader.close()
        follower.close()


def test_changes_made_on_one_replica_reach_every_replica(pool, location):
    data, router = pool
    one, two = replica(location, router), replica(location)
    try:
        evaluations = {q: float(i % 2) for i, q in enumerate(data.query_ids[:30])}
        answer = one.add_model("newcomer", evaluations)
        assert answer == {"model": "newcomer", "n_evaluations": 30, "n_models": 7}
        two.follow()
        assert "newcomer" in two.router.classes_.tolist()
        # The same name onboarded twice through two replicas: the log's first
        # wins, and the other is answered with the reason.
        with pytest.raises(RequestError, match="already served") as raised:
            two.add_model("newcomer", evaluations)
        assert raised.value.status == 409
        removed = data.model_names[0]
        assert two.remove_model(removed)["n_models"] == 6
        one.follow()
        assert removed not in one.router.classes_.tolist()
        np.testing.assert_array_equal(
            probabilities(one, data), probabilities(two, data)
        )
        assert one.position == two.position
    finally:
        one.close()
        two.close()


def test_a_removal_drops_the_outcomes_waiting_for_its_model(pool, location):
    """A model onboarded again under the name never learns its namesake's."""
    data, router = pool
    one = replica(location, router, fold_interval=3600.0)  # no mark meanwhile
    try:
        name = data.model_names[1]
        sent = [dict(outcome, model=name) for outcome in outcomes(data, 5)]
        one.feedback(sent)
        one.remove_model(name)
        evaluations = {q: 1.0 for q in data.query_ids[:20]}
        one.add_model(name, evaluations)
        one.fold_interval = 0.0
        one.follow()
        assert one.outcomes_learnt().get(name, 0) == 0
        assert one.pending_outcomes() == 0
    finally:
        one.close()


def test_a_replica_started_later_loads_the_snapshot_and_folds_the_tail(pool, location):
    data, router = pool
    one = replica(location, router, snapshot_interval=0.0)  # a snapshot a reading
    late = None
    try:
        one.feedback(outcomes(data, 12))
        one.follow()
        # Outcomes still wait for a mark when a change comes: the snapshot taken
        # after it must not leave them behind.
        one.fold_interval = 3600.0
        one.feedback(outcomes(data, 7, seed=2))
        one.add_model("late", {q: 0.5 for q in data.query_ids[:10]})
        with open_store(location) as store:
            assert store.latest_snapshot().through == one.position
        late = replica(location)
        one.fold_interval = 0.0
        one.feedback(outcomes(data, 3, seed=4))
        one.follow()
        late.follow()
        assert late.position == one.position
        np.testing.assert_array_equal(
            probabilities(late, data), probabilities(one, data)
        )
        assert late.outcomes_learnt() == one.outcomes_learnt()
        assert sum(late.outcomes_learnt().values()) == 22
    finally:
        one.close()
        if late is not None:
            late.close()


def test_a_retried_request_is_kept_once(pool, location):
    data, router = pool
    one = replica(location, router)
    try:
        sent = outcomes(data, 4)
        first = one.feedback(sent, key="client-7:request-1")
        again = one.feedback(sent, key="client-7:request-1")
        assert first["through"] == again["through"] == 4
        with open_store(location) as store:
            assert store.last_id() == 4
    finally:
        one.close()


def test_a_store_without_a_router_needs_a_model_file(location):
    with pytest.raises(StoreError, match="holds no router yet; give the model file"):
        replica(location)


def test_the_folding_thread_learns_what_any_replica_was_sent(pool, location):
    data, router = pool
    one = replica(location, router, fold_interval=0.2, poll_interval=0.05)
    two = replica(location, fold_interval=0.2, poll_interval=0.05)
    one.start_folding()
    two.start_folding()
    try:
        through = two.feedback(outcomes(data, 8))["through"]
        deadline = time.monotonic() + 30
        while min(one.position, two.position) <= through:
            assert time.monotonic() < deadline, "not learnt within 30 s"
            time.sleep(0.05)
        assert sum(one.outcomes_learnt().values()) == 8
    finally:
        one.close()
        two.close()


def test_an_unreachable_database_refuses_writes_and_routing_goes_on(
    pool, postgresql_server, postgresql_database
):
    data, router = pool
    one = replica(postgresql_database, router)
    try:
        one.feedback(outcomes(data, 3))
        one.follow()
        postgresql_server.stop()
        try:
            with pytest.raises(RequestError, match="send it again later") as raised:
                one.feedback(outcomes(data, 2))
            assert raised.value.status == 503
            assert postgresql_server.password not in raised.value.message
            assert len(one.route([data.query_ids[0]], k=1)) == 1
        finally:
            postgresql_server.start()
        one.feedback(outcomes(data, 2))
        one.follow()
        assert sum(one.outcomes_learnt().values()) == 5
    finally:
        one.close()


def test_the_log_holds_each_kind_of_change(pool, location):
    """What a replica appends is what every replica reads."""
    data, router = pool
    one = replica(location, router)
    try:
        one.feedback(outcomes(data, 1))
        one.add_model("x", {data.query_ids[0]: 1.0})
        one.remove_model("x")
        with open_store(location) as store:
            kinds = [entry.kind for entry in store.entries_after(0, 100)]
        assert kinds[0] == "outcome" and "model" in kinds and kinds[-1] == "removal"
        assert LogEntry("fold").kind == "fold"
    finally:
        one.close()


# -- sklocus serve --store ------------------------------------------------------------


def test_two_served_replicas_share_what_either_is_sent(pool, location, tmp_path):
    """Two `sklocus serve --store` processes: one memory, from either door."""
    pytest.importorskip("fastapi")
    import httpx
    from test_serve import Server

    import sklocus

    data, router = pool
    model = tmp_path / "router.sklocus"
    sklocus.save(router, model)
    options = ["--store", location, "--fold-interval", "0.1"]
    one = Server(model, *options, cwd=tmp_path)
    two = Server(model, *options, cwd=tmp_path)
    try:
        sent = outcomes(data, 6)
        answer = httpx.post(
            f"{one.url}/feedback",
            json={"outcomes": sent},
            headers={"Idempotency-Key": "request-1"},
        )
        assert answer.status_code == 200 and answer.json()["through"] == 6
        again = httpx.post(
            f"{two.url}/feedback",
            json={"outcomes": sent},
            headers={"Idempotency-Key": "request-1"},
        )
        assert again.json()["through"] == 6  # kept once
        onboarded = httpx.post(
            f"{two.url}/models",
            json={"name": "newcomer", "evaluations": {data.query_ids[0]: 1.0}},
            timeout=60,
        )
        assert onboarded.status_code == 201, onboarded.text
        deadline = time.monotonic() + 60
        while True:
            healths = [httpx.get(f"{s.url}/health").json() for s in (one, two)]
            if healths[0]["position"] == healths[1]["position"] and all(
                h["lag"] == 0 and h["n_models"] == 7 for h in healths
            ):
                break
            assert time.monotonic() < deadline, healths
            time.sleep(0.1)
        assert sorted(h["lease"] for h in healths) == [False, True]
        listed = [httpx.get(f"{s.url}/models").json()["models"] for s in (one, two)]
        assert listed[0] == listed[1]
        assert sum(m["n_outcomes"] for m in listed[0]) == 6
        probe = {"queries": data.query_ids[:40]}
        predicted = [
            httpx.post(f"{s.url}/predict", json=probe).json() for s in (one, two)
        ]
        assert predicted[0] == predicted[1]
    finally:
        for server in (one, two):
            code, stderr = server.stop()
            assert code == 0, stderr
    password = urllib.parse.urlsplit(location).password
    if password is not None:  # the server's own output never shows it
        assert password not in stderr
    assert "store" in stderr


def test_a_store_is_not_kept_beside_a_journal_or_a_write_back(pool, tmp_path, capsys):
    import sklocus
    from sklocus.cli import main

    model = tmp_path / "router.sklocus"
    sklocus.save(pool[1], model)
    for flag in (["--feedback-journal", "j.db"], ["--write-back"]):
        code = main(["serve", str(model), "--store", str(tmp_path / "s.db"), *flag])
        assert code != 0
        assert f"argument {flag[0]}: not with --store" in capsys.readouterr().err


def _children(pid):
    """The processes ``pid`` started that are sklocus workers."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as listed:
            found += [int(child) for child in listed.read().split()]
    return [
        child
        for child in found
        if b"spawn_main" in open(f"/proc/{child}/cmdline", "rb").read()
    ]


def _healths(url, n=16):
    """``/health`` from ``n`` requests at once, each on a new connection."""
    import httpx

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: httpx.get(f"{url}/health").json(), range(n)))


def _phase(what, seconds=60.0):
    """Return a function to call in each round of a wait, failing after ``seconds``."""
    deadline = time.monotonic() + seconds

    def wait(seen=None):
        assert time.monotonic() < deadline, (
            f"waited {seconds:.0f} s for {what} ({seen})"
        )
        time.sleep(0.1)

    return wait


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")
def test_workers_share_one_port_and_one_memory_and_come_back(pool, tmp_path):
    pytest.importorskip("fastapi")
    import httpx
    from test_serve import Server

    import sklocus

    data, router = pool
    model = tmp_path / "router.sklocus"
    sklocus.save(router, model)
    served = Server(
        model, "--store", tmp_path / "store.db", "--workers", "2", cwd=tmp_path
    )
    try:
        workers = _children(served.process.pid)
        assert len(workers) == 2
        # Each phase has its own minute: under a loaded machine a worker started
        # again takes seconds to import and load before it answers.
        seen = set()
        wait = _phase("both workers to answer, one holding the lease")
        while seen != {True, False}:
            wait(seen)
            seen |= {health["lease"] for health in _healths(served.url)}
        answer = httpx.post(
            f"{served.url}/feedback", json={"outcomes": outcomes(data, 5)}
        )
        assert answer.status_code == 200
        wait = _phase("both workers to learn 5 outcomes and their mark")
        while not all(health["position"] == 6 for health in _healths(served.url)):
            wait()
        os.kill(workers[0], signal.SIGKILL)
        wait = _phase("the killed worker to be started again")
        while (
            sorted(_children(served.process.pid)) == sorted(workers)
            or len(_children(served.process.pid)) != 2
        ):
            wait()
        wait = _phase("the new worker to catch up")
        while not all(h["position"] == 6 for h in _healths(served.url)):
            wait()
        workers = _children(served.process.pid)
    finally:
        code, stderr = served.stop()
    assert code == 0, stderr
    assert "with 2 workers" in stderr
    assert "exited with status -9; starting it again" in stderr
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")
def test_workers_stop_on_sigint_though_started_with_it_ignored(pool, tmp_path):
    """Found in full runs of the suite: a shell script's background job (and a
    process whose parent ignores SIGINT) starts with SIGINT ignored, and Python
    then never raises KeyboardInterrupt: the supervisor ignored SIGINT and its
    workers served on."""
    pytest.importorskip("fastapi")
    from test_serve import Server

    import sklocus

    _, router = pool
    model = tmp_path / "router.sklocus"
    sklocus.save(router, model)
    # Ignored signals stay ignored across fork and exec (POSIX). Without its
    # own handler the supervisor ignored the SIGINT of stop() (60 s, failed).
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        served = Server(
            model, "--store", tmp_path / "store.db", "--workers", "2", cwd=tmp_path
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    try:
        workers = _children(served.process.pid)
    finally:
        code, stderr = served.stop()  # SIGINT
    assert code == 0, stderr
    assert workers and not any(_running(pid) for pid in workers)


def _running(pid):
    """Whether process ``pid`` runs (neither gone nor a zombie left unreaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")
def test_workers_stop_when_their_supervisor_is_killed(pool, tmp_path):
    """Found by a benchmark: a supervisor killed (by a test that timed out)
    left its two workers serving the port, unsupervised, for good."""
    pytest.importorskip("fastapi")
    from test_serve import Server

    import sklocus

    model = tmp_path / "router.sklocus"
    sklocus.save(pool[1], model)
    served = Server(
        model, "--store", tmp_path / "store.db", "--workers", "2", cwd=tmp_path
    )
    workers = _children(served.process.pid)
    assert len(workers) == 2
    served.process.kill()
    served.process.wait()
    wait = _phase("the workers to stop without their supervisor")
    try:
        while any(_running(pid) for pid in workers):
            wait([pid for pid in workers if _running(pid)])
    finally:
        for pid in filter(_running, workers):
            os.kill(pid, signal.SIGKILL)


def test_a_second_server_on_files_another_writes_is_refused(pool, tmp_path, capsys):
    """Round of issue 71: two servers on one journal drifted apart (11 models
    against 13) and lost an onboarding; under a store they are replicas."""
    pytest.importorskip("fastapi")
    from test_serve import Server

    import sklocus
    from sklocus.cli import main

    model = tmp_path / "router.sklocus"
    sklocus.save(pool[1], model)
    first = Server(model, "--write-back", "--feedback-journal", "j.db", cwd=tmp_path)
    try:
        for flags, blamed in [
            (["--feedback-journal", str(tmp_path / "j.db")], "--feedback-journal"),
            (["--write-back"], "--write-back"),
        ]:
            assert main(["serve", str(model), *flags, "--port", "0"]) == 2
            error = capsys.readouterr().err
            assert f"argument {blamed}: " in error
            assert f"of another sklocus serve (process {first.process.pid})" in error
            assert "replicas of one store (--store)" in error
    finally:
        code, stderr = first.stop()
        assert code == 0, stderr
    # Once it stopped, the files are free.
    second = Server(model, "--write-back", "--feedback-journal", "j.db", cwd=tmp_path)
    second.stop()


def test_a_snapshot_that_cannot_be_written_leaves_the_previous(
    pool, location, monkeypatch
):
    data, router = pool
    one = replica(location, router, snapshot_interval=0.0)
    try:

        def refused(*args, **kwargs):
            raise StoreUnavailable("the disk is full")

        saved = one.store.save_snapshot
        monkeypatch.setattr(one.store, "save_snapshot", refused)
        one.feedback(outcomes(data, 4))
        one.follow()  # learns; the snapshot fails, and is logged
        assert one.position == 5 and sum(one.outcomes_learnt().values()) == 4
        with open_store(location) as store:
            assert store.latest_snapshot().through == 0  # the seed, whole
        late = replica(location)  # starts from the seed and folds the log
        try:
            np.testing.assert_array_equal(
                probabilities(late, data), probabilities(one, data)
            )
        finally:
            late.close()
        monkeypatch.setattr(one.store, "save_snapshot", saved)
        one.feedback(outcomes(data, 2, seed=1))
        one.follow()
        with open_store(location) as store:
            assert store.latest_snapshot().through == one.position == 8
    finally:
        one.close()
