"""The reliability state of one gateway: breaker cells, lane budgets, health-probe claims and wait
queues, and what the lifecycle asks of them (SPEC §3, §4).

`Reliability(config, shared)` is made per worker process. Its state lives in blocks of `BLOCK`
slots in the tail of the gateway's shared counters (`capacity(config)` slots, allocated before the
workers fork, after the lane permits), or in a local array with one process:

- a lane block per model (budget used, attempts in flight, the prober's claim, queue counts),
- a cell block per (pool, lane) and per direct route (the breaker cell),
- a pool block per pool (requests queued for it).

Every worker must agree on which block is whose, or a lane one worker trips would be another
lane's cell in the next worker. At boot every worker computes the same layout from the same
config (`plan`, deterministic). After that only the parent plans: a reload
(busbar/admin/live.py) calls `plan(config, old_router)` there, which keeps the blocks of what
survives (a lane block by model name; a cell block while its (pool, lane) pair exists and the
lane's model did not change, the rule the router keeps Lane objects by; a pool block by name),
takes fresh blocks for the rest, and sends the layout with the config, and every worker
`attach(snapshot, layout)`es it. A block a reload dropped may still be written by requests of
the old snapshot in flight, so it is reused only after a quarantine longer than any request.

`on_attempt` is the site's attempt hook: every attempt's disposition reaches its cell there, and
nowhere else.
"""
from __future__ import annotations

import collections
import time

from cbusbar.clock import now_ns

from busbar.engine.classify import D_HARD_DOWN, D_TRANSIENT, FAULT_DISPOSITION
from busbar.engine.records import (F_CONNECT, F_CREDENTIALS, F_MALFORMED, F_RESET, F_STATUS,
                                   F_TIMEOUT, F_TRUNCATED, O_EXHAUSTED)
from busbar.reliability.breaker import (CELL_SLOTS, HALF_OPEN, LANE_SLOTS, OPEN, S_STATE, S_UNTIL,
                                        Cell, LaneState, LocalSlots, Window)
from busbar.reliability.policy import DEFAULT_BREAKER, DEFAULT_FAILOVER, DEFAULT_ON_EXHAUSTED

# Retry-After when nothing is cooling down (saturation, nothing configured): the reference's 2 s,
# never 1 (SPEC §4.3), so clients that retry at once do not hammer a saturated gateway.
RETRY_FLOOR_SECS = 2

# What the caller is told when every lane failed, by how the last attempt failed. Never the
# upstream's address: the caller should not learn busbar's topology.
EXHAUSTED = {
    F_CONNECT: (502, "api_error", "busbar could not connect to the upstream provider."),
    F_TIMEOUT: (504, "timeout", "The upstream provider did not answer in time."),
    F_CREDENTIALS: (503, "overloaded", "busbar has no credentials for the upstream provider yet "
                    "(they are being fetched); retry shortly."),
    F_RESET: (502, "api_error", "The upstream provider closed the connection before answering."),
    F_MALFORMED: (502, "api_error", "The upstream provider returned a response busbar could not read."),
    F_TRUNCATED: (502, "api_error", "The upstream provider's stream ended before it was complete."),
}
UNREADABLE = EXHAUSTED[F_MALFORMED]
TIMED_OUT = "The request timed out. Please retry shortly."
CREDENTIALS_REFUSED = ("The upstream provider refused busbar's credentials for every lane that "
                       "could take this request; the lanes are benched. Please retry later.")

# A provider's Retry-After holds its lane at least this long (a provider's rate limit: SPEC §4.2),
# up to limits.max_honored_retry_after_secs. The header counts whole seconds (RFC 9110 §10.2.3),
# and a `Retry-After: 0` on a 429 under load would otherwise let every caller straight back.
HOLD_FLOOR_SECS = 1.0

# Every block is this many slots, whatever it holds, so one free list serves all three kinds.
BLOCK = 8
POOL_SLOTS = 1
P_QUEUED = 0        # pool block: requests of this pool waiting in a queue, every worker
assert CELL_SLOTS <= BLOCK and LANE_SLOTS <= BLOCK and POOL_SLOTS <= BLOCK
# Room for reloads that add models and pools: four times the boot config's blocks, and at least
# 1024 blocks (64 KiB of mapping; the kernel backs a page of it only once a block on it is used).
MIN_BLOCKS = 1024
# A dropped block waits this long past the longest a request of the old config can live (its
# failover budget, or a stream's upstream_request_timeout_secs) before it is reused.
QUARANTINE_MARGIN_SECS = 60.0


