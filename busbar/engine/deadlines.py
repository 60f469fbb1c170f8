# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""Coarse timeouts for every connection and attempt of one gateway process (busbar/server/gateway.py
makes one per worker; connections and exchanges arm it).

A timer wheel of `resolution`-second slots swept by one periodic callback, instead of a loop timer
armed and cancelled per request (call_later + cancel measured ~1-2 µs each on the hot path; arming
here is two dict operations). A deadline fires between its time and one resolution later.

The sweep sleeps until the earliest slot with an owner, not one resolution: a worker holding idle
keep-alive connections (each armed with the 75 s idle timeout) woke 10 times a second (100 with
an attempt_timeout_ms of 200) to find nothing due; ~1.6 ms of CPU a second, idle (measured). An
arm() sooner than the pending sweep moves it (rare: deadlines come later as time goes on).

An owner has a `_slot` attribute and an `on_deadline()` method; it is in at most one slot, and
leaves it when disarmed, so nothing is retained past its deadline. The request path's owners (the
client connection, the exchange) derive from `Timed`, whose `_slot` the compiled wheel reads as a
struct field; any other object with the two works too (the reliability queue's waiters).

Empty slots leave the wheel within `prune_secs` (the sweep drops them; the first owner to leave a
slot after a pruning brings the next sweep that close): kept until their time
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
        self.handle = None     # the pending sweep (None: the wheel is empty and asleep)
        self.next = 0          # the slot the pending sweep is for (-1 while a sweep runs)
        self.dirty = False     # an owner left a slot since the last pruning
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
            if not self.dirty:
                self._left()
        now = self.loop.time()
        # The first slot whose time is at or after the deadline.
        n = int((now + secs) / self.resolution) + 1
        slot = self.slots.get(n)
        if slot is None:
            slot = self.slots[n] = {}
            if self.handle is None:
                # No sweep pending means no other slot exists: the wheel restarts from now.
                self.swept = self.pruned = int(now / self.resolution)
                self._wake_at(n, now)
        if n < self.next:
            # Sooner than the pending sweep (which sleeps until the earliest deadline).
            self.handle.cancel()
            self._wake_at(n, now)
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
                if not self.dirty:
                    self._left()
            return
        slot = owner._slot
        if slot is not None:
            owner._slot = None
            del slot[owner]
            if not self.dirty:
                self._left()

    def _left(self):
        """The first owner to leave a slot since the last pruning: the emptied slot is dropped
        within prune_secs, so the sweep must not sleep longer than that."""
        self.dirty = True
        if self.next > 0:
            now = self.loop.time()
            p = self._prune_slot(int(now / self.resolution))
            if p < self.next:
                self.handle.cancel()
                self._wake_at(p, now)

    def _prune_slot(self, now):
        """The slot of the next pruning, after slot `now`."""
        p = self.pruned + self.prune_every
        return p if p > now else now + 1

    def _wake_at(self, n, now):
        """Schedules the sweep for slot `n` (its time plus a millisecond: the loop's timers count
        whole milliseconds, rounded down)."""
        self.next = n
        delay = n * self.resolution - now + 0.001
        self.handle = self.loop.call_later(delay if delay > 0.0 else 0.0, self._sweep)

    def _sweep(self):
        self.next = -1          # an arm() from an owner's on_deadline does not reschedule
        now = int(self.loop.time() / self.resolution)
        slots = self.slots
        n = self.swept
        if now - n <= len(slots):
            due = range(n + 1, now + 1)
        else:
            # A long sleep: the due slots in order, not every slot number since the last sweep.
            due = sorted([k for k in slots if k <= now])
        for k in due:
            if not slots:
                break
            slot = slots.pop(k, None)
            if slot:
                for owner in list(slot):
                    if owner._slot is slot:
                        owner._slot = None
                        try:
                            owner.on_deadline()
                        except Exception:  # one owner's bug must not stop the others' timeouts
                            log.exception("timeout handler failed")
        self.swept = now
        if self.dirty and now - self.pruned >= self.prune_every:
            self.pruned = now
            self.dirty = False
            for k in [k for k, slot in slots.items() if not slot]:
                del slots[k]
        # The next sweep: the earliest slot with an owner (the next few are looked at first: under
        # load the next slot is usually taken), or the next pruning if an owner left a slot.
        nxt = 0
        for k in range(now + 1, now + 9):
            if slots.get(k):
                nxt = k
                break
        if nxt == 0:
            for k, slot in slots.items():
                if slot and (nxt == 0 or k < nxt):
                    nxt = k
        if nxt == 0:
            # Nothing armed: the wheel sleeps until the next arm().
            slots.clear()
            self.handle = None
            self.next = 0
            self.dirty = False
            return
        if self.dirty:
            nxt = min(nxt, self._prune_slot(now))
        self._wake_at(nxt, self.loop.time())

    def close(self):
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.next = 0
        self.slots.clear()
