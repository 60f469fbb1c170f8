"""busbar.routing: SWRR order, permits (skipped, never queued), exclusion, lane-global limits."""
from __future__ import annotations

import textwrap

import pytest

from busbar.config import load
from busbar.routing import Lane, Router, Target


def router(models: str, pools: str = "") -> Router:
    text = "providers:\n  ollama:\nmodels:\n" + textwrap.indent(textwrap.dedent(models), "  ")
    if pools:
        text += "pools:\n" + textwrap.indent(textwrap.dedent(pools), "  ")
    return Router(load(text=text, env={}))


def picks(target: Target, n: int, exclude=frozenset()) -> list[str]:
    """n picks, each released at once (no concurrency pressure)."""
    seq = []
    for _ in range(n):
        lane = target.pick(exclude)
        seq.append(None if lane is None else lane.name)
        if lane is not None:
            lane.release()
    return seq


ABC = """
a: {provider: ollama}
b: {provider: ollama}
c: {provider: ollama}
"""


def test_swrr_5_1_1_is_the_nginx_sequence():
    r = router(ABC, "p: {members: [{model: a, weight: 5}, {model: b}, {model: c}]}\n")
    assert picks(r.resolve("p"), 14) == list("aabacaa" * 2)


def test_swrr_proportions_and_spread():
    r = router(ABC, "p: {members: [{model: a, weight: 3}, {model: b, weight: 2}, {model: c, weight: 1}]}\n")
    seq = picks(r.resolve("p"), 600)
    assert (seq.count("a"), seq.count("b"), seq.count("c")) == (300, 200, 100)
    assert "aaa" not in "".join(seq)  # smooth: never a burst of the heavy member


def test_equal_weights_rotate():
    r = router(ABC, "p: {members: [{model: a}, {model: b}, {model: c}]}\n")
    assert picks(r.resolve("p"), 6) == list("abcabc")


def test_member_at_capacity_is_skipped_not_queued():
    r = router(
        "a: {provider: ollama, max_concurrent: 1}\nb: {provider: ollama}\n",
        "p: {members: [{model: a, weight: 5}, {model: b}]}\n",
    )
    p = r.resolve("p")
    held = p.pick()
    assert held is r.lanes["a"] and held.inflight == 1
    # a is full: every pick goes to b at once; a's current weight does not move meanwhile.
    frozen = p.current[0]
    assert picks(p, 4) == ["b"] * 4
    assert p.current[0] == frozen
    held.release()
    # The 5/1 cycle (a a a b a a) resumes where the held pick left it, as if b's extra picks
    # had never happened: a lane's skip costs it nothing.
    assert picks(p, 5) == ["a", "a", "b", "a", "a"]
    assert picks(p, 6) == ["a", "a", "a", "b", "a", "a"]


def test_nobody_eligible_returns_none_and_takes_nothing():
    r = router(
        "a: {provider: ollama, max_concurrent: 1}\nb: {provider: ollama, max_concurrent: 2}\n",
        "p: {members: [{model: a}, {model: b}]}\n",
    )
    p = r.resolve("p")
    held = [p.pick(), p.pick(), p.pick()]
    assert sorted(lane.name for lane in held) == ["a", "b", "b"]
    before = list(p.current)
    assert p.pick() is None
    assert p.current == before
    assert (r.lanes["a"].inflight, r.lanes["b"].inflight) == (1, 2)


def test_exclude_set():
    r = router(ABC, "p: {members: [{model: a, weight: 5}, {model: b}, {model: c}]}\n")
    p = r.resolve("p")
    a, b, c = (r.lanes[n] for n in "abc")
    assert set(picks(p, 10, exclude={a})) == {"b", "c"}
    assert picks(p, 3, exclude=frozenset({a, b})) == ["c", "c", "c"]
    assert picks(p, 2, exclude={a, b, c}) == [None, None]
    assert all(lane.inflight == 0 for lane in (a, b, c))


def test_failover_walk_excludes_tried_lanes():
    r = router(ABC, "p: {members: [{model: a}, {model: b}, {model: c}]}\n")
    p = r.resolve("p")
    tried: set[Lane] = set()
    walk = []
    while (lane := p.pick(tried)) is not None:
        walk.append(lane.name)
        tried.add(lane)
        lane.release()
    assert sorted(walk) == ["a", "b", "c"]


