"""The reliability state of one gateway: breaker cells, lane budgets, and what the lifecycle asks of
them (SPEC §3, §4).

`Reliability(config, shared)` is made per worker process. Its cells live in slots after the lane
permits in the gateway's shared counters (`capacity(config)` more of them, allocated before the
workers fork), or in a local array with one process. `attach(snapshot)` gives each target of a
snapshot's router its cells and policies; a reloaded snapshot is attached again and keeps the
cells of the (pool, lane) pairs it still has, keyed by name. Cells and lane states a reload adds
take spare slots: the parent plans where (`plan(config)`) and sends the plan with the swap, so
every worker puts a new cell in the same slots (busbar/admin/live.py). `on_attempt` is the site's
attempt hook: every attempt's disposition reaches its cell there, and nowhere else.
"""
from __future__ import annotations

import time

from busbar.reliability.breaker import (CELL_SLOTS, HALF_OPEN, LANE_SLOTS, OPEN, S_STATE, S_UNTIL,
                                        Cell, LaneState, LocalSlots, Window)
from busbar.reliability.classify import FAULT_DISPOSITION
from busbar.reliability.policy import DEFAULT_BREAKER, DEFAULT_FAILOVER, DEFAULT_ON_EXHAUSTED

# Retry-After when nothing is cooling down (saturation, nothing configured): the reference's 2 s,
# never 1 (SPEC §4.3), so clients that retry at once do not hammer a saturated gateway.
RETRY_FLOOR_SECS = 2


# Room for the cells and lane states config reloads add over the process's life: as many slots
# again as the boot config needs, and at least 8192 (1024 cells; 64 KiB of shared memory, whose
# pages are only backed once written). A reload that needs more is refused (restart to grow).
SPARE_SLOTS_MIN = 8192


def slots_needed(config) -> int:
    cells = len(config.models) + sum(len(p.members) for p in config.pools.values())
    return cells * CELL_SLOTS + len(config.models) * LANE_SLOTS


def capacity(config) -> int:
    """Slots the gateway's shared mapping holds for reliability: the boot config's and spares."""
    need = slots_needed(config)
    return need + max(need, SPARE_SLOTS_MIN)


class NoRoom(Exception):
    pass


class TargetPolicy:
    """What a target needs from reliability per request: its cells by lane and its policies."""

    __slots__ = ("cell_of", "failover", "on_exhausted", "max_attempts", "pool")

    def __init__(self, pool, cells_by_lane, failover, on_exhausted):
        self.pool = pool
        self.cell_of = cells_by_lane
        self.failover = failover
        self.on_exhausted = on_exhausted
        self.max_attempts = failover.max_hops + 1


