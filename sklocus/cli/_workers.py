"""``sklocus serve --workers N``: N replicas of one store, in N processes, on one port.

One process routes on one core at a time (its router thread). With ``--workers
N`` the command opens the port and the store, starts the store from MODEL when
it holds no router yet, and then runs N worker processes: each loads the
store's router, follows its log (:mod:`sklocus.serve._replica`) and accepts
connections from the one listening socket, which they share. Routing then
uses N cores, and an outcome sent to any worker is learnt by all.

The command stays as their supervisor: a worker that dies (killed, out of
memory) is started again, and stopping the command (Ctrl-C, SIGINT or SIGTERM,
even where the shell started it with SIGINT ignored) stops every worker after
the requests it is answering. A worker whose supervisor is
gone (killed, out of memory) stops the same way within a second, rather than
serve on alone, unsupervised, holding the port.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing.connection import wait

from sklocus.cli._common import UserError, say

# A worker that exits this many times within _RESTART_WINDOW seconds is not
# started again: something it cannot get past (a port, a store) keeps failing.
_RESTARTS = 5
_RESTART_WINDOW = 60.0
# Seconds a worker has to finish its requests once asked to stop.
_STOP_SECONDS = 30.0
# How often a worker looks whether its supervisor still runs.
_WATCH_SECONDS = 0.5


def run_workers(arguments, token):
    """Serve with ``arguments.workers`` processes; return the exit status."""
    from sklocus._persistence import serialised
    from sklocus.cli._serve import _router_from, _store
    from sklocus.serve import listen
    from sklocus.serve._store import StoreError

    store = _store(arguments)
    if store is None:
        raise UserError(
            "argument --workers: needs --store, the store the workers share (a "
            "SQLite file will do on one machine)"
        )
    try:
        snapshot = store.latest_snapshot()
        if snapshot is None:
            seed, _ = _router_from(arguments)
            say(f"Starting the store {store.location} from {arguments.model}...")
            snapshot = store.seed_snapshot(serialised(seed))
            del seed
        else:
            say(
                f"The store {store.location} holds a router through log entry "
                f"#{snapshot.through}: the workers serve it."
            )
    except StoreError as error:
        raise UserError(f"--store: {error}") from None
    finally:
        store.close()
    try:
        listener = listen(arguments.host, arguments.port)
    except OSError as error:
        raise UserError(str(error)) from None
    threads = max(1, (os.cpu_count() or 1) // arguments.workers)
    port = listener.getsockname()[1]
    say(
        f"Serving on http://{arguments.host}:{port} with {arguments.workers} "
        f"workers, {threads} thread(s) each, every one a replica of "
        f"{store.location} (OpenAPI page at /docs)."
    )
    with listener:
        return _supervise(arguments, listener, token, threads)


def _supervise(arguments, listener, token, threads):
    context = multiprocessing.get_context("spawn")  # torch and fork do not mix

    def start(index):
        worker = context.Process(
            target=_work,
            args=(arguments, listener, token, threads, os.getpid()),
            name=f"sklocus-worker-{index}",
        )
        worker.start()
        return worker

    stopping = False

    def stop(signum, frame):
        nonlocal stopping
        stopping = True

    # SIGINT by a handler of its own too, not as KeyboardInterrupt: a process
    # started in the background by a script (or by a parent that ignores it)
    # inherits SIGINT ignored, and Python then never raises it; and a
    # KeyboardInterrupt could cut a worker's start short, leaving it unowned.
    stop_signals = (signal.SIGTERM, signal.SIGINT)
    previous = {number: signal.signal(number, stop) for number in stop_signals}
    workers = []
    exits = []
    status = 0
    try:
        workers.extend(start(index) for index in range(arguments.workers))
        while not stopping:
            wait([worker.sentinel for worker in workers], timeout=0.5)
            for index, worker in enumerate(workers):
                if worker.exitcode is None or stopping:
                    continue
                now = time.monotonic()
                exits = [at for at in exits if now - at < _RESTART_WINDOW] + [now]
                if len(exits) > _RESTARTS:
                    say(
                        f"Worker {index} exited with status {worker.exitcode}, and "
                        f"workers exited {len(exits)} times within "
                        f"{_RESTART_WINDOW:g} s: stopping."
                    )
                    stopping, status = True, 1
                    break
                say(
                    f"Worker {index} (process {worker.pid}) exited with status "
                    f"{worker.exitcode}; starting it again."
                )
                workers[index] = start(index)
    finally:
        for number, handler in previous.items():
            if handler is not None:  # None: set outside Python, left as it is
                signal.signal(number, handler)
        _stop(workers)
    return status


def _stop(workers):
    """Ask each worker to stop after its requests; kill those that do not."""
    for worker in workers:
        if worker.exitcode is None:
            try:
                os.kill(worker.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + _STOP_SECONDS
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
        if worker.exitcode is None:
            worker.kill()
            worker.join()


def _work(arguments, listener, token, threads, supervisor):
    """One worker: a replica of the store, serving on the shared socket."""
    # Its own process group: a Ctrl-C at the terminal reaches the supervisor,
    # which asks each worker once (a second SIGINT would cut uvicorn short).
    os.setpgrp()
    _stop_without(supervisor)
    if "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    from sklocus.cli._serve import (
        _check_upstreams,
        _limits,
        _replica,
        _store,
        _upstreams,
    )
    from sklocus.serve import run

    try:
        upstreams = _upstreams(arguments)
        service = _replica(_store(arguments), None, arguments, quiet=True)
        if upstreams is not None:
            _check_upstreams(upstreams, service.router, quiet=True)
        service.warm_up()
        run(
            service,
            listener=listener,
            token=token,
            limits=_limits(arguments),
            log_level=arguments.log_level,
            upstreams=upstreams,
        )
    except UserError as error:
        print(f"sklocus serve: worker {os.getpid()}: error: {error}", file=sys.stderr)
        sys.exit(2)


def _stop_without(supervisor):
    """Stop this worker, as SIGTERM does, once process ``supervisor`` is gone.

    In its own process group a worker outlives a supervisor that is killed; a
    thread sees the worker's parent change (to init, or a subreaper) and sends
    the worker SIGTERM: before the server runs that ends the process at once,
    afterwards the server stops after the requests it is answering.
    """

    def watch():
        while os.getppid() == supervisor:
            time.sleep(_WATCH_SECONDS)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="sklocus-supervisor", daemon=True).start()
