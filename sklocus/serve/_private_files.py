"""Files a server keeps that others must neither read nor write.

A feedback journal or a store holds every query it is sent, and what is written
there is learnt; SQLite gives the ``-wal`` and ``-shm`` files it makes beside a
database the database file's permissions. So these files are created readable
and writable by their owner alone, and existing ones that others may read or
write are refused, as is a link to a file that does not exist (which SQLite
would create wherever it points).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class PrivateFileError(OSError):
    """A server's own file that is missing, exposed or cannot be made."""


def create_private(path, what, *, companions=("-wal", "-shm")):
    """Create ``path`` empty and owner-only if missing; refuse it exposed.

    Parameters
    ----------
    path : path-like
    what : str
        What the file is, for the messages ("feedback journal", "store").
    companions : tuple of str
        Suffixes of files beside it whose modes are checked too.
    """
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise PrivateFileError(
            f"{path} is a link to {os.readlink(path)}, which does not exist; give "
            f"the {what}'s own path"
        )
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        pass
    except OSError as error:
        raise PrivateFileError(f"{path}: cannot create the {what} ({error})") from None
    if os.name != "posix":
        return
    for file in (path, *(Path(f"{path}{suffix}") for suffix in companions)):
        try:
            mode = file.stat().st_mode
        except FileNotFoundError:
            continue
        if mode & 0o077:
            raise PrivateFileError(
                f"{file} may be read or written by others (mode "
                f"{stat.S_IMODE(mode):04o}); the {what} holds every query it is "
                f"sent, and outcomes written there are learnt: chmod 600 {file}"
            )
