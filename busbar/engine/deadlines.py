# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""Coarse timeouts for every connection and attempt of one gateway process (busbar/server/gateway.py
makes one per worker; connections and exchanges arm it).

A timer wheel of `resolution`-second slots swept by one periodic callback, instead of a loop timer
armed and cancelled per request (call_later + cancel measured ~1-2 µs each on the hot path; arming
here is two dict operations). A deadline fires between its time and one resolution later.

An owner has a `_slot` attribute and an `on_deadline()` method; it is in at most one slot, and
leaves it when disarmed, so nothing is retained past its deadline. The request path's owners (the
client connection, the exchange) derive from `Timed`, whose `_slot` the compiled wheel reads as a
struct field; any other object with the two works too (the reliability queue's waiters).

Empty slots leave the wheel within `prune_secs` (the sweep drops them): kept until their time
(an idle timeout is 75 s), the emptied slots of a burst of connections, some with the table of
a thousand owners, held memory long after the burst (bench/soak_memory.py). Dropped by the
sweep rather than by each disarm, which would free and rebuild a slot per request when
requests come one at a time (callgrind: +2.5k instructions a small request)."""
from __future__ import annotations

import logging

log = logging.getLogger("busbar")


class Timed:
    """A wheel owner's slot (None while no deadline of it runs); subclasses answer on_deadline."""

    def on_deadline(self):
        pass


class Deadlines:

    def __init__(self, loop, resolution, prune_secs=1.0):
        self.loop = loop
        self.resolution = resolution
        self.slots = {}        # slot number → {owner: None}
        self.swept = 0         # every slot up to this number has fired
        self.handle = None
        self.prune_every = max(1, int(prune_secs / resolution))    # in slots
        self.pruned = 0        # the slot number at the last pruning

    def arm(self, owner, secs):
        if isinstance(owner, Timed):
            t = owner
            old = t._slot
        else:
            t = None
            old = owner._slot
        if old is not None:
            del old[owner]
        now = self.loop.time()
        # The first slot whose time is at or after the deadline.
        n = int((now + secs) / self.resolution) + 1
        slot = self.slots.get(n)
        if slot is None:
            slot = self.slots[n] = {}
            if self.handle is None:
                # No sweep pending means no other slot exists: the wheel restarts from now.
                self.swept = self.pruned = int(now / self.resolution)
                self.handle = self.loop.call_later(self.resolution, self._sweep)
        slot[owner] = None
        if t is not None:
            t._slot = slot
        else:
            owner._slot = slot

    def disarm(self, owner):
        if isinstance(owner, Timed):
            t = owner
            slot = t._slot
            if slot is not None:
                t._slot = None
                del slot[owner]
            return
        slot = owner._slot
        if slot is not None:
            owner._slot = None
            del slot[owner]

    def _sweep(self):
        self.handle = None
        now = int(self.loop.time() / self.resolution)
        slots = self.slots
        n = self.swept
        while n < now and slots:
            n += 1
            slot = slots.pop(n, None)
            if slot:
                for owner in list(slot):
                    if owner._slot is slot:
                        owner._slot = None
                        try:
                            owner.on_deadline()
                        except Exception:  # one owner's bug must not stop the others' timeouts
                            log.exception("timeout handler failed")
        self.swept = now
        if now - self.pruned >= self.prune_every:
            self.pruned = now
            for k in [k for k, slot in slots.items() if not slot]:
                del slots[k]
        if slots:
            self.handle = self.loop.call_later(self.resolution, self._sweep)

    def close(self):
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.slots.clear()
