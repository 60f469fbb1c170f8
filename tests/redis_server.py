"""A real redis-server for the tests: started on a free loopback port, no persistence (unless asked),
stopped at the end. `make redis` installs Debian's package when it is missing.

    with RedisServer() as srv:      # srv.url == "redis://127.0.0.1:<port>/0"
        srv.stop()                  # the fail-mode tests: Redis goes away...
        srv.start()                 # ...and comes back on the same port (empty: no persistence)
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time


def redis_server_path() -> str | None:
    """redis-server on PATH, or where Debian puts it (root's PATH may lack /usr/sbin, and a
    non-root one /usr/bin is always there); None when it is not installed."""
    found = shutil.which("redis-server")
    if found:
        return found
    for p in ("/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server"):
        if os.access(p, os.X_OK):
            return p
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port: int, timeout: float = 0.2) -> bool:
    """PING over a raw socket (the helper does not need redis-py)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, port: int | None = None, binary: str | None = None, persist: bool = False):
        self.binary = binary or redis_server_path()
        if self.binary is None:
            raise FileNotFoundError("redis-server not found (make redis installs Debian's package)")
        self.port = port or _free_port()
        self.url = "redis://127.0.0.1:%d/0" % self.port
        self.dir = tempfile.mkdtemp(prefix="busbar-redis-")
        self.persist = persist          # True: a stop saves to dump.rdb and the restart loads it
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> "RedisServer":
        if self.proc is not None and self.proc.poll() is None:
            return self
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                "--save", "3600 1" if self.persist else "", "--appendonly", "no", "--dir", self.dir,
                "--daemonize", "no", "--protected-mode", "yes", "--loglevel", "warning",
                "--logfile", os.path.join(self.dir, "redis.log")]
        deadline = time.monotonic() + timeout
        while True:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL, start_new_session=True)
            while time.monotonic() < deadline and self.proc.poll() is None:
                if _ping(self.port):
                    return self
                time.sleep(0.02)
            # Exited (the port was taken, e.g. a restart racing the old socket's close) or hung.
            self._kill()
            if time.monotonic() >= deadline:
                raise RuntimeError("redis-server did not answer PING on port %d within %.0fs; "
                                   "see %s" % (self.port, timeout,
                                               os.path.join(self.dir, "redis.log")))
            time.sleep(0.1)

    def stop(self):
        """Stops the server (its clients see their connections closed) and waits for it."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    self._kill()
            self.proc = None

    def restart(self):
        self.stop()
        return self.start()

    def _kill(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(5)
            self.proc = None

    def close(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()
