"""`on_exhausted: {queue: {max_ms}}` (SPEC §4.3): a request whose pool's lanes are all at capacity
waits for a lane permit, first come first served, up to `min(max_ms, what is left of the failover
budget)`, then is answered as `reject` would (503 in the caller's shape, Retry-After).

Only saturation queues: when no candidate lane of the pool is at capacity (they are cooling down,
out of budget, or there are none), the request is shed at once. A waiter waits on every saturated
candidate lane of its pool at once; the first permit of any of them is its.

One worker. Each Lane with a queue has a FIFO of this worker's waiters (`LaneQueue`, an insertion-
ordered dict: O(1) to add, take the head, or remove a waiter that left). `Lane.release()` hands the
permit straight to the head waiter instead of freeing it (busbar/routing/swrr.py): exactly one
waiter is woken per released permit, and a request arriving meanwhile cannot take it first (while
anyone waits for a lane, a fresh acquire of it fails: the lane counts as at capacity). The woken
request runs on the next loop turn, re-checks the breaker (its cell's claim, which also takes the
lane's request budget) and is attempted on that lane; if the cell no longer admits, the permit goes
to the next waiter and the request selects again (and may wait again, for what is left of its
deadline). The wait is bounded by the worker's deadline wheel (the waiter is its owner, no timer of
its own); a client that leaves while queued is removed at once (Exchange.finish calls `leave`).

Several workers. Lane permits are one counter in shared memory (cbusbar/shared.pyx), so a permit
released in worker B must be able to reach a waiter in worker A. The lane's block
(busbar/reliability/state.py) holds, for every worker together, the number of waiters (`L_WAITING`:
the "someone waits" barrier above) and the enqueue time of the oldest one (`L_OLDEST`, monotonic
ms, one clock for the host). A release hands its permit to a local waiter only when that waiter is
the oldest of the gateway; otherwise the permit goes back to the shared counter, and the worker
holding the oldest waiter takes it by polling: while a worker has waiters on shared lanes it polls
every 1 ms, doubling to 16 ms (`limits.queue_poll_max_ms`) while nothing comes, back to 1 ms after
each grant. A poll re-asserts
the worker's head in `L_OLDEST` (compare-and-swap to the minimum: when the oldest waiter leaves,
its worker writes its next head or 0, and the others' heads are back within one poll), and takes
free permits for its head while its head is the oldest. Cost: nothing at all while nobody waits;
while waiting, at most 1000 wake-ups a second per worker (about 60 once the backoff settles), each
a few atomic loads per lane with waiters, and a permit crossing workers waits up to 16 ms (mean
about half) before it is used. FIFO across workers is as exact as that convergence: a head that
just changed may lose one permit to the next-oldest worker. An `L_OLDEST` older than the longest
configured max_ms is stale (its worker died) and ignored. Wake-ups through the deadline wheel
would cost the same wheel resolution (5-100 ms) on every crossing; an eventfd per worker would
make crossings immediate but needs a descriptor per worker pair and a reader in every loop.
A worker that dies with waiters leaves its count behind (the lane then refuses fresh acquires and
can only be reached through the queue), as it leaves behind the permits it held.
"""
from __future__ import annotations

import time

from busbar.reliability.breaker import L_OLDEST, L_WAITING

WAITING = 0
GRANTED = 1     # a permit is the waiter's; its request runs on the next loop turn
DONE = 2

# Cross-worker polling (see the module docstring): from 1 ms, doubling while nothing was taken,
# to limits.queue_poll_max_ms (16 by default: its reason is in busbar/config/schema.py).
POLL_MIN_SECS = 0.001
# An L_OLDEST older than the longest configured max_ms plus this is a dead worker's: ignored.
STALE_MARGIN_MS = 1000

_perf_ns = time.perf_counter_ns