class Reliability:
    def __init__(self, config, shared=None, clock=time.monotonic, rand=None):
        self.clock = clock
        self.rand = rand
        need = capacity(config)
        if shared is not None and shared.size >= len(config.models) + need:
            # The tail of the mapping: the lane permits (and the control plane's room for models
            # added by reloads) come first.
            self.slots = shared
            self.offset = shared.size - need
        else:
            self.slots = LocalSlots(need)
            self.offset = 0
        self.end = self.offset + need
        self.limits = config.limits
        self.cells = {}         # (pool, lane name) → Cell; pool "" = the lane-default cell
        self.lanes = {}         # lane name → LaneState
        self.live = ()          # the cells of the attached snapshot (reloads leave others behind)
        self._layout(config)
        self.snapshot = None

    def _layout(self, config):
        i = self.offset
        for name in sorted(config.models):
            self.lanes[name] = LaneState(self.slots, i, config.models[name].max_requests)
            i += LANE_SLOTS
        self._next = i

    def _take(self, n, at=None):
        """`n` slots: at `at` (a plan's choice) or the next free ones."""
        i = self._next if at is None else at
        if i + n > self.end:
            raise NoRoom("no spare reliability slots for a cell (restart to grow the table)")
        self._next = max(self._next, i + n)
        return i

    def _cell(self, pool, lane, policy, member=None, plan=None):
        key = (pool, lane.name)
        c = self.cells.get(key)
        if c is None:
            if lane.name not in self.lanes:     # a model a reload added
                self.lanes[lane.name] = LaneState(
                    self.slots, self._take(LANE_SLOTS, _at(plan, ("lane", lane.name))),
                    lane.model.max_requests)
            c = Cell(pool, lane, policy, self.slots, self._take(CELL_SLOTS, _at(plan, key)),
                     self.limits, self.clock, self.rand, self.lanes[lane.name])
            self.cells[key] = c
        elif c.policy != policy:
            # A reload changed the pool's breaker: the shared state stays, the policy is the new one.
            c.policy = policy
            c.window = Window(policy.window_secs)
        c.lane = lane
        if member is not None:
            c.context_max = member.context_max
            c.attempt_timeout_ms = member.attempt_timeout_ms
        return c

    def _pairs(self, config):
        """(pool, lane name) of every cell `config` needs, in attach order ("" = direct route)."""
        for name in config.models:
            yield ("", name)
        for name, pool in config.pools.items():
            for member in pool.members:
                yield (name, member.model.name)

    def plan(self, config) -> dict:
        """Where the cells and lane states `config` adds go, decided once (by the parent) so that
        every worker puts them in the same slots; raises NoRoom when the spares are used up."""
        out = {}
        nxt = self._next
        for key in self._pairs(config):
            lane = key[1]
            if lane not in self.lanes and ("lane", lane) not in out:
                out[("lane", lane)] = nxt
                nxt += LANE_SLOTS
            if key not in self.cells and key not in out:
                out[key] = nxt
                nxt += CELL_SLOTS
        if nxt > self.end:
            raise NoRoom("the reliability table has no room for %d more cell(s); restart busbar "
                         "to grow it" % sum(1 for k in out if k[0] != "lane"))
        return out

    def attach(self, snapshot, plan=None):
        """Gives every target of the snapshot's router its cells and policies. `plan`: from the
        parent's `plan(config)` for a reloaded snapshot (None: allocate in order)."""
        config = snapshot.config
        router = snapshot.router
        for name, model in config.models.items():
            st = self.lanes.get(name)
            if st is not None:
                st.limit = model.max_requests
        live = []
        for name, lane in router.lanes.items():
            t = router.resolve(name)
            if t is not None and not t.is_pool:
                cell = self._cell("", lane, DEFAULT_BREAKER, plan=plan)
                live.append(cell)
                t.cells = (cell,)
                t.policy = TargetPolicy("", {lane: cell}, DEFAULT_FAILOVER, DEFAULT_ON_EXHAUSTED)
        for name, pool in config.pools.items():
            t = router.resolve(name)
            cells = []
            by = {}
            excluded = set(pool.failover.exclusions)
            for lane, member in zip(t.lanes, pool.members):
                cell = self._cell(name, lane, pool.breaker, member, plan)
                cells.append(cell)
                live.append(cell)
                by[lane] = cell
            t.cells = tuple(cells)
            t.policy = TargetPolicy(name, by, pool.failover, pool.on_exhausted)
            t.excluded = frozenset(lane for lane in t.lanes if lane.name in excluded)
        self.live = tuple(live)
        self.snapshot = snapshot

    # ------------------------------------------------------------------ the attempt hook
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
            cell.budget.done(False)
            cell.record_ok()
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
        cell.record(d, a.retry_after, a.reason)

    # ------------------------------------------------------------------ questions
    def healthy(self) -> bool:
        """Any lane usable in any cell (side-effect free: never takes a probe slot)."""
        # A closed cell that cools after a failure still serves when it is all that is left.
        return any(c.usable() or (c.state() == 0 and (c.budget.limit is None or c.budget.left()))
                   for c in self.live)

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

    def least_bad(self, target, exclude):
        """The cooling lane whose cooldown ends soonest and that has a free permit (SPEC §4.3),
        its permit and budget taken; None when there is none."""
        return _soonest(target, exclude, closed_only=False)


def _soonest(target, exclude, closed_only):
    """The lane of `target` (not excluded, with budget and a free permit; closed cells only when
    asked) whose cooldown ends first, its permit and budget taken; None when there is none."""
    best = None
    best_until = None
    for lane, cell in target.policy.cell_of.items():
        if lane in exclude or lane in target.excluded or (closed_only and cell.state() != 0):
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


def _at(plan, key):
    return None if plan is None else plan.get(key)
