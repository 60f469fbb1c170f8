"""bench/ttfb.py's interleaving, against real servers on loopback: which target each round sends
to first, fixed or in balanced orders."""
from __future__ import annotations

import collections
import http.server
import threading

import pytest

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


def _measure(rotate, names="dabc", n=3):
    seen = []
    servers = _servers(names, seen)
    try:
        targets = {x: (s.server_address[1], "/x", {}, b'{"seq":"@SEQ@"}')
                   for x, s in zip(names, servers)}
        samples, errors = ttfb.measure(targets, n, warmup=1, rotate=rotate)
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
    assert errors == {}
    assert {x: [y[2] for y in v] for x, v in samples.items()} == {x: [200] * n for x in names}
    return "".join(seen)


def test_fixed_order_sends_every_round_in_the_targets_order():
    assert _measure(False) == "dabc" * 4


@pytest.mark.parametrize("names", ["dabc", "dabce"])
def test_rotated_order_keeps_the_first_target_first_and_balances_the_others_behind_it(names):
    # Three gateways: six orders (2m for an odd m), four: four. Over that many measured rounds
    # (after the warm-up round) each gateway takes every place once per order set's share, and
    # comes right after each other gateway equally often: the cyclic rotation this replaces put
    # the same gateway right after the same one in most rounds.
    m = len(names) - 1
    k = len(ttfb.balanced_orders(m))
    seen = _measure(True, names, n=k)
    rounds = [seen[i:i + m + 1] for i in range(0, len(seen), m + 1)]
    assert len(rounds) == k + 1 and all(r[0] == "d" for r in rounds)
    measured = rounds[1:]
    places = collections.Counter((r[j], j) for r in measured for j in range(1, m + 1))
    after = collections.Counter((r[j - 1], r[j]) for r in measured for j in range(2, m + 1))
    assert len(places) == m * m and len(set(places.values())) == 1
    assert len(after) == m * (m - 1) and len(set(after.values())) == 1


def test_balanced_orders():
    for m in range(1, 8):
        rows = ttfb.balanced_orders(m)
        assert all(sorted(r) == list(range(m)) for r in rows)
        after = collections.Counter((r[i - 1], r[i]) for r in rows for i in range(1, m))
        assert m < 2 or (len(after) == m * (m - 1) and len(set(after.values())) == 1)


def test_rotation_with_the_first_target_alone():
    assert _measure(True, "d") == "d" * 4