class Waiter:
    """One queued request. Owner of a slot of the worker's deadline wheel (`_slot`,
    `on_deadline`) for its max_ms."""

    __slots__ = ("qs", "ex", "target", "queues", "t_ms", "deadline", "state", "lane", "pool_slot",
                 "_slot")

    def __init__(self, qs, ex, target, t_ms, deadline, pool_slot):
        self.qs = qs
        self.ex = ex
        self.target = target
        self.queues = []
        self.t_ms = t_ms
        self.deadline = deadline    # monotonic ms
        self.state = WAITING
        self.lane = None
        self.pool_slot = pool_slot
        self._slot = None

    def on_deadline(self):
        """max_ms passed without a permit: answered as reject would."""
        if self.state != WAITING:
            return
        self.qs.unlink(self)
        ex = self.ex
        if not ex.closed:
            try:
                self.qs.rel.exhausted(ex, hops_spent=True)
            except Exception as e:  # a bug answers this request with a 500, not silence
                ex.crash(e)

    def leave(self):
        """The request ended while queued or woken (client gone, drain): out of every queue, and a
        permit handed to it goes to the next waiter."""
        if self.state == WAITING:
            self.qs.unlink(self)
        elif self.state == GRANTED:
            self.state = DONE
            self.lane.release()


class LaneQueue:
    """This worker's waiters for one Lane, oldest first."""

    __slots__ = ("qs", "lane", "waiters", "i", "shared")

    def __init__(self, qs, lane, block):
        self.qs = qs
        self.lane = lane
        self.waiters = {}       # Waiter → None, in arrival order
        self.i = block          # the lane's reliability block (L_WAITING, L_OLDEST)
        self.shared = lane._shared is not None

    def blocked(self) -> bool:
        """Someone, in any worker, waits for this lane: a fresh acquire must queue behind."""
        return self.qs.slots.value(self.i + L_WAITING) > 0

    def add(self, w):
        first = not self.waiters
        self.waiters[w] = None
        slots = self.qs.slots
        slots.add(self.i + L_WAITING, 1)
        if first:
            self.assert_oldest(w.t_ms)

    def remove(self, w):
        waiters = self.waiters
        head = next(iter(waiters))
        del waiters[w]
        slots = self.qs.slots
        slots.add(self.i + L_WAITING, -1)
        if head is w:
            i = self.i + L_OLDEST
            cur = slots.value(i)
            if cur == w.t_ms:
                nxt = next(iter(waiters), None)
                slots.cas(i, cur, nxt.t_ms if nxt is not None else 0)
            if waiters and self.shared:
                self.assert_oldest(next(iter(waiters)).t_ms)

    def assert_oldest(self, t):
        """L_OLDEST = min(L_OLDEST, t) (0 = nobody)."""
        slots = self.qs.slots
        i = self.i + L_OLDEST
        while True:
            cur = slots.value(i)
            if cur != 0 and cur <= t:
                return
            if slots.cas(i, cur, t):
                return

    def oldest_here(self, now) -> bool:
        """Whether this worker's head waiter is the gateway's oldest for the lane."""
        cur = self.qs.slots.value(self.i + L_OLDEST)
        head = next(iter(self.waiters))
        return cur == 0 or head.t_ms <= cur or now - cur > self.qs.stale_ms

    def handoff(self) -> bool:
        """Called by Lane.release with the permit still held: True when it went to a waiter."""
        if not self.waiters:
            return False
        if self.shared and not self.oldest_here(self.qs.rel.now_ms()):
            return False    # an older waiter in another worker takes it from the counter
        self.qs.grant(next(iter(self.waiters)), self.lane)
        return True


