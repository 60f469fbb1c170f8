"""The floor: a bare pass-through proxy on busbar's own stack (uvloop + httptools on both sides, the
same keep-alive upstream pool), with no routing, no parsing of bodies, no translation. What busbar
costs above this is what routing, splicing and translating cost (BENCHMARK.md rule 7).

    python bench/floor.py --listen 127.0.0.1:9100 --upstream 127.0.0.1:8089
"""
from __future__ import annotations

import argparse
import asyncio
import signal

import httptools
import uvloop

from busbar.upstream.pool import UpstreamPool


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

    def connection_made(self, transport):
        self.transport = transport

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
        self.transport.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
        self._next()


class _Relay:
    """One upstream exchange: response head and body relayed as they come (chunked)."""
    __slots__ = ("front", "conn")

    def __init__(self, front, conn, data):
        self.front = front
        self.conn = conn
        conn.send(self, data)

    def on_upstream_headers(self, status, headers):
        ct = b"application/json"
        for k, v in headers:
            if k == b"content-type":
                ct = v
        self.front.transport.write(b"HTTP/1.1 %d OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
                                   % (status, ct))

    def on_upstream_body(self, chunk):
        self.front.transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))

    def on_upstream_complete(self):
        self.front.transport.write(b"0\r\n\r\n")
        self.front._next()

    def on_upstream_error(self, reason):
        self.front.transport.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", default="127.0.0.1:9100")
    ap.add_argument("--upstream", default="127.0.0.1:8089")
    a = ap.parse_args()
    lh, lp = a.listen.rsplit(":", 1)
    uh, up = a.upstream.rsplit(":", 1)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    pool = UpstreamPool(loop, connect_timeout=10, max_idle_per_host=256, idle_timeout=90)
    key = ("http", uh, int(up))
    host = a.upstream.encode()
    server = loop.run_until_complete(loop.create_server(lambda: Floor(pool, key, host), lh, int(lp),
                                                        backlog=4096))
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print("floor listening on %s -> %s" % (a.listen, a.upstream), flush=True)
    loop.run_until_complete(stop.wait())
    server.close()
    pool.close()


if __name__ == "__main__":
    main()
