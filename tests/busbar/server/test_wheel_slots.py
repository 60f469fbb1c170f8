"""The Deadlines wheel keeps no empty slot for long (busbar/engine/deadlines.py): a slot whose owners
were all disarmed, or re-armed elsewhere, leaves the wheel at the next pruning sweep (every
`prune_secs`) instead of at its time (75 s later for an idle timeout), with the table that held a
burst of owners."""
import asyncio

import uvloop

from busbar.engine.deadlines import Deadlines
from tests.busbar.server.test_timeouts import Owner


def test_a_slot_emptied_by_disarm_or_rearm_leaves_the_wheel():
    loop = uvloop.new_event_loop()
    try:
        d = Deadlines(loop, 0.01, prune_secs=0.05)
        owners = [Owner([], i) for i in range(1000)]
        for o in owners:
            d.arm(o, 75.0)
        assert len(d.slots) <= 2 and sum(map(len, d.slots.values())) == 1000
        for o in owners[:500]:
            d.disarm(o)
        for o in owners[500:]:
            d.arm(o, 30.0)          # re-armed: the 75 s slot empties
        assert sum(map(len, d.slots.values())) == 500
        loop.run_until_complete(asyncio.sleep(0.12))
        assert d.slots and all(len(s) for s in d.slots.values())     # the 75 s slot is gone
        for o in owners[500:]:
            d.disarm(o)
        loop.run_until_complete(asyncio.sleep(0.12))
        assert not d.slots and all(o._slot is None for o in owners)
        assert d.handle is None     # an empty wheel stops sweeping
        d.arm(owners[0], 0.01)      # the wheel still works after emptying
        loop.run_until_complete(asyncio.sleep(0.05))
        assert not d.slots and owners[0]._slot is None
    finally:
        d.close()
        loop.close()
