"""busbar/engine/deadlines.py: the wheel's two kinds of owner (a `Timed` subclass, whose slot the
compiled wheel reads as a struct field, and any object with `_slot` and `on_deadline`, like the
reliability queue's waiters) fire, disarm and re-arm alike, side by side in one wheel."""
import asyncio

import uvloop

from busbar.engine import deadlines
from busbar.engine.deadlines import Deadlines, Timed


def _owner(base):
    """An owner class on `base`: Timed (the wheel reads its _slot as a struct field) or object."""
    class Owner(base):
        def __init__(self, log, name):
            self._slot = None
            self.log = log
            self.name = name

        def on_deadline(self):
            self.log.append(self.name)
    Owner.__name__ = "TimedOwner" if base is Timed else "PlainOwner"
    return Owner


TimedOwner = _owner(Timed)
PlainOwner = _owner(object)


def test_the_wheel_is_compiled():
    assert deadlines.__file__.endswith(".so")


def test_timed_and_plain_owners_fire_disarm_and_rearm_alike():
    loop = uvloop.new_event_loop()
    log = []
    d = Deadlines(loop, 0.01, prune_secs=0.05)
    try:
        owners = [cls(log, "%s-%d" % (cls.__name__, i))
                  for cls in (TimedOwner, PlainOwner) for i in range(4)]
        for o in owners:
            d.arm(o, 0.02)
        for o in owners:
            assert o._slot is not None and o in o._slot
        d.disarm(owners[1])             # a Timed owner leaves
        d.disarm(owners[5])             # a plain one too
        d.arm(owners[2], 5.0)           # re-armed far away: leaves its first slot
        d.arm(owners[6], 5.0)
        assert owners[1]._slot is None and owners[5]._slot is None
        assert owners[2] not in d.slots[min(d.slots)]
        loop.run_until_complete(asyncio.sleep(0.1))
        assert sorted(log) == sorted(o.name for i, o in enumerate(owners) if i not in (1, 2, 5, 6))
        assert all(owners[i]._slot is None for i in (0, 3, 4, 7))
        assert owners[2]._slot is not None and owners[6]._slot is not None
        d.disarm(owners[2])
        d.disarm(owners[6])
        d.disarm(owners[0])             # not armed: nothing happens
        loop.run_until_complete(asyncio.sleep(0.1))
        assert len(log) == 4 and not d.slots
    finally:
        d.close()
        loop.close()


def test_the_sweep_sleeps_until_the_earliest_deadline():
    """An idle worker's keep-alive connections (armed 75 s ahead) cost no wake-up every resolution:
    the sweep sleeps until the earliest slot; a sooner arm() moves it; an owner leaving brings it
    to the next pruning; due slots after a long sleep fire in order."""
    loop = uvloop.new_event_loop()
    log = []
    d = Deadlines(loop, 0.01, prune_secs=0.05)
    try:
        far = TimedOwner(log, "far")
        d.arm(far, 5.0)
        swept = d.swept
        assert d.next * d.resolution - loop.time() > 4.9
        loop.run_until_complete(asyncio.sleep(0.15))
        assert d.swept == swept and log == []           # no sweep ran in 15 resolutions
        near = PlainOwner(log, "near")
        d.arm(near, 0.03)                               # sooner: the sweep moves
        assert d.next * d.resolution - loop.time() < 0.06
        loop.run_until_complete(asyncio.sleep(0.1))
        assert log == ["near"]
        assert d.next * d.resolution - loop.time() > 4.5    # back to sleep until "far"
        swept = d.swept
        d.disarm(far)                                   # a slot emptied: pruned within 0.05 s
        loop.run_until_complete(asyncio.sleep(0.12))
        assert d.swept > swept and not d.slots and d.handle is None
        order = [TimedOwner(log, "a"), PlainOwner(log, "b"), TimedOwner(log, "c")]
        for o, secs in zip(order, (0.3, 0.2, 0.25)):
            d.arm(o, secs)
        loop.run_until_complete(asyncio.sleep(0.45))
        assert log == ["near", "b", "c", "a"] and not d.slots and d.handle is None
    finally:
        d.close()
        loop.close()
