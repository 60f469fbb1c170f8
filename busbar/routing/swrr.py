# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""Lane selection: smooth weighted round robin over lanes with a free permit (SPEC §3).

Per request the server calls `Router.resolve(name)` (one dict lookup) and then `Target.pick()` once
per attempt, passing the lanes already tried as `exclude`. A Router belongs to one event loop: its
counters are plain ints, updated without locks, which is safe because an asyncio worker runs one
callback at a time and `pick` never awaits.
"""
from __future__ import annotations


_NO_LANES: frozenset = frozenset()


class Lane:
    """One model on its provider, shared by every target that uses it, so `max_concurrent` is
    lane-global: a permit taken through pool A is unavailable to pool B and to the direct route.

    With several worker processes the permit count lives in `shared` (cbusbar.shared, a mapping
    every worker inherits from the parent and updates atomically), so the limit holds for the whole
    gateway, not once per process. `inflight` always counts this process's own requests.

    `queue`: where requests wait for a permit of this lane when a pool using it queues (busbar/
    reliability/queue.py), else None. While anyone waits, a fresh acquire fails (the lane counts as
    at capacity) and a released permit goes to the head waiter instead of back to the count."""

    def __init__(self, model, shared=None, slot=-1):
        self.model = model
        self.name = model.name
        self.inflight = 0
        self.limit = model.max_concurrent  # None = unbounded
        self._shared = shared if (shared is not None and self.limit is not None) else None
        self._slot = slot
        self.queue = None

    def has_permit(self):
        limit = self.limit
        if limit is None:
            return True
        q = self.queue
        if q is not None and q.blocked():
            return False
        if self._shared is not None:
            return self._shared.value(self._slot) < limit
        return self.inflight < limit

    def try_acquire(self):
        """Takes a permit if one is free. A lane at capacity is skipped, never waited on."""
        limit = self.limit
        if limit is not None:
            q = self.queue
            if q is not None and q.blocked():
                return False
            if self._shared is not None:
                if not self._shared.try_acquire(self._slot, limit):
                    return False
            elif self.inflight >= limit:
                return False
        self.inflight += 1
        return True

    def take_queued(self):
        """A queued request's acquire: the waiters' own barrier does not apply to them."""
        if self._shared is not None:
            if not self._shared.try_acquire(self._slot, self.limit):
                return False
        elif self.inflight >= self.limit:
            return False
        self.inflight += 1
        return True

    def release(self):
        if self.inflight <= 0:
            # A double release would silently raise the lane's real concurrency above its limit.
            raise RuntimeError(f"lane {self.name!r}: release() without a matching acquire")
        q = self.queue
        if q is not None and q.waiters and q.handoff():
            return      # the permit went to the head waiter: still taken, now by it
        self.inflight -= 1
        if self._shared is not None:
            self._shared.release(self._slot)

    def __repr__(self) -> str:
        limit = "unbounded" if self.limit is None else self.limit
        return f"<Lane {self.name!r} inflight={self.inflight} limit={limit}>"


class Target:
    """What a client names: a pool, or a model used directly (one member of weight 1).

    SWRR (nginx's ngx_http_upstream_get_peer): every eligible member's current weight grows by its
    weight, the largest wins (first on ties) and gives back the sum of the eligible weights. Weights
    5/1/1 yield a a b a c a a: proportional, and spread out rather than bursty. Current weights
    belong to this target, i.e. to the (pool, lane) pair; a member that is not eligible keeps its
    current weight untouched, exactly as nginx treats a peer that is down or at max_conns.
    """

    def __init__(self, name, is_pool, members, passthrough=False):
        """members: [(Lane, weight, reasoning override or None)]. passthrough: the caller's own
        credential goes upstream on every lane (the pool's upstream_credentials, else the
        all-pools default of pools.upstream_credentials)."""
        self.name = name
        self.is_pool = is_pool
        self.lanes = tuple(lane for lane, _, _ in members)
        self.weights = tuple(weight for _, weight, _ in members)
        self.current = [0] * len(members)
        self.passthrough = passthrough
        # governance: every member takes the caller's own key (upstream_credentials: passthrough,
        # the target's or each provider's), so busbar's own key check is skipped for this target
        # (issue 10, BYOK).
        self.byok = passthrough or (bool(self.lanes) and all(
            getattr(lane.model.provider, "upstream_credentials", "own") == "passthrough"
            for lane in self.lanes))
        # reliability (busbar/reliability/state.py attaches them): the breaker cell of each member,
        # parallel to `lanes`; the target's failover policy; members never selected through it.
        self.cells = None
        self.policy = None
        self.excluded = _NO_LANES
        # routing beyond weights (busbar/routing/plan.py: strategy, tiers, affinity, hooks),
        # attached per snapshot by the gateway's RoutingState; None: this SWRR alone.
        self.plan = None
        # Member-level reasoning overrides the model's own setting for requests through this pool.
        self._reasoning = {
            lane: (lane.model.reasoning if override is None else override)
            for lane, _, override in members
        }
        # Lanes whose model does not serve an operation (config `operations:`): never candidates
        # for it. Built once; `pick(exclude)` takes them with the lanes already tried.
        self._lacking = {}
        for lane in self.lanes:
            for op in ("chat", "embeddings"):
                if op not in lane.model.operations:
                    self._lacking[op] = self._lacking.get(op, frozenset()) | {lane}

    def lacking(self, op):
        """The lanes of this target that do not serve `op`."""
        return self._lacking.get(op, _NO_LANES)

    def serves(self, op: str) -> bool:
        """Whether any lane of this target serves `op`."""
        return len(self._lacking.get(op, _NO_LANES)) < len(self.lanes)

    def eligible(self, lane):
        """Whether `lane` may take a request through this target right now. Today that is a free
        permit; the circuit breaker's per-(pool, lane) cell joins this check (the direct route
        then uses the lane-default cell). This runs per member per pick: unbounded lanes return at
        once."""
        return lane.limit is None or lane.has_permit()

    def pick(self, exclude=_NO_LANES):
        """The next lane by SWRR among eligible lanes not in `exclude`, with its permit already
        acquired (the caller must `release()` it). None when no lane is eligible."""
        lanes = self.lanes
        cells = self.cells
        if len(lanes) == 1:
            lane = lanes[0]
            if lane in exclude or not self.eligible(lane):
                return None
            if cells is not None:
                cell = cells[0]
                if cell.enter():
                    # The common case in one call: a closed cell, nothing cooling, no budget.
                    if lane.try_acquire():
                        return lane
                    cell.budget.done(True)
                    return None
                if not cell.usable() or not lane.try_acquire():
                    return None
                if not cell.claim():
                    lane.release()
                    return None
                return lane
            return lane if lane.try_acquire() else None
        if self.excluded:
            exclude = self.excluded | exclude
        current = self.current
        weights = self.weights
        best = -1
        best_weight = 0
        total = 0
        for i in range(len(lanes)):
            lane = lanes[i]
            if lane in exclude or not self.eligible(lane) or (
                    cells is not None and not cells[i].usable()):
                continue
            weight = weights[i]
            cw = current[i] + weight
            current[i] = cw
            total += weight
            if best < 0 or cw > best_weight:
                best = i
                best_weight = cw
        if best < 0:
            return None
        current[best] = best_weight - total
        lane = lanes[best]
        # eligible() just saw a free permit; only another worker process can take it in between
        # (shared permits), in which case the next-best lane is tried.
        if not lane.try_acquire():
            return self.pick(frozenset(exclude) | {lane})
        # The breaker cell's claim: a half-open cell's one probe may have gone to another request
        # (or worker) since usable() read it; the next-best lane is tried then.
        if cells is not None and not cells[best].claim():
            lane.release()
            return self.pick(frozenset(exclude) | {lane})
        return lane

    def reasoning(self, lane):
        """Whether requests through this target to `lane` are treated as reasoning requests."""
        return self._reasoning[lane]

    def __repr__(self) -> str:
        kind = "pool" if self.is_pool else "model"
        return f"<Target {kind} {self.name!r} lanes={[lane.name for lane in self.lanes]}>"


class Router:
    """The routing table for one Config: a Lane per model, a Target per pool and per model.
    Pools and models never share a name (the config refuses it), so one dict serves both."""

    def __init__(self, config, shared=None, lanes=None):
        """shared: a cbusbar.shared.SharedCounters with one slot per model (in sorted name order),
        created before the worker processes fork; None for a single process. lanes: the Lane per
        model, given by a reload (busbar/admin/live.py) that keeps the surviving ones."""
        self.config = config
        if lanes is None:
            slots = {name: i for i, name in enumerate(sorted(config.models))}
            lanes = {name: Lane(model, shared, slots[name]) for name, model in config.models.items()}
        self.lanes = lanes
        # A model named directly has no pool: the all-pools default says whose key goes up.
        direct = getattr(config, "upstream_credentials", "own") == "passthrough"
        targets = {
            name: Target(name, False, [(lane, 1, None)], direct)
            for name, lane in self.lanes.items()
        }
        # Pools first (SPEC §1.1): inserted last so a pool wins should a name ever overlap.
        for name, pool in config.pools.items():
            targets[name] = Target(
                name,
                True,
                [(self.lanes[m.model.name], m.weight, m.reasoning) for m in pool.members],
                pool.upstream_credentials == "passthrough",
            )
        self._targets = targets
        self._names = sorted(config.pools) + sorted(config.models)

    def resolve(self, name):
        return self._targets.get(name)

    def names(self) -> list[str]:
        """Every routable name: pools sorted, then models sorted (GET /v1/models)."""
        return list(self._names)
