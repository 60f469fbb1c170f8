"""cbusbar/metrics.pyx: Counting.on_finish counts each record under its own (ingress, pool, lane),
its one-entry memo of the last names included, and a reload that gives a name its own slots is
followed even when the names are the very same str objects as before."""
from __future__ import annotations

from cbusbar.record import RequestRecord
from cbusbar.shared import SharedCounters

from busbar import config as cfgmod
from busbar.observability import metrics as M

BASE = """
listen: "127.0.0.1:1"
providers:
  m: {{protocol: openai, base_url: "http://127.0.0.1:9", api_key: {{env: K}}}}
models:
  a: {{provider: m, upstream_model: a}}
pools:
  p: {{members: [{{model: a}}]}}
{more}"""


def load(more=""):
    return cfgmod.load(text=BASE.format(more=more), env={"K": "k" * 24})


def record(ingress, target, ns=1000):
    r = RequestRecord()
    r.ingress, r.target, r.lane, r.outcome = ingress, target, None, "ok"
    r.busbar_ns = ns
    return r


def ok_count(m, ingress, target):
    """The requests counter of (ingress, pool, outcome ok), as /metrics renders it."""
    base = m._bases((ingress, target, None))[0]
    return m.values()[base + M.OUTCOMES.index("ok")]


def test_each_record_counted_under_its_own_names_as_they_alternate():
    L = M.Layout(load("  p2: {members: [{model: a}]}\n"), 1)
    m = M.Metrics(L, SharedCounters(L.size))
    p, p2 = "".join(["p"]), "".join(["p2"])
    for ingress, target in [("openai", p), ("openai", p), ("anthropic", p), ("openai", p2),
                            ("openai", p), ("anthropic", p2), ("anthropic", p2)]:
        m.hook(record(ingress, target))
    assert ok_count(m, "openai", "p") == 3
    assert ok_count(m, "anthropic", "p") == 1
    assert ok_count(m, "openai", "p2") == 1
    assert ok_count(m, "anthropic", "p2") == 2


def test_a_reload_that_adds_the_pool_moves_it_out_of_unresolved():
    c1 = load()
    L = M.Layout(c1, 1)
    m = M.Metrics(L, SharedCounters(L.size))
    q = "".join(["q"])      # one str object, as a config's names are, request after request
    m.hook(record("openai", q))
    assert ok_count(m, "openai", M.UNRESOLVED) == 1       # not a configured pool yet
    plan = L.plan(load("  q: {members: [{model: a}]}\n"))
    assert plan["left_out"] == []
    L.adopt(plan)
    m.hook(record("openai", q))
    m.hook(record("openai", q))
    assert ok_count(m, "openai", "q") == 2
    assert ok_count(m, "openai", M.UNRESOLVED) == 1


def test_admission_refusals_by_gate_and_nothing_for_answered_requests():
    L = M.Layout(load(), 1)
    m = M.Metrics(L, SharedCounters(L.size))

    def refused():
        v = m.values()
        return {g: v[L.admission + i] for i, g in enumerate(M.GATES) if v[L.admission + i]}

    for _ in range(3):
        m.hook(record("openai", "p"))
    assert refused() == {}
    shed = record("openai", None)
    shed.outcome = "shed"           # refused by the inbound concurrency cap before routing
    m.hook(shed)
    m.hook(shed)
    over = record("openai", "p")
    over.outcome, over.denied = "client_error", "budget"
    m.hook(over)
    assert refused() == {"inbound_concurrency": 2, "budget": 1}
