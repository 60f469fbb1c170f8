"""`GET /stats` (SPEC §7): every breaker cell of the gateway with its lane's capacity and budget.

`stats_snapshot(site) -> dict` is the one producer; the JSON route, the status page and metric
scrapes all call it. It only reads (it never takes a half-open probe slot), and every number in it
is gateway-wide: cells, budgets and in-flight counts live in the shared mapping every worker
updates, so any worker answers for all of them.

Shape:
    {"pools": {<pool>: [<member model>, ...]},
     "lanes": [{"pool": <pool or "" for the direct route>, "model", "provider",
                "max_concurrent": n|null, "limit": n|"unbounded", "inflight", "free_slots": n|null,
                "available": n|"unbounded", "at_capacity": bool,
                "availability": available|breaker_open|at_capacity|budget_exhausted|probe_in_flight,
                "recovery_hint_ms": ms|null, "breaker_state": closed|half_open|open, "ok", "err",
                "client_fault", "usable": bool, "dead": bool, "dead_reason": str|null,
                "cooldown_remaining_s", "streak", "trips", "budget": n|"unbounded",
                "probes_ok", "probes_failed", "queued"}, ...]}
"""
from __future__ import annotations

from busbar.reliability.breaker import HALF_OPEN, L_PROBE_FAIL, L_PROBE_OK, L_WAITING


# The least a caller should wait for a lane that has no cooldown to count down (the Rust
# gateway's floors, which feed its Retry-After and /stats): one request's time for a lane whose
# half-open probe is in flight, 2 s for a lane at its concurrency cap (no drain estimate).
PROBE_RETRY_FLOOR_MS = 250
AT_CAPACITY_FLOOR_MS = 2000


def availability(lane, cell):
    """(what keeps the lane from taking a request through `cell` now, or "available"; the least
    milliseconds until it could, or None when it can now or nothing but an operator brings it
    back). One reading for /stats and the busbar_lane_available / _recovery_hint_ms gauges."""
    bud = cell.budget
    cooling = cell.cooldown_remaining()
    state = cell.state()
    if bud.limit is not None and not bud.left():
        return "budget_exhausted", None
    if state == HALF_OPEN and cooling > 0:
        return "probe_in_flight", PROBE_RETRY_FLOOR_MS
    if cooling > 0:
        return "breaker_open", int(cooling * 1000)
    if lane.limit is not None and not lane.has_permit():
        return "at_capacity", AT_CAPACITY_FLOOR_MS
    return "available", None


def lane_stats(pool: str, lane, cell) -> dict:
    snap = cell.snapshot()
    bud = cell.budget
    limit = lane.limit
    inflight = bud.inflight()
    free = None if limit is None else max(0, limit - inflight)
    at_capacity = limit is not None and not lane.has_permit()
    left = bud.left()
    cooling = snap["cooldown_remaining_s"]
    availability_, hint = availability(lane, cell)
    return {
        "pool": pool, "model": lane.name, "provider": lane.model.provider.name,
        "max_concurrent": limit, "limit": "unbounded" if limit is None else limit,
        "inflight": inflight, "free_slots": free,
        "available": "unbounded" if limit is None else free, "at_capacity": at_capacity,
        "availability": availability_, "recovery_hint_ms": hint,
        "breaker_state": snap["state"], "ok": snap["ok"], "err": snap["err"],
        "client_fault": snap["client_fault"], "usable": availability_ == "available",
        "dead": snap["hard_down"] and cooling > 0,
        "dead_reason": "hard_down: the provider refused busbar's credentials"
        if snap["hard_down"] and cooling > 0 else None,
        "cooldown_remaining_s": cooling, "streak": snap["streak"], "trips": snap["trips"],
        "budget": "unbounded" if bud.limit is None else left,
        # health probes of the lane (every worker's; never in ok/err), and requests queued for
        # one of its permits (on_exhausted: queue), gateway-wide
        "probes_ok": bud.slots.value(bud.i + L_PROBE_OK),
        "probes_failed": bud.slots.value(bud.i + L_PROBE_FAIL),
        "queued": max(0, bud.slots.value(bud.i + L_WAITING)),
    }


def stats_snapshot(site, allowed=None) -> dict:
    """`allowed`: the names a virtual key may call (its allowed_pools), or None for all: then only
    those pools and their cells, and the direct routes of the models it names, are shown, so a
    key cannot read the topology it cannot reach."""
    rel = site.reliability
    config = site.snapshot.config
    router = site.snapshot.router
    lanes = []
    for (pool, name), cell in sorted(rel.cells.items()):
        lane = router.lanes.get(name)
        if lane is None or (pool and pool not in config.pools):
            continue    # a cell a reload left behind
        if allowed is not None and (pool or name) not in allowed:
            continue
        lanes.append(lane_stats(pool, lane, cell))
    return {"pools": {name: [m.model.name for m in p.members] for name, p in config.pools.items()
                      if allowed is None or name in allowed},
            "lanes": lanes}
