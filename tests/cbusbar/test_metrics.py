"""cbusbar/metrics.pyx: Counting.on_finish counts each record under its own (ingress, pool, lane),
its one-entry memo of the last names included, and a reload that gives a name its own slots is
followed even when the names are the very same str objects as before; the status answered
decides busbar_requests_total's outcome; the end-to-end window's rings are emptied as thirds of
`buffer_seconds` pass, and the quantiles read from them stay within their bucket's error."""
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


def record(ingress, target, ns=1000, status=200, t_end=10**12, e2e=5_000_000):
    r = RequestRecord()
    r.ingress, r.target, r.lane, r.outcome = ingress, target, None, "ok"
    r.busbar_ns = ns
    r.status = status
    r.t_end = t_end
    r.t0 = t_end - e2e
    return r


def ok_count(m, ingress, target):
    """The requests counter of (ingress, pool, outcome ok), as /metrics renders it."""
    base = m._bases((ingress, target, None))[0]
    row = m.values()[base:base + len(M.OUTCOMES) * M.N_STATUS]
    return sum(row[o * M.N_STATUS] for o in range(len(M.OUTCOMES)))


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
        out = {g: v[L.admission + i] for i, g in enumerate(M.GATES) if v[L.admission + i]}
        out.update({g: v[L.denied + i] for i, g in enumerate(M.GOVERNANCE_GATES)
                    if v[L.denied + i]})
        return out

    for _ in range(3):
        m.hook(record("openai", "p"))
    assert refused() == {}
    shed = record("openai", None, status=503)
    shed.outcome = "shed"           # refused by the inbound concurrency cap before routing
    m.hook(shed)
    m.hook(shed)
    over = record("openai", "p", status=429)
    over.outcome, over.denied = "client_error", "budget"
    m.hook(over)
    assert refused() == {"inbound": 2, "budget": 1}


def test_the_status_answered_is_the_outcome_and_a_client_gone_is_none():
    L = M.Layout(load(), 1)
    m = M.Metrics(L, SharedCounters(L.size))
    for status in (200, 206, 503, 404, 429, 500, 502, 0):
        r = record("openai", "p", status=status)
        r.outcome = "client_gone" if status == 0 else "ok"
        m.hook(r)
    text = M.render(m).decode()
    lines = [x for x in text.splitlines() if x.startswith('busbar_requests_total{')]
    assert sorted(lines) == sorted([
        'busbar_requests_total{ingress_protocol="openai",pool="p",outcome="ok"} 2',
        'busbar_requests_total{ingress_protocol="openai",pool="p",outcome="exhausted"} 1',
        'busbar_requests_total{ingress_protocol="openai",pool="p",outcome="client_error"} 2',
        'busbar_requests_total{ingress_protocol="openai",pool="p",outcome="error"} 2'])
    assert 'busbar_request_outcomes_total{ingress_protocol="openai",pool="p",outcome="client_gone"} 1' \
        in text
    # The request nobody was answered has no duration either.
    assert 'busbar_request_duration_seconds_count{ingress_protocol="openai",pool="p"} 7' in text


def test_the_window_rolls_by_thirds_and_quantiles_stay_within_a_bucket():
    import random
    L = M.Layout(load(), 1, buffer_seconds=3)      # thirds of a second
    m = M.Metrics(L, SharedCounters(L.size))
    third = L.third_ns
    base = 1000 * third
    rnd = random.Random(7)
    times = [int(rnd.lognormvariate(-3, 1.2) * 1e9) for _ in range(2000)]
    for i, e2e in enumerate(times):
        # spread over two thirds: both in the window at the end of the second
        m.hook(record("openai", "p", t_end=base + (i % 2) * third + 1, e2e=e2e))
    w = m.window(base + third + 5)
    counts, lo, hi = w[(L.ing_i["openai"], L.pool_i["p"])]
    assert sum(counts) == len(times) and lo == min(times) and hi == max(times)
    srt = sorted(times)
    for q in (0.5, 0.9, 0.99):
        want = srt[int(q * (len(srt) - 1))]
        got = M.quantile(counts, lo, hi, q) * 1e9
        assert abs(got - want) / want <= 2 * M.E2E_ERROR + 0.01, (q, got, want)
    assert M.quantile(counts, lo, hi, 0.0) * 1e9 == lo and M.quantile(counts, lo, hi, 1.0) * 1e9 == hi
    # Three thirds later nothing of it is left: the window is empty, the totals stay.
    assert m.window(base + 4 * third) == {}
    # A request in a new third takes its ring (the one the first third used: 4 rings) empty.
    m.hook(record("openai", "p", t_end=base + 4 * third + 1, e2e=7_000_000))
    counts, lo, hi = m.window(base + 4 * third + 2)[(L.ing_i["openai"], L.pool_i["p"])]
    assert sum(counts) == 1 and lo == hi == 7_000_000
    v = m.values()
    b = m._bases(("openai", "p", None))[7]
    assert v[b + 1] == len(times) + 1 and v[b] == sum(times) + 7_000_000
