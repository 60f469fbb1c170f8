"""Prometheus metrics over every worker process: integer counters in shared memory, text on scrape.

Every series and label combination busbar can produce is known from the config (ingress protocols,
configured pool/model names, outcomes, dispositions), so `Layout` gives each one a fixed slot in a
`cbusbar.shared.SharedCounters` mapping created before the workers fork. The hot path is a few
atomic adds at the request's end (`on_finish`, attempts included); whichever worker answers a
scrape reads the whole mapping and renders text format 0.0.4, so any worker's answer covers all.

Measured (2 workers vs one process' dicts): an atomic add through the cpdef call costs ~50 ns, a
Python dict increment ~70 ns, and the parent-gathering alternative needs an IPC round per scrape
plus per-worker state; shared counters win on both counts.

Histograms store per-bucket (non-cumulative) counts and the sum in nanoseconds; rendering makes
them cumulative. Gauges that belong to a process (lane in-flight, RSS, fds) are published by each
worker into its own region every PUBLISH_SECS and summed on scrape.
"""
from __future__ import annotations

import os
import time

from cbusbar.metrics import Counting

from busbar.engine import records as R

INGRESS = ("openai", "responses", "anthropic", "gemini", "cohere", "bedrock", "bedrock-invoke", "none")
OUTCOMES = (R.O_OK, R.O_CLIENT_ERROR, R.O_UPSTREAM_ERROR, R.O_EXHAUSTED, R.O_BROKEN,
            R.O_CLIENT_GONE, R.O_INTERNAL, R.O_SHED)
# Why an attempt failed, in the reference's disposition words where one fits (SPEC §4.1), else the
# fault itself. The reliability issue's classifier replaces `disposition()` when it lands.
DISPOSITIONS = ("transient_upstream", "attempt_timeout", "hard_down", "context_length", "connect",
                "upstream_4xx", "reset", "malformed", "truncated", "protocol", "credentials",
                "refused", "cancelled", "internal")
TOKEN_KINDS = ("input", "output", "cached")
# Where a request was refused before any upstream: the inbound cap, and governance's gates
# (busbar/governance/gate.py sets RequestRecord.denied to one of the others).
GATES = ("inbound_concurrency", "auth", "pool_acl", "rate_limit", "budget", "concurrent",
         "group_disabled", "store_unavailable")
# busbar_key_spend_usd_total: the keys with the most spend get their own series, the rest are
# summed under key="others" (a gateway with thousands of keys must not mint thousands of series).
SPEND_SERIES_MAX = 100
UNRESOLVED = "unresolved"

