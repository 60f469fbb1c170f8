"""How a pool that is more than weights picks a lane per attempt: its ordering strategy, its member
tiers, session affinity, and what its hooks decided (docs/routing.md, docs/hooks.md).

A pool with none of these has no plan (`Target.plan is None`) and takes `Target.pick`, the smooth
weighted round-robin, exactly as before: the engine reads one field to know. With a plan, each
attempt (`pick(ex)`) goes:

1. the session's pinned lane (`affinity: {mode: session}`), while it can take the request;
2. a gate's `order`, when one decided: its first lane that can take the request, whatever its
   tier (a gate that orders owns the ranking; the members' tier labels were its input, as in
   the Rust gateway); a lane the order leaves out is not excluded, only ranked after;
3. else tier by tier, in the order the members name their tiers (members without `tier` form a
   tier of their own, placed where the first of them is; in a pool with no `hooks:` the tier is a
   label only, as in the Rust gateway, and every member is one tier): a lower tier is tried only when no lane
   of the tiers above can take the request (tripped, cooling, at capacity, out of budget, tried).
   Within a tier, the pool's strategy: `weighted` is the pool's own SWRR over the tier;
   `cheapest` (the rate card's (input + output) / 2, ascending), `fastest` (the latency average,
   ascending), `least_busy` (free concurrency over every worker, descending) and `usage` (the
   caller's rate-limit headroom, descending) rank the tier's lanes and take the first that can
   serve, as the Rust gateway's ranking hooks do: a lane without the signal ranks last, ties keep
   member order, and a tier where no lane has the signal is weighted;
4. the lane taken becomes the session's pin (a failover re-pins it).

A hook's `restrict` holds on every hop, a fallback pool's included (Run.allowed_in). The strategies
read signals only: whether a lane can take the request is the same question SWRR asks (a free
permit, the breaker cell, the lane budget), asked by `_take`.
"""
from __future__ import annotations

import hashlib
import time

from busbar.routing.signals import Signals, prepare, shared_for  # noqa: F401 (prepare: supervisor)

# What a lane without `max_concurrent` reports as its free concurrency: the Rust gateway's
# unbounded lane is a semaphore of tokio's MAX_PERMITS (2^61 - 1), so its in-flight count still
# orders lanes (fewer in flight = more free) and a bounded lane never looks freer.
UNBOUNDED = (1 << 61) - 1
_NO_LANES: frozenset = frozenset()


class Run:
    """A request's routing state beside its exchange (`Exchange.routing`): the session it pins,
    what its hooks decided (an order of member indexes; restricts, each a set of tags and its
    on_empty), and the hook run that fires its later stages (busbar/hooks/run.py)."""

    __slots__ = ("plan", "fp", "order", "restricts", "allowed", "hooks")

    def __init__(self, plan):
        self.plan = plan
        self.fp = None          # the session's fingerprint, when the pool pins sessions
        self.order = None       # a gate's order: member indexes, most preferred first
        self.restricts = ()     # ((tags, on_empty), ...): every hop stays within them
        self.allowed = {}       # target -> the lanes its restricts leave (None: all)
        self.hooks = None       # busbar/hooks/run.py HookRun, for the routing/response stages

    def allowed_in(self, ex, target):
        """The lanes of `target` this request's restricts leave, or None when it has none; the
        others join the lanes the request never tries (`ex.tried`, as lanes that do not serve its
        operation do), so no path past the pick (on_exhausted's least_bad, a cooling lane, a
        queue) reaches them either. A fallback pool is held to the same tags as the pool that
        restricted (its own members' tags); a restrict that leaves none of its lanes applies its
        on_empty: `weighted` skips it, otherwise nothing is allowed (fail closed)."""
        if not self.restricts:
            return None
        got = self.allowed.get(target, False)
        if got is not False:
            return got
        pool = ex.snap.config.pools.get(target.name) if target.is_pool else None
        tags = [set(m.tags) for m in pool.members] if pool is not None else \
            [set() for _ in target.lanes]
        lanes = frozenset(target.lanes)
        for want, on_empty in self.restricts:
            narrowed = frozenset(lane for i, lane in enumerate(target.lanes)
                                 if lane in lanes and tags[i].intersection(want))
            if narrowed:
                lanes = narrowed
            elif on_empty != "weighted":
                lanes = _NO_LANES
                break
        self.allowed[target] = lanes
        ex.tried.update(lane for lane in target.lanes if lane not in lanes)
        return lanes


_BARE = Run(None)


