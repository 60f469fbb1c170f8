"""Where reliability keeps its state (busbar/reliability/state.py): the blocks of lanes, cells and
pools in the shared mapping, kept across reloads by what survives, fresh for the rest, reused
only after a quarantine, never overlapping the lane permits."""
from __future__ import annotations

import pytest

from busbar.admin.live import assign_slots, next_snapshot
from busbar.config.loader import build
from busbar.engine.snapshot import Snapshot
from busbar.reliability.breaker import CLOSED, OPEN
from busbar.engine.classify import D_TRANSIENT
from busbar.reliability.state import BLOCK, NoRoom, Reliability, capacity
from cbusbar.shared import SharedCounters

BASE = """
providers: {p: {protocol: openai, base_url: "http://127.0.0.1:1", api_key: {env: K}}}
models:
  a: {provider: p, upstream_model: ua, max_concurrent: 2}
  b: {provider: p, upstream_model: ub}
pools:
  one: {members: [{model: a}, {model: b}], breaker: {trip: {mode: consecutive, consecutive_n: 1}}}
"""


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def cfg(text):
    config, out = build(text=text, env={"K": "sk-xxxxxxxxxxxxxxxx"})
    assert config is not None, out.errors
    return config


def boot(text, shared=None, clock=None):
    config = cfg(text)
    snap = Snapshot(config, shared)
    rel = Reliability(config, shared, clock=clock or Clock())
    rel.attach(snap)
    return rel, snap


def reload(rel, old, text, shared=None):
    config = cfg(text)
    slots = assign_slots(old.router, config, shared, rel.offset if shared is not None else None)
    layout = rel.plan(config, old.router)
    snap, _ = next_snapshot(old, config, old.version + 1, shared, slots)
    rel.attach(snap, layout)
    return snap, layout


def test_every_worker_plans_the_same_boot_layout_and_blocks_never_overlap():
    config = cfg(BASE)
    shared = SharedCounters(256 + capacity(config))
    r1, _ = boot(BASE, shared)
    r2, _ = boot(BASE, shared)
    assert r1.layout == r2.layout
    bases = [b for kind in r1.layout.values() for b in kind.values()]
    assert len(set(bases)) == len(bases)
    assert min(bases) >= r1.offset == shared.size - capacity(config) >= 256
    assert all((b - r1.offset) % BLOCK == 0 for b in bases)


def test_a_reload_keeps_what_survives_and_gives_the_rest_fresh_blocks():
    config = cfg(BASE)
    shared = SharedCounters(256 + capacity(config))
    rel, snap = boot(BASE, shared)
    before = dict(rel.layout["cells"]), dict(rel.layout["lanes"])
    cell_a = rel.cells[("one", "a")]
    cell_a.record(D_TRANSIENT)
    assert cell_a.state() == OPEN
    # b's model changes (a new lane: its cells start fresh); a pool is added; a survives.
    text = BASE.replace("upstream_model: ub", "upstream_model: ub2") + \
        "  two: {members: [{model: a}]}\n"
    snap2, layout = reload(rel, snap, text, shared)
    assert layout["cells"][("one", "a")] == before[0][("one", "a")]
    assert rel.cells[("one", "a")] is cell_a and cell_a.state() == OPEN
    assert layout["cells"][("one", "b")] != before[0][("one", "b")]
    assert layout["cells"][("", "b")] != before[0][("", "b")]
    assert layout["lanes"] == before[1]                 # lane blocks are kept by name
    assert rel.cells[("two", "a")].state() == CLOSED
    t = snap2.router.resolve("two")
    assert t.policy is not None and t.cells[0] is rel.cells[("two", "a")]
    # The permits of new lanes never land in reliability's blocks.
    assert all(lane._slot < rel.offset for lane in snap2.router.lanes.values()
               if lane.limit is not None)


def test_dropped_blocks_are_reused_only_after_the_quarantine_and_zeroed():
    clock = Clock()
    rel, snap = boot(BASE, clock=clock)
    two = BASE + "  two: {members: [{model: a}]}\n"
    snap, layout = reload(rel, snap, two)
    dropped = layout["cells"][("two", "a")]
    rel.cells[("two", "a")].record(D_TRANSIENT)
    snap, layout = reload(rel, snap, BASE)             # "two" gone: its blocks in quarantine
    snap, layout = reload(rel, snap, two)
    assert layout["cells"][("two", "a")] != dropped     # still in quarantine
    clock.t += 10_000
    snap, layout = reload(rel, snap, BASE)
    snap, layout = reload(rel, snap, two.replace("two", "three"))
    assert layout["cells"][("three", "a")] == dropped    # the oldest block past its quarantine
    assert rel.cells[("three", "a")].state() == CLOSED   # zeroed: the tripped state is gone


def test_a_reload_beyond_the_mapping_is_refused():
    config = cfg(BASE)
    cap = capacity(config)
    shared = SharedCounters(256 + cap)
    rel, snap = boot(BASE, shared)
    many = BASE + "".join("  x%d: {members: [{model: a}, {model: b}]}\n" % i
                          for i in range(cap // BLOCK))
    with pytest.raises(NoRoom):
        reload(rel, snap, many, shared)
