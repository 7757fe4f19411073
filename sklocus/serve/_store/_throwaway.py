"""A throwaway PostgreSQL server, started from the installed binaries.

For trying replicas on one machine, and for the tests and benchmarks of the
PostgreSQL store: :class:`ThrowawayServer` makes a database cluster in a
temporary folder, serves it on a free port of 127.0.0.1 with a password, and
removes it when stopped. The server refuses to run as root, so as root it runs
as the ``postgres`` user (which the Debian package creates) through
``runuser``.

The binaries are found on ``PATH`` (``initdb``, ``pg_ctl``), else in the
newest ``/usr/lib/postgresql/*/bin`` (Debian's layout); :func:`binaries`
returns None when there are none.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

USER = "sklocus"


def binaries():
    """Return the folder holding ``initdb`` and ``pg_ctl``, or None."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).resolve().parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda path: (
            int(path.parent.parent.name) if path.parent.parent.name.isdigit() else 0
        ),
    )
    return versions[-1].parent if versions else None


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ThrowawayServer:
    """A PostgreSQL server of its own, for one test session or benchmark.

    Parameters
    ----------
    fsync : bool, default=True
        Whether the server flushes commits to disk: off makes tests faster;
        benchmarks keep it on, as a real server has it.
    """

    def __init__(self, fsync=True):
        self.bin = binaries()
        if self.bin is None:
            raise FileNotFoundError(
                "no PostgreSQL server binaries (initdb, pg_ctl) on PATH or in "
                "/usr/lib/postgresql/*/bin; apt-get install postgresql"
            )
        self.fsync = fsync
        self.password = secrets.token_hex(12)
        self.folder = Path(tempfile.mkdtemp(prefix="sklocus-postgresql-"))
        self.data = self.folder / "data"
        self.port = None
        self._as = []
        if os.geteuid() == 0:  # the server refuses to run as root
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                raise PermissionError(
                    "the PostgreSQL server refuses to run as root, and there is no "
                    "postgres user to run it as (the postgresql package makes one)"
                ) from None
            os.chown(self.folder, owner.pw_uid, owner.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        password_file = self.folder / "password"
        password_file.write_text(self.password)
        if self._as:
            os.chown(password_file, owner.pw_uid, owner.pw_gid)
        self._command(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            USER,
            "--auth=scram-sha-256",
            f"--pwfile={password_file}",
            "--no-sync",
            "--encoding=UTF8",
            "--locale=C",
        )
        password_file.unlink()

    def _command(self, program, *arguments, check=True):
        return subprocess.run(
            [*self._as, str(self.bin / program), *arguments],
            check=check,
            capture_output=True,
            text=True,
            timeout=120,
        )

    @property
    def url(self):
        """The database's URI, with the password."""
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/postgres"

    def start(self):
        """Start serving (on the port of the last start, or a free one)."""
        if self.port is None:
            self.port = _free_port()
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 "
            f"-c unix_socket_directories={self.folder} "
            f"-c fsync={'on' if self.fsync else 'off'} -c max_connections=200"
        )
        self._command(
            "pg_ctl",
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.folder / "log"),
            "-w",
            "start",
        )
        return self

    def stop(self, mode="fast"):
        """Stop the server; ``mode="immediate"`` stops it as a crash would."""
        self._command("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self):
        self.stop()
        return self.start()

    def remove(self):
        """Stop the server, if it runs, and delete its files."""
        self._command(
            "pg_ctl", "-D", str(self.data), "-m", "immediate", "stop", check=False
        )
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.remove()
