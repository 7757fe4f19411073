"""The JSON-lines result files the research scripts write and report from."""

from __future__ import annotations

import json


def read_rows(paths):
    """Return every row of the JSON-lines files ``paths``, in order."""
    return [
        json.loads(line)
        for path in paths
        for line in path.read_text().splitlines()
        if line.strip()
    ]
