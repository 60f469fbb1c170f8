"""The floor: a bare pass-through proxy on busbar's own stack (uvloop + httptools on both sides, the
same keep-alive upstream pool), with no routing, no parsing of bodies, no translation. What busbar
costs above this is what routing, splicing and translating cost (BENCHMARK.md rule 7).

    python bench/floor.py --listen 127.0.0.1:9100 --upstream 127.0.0.1:8089 [--tls-cert C --tls-key K]
"""
from __future__ import annotations

import argparse
import asyncio
import pathlib
import signal
import sys

import httptools
import uvloop

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from busbar.upstream.pool import UpstreamPool  # noqa: E402  (the repo root is put on the path first)


REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden",
           404: b"Not Found", 413: b"Payload Too Large", 429: b"Too Many Requests",
           500: b"Internal Server Error", 502: b"Bad Gateway", 503: b"Service Unavailable"}


class Floor(asyncio.Protocol):
    def __init__(self, pool, key, host_header):
        self.pool = pool
        self.key = key
        self.host = host_header
        self.parser = httptools.HttpRequestParser(self)
        self.transport = None
        self.url = b""
        self.headers = []
        self.body = []
        self.queue = []
        self.busy = False
        self.closed = False

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        # A client that leaves mid-answer (wrk does, at the end of a run): the upstream answer is
        # still read to its end, so the pooled connection stays usable; it is just not written.
        self.closed = True
        self.queue.clear()

    def write(self, data):
        if not self.closed:
            self.transport.write(data)

    def data_received(self, data):
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.close()

    def on_message_begin(self):
        self.url = b""
        self.headers = []
        self.body = []

    def on_url(self, url):
        self.url += url

    def on_header(self, name, value):
        n = name.lower()
        if n not in (b"host", b"content-length", b"connection", b"transfer-encoding"):
            self.headers.append(b"%s: %s\r\n" % (name, value))

    def on_body(self, body):
        self.body.append(body)

    def on_message_complete(self):
        body = b"".join(self.body)
        data = b"".join([b"%s %s HTTP/1.1\r\nHost: %s\r\n" % (self.parser.get_method(), self.url, self.host)]
                        + self.headers + [b"Content-Length: %d\r\n\r\n" % len(body), body])
        self.queue.append(data)
        if not self.busy:
            self._next()

    def _next(self):
        if not self.queue:
            self.busy = False
            return
        self.busy = True
        data = self.queue.pop(0)
        self.pool.acquire(self.key, lambda c: _Relay(self, c, data), lambda r: self._fail())

    def _fail(self):
        self.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
        self._next()


class _Relay:
    """One upstream exchange. A response with a length is relayed as one write with the same length
    (as busbar relays a same-protocol buffered answer); one without (a stream) is relayed chunk by
    chunk as it comes, chunked to the client."""
    __slots__ = ("front", "conn", "head", "parts", "length")

    def __init__(self, front, conn, data):
        self.front = front
        self.conn = conn
        self.parts = []
        self.length = -1
        conn.send(self, data)

    def on_upstream_headers(self, status, headers):
        ct = b"application/json"
        for k, v in headers:
            if k == b"content-type":
                ct = v
            elif k == b"content-length":
                self.length = int(v)
        line = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\n" % (status, REASONS.get(status, b"Status"), ct)
        if self.length >= 0:
            self.head = line + b"Content-Length: %d\r\n\r\n" % self.length
        else:
            self.front.write(line + b"Transfer-Encoding: chunked\r\n\r\n")

    def on_upstream_body(self, chunk):
        if self.length >= 0:
            self.parts.append(chunk)
        else:
            self.front.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))

    def on_upstream_complete(self):
        if self.length >= 0:
            self.front.write(b"".join([self.head] + self.parts))
        else:
            self.front.write(b"0\r\n\r\n")
        self.front._next()

    def on_upstream_error(self, reason):
        self.front.transport.close()

    def crash(self, exc):
        """The pool's report of an exception raised inside one of the callbacks above."""
        self.front.transport.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", default="127.0.0.1:9100")
    ap.add_argument("--upstream", default="127.0.0.1:8089")
    ap.add_argument("--tls-cert", help="serve TLS with this PEM certificate (and --tls-key), with "
                    "busbar's own server context (busbar.config.control.ssl_context)")
    ap.add_argument("--tls-key")
    a = ap.parse_args()
    tls = {}
    if a.tls_cert:
        from busbar.config.control import Tls, ssl_context
        with open(a.tls_cert) as c, open(a.tls_key) as k:
            tls = {"ssl": ssl_context(Tls("floor", c.read(), k.read())), "ssl_handshake_timeout": 10}
    lh, lp = a.listen.rsplit(":", 1)
    uh, up = a.upstream.rsplit(":", 1)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    pool = UpstreamPool(loop, connect_timeout=10, max_idle_per_host=256, idle_timeout=90)
    key = ("http", uh, int(up))
    host = a.upstream.encode()
    server = loop.run_until_complete(loop.create_server(lambda: Floor(pool, key, host), lh, int(lp),
                                                        backlog=4096, **tls))
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print("floor listening on %s -> %s" % (a.listen, a.upstream), flush=True)
    loop.run_until_complete(stop.wait())
    server.close()
    pool.close()


if __name__ == "__main__":
    main()