# busbar's own time per request: from 50 µs (a relayed small call is ~100-300 µs) to 2.5 s.
REQUEST_BUCKETS_S = (0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003,
                     0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Upstream time: first tokens in ~0.2 s, long generations in minutes.
UPSTREAM_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# How often each worker publishes its per-process gauges (lane in-flight, pid) to shared memory.
PUBLISH_SECS = 1.0
# Cached slot bases per (ingress, target, lane): every key is made of configured names, so the
# cache is bounded by the config; the cap only guards against a config with thousands of lanes.
CACHE_MAX = 4096


def disposition(a) -> str:
    f = a.fault
    if f == R.F_STATUS:
        s = a.status
        if s == 429 or s == 408 or s >= 500:
            return "transient_upstream"
        if s == 401 or s == 403:
            return "hard_down"
        return "upstream_4xx"
    if f == R.F_TIMEOUT:
        return "attempt_timeout"
    return f


# Names a config reload may add over the process's life, beyond the boot config's (the slots are
# laid out before the workers fork, so room for later names is reserved then): pools and models
# (a model is also the direct route's `pool` label), (pool, lane) pairs, and lanes. A pool's series
# take ~270 slots (2.2 KiB), a pair's 18, so the defaults cost ~180 KiB of shared memory, whose
# pages are only backed once written. Past them a new pool counts under pool="unresolved" (a new
# pair's lane series are not counted) and the reload logs a WARNING: restart to grow the table.
SPARE_POOLS_MIN = 64
SPARE_PAIRS_MIN = 256
SPARE_LANES_MIN = 64


def _names(config):
    """(pool labels, (pool, lane) pairs, lanes) of one config, sorted."""
    models = sorted(config.models)
    pairs = set((m, m) for m in models)
    for name, pool in config.pools.items():
        for m in pool.members:
            pairs.add((name, m.model.name))
    return sorted(set(config.pools) | set(models)), sorted(pairs), models


_OUT_I = {o: i for i, o in enumerate(OUTCOMES)}
_DISP_I = {d: i for i, d in enumerate(DISPOSITIONS)}
_ING_I = {p: i for i, p in enumerate(INGRESS)}
_REQ_BOUNDS_NS = [int(b * 1e9) for b in REQUEST_BUCKETS_S]
_UP_BOUNDS_NS = [int(b * 1e9) for b in UPSTREAM_BUCKETS_S]


class Layout:
    """Slot numbers for every series. Built from the boot config before the workers fork, with
    spare room (SPARE_*); every name gets an index once and keeps it for the process's life, so
    the same slot means the same series in every worker. A reload adds names through the parent:
    `plan(config)` there, `adopt(plan)` in every worker (busbar/admin/live.py sends it with the
    config), so a pool added by a reload is counted into the same slots by all of them."""

    def __init__(self, config, workers: int, sinks=()):
        pools, pairs, lanes = _names(config)
        self.pools = pools + [UNRESOLVED]       # index = position; names are only ever appended
        self.pairs = pairs
        self.lanes = lanes
        self.forgets = []       # every Metrics' forget(): its cached slot bases, dropped by adopt()
        self.P = len(self.pools) + max(SPARE_POOLS_MIN, len(self.pools))
        self.PL = len(pairs) + max(SPARE_PAIRS_MIN, len(pairs))
        self.M = len(lanes) + max(SPARE_LANES_MIN, len(lanes))
        self._index()
        self.sinks = ["access_log"] + list(sinks) + ["otlp"]
        self.workers = workers
        n = 0

        def take(k):
            nonlocal n
            start = n
            n += k
            return start

        P, I, O, D, L = self.P, len(INGRESS), len(OUTCOMES), len(DISPOSITIONS), self.PL
        self.ing_i = {p: i for i, p in enumerate(INGRESS)}
        self.out_i = {o: i for i, o in enumerate(OUTCOMES)}
        self.disp_i = {d: i for i, d in enumerate(DISPOSITIONS)}
        self.gate_i = {g: i for i, g in enumerate(GATES)}
        self.requests = take(I * P * O)
        self.rb = len(REQUEST_BUCKETS_S) + 2     # buckets, +Inf, sum (ns)
        self.req_hist = take(I * P * self.rb)
        self.ub = len(UPSTREAM_BUCKETS_S) + 2
        self.up_hist = take(P * self.ub)
        self.attempts = take(L)
        self.failures = take(L * D)
        self.failovers = take(P * D)
        self.translations = take(I * I)
        self.tokens = take(L * len(TOKEN_KINDS))
        self.admission = take(len(GATES))
        self.dropped = take(len(self.sinks))
        self.worker_claim = take(1)
        self.boot_time = take(1)
        # Per worker: pid, then each lane's in-flight count.
        self.per_worker = self.M + 1
        self.workers_base = take(workers * self.per_worker)
        self.size = n
        self.req_bounds_ns = [int(b * 1e9) for b in REQUEST_BUCKETS_S]
        self.up_bounds_ns = [int(b * 1e9) for b in UPSTREAM_BUCKETS_S]

    def _index(self):
        self.pool_i = {p: i for i, p in enumerate(self.pools)}
        self.pair_i = {p: i for i, p in enumerate(self.pairs)}
        self.lane_i = {m: i for i, m in enumerate(self.lanes)}

    def plan(self, config) -> dict:
        """The name tables with `config`'s new names appended (what fits in the spares), and the
        names left without series. Pure: the parent computes it, every worker adopts it."""
        pools, pairs, lanes = _names(config)
        out = {"pools": list(self.pools), "pairs": list(self.pairs), "lanes": list(self.lanes),
               "left_out": []}
        for key, names, cap in (("pools", pools, self.P), ("pairs", pairs, self.PL),
                                ("lanes", lanes, self.M)):
            have = set(out[key])
            for name in names:
                if name in have:
                    continue
                if len(out[key]) < cap:
                    out[key].append(name)
                    have.add(name)
                else:
                    out["left_out"].append(name if isinstance(name, str) else "%s/%s" % name)
        return out

    def adopt(self, plan: dict):
        # Only ever appends (a worker that missed a swap catches up with the next one).
        if len(plan["pools"]) >= len(self.pools) and len(plan["pairs"]) >= len(self.pairs) and \
                len(plan["lanes"]) >= len(self.lanes):
            self.pools, self.pairs, self.lanes = list(plan["pools"]), list(plan["pairs"]), list(plan["lanes"])
            self._index()
            for f in self.forgets:      # cached slot bases may map a new name to "unresolved"
                f()


class Metrics:
    """One worker's view of the shared counters, and the finish hook that counts into them."""

    def __init__(self, layout: Layout, counters):
        self.L = layout
        self.c = counters
        self.add = counters.add
        self.worker = -1
        self.site = None
        self.cache = {}         # (ingress, target, lane) -> slot bases (cbusbar.metrics.Bases)
        # The finish hook, in C (cbusbar/metrics.pyx).
        self.hook = Counting(self, counters, _REQ_BOUNDS_NS, _UP_BOUNDS_NS, _OUT_I, _ING_I,
                             layout.gate_i, layout.translations, layout.admission, R.O_SHED)
        self.on_finish = self.hook.on_finish
        layout.forgets.append(self.forget)

    def forget(self):
        """Drops the slot bases cached by name (the dict and the hook's last ones)."""
        self.cache.clear()
        self.hook.forget()

    def attach(self, site):
        """Claims this worker's region and starts publishing its gauges."""
        L = self.L
        self.site = site
        self.worker = self.add(L.worker_claim, 1) - 1
        if self.c.value(L.boot_time) == 0:
            self.c.store(L.boot_time, int(time.time()))
        self.publish()

    def publish(self):
        L = self.L
        w = self.worker
        if w < 0 or w >= L.workers or self.site is None:
            return
        base = L.workers_base + w * L.per_worker
        self.c.store(base, os.getpid())
        lanes = self.site.snapshot.router.lanes
        for i, name in enumerate(L.lanes):
            lane = lanes.get(name)
            self.c.store(base + 1 + i, lane.inflight if lane is not None else 0)

    # ------------------------------------------------------------------ hot path
    def _attempts(self, target, atts, fo):
        """Attempts, failures and failovers of a request that failed over or failed (the rare
        path: a lookup per attempt)."""
        L = self.L
        add = self.add
        last = len(atts) - 1
        for n, a in enumerate(atts):
            k = L.pair_i.get((target, a.lane.name if a.lane is not None else None))
            if k is not None:
                add(L.attempts + k, 1)
            if a.fault is not None:
                d = _DISP_I.get(disposition(a), 0)
                if k is not None:
                    add(L.failures + k * len(DISPOSITIONS) + d, 1)
                if n < last:
                    # Every failed attempt that another attempt followed is one failover.
                    add(fo + d, 1)

    def _bases(self, key):
        """Slot bases of one (ingress, target, lane): the requests row, the two histograms, the
        failovers row, the tokens (-1: no pair), the ingress index, and the attempts slot (-1: no
        pair). cbusbar.metrics caches them per key (`keep`); a reload that adds names empties the
        cache (`Layout.adopt`)."""
        L = self.L
        ingress, target, lane = key
        p = L.pool_i.get(target or UNRESOLVED)
        if p is None:
            p = L.pool_i[UNRESOLVED]
        i = L.ing_i.get(ingress or "none", L.ing_i["none"])
        ip = i * L.P + p
        k = L.pair_i.get((target, lane)) if lane is not None else None
        return (L.requests + ip * len(OUTCOMES), L.req_hist + ip * L.rb, L.up_hist + p * L.ub,
                L.failovers + p * len(DISPOSITIONS), -1 if k is None else L.tokens + k * 3, i,
                -1 if k is None else L.attempts + k)

    def keep(self, key, bases):
        if len(self.cache) < CACHE_MAX:
            self.cache[key] = bases

    def dropped(self, sink: str, n: int = 1):
        try:
            i = self.L.sinks.index(sink)
        except ValueError:
            return
        self.add(self.L.dropped + i, n)

    # ------------------------------------------------------------------ reading
    def values(self):
        return self.c.values(0, self.L.size)

    def summary(self, v=None) -> dict:
        """Totals the status page needs: requests, failovers and busbar-time buckets summed over
        every label (cumulative; the page's endpoint takes differences over time)."""
        L = self.L
        v = v if v is not None else self.values()
        # Protocol requests only: health checks (ingress "none", the last) would swamp req/s.
        I, P, O, n = len(INGRESS) - 1, L.P, len(OUTCOMES), len(L.pools)
        requests = sum(v[L.requests:L.requests + I * P * O])
        buckets = [0] * (L.rb - 1)
        nb = L.rb - 1
        for i in range(I):
            for p in range(n):      # the names assigned so far, not the spares
                base = L.req_hist + (i * P + p) * L.rb
                for b, x in enumerate(v[base:base + nb]):
                    buckets[b] += x
        failovers = sum(v[L.failovers:L.failovers + P * len(DISPOSITIONS)])
        return {"requests": requests, "failovers": failovers, "busbar_buckets": buckets}


def _labels(**kw) -> str:
    return "{" + ",".join('%s="%s"' % (k, _esc(v)) for k, v in kw.items()) + "}"


def _esc(v) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _proc_stats(pid: int):
    """(rss bytes, open fds) of a live process, or None."""
    try:
        with open("/proc/%d/statm" % pid) as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        fds = len(os.listdir("/proc/%d/fd" % pid))
        return rss, fds
    except (OSError, ValueError, IndexError):
        return None


# busbar_lane_state's values: the breaker's own state numbers (busbar/reliability/breaker.py),
# and BENCHED for an open cell whose lane refused busbar's credentials.
BENCHED = 3


def _cells(site):
    """(pool label, lane, state, trips) of every breaker cell of the current config, read from the
    shared slots (gateway-wide). A direct route's cell is labelled with its model's name as pool,
    as in every other series."""
    rel = site.reliability if site is not None else None
    if rel is None:
        return []
    from busbar.reliability.breaker import OPEN, S_HARD, S_STATE, S_TRIPS
    out = []
    for c in rel.cells.values():
        slots, b = c.slots, c.base
        state = slots.value(b + S_STATE)
        if state == OPEN and slots.value(b + S_HARD):
            state = BENCHED
        name = c.lane.name
        out.append((c.pool or name, name, state, slots.value(b + S_TRIPS)))
    out.sort()
    return out


def render(m: Metrics) -> bytes:
    """Text format 0.0.4 of every series, read from shared memory at this moment."""
    m.publish()
    L = m.L
    v = m.values()
    out = []
    w = out.append
    I, P, O, D = len(INGRESS), L.P, len(OUTCOMES), len(DISPOSITIONS)

    w("# HELP busbar_requests_total Requests answered, by ingress protocol, pool and outcome.")
    w("# TYPE busbar_requests_total counter")
    for i, ing in enumerate(INGRESS):
        for p, pool in enumerate(L.pools):
            for o, outc in enumerate(OUTCOMES):
                x = v[L.requests + (i * P + p) * O + o]
                if x:
                    w("busbar_requests_total%s %d" % (_labels(ingress_protocol=ing, pool=pool, outcome=outc), x))

    def hist(name, help_, slot_of, labels_iter, bounds):
        w("# HELP %s %s" % (name, help_))
        w("# TYPE %s histogram" % name)
        nb = len(bounds) + 2
        for labels, base in labels_iter:
            counts = v[base:base + nb - 1]
            total = sum(counts)
            if not total:
                continue
            cum = 0
            lab = labels[1:-1]
            for b, le in enumerate(bounds):
                cum += counts[b]
                w('%s_bucket{%s,le="%s"} %d' % (name, lab, repr(float(le)), cum))
            w('%s_bucket{%s,le="+Inf"} %d' % (name, lab, total))
            w("%s_sum%s %.9f" % (name, labels, v[base + nb - 1] / 1e9))
            w("%s_count%s %d" % (name, labels, total))

    hist("busbar_request_duration_seconds",
         "busbar's own time per request (total minus upstream time), as in Server-Timing.", None,
         ((_labels(ingress_protocol=ing, pool=pool), L.req_hist + (i * P + p) * L.rb)
          for i, ing in enumerate(INGRESS) for p, pool in enumerate(L.pools)), REQUEST_BUCKETS_S)
    hist("busbar_upstream_duration_seconds", "Upstream time per request (all its attempts).", None,
         ((_labels(pool=pool), L.up_hist + p * L.ub) for p, pool in enumerate(L.pools)),
         UPSTREAM_BUCKETS_S)

    w("# HELP busbar_upstream_attempts_total Upstream attempts, by pool and lane.")
    w("# TYPE busbar_upstream_attempts_total counter")
    for k, (pool, lane) in enumerate(L.pairs):
        x = v[L.attempts + k]
        if x:
            w("busbar_upstream_attempts_total%s %d" % (_labels(pool=pool, lane=lane), x))
    w("# HELP busbar_upstream_failures_total Failed upstream attempts, by pool, lane and disposition.")
    w("# TYPE busbar_upstream_failures_total counter")
    for k, (pool, lane) in enumerate(L.pairs):
        for d, disp in enumerate(DISPOSITIONS):
            x = v[L.failures + k * D + d]
            if x:
                w("busbar_upstream_failures_total%s %d" % (_labels(pool=pool, lane=lane, disposition=disp), x))
    w("# HELP busbar_failovers_total Failed attempts followed by another lane, by pool and reason.")
    w("# TYPE busbar_failovers_total counter")
    for p, pool in enumerate(L.pools):
        for d, disp in enumerate(DISPOSITIONS):
            x = v[L.failovers + p * D + d]
            if x:
                w("busbar_failovers_total%s %d" % (_labels(pool=pool, reason=disp), x))
    cells = _cells(m.site)
    w("# HELP busbar_lane_state Breaker state of each (pool, lane) cell: 0 closed, 1 open, "
      "2 half_open (one probe in flight), 3 benched (hard_down: the provider refused busbar's key).")
    w("# TYPE busbar_lane_state gauge")
    for pool, lane, state, _ in cells:
        w("busbar_lane_state%s %d" % (_labels(pool=pool, lane=lane), state))
    w("# HELP busbar_breaker_trips_total Times a (pool, lane) cell went from closed to open "
      "(error threshold reached, or benched).")
    w("# TYPE busbar_breaker_trips_total counter")
    for pool, lane, _, trips in cells:
        w("busbar_breaker_trips_total%s %d" % (_labels(pool=pool, lane=lane), trips))
    w("# HELP busbar_translations_total Requests answered through a translation, by protocols.")
    w("# TYPE busbar_translations_total counter")
    for i, a in enumerate(INGRESS):
        for j, b in enumerate(INGRESS):
            x = v[L.translations + i * I + j]
            if x:
                w("busbar_translations_total%s %d" % (_labels(**{"from": a, "to": b}), x))
    w("# HELP busbar_tokens_total Tokens reported by the upstream, by pool, model and kind.")
    w("# TYPE busbar_tokens_total counter")
    for k, (pool, lane) in enumerate(L.pairs):
        for t, kind in enumerate(TOKEN_KINDS):
            x = v[L.tokens + k * 3 + t]
            if x:
                w("busbar_tokens_total%s %d" % (_labels(pool=pool, model=lane, kind=kind), x))
    w("# HELP busbar_admission_denied_total Requests refused before routing, by gate.")
    w("# TYPE busbar_admission_denied_total counter")
    for g, gate in enumerate(GATES):
        w("busbar_admission_denied_total%s %d" % (_labels(gate=gate), v[L.admission + g]))
    spend = m.site.gov_spend if m.site is not None else None
    if spend is not None:
        # governance: derived from stored usage and the current rate card, refreshed every few
        # seconds by the parent (busbar/governance/plane.py); the top keys, then "others".
        w("# HELP busbar_key_spend_usd_total Spend of each virtual key (USD, from the rate card).")
        w("# TYPE busbar_key_spend_usd_total counter")
        ranked = sorted(spend.items(), key=lambda kv: -kv[1])
        others = 0
        for n, ((key, group), usd) in enumerate(ranked):
            if n < SPEND_SERIES_MAX:
                w("busbar_key_spend_usd_total%s %.9f" % (_labels(key=key, group=group or ""), usd))
            else:
                others += usd
        if len(ranked) > SPEND_SERIES_MAX:
            w("busbar_key_spend_usd_total%s %.9f" % (_labels(key="others", group=""), others))
    w("# HELP busbar_records_dropped_total Records a saturated sink dropped, by sink.")
    w("# TYPE busbar_records_dropped_total counter")
    for s, sink in enumerate(L.sinks):
        w("busbar_records_dropped_total%s %d" % (_labels(sink=sink), v[L.dropped + s]))

    # Per-worker gauges, summed over the live workers.
    inflight = [0] * len(L.lanes)
    rss = fds = live = 0
    for wk in range(min(v[L.worker_claim], L.workers)):
        base = L.workers_base + wk * L.per_worker
        pid = v[base]
        st = _proc_stats(pid) if pid else None
        if st is None:
            continue
        live += 1
        rss += st[0]
        fds += st[1]
        for i in range(len(L.lanes)):
            inflight[i] += v[base + 1 + i]
    w("# HELP busbar_lane_inflight Upstream requests in flight on a lane, over all workers.")
    w("# TYPE busbar_lane_inflight gauge")
    current = m.site.snapshot.router.lanes if m.site is not None else None
    for i, lane in enumerate(L.lanes):
        if current is None or lane in current:      # a model a reload removed has no gauge
            w("busbar_lane_inflight%s %d" % (_labels(lane=lane), inflight[i]))
    # reliability: requests waiting for a lane permit (on_exhausted: queue), from the shared
    # pool blocks every worker updates (busbar/reliability/queue.py).
    rel = m.site.reliability if m.site is not None else None
    queued = rel.queued_by_pool() if rel is not None else {}
    if queued:
        w("# HELP busbar_pool_queued Requests waiting for a lane permit, over all workers.")
        w("# TYPE busbar_pool_queued gauge")
        for pool in sorted(queued):
            w("busbar_pool_queued%s %d" % (_labels(pool=pool), queued[pool]))
    w("# HELP busbar_workers Live worker processes.")
    w("# TYPE busbar_workers gauge")
    w("busbar_workers %d" % live)
    w("# HELP busbar_process_resident_memory_bytes Resident memory of all worker processes.")
    w("# TYPE busbar_process_resident_memory_bytes gauge")
    w("busbar_process_resident_memory_bytes %d" % rss)
    w("# HELP busbar_process_open_fds Open file descriptors of all worker processes.")
    w("# TYPE busbar_process_open_fds gauge")
    w("busbar_process_open_fds %d" % fds)
    w("# HELP busbar_process_uptime_seconds Seconds since the gateway started.")
    w("# TYPE busbar_process_uptime_seconds gauge")
    boot = v[L.boot_time]
    w("busbar_process_uptime_seconds %d" % (max(0, int(time.time()) - boot) if boot else 0))
    return ("\n".join(out) + "\n").encode()
