"""Session affinity (`affinity: {mode: session}`, busbar/routing/signals.py and plan.py): a session
key, read from the pool's `header_name` (default x-session-id, as the Rust docs say), pins the
session to a lane while that lane can serve it; the pin is one truth for every worker (shared
memory), the table is bounded (`limits.affinity_max_sessions`), and a failover re-pins."""
from __future__ import annotations

import subprocess

import httpx
import pytest

from busbar import config as cfgmod
from busbar.routing.signals import WAYS, Signals
from tests.busbar.routing.test_strategies import Lanes, config
from tests.conftest import start_gateway, stop


def send(url, model, session=None, header="x-session-id"):
    """One call on a fresh connection (so calls spread over the workers); the lane that answered."""
    h = {header: session} if session is not None else {}
    with httpx.Client(timeout=30) as c:
        r = c.post(url + "/v1/chat/completions", headers=h,
                   json={"model": model, "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200, r.text
        return r.json()["model"]


@pytest.fixture
def two_lanes(tmp_path):
    up = Lanes({"a": 0.0, "b": 0.0})
    started = []

    def make(pool, workers=2):
        text = config(up, pool, """\
  a: {provider: up, upstream_model: a}
  b: {provider: up, upstream_model: b}""")
        g = start_gateway(tmp_path, text, workers, stderr=subprocess.DEVNULL)
        started.append(g)
        return g
    yield up, make
    for g in started:
        stop(g.proc)
    up.close()


def test_a_session_stays_on_its_lane_across_workers(two_lanes):
    up, make = two_lanes
    g = make("""\
  p:
    affinity: {mode: session}
    members: [{model: a}, {model: b}]""")
    for s in ("alpha", "beta", "gamma", "delta"):
        got = {send(g.url, "p", s) for _ in range(12)}
        assert len(got) == 1, (s, got)
    # New sessions are spread by weight; without the header, so are calls.
    lanes = {send(g.url, "p", "s-%d" % i) for i in range(16)}
    assert lanes == {"a", "b"}
    assert {send(g.url, "p") for _ in range(8)} == {"a", "b"}


def test_the_header_name_is_the_pools(two_lanes):
    up, make = two_lanes
    g = make("""\
  p:
    affinity: {mode: session, header_name: X-Conversation}
    members: [{model: a}, {model: b}]""")
    first = send(g.url, "p", "c1", header="x-conversation")
    assert all(send(g.url, "p", "c1", header="X-Conversation") == first for _ in range(10))
    # x-session-id means nothing to this pool.
    assert {send(g.url, "p", "c1") for _ in range(8)} == {"a", "b"}


def test_a_failover_re_pins_the_session_and_the_new_pin_holds(two_lanes):
    up, make = two_lanes
    g = make("""\
  p:
    affinity: {mode: session}
    failover: {max_hops: 1}
    members: [{model: a}, {model: b}]""")
    home = send(g.url, "p", "s1")
    other = "b" if home == "a" else "a"
    assert send(g.url, "p", "s1") == home
    up.fail.add(home)
    # The pinned lane fails: the call fails over (the caller sees the other lane's answer) and
    # the session is pinned there, for every worker.
    assert send(g.url, "p", "s1") == other
    up.fail.discard(home)
    assert [send(g.url, "p", "s1") for _ in range(10)] == [other] * 10


def test_affinity_with_a_strategy_pins_what_the_strategy_chose(two_lanes):
    up, make = two_lanes
    g = make("""\
  p:
    hooks: [least_busy]
    affinity: {mode: session}
    members: [{model: b}, {model: a}]""", workers=1)
    assert [send(g.url, "p", "s") for _ in range(5)] == ["b"] * 5


def _signals(sessions, clock):
    cfg = cfgmod.load(text="""
providers: {m: {protocol: openai, base_url: "http://127.0.0.1:9", api_key: {env: K}}}
models: {a: {provider: m}}
limits: {affinity_max_sessions: %d}
""" % sessions, env={"K": "k"})
    assert cfg.limits.affinity_max_sessions == sessions
    return Signals(cfg, clock=clock)


def test_the_session_table_is_bounded_and_forgets_the_least_recently_used():
    t = [100.0]
    s = _signals(WAYS, lambda: t[0])       # one set of four
    fps = [Signals.fingerprint(b"pool", b"s%d" % i) for i in range(5)]
    for i, fp in enumerate(fps[:4]):
        t[0] += 1
        s.pin(fp, i)
    t[0] += 1
    assert s.pinned(fps[0]) == 0            # used again: now the most recent
    t[0] += 1
    s.pin(fps[4], 4)                        # the set is full: the least recently used goes
    assert s.pinned(fps[1]) is None
    assert [s.pinned(fps[i]) for i in (0, 2, 3, 4)] == [0, 2, 3, 4]
    assert s.sessions() == WAYS
    # A big table holds many; never more than its size.
    s = _signals(64, lambda: t[0])
    for i in range(1000):
        s.pin(Signals.fingerprint(b"pool", b"x%d" % i), i % 3)
    assert s.sessions() <= 64


def test_a_re_pin_overwrites_and_the_scope_separates_pools():
    s = _signals(1024, lambda: 1.0)
    fp = Signals.fingerprint(b"pool-a", b"s")
    s.pin(fp, 0)
    s.pin(fp, 1)
    assert s.pinned(fp) == 1 and s.sessions() == 1
    assert s.pinned(Signals.fingerprint(b"pool-b", b"s")) is None


def test_the_limit_is_checked():
    with pytest.raises(cfgmod.ConfigError) as e:
        cfgmod.load(text="""
providers: {m: {protocol: openai, base_url: "http://127.0.0.1:9", api_key: {env: K}}}
models: {a: {provider: m}}
limits: {affinity_max_sessions: 0}
""", env={"K": "k"})
    assert "limits.affinity_max_sessions: must be >= 1, got 0" in str(e.value)