def blocks_needed(config) -> int:
    """Lane blocks, direct-route cells, pool-member cells, pool blocks."""
    return 2 * len(config.models) + sum(len(p.members) + 1 for p in config.pools.values())


def capacity(config) -> int:
    """Slots of the shared mapping reliability takes (its tail), for this boot config."""
    return BLOCK * max(MIN_BLOCKS, 4 * blocks_needed(config))


class NoRoom(Exception):
    """A reload needs more blocks than the mapping has free (restart to grow it)."""


def _longest_request_secs(config) -> float:
    t = config.limits.upstream_request_timeout_secs
    for p in config.pools.values():
        t = max(t, p.failover.timeout_secs)
    return t


class TargetPolicy:
    """What a target needs from reliability per request: its cells by lane and its policies."""

    __slots__ = ("cell_of", "failover", "on_exhausted", "max_attempts", "pool", "queued")

    def __init__(self, pool, cells_by_lane, failover, on_exhausted, queued=None):
        self.pool = pool
        self.cell_of = cells_by_lane
        self.failover = failover
        self.on_exhausted = on_exhausted
        self.max_attempts = failover.max_hops + 1
        self.queued = queued    # the pool block's queued slot (on_exhausted: queue), else None


class Reliability:
    def __init__(self, config, shared=None, clock=time.monotonic, rand=None):
        self.clock = clock
        self.rand = rand
        cap = capacity(config)
        if shared is not None and shared.size >= len(config.models) + cap:
            # The tail of the mapping: the lane permits (and the control plane's room for models
            # added by reloads) come first.
            self.slots = shared
            self.offset = shared.size - cap
            self.end = shared.size
        else:
            self.slots = LocalSlots(BLOCK * blocks_needed(config))
            self.offset = 0
            self.end = None         # grows
        self.limits = config.limits
        self._next = self.offset    # the next never-used block
        self._free = collections.deque()    # (reusable from, block) in the order dropped
        self.layout = {"lanes": {}, "cells": {}, "pools": {}}
        self.cells = {}         # (pool, lane name) → Cell; pool "" = the lane-default cell
        self.lanes = {}         # lane name → LaneState
        self.cells_by_lane = {}     # lane name → [Cell] (every pool's, and the direct route's)
        self.pool_slot = {}     # pool name → its pool block
        self.snapshot = None
        self.queues = None      # busbar/reliability/queue.py Queues, made when a pool queues
        self.loop = None        # the worker's event loop (set by the gateway; queue wake-ups)
        self.deadlines = None   # the worker's deadline wheel (queue max_ms)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ------------------------------------------------------------------ layout
    def _alloc(self, now: float) -> int:
        free = self._free
        if free and free[0][0] <= now:
            base = free.popleft()[1]
            for k in range(BLOCK):
                self.slots.store(base + k, 0)
            return base
        base = self._next
        if self.end is None:
            self.slots.grow(base + BLOCK)
        elif base + BLOCK > self.end:
            raise NoRoom("no free shared slots for the breaker cells of this config (restart "
                         "busbar to grow the table)")
        self._next = base + BLOCK
        return base

    def plan(self, config, old_router=None) -> dict:
        """The block of every lane, cell and pool of `config`: {"lanes": {name: base},
        "cells": {(pool, name): base}, "pools": {name: base}}. Deterministic for a given history,
        so every worker's boot plan is the same; after boot only the parent plans (a reload) and
        the workers apply its layout. Blocks that survive are kept (see the module docstring)."""
        now = self.clock()
        cur = self.layout
        models = config.models

        def survives(name):
            lane = old_router.lanes.get(name) if old_router is not None else None
            return lane is not None and lane.model == models[name]

        lanes = {}
        for name in sorted(models):
            base = cur["lanes"].get(name)
            lanes[name] = base if base is not None else self._alloc(now)
        keys = [("", name) for name in sorted(models)]
        for pname in sorted(config.pools):
            keys.extend((pname, m.model.name) for m in config.pools[pname].members)
        cells = {}
        for key in keys:
            base = cur["cells"].get(key)
            cells[key] = base if base is not None and survives(key[1]) else self._alloc(now)
        pools = {}
        for pname in sorted(config.pools):
            base = cur["pools"].get(pname)
            pools[pname] = base if base is not None else self._alloc(now)
        used = set(lanes.values()) | set(cells.values()) | set(pools.values())
        old_config = self.snapshot.config if self.snapshot is not None else None
        wait = max(_longest_request_secs(config),
                   _longest_request_secs(old_config) if old_config is not None else 0.0)
        for kind in ("lanes", "cells", "pools"):
            for base in cur[kind].values():
                if base not in used:
                    self._free.append((now + wait + QUARANTINE_MARGIN_SECS, base))
                    used.add(base)
        self.layout = {"lanes": lanes, "cells": cells, "pools": pools}
        return self.layout

    def attach(self, snapshot, layout=None):
        """Gives every target of the snapshot's router its cells and policies, in the blocks of
        `layout` (the parent's plan; None: plan here, at boot or in a single process)."""
        if layout is None:
            layout = self.plan(snapshot.config,
                               self.snapshot.router if self.snapshot is not None else None)
        else:
            self.layout = layout
        config = snapshot.config
        router = snapshot.router
        slots = self.slots
        if self.end is None:
            top = max([0] + [b + BLOCK for kind in layout.values() for b in kind.values()])
            slots.grow(top)
        lanes = {}
        for name, base in layout["lanes"].items():
            ls = self.lanes.get(name)
            if ls is None or ls.i != base:
                ls = LaneState(slots, base, None)
            ls.limit = config.models[name].max_requests
            lanes[name] = ls
        self.lanes = lanes
        old = self.cells
        cells = {}
        by_lane = {}

        def cell(pool, lane, policy, member=None):
            key = (pool, lane.name)
            base = layout["cells"][key]
            c = old.get(key)
            if c is None or c.base != base:
                c = Cell(pool, lane, policy, slots, base, self.limits, self.clock, self.rand,
                         lanes[lane.name])
            else:
                if c.policy.window_secs != policy.window_secs:
                    c.window = Window(policy.window_secs)
                c.policy = policy
                c.budget = lanes[lane.name]
            c.lane = lane
            c.limits = config.limits
            c.context_max = member.context_max if member is not None else None
            c.attempt_timeout_ms = member.attempt_timeout_ms if member is not None else None
            cells[key] = c
            by_lane.setdefault(lane.name, []).append(c)
            return c

        for name, lane in router.lanes.items():
            t = router.resolve(name)
            if t is not None and not t.is_pool:
                c = cell("", lane, DEFAULT_BREAKER)
                t.cells = (c,)
                t.policy = TargetPolicy("", {lane: c}, DEFAULT_FAILOVER, DEFAULT_ON_EXHAUSTED)
        queued_lanes = set()
        for name, pool in config.pools.items():
            t = router.resolve(name)
            cs = []
            by = {}
            excluded = set(pool.failover.exclusions)
            for lane, member in zip(t.lanes, pool.members):
                c = cell(name, lane, pool.breaker, member)
                cs.append(c)
                by[lane] = c
            t.cells = tuple(cs)
            queued = None
            if pool.on_exhausted.kind == "queue":
                queued = layout["pools"][name] + P_QUEUED
                queued_lanes.update(lane for lane in t.lanes
                                    if lane.limit is not None and lane not in t.excluded
                                    and lane.name not in excluded)
            t.policy = TargetPolicy(name, by, pool.failover, pool.on_exhausted, queued)
            t.excluded = frozenset(lane for lane in t.lanes if lane.name in excluded)
        self.cells = cells
        self.cells_by_lane = by_lane
        self.pool_slot = dict(layout["pools"])
        self.limits = config.limits
        self.snapshot = snapshot
        if queued_lanes or self.queues is not None:
            from busbar.reliability.queue import Queues
            if self.queues is None:
                self.queues = Queues(self)
            self.queues.attach(snapshot, queued_lanes)

    # ------------------------------------------------------------------ the attempt hook
    def hook(self):
        """The attempt hook the gateway installs: `on_attempt` with its happy path (an answer read
        whole: the cell's `ok()`) in C (cbusbar/cellcore.pyx CellHook)."""
        from cbusbar.cellcore import CellHook
        return CellHook(self.on_attempt)

    def on_attempt(self, ex, a):
        """Every attempt's end (Exchange.end_attempt): its disposition to its cell."""
        target = ex.target
        pol = target.policy if target is not None else None
        if pol is None:
            return
        cell = pol.cell_of.get(a.lane)
        if cell is None:
            return
        fault = a.fault
        if fault is None:
            cell.ok()
            return
        cell.budget.done(True)
        d = a.disposition
        if d is None:
            d = a.disposition = FAULT_DISPOSITION.get(fault)
        if d is None:
            # Not the lane's doing (client gone, request not writable, credentials pending): a
            # probe that ends so gives its slot back at once.
            if cell.state() == HALF_OPEN:
                cell.slots.store(cell.base + S_UNTIL, cell.now_ms())
                cell.slots.store(cell.base + S_STATE, OPEN)
            return
        ra = a.retry_after
        cell.record(d, ra, a.reason)
        if ra is not None and d == D_TRANSIENT and not target.passthrough and \
                a.lane.model.provider.upstream_credentials != "passthrough":
            # (passthrough: the limit is the caller's key's, not the lane's; other callers' keys
            # may still be served, so only the breaker cooldown steers)
            self.hold(cell, ra, a.error_class == "rate_limit")

    def hold(self, cell, retry_after, rate_limit):
        """A provider's Retry-After on a transient failure: its lane is held for max(Retry-After,
        HOLD_FLOOR_SECS), capped by limits.max_honored_retry_after_secs, in every pool and
        direct route and every worker, whether or not another lane could take its calls. The
        breaker cooldown only steers traffic to other members (with none left, `cooling_closed`
        calls the lane anyway); a hold is the provider's word, and no call goes to the lane
        before it ends: callers are answered locally (`exhausted`)."""
        secs = min(max(retry_after, HOLD_FLOOR_SECS), cell.limits.max_honored_retry_after_secs)
        until = cell.now_ms() + int(secs * 1000)
        cell.budget.hold(until, rate_limit)
        # Selection (Target.pick, in C) skips a cooling cell: every cell of the lane cools at
        # least as long, so the happy path reads nothing new.
        for c in self.cells_by_lane.get(cell.lane.name, ()):
            c._extend(until)

    # ------------------------------------------------------------------ a request's budgets
    # The exchange (busbar/engine/exchange.py) asks these on its failure paths only: next_hop once
    # an attempt failed, exhausted when no lane can take the request, context_exceeded when a
    # lane found the prompt too long. Each answers the request through the exchange (`attempt`,
    # `error`, `final_error`) when it decides its end.
    def next_hop(self, ex) -> bool:
        """Whether `ex` may make another attempt after a failed one: its target's hops and time
        (SPEC §4.3: failover.max_hops, failover.timeout_secs; a target without a policy, the
        snapshot's attempt cap). When not, the request is answered here and False returned."""
        pol = ex.target.policy
        if pol is not None:
            if len(ex.attempts) >= pol.max_attempts:
                self.exhausted(ex, hops_spent=True)
                return False
            if now_ns() - ex.req.t0 >= pol.failover.timeout_secs * 1e9:
                ex.error(503, "overloaded", TIMED_OUT, outcome=O_EXHAUSTED)
                return False
        elif len(ex.attempts) >= ex.snap.max_attempts:
            self.exhausted(ex)
            return False
        return True

    def context_exceeded(self, ex, failed):
        """`failed` found the prompt too long: only members with a larger known context stay
        candidates of `ex` (unknown ones stay too)."""
        pol = ex.target.policy
        if pol is None:
            return
        cm = pol.cell_of[failed].context_max
        if cm is None:
            return
        for lane, cell in pol.cell_of.items():
            if cell.context_max is not None and cell.context_max <= cm:
                ex.tried.add(lane)

    def exhausted(self, ex, hops_spent=False):
        """No lane can take `ex` (or its hops ran out): the target's on_exhausted policy, then the
        caller's answer (SPEC §4.3)."""
        target = ex.target
        pol = target.policy
        if pol is not None and not hops_spent:
            lane = self.cooling_closed(target, ex.tried)
            if lane is not None:
                ex.attempt(lane)
                return
            oe = pol.on_exhausted
            if oe.kind == "fallback_pool":
                nxt = ex.snap.router.resolve(oe.fallback_pool)
                # Cycles are refused at boot; this guards a reload that made one anyway.
                if nxt is not None and ex.fallbacks < len(ex.snap.config.pools):
                    ex.fallbacks += 1
                    ex.target = nxt
                    ex.tried.update(nxt.lacking(ex.op.name if ex.op is not None else "chat"))
                    ex.attempt()
                    return
            elif oe.kind == "least_bad":
                lane = self.least_bad(target, ex.tried)
                if lane is not None:
                    ex.site.log_debug("pool %s exhausted: degraded to %s", target.name, lane.name)
                    ex.attempt(lane)
                    return
            elif oe.kind == "queue":
                # Waits for a permit (attempt(lane) when one comes); after max_ms the queue calls
                # exhausted(hops_spent=True), answered below as reject.
                if self.enqueue(ex, target):
                    return
        atts = ex.attempts
        last = atts[-1] if atts else None
        if last is None and pol is not None:
            held = self.held(target, ex.tried)
            if held is not None:
                # Every lane left is held by its provider's Retry-After: answered here, without
                # a call, with the time left (SPEC §4.2).
                _held_answer(ex, held[0], held[1])
                return
        if last is None or last.fault == F_CREDENTIALS or last.disposition == D_HARD_DOWN:
            if pol is None:
                why = "all are at capacity"
            else:
                why = self.why(target, ex.tried)
            wait = self.soonest_cooldown(target) if pol is not None else None
            ra = int(wait + 0.999) if wait else RETRY_FLOOR_SECS
            if ra < RETRY_FLOOR_SECS:
                ra = RETRY_FLOOR_SECS
            if last is not None and last.disposition == D_HARD_DOWN:
                msg = CREDENTIALS_REFUSED
            elif last is not None:
                msg = EXHAUSTED[F_CREDENTIALS][2]
            else:
                msg = "No lane for '%s' can take the request right now: %s. Please retry " \
                      "shortly." % (ex.name, why)
            ex.error(503, "overloaded", msg, retry_after=ra, outcome=O_EXHAUSTED)
            return
        le = ex.last_error
        if last.fault == F_STATUS and le is not None:
            # Every lane failed and the last said why: the caller gets that upstream error in its
            # own shape, which says more than a generic message.
            ex.final_error(*le, outcome=O_EXHAUSTED)
            return
        status, kind, msg = EXHAUSTED.get(last.fault, UNREADABLE)
        if last.fault == F_CONNECT and last.reason and "SSL" in last.reason:
            msg = ("busbar could not connect to the upstream provider: its TLS certificate was "
                   "not accepted.")
        ex.error(status, kind, msg, outcome=O_EXHAUSTED)

    # ------------------------------------------------------------------ questions
    def healthy(self) -> bool:
        """Any lane usable in any cell (side-effect free: never takes a probe slot)."""
        # A closed cell that cools after a failure still serves when it is all that is left.
        return any(c.usable() or (c.state() == 0 and (c.budget.limit is None or c.budget.left()))
                   for c in self.cells.values())

    def soonest_cooldown(self, target, exclude=()) -> float | None:
        """Seconds until the first cooling cell of `target` (not in `exclude`) may be tried."""
        best = None
        for lane, cell in target.policy.cell_of.items():
            if lane in exclude:
                continue
            r = cell.cooldown_remaining()
            if r > 0 and (best is None or r < best):
                best = r
        return best

    def held(self, target, exclude):
        """When a provider's Retry-After holds every lane of `target` that could take the request
        (not in `exclude`): (seconds until the first may be called again, whether every hold is
        a rate limit). None when some candidate lane is not held (or there is none)."""
        now = None
        wait = None
        rate_limit = True
        for lane, cell in target.policy.cell_of.items():
            if lane in exclude or lane in target.excluded:
                continue
            if now is None:
                now = cell.now_ms()
            h = cell.budget.held(now)
            if h is None:
                return None
            left = h[0] / 1000.0
            if cell.state() != 0:
                # Tripped as well: the cooldown may end later than the hold.
                left = max(left, cell.cooldown_remaining())
            if wait is None or left < wait:
                wait = left
            rate_limit = rate_limit and h[1]
        if wait is None:
            return None
        return wait, rate_limit

    def why(self, target, exclude) -> str:
        """Why no lane of `target` could take the request, in words for the caller."""
        cooling = capacity = budget = 0
        for lane, cell in target.policy.cell_of.items():
            if lane in exclude:
                continue
            if cell.budget.limit is not None and not cell.budget.left():
                budget += 1
            elif cell.cooldown_remaining() > 0 or cell.state() != 0:
                cooling += 1
            elif not (lane.limit is None or lane.has_permit()):
                capacity += 1
        if not (cooling or capacity or budget):
            return "no lane is configured for it"
        parts = []
        if cooling:
            parts.append("cooling down after upstream failures")
        if capacity:
            parts.append("at capacity")
        if budget:
            parts.append("out of their request budget")
        return "all lanes are " + " or ".join(parts)

    def cooling_closed(self, target, exclude):
        """A lane that is cooling after a failure that did not trip (its cell still closed), when
        nothing else can take the request: the cooldown steers traffic to the other members, but
        with no other member left it must not turn one transient error into a 503 for every caller
        (a direct route has no other member). Tripped cells stay out. Permit and budget taken."""
        return _soonest(target, exclude, closed_only=True)

    def enqueue(self, ex, target) -> bool:
        """on_exhausted: queue (busbar/reliability/queue.py): True when `ex` now waits for a
        permit (it is attempted when one comes, or answered as reject after max_ms); False when
        the exhaustion is not saturation or no time is left: answer at once."""
        qs = self.queues
        return qs is not None and qs.enqueue(ex, target)

    def queued_by_pool(self) -> dict:
        """Requests waiting for a permit per queueing pool, every worker's."""
        snap = self.snapshot
        out = {}
        if snap is None:
            return out
        for name, pool in snap.config.pools.items():
            if pool.on_exhausted.kind == "queue" and name in self.pool_slot:
                out[name] = max(0, self.slots.value(self.pool_slot[name] + P_QUEUED))
        return out

    def least_bad(self, target, exclude):
        """The cooling lane whose cooldown ends soonest and that has a free permit (SPEC §4.3),
        its permit and budget taken; None when there is none."""
        return _soonest(target, exclude, closed_only=False)


