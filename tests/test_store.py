"""The store of a served router's changes, on SQLite and on PostgreSQL.

Each contract test runs on both backends: a SQLite file, and a database of its
own on a throwaway PostgreSQL server (``conftest.postgresql_server``).
"""

import os
import signal
import subprocess
import sys
import threading

import pytest

from sklocus.serve._store import (
    LeaseLost,
    LogEntry,
    StoreError,
    StoreUnavailable,
    open_store,
    redacted,
)
from sklocus.serve._store._sqlite import SQLiteStore

pytestmark = pytest.mark.slow


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request, tmp_path):
    if request.param == "sqlite":
        return str(tmp_path / "store.db")
    return request.getfixturevalue("postgresql_database")


@pytest.fixture
def store(location):
    with open_store(location) as store:
        yield store


def outcomes(n, start=0):
    return [
        LogEntry.outcome(f"query {start + i} ✓", f"m{i % 3}", (i % 7) / 7)
        for i in range(n)
    ]


# -- the log ----------------------------------------------------------------------


def test_entries_keep_their_order_and_every_field(store):
    assert store.last_id() == 0
    assert store.entries_after(0, 10) == []
    first = outcomes(3)
    changes = [
        LogEntry.outcome("q", "m", 0.1, query_group="maths"),
        LogEntry("model", model="new", body='{"evaluations": {"q": 1.0}}'),
        LogEntry("removal", model="m0"),
        LogEntry("fold"),
    ]
    assert store.append(first) == 3
    assert store.append(changes) == 7
    assert store.append([]) == 7
    read = store.entries_after(0, 100)
    assert [entry.id for entry in read] == list(range(1, 8))
    for kept, given in zip(read, first + changes):
        assert kept.columns() == given.columns()
    assert read[0].score == 0.0 and read[2].score == 2 / 7  # exact floats
    assert [entry.id for entry in store.entries_after(5, 100)] == [6, 7]
    assert [entry.id for entry in store.entries_after(2, 2)] == [3, 4]
    assert store.last_id() == 7


def test_an_entry_of_no_known_kind_is_refused():
    with pytest.raises(ValueError, match="kind is one of outcome, model"):
        LogEntry("outcomes")


def test_a_request_key_appends_once(store):
    assert store.append(outcomes(2), key="request-1") == 2
    assert store.append(outcomes(5), key="request-1") == 2
    assert store.append(outcomes(1), key="request-2") == 3
    assert store.last_id() == 3


