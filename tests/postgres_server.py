"""A real PostgreSQL for the tests: a throwaway cluster (initdb) in a temporary directory, started on
a free loopback port, stopped and deleted at the end. `make postgres` installs Debian's package
when it is missing.

    with PostgresServer() as srv:   # srv.url == "postgres://busbar@127.0.0.1:<port>/busbar"
        srv.create_database("other")    # a database of its own (returns its URL)

PostgreSQL refuses to run as root: as root the cluster belongs to `nobody` (runuser), otherwise to
the current user. Nothing is durable (fsync off): a test cluster, not a database.
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time

USER = "busbar"
DATABASE = "busbar"


def postgres_bin_dir() -> str | None:
    """The directory of Debian's server binaries (initdb, pg_ctl, postgres), newest version first;
    None when the server is not installed (the client alone is not enough)."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                    key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
                    reverse=True):
        if all(os.access(os.path.join(d, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            return d
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return os.path.dirname(found)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_owner() -> list[str]:
    """The command prefix that runs a server binary as the cluster's owner."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    return [runuser, "-u", "nobody", "--"]


class PostgresServer:
    def __init__(self, port: int | None = None, bin_dir: str | None = None):
        self.bin = bin_dir or postgres_bin_dir()
        if self.bin is None:
            raise FileNotFoundError("PostgreSQL's server binaries not found (make postgres "
                                    "installs Debian's postgresql)")
        self.port = port or _free_port()
        self.dir = tempfile.mkdtemp(prefix="busbar-pg-")
        self.data = os.path.join(self.dir, "data")
        self.log = os.path.join(self.dir, "postgres.log")
        self.url = self.url_of(DATABASE)
        self.running = False
        if os.geteuid() == 0:       # the cluster's owner must be able to write here
            os.chmod(self.dir, 0o700)
            shutil.chown(self.dir, "nobody")

    def url_of(self, database: str) -> str:
        return "postgres://%s@127.0.0.1:%d/%s" % (USER, self.port, database)

    def _run(self, *args, timeout=60):
        out = subprocess.run(_as_owner() + [os.path.join(self.bin, args[0]), *args[1:]],
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        if out.returncode != 0:
            raise RuntimeError("%s failed (%d): %s %s" % (args[0], out.returncode,
                                                          out.stdout.decode(errors="replace")[-800:],
                                                          out.stderr.decode(errors="replace")[-800:]))
        return out

    def start(self, timeout: float = 30.0) -> "PostgresServer":
        if self.running:
            return self
        if not os.path.isdir(self.data):
            self._run("initdb", "-D", self.data, "-U", USER, "--auth=trust", "-E", "UTF8",
                      "--no-sync", "--no-instructions")
        opts = ("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
                "-c full_page_writes=off -c max_connections=200" % (self.port, self.dir))
        self._run("pg_ctl", "-D", self.data, "-o", opts, "-l", self.log, "-w", "-t",
                  str(int(timeout)), "start", timeout=timeout + 10)
        self.running = True
        self._psql("postgres", "CREATE DATABASE %s" % DATABASE, ok_if="already exists")
        return self

    def _psql(self, database: str, sql: str, ok_if: str | None = None):
        psql = os.path.join(self.bin, "psql")
        out = subprocess.run([psql, "-h", "127.0.0.1", "-p", str(self.port), "-U", USER, "-d",
                              database, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql],
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        if out.returncode != 0 and not (ok_if and ok_if in out.stderr.decode(errors="replace")):
            raise RuntimeError("psql: %s" % out.stderr.decode(errors="replace")[-800:])

    def create_database(self, name: str) -> str:
        """A fresh, empty database of the cluster; its URL."""
        self._psql("postgres", 'DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % name)
        self._psql("postgres", 'CREATE DATABASE "%s"' % name)
        return self.url_of(name)

    def stop(self):
        if self.running:
            try:
                self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")
            except Exception:
                self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
            self.running = False

    def close(self):
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


def wait_port(port: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False
