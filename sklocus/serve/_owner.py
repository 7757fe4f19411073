"""One server at a time for the files a single-process server writes.

Two ``sklocus serve`` processes writing back to one model file, or keeping one
feedback journal, drift apart (each learns what it was sent, and the last to
save wins): a change answered by one is missing after both stop. So a server
claims each such file: an exclusive ``flock`` on a lock file beside it
(``FILE.lock``, holding the process id), which the kernel releases when the
process ends, however it ends. The SQLite file itself is never locked this way.
Several processes that must share what they learn are replicas of one store
(``--store``) instead.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class OwnedElsewhere(RuntimeError):
    """A file another server writes."""


def claim(path, what):
    """Claim ``path`` for this process; return the lock's file (keep it open).

    Raises OwnedElsewhere, naming the process that holds it, when another
    server has claimed it.
    """
    lock = Path(f"{path}.lock")
    descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(descriptor, 32).decode(errors="replace").strip()
        os.close(descriptor)
        process = f"process {holder}" if holder.isdigit() else "another process"
        raise OwnedElsewhere(
            f"{path} is the {what} of another sklocus serve ({process}); two "
            "servers writing one file drift apart and lose changes. Stop that "
            "one, or serve both as replicas of one store (--store)"
        ) from None
    os.ftruncate(descriptor, 0)
    os.write(descriptor, str(os.getpid()).encode())
    return os.fdopen(descriptor, "r+b")