def _held_answer(ex, wait, rate_limit):
    """The caller's answer while the lanes' providers asked busbar to wait: their rate limit in
    the caller's own words (429), else overloaded (503), with Retry-After the time left, rounded
    up, at least 1 s."""
    kind = "rate_limit" if rate_limit else "overloaded"
    ra = int(wait)
    if ra < wait:
        ra += 1
    if ra < 1:
        ra = 1
    if rate_limit:
        msg = ("The upstream provider is rate limiting '%s' and asked busbar to wait; "
               "please retry after the indicated time." % ex.name)
    else:
        msg = ("The upstream provider of '%s' is unavailable and asked busbar to wait; "
               "please retry after the indicated time." % ex.name)
    ex.error(ex.own_error(kind)[0], kind, msg, retry_after=ra, outcome=O_EXHAUSTED)


def _soonest(target, exclude, closed_only):
    """The lane of `target` (not excluded, not held by its provider's Retry-After, with budget
    and a free permit; closed cells only when asked) whose cooldown ends first, its permit and
    budget taken; None when there is none."""
    best = None
    best_until = None
    now = None
    for lane, cell in target.policy.cell_of.items():
        if lane in exclude or lane in target.excluded or (closed_only and cell.state() != 0):
            continue
        if now is None:
            now = cell.now_ms()
        if cell.budget.held(now) is not None:
            continue
        if cell.budget.limit is not None and not cell.budget.left():
            continue
        if not (lane.limit is None or lane.has_permit()):
            continue
        u = cell.until_ms()
        if best is None or u < best_until:
            best, best_until = lane, u
    if best is None or not best.try_acquire():
        return None
    if not target.policy.cell_of[best].budget.take():
        best.release()
        return None
    return best
