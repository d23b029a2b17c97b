"""A throwaway PostgreSQL cluster on a unix socket of its own, for the store tests.

Uses the server binaries of Debian's ``postgresql`` package
(``/usr/lib/postgresql/<version>/bin``; ``.ci/run`` installs it, or set
``LLMGW_PG_BIN`` to another bin directory). ``initdb`` refuses to run as root, so
as root the cluster is created and run as the ``postgres`` system user (or
``nobody`` when there is none), in a private temporary directory owned by it.

The cluster listens on no TCP port at all (``listen_addresses = ''``), only on a unix
socket in its own directory, and trusts those connections: PostgreSQL cannot listen on
port 0 and say which port it got, and a TCP port picked beforehand could be taken
before it binds. Its URLs name the socket directory
(``postgresql://postgres@/db?host=/tmp/llmgw-pg-…``, libpq's form). It is removed by
:meth:`TempCluster.stop`. With ``fast=True`` (the tests) it runs without fsync;
benchmarks pass ``fast=False``.

Not finding PostgreSQL is an error, never a skip: the store must be tested on both
backends.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg


class PostgresNotAvailable(RuntimeError):
    pass


def find_bindir() -> Path:
    """The bin directory of the newest installed PostgreSQL server."""
    override = os.environ.get("LLMGW_PG_BIN")
    if override:
        candidates = [override]
    else:

        def version(path: str) -> tuple[int, ...]:
            found = re.search(r"/postgresql/([\d.]+)/bin$", path)
            return tuple(int(p) for p in found.group(1).split(".")) if found else (0,)

        candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    for bindir in candidates:
        if (Path(bindir) / "initdb").is_file() and (Path(bindir) / "pg_ctl").is_file():
            return Path(bindir)
    raise PostgresNotAvailable(
        "PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin "
        "(install Debian's package: apt-get install -y postgresql; .ci/run does) "
        "or set LLMGW_PG_BIN to a directory holding initdb and pg_ctl"
    )


class TempCluster:
    """initdb, pg_ctl start, databases on demand, pg_ctl stop and remove."""

    def __init__(self, *, fast: bool = True) -> None:
        self.bindir = find_bindir()
        self.fast = fast
        self.base = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "server.log"
        self._user: Any = None
        self._started = False
        self._names = itertools.count(1)
        if os.geteuid() == 0:
            for name in ("postgres", "nobody"):
                with contextlib.suppress(KeyError):
                    self._user = pwd.getpwnam(name)
                    break
            if self._user is None:
                shutil.rmtree(self.base, ignore_errors=True)
                raise PostgresNotAvailable("running as root and no 'postgres' or 'nobody' user")
            os.chown(self.base, self._user.pw_uid, self._user.pw_gid)
        os.chmod(self.base, 0o700)

    def _run(self, argv: Sequence[str], *, timeout: float = 120.0) -> None:
        kwargs: dict[str, Any] = {}
        if self._user is not None:
            kwargs = {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}
        with open(self.base / "commands.log", "ab") as out:
            result = subprocess.run(
                list(argv),
                cwd=self.base,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                env={**os.environ, "LC_ALL": "C", "HOME": str(self.base)},
                check=False,
                **kwargs,
            )
        if result.returncode != 0:
            raise PostgresNotAvailable(
                f"{' '.join(argv)} exited with {result.returncode}:\n{self.output()}"
            )

    def output(self) -> str:
        text = []
        for path in (self.base / "commands.log", self.log):
            with contextlib.suppress(OSError):
                text.append(path.read_text(errors="replace")[-4000:])
        return "\n".join(text)

    def start(self) -> TempCluster:
        """initdb and pg_ctl start; on failure the directory is removed (its output is in
        the exception)."""
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> TempCluster:
        self._run(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data),
                "--auth=trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--locale=C",
                *(["--no-sync"] if self.fast else []),
            ]
        )
        options = self._options()
        self._run(
            [
                str(self.bindir / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.log),
                "-w",
                "-t",
                "60",
                "-o",
                " ".join(options),
                "start",
            ]
        )
        self._started = True
        return self

    def _options(self) -> list[str]:
        # No TCP: the socket's directory is the cluster's own, so its name
        # (.s.PGSQL.5432) cannot clash with another cluster's.
        options = [
            f"-k {self.base}",
            "-c listen_addresses=''",
            "-c max_connections=200",
        ]
        if self.fast:
            options += ["-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off"]
        return options

    def restart(self, while_down: Callable[[], object] = lambda: None) -> None:
        """Stop the server (fast: every session is cut), call `while_down`, start it
        again with the same options; it takes connections when this returns."""
        pg_ctl = str(self.bindir / "pg_ctl")
        self._run([pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop"], timeout=60)
        try:
            while_down()
        finally:
            self._run(
                [pg_ctl, "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o",
                 " ".join(self._options()), "start"],
                timeout=120,
            )  # fmt: skip

    def url(self, database: str = "postgres") -> str:
        """A libpq URL of `database`, through the cluster's unix socket."""
        return f"postgresql://postgres@/{database}?host={quote(str(self.base), safe='/')}"

    def new_database(self) -> str:
        """A fresh empty database; its URL."""
        name = f"llmgw_test_{next(self._names)}_{int(time.time() * 1000) % 100000}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            if self._started:
                self._run(
                    [str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "stop"],
                    timeout=60,
                )
                self._started = False
        finally:
            shutil.rmtree(self.base, ignore_errors=True)
