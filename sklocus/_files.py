"""Write a file whole or not at all: what every sklocus output goes through."""

from __future__ import annotations

import glob
import os
import shutil
import uuid
from pathlib import Path


def remove_temporaries(path):
    """Remove what a killed write of ``path`` left beside it (``.NAME.*.partial``)."""
    path = Path(path)
    for temporary in path.parent.glob(f".{glob.escape(path.name)}.*.partial"):
        temporary.unlink(missing_ok=True)


def write_atomically(path, write):
    """Write the file ``path`` whole or not at all.

    ``write(temporary)`` writes a temporary file beside ``path``, which is then
    synced to disk and renamed to ``path``: an interruption or a failure leaves
    the previous file as it was, and readers never see half a file. A kill
    leaves the temporary behind, which the next write of ``path`` removes. A
    symbolic link is written through, as ``open`` would: the link stays a link.

    Parameters
    ----------
    path : str or path-like
        The file to write (replaced if it exists, keeping its permissions; a new
        file gets the usual ones, the umask's).
    write : callable
        Called with the temporary's path; writes the whole file there.

    Returns
    -------
    object
        What ``write`` returns.
    """
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    remove_temporaries(path)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.partial")
    try:
        result = write(temporary)
        with open(temporary, "rb+") as file:
            os.fsync(file.fileno())
        if path.exists():
            shutil.copymode(path, temporary)
        os.replace(temporary, path)
        _sync_folder(path.parent)
    finally:
        temporary.unlink(missing_ok=True)
    return result


def _sync_folder(folder):
    """Flush a folder's entries to disk, so that a rename in it survives a crash.

    Where a folder cannot be opened for that (Windows), the rename stands as
    the file system keeps it.
    """
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
