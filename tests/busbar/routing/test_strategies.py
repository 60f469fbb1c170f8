"""The pool ordering strategies and tiers (busbar/routing/plan.py) through the real server, under
concurrent calls, against an upstream whose lanes differ in latency, cost and capacity (the
hostile upstream answers each lane's model as the test says, and counts what each received and how
many it held at once). Two workers where the signal is shared: lane permits, in-flight counts and
the latency average live in shared memory, so the strategy holds for the gateway, not per worker."""
from __future__ import annotations

import json
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import start_gateway, stop
from tests.hostile import HostileUpstream, http_response, openai_body

SIGNING = "ab" * 32
ADMIN = "adm-" + "t" * 32


class Lanes:
    """An upstream playing several lanes: `delays[model]` seconds before each answer (mutable
    while the test runs); `peak[model]`: the most requests it held at once."""

    def __init__(self, delays: dict, fail=()):
        self.delays = dict(delays)
        self.fail = set(fail)
        self.lock = threading.Lock()
        self.now = {m: 0 for m in delays}
        self.peak = {m: 0 for m in delays}
        self.up = HostileUpstream({m: self._answer for m in delays})

    def _answer(self, c, req):
        m = req.model
        with self.lock:
            self.now[m] += 1
            self.peak[m] = max(self.peak[m], self.now[m])
        try:
            time.sleep(self.delays[m])
        finally:
            # Held until the answer starts: busbar frees the lane's permit once it has the answer,
            # and may send the next request before this thread would run a decrement placed after
            # sendall (seen under load: a peak of 2 that busbar never caused).
            with self.lock:
                self.now[m] -= 1
        if m in self.fail:
            c.sendall(http_response(503, b'{"error":{"message":"down","type":"server_error"}}'))
        else:
            c.sendall(http_response(200, openai_body("from " + m, model=m)))

    def count(self, m) -> int:
        return self.up.count(m)

    def close(self):
        self.up.close()


def config(lanes: Lanes, pools: str, models: str, tail: str = "") -> str:
    return """\
listen: "127.0.0.1:{port}"
providers:
  up: {protocol: openai, base_url: "%s", api_key: {env: MOCK_KEY}}
models:
%s
pools:
%s
limits: {header_read_timeout_secs: 5}
%s""" % (lanes.up.url, models, pools, tail)


def call(url, model, n, threads, headers=None) -> list:
    """`n` chat calls to `model` from `threads` threads (a client each, so connections land on
    both workers); the lane (upstream model) that answered each."""
    def one(i):
        with httpx.Client(timeout=30) as c:
            r = c.post(url + "/v1/chat/completions", headers=headers or {},
                       json={"model": model, "messages": [{"role": "user", "content": "hi %d" % i}]})
            assert r.status_code == 200, r.text
            return r.json()["model"]
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(one, range(n)))


@pytest.fixture
def lanes():
    made = []

    def make(delays, fail=()):
        lane = Lanes(delays, fail)
        made.append(lane)
        return lane
    yield make
    for lane in made:
        lane.close()


@pytest.fixture
def gw(tmp_path):
    started = []

    def make(text, workers=2, extra_env=None):
        g = start_gateway(tmp_path, text, workers, extra_env, stderr=subprocess.DEVNULL)
        started.append(g)
        return g
    yield make
    for g in started:
        stop(g.proc)


def test_cheapest_fills_the_cheapest_lane_up_to_its_capacity_then_the_next(lanes, gw):
    up = lanes({"cheap": 0.15, "mid": 0.0, "dear": 0.0})
    text = config(up, """\
  p:
    hooks: [cheapest]
    members: [{model: dear}, {model: mid}, {model: cheap}]""", """\
  cheap: {provider: up, upstream_model: cheap, max_concurrent: 2}
  mid: {provider: up, upstream_model: mid}
  dear: {provider: up, upstream_model: dear}""", """\
rate_card:
  cheap: {input_utok: 0.5, output_utok: 1.5}
  mid: {input_utok: 3, output_utok: 15}
  dear: {input_utok: 15, output_utok: 75}
""")
    g = gw(text)
    # One at a time: the cheapest lane, always, whatever the member order.
    assert call(g.url, "p", 6, 1) == ["cheap"] * 6
    # Eight at a time: the cheap lane takes what its two permits (shared by both workers) allow,
    # the rest spills to the next cheapest; the dearest is never reached.
    got = call(g.url, "p", 32, 8)
    assert up.peak["cheap"] <= 2
    assert got.count("cheap") >= 4 and got.count("mid") >= 8 and got.count("dear") == 0


