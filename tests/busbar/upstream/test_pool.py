"""The upstream pool on its own (busbar/upstream/pool.py), against raw-socket peers on loopback:
interim answers, 101, back-pressure state, what may be reused and what must not."""
import asyncio
import socket
import threading

import pytest
import uvloop

from busbar.upstream.pool import UpstreamPool


class Handler:
    def __init__(self):
        self.events = []
        self.done = asyncio.Event()

    def on_upstream_headers(self, status, headers):
        self.events.append(("headers", status))

    def on_upstream_body(self, chunk):
        self.events.append(("body", chunk))

    def on_upstream_complete(self):
        self.events.append(("complete",))
        self.done.set()

    def on_upstream_error(self, reason):
        self.events.append(("error", reason))
        self.done.set()

    def crash(self, exc):
        self.events.append(("crash", repr(exc)))
        self.done.set()


class Peer:
    """A listening socket whose each connection answers with `script(conn, n)` per request."""

    def __init__(self, script):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.script = script
        self.accepted = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        n = 0
        c.settimeout(5)
        try:
            while True:
                buf = b""
                while b"\r\n\r\n" not in buf:
                    d = c.recv(4096)
                    if not d:
                        return
                    buf += d
                n += 1
                if self.script(c, n) is False:
                    return
        except OSError:
            pass
        finally:
            c.close()


@pytest.fixture
def loop():
    lp = uvloop.new_event_loop()
    yield lp
    lp.close()


def _exchange(loop, pool, port, data=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"):
    h = Handler()
    box = {}

    def ready(conn):
        box["conn"] = conn
        conn.send(h, data)

    def err(reason):
        h.on_upstream_error(reason)

    pool.acquire(("http", "127.0.0.1", port), ready, err)
    loop.run_until_complete(asyncio.wait_for(h.done.wait(), 5))
    return h, box.get("conn")


def _pool(loop):
    return UpstreamPool(loop, connect_timeout=2, max_idle_per_host=4, idle_timeout=30)


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def test_interim_answers_are_skipped_and_the_connection_reused_after_the_final_one(loop):
    def script(c, n):
        c.sendall(b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n")
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n#%d" % n)
    peer = Peer(script)
    pool = _pool(loop)
    h1, c1 = _exchange(loop, pool, peer.port)
    assert h1.events == [("headers", 200), ("body", b"#1"), ("complete",)]
    h2, c2 = _exchange(loop, pool, peer.port)
    assert h2.events == [("headers", 200), ("body", b"#2"), ("complete",)]
    assert c1 is c2 and peer.accepted == 1
    pool.close()


def test_101_is_an_error_and_the_connection_is_not_reused(loop):
    peer = Peer(lambda c, n: c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n"
                                       b"Connection: Upgrade\r\n\r\n"))
    pool = _pool(loop)
    h, conn = _exchange(loop, pool, peer.port)
    assert h.events[0][0] == "error" and conn.closed
    assert not pool.idle.get(conn.key)
    pool.close()


def test_a_connection_paused_by_its_exchange_is_resumed_when_it_goes_back(loop):
    peer = Peer(lambda c, n: c.sendall(OK))
    pool = _pool(loop)
    h = Handler()
    box = {}

    class Pausing(Handler):
        def on_upstream_headers(self, status, headers):
            box["conn"].pause()        # the client is slow: back-pressure
            super().on_upstream_headers(status, headers)

    p = Pausing()

    def ready(conn):
        box["conn"] = conn
        conn.send(p, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")

    pool.acquire(("http", "127.0.0.1", peer.port), ready, h.on_upstream_error)
    loop.run_until_complete(asyncio.wait_for(p.done.wait(), 5))
    conn = box["conn"]
    assert p.events[-1] == ("complete",)
    assert not conn.paused and conn.transport.is_reading()   # back in the pool, readable
    h2, c2 = _exchange(loop, pool, peer.port)
    assert c2 is conn and h2.events[-1] == ("complete",)
    pool.close()


def test_a_paused_or_busy_connection_is_never_pooled(loop):
    peer = Peer(lambda c, n: c.sendall(OK))
    pool = _pool(loop)
    _, conn = _exchange(loop, pool, peer.port)
    idle = pool.idle[conn.key]
    assert idle == [conn]
    idle.pop()
    conn.pause()
    pool.release(conn)          # paused: closed instead of pooled
    assert conn.closed and not pool.idle[conn.key]
    pool.close()


def test_bytes_on_an_idle_connection_close_it(loop):
    def script(c, n):
        c.sendall(OK)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nextra")   # nobody asked
    peer = Peer(script)
    pool = _pool(loop)
    _, conn = _exchange(loop, pool, peer.port)
    loop.run_until_complete(asyncio.sleep(0.2))
    assert conn.closed and not pool.idle.get(conn.key)
    pool.close()


def test_abandon_closes_and_nothing_reaches_the_handler_after(loop):
    peer = Peer(lambda c, n: (c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart"),
                              __import__("time").sleep(0.3), c.sendall(b"x" * 96)))
    pool = _pool(loop)
    h = Handler()

    class Abandoning(Handler):
        def on_upstream_body(self, chunk):
            super().on_upstream_body(chunk)
            box["conn"].abandon()
            self.done.set()

    a = Abandoning()
    box = {}

    def ready(conn):
        box["conn"] = conn
        conn.send(a, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")

    pool.acquire(("http", "127.0.0.1", peer.port), ready, h.on_upstream_error)
    loop.run_until_complete(asyncio.wait_for(a.done.wait(), 5))
    loop.run_until_complete(asyncio.sleep(0.5))
    assert a.events == [("headers", 200), ("body", b"part")]
    assert box["conn"].closed and not pool.idle.get(box["conn"].key)
    pool.close()


def test_refused_and_reset_are_reported_as_errors(loop):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    pool = _pool(loop)
    h, _ = _exchange(loop, pool, port)
    assert h.events == [("error", "connect failed: ConnectionRefusedError")]

    def script(c, n):
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab")
        return False            # closes with the body short
    peer = Peer(script)
    h, conn = _exchange(loop, pool, peer.port)
    assert h.events[:2] == [("headers", 200), ("body", b"ab")]
    assert h.events[-1] == ("error", "upstream connection closed before the response ended")
    pool.close()