class Queues:
    """One worker's wait queues (made by Reliability when a pool queues)."""

    def __init__(self, rel):
        self.rel = rel
        self.slots = rel.slots
        self.polling = set()    # LaneQueues on shared lanes with waiters here
        self.poll_handle = None
        self.delay = POLL_MIN_SECS
        self.stale_ms = STALE_MARGIN_MS

    def attach(self, snapshot, lanes):
        """`lanes`: the Lanes of the snapshot some queueing pool may wait on. Others lose their
        queue once it is empty (waiters of an older snapshot keep theirs until they are done)."""
        rel = self.rel
        for lane in lanes:
            block = rel.lanes[lane.name].i
            q = lane.queue
            if q is None or q.qs is not self:
                lane.queue = LaneQueue(self, lane, block)
            else:
                q.i = block
        for lane in snapshot.router.lanes.values():
            if lane not in lanes and lane.queue is not None and not lane.queue.waiters:
                lane.queue = None
        longest = 0
        for p in snapshot.config.pools.values():
            if p.on_exhausted.kind == "queue":
                longest = max(longest, p.on_exhausted.queue_max_ms)
        self.stale_ms = longest + STALE_MARGIN_MS

    # ------------------------------------------------------------------ waiting
    def enqueue(self, ex, target) -> bool:
        """Queues `ex` on its target's saturated candidate lanes; False when none is saturated
        (the exhaustion is not saturation: shed at once) or no time is left."""
        rel = self.rel
        pol = target.policy
        now = rel.now_ms()
        prev = ex.queued
        if prev is not None:
            deadline = prev.deadline        # a woken request that waits again: the same bound
        else:
            left = pol.failover.timeout_secs * 1000.0 - (_perf_ns() - ex.req.t0) / 1e6
            deadline = now + int(min(pol.on_exhausted.queue_max_ms, left))
        if deadline <= now:
            return False
        tried = ex.tried
        excluded = target.excluded
        cell_of = pol.cell_of
        lanes = []
        for lane in target.lanes:
            q = lane.queue
            if q is None or lane in tried or lane in excluded or lane.has_permit():
                continue
            cell = cell_of.get(lane)
            if cell is not None and not cell.usable():
                continue    # cooling down or out of budget: a permit would not help
            lanes.append(lane)
        if not lanes:
            return False
        w = Waiter(self, ex, target, now, deadline, pol.queued)
        ex.queued = w
        for lane in lanes:
            q = lane.queue
            w.queues.append(q)
            q.add(w)
            if q.shared:
                self.polling.add(q)
        if w.pool_slot is not None:
            self.slots.add(w.pool_slot, 1)
        rel.deadlines.arm(w, (deadline - now) / 1000.0)
        if self.polling and self.poll_handle is None:
            self.delay = POLL_MIN_SECS
            self.poll_handle = rel.loop.call_later(self.delay, self._poll)
        return True

    def unlink(self, w):
        """Out of every queue it is in (it got a permit, timed out or left)."""
        for q in w.queues:
            q.remove(w)
        w.queues = ()
        w.state = DONE
        self.rel.deadlines.disarm(w)
        if w.pool_slot is not None:
            self.slots.add(w.pool_slot, -1)

    def grant(self, w, lane):
        """The permit of `lane` (already counted as taken) is w's."""
        self.unlink(w)
        w.state = GRANTED
        w.lane = lane
        self.rel.loop.call_soon(self._deliver, w)

    def _deliver(self, w):
        if w.state != GRANTED:
            return      # left in between; leave() gave the permit on
        w.state = DONE
        lane = w.lane
        ex = w.ex
        if ex.closed:
            lane.release()
            return
        try:
            cell = w.target.policy.cell_of.get(lane)
            if cell is not None and not cell.claim():
                # The breaker moved while it waited (or the budget ran out): the permit to the
                # next waiter, and this request selects again.
                lane.release()
                ex.attempt()
                return
            ex.attempt(lane)
        except Exception as e:  # a bug answers this request with a 500, not silence
            ex.crash(e)

    # ------------------------------------------------------------------ cross-worker
    def _poll(self):
        self.poll_handle = None
        now = self.rel.now_ms()
        granted = False
        for q in list(self.polling):
            if not q.waiters:
                self.polling.discard(q)
                continue
            q.assert_oldest(next(iter(q.waiters)).t_ms)
            lane = q.lane
            while q.waiters and q.oldest_here(now) and lane.take_queued():
                self.grant(next(iter(q.waiters)), lane)
                granted = True
        if self.polling:
            top = max(POLL_MIN_SECS, self.rel.limits.queue_poll_max_ms / 1000.0)
            self.delay = POLL_MIN_SECS if granted else min(self.delay * 2, top)
            self.poll_handle = self.rel.loop.call_later(self.delay, self._poll)