def test_permits_are_lane_global_across_pools_and_the_direct_route():
    r = router(
        "a: {provider: ollama, max_concurrent: 2}\nb: {provider: ollama}\n",
        "p1: {members: [{model: a, weight: 10}, {model: b}]}\np2: {members: [{model: a, weight: 10}, {model: b}]}\n",
    )
    a = r.lanes["a"]
    assert r.resolve("p1").pick() is a
    assert r.resolve("p2").pick() is a
    assert a.inflight == 2
    assert r.resolve("a").pick() is None  # the direct route sees the same full lane
    assert r.resolve("p2").pick() is r.lanes["b"]
    a.release()
    assert r.resolve("a").pick() is a
    assert a.inflight == 2


def test_current_weights_are_per_pool():
    r = router(ABC, "p1: {members: [{model: a, weight: 2}, {model: b}]}\n"
                    "p2: {members: [{model: a, weight: 2}, {model: b}]}\n")
    p1, p2 = r.resolve("p1"), r.resolve("p2")
    assert picks(p1, 2) == ["a", "b"]
    assert picks(p2, 3) == ["a", "b", "a"]  # p2 starts fresh, unaffected by p1's picks
    assert picks(p1, 1) == ["a"]


def test_release_and_try_acquire():
    r = router("a: {provider: ollama, max_concurrent: 2}\n")
    lane = r.lanes["a"]
    assert lane.limit == 2 and lane.model.name == "a"
    assert lane.try_acquire() and lane.try_acquire()
    assert not lane.try_acquire()
    assert lane.inflight == 2
    lane.release()
    assert lane.inflight == 1 and lane.try_acquire()
    lane.release()
    lane.release()
    assert lane.inflight == 0
    with pytest.raises(RuntimeError):
        lane.release()
    unbounded = Router(load(text="providers: {ollama: }\nmodels: {u: {provider: ollama}}\n", env={})).lanes["u"]
    assert unbounded.limit is None
    assert all(unbounded.try_acquire() for _ in range(1000))


def test_direct_model_target():
    r = router("a: {provider: ollama, max_concurrent: 1}\n")
    t = r.resolve("a")
    assert (t.name, t.is_pool) == ("a", False)
    lane = t.pick()
    assert lane is r.lanes["a"]
    assert t.pick() is None
    assert t.pick(exclude={lane}) is None
    lane.release()
    assert t.pick(exclude={lane}) is None
    assert t.pick() is lane


def test_resolve_and_names():
    r = router(
        "zeta: {provider: ollama}\nalpha: {provider: ollama}\n",
        "zpool: {members: [{model: zeta}]}\napool: {members: [{model: alpha}]}\n",
    )
    assert r.names() == ["apool", "zpool", "alpha", "zeta"]
    assert r.resolve("apool").is_pool and not r.resolve("alpha").is_pool
    assert r.resolve("missing") is None
    assert set(r.lanes) == {"zeta", "alpha"}
    assert r.resolve("zpool").lanes == (r.lanes["zeta"],)


def test_member_reasoning_override():
    r = router(
        "a: {provider: ollama, reasoning: true}\nb: {provider: ollama}\n",
        "p: {members: [{model: a, reasoning: false}, {model: b, reasoning: true}]}\n",
    )
    p = r.resolve("p")
    assert p.reasoning(r.lanes["a"]) is False
    assert p.reasoning(r.lanes["b"]) is True
    assert r.resolve("a").reasoning(r.lanes["a"]) is True
    assert r.resolve("b").reasoning(r.lanes["b"]) is False


def test_permits_shared_across_worker_processes():
    # Two routers over one SharedCounters stand for two worker processes: max_concurrent: 2 holds
    # for both together, and a release in one frees the permit for the other.
    import os

    from cbusbar.shared import SharedCounters

    from busbar.config import load as _load
    cfg = _load(text="providers: {ollama: }\nmodels: {a: {provider: ollama, max_concurrent: 2}, "
                     "b: {provider: ollama}}\npools: {p: {members: [{model: a}, {model: b}]}}\n", env={})
    shared = SharedCounters(len(cfg.models))
    r1, r2 = Router(cfg, shared), Router(cfg, shared)
    assert r1.resolve("a").pick() is r1.lanes["a"]
    assert r2.resolve("a").pick() is r2.lanes["a"]
    assert r1.resolve("a").pick() is None and r2.resolve("a").pick() is None
    # the pool skips the full lane and takes b
    assert r2.resolve("p").pick() is r2.lanes["b"]
    pid = os.fork()
    if pid == 0:  # a real other process releases its permit
        r2.lanes["a"].release()
        os._exit(0)
    os.waitpid(pid, 0)
    assert shared.value(0) == 1
    assert r1.resolve("a").pick() is r1.lanes["a"]