class PoolPlan:
    """One pool's routing beyond plain weights, for one snapshot (RoutingState.attach)."""

    __slots__ = ("name", "target", "signals", "strategy", "tiers", "tier_of", "affinity",
                 "scope", "cost", "hooks", "member_of", "tags", "tier_names")

    def __init__(self, name, pool, target, signals, rate_card):
        self.name = name
        self.target = target
        self.signals = signals
        self.strategy = pool.strategy
        self.affinity = pool.affinity_header.encode("latin-1") if pool.affinity_header else None
        lanes = target.lanes
        self.member_of = {lane: i for i, lane in enumerate(lanes)}
        self.tags = tuple(m.tags for m in pool.members)
        self.tier_names = tuple(m.tier for m in pool.members)
        # A pool with no `hooks:` (plain weighted) treats `tier` as a label only, as the Rust
        # gateway documents ("inert for plain weighted pools"): a config swapped in from it routes
        # by weight across every tier, as it did there. With a strategy or a gate, tiers order.
        tiered = pool.strategy != "weighted" or bool(pool.hooks)
        order = list(dict.fromkeys(self.tier_names)) if tiered else [None]
        self.tier_of = tuple(order.index(t) if tiered else 0 for t in self.tier_names)
        # Each tier's lanes, in member order; one tier when no member names one.
        self.tiers = tuple(tuple(lanes[i] for i in range(len(lanes)) if self.tier_of[i] == k)
                           for k in range(len(order)))
        # Sessions are pinned per pool and per member list: a reload that changes the members
        # starts the pool's sessions afresh rather than pinning them to whatever moved into a slot.
        self.scope = hashlib.blake2b(("%s\0%s" % (name, "\0".join(lane.name for lane in lanes)))
                                     .encode(), digest_size=32).digest()
        # cheapest: the Rust gateway's cost scalar, (input + output) / 2 of the rate card, per
        # million tokens; None for a lane the card does not price (or no card).
        self.cost = tuple(((r.input + r.output) / 2) if r is not None else None
                          for r in ((rate_card or {}).get(lane.name) for lane in lanes))
        self.hooks = None       # busbar/hooks/run.py HookPlan, when the pool fires hooks

    def plain(self) -> bool:
        """No strategy, tier, affinity or hook: SWRR alone (the pool needs no plan)."""
        return (self.strategy == "weighted" and len(self.tiers) == 1 and self.affinity is None
                and self.hooks is None)

    # ------------------------------------------------------------------ signals
    def available(self, i, lane) -> int:
        """Free concurrency of member `i` over every worker."""
        cell = self.target.cells[i] if self.target.cells is not None else None
        if lane.limit is None:
            return UNBOUNDED - (cell.budget.inflight() if cell is not None else lane.inflight)
        if lane._shared is not None:
            return max(0, lane.limit - lane._shared.value(lane._slot))
        return max(0, lane.limit - lane.inflight)

    def budget_left(self, i):
        """Member `i`'s lifetime request budget left (`max_requests`), or None when unlimited."""
        cells = self.target.cells
        if cells is None or cells[i].budget.limit is None:
            return None
        return cells[i].budget.left()

    def key(self, i, lane, headroom):
        """The strategy's sort key of member `i` (smaller first), or None without the signal."""
        s = self.strategy
        if s == "cheapest":
            return self.cost[i]
        if s == "fastest":
            return self.signals.latency_ms(lane)
        if s == "least_busy":
            return -self.available(i, lane)
        if s == "usage":
            return None if headroom is None else -headroom
        return None

    # ------------------------------------------------------------------ picking
    def run(self, ex):
        """The request's Run, made at its first pick (or by its hooks, earlier); a pool that
        neither pins sessions nor has hooks shares one empty Run (nothing per request to keep)."""
        r = ex.routing
        if r is None:
            if self.affinity is None:
                return _BARE
            r = ex.routing = Run(self)
        if self.affinity is not None and r.fp is None:
            v = ex.req.headers.get(self.affinity)
            if v:
                r.fp = Signals.fingerprint(self.scope, v)
        return r

    def pick(self, ex, r, exclude):
        """This pool's lane for the attempt, its permit taken; None when none can take it."""
        target = self.target
        lanes = target.lanes
        r.allowed_in(ex, target)        # the restricted-out lanes join ex.tried (exclude)
        if target.excluded:
            exclude = target.excluded | exclude
        sig = self.signals
        if r.fp is not None and r.plan is self:
            m = sig.pinned(r.fp)
            if m is not None and 0 <= m < len(lanes):
                lane = lanes[m]
                if lane not in exclude and _take(target, m, lane):
                    return lane
        lane = None
        order = r.order if r.plan is self else None
        if order is not None:
            # A gate that orders owns the ranking, across tiers (the members' tier labels were
            # its input, as in the Rust gateway); when none of its lanes can serve, the pool's own
            # tiers and strategy take the rest.
            for i in order:
                cand = lanes[i]
                if cand not in exclude and _take(target, i, cand):
                    lane = cand
                    break
        if lane is None:
            headroom = usage_headroom(ex, self.name) if self.strategy == "usage" else None
            for tier in self.tiers:
                cand = [x for x in tier if x not in exclude]
                if cand:
                    lane = self._pick_tier(target, cand, headroom, exclude)
                    if lane is not None:
                        break
        if lane is not None and r.fp is not None and r.plan is self:
            sig.pin(r.fp, self.member_of[lane])
        return lane

    def _pick_tier(self, target, cand, headroom, exclude):
        member_of = self.member_of
        if self.strategy != "weighted":
            keyed = [(self.key(member_of[lane], lane, headroom), member_of[lane], lane)
                     for lane in cand]
            if all(k is None for k, _, _ in keyed):
                ranked = None       # no lane has the signal: the strategy abstains
            else:
                keyed.sort(key=lambda t: (t[0] is None, t[0] if t[0] is not None else 0, t[1]))
                ranked = [lane for _, _, lane in keyed]
        else:
            ranked = None
        if ranked:
            for lane in ranked:
                if _take(target, member_of[lane], lane):
                    return lane
        # SWRR over the tier (what is not ranked stays reachable, never stranded).
        others = frozenset(lane for lane in target.lanes if lane not in cand)
        return target.pick(exclude | others if others else exclude)


