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


def _measure(rotate, names="dabc"):
    seen = []
    servers = _servers(names, seen)
    try:
        targets = {n: (s.server_address[1], "/x", {}, b'{"seq":"@SEQ@"}')
                   for n, s in zip(names, servers)}
        samples, errors = ttfb.measure(targets, 3, warmup=1, rotate=rotate)
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
    assert errors == {}
    assert {n: [x[2] for x in v] for n, v in samples.items()} == {n: [200] * 3 for n in names}
    return "".join(seen)


def test_fixed_order_sends_every_round_in_the_targets_order():
    assert _measure(False) == "dabc" * 4


def test_rotated_order_keeps_the_first_target_first_and_rotates_the_others_behind_it():
    # The warm-up round counts: round 0 d a b c, round 1 d b c a, round 2 d c a b, round 3 d a b c.
    seen = _measure(True)
    assert seen == "dabc" + "dbca" + "dcab" + "dabc"
    # Over the three rounds after the warm-up each gateway follows the direct request once.
    assert sorted(seen[i + 1] for i in range(4, len(seen), 4)) == ["a", "b", "c"]


def test_rotation_with_the_first_target_alone():
    assert _measure(True, "d") == "d" * 4
