"""In-process: the parent's plans for a reload. Metric names keep their slots and new ones take
spares (past them a name is left out and said so); breaker cells of a new pool go where the plan
puts them in every worker, and a plan past the spare slots is refused."""
from __future__ import annotations

import pytest

from busbar import config as cfgmod
from busbar.engine.snapshot import Snapshot
from busbar.observability import metrics as M
from busbar.reliability import state as S

BASE = """
listen: "127.0.0.1:1"
providers:
  m: {provider_kw}
models:
  a: {{provider: m, upstream_model: a}}
  b: {{provider: m, upstream_model: b}}
{more}pools:
  p: {{members: [{{model: a}}, {{model: b}}]}}
{pools}"""


def load(more="", pools=""):
    text = BASE.format(provider_kw='{protocol: openai, base_url: "http://127.0.0.1:9", api_key: {env: K}}',
                       more=more, pools=pools)
    return cfgmod.load(text=text, env={"K": "k" * 24})


def test_metric_names_keep_their_slots_and_new_ones_take_spares(monkeypatch):
    c1 = load()
    L = M.Layout(c1, 2)
    before = dict(L.pool_i), dict(L.pair_i), L.size
    c2 = load("  c: {provider: m, upstream_model: c}\n", "  q: {members: [{model: c}, {model: a}]}\n")
    plan = L.plan(c2)
    assert plan["left_out"] == []
    L.adopt(plan)
    assert all(L.pool_i[k] == v for k, v in before[0].items())
    assert all(L.pair_i[k] == v for k, v in before[1].items())
    assert {"q", "c"} <= set(L.pool_i) and ("q", "c") in L.pair_i and L.size == before[2]
    # A worker that adopts the same plan agrees slot for slot.
    other = M.Layout(c1, 2)
    other.adopt(plan)
    assert other.pool_i == L.pool_i and other.pair_i == L.pair_i and other.lanes == L.lanes
    # Past the spares: left out, counted as unresolved.
    monkeypatch.setattr(M, "SPARE_POOLS_MIN", 1)
    small = M.Layout(c1, 1)         # room for as many names again as the boot config's
    many = load("".join("  x%d: {provider: m, upstream_model: x}\n" % i for i in range(10)))
    plan = small.plan(many)
    assert len(plan["pools"]) == small.P and len(plan["left_out"]) == 10 - (small.P - 4)


def test_breaker_cells_of_a_new_pool_go_where_the_plan_puts_them():
    from cbusbar.shared import SharedCounters
    c1 = load()
    c2 = load("  c: {provider: m, upstream_model: c}\n", "  q: {members: [{model: c}, {model: a}]}\n")
    shared = SharedCounters(256 + S.capacity(c1))
    workers = [S.Reliability(c1, shared) for _ in range(2)]
    for r in workers:
        r.attach(Snapshot(c1, shared))
    plan = workers[0].plan(c2)
    assert ("q", "c") in plan and ("lane", "c") in plan and ("p", "a") not in plan
    for r in workers:
        r.attach(Snapshot(c2, shared), plan)
    a, b = (r.cells[("q", "c")] for r in workers)
    assert a.base == b.base == plan[("q", "c")]
    assert workers[0].cells[("p", "a")].base == workers[1].cells[("p", "a")].base
    # One worker trips the new cell; the other sees it open.
    a.slots.store(a.base + 0, 1)
    assert b.state() == 1
    assert {c for c in workers[0].live} >= {workers[0].cells[("q", "c")]}
    assert ("p", "b") in {(c.pool, c.lane.name) for c in workers[0].live}


def test_a_plan_past_the_spare_slots_is_refused(monkeypatch):
    monkeypatch.setattr(S, "SPARE_SLOTS_MIN", 0)
    c1 = load()
    rel = S.Reliability(c1)
    rel.attach(Snapshot(c1))
    more = "".join("  x%d: {provider: m, upstream_model: x}\n" % i for i in range(40))
    with pytest.raises(S.NoRoom):
        rel.plan(load(more))
