"""Which code produced a benchmark's figures: the commit the scripts name in docs."""

from __future__ import annotations

import subprocess


def commit():
    """The checked-out commit, marked when the tree has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], capture_output=True, text=True
        ).stdout.strip()
    except OSError:
        return "unknown"
    return f"{head}{' (with uncommitted changes)' if dirty else ''}" or "unknown"