def test_ids_are_given_and_seen_in_one_order_across_writers(location):
    """Appenders race; a reader never sees an id before every id below it."""
    writers = [open_store(location) for _ in range(3)]
    reader = open_store(location)
    batches, seen, stop = 40, [], threading.Event()

    def write(store, w):
        for b in range(batches):
            store.append(outcomes(5, start=1000 * w + 10 * b))

    def read():
        position = 0
        while not stop.is_set() or position < 3 * batches * 5:
            for entry in reader.entries_after(position, 1000):
                seen.append(entry.id)
                position = entry.id

    threads = [
        threading.Thread(target=write, args=(s, w)) for w, s in enumerate(writers)
    ]
    follower = threading.Thread(target=read)
    follower.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    follower.join(timeout=60)
    assert seen == list(range(1, 3 * batches * 5 + 1))
    # Each append's entries are consecutive.
    entries = reader.entries_after(0, 10_000)
    for first in range(0, len(entries), 5):
        numbers = {int(e.query.split()[1]) // 10 for e in entries[first : first + 5]}
        assert len(numbers) == 1
    for store in [*writers, reader]:
        store.close()


# -- snapshots and the lease --------------------------------------------------------


def test_a_snapshot_is_written_by_the_lease_holder_alone(location):
    with open_store(location) as one, open_store(location) as two:
        assert one.latest_snapshot() is None
        # The first model file offered starts the store, lease or not.
        assert one.seed_snapshot(b"first").content == b"first"
        assert two.seed_snapshot(b"second").content == b"first"
        assert one.latest_snapshot().through == 0
        with pytest.raises(LeaseLost, match="does not hold it"):
            one.save_snapshot(b"model", 3)
        assert one.try_lease() and one.holds_lease
        assert not two.try_lease() and not two.holds_lease
        assert one.try_lease()  # held already
        for through in (3, 5, 9):
            one.save_snapshot(
                f"model through {through}".encode(), through, {"learnt": {"m": through}}
            )
        latest = two.latest_snapshot()
        assert (latest.through, latest.content) == (9, b"model through 9")
        assert latest.state == {"learnt": {"m": 9}}
        one.release_lease()
        assert two.try_lease()
        two.save_snapshot(b"model through 11", 11)
        assert one.latest_snapshot().content == b"model through 11"


def test_a_lease_ends_with_the_process_that_held_it(location):
    """SIGKILLed holding the lease: the next replica takes it."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from sklocus.serve._store import open_store\n"
            "store = open_store(sys.argv[1])\n"
            "assert store.try_lease()\n"
            "print('held', flush=True)\n"
            "time.sleep(600)\n",
            location,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with open_store(location) as store:
            assert not store.try_lease()
            holder.send_signal(signal.SIGKILL)
            holder.wait(timeout=30)
            for _ in range(100):  # the server notices the session ended
                if store.try_lease():
                    break
                threading.Event().wait(0.1)
            assert store.holds_lease
    finally:
        holder.kill()
        holder.wait()


def test_a_damaged_snapshot_is_refused(tmp_path):
    path = tmp_path / "store.db"
    with SQLiteStore(path) as store:
        store.try_lease()
        store.save_snapshot(b"model bytes", 4)
        store._db.execute("UPDATE snapshots SET content = ?", (b"model bytez",))
        with pytest.raises(StoreError, match="snapshot through #4 is damaged"):
            store.latest_snapshot()


# -- SQLite --------------------------------------------------------------------------


def test_a_sqlite_store_is_owner_only_and_refuses_other_files(tmp_path):
    path = tmp_path / "store.db"
    SQLiteStore(path).close()
    assert os.stat(path).st_mode & 0o777 == 0o600
    with pytest.raises(StoreError, match="is a folder, not a store"):
        SQLiteStore(tmp_path)
    from sklocus.serve._journal import FeedbackJournal

    FeedbackJournal(tmp_path / "journal.db").close()
    with pytest.raises(StoreError, match="is a feedback journal of other tables"):
        SQLiteStore(tmp_path / "journal.db")
    os.chmod(path, 0o644)
    with pytest.raises(StoreError, match=r"may be read or written by others \(mode"):
        SQLiteStore(path)


def test_a_full_disk_is_unavailable_and_appends_nothing(tmp_path):
    with SQLiteStore(tmp_path / "store.db") as store:
        store.append(outcomes(1))
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")
        big = [LogEntry.outcome("q" * 5000, "m", 1.0)] * 50
        with pytest.raises(StoreUnavailable, match="database or disk is full"):
            store.append(big)
        assert store.last_id() == 1


# -- PostgreSQL ----------------------------------------------------------------------


def test_a_password_is_never_shown():
    assert (
        redacted("postgresql://router:s3cret@db:5432/sklocus?sslmode=require")
        == "postgresql://router:***@db:5432/sklocus?sslmode=require"
    )
    assert redacted("postgres://db/x?password=s3cret&user=u") == (
        "postgres://db/x?password=***&user=u"
    )
    assert redacted("host=db password='s3 cret' dbname=x") == (
        "host=db password=*** dbname=x"
    )
    assert redacted("/var/lib/sklocus/store.db") == "/var/lib/sklocus/store.db"


def test_an_unreachable_server_is_unavailable_then_served_again(
    postgresql_server, postgresql_database
):
    store = open_store(postgresql_database)
    password = postgresql_server.password
    assert password not in repr(store)
    store.append(outcomes(2))
    postgresql_server.stop()
    try:
        with pytest.raises(StoreUnavailable) as raised:
            store.append(outcomes(1))
        assert password not in str(raised.value)
        with pytest.raises(StoreUnavailable):
            store.last_id()
    finally:
        postgresql_server.start()
    assert store.append(outcomes(1)) == 3  # connected again
    store.close()


def test_open_store_reads_the_location(tmp_path, postgresql_database):
    with open_store(tmp_path / "a.db") as store:
        assert type(store).__name__ == "SQLiteStore"
    with open_store(f"sqlite://{tmp_path}/b.db") as store:
        assert store.location == f"{tmp_path}/b.db"
    with open_store(postgresql_database) as store:
        assert type(store).__name__ == "PostgreSQLStore"
        assert "***" in store.location


def test_trying_for_the_lease_keeps_one_session(postgresql_database):
    """A replica tries at each reading of the log: one connection, not one a try."""
    with open_store(postgresql_database) as holder:
        with open_store(postgresql_database) as other:
            assert holder.try_lease() and not other.try_lease()
            connect, made = other._connect, []
            other._connect = lambda: made.append(1) or connect()
            for _ in range(20):
                assert not other.try_lease()
            assert made == []
            holder.release_lease()
            assert other.try_lease()  # on the session it kept trying on
            assert made == []
