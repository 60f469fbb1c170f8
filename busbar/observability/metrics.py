"""Prometheus metrics over every worker process: integer counters in shared memory, text on scrape.

The series, their labels and what their values mean are the Rust gateway's (its
docs/observability.md), so a dashboard or an alert written for one reads the other; busbar's own
series beside them carry names that gateway does not use (docs/operations.md lists both).

Every series and label combination busbar can produce is known from the config (ingress protocols,
configured pool/model names, outcomes, dispositions), so `Layout` gives each one a fixed slot in a
`cbusbar.shared.SharedCounters` mapping created before the workers fork. The hot path is a few
atomic adds at the request's end (cbusbar/metrics.pyx, attempts included); whichever worker
answers a scrape reads the mapping and renders text format 0.0.4, so any worker's answer covers all.

Measured (2 workers vs one process' dicts): an atomic add through the cpdef call costs ~50 ns, a
Python dict increment ~70 ns, and the parent-gathering alternative needs an IPC round per scrape
plus per-worker state; shared counters win on both counts.

Histograms store per-bucket (non-cumulative) counts and the sum in nanoseconds; rendering makes
them cumulative. busbar_request_duration_seconds is a summary, as the Rust gateway exposes it: the
cumulative sum and count, and quantiles over the last `buffer_seconds` read from the rolling
window of log-spaced buckets cbusbar/metrics.pyx keeps (an estimate within E2E_ERROR of the true
value, clamped to the window's exact min and max). Gauges are read when a scrape asks: the lanes'
from the breaker cells and lane blocks in shared memory, the governance ones from the board the
parent writes (GovBoard).
"""
from __future__ import annotations

import logging
import math
import mmap
import os
import re
import struct
import time

from cbusbar.metrics import Counting

from busbar.engine import records as R
from busbar.engine.classify import D_ATTEMPT_TIMEOUT, D_CONTEXT, D_HARD_DOWN, D_TRANSIENT

log = logging.getLogger("busbar")

INGRESS = ("openai", "responses", "anthropic", "gemini", "cohere", "bedrock", "bedrock-invoke", "none")
# busbar's own outcome of a request (busbar/engine/records.py O_*): busbar_request_outcomes_total.
OUTCOMES = (R.O_OK, R.O_CLIENT_ERROR, R.O_UPSTREAM_ERROR, R.O_EXHAUSTED, R.O_BROKEN,
            R.O_CLIENT_GONE, R.O_INTERNAL, R.O_SHED)
# busbar_requests_total's `outcome`, from the status the client was answered (the Rust gateway's
# finish: 2xx ok, 503 exhausted, other 4xx client_error, anything else error), in
# cbusbar/metrics.pyx's order; a request the client left before any answer has none and is not
# in that series (nor in busbar_request_duration_seconds).
STATUS_OUTCOMES = ("ok", "exhausted", "client_error", "error")
N_STATUS = len(STATUS_OUTCOMES) + 1
# busbar_upstream_failures_total's `disposition`: what a failed attempt meant for its lane.
DISPOSITIONS = (D_TRANSIENT, D_ATTEMPT_TIMEOUT, D_HARD_DOWN, D_CONTEXT)
# busbar_failovers_total's `reason`: the dispositions, and `connect` for an attempt that never
# reached the upstream (`timeout` is the Rust gateway's word for its transport timeout; busbar's
# attempt deadline is `attempt_timeout`, so busbar does not produce it).
REASONS = ("timeout", "connect") + DISPOSITIONS
TOKEN_KINDS = ("input", "output", "cached")
# busbar_admission_denied_total's `gate`: a bounded admission that refused work because it was
# full (the Rust gateway's names): the inbound concurrency cap, a request-log webhook's deliveries,
# a request-log file's buffer.
GATES = ("inbound", "webhook", "request-log-file")
# busbar_governance_denied_total's `gate`: where governance refused a request before any upstream
# (busbar/governance/gate.py sets RequestRecord.denied to one of these).
GOVERNANCE_GATES = ("auth", "pool_acl", "rate_limit", "budget", "concurrent", "group_disabled",
                    "store_unavailable")
UNRESOLVED = "unresolved"

