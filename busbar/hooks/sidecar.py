"""One message to a hook's sidecar: an HTTP/1.1 POST on the worker's keep-alive upstream pool
(busbar/upstream/pool.py), answered through the pool's callbacks, with no task per message.

The rules are the Rust forwarder's (busbar-webrequest-hook): a 2xx answer's body is the reply; any
other status, a connection that fails or closes early, a body over `REPLY_MAX_BYTES`, a body that
is not JSON, and no answer within the deadline are errors, never an abstain (the gate's on_error
decides). Redirects are not followed. The reply is parsed by orjson, which refuses nesting deeper
than 1024 levels before building anything, so a hostile sidecar can exhaust neither the stack nor
the heap.
"""
from __future__ import annotations

import orjson

from cbusbar.clock import now_ns

# A reply is a small verdict (an order, a reject, a rewrite of the messages); past 64 KiB it is a
# hostile or broken sidecar (the Rust forwarder's cap). It also bounds how large a rewrite can be.
REPLY_MAX_BYTES = 64 * 1024

T_TIMEOUT = "timeout"
T_ERROR = "error"


class Call:
    """One POST and its answer; `done(reply, error)` is called once: the parsed JSON reply, or
    None and (T_TIMEOUT | T_ERROR, reason). `parse` False (a tap's notify): the answer is read
    (so the connection serves again) and not parsed; `done` gets None, None."""

    __slots__ = ("pool", "data", "done", "conn", "timer", "status", "chunks", "size", "ended",
                 "t0", "parse")

    def __init__(self, site, sidecar, body: bytes, timeout_s: float, done, parse=True):
        self.parse = parse
        self.pool = site.pool
        self.data = sidecar.head + b"Content-Length: %d\r\n\r\n" % len(body) + body
        self.done = done
        self.conn = None
        self.status = 0
        self.chunks = []
        self.size = 0
        self.ended = False
        self.t0 = now_ns()
        self.timer = site.loop.call_later(timeout_s, self._timeout)
        self.pool.acquire(sidecar.key, self._on_conn, self._on_conn_error)

    def elapsed_ns(self) -> int:
        return now_ns() - self.t0

    # -- the pool's callbacks
    def _on_conn(self, conn):
        if self.ended:
            self.pool.release(conn)     # it carried nothing
            return
        self.conn = conn
        conn.send(self, self.data)
        self.data = None

    def _on_conn_error(self, reason):
        self._end(None, (T_ERROR, reason))

    def on_upstream_headers(self, status, headers):
        self.status = status
        for k, v in headers:
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    n = 0
                if n > REPLY_MAX_BYTES:
                    self._end(None, (T_ERROR, "the reply exceeds %d bytes" % REPLY_MAX_BYTES))
                return

    def on_upstream_body(self, chunk):
        self.size += len(chunk)
        if self.size > REPLY_MAX_BYTES:
            self._end(None, (T_ERROR, "the reply exceeds %d bytes" % REPLY_MAX_BYTES))
            return
        self.chunks.append(chunk)

    def on_upstream_complete(self):
        self.conn = None        # the pool took the connection back (or closed it)
        if self.ended:
            return
        if not 200 <= self.status < 300:
            self._end(None, (T_ERROR, "the sidecar answered HTTP %d" % self.status))
            return
        if not self.parse:
            self._end(None, None)
            return
        body = b"".join(self.chunks)
        try:
            reply = orjson.loads(body)
        except orjson.JSONDecodeError:
            # Length only: a sidecar that echoed granted prompt text into a broken reply must not
            # have it logged.
            self._end(None, (T_ERROR, "the reply is not JSON (%d bytes)" % len(body)))
            return
        self._end(reply, None)

    def on_upstream_error(self, reason):
        self.conn = None
        self._end(None, (T_ERROR, reason))

    def crash(self, exc):
        self.conn = None
        self._end(None, (T_ERROR, "internal error: %s" % exc.__class__.__name__))

    def _timeout(self):
        self.timer = None
        self._end(None, (T_TIMEOUT, "no answer within the deadline"))

    def _end(self, reply, error):
        if self.ended:
            return
        self.ended = True
        self.chunks = None
        t = self.timer
        if t is not None:
            self.timer = None
            t.cancel()
        c = self.conn
        if c is not None:
            # An answer not read whole cannot be followed by the next message on that connection.
            self.conn = None
            c.abandon()
        done = self.done
        self.done = None
        done(reply, error)
