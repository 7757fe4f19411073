"""The per-user folder where sklocus keeps what it can rebuild.

The assembled all-mpnet-base-v2 model and the command line's encodings of
query texts live there: files that save minutes when kept and cost nothing but
time when deleted.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Where sklocus keeps its cache instead of the platform's folder.
HOME_VARIABLE = "SKLOCUS_HOME"


def user_cache_folder():
    r"""Return the folder of sklocus's per-user cache, by the platform's convention.

    ``$SKLOCUS_HOME`` when set; else ``$XDG_CACHE_HOME/sklocus`` (when set to an
    absolute path, as the XDG specification requires) or ``~/.cache/sklocus``
    on Linux and other Unix systems, ``~/Library/Caches/sklocus`` on macOS and
    ``%LOCALAPPDATA%\sklocus\Cache`` on Windows. Nothing is created.

    Returns
    -------
    pathlib.Path
    """
    home = os.environ.get(HOME_VARIABLE)
    if home:
        return Path(home).expanduser()
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        base = Path(local) if local else Path.home() / "AppData" / "Local"
        return base / "sklocus" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "sklocus"
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "sklocus"
    return Path.home() / ".cache" / "sklocus"
