"""A hook sidecar for tests: what an operator runs beside busbar for `module: busbar-webrequest-hook`
hooks (docs/hooks.md), written in plain Python on the standard library.

Each path is a hook: `Sidecar({"/pii": fn, ...})` answers a POST to /pii with `fn(message)`, where
`message` is the JSON busbar sent (op, request, candidates, context, stage) and the function's
return is the reply: a dict (sent as JSON, 200), `(status, body bytes)` to answer something else,
or `None` to answer `{}` (abstain). `delay` per path holds the answer (a slow sidecar). Every
message received is kept, in order, with its raw body, so a test can assert what a hook saw (and
what it never saw). Threads per connection; `close()` stops it.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Sidecar:
    def __init__(self, routes: dict, delay: dict | None = None, port: int = 0):
        self.routes = routes
        self.delay = delay or {}
        self.received = []          # (path, message dict, raw bytes)
        self.lock = threading.Lock()
        side = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(n)
                path = self.path
                try:
                    msg = json.loads(raw)
                except ValueError:
                    msg = None
                with side.lock:
                    side.received.append((path, msg, raw, dict(self.headers)))
                d = side.delay.get(path)
                if d:
                    time.sleep(d)
                fn = side.routes.get(path.split("?")[0])
                out = fn(msg) if fn is not None else None
                if isinstance(out, tuple):
                    status, body = out
                else:
                    status, body = 200, json.dumps(out if out is not None else {}).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = "http://127.0.0.1:%d" % self.port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def messages(self, path=None, op=None) -> list:
        with self.lock:
            return [m for p, m, _, _ in self.received
                    if (path is None or p.split("?")[0] == path) and
                    (op is None or (m or {}).get("op") == op)]

    def raw(self, path=None) -> list:
        with self.lock:
            return [r for p, _, r, _ in self.received if path is None or p.split("?")[0] == path]

    def wait(self, path, n, timeout=10.0) -> list:
        """The first `n` messages to `path`, waiting for them (taps arrive after the answer)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.messages(path)
            if len(got) >= n:
                return got
            time.sleep(0.01)
        raise AssertionError("%s got %d messages, expected %d" % (path, len(self.messages(path)), n))

    def close(self):
        self.server.shutdown()
        self.server.server_close()
