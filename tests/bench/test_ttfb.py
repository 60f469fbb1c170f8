"""bench/ttfb.py's interleaving, against real servers on loopback: which target each round sends
to first, fixed or rotated."""
from __future__ import annotations

import http.server
import threading

from tests.bench import bench_module as _module

ttfb = _module("ttfb")


def _servers(names, seen):
    """One keep-alive HTTP server per name; each request appends the server's name to `seen`."""
    out = []
    for name in names:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            me = name

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                seen.append(self.me)
                body = b'{"ok":true}'
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        out.append(srv)
    return out


def _measure(rotate):
    seen = []
    servers = _servers("abc", seen)
    try:
        targets = {n: (s.server_address[1], "/x", {}, b'{"seq":"@SEQ@"}')
                   for n, s in zip("abc", servers)}
        samples, errors = ttfb.measure(targets, 3, warmup=1, rotate=rotate)
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
    assert errors == {}
    assert {n: [x[2] for x in v] for n, v in samples.items()} == {n: [200] * 3 for n in "abc"}
    return "".join(seen)


def test_fixed_order_sends_every_round_in_the_targets_order():
    assert _measure(False) == "abc" * 4


def test_rotated_order_starts_each_round_one_target_later():
    # The warm-up round counts: round 0 a b c, round 1 b c a, round 2 c a b, round 3 a b c.
    assert _measure(True) == "abc" + "bca" + "cab" + "abc"
