"""A hook sidecar for the bench: what `module: busbar-webrequest-hook` forwards to, answering every
POST with `{}` (abstain) on keep-alive connections, as fast as Python answers HTTP (uvloop, the
httptools parser, no framework). What it costs busbar to ask a gate on loopback is then the row
"busbar, one gate hook on loopback" minus the plain busbar row (bench/run.py).

    .venv/bin/python bench/sidecar.py --listen 127.0.0.1:8787
"""
from __future__ import annotations

import argparse
import asyncio

import httptools
import uvloop

REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
HEALTH = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Side(asyncio.Protocol):
    def connection_made(self, transport):
        self.t = transport
        self.p = httptools.HttpRequestParser(self)
        self.get = False

    def data_received(self, data):
        try:
            self.p.feed_data(data)
        except httptools.HttpParserError:
            self.t.close()

    def on_message_begin(self):
        self.get = False

    def on_url(self, url):
        self.get = url.startswith(b"/healthz")

    def on_message_complete(self):
        self.t.write(HEALTH if self.get else REPLY)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", default="127.0.0.1:8787")
    a = ap.parse_args()
    host, _, port = a.listen.rpartition(":")
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(loop.create_server(Side, host, int(port), backlog=1024))
    loop.run_forever()


if __name__ == "__main__":
    main()
