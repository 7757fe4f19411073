"""The router thread's fair turns (issue 70, F3).

One client sending batches of long texts one after another made another
client's single query wait 22.5 s: the router thread took calls first come,
first served, whole. Now work comes in turns, and the client charged least
for the thread's time goes next.
"""

import threading
import time

import pytest

from sklocus.serve._router_thread import RouterThread, one_turn
from sklocus.serve._service import _turns

# Far beyond what any turn here takes: reached only when the thread is stuck.
PATIENCE = 20.0


def held(thread):
    """Take ``thread`` with a turn that waits; return the event that frees it."""
    free, taken = threading.Event(), threading.Event()

    def hold():
        taken.set()
        free.wait(PATIENCE)

    thread.submit(hold)
    assert taken.wait(PATIENCE)
    return free


def recorded(log, name, turns):
    """Turns that each append ``name`` to ``log``; the work returns ``name``."""
    for turn in range(turns):
        if turn:
            yield
        log.append(name)
    return name


def test_a_light_client_waits_for_one_turn_of_a_heavy_one():
    thread, log = RouterThread(), []
    free = held(thread)
    heavy = [
        thread.submit_turns(recorded(log, "heavy", 20), client="127.0.0.2")
        for _ in range(3)
    ]
    light = thread.submit_turns(recorded(log, "light", 1), client="127.0.0.1")
    free.set()
    assert light.result(PATIENCE) == "light"
    assert [future.result(PATIENCE) for future in heavy] == ["heavy"] * 3
    # The heavy client came first and was charged for its first turn; the
    # light one, charged nothing, went next, before the other 59.
    assert log.index("light") == 1
    assert len(log) == 61


def test_busy_clients_take_turns_and_each_is_served_in_order():
    thread, log = RouterThread(), []
    free = held(thread)
    for number in range(2):
        for client in ["a", "b"]:
            thread.submit_turns(recorded(log, f"{client}{number}", 5), client=client)
    last = thread.submit_turns(recorded(log, "end", 1), client="c")
    free.set()
    last.result(PATIENCE)
    thread.call(lambda: None)  # every turn queued before this one is done
    for client in ["a", "b"]:
        # A client's own work is done in the order it came...
        mine = [name for name in log if name.startswith(client)]
        assert mine == [f"{client}0"] * 5 + [f"{client}1"] * 5
    # ...and two clients that keep the thread busy share it: neither has all
    # of its work done before the other's begins.
    assert log.index("b0") < log.index("a1") and log.index("a0") < log.index("b1")


def test_cancelled_work_is_dropped_at_its_next_turn():
    thread, log = RouterThread(), []
    free = held(thread)
    waiting = thread.submit_turns(recorded(log, "gone", 3), client="a")
    assert waiting.cancel()
    free.set()
    thread.call(lambda: None)
    assert log == []  # never computed

    started, go_on = threading.Event(), threading.Event()

    def begun():
        log.append("first")
        started.set()
        yield
        go_on.wait(PATIENCE)
        yield
        log.append("never")

    running = thread.submit_turns(begun(), client="a")
    assert started.wait(PATIENCE)
    running.cancel()  # while its second turn runs
    go_on.set()
    thread.call(lambda: None)
    assert log == ["first"]


def test_errors_reach_the_caller_and_the_thread_goes_on():
    thread = RouterThread()

    def failing():
        yield
        raise ValueError("query 'q' is unknown")

    with pytest.raises(ValueError, match="query 'q' is unknown"):
        thread.run_turns(failing())
    assert thread.call(sum, [1, 2]) == 3
    with pytest.raises(TypeError, match="turns must be a generator; got list"):
        thread.submit_turns([1, 2])


def test_work_asked_for_on_the_router_thread_runs_at_once():
    thread = RouterThread()

    def nested():
        # Waiting for the queue here would wait for itself.
        return thread.run_turns(recorded([], "inner", 3))

    assert thread.call(nested) == "inner"
    assert thread.call(threading.get_ident) == thread.call(threading.get_ident)
    assert thread.call(threading.get_ident) != threading.get_ident()


def test_one_turn_returns_what_its_function_returns():
    turns = one_turn(divmod, 7, 2)
    with pytest.raises(StopIteration) as stop:
        next(turns)
    assert stop.value.value == (3, 1)


def test_routings_are_sliced_into_turns_of_a_few_queries():
    short = [f"q{i}" for i in range(40)]
    assert [(s.start, s.stop) for s in _turns(short)] == [(0, 16), (16, 32), (32, 40)]
    long = ["x" * 1_500, "y" * 1_500, "z" * 5_000, "w"]
    # At most 2,000 characters a turn, but never less than one query.
    assert [(s.start, s.stop) for s in _turns(long)] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert list(_turns([])) == []


def queued(*clients):
    """Queues holding one work each for ``clients``, the first the oldest."""
    return {
        client: [type("Queued", (), {"order": order})()]
        for order, client in enumerate(clients)
    }


def test_the_next_turn_goes_to_the_client_whose_turn_would_end_first():
    """Fair queueing's order: a client's start tag plus how long its turns
    take. A client of short turns goes before one a little ahead of it whose
    turns are long (a batch of long texts), rather than wait behind it."""
    thread = RouterThread()
    thread._virtual = 1.0
    thread._finish = {"short": 1.10, "long": 1.05}
    thread._turn_seconds = {"short": 0.03, "long": 0.19}
    thread._queues = queued("long", "short")
    assert thread._next_client() == "short"
    thread._turn_seconds = {"short": 0.03, "long": 0.03}
    assert thread._next_client() == "long"  # ahead, and turns alike


def test_a_client_not_seen_before_is_taken_to_have_typical_turns():
    """A flood from new addresses: with turns taken to be none, each went
    first once, before the client it found waiting."""
    thread = RouterThread()
    thread._virtual = 1.0
    thread._finish = {"known": 1.10}
    thread._turn_seconds = {"known": 0.03, "flood": 0.19}
    thread._typical_turn = 0.17
    thread._queues = queued("new", "known")
    assert thread._next_client() == "known"  # 1.13 against 1.0 + 0.17
    thread._finish = {"known": 1.30}
    assert thread._next_client() == "new"


def test_time_used_alone_is_not_held_against_a_client():
    """A client that kept the thread busy while no one else wanted it shares
    it equally with a newcomer, rather than waiting while the newcomer
    catches up (80 ms of its own, here, with a charge that decayed)."""
    thread, log = RouterThread(), []
    started = threading.Event()

    def steady(name, turns):
        for turn in range(turns):
            if turn == 40:
                started.set()
            time.sleep(0.002)
            log.append(name)
            yield

    alone = thread.submit_turns(steady("alone", 200), client="alone")
    assert started.wait(PATIENCE)
    newcomer = thread.submit_turns(steady("new", 20), client="new")
    newcomer.result(PATIENCE)
    alone.result(PATIENCE)
    after = log[log.index("new") :]
    assert "alone" in after[:4], after[:24]