# busbar's own time per request: from 50 µs (a relayed small call is ~100-300 µs) to 2.5 s.
REQUEST_BUCKETS_S = (0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003,
                     0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
# Upstream time: first tokens in ~0.2 s, long generations in minutes.
UPSTREAM_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# The end-to-end quantiles' rolling window: buckets from 2**17 ns (131 µs), 8 to an octave (each
# 9 % wider than the last, so an estimate at a bucket's geometric middle is within ~4.4 % of any
# value in it; cbusbar/metrics.pyx finds a bucket from the time's top bits, which may put a time
# 0.4 % past an edge in the bucket below), 26 octaves up to ~2.4 h, one below and one above. The
# Rust gateway's summary keeps a sketch of the same kind (its window split in three rotating
# buckets, as here).
E2E_MIN_EXP = 17
E2E_PER_OCTAVE = 8              # cbusbar/metrics.pyx's PER_OCTAVE
E2E_BUCKETS = 2 + 26 * E2E_PER_OCTAVE
E2E_ERROR = 2 ** (0.5 / E2E_PER_OCTAVE) - 1 + 1 / 256
# floor(PER_OCTAVE * log2(1 + m/256)): the bucket within an octave of the 8 bits under a time's
# highest set bit.
E2E_OCTAVE = bytes(int(E2E_PER_OCTAVE * math.log2(1 + m / 256)) for m in range(256))
RINGS = 4
# The quantiles the summary renders (the Rust gateway's exporter's defaults: min, median, p90,
# p95, p99, p99.9, max), with their label text.
QUANTILES = ((0.0, "0"), (0.5, "0.5"), (0.9, "0.9"), (0.95, "0.95"), (0.99, "0.99"),
             (0.999, "0.999"), (1.0, "1"))
# How often each worker publishes its per-process gauges (its pid) to shared memory.
PUBLISH_SECS = 1.0
# Cached slot bases per (ingress, target, lane): every key is made of configured names, so the
# cache is bounded by the config; the cap only guards against a config with thousands of lanes.
CACHE_MAX = 4096
# busbar_lane_state's values (lane_state).
_LANE_STATE_CLOSED, _LANE_STATE_HALF_OPEN, _LANE_STATE_OPEN = 0, 1, 2


# Names a config reload may add over the process's life, beyond the boot config's (the slots are
# laid out before the workers fork, so room for later names is reserved then): pools and models
# (a model is also the direct route's `pool` label), and (pool, lane) pairs. A pool's series take
# ~7k slots across its ingress protocols (mostly the end-to-end window's buckets, whose pages are
# only backed once a request of that protocol and pool writes them), a pair's 8. Past the spares a
# new pool counts under pool="unresolved" (a new pair's lane series are not counted) and the
# reload logs a WARNING: restart to grow the table.
SPARE_POOLS_MIN = 64
SPARE_PAIRS_MIN = 256


def failover_reason(a) -> str:
    """Why a failed attempt was left, in busbar_failovers_total's words (`connect` when it never
    reached the upstream, else its disposition); the fault itself for one that has none."""
    if a.fault == R.F_CONNECT:
        return "connect"
    return a.disposition or a.fault


def _names(config):
    """(pool labels, (pool, lane) pairs) of one config, sorted."""
    models = sorted(config.models)
    pairs = set((m, m) for m in models)
    for name, pool in config.pools.items():
        for m in pool.members:
            pairs.add((name, m.model.name))
    return sorted(set(config.pools) | set(models)), sorted(pairs)


_OUT_I = {o: i for i, o in enumerate(OUTCOMES)}
_DISP_I = {d: i for i, d in enumerate(DISPOSITIONS)}
_REASON_I = {d: i for i, d in enumerate(REASONS)}
_ING_I = {p: i for i, p in enumerate(INGRESS)}
_REQ_BOUNDS_NS = [int(b * 1e9) for b in REQUEST_BUCKETS_S]
_UP_BOUNDS_NS = [int(b * 1e9) for b in UPSTREAM_BUCKETS_S]


class Layout:
    """Slot numbers for every series. Built from the boot config before the workers fork, with
    spare room (SPARE_*); every name gets an index once and keeps it for the process's life, so
    the same slot means the same series in every worker. A reload adds names through the parent:
    `plan(config)` there, `adopt(plan)` in every worker (busbar/admin/live.py sends it with the
    config), so a pool added by a reload is counted into the same slots by all of them.
    `buffer_seconds`: the end-to-end quantiles' window (export.<n>.settings.buffer_seconds)."""

    def __init__(self, config, workers: int, sinks=(), buffer_seconds: int = 60):
        pools, pairs = _names(config)
        self.pools = pools + [UNRESOLVED]       # index = position; names are only ever appended
        self.pairs = pairs
        self.forgets = []       # every Metrics' forget(): its cached slot bases, dropped by adopt()
        self.P = len(self.pools) + max(SPARE_POOLS_MIN, len(self.pools))
        self.PL = len(pairs) + max(SPARE_PAIRS_MIN, len(pairs))
        self._index()
        self.sinks = ["access_log"] + list(sinks) + ["otlp"]
        self.workers = workers
        self.buffer_seconds = buffer_seconds
        n = 0

        def take(k):
            nonlocal n
            start = n
            n += k
            return start

        P, I, O, L = self.P, len(INGRESS), len(OUTCOMES), self.PL
        self.ing_i = {p: i for i, p in enumerate(INGRESS)}
        self.gate_i = {g: i for i, g in enumerate(GOVERNANCE_GATES)}
        # busbar's outcome x the answer's status class, per (ingress, pool)
        self.requests = take(I * P * O * N_STATUS)
        self.rb = len(REQUEST_BUCKETS_S) + 2     # buckets, +Inf, sum (ns)
        self.req_hist = take(I * P * self.rb)
        self.e2e = take(I * P * 2)              # end-to-end sum (ns), count
        self.ub = len(UPSTREAM_BUCKETS_S) + 2
        self.up_hist = take(P * self.ub)
        self.attempts = take(L)
        self.failures = take(L * len(DISPOSITIONS))
        self.failovers = take(P * len(REASONS))
        self.translations = take(I * I)
        self.tokens = take(L * len(TOKEN_KINDS))
        self.admission = take(len(GATES))
        self.denied = take(len(GOVERNANCE_GATES))
        self.dropped = take(len(self.sinks))
        self.webhook_dropped = take(1)
        self.file_dropped = take(1)
        self.billing_truncated = take(1)
        self.worker_claim = take(1)
        self.boot_time = take(1)
        self.per_worker = 1                      # its pid
        self.workers_base = take(workers * self.per_worker)
        self.markers = take(RINGS)
        # The rolling window, last: a scrape reads everything before it in one call, and of the
        # rings only the rows of named pools.
        self.row = E2E_BUCKETS + 2               # buckets, min (ns), max (ns)
        self.ring_size = I * P * self.row
        self.ring0 = take(RINGS * self.ring_size)
        self.size = n
        self.third_ns = max(1, int(buffer_seconds * 1e9 / 3))

    def _index(self):
        self.pool_i = {p: i for i, p in enumerate(self.pools)}
        self.pair_i = {p: i for i, p in enumerate(self.pairs)}

    def window(self):
        """What cbusbar.metrics.Counting needs of the rolling window."""
        return (self.markers, self.ring0, self.ring_size, self.row, E2E_BUCKETS, self.P,
                self.third_ns, E2E_MIN_EXP, E2E_OCTAVE)

    def plan(self, config) -> dict:
        """The name tables with `config`'s new names appended (what fits in the spares), and the
        names left without series. Pure: the parent computes it, every worker adopts it."""
        pools, pairs = _names(config)
        out = {"pools": list(self.pools), "pairs": list(self.pairs), "left_out": []}
        for key, names, cap in (("pools", pools, self.P), ("pairs", pairs, self.PL)):
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
        if len(plan["pools"]) >= len(self.pools) and len(plan["pairs"]) >= len(self.pairs):
            self.pools, self.pairs = list(plan["pools"]), list(plan["pairs"])
            self._index()
            for f in self.forgets:      # cached slot bases may map a new name to "unresolved"
                f()


class Metrics:
    """One worker's view of the shared counters, and the finish hook that counts into them.
    `board`: the governance gauges' GovBoard (None: no governance series), written by the process
    that computes the figures (`publish`) with at most `key_gauge_limit` keys' series."""

    def __init__(self, layout: Layout, counters, board=None, key_gauge_limit=2000):
        self.L = layout
        self.c = counters
        self.add = counters.add
        self.board = board
        self.key_gauge_limit = key_gauge_limit
        self.figures = None     # the governance figures last written to the board
        self.left_out = 0       # keys past key_gauge_limit at the last warning
        self.worker = -1
        self.site = None
        self.cache = {}         # (ingress, target, lane) -> slot bases (cbusbar.metrics.Bases)
        # The finish hook, in C (cbusbar/metrics.pyx).
        self.hook = Counting(self, counters, _REQ_BOUNDS_NS, _UP_BOUNDS_NS, _OUT_I, _ING_I,
                             layout.gate_i, layout.translations, layout.admission, layout.denied,
                             R.O_SHED, layout.window())
        self.hook.forget(len(layout.pools))
        self.on_finish = self.hook.on_finish
        layout.forgets.append(self.forget)

    def forget(self):
        """Drops the slot bases cached by name (the dict and the hook's last ones)."""
        self.cache.clear()
        self.hook.forget(len(self.L.pools))

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
        self.c.store(L.workers_base + w * L.per_worker, os.getpid())
        figures = self.site.gov_figures
        if figures is not None and figures is not self.figures and self.board is not None:
            self.figures = figures
            self.board.write(governance_text(figures, self.key_gauge_limit, self._left_out))

    def _left_out(self, n_keys):
        """One WARNING each time the number of keys past key_gauge_limit changes."""
        if n_keys != self.left_out:
            self.left_out = n_keys
            log.warning("metrics: %d virtual keys, per-key series for the %d with the most spend "
                        "only (export prometheus key_gauge_limit)", n_keys, self.key_gauge_limit)

    # ------------------------------------------------------------------ hot path
    def _attempts(self, rec, fo):
        """Attempts, failures and failovers of a request that failed over or failed (the rare
        path: a lookup per attempt). A failed attempt is a failover when busbar went on to another
        attempt, or when it was the last one and the request ended with no lane left
        (`exhausted`): the Rust gateway counts one each time it leaves a failed lane."""
        L = self.L
        add = self.add
        target = rec.target
        atts = rec.attempts
        last = len(atts) - 1
        nd = len(DISPOSITIONS)
        for n, a in enumerate(atts):
            k = L.pair_i.get((target, a.lane.name if a.lane is not None else None))
            if k is not None:
                add(L.attempts + k, 1)
            d = _DISP_I.get(a.disposition)
            if d is None:
                continue        # a success, the caller's fault, or not the lane's
            if k is not None:
                add(L.failures + k * nd + d, 1)
            if n < last or rec.outcome == R.O_EXHAUSTED:
                add(fo + _REASON_I[failover_reason(a)], 1)

    def _bases(self, key):
        """Slot bases of one (ingress, target, lane): the requests row, the two histograms, the
        failovers row, the tokens (-1: no pair), the ingress index, the attempts slot (-1: no
        pair), the end-to-end sum and count, and the row in the rolling window's rings.
        cbusbar.metrics caches them per key (`keep`); a reload that adds names empties the cache
        (`Layout.adopt`)."""
        L = self.L
        ingress, target, lane = key
        p = L.pool_i.get(target or UNRESOLVED)
        if p is None:
            p = L.pool_i[UNRESOLVED]
        i = L.ing_i.get(ingress or "none", L.ing_i["none"])
        ip = i * L.P + p
        k = L.pair_i.get((target, lane)) if lane is not None else None
        return (L.requests + ip * len(OUTCOMES) * N_STATUS, L.req_hist + ip * L.rb,
                L.up_hist + p * L.ub, L.failovers + p * len(REASONS),
                -1 if k is None else L.tokens + k * 3, i, -1 if k is None else L.attempts + k,
                L.e2e + ip * 2, ip)

    def keep(self, key, bases):
        if len(self.cache) < CACHE_MAX:
            self.cache[key] = bases

    def dropped(self, sink: str, n: int = 1):
        """A record a sink could not take (busbar_records_dropped_total{sink})."""
        try:
            i = self.L.sinks.index(sink)
        except ValueError:
            return
        self.add(self.L.dropped + i, n)

    def shed(self, gate: str, n: int = 1):
        """A bounded admission refused work because it was full: busbar_admission_denied_total,
        and the Rust gateway's dropped-logs counter of that gate."""
        L = self.L
        self.add(L.admission + GATES.index(gate), n)
        if gate == "webhook":
            self.add(L.webhook_dropped, n)
        elif gate == "request-log-file":
            self.add(L.file_dropped, n)

    def billing_lost(self):
        """A relayed answer whose usage busbar could not read (the request is billed zero)."""
        self.add(self.L.billing_truncated, 1)

    # ------------------------------------------------------------------ reading
    def values(self):
        return self.c.values(0, self.L.ring0)

    def summary(self, v=None) -> dict:
        """Totals the status page needs: requests, failovers and busbar-time buckets summed over
        every label (cumulative; the page's endpoint takes differences over time)."""
        L = self.L
        v = v if v is not None else self.values()
        # Protocol requests only: health checks (ingress "none", the last) would swamp req/s.
        I, P, n = len(INGRESS) - 1, L.P, len(L.pools)
        row = len(OUTCOMES) * N_STATUS
        requests = sum(v[L.requests:L.requests + I * P * row])
        buckets = [0] * (L.rb - 1)
        nb = L.rb - 1
        for i in range(I):
            for p in range(n):      # the names assigned so far, not the spares
                base = L.req_hist + (i * P + p) * L.rb
                for b, x in enumerate(v[base:base + nb]):
                    buckets[b] += x
        failovers = sum(v[L.failovers:L.failovers + P * len(REASONS)])
        return {"requests": requests, "failovers": failovers, "busbar_buckets": buckets}

    def window(self, now_ns: int | None = None, pairs=None):
        """{(ingress index, pool index): (bucket counts, min ns, max ns)} of the rolling window:
        the rings marked for the current third of it and the two before. `pairs`: the (ingress,
        pool) indexes to read (default: every named pool's), so a scrape reads, and so backs with
        memory, only the rows of what was asked."""
        L = self.L
        third = (now_ns if now_ns is not None else time.perf_counter_ns()) // L.third_ns
        live = [r for r in range(RINGS) if third - 2 <= self.c.value(L.markers + r) - 1 <= third]
        if pairs is None:
            pairs = [(i, p) for i in range(len(INGRESS)) for p in range(len(L.pools))]
        out = {}
        nb = E2E_BUCKETS
        for i, p in pairs:
            counts, lo, hi = None, 0, 0
            for r in live:
                start = L.ring0 + r * L.ring_size + (i * L.P + p) * L.row
                row = self.c.values(start, start + L.row)
                if not any(row[:nb]):
                    continue
                if counts is None:
                    counts = row[:nb]
                else:
                    counts = [a + b for a, b in zip(counts, row[:nb])]
                if row[nb] and (not lo or row[nb] < lo):
                    lo = row[nb]
                hi = max(hi, row[nb + 1])
            if counts is not None:
                out[(i, p)] = (counts, lo, hi)
        return out


def quantile(counts, lo_ns, hi_ns, q) -> float:
    """The q-quantile in seconds of the window's buckets (0 when empty, as the Rust gateway's
    exporter answers an empty window): the geometric middle of the bucket holding rank
    q·(n-1), clamped to the window's exact min and max (so q 0 and 1 are exact)."""
    n = sum(counts)
    if not n:
        return 0.0
    if q <= 0:
        return lo_ns / 1e9
    if q >= 1:
        return hi_ns / 1e9
    rank = q * (n - 1)
    cum = 0
    b = 0
    while b < len(counts) - 1:
        cum += counts[b]
        if cum > rank:
            break
        b += 1
    if b == 0:
        est = lo_ns
    else:
        est = 2 ** (E2E_MIN_EXP + (b - 0.5) / E2E_PER_OCTAVE)
    return min(max(est, lo_ns), hi_ns) / 1e9


def _labels(**kw) -> str:
    return "{" + ",".join('%s="%s"' % (k, _esc(v)) for k, v in kw.items()) + "}"


def _esc(v) -> str:
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(x: float) -> str:
    """A sample value as the Rust gateway's exporter writes one (shortest form, no exponent for
    small integers)."""
    if x == int(x) and abs(x) < 1e15:
        return "%d" % x
    return repr(float(x))


def _proc_stats(pid: int):
    """(rss bytes, open fds) of a live process, or None."""
    try:
        with open("/proc/%d/statm" % pid) as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        fds = len(os.listdir("/proc/%d/fd" % pid))
        return rss, fds
    except (OSError, ValueError, IndexError):
        return None


def lane_state(cell, siblings) -> int:
    """busbar_lane_state of one (pool, lane) cell, as the Rust gateway derives it: 2 (open) when
    the lane is benched (its provider refused busbar's key) or this cell cools down and no cell
    of the lane (any pool's, or its direct route's) would admit; 1 (half-open) when this cell
    cools down or probes while the lane still admits somewhere (its own probe included); else 0
    (closed). Reads only: never takes a probe."""
    from busbar.reliability.breaker import HALF_OPEN, S_HARD
    cooling = cell.cooldown_remaining() > 0
    if cooling and cell.slots.value(cell.base + S_HARD):
        return _LANE_STATE_OPEN
    if not cooling:
        return _LANE_STATE_CLOSED
    usable = any(c.state() == HALF_OPEN or c.cooldown_remaining() <= 0 for c in siblings)
    return _LANE_STATE_HALF_OPEN if usable else _LANE_STATE_OPEN


def _cells(site):
    """(pool label, lane name, Lane, Cell, the lane's cells) of every breaker cell of the current
    config, sorted. A direct route's cell is labelled with its model's name as pool, as in every
    other series."""
    rel = site.reliability if site is not None else None
    if rel is None:
        return []
    config = site.snapshot.config
    lanes = site.snapshot.router.lanes
    out = []
    for (pool, name), c in rel.cells.items():
        lane = lanes.get(name)
        if lane is None or (pool and pool not in config.pools):
            continue    # a cell a reload left behind
        out.append((pool or name, name, lane, c, rel.cells_by_lane.get(name, (c,))))
    out.sort(key=lambda t: (t[0], t[1]))
    return out


def render(m: Metrics) -> bytes:
    """Text format 0.0.4 of every series, read from shared memory at this moment."""
    m.publish()
    L = m.L
    v = m.values()
    out = []
    w = out.append
    I, P, O, D, NR = len(INGRESS), L.P, len(OUTCOMES), len(DISPOSITIONS), len(REASONS)
    row = O * N_STATUS

    def head(name, kind, help_):
        w("# HELP %s %s" % (name, help_))
        w("# TYPE %s %s" % (name, kind))

    head("busbar_requests_total", "counter", "Total ingress requests, by ingress protocol, pool "
         "and outcome (from the status answered: ok 2xx, exhausted 503, client_error 4xx, "
         "error otherwise).")
    outcomes = {}
    for i, ing in enumerate(INGRESS):
        for p, pool in enumerate(L.pools):
            base = L.requests + (i * P + p) * row
            cells = v[base:base + row]
            if not any(cells):
                continue
            for s, name in enumerate(STATUS_OUTCOMES):
                x = sum(cells[o * N_STATUS + s] for o in range(O))
                if x:
                    w("busbar_requests_total%s %d" % (_labels(ingress_protocol=ing, pool=pool,
                                                              outcome=name), x))
            for o, name in enumerate(OUTCOMES):
                x = sum(cells[o * N_STATUS:(o + 1) * N_STATUS])
                if x:
                    outcomes[(ing, pool, name)] = x
    head("busbar_request_outcomes_total", "counter", "Requests by ingress protocol, pool and "
         "busbar's own outcome (ok, client_error, upstream_error, exhausted, broken, client_gone, "
         "internal, shed).")
    for (ing, pool, name), x in outcomes.items():
        w("busbar_request_outcomes_total%s %d" % (_labels(ingress_protocol=ing, pool=pool,
                                                          outcome=name), x))

    window = m.window(pairs=[(i, p) for i in range(I) for p in range(len(L.pools))
                             if v[L.e2e + (i * P + p) * 2 + 1]])
    head("busbar_request_duration_seconds", "summary", "End-to-end latency of a request, "
         "failover hops included; quantiles over the last buffer_seconds.")
    for i, ing in enumerate(INGRESS):
        for p, pool in enumerate(L.pools):
            base = L.e2e + (i * P + p) * 2
            count = v[base + 1]
            if not count:
                continue
            lab = _labels(ingress_protocol=ing, pool=pool)
            counts, lo, hi = window.get((i, p), (None, 0, 0))
            for q, text in QUANTILES:
                x = quantile(counts, lo, hi, q) if counts is not None else 0.0
                w('busbar_request_duration_seconds{%s,quantile="%s"} %s' % (lab[1:-1], text,
                                                                             _num(x)))
            w("busbar_request_duration_seconds_sum%s %s" % (lab, _num(v[base] / 1e9)))
            w("busbar_request_duration_seconds_count%s %d" % (lab, count))

    def hist(name, help_, labels_iter, bounds):
        head(name, "histogram", help_)
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

    hist("busbar_own_duration_seconds",
         "busbar's own time per request (total minus upstream time), as in Server-Timing.",
         ((_labels(ingress_protocol=ing, pool=pool), L.req_hist + (i * P + p) * L.rb)
          for i, ing in enumerate(INGRESS) for p, pool in enumerate(L.pools)), REQUEST_BUCKETS_S)
    hist("busbar_upstream_duration_seconds", "Upstream time per request (all its attempts).",
         ((_labels(pool=pool), L.up_hist + p * L.ub) for p, pool in enumerate(L.pools)),
         UPSTREAM_BUCKETS_S)

    head("busbar_upstream_attempts_total", "counter", "Upstream call attempts, by pool and lane "
         "(each failover hop counted).")
    for k, (pool, lane) in enumerate(L.pairs):
        x = v[L.attempts + k]
        if x:
            w("busbar_upstream_attempts_total%s %d" % (_labels(pool=pool, lane=lane), x))
    head("busbar_upstream_failures_total", "counter", "Upstream failures, by pool, lane and "
         "disposition (transient_upstream, attempt_timeout, hard_down, context_length).")
    for k, (pool, lane) in enumerate(L.pairs):
        for d, disp in enumerate(DISPOSITIONS):
            x = v[L.failures + k * D + d]
            if x:
                w("busbar_upstream_failures_total%s %d" % (
                    _labels(pool=pool, lane=lane, disposition=disp), x))
    head("busbar_failovers_total", "counter", "Failover events (a failed lane left for the next), "
         "by pool and reason.")
    for p, pool in enumerate(L.pools):
        for d, reason in enumerate(REASONS):
            x = v[L.failovers + p * NR + d]
            if x:
                w("busbar_failovers_total%s %d" % (_labels(pool=pool, reason=reason), x))

    cells = _cells(m.site)
    head("busbar_breaker_trips_total", "counter", "Circuit-breaker trips (closed to open; a "
         "failed probe's reopening is not one), by pool and lane.")
    from busbar.reliability.breaker import S_TRIPS
    for pool, lane, _, c, _ in cells:
        w("busbar_breaker_trips_total%s %d" % (_labels(pool=pool, lane=lane),
                                               c.slots.value(c.base + S_TRIPS)))
    _lane_gauges(w, head, cells, m.site)

    head("busbar_translations_total", "counter", "Cross-protocol translation hops, by protocols.")
    for i, a in enumerate(INGRESS):
        for j, b in enumerate(INGRESS):
            x = v[L.translations + i * I + j]
            if x:
                w("busbar_translations_total%s %d" % (_labels(**{"from": a, "to": b}), x))
    head("busbar_tokens_total", "counter", "Tokens reported by the upstream, by pool, model and "
         "kind.")
    for k, (pool, lane) in enumerate(L.pairs):
        for t, kind in enumerate(TOKEN_KINDS):
            x = v[L.tokens + k * 3 + t]
            if x:
                w("busbar_tokens_total%s %d" % (_labels(pool=pool, model=lane, kind=kind), x))
    head("busbar_admission_denied_total", "counter", "Work a full admission gate refused, by gate "
         "(inbound: the inbound concurrency cap; webhook, request-log-file: a request-log sink).")
    for g, gate in enumerate(GATES):
        w("busbar_admission_denied_total%s %d" % (_labels(gate=gate), v[L.admission + g]))
    head("busbar_governance_denied_total", "counter", "Requests governance refused before any "
         "upstream, by gate.")
    for g, gate in enumerate(GOVERNANCE_GATES):
        w("busbar_governance_denied_total%s %d" % (_labels(gate=gate), v[L.denied + g]))
    for name, slot, help_ in (
            ("busbar_billing_truncated_total", L.billing_truncated,
             "Same-protocol streamed answers relayed to the client unchanged whose usage busbar "
             "could not read, so the request was billed zero."),
            ("busbar_webhook_logs_dropped_total", L.webhook_dropped,
             "Request-log webhook deliveries shed because the sink's deliveries in flight were "
             "at their cap."),
            ("busbar_file_logs_dropped_total", L.file_dropped,
             "Request-log file lines shed because the sink's unwritten lines were at their cap.")):
        head(name, "counter", help_)
        w("%s %d" % (name, v[slot]))
    head("busbar_records_dropped_total", "counter", "Records a sink dropped (full, or failed to "
         "deliver), by sink.")
    for s, sink in enumerate(L.sinks):
        w("busbar_records_dropped_total%s %d" % (_labels(sink=sink), v[L.dropped + s]))
    if m.board is not None:
        text = m.board.read()
        if text:
            out.append(text.rstrip("\n"))

    rss = fds = live = 0
    for wk in range(min(v[L.worker_claim], L.workers)):
        pid = v[L.workers_base + wk * L.per_worker]
        st = _proc_stats(pid) if pid else None
        if st is None:
            continue
        live += 1
        rss += st[0]
        fds += st[1]
    head("busbar_workers", "gauge", "Live worker processes.")
    w("busbar_workers %d" % live)
    head("busbar_process_resident_memory_bytes", "gauge", "Resident memory of all worker processes.")
    w("busbar_process_resident_memory_bytes %d" % rss)
    head("busbar_process_open_fds", "gauge", "Open file descriptors of all worker processes.")
    w("busbar_process_open_fds %d" % fds)
    head("busbar_process_uptime_seconds", "gauge", "Seconds since the gateway started.")
    boot = v[L.boot_time]
    w("busbar_process_uptime_seconds %d" % (max(0, int(time.time()) - boot) if boot else 0))
    return ("\n".join(out) + "\n").encode()


def _lane_gauges(w, head, cells, site):
    """The per-(pool, lane) gauges, read from the breaker cells and lane blocks (gateway-wide)."""
    from busbar.reliability.stats import availability
    rows = []
    for pool, name, lane, c, siblings in cells:
        avail, hint = availability(lane, c)
        rows.append((_labels(pool=pool, lane=name), lane, c, siblings, avail, hint))
    head("busbar_lane_state", "gauge", "Per-(pool,lane) circuit-breaker health: 0 closed, "
         "1 half-open (cooling, the lane still admits), 2 open (tripped).")
    for lab, _, c, siblings, _, _ in rows:
        w("busbar_lane_state%s %d" % (lab, lane_state(c, siblings)))
    head("busbar_lane_available", "gauge", "Per-(pool,lane) availability: 1 the lane would admit a "
         "request now, 0 unavailable for any reason (breaker, capacity, budget, probe in flight).")
    for lab, _, _, _, avail, _ in rows:
        w("busbar_lane_available%s %d" % (lab, 1 if avail == "available" else 0))
    head("busbar_lane_recovery_hint_ms", "gauge", "Per-(pool,lane) least milliseconds until an "
         "unavailable lane could serve; 0 when available or nothing but an operator recovers it.")
    for lab, _, _, _, _, hint in rows:
        w("busbar_lane_recovery_hint_ms%s %d" % (lab, hint or 0))
    head("busbar_lane_inflight", "gauge", "Per-(pool,lane) requests in flight on the lane, over all "
         "workers.")
    for lab, _, c, _, _, _ in rows:
        w("busbar_lane_inflight%s %d" % (lab, c.budget.inflight()))
    head("busbar_lane_available_permits", "gauge", "Per-(pool,lane) free concurrency permits of a "
         "bounded lane (unbounded lanes have no sample).")
    for lab, lane, c, _, _, _ in rows:
        if lane.limit is not None:
            w("busbar_lane_available_permits%s %d" % (lab, max(0, lane.limit - c.budget.inflight())))
    # reliability: requests waiting for a lane permit (on_exhausted: queue), from the shared pool
    # blocks every worker updates (busbar/reliability/queue.py); 0 for a pool that does not queue.
    rel = site.reliability if site is not None else None
    queued = rel.queued_by_pool() if rel is not None else {}
    head("busbar_pool_queued", "gauge", "Per-pool requests waiting for a lane permit "
         "(on_exhausted: queue), over all workers.")
    pools = site.snapshot.config.pools if site is not None else {}
    for pool in sorted(pools):
        w("busbar_pool_queued%s %d" % (_labels(pool=pool), queued.get(pool, 0)))


# ---------------------------------------------------------------------------- governance gauges
# A label of a key's own (its mint-time `labels`) is echoed onto its series when it is a valid
# Prometheus label name that none of the series' own labels takes.
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_RESERVED = frozenset(("key", "bucket", "group", "window", "model", "tier"))
TIERS = ("input", "output", "cache_read", "cache_write")


def _mint_labels(labels) -> dict:
    return {k: v for k, v in sorted((labels or {}).items())
            if isinstance(k, str) and _LABEL_NAME.match(k) and not k.startswith("__")
            and k not in _RESERVED and isinstance(v, (str, int, float))}


def governance_text(figures, key_gauge_limit: int, warn=None) -> str:
    """The governance gauges' text from busbar.governance.figures' Figures: per key (the
    `key_gauge_limit` highest-spend keys; `warn(n_keys)` when more were left out) its all-time
    spend, tokens and per-(model, tier) tokens; per (group, window) enforcement bucket its spend,
    budget left and per-(model, tier) tokens in the current window."""
    out = []
    w = out.append
    keys = sorted(figures.keys, key=lambda k: (-k.spend_cents, k.id))
    if len(keys) > key_gauge_limit:
        if warn is not None:
            warn(len(keys))
        keys = keys[:key_gauge_limit]
    w("# HELP busbar_key_spend_cents Per-virtual-key derived spend (cents of the rate card's "
      "unit, all time), from the stored tokens and the current rate_card.")
    w("# TYPE busbar_key_spend_cents gauge")
    for k in keys:
        w("busbar_key_spend_cents%s %d" % (_labels(key=k.id, **_mint_labels(k.labels)),
                                           k.spend_cents))
    w("# HELP busbar_key_tokens_total Per-virtual-key tokens consumed (all time, every tier).")
    w("# TYPE busbar_key_tokens_total gauge")
    for k in keys:
        w("busbar_key_tokens_total%s %d" % (_labels(key=k.id, **_mint_labels(k.labels)), k.tokens))
    w("# HELP busbar_bucket_tokens Per-(bucket, model, tier) tokens in the bucket's current "
      "window (a key's bucket: all time).")
    w("# TYPE busbar_bucket_tokens gauge")
    for k in keys:
        mint = _mint_labels(k.labels)
        for model, tiers in sorted(k.models.items()):
            for tier, x in zip(TIERS, tiers):
                w("busbar_bucket_tokens%s %d" % (_labels(bucket=k.id, **mint, model=model,
                                                         tier=tier), x))
    for b in figures.buckets:
        for model, tiers in sorted(b.models.items()):
            for tier, x in zip(TIERS, tiers):
                w("busbar_bucket_tokens%s %d" % (_labels(bucket=b.id, group=b.group,
                                                         window=b.window, model=model, tier=tier),
                                                 x))
    w("# HELP busbar_bucket_spend_cents Derived spend (cents) per (group, window) enforcement "
      "bucket in its current window.")
    w("# TYPE busbar_bucket_spend_cents gauge")
    for b in figures.buckets:
        if b.spend_cents is not None:
            w("busbar_bucket_spend_cents%s %d" % (_labels(bucket=b.id, group=b.group,
                                                          window=b.window), b.spend_cents))
    w("# HELP busbar_bucket_budget_remaining_cents Budget cap minus derived spend (cents) of a "
      "bucket with a budget limit.")
    w("# TYPE busbar_bucket_budget_remaining_cents gauge")
    for b in figures.buckets:
        if b.remaining_cents is not None:
            w("busbar_bucket_budget_remaining_cents%s %d" % (
                _labels(bucket=b.id, group=b.group, window=b.window), b.remaining_cents))
    return "\n".join(out) + "\n"


class GovBoard:
    """The governance gauges' text, written by the parent (which owns the store) and read by
    whichever worker answers a scrape: an anonymous MAP_SHARED mapping made before the fork, two
    halves written in turn, and a header: the generation (its parity names the live half), then
    each half's length. A write fills the other half and its length, then stores the generation
    (one aligned 8-byte store); a reader copies the live half and checks the generation did not
    move meanwhile (a write every few seconds, a copy in microseconds: a retry is rare). Pages
    are backed only as far as the text reaches."""

    WORD = struct.Struct("<q")
    HEAD = 3 * WORD.size                # generation, length of half 0, length of half 1

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.mm = mmap.mmap(-1, self.HEAD + 2 * capacity, mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
        self.truncated = False

    def write(self, text: str):
        data = text.encode()
        if len(data) > self.capacity:
            cut = data.rfind(b"\n", 0, self.capacity)
            data = data[:cut + 1] if cut >= 0 else b""
            if not self.truncated:
                log.warning("metrics: the governance series exceed the board's %d bytes; the "
                            "rest is left out (lower key_gauge_limit)", self.capacity)
            self.truncated = True
        gen = self.WORD.unpack_from(self.mm, 0)[0] + 1
        half = gen % 2
        start = self.HEAD + half * self.capacity
        self.mm[start:start + len(data)] = data
        self.WORD.pack_into(self.mm, (1 + half) * self.WORD.size, len(data))
        self.WORD.pack_into(self.mm, 0, gen)

    def read(self) -> str:
        for _ in range(8):
            gen = self.WORD.unpack_from(self.mm, 0)[0]
            if not gen:
                return ""
            half = gen % 2
            n = self.WORD.unpack_from(self.mm, (1 + half) * self.WORD.size)[0]
            start = self.HEAD + half * self.capacity
            data = self.mm[start:start + n]
            if self.WORD.unpack_from(self.mm, 0)[0] == gen:
                return data.decode()
        return ""


# The board's size per half: 2000 keys (key_gauge_limit's default) with a few models each are
# ~2-3 MiB of text; 16 MiB leaves room for a larger limit, and costs nothing until written.
BOARD_BYTES = 16 * 1024 * 1024