def test_fastest_follows_the_shared_latency_average(lanes, gw):
    up = lanes({"slow": 0.15, "fast": 0.005})
    text = config(up, """\
  p:
    hooks: [fastest]
    members: [{model: slow}, {model: fast}]""", """\
  slow: {provider: up, upstream_model: slow}
  fast: {provider: up, upstream_model: fast}""")
    g = gw(text)
    # Each lane measured through its direct route (the average is lane-wide, over every worker).
    call(g.url, "slow", 2, 2)
    call(g.url, "fast", 2, 2)
    got = call(g.url, "p", 30, 6)
    assert got == ["fast"] * 30 and up.count("slow") == 2
    # The fast lane slows down: its average climbs past the slow lane's and traffic moves.
    up.delays["fast"] = 0.4
    seq = [call(g.url, "p", 1, 1)[0] for _ in range(12)]
    assert "slow" in seq
    first_slow = seq.index("slow")
    assert 2 <= first_slow <= 8, seq


def test_least_busy_sends_to_the_lane_with_the_most_free_concurrency(lanes, gw):
    up = lanes({"a": 1.2, "b": 1.2})
    text = config(up, """\
  p:
    hooks: [least_busy]
    members: [{model: a}, {model: b}]""", """\
  a: {provider: up, upstream_model: a}
  b: {provider: up, upstream_model: b}""")
    g = gw(text)
    # Four calls held on lane a through its direct route, from both workers: a lane's in-flight
    # count is lane-wide and gateway-wide.
    with ThreadPoolExecutor(4) as held:
        busy = [held.submit(call, g.url, "a", 1, 1) for _ in range(4)]
        deadline = time.monotonic() + 5
        while up.now["a"] < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert up.now["a"] == 4
        # The pool's next four calls all go to b: it has more free concurrency until it holds
        # as many (weighted would have sent half of them to a).
        got = call(g.url, "p", 4, 4)
        assert got == ["b"] * 4
        assert [f.result() for f in busy] == [["a"]] * 4
    assert up.count("a") == 4


def test_least_busy_counts_bounded_lanes_by_their_free_permits(lanes, gw):
    up = lanes({"small": 0.05, "big": 0.05})
    text = config(up, """\
  p:
    hooks: [least_busy]
    members: [{model: small}, {model: big}]""", """\
  small: {provider: up, upstream_model: small, max_concurrent: 2}
  big: {provider: up, upstream_model: big, max_concurrent: 40}""")
    g = gw(text)
    got = call(g.url, "p", 24, 6)
    # `big` always has more free slots: `small` is only reached when ranked first, never here.
    assert got == ["big"] * 24


def test_tiers_reach_overflow_only_when_primary_cannot_serve(lanes, gw):
    up = lanes({"p1": 0.2, "p2": 0.2, "o1": 0.0})
    text = config(up, """\
  p:
    hooks: [weighted]
    members:
      - {model: p1, tier: primary}
      - {model: o1, tier: overflow}
      - {model: p2, tier: primary}""", """\
  p1: {provider: up, upstream_model: p1, max_concurrent: 1}
  p2: {provider: up, upstream_model: p2, max_concurrent: 1}
  o1: {provider: up, upstream_model: o1}""")
    g = gw(text)
    # One at a time: the primary tier, by weight between its two lanes.
    got = call(g.url, "p", 6, 1)
    assert sorted(set(got)) == ["p1", "p2"] and "o1" not in got
    # Eight at a time: the primaries are at capacity most of the time, and overflow takes the
    # rest; neither primary ever held two.
    got = call(g.url, "p", 32, 8)
    assert got.count("o1") > 0 and got.count("p1") + got.count("p2") >= 4
    assert up.peak["p1"] <= 1 and up.peak["p2"] <= 1


def test_tiers_are_labels_only_in_a_pool_without_hooks(lanes, gw):
    # The Rust gateway documents `tier` as "inert for plain weighted pools": a config swapped in
    # from it keeps routing by weight across every tier (here one at a time, so no lane is ever
    # at capacity and a tiered pool would never reach overflow).
    up = lanes({"p1": 0.0, "o1": 0.0})
    text = config(up, """\
  p:
    members:
      - {model: p1, tier: primary}
      - {model: o1, tier: overflow}""", """\
  p1: {provider: up, upstream_model: p1}
  o1: {provider: up, upstream_model: o1}""")
    g = gw(text, workers=1)     # one SWRR: an exact split
    got = call(g.url, "p", 8, 1)
    assert got.count("p1") == 4 and got.count("o1") == 4


