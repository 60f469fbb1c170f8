"""Property: in random worlds of lanes (healthy, tripped, saturated, budget-empty, context-limited,
failing) under each on_exhausted policy, selection never gives up while an eligible lane exists,
and the hop budget holds. Drives the same pieces the exchange does: Target.pick with the tried set,
the cells' outcomes, and Reliability.least_bad / why."""
from __future__ import annotations

from hypothesis import given, settings, strategies as st

from busbar.config.loader import build
from busbar.engine.snapshot import Snapshot
from busbar.engine.classify import D_TRANSIENT
from busbar.reliability.state import Reliability

KINDS = ("healthy", "tripped", "saturated", "budget_empty", "failing")


class Clock:
    t = 5000.0

    def __call__(self):
        return self.t


def world(kinds, policy, max_hops):
    models = []
    members = []
    for i, k in enumerate(kinds):
        extra = ", max_concurrent: 1" if k == "saturated" else (", max_requests: 1" if k == "budget_empty" else "")
        models.append("  m%d: {provider: p, upstream_model: u%d%s}" % (i, i, extra))
        members.append("{model: m%d}" % i)
    oe = {"reject": "reject", "least_bad": "least_bad"}[policy]
    text = """
providers: {p: {protocol: openai, base_url: "http://127.0.0.1:1", api_key: {env: K}}}
models:
%s
pools:
  pool: {members: [%s], on_exhausted: %s, failover: {max_hops: %d}}
""" % ("\n".join(models), ", ".join(members), oe, max_hops)
    config, out = build(text=text, env={"K": "sk-xxxxxxxxxxxx"})
    assert config is not None, out.errors
    snap = Snapshot(config)
    clock = Clock()
    rel = Reliability(config, clock=clock)
    rel.attach(snap)
    target = snap.router.resolve("pool")
    for lane, k in zip(target.lanes, kinds):
        cell = target.policy.cell_of[lane]
        if k == "tripped":
            cell.record(D_TRANSIENT)
        elif k == "saturated":
            assert lane.try_acquire()
        elif k == "budget_empty":
            assert cell.budget.take()
    return target, rel, clock


@settings(max_examples=150, deadline=None)
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=6),
       policy=st.sampled_from(["reject", "least_bad"]), max_hops=st.integers(0, 4))
def test_no_503_while_an_eligible_lane_exists_and_hops_hold(kinds, policy, max_hops):
    target, rel, clock = world(kinds, policy, max_hops)
    kind_of = dict(zip(target.lanes, kinds))
    tried = set()
    attempts = 0
    served = False
    while attempts < target.policy.max_attempts:
        lane = target.pick(tried)
        if lane is None and policy == "least_bad":
            lane = rel.least_bad(target, tried)
        if lane is None:
            eligible = [l for l, k in kind_of.items() if l not in tried and k in ("healthy", "failing")]
            assert not eligible, "exhausted while %s could take it" % eligible
            if policy == "least_bad":
                assert not [l for l, k in kind_of.items() if l not in tried and k == "tripped"]
            assert rel.why(target, tried)
            break
        attempts += 1
        tried.add(lane)
        cell = target.policy.cell_of[lane]
        k = kind_of[lane]
        assert k != "saturated" and k != "budget_empty"
        if k == "tripped":
            assert policy == "least_bad"
        lane.release()
        if k == "healthy":
            cell.budget.done(False)
            cell.record(None)
            served = True
            break
        cell.budget.done(True)
        cell.record(D_TRANSIENT)
    assert attempts <= max_hops + 1
    healthy_first = "healthy" in kinds
    if healthy_first and not served:
        # Only the hop budget may stop a request that had a healthy lane: every failing lane was
        # tried first.
        assert attempts == max_hops + 1