def _take(target, i, lane) -> bool:
    """Member `i` of `target` takes the request if it can: the question SWRR asks of a lane (a free
    permit, a usable breaker cell and its budget), with its permit and cell claim taken."""
    if not target.eligible(lane):
        return False
    cells = target.cells
    if cells is None:
        return lane.try_acquire()
    cell = cells[i]
    if not cell.usable() or not lane.try_acquire():
        return False
    if not cell.claim():
        lane.release()
        return False
    return True


def pick(ex):
    """The attempt's lane for an exchange whose target has a plan, or whose hooks restricted it
    (a fallback pool without a plan still honours the restrict)."""
    target = ex.target
    plan = target.plan
    r = ex.routing
    if plan is None:
        if r is not None:
            r.allowed_in(ex, target)
        return target.pick(ex.tried)
    return plan.pick(ex, plan.run(ex), ex.tried)


def usage_headroom(ex, pool):
    """The `usage` signal: the fraction left of the tightest requests/tokens limit over the caller
    key's group chain for this pool (1.0 unused, 0.0 at the cap), or None with no such limit (or
    no key). The same for every lane of the pool, as in the Rust gateway: under a limit the pool
    is walked in member order, and without one the strategy abstains (weighted). Read from the
    local limit table; a Redis store answers admission remotely, so its pools abstain."""
    key = ex.principal
    gate = ex.site.gate
    gov = ex.snap.governance
    if key is None or key.group is None or gate is None or gov is None:
        return None
    ledger = gate.ledger
    if getattr(ledger, "remote", True):
        return None
    from busbar.governance.model import Denial, window
    chain = gate.chain(gov, key.group, pool, gate.directory.group)
    if chain.__class__ is Denial:
        return None
    now = time.time()
    h = None
    for bucket, kind, amount, per, _name in chain:
        if kind != "requests" and kind != "tokens":
            continue
        used = ledger.table.value(bucket, window(per, now)[0])
        frac = 0.0 if amount <= 0 else min(1.0, max(0.0, 1.0 - used / amount))
        h = frac if h is None else min(h, frac)
    return h


class RoutingState:
    """One worker's routing beyond plain weights: the lane signals (busbar/routing/signals.py) and
    the plans it gives each snapshot's pools (`attach`, at boot and at every reload). `hooks_of
    (config, pool, plan)`: a pool's hook plan or None (busbar/hooks/run.py HookPlan.of, given by
    the gateway: hooks use routing, not the other way round)."""

    def __init__(self, config, hooks_of=None, clock=time.monotonic):
        self.signals = Signals(config, shared_for(config), clock)
        self.hooks_of = hooks_of
        self.hooks = None       # busbar/hooks/run.py HookRunner: the worker's hook sidecar calls
        self.seen = set()       # Lane objects whose latency slot this worker reset (`forget`)
        self.recorder = None    # the attempt hook that records latency, once a pool reads it

    def attach(self, snapshot, site=None):
        snapshot.routing = self
        config = snapshot.config
        router = snapshot.router
        gov = config.governance
        card = gov.rate_card if gov is not None else None
        latency = False
        for lane in router.lanes.values():
            if lane not in self.seen:
                self.seen.add(lane)
                if self.signals.by_name is None:
                    self.signals.forget(lane)
        self.seen &= set(router.lanes.values())
        for name, pool in config.pools.items():
            target = router.resolve(name)
            plan = PoolPlan(name, pool, target, self.signals, card)
            if self.hooks_of is not None:
                plan.hooks = self.hooks_of(config, pool, plan)
            target.plan = None if plan.plain() else plan
            latency = latency or pool.strategy == "fastest" or plan.hooks is not None
        if latency:
            self.signals.recording = True
            if self.recorder is None and site is not None:
                self.recorder = LatencyHook(self.signals)
                site.attempt_hooks.append(self.recorder)


class LatencyHook:
    """The attempt hook recording each 2xx head's latency (installed once a pool reads it)."""

    __slots__ = ("signals",)

    def __init__(self, signals):
        self.signals = signals

    def __call__(self, ex, a):
        if a.fault is None and 200 <= a.status < 300 and a.t_headers and a.t_connected:
            # From the request written (a reused connection) or the connect done (a fresh one)
            # to the response head: the upstream's own time, as Server-Timing counts it.
            self.signals.record(a.lane, a.t_headers - a.t_connected)