def test_tiers_fail_over_to_overflow_when_the_primary_is_down(lanes, gw):
    up = lanes({"p1": 0.0, "o1": 0.0}, fail=("p1",))
    text = config(up, """\
  p:
    hooks: [cheapest]
    members:
      - {model: p1, tier: primary}
      - {model: o1, tier: overflow}""", """\
  p1: {provider: up, upstream_model: p1}
  o1: {provider: up, upstream_model: o1}""", """\
rate_card:
  p1: {input_utok: 1, output_utok: 1}
  o1: {input_utok: 0.1, output_utok: 0.1}
""")
    g = gw(text, workers=1)
    # Overflow is cheaper, yet the primary tier comes first: cheapest ranks within a tier.
    # The primary answers 503: each call fails over to overflow (same request), and once the
    # breaker opens, calls go straight to overflow.
    assert call(g.url, "p", 10, 1) == ["o1"] * 10
    assert 1 <= up.count("p1") < 10


def test_usage_walks_member_order_under_a_rate_limit_and_weights_without(lanes, tmp_path):
    up = lanes({"a": 0.0, "b": 0.0})
    text = config(up, """\
  p:
    hooks: [usage]
    members: [{model: b}, {model: a}]""", """\
  a: {provider: up, upstream_model: a}
  b: {provider: up, upstream_model: b}""", """\
admin_listen: "127.0.0.1:{admin}"
identity-providers:
  admin-tokens: {module: admin-tokens, token: {env: BB_ADMIN}}
auth: {chain: [keys], admin_auth: [admin-tokens], signing_key: {env: BB_SIGNING}}
store: {module: memory}
groups:
  limited: {limits: [{requests: 1000, per: minute}]}
  open: {limits: [{concurrent: 100}]}
""")
    from tests.conftest import free_port
    from tests.integration.gov_helpers import Admin
    admin = free_port()
    g = start_gateway(tmp_path, text.replace("{admin}", str(admin)), 1,
                      {"BB_SIGNING": SIGNING, "BB_ADMIN": ADMIN})
    try:
        a = Admin(admin)
        limited = a.mint(name="lim", group="limited")["token"]
        free = a.mint(name="free", group="open")["token"]
        # Under a requests limit the headroom is the key's, the same for every lane (as in the
        # Rust gateway): the pool is walked in member order.
        got = call(g.url, "p", 8, 1, {"authorization": "Bearer " + limited})
        assert got == ["b"] * 8
        # No requests/tokens limit: no signal, the strategy abstains, the pool is weighted.
        got = call(g.url, "p", 8, 1, {"authorization": "Bearer " + free})
        assert got.count("a") == 4 and got.count("b") == 4
    finally:
        stop(g.proc)


def test_strategies_leave_a_plain_pool_as_it_was(tmp_path, lanes):
    """A pool naming `weighted` (or nothing) has no plan: the same SWRR, no latency recorded."""
    from tests.inproc import InprocGateway
    up = lanes({"a": 0.0, "b": 0.0})
    text = config(up, """\
  w: {hooks: [weighted], members: [{model: a, weight: 3}, {model: b}]}
  n: {members: [{model: a}, {model: b}]}""", """\
  a: {provider: up, upstream_model: a}
  b: {provider: up, upstream_model: b}""")
    g = InprocGateway(text)
    try:
        snap = g.gw.snapshot
        assert snap.router.resolve("w").plan is None and snap.router.resolve("n").plan is None
        assert g.gw.snapshot.routing.recorder is None
        got = call(g.url, "w", 8, 1)
        assert got == ["a", "a", "b", "a", "a", "a", "b", "a"]
    finally:
        g.stop()


def test_the_latency_average_is_the_rust_smoothing():
    from busbar import config as cfgmod
    from busbar.routing.signals import Signals
    cfg = cfgmod.load(text="""
providers: {m: {protocol: openai, base_url: "http://127.0.0.1:9", api_key: {env: K}}}
models: {a: {provider: m}}
""", env={"K": "k"})

    class L:
        name = "a"
        _slot = 0
    s = Signals(cfg)
    assert s.latency_ms(L) is None
    s.record(L, 100_000_000)            # the first sample seeds it
    assert s.latency_ms(L) == 100.0
    s.record(L, 200_000_000)            # 0.2 * 200 + 0.8 * 100
    assert s.latency_ms(L) == 120.0
    assert json.dumps(s.latency_ms(L))
