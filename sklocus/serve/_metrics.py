"""``GET /metrics``: a served router's figures in Prometheus's text format.

Each process answers for itself: the requests it answered by route and status,
the folds it computed and how long they took, what waits to be learnt, and, as
a replica of a store, its position in the log, its lag and whether it holds the
lease. With ``--workers N`` a scrape reaches one worker: each series carries
the process id (``process``), so series of different workers never mix.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

# Requests whose path matched no route are counted under this route label, so
# that a client cannot make a series per path it invents.
UNMATCHED = "unmatched"


class FoldTimes:
    """How many folds a service computed, and how long they took."""

    def __init__(self):
        self._lock = threading.Lock()
        self.count = 0
        self.seconds = 0.0
        self.last = 0.0

    def record(self, seconds):
        with self._lock:
            self.count += 1
            self.seconds += seconds
            self.last = seconds


class RequestCounts:
    """Requests answered, by route (its path template) and status."""

    def __init__(self):
        self._counts = Counter()

    def count(self, route, status):
        self._counts[route, status] += 1

    def items(self):
        return sorted(self._counts.items())


def _escaped(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _series(name, labels, value):
    shown = ",".join(f'{key}="{_escaped(v)}"' for key, v in labels.items())
    return f"{name}{{{shown}}} {value!r}" if shown else f"{name} {value!r}"


def exposition(service, requests):
    """Return the text ``GET /metrics`` answers, in Prometheus.s format 0.0.4."""
    from sklocus._versioning import __version__

    process = {"process": str(os.getpid())}
    lines = []

    def metric(name, kind, text, samples):
        lines.append(f"# HELP {name} {text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            lines.append(_series(name, {**process, **labels}, value))

    health = service.health()
    metric(
        "sklocus_info",
        "gauge",
        "The sklocus version serving (always 1).",
        [({"version": __version__}, 1)],
    )
    metric(
        "sklocus_requests_total",
        "counter",
        "Requests answered, by route and status.",
        [
            ({"route": route, "status": str(status)}, count)
            for (route, status), count in requests.items()
        ],
    )
    metric("sklocus_models", "gauge", "Models served.", [({}, health["n_models"])])
    metric(
        "sklocus_pending_outcomes",
        "gauge",
        "Outcomes kept and not yet learnt.",
        [({}, health["pending_outcomes"])],
    )
    folds = service.fold_times
    metric(
        "sklocus_fold_duration_seconds",
        "summary",
        "Folds of changes into the served router, and the seconds they took.",
        [],
    )
    lines.append(_series("sklocus_fold_duration_seconds_count", process, folds.count))
    lines.append(_series("sklocus_fold_duration_seconds_sum", process, folds.seconds))
    metric(
        "sklocus_fold_last_seconds",
        "gauge",
        "Seconds the last fold took.",
        [({}, folds.last)],
    )
    if health.get("position") is not None:
        metric(
            "sklocus_log_position",
            "gauge",
            "Id of the last entry of the store's log this replica has folded.",
            [({}, health["position"])],
        )
        metric(
            "sklocus_log_lag",
            "gauge",
            "Entries of the store's log this replica knows of and has not folded.",
            [({}, health["lag"])],
        )
        metric(
            "sklocus_lease",
            "gauge",
            "1 while this replica holds the store's lease (writes marks and "
            "snapshots), else 0.",
            [({}, int(health["lease"]))],
        )
    return "\n".join(lines) + "\n"
