"""Where busbar's p99.9 comes from: a per-request trace of the slow requests.

    .venv/bin/python bench/tail.py [--n 10000] [--conns 1,32] [--only KEY[,KEY]] [--warm 1000]
                                   [--gap-ms 0] [--probe-ms 1] [--stall-us 1000] [--no-pin]
                                   [--no-trace] [--top 20]

The built-in mock (`busbar.cli mock --require-auth`) and busbar (`busbar.cli serve --workers 1`,
bench/run.py's six lanes, Server-Timing on, access log and metrics off, the admin listener on a
free port) run as separate processes; busbar is pinned to core 0, the mock and this script (the
load) to core 1 (`--no-pin`: nothing pinned). busbar starts with a `sitecustomize.py` on its
PYTHONPATH (written into the results folder) that, inside busbar, without changing busbar's code,
wraps at import: `HttpConnection.data_received` and `UpstreamConnection.data_received` (a stamp at
entry), `Exchange.start`, `Exchange._timing` (the same Server-Timing value, computed from the same
clock reading it records) and `Exchange.finish`; registers a `gc.callbacks` entry; serves on a
`uvloop.Loop` subclass whose `call_later` times every timer callback it runs (the deadline wheel's
`Deadlines._sweep`, the pool's `UpstreamPool._reap`, the idle trim's `tick`, metrics' publish, ...);
and runs a probe timer every --probe-ms that records how late it fired (0: no probe). Everything
goes into preallocated `array('q')`s (no Python object kept per request, so the tracer adds nothing
to the collector's work); SIGUSR1 writes what was recorded since the last SIGUSR1 to a file and
starts over. The load is in this script: asyncio on uvloop, raw HTTP/1.1 keep-alive connections,
each request's body unique (a counter in the last user message, as bench/load.lua does), one
request at a time per connection (--gap-ms: a pause between a response and the next request on
the connection, to let busbar go idle as run.py's concurrency-1 phase does).

For each case (small Anthropic → Anthropic, ~8 tokens: `anthropic-anthropic-100`; Anthropic →
OpenAI, ~1k tokens: `anthropic-openai-4096`) and each --conns value: --warm requests (not
recorded), SIGUSR1, --n requests, SIGUSR1; then this script joins the trace and prints:

- p50 / p99 / p99.9 of busbar;dur as the client read it (the `Server-Timing` header) and as
  recorded inside (the two must hold the same values: `matched` counts the requests whose recorded
  value is the header's, to the µs the header shows);
- the slowest 0.1 % (at least --top, default 20) requests, one row each;
- for the requests above 3× p50 (the issue's bound), the share showing each attribute, and the
  share showing none.

busbar;dur is busbar's own time in two pieces on one thread: seg1 from the parse of the request
(t0, the read that brought it) to its send upstream (t_send), seg2 from the upstream's answer
(t_send + rtt) to the Server-Timing header being written. Nothing else can run on the loop inside
either piece, so a timer callback or another request can only overlap one if the stamps are not
what they seem; GC and preemption can.

Columns of the slow-request table (times in µs; "segs" = seg1 + seg2):
  dur       busbar;dur as recorded (= the header's)
  seg1/seg2 its two pieces (see above)
  offcpu    wall time minus the thread's CPU time (CLOCK_THREAD_CPUTIME_ID) over both pieces,
            measured from the entry of the data_received that started each piece: time the thread
            was not running (preempted, or waiting in the kernel)
  rdelay    run-queue wait over both pieces (/proc/thread-self/schedstat, 2nd field): time the
            thread was runnable but another task had the core
  ivcsw     involuntary context switches over both pieces (getrusage(RUSAGE_THREAD).ru_nivcsw)
  minflt    minor page faults over both pieces (ru_minflt: first touches of new heap/arena pages)
  gc        collections that ran inside the pieces: "g<generation>:<µs>", comma separated
  timers    timer callbacks that ran inside the pieces (name:µs) (expected: none)
  lag       the largest lateness of the loop probe whose wait overlapped the pieces
  infl      site.inflight when the request started / when it finished (itself included at the end)
  others    how many other requests' pieces overlapped this one's (expected: 0)
  conn      1 when the pool had no idle upstream connection: the connect is inside seg1 (t_send is
            stamped when the connection is handed over, busbar/engine/exchange.py _on_conn)
  rqbefore  run-queue wait just before each piece started (since the stamp before it, ≤ ~1 ms
            with the probe on): another task had core 0 right before, so busbar ran cold

Attributes in the summary (each a share of the requests above 3× p50): gc (any generation, and
per generation), wheel sweep (`Deadlines._sweep` ran inside), other timer, loop stall (probe lag
> --stall-us), ivcsw ≥ 1, inflight > 1 (at start or at finish: other requests waiting on the
upstream at the same time; not queueing in itself, see "others"), others > 0, minflt ≥ 1,
offcpu ≥ half of (dur - p50), connect, rq_before > 0; "none" = none of gc, sweep, other timer,
stall, ivcsw, inflight > 1, connect; "unexplained" = none of gc, timers, stall, ivcsw, minflt,
offcpu, others, connect, rq_before. Per phase it also prints each GC generation's collections and
their durations, each timer callback's runs, the probe's lateness (the late probes' waits split into
busbar's own CPU, its run-queue wait and the rest) and core 0's /proc/stat ticks and interrupts over
the phase beside busbar's own CPU ticks (the difference: other processes on busbar's core).

Everything (the percentiles, every slow request, the summary, every request's record and the
client's values, the GC, timer and probe events) is written as JSON to
bench/results/tail-<UTC timestamp>/tail.json, with busbar's and the mock's logs. --no-trace runs
busbar without the sitecustomize (client-side figures only: what the tracing itself costs).
"""
from __future__ import annotations

import argparse
import asyncio
import bisect
import datetime
import heapq
import json
import math
import os
import pathlib
import pickle
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from array import array

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

try:
    import uvloop

    import inproc  # noqa: E402
    import payloads  # noqa: E402
    import procs  # noqa: E402
    import run as benchrun  # noqa: E402
except ImportError as _e:
    sys.exit("tail: %s; run it with busbar's venv: .venv/bin/python bench/tail.py" % (_e,))

PY = sys.executable
CASES = {
    "anthropic-anthropic-100": ("Anthropic → Anthropic, ~8 tok", "anthropic", "ant-model", 100),
    "anthropic-openai-4096": ("Anthropic → OpenAI, ~1k tok", "anthropic", "oai-model", 4096),
}

# The fields of one request's record inside busbar (array('q'), F per request).
FIELDS = ("t0", "t_dr", "cpu_dr", "t_sent", "cpu_sent", "t_send", "rtt", "t_up", "cpu_up",
          "t_ans", "cpu_ans", "dur", "infl_start", "infl_end", "t_fin",
          "iv_a", "iv_b", "iv_c", "iv_d", "mf_a", "mf_b", "mf_c", "mf_d",
          "rd_a", "rd_b", "rd_c", "rd_d", "connect")

TRACE = r'''
# Written by bench/tail.py: per-request tracing inside busbar (see its docstring).
import os
_OUT = os.environ.get("BENCH_TAIL_DIR")
if _OUT:
    import gc, sys, time, signal, resource, pickle
    from array import array
    from importlib.abc import MetaPathFinder
    from importlib.machinery import PathFinder

    FIELDS = %(fields)r
    F = len(FIELDS)
    IX = {n: i for i, n in enumerate(FIELDS)}
    CAP = int(os.environ.get("BENCH_TAIL_CAP", "65536"))
    PROBE_NS = int(float(os.environ.get("BENCH_TAIL_PROBE_MS", "1")) * 1e6)
    perf = time.perf_counter_ns
    cpu = time.thread_time_ns
    _rusage = resource.getrusage
    _THREAD = resource.RUSAGE_THREAD
    _pread = os.pread
    _sched = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def _rdelay():
        s = _pread(_sched, 64, 0)
        return int(s[s.index(b" ") + 1:s.rindex(b" ")])

    class _State:
        pass
    S = _State()

    def _reset():
        S.req = array("q", bytes(8 * F * CAP))
        S.n = 0
        S.gc = array("q", bytes(8 * 4 * 8192))
        S.ngc = 0
        S.tm = array("q", bytes(8 * 3 * 65536))
        S.ntm = 0
        S.pr = array("q", bytes(8 * 4 * 262144))
        S.npr = 0
        S.idx = {}
        S.overflow = 0
    _reset()
    S.names = []
    S.name_ids = {}
    S.seq = 0
    # the latest data_received entries (client side, upstream side): wall, CPU, rusage, run delay
    S.dr = (0, 0, 0, 0, 0)
    S.up = (0, 0, 0, 0, 0)
    S.gc_t = 0

    def _stamp():
        r = _rusage(_THREAD)
        return (perf(), cpu(), r.ru_nivcsw, r.ru_minflt, _rdelay())

    def _gc_cb(phase, info):
        if phase == "start":
            S.gc_t = perf()
            return
        i = S.ngc
        if i < 8192:
            g = S.gc
            b = 4 * i
            g[b] = S.gc_t
            g[b + 1] = perf()
            g[b + 2] = info["generation"]
            g[b + 3] = info["collected"]
            S.ngc = i + 1
    gc.callbacks.append(_gc_cb)

    def _name_id(cb):
        name = getattr(cb, "__qualname__", None) or type(cb).__name__
        mod = getattr(cb, "__module__", None)
        if mod:
            name = mod + ":" + name
        i = S.name_ids.get(name)
        if i is None:
            i = S.name_ids[name] = len(S.names)
            S.names.append(name)
        return i

    def _timed(cb):
        nid = _name_id(cb)

        def run(*a):
            t = perf()
            try:
                return cb(*a)
            finally:
                i = S.ntm
                if i < 65536:
                    m = S.tm
                    b = 3 * i
                    m[b] = t
                    m[b + 1] = perf()
                    m[b + 2] = nid
                    S.ntm = i + 1
        return run

    def _dump(signum=None, frame=None):
        n = S.n
        doc = {"fields": FIELDS, "n": n, "req": S.req[:F * n].tobytes(),
               "gc": S.gc[:4 * S.ngc].tobytes(), "tm": S.tm[:3 * S.ntm].tobytes(),
               "pr": S.pr[:4 * S.npr].tobytes(), "names": list(S.names),
               "overflow": S.overflow, "pid": os.getpid(), "probe_ns": PROBE_NS,
               "gc_stats": gc.get_stats(), "gc_count": gc.get_count(),
               "gc_threshold": gc.get_threshold(), "gc_freeze": gc.get_freeze_count(),
               "pending": len(S.idx)}
        S.seq += 1
        path = os.path.join(_OUT, "trace-%%d.pkl" %% S.seq)
        with open(path + ".tmp", "wb") as f:
            pickle.dump(doc, f)
        os.rename(path + ".tmp", path)
        _reset()
    signal.signal(signal.SIGUSR1, _dump)

    def _patch(gwmod):
        import uvloop
        from busbar.engine.exchange import Exchange
        from busbar.server.http import HttpConnection
        from busbar.upstream.pool import UpstreamConnection

        base_call_later = uvloop.Loop.call_later

        class TracedLoop(uvloop.Loop):
            def call_later(self, delay, callback, *args, context=None):
                return base_call_later(self, delay, _timed(callback), *args, context=context)

        def install():
            loop = TracedLoop()
            if PROBE_NS > 0:
                secs = PROBE_NS / 1e9
                due = [0]

                def probe():
                    t = perf()
                    i = S.npr
                    if i < 262144:
                        p = S.pr
                        b = 4 * i
                        p[b] = t
                        p[b + 1] = t - due[0]
                        p[b + 2] = cpu()
                        p[b + 3] = _rdelay()
                        S.npr = i + 1
                    due[0] = perf() + PROBE_NS
                    base_call_later(loop, secs, probe)
                due[0] = perf() + PROBE_NS
                base_call_later(loop, secs, probe)
            return loop
        gwmod._install_uvloop = install

        # Traced subclasses, put where the gateway makes its connections and exchanges: busbar's
        # hot classes are compiled (immutable types), so their methods cannot be patched in place;
        # a Python subclass's overrides are called even from the compiled code (cpdef).
        class TracedConnection(HttpConnection):
            def data_received(self, data):
                S.dr = _stamp()
                return HttpConnection.data_received(self, data)
        gwmod.HttpConnection = TracedConnection

        class TracedUpstream(UpstreamConnection):
            def data_received(self, data):
                S.up = _stamp()
                return UpstreamConnection.data_received(self, data)

        base_pool = gwmod.UpstreamPool

        class TracedPool(base_pool):
            def __init__(self, *a, **kw):
                base_pool.__init__(self, *a, **kw)
                self.connection_class = TracedUpstream
        gwmod.UpstreamPool = TracedPool

        start_orig = Exchange.start
        I_T0, I_TDR, I_CDR, I_TS, I_CS = IX["t0"], IX["t_dr"], IX["cpu_dr"], IX["t_sent"], IX["cpu_sent"]
        I_IS, I_IVA, I_IVB, I_MFA, I_MFB = IX["infl_start"], IX["iv_a"], IX["iv_b"], IX["mf_a"], IX["mf_b"]
        I_RDA, I_RDB, I_CONN = IX["rd_a"], IX["rd_b"], IX["connect"]

        def start(self):
            i = S.n
            if i >= CAP:
                S.overflow += 1
                return start_orig(self)
            S.n = i + 1
            S.idx[id(self)] = i
            r = S.req
            b = F * i
            d = S.dr
            r[b + I_T0] = self.req.t0
            r[b + I_TDR] = d[0]
            r[b + I_CDR] = d[1]
            r[b + I_IVA] = d[2]
            r[b + I_MFA] = d[3]
            r[b + I_RDA] = d[4]
            r[b + I_IS] = self.site.inflight
            try:
                return start_orig(self)
            finally:
                s = _stamp()
                r[b + I_TS] = s[0]
                r[b + I_CS] = s[1]
                r[b + I_IVB] = s[2]
                r[b + I_MFB] = s[3]
                r[b + I_RDB] = s[4]
                # no upstream connection handed over by the time start returns: the pool had no
                # idle one and is connecting (the connect is inside seg1, t0 .. t_send)
                r[b + I_CONN] = 1 if self.upconn is None and self.att is not None else 0

        I_TSEND, I_RTT, I_TUP, I_CUP, I_TANS, I_CANS, I_DUR = (
            IX["t_send"], IX["rtt"], IX["t_up"], IX["cpu_up"], IX["t_ans"], IX["cpu_ans"], IX["dur"])
        I_IVC, I_IVD, I_MFC, I_MFD, I_RDC, I_RDD = (
            IX["iv_c"], IX["iv_d"], IX["mf_c"], IX["mf_d"], IX["rd_c"], IX["rd_d"])

        def _timing(self):
            # Exchange._timing's own computation, on the clock reading that is recorded.
            if not self.snap.server_timing:
                return b""
            t = perf()
            dur = t - self.req.t0 - self.rtt
            if dur < 0:
                dur = 0
            i = S.idx.get(id(self))
            if i is not None:
                c = cpu()
                r = S.req
                b = F * i
                r[b + I_TANS] = t
                r[b + I_CANS] = c
                r[b + I_DUR] = dur
                try:
                    r[b + I_TSEND] = self.t_send
                except AttributeError:      # answered without an upstream (health, errors)
                    r[b + I_TSEND] = 0
                r[b + I_RTT] = self.rtt
                u = S.up
                r[b + I_TUP] = u[0]
                r[b + I_CUP] = u[1]
                r[b + I_IVC] = u[2]
                r[b + I_MFC] = u[3]
                r[b + I_RDC] = u[4]
                ru = _rusage(_THREAD)
                r[b + I_IVD] = ru.ru_nivcsw
                r[b + I_MFD] = ru.ru_minflt
                r[b + I_RDD] = _rdelay()
            return b"Server-Timing: busbar;dur=%%.3f\r\n" %% (dur / 1e6)

        finish_orig = Exchange.finish
        I_IE, I_TF = IX["infl_end"], IX["t_fin"]

        def finish(self, outcome, keep_alive=True):
            i = S.idx.pop(id(self), None) if not self.closed else None
            if i is not None:
                S.req[F * i + I_IE] = self.site.inflight
            try:
                return finish_orig(self, outcome, keep_alive)
            finally:
                if i is not None:
                    S.req[F * i + I_TF] = perf()

        class TracedExchange(Exchange):
            pass
        TracedExchange.start = start
        TracedExchange._timing = _timing
        TracedExchange.finish = finish

        def new_exchange(site, conn, req, route):      # what the Gateway binds as new_exchange
            return TracedExchange(site, conn, req, route, site.snapshot)
        gwmod.new_exchange = new_exchange

    class _Hook(MetaPathFinder):
        # Patched once busbar.supervisor (which imports the gateway module first) has loaded: the
        # uvloop factory is the supervisor's, the connection and pool classes the gateway's.
        def find_spec(self, name, path=None, target=None):
            if name != "busbar.supervisor":
                return None
            spec = PathFinder.find_spec(name, path)
            if spec is None:
                return None
            loader = spec.loader
            orig = loader.exec_module

            def exec_module(module):
                orig(module)
                gwmod = sys.modules["busbar.server.gateway"]
                _patch(gwmod)
                module._install_uvloop = gwmod._install_uvloop
            loader.exec_module = exec_module
            sys.meta_path.remove(self)
            return spec
    sys.meta_path.insert(0, _Hook())
''' % {"fields": FIELDS}


def log(msg):
    print("[tail %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


pct = benchrun.pct     # nearest-rank percentile of an ascending list


# --------------------------------------------------------------------------------------- the load

class Client(inproc.Client):
    """One keep-alive connection, one request at a time (bench/inproc.py's client); keeps each
    answer's busbar;dur (µs) and its latency (µs, from the write to the whole response)."""

    def __init__(self, prefix, head, tail, n, tag, gap, out):
        self.prefix, self.head, self.tail = prefix, head, tail
        self.n, self.tag, self.gap, self.out = n, tag, gap, out
        self.sent = 0
        self.buf = b""
        self.t = 0
        self.loop = asyncio.get_event_loop()
        self.done = self.loop.create_future()

    def connection_made(self, transport):
        self.transport = transport
        if self.n:
            self.send()
        else:
            self.done.set_result(None)

    def send(self):
        self.t = time.perf_counter_ns()
        super().send()

    def answered(self, head):
        lat = (time.perf_counter_ns() - self.t) / 1000
        t = re.search(rb"busbar;dur=([0-9.]+)", head)
        self.out.append((float(t.group(1)) * 1000 if t else -1.0, lat))

    def next(self):
        if self.gap:
            self.loop.call_later(self.gap, self.send)
        else:
            self.send()


async def load(port, case, conns, n, gap, tag):
    _, proto, model, size = CASES[case]
    template = payloads.body(proto, model, size)
    head, tail = template.split(payloads.MARK.encode())
    hb = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in payloads.headers(proto).items())
    prefix = b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n%sContent-Length: " % (
        payloads.path(proto, model).encode(), port, hb)
    loop = asyncio.get_running_loop()
    out = []
    clients = []
    for c in range(conns):
        k = n // conns + (1 if c < n % conns else 0)
        _, cl = await loop.create_connection(
            lambda k=k, c=c: Client(prefix, head, tail, k, tag * 1000 + c, gap, out),
            "127.0.0.1", port)
        clients.append(cl)
    t0 = time.perf_counter()
    await asyncio.gather(*(cl.done for cl in clients))
    wall = time.perf_counter() - t0
    for cl in clients:
        cl.transport.close()
    return out, wall


# --------------------------------------------------------------------------------------- the trace

def core_counters(core=0):
    """cpu<core>'s /proc/stat fields (clock ticks) and its interrupt count (/proc/interrupts)."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu%d " % core):
                v = [int(x) for x in line.split()[1:]]
                out.update(zip(("user", "nice", "system", "idle", "iowait", "irq", "softirq",
                                "steal"), v))
    irq = 0
    with open("/proc/interrupts") as f:
        cpus = f.readline().split()
        col = cpus.index("CPU%d" % core) if "CPU%d" % core in cpus else None
        for line in f:
            parts = line.split()
            if col is not None and len(parts) > col + 1 and parts[col + 1].isdigit():
                irq += int(parts[col + 1])
    out["interrupts"] = irq
    return out


def request_dump(pid, trace_dir, seq, timeout=10.0):
    """SIGUSR1 to busbar; the trace it writes (its `seq`-th)."""
    os.kill(pid, signal.SIGUSR1)
    path = trace_dir / ("trace-%d.pkl" % seq)
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit("tail: busbar wrote no %s within %.0f s" % (path.name, timeout))
        time.sleep(0.02)
    with open(path, "rb") as f:
        return pickle.load(f)


def _arr(b):
    a = array("q")
    a.frombytes(b)
    return a


def analyse(doc, client, stall_us, top):
    """Joins the requests with the GC, timer and probe events; the figures and the slow rows."""
    F = len(doc["fields"])
    ix = {n: i for i, n in enumerate(doc["fields"])}
    raw = _arr(doc["req"])
    reqs = [dict(zip(doc["fields"], raw[F * i:F * (i + 1)])) for i in range(doc["n"])]
    g = _arr(doc["gc"])
    gcs = sorted((g[4 * i], g[4 * i + 1], g[4 * i + 2], g[4 * i + 3]) for i in range(len(g) // 4))
    m = _arr(doc["tm"])
    tms = sorted((m[3 * i], m[3 * i + 1], doc["names"][m[3 * i + 2]]) for i in range(len(m) // 3))
    p = _arr(doc["pr"])
    # a probe's wait: from when it was due to when it ran, with its lateness
    probes = sorted((p[4 * i] - p[4 * i + 1], p[4 * i], p[4 * i + 1]) for i in range(len(p) // 4))
    # each late probe's wait, split: busbar's own CPU time and its run-queue wait since the
    # previous probe; the rest was neither (the vCPU not running: the hypervisor)
    stalls = {"count": 0, "late_us": 0.0, "own_cpu_us": 0.0, "runqueue_us": 0.0, "rest_us": 0.0}
    for i in range(1, len(p) // 4):
        late = p[4 * i + 1]
        if late > stall_us * 1000:
            wall = p[4 * i] - p[4 * i - 4]
            own = p[4 * i + 2] - p[4 * i - 2]
            rq = p[4 * i + 3] - p[4 * i - 1]
            stalls["count"] += 1
            stalls["late_us"] += late / 1000
            stalls["own_cpu_us"] += own / 1000
            stalls["runqueue_us"] += rq / 1000
            stalls["rest_us"] += max(0, wall - own - rq - doc["probe_ns"]) / 1000
    del ix

    def inside(events, a, b):
        """Events (start, end, ...) sorted by start that intersect [a, b]."""
        out = []
        # an event starting before a that ends after a: at most a few, look back a little
        j = bisect.bisect_left(events, (a,))
        k = j - 1
        while k >= 0 and j - k <= 64:
            if events[k][1] >= a:
                out.append(events[k])
            k -= 1
        while j < len(events) and events[j][0] <= b:
            out.append(events[j])
            j += 1
        return out

    # a timeline of (time, run-queue wait so far) from every stamp: the probes' and the requests'
    tl_rd = sorted([(p[4 * i], p[4 * i + 3]) for i in range(len(p) // 4)]
                   + [(r["t_dr"], r["rd_a"]) for r in reqs] + [(r["t_sent"], r["rd_b"]) for r in reqs]
                   + [(r["t_up"], r["rd_c"]) for r in reqs] + [(r["t_ans"], r["rd_d"]) for r in reqs])
    tl_t = [t for t, _ in tl_rd]

    def rq_before(t, rd):
        """Run-queue wait between the stamp before t (≤ ~1 ms earlier with the probe on) and t:
        another task had core 0 right before busbar started this piece (its caches then cold)."""
        j = bisect.bisect_left(tl_t, t) - 1
        return max(0, rd - tl_rd[j][1]) if j >= 0 else 0

    segs = []   # (start, end, request index)
    for i, r in enumerate(reqs):
        r["seg1"] = (r["t0"], r["t_send"])
        r["seg2"] = (r["t_send"] + r["rtt"], r["t_ans"])
        segs.append((r["t0"], r["t_send"], i))
        segs.append((r["t_send"] + r["rtt"], r["t_ans"], i))
    segs.sort()
    others = [set() for _ in reqs]
    active = []     # heap of (end, index)
    for a, b, i in segs:
        while active and active[0][0] < a:
            heapq.heappop(active)
        for _, j in active:
            if j != i:
                others[i].add(j)
                others[j].add(i)
        heapq.heappush(active, (b, i))

    rows = []
    for i, r in enumerate(reqs):
        gl, tl, lag = [], [], 0
        for a, b in (r["seg1"], r["seg2"]):
            gl += inside(gcs, a, b)
            tl += inside(tms, a, b)
            for _due, _fired, late in inside(probes, a, b):
                lag = max(lag, late)
        wall1 = r["t_sent"] - r["t_dr"]
        wall2 = r["t_ans"] - r["t_up"]
        off = (wall1 - (r["cpu_sent"] - r["cpu_dr"])) + (wall2 - (r["cpu_ans"] - r["cpu_up"]))
        rows.append({
            "i": i, "dur_us": r["dur"] / 1000, "seg1_us": (r["t_send"] - r["t0"]) / 1000,
            "seg2_us": (r["t_ans"] - r["t_send"] - r["rtt"]) / 1000,
            "offcpu_us": max(0, off) / 1000,
            "rdelay_us": ((r["rd_b"] - r["rd_a"]) + (r["rd_d"] - r["rd_c"])) / 1000,
            "ivcsw": (r["iv_b"] - r["iv_a"]) + (r["iv_d"] - r["iv_c"]),
            "minflt": (r["mf_b"] - r["mf_a"]) + (r["mf_d"] - r["mf_c"]),
            "gc": [(gen, (b - a) / 1000) for a, b, gen, _ in sorted(set(gl))],
            "timers": [(name, (b - a) / 1000) for a, b, name in sorted(set(tl))],
            "lag_us": lag / 1000, "infl_start": r["infl_start"], "infl_end": r["infl_end"],
            "others": len(others[i]), "rtt_us": r["rtt"] / 1000, "connect": r["connect"],
            "rq_before_us": (rq_before(r["t_dr"], r["rd_a"]) + rq_before(r["t_up"], r["rd_c"])) / 1000,
        })

    inner = sorted(x["dur_us"] for x in rows)
    outer = sorted(d for d, _ in client)
    lat = sorted(l for _, l in client)
    # the header shows ms to 3 decimals: µs, rounded
    from collections import Counter
    hc = Counter(round(d) for d in outer)
    ic = Counter(round(d + 1e-9) for d in inner)
    matched = sum(min(v, ic.get(k, 0)) for k, v in hc.items())

    p50 = pct(inner, 50)
    bound = 3 * p50 if p50 else 0
    slow = [x for x in rows if x["dur_us"] > bound]
    k = max(top, int(math.ceil(len(rows) / 1000)))
    slowest = sorted(rows, key=lambda x: -x["dur_us"])[:k]

    def flags(x):
        gens = {gen for gen, _ in x["gc"]}
        names = [n for n, _ in x["timers"]]
        sweep = any(n.endswith("Deadlines._sweep") for n in names)
        excess = x["dur_us"] - p50
        return {
            "gc": bool(gens), "gc0": 0 in gens, "gc1": 1 in gens, "gc2": 2 in gens,
            "sweep": sweep, "other_timer": any(not n.endswith("Deadlines._sweep") for n in names),
            "stall": x["lag_us"] > stall_us, "ivcsw": x["ivcsw"] > 0,
            "inflight>1": x["infl_start"] > 1 or x["infl_end"] > 1,
            "others": x["others"] > 0, "minflt": x["minflt"] > 0,
            "offcpu": x["offcpu_us"] >= max(1.0, excess / 2), "connect": bool(x["connect"]),
            "rq_before": x["rq_before_us"] > 0,
        }
    share = {}
    if slow:
        fl = [flags(x) for x in slow]
        for key in fl[0]:
            share[key] = sum(f[key] for f in fl) / len(fl)
        share["none"] = sum(not (f["gc"] or f["sweep"] or f["other_timer"] or f["stall"]
                                 or f["ivcsw"] or f["inflight>1"] or f["connect"])
                            for f in fl) / len(fl)
        share["unexplained"] = sum(not (f["gc"] or f["sweep"] or f["other_timer"] or f["stall"]
                                        or f["ivcsw"] or f["minflt"] or f["offcpu"]
                                        or f["others"] or f["connect"] or f["rq_before"])
                                   for f in fl) / len(fl)
    allfl = [flags(x) for x in rows]
    base = {key: sum(f[key] for f in allfl) / len(allfl) for key in allfl[0]} if allfl else {}
    # the split of the slow requests' excess time (over p50) by where it went
    seg_excess = {
        "seg1_p50_us": pct(sorted(x["seg1_us"] for x in rows), 50),
        "seg2_p50_us": pct(sorted(x["seg2_us"] for x in rows), 50),
        "slow_seg1_median_us": pct(sorted(x["seg1_us"] for x in slow), 50) if slow else None,
        "slow_seg2_median_us": pct(sorted(x["seg2_us"] for x in slow), 50) if slow else None,
        "slow_offcpu_sum_us": sum(x["offcpu_us"] for x in slow),
        "slow_gc_sum_us": sum(d for x in slow for _, d in x["gc"]),
        "slow_excess_sum_us": sum(x["dur_us"] - p50 for x in slow),
    }
    gc_all = {}
    for a, b, gen, _coll in gcs:
        e = gc_all.setdefault(gen, [])
        e.append((b - a) / 1000)
    timers_all = {}
    for a, b, name in tms:
        timers_all.setdefault(name, []).append((b - a) / 1000)
    lags = sorted(l / 1000 for _, _, l in probes)
    return {
        "requests_recorded": len(rows), "requests_sent": len(client), "matched": matched,
        "overflow": doc["overflow"], "pending": doc["pending"],
        "dur_us_client": {"p50": pct(outer, 50), "p99": pct(outer, 99), "p99.9": pct(outer, 99.9),
                          "max": outer[-1] if outer else None},
        "dur_us_inside": {"p50": p50, "p99": pct(inner, 99), "p99.9": pct(inner, 99.9),
                          "max": inner[-1] if inner else None},
        "latency_us_client": {"p50": pct(lat, 50), "p99": pct(lat, 99), "p99.9": pct(lat, 99.9)},
        "bound_us": bound, "slow_count": len(slow), "slow_share": share, "all_share": base,
        "segments": seg_excess, "slowest": slowest,
        "gc_events": {str(gen): {"count": len(v), "p50_us": pct(sorted(v), 50),
                                 "max_us": max(v)} for gen, v in sorted(gc_all.items())},
        "timer_events": {n: {"count": len(v), "sum_us": round(sum(v), 1), "max_us": max(v)}
                         for n, v in sorted(timers_all.items())},
        "probe": {"count": len(lags), "lag_p50_us": pct(lags, 50), "lag_p99_us": pct(lags, 99),
                  "lag_max_us": lags[-1] if lags else None,
                  "over_stall": sum(l > stall_us for l in lags), "stalls": stalls},
        "gc_state": {"stats": doc["gc_stats"], "count": doc["gc_count"],
                     "threshold": doc["gc_threshold"], "freeze": doc["gc_freeze"]},
        "rows": rows,
    }


# --------------------------------------------------------------------------------------- output

def _f(v, nd=1):
    return "—" if v is None else ("%.*f" % (nd, v))


def print_phase(name, res, top_only=False):
    c, i = res["dur_us_client"], res.get("dur_us_inside")
    print("\n### %s" % name)
    print("requests %d, busbar;dur µs p50 / p99 / p99.9 / max: client %s / %s / %s / %s"
          % (res["requests_sent"], _f(c["p50"]), _f(c["p99"]), _f(c["p99.9"]), _f(c["max"])))
    if i is None:
        return
    print("inside (recorded %d, matched the header %d): %s / %s / %s / %s; p99.9 ÷ p50 = %.1f"
          % (res["requests_recorded"], res["matched"], _f(i["p50"]), _f(i["p99"]),
             _f(i["p99.9"]), _f(i["max"]), i["p99.9"] / i["p50"] if i["p50"] else 0))
    L = res["latency_us_client"]
    print("client latency µs p50 / p99 / p99.9: %s / %s / %s" % (_f(L["p50"]), _f(L["p99"]),
                                                               _f(L["p99.9"])))
    print("\n| dur | seg1 | seg2 | offcpu | rdelay | ivcsw | minflt | gc | timers | lag | infl | others | conn "
          "| rqbefore |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|---:|---:|---:|")
    for x in res["slowest"]:
        print("| %.0f | %.0f | %.0f | %.0f | %.0f | %d | %d | %s | %s | %.0f | %d/%d | %d | %d | %.0f |" % (
            x["dur_us"], x["seg1_us"], x["seg2_us"], x["offcpu_us"], x["rdelay_us"], x["ivcsw"],
            x["minflt"], ",".join("g%d:%.0f" % g for g in x["gc"]) or "-",
            ",".join("%s:%.0f" % (n.rsplit(":", 1)[-1], d) for n, d in x["timers"]) or "-",
            x["lag_us"], x["infl_start"], x["infl_end"], x["others"], x["connect"], x["rq_before_us"]))
    s, a = res["slow_share"], res["all_share"]
    print("\nabove 3× p50 (%.0f µs): %d requests (%.2f %%); share with each attribute (all "
          "requests in brackets):" % (res["bound_us"], res["slow_count"],
                                      100 * res["slow_count"] / max(1, res["requests_recorded"])))
    if s:
        print("  " + ", ".join("%s %.0f %% (%.1f %%)" % (k, 100 * v, 100 * a.get(k, 0))
                               if k in a else "%s %.0f %%" % (k, 100 * v) for k, v in s.items()))
    sg = res["segments"]
    print("  seg1/seg2 p50 %s/%s µs, slow median %s/%s µs; slow excess over p50 %.0f µs in all, of "
          "which off-CPU %.0f µs, GC %.0f µs" % (
              _f(sg["seg1_p50_us"]), _f(sg["seg2_p50_us"]), _f(sg["slow_seg1_median_us"]),
              _f(sg["slow_seg2_median_us"]), sg["slow_excess_sum_us"], sg["slow_offcpu_sum_us"],
              sg["slow_gc_sum_us"]))
    print("  gc during the phase: %s; timers: %s; probe lag p50/p99/max %s/%s/%s µs, %d over "
          "the stall bound" % (
              ", ".join("gen%s ×%d (p50 %.0f, max %.0f µs)" % (g, v["count"], v["p50_us"],
                                                              v["max_us"])
                        for g, v in res["gc_events"].items()) or "none",
              ", ".join("%s ×%d (max %.0f µs)" % (n.rsplit(":", 1)[-1], v["count"], v["max_us"])
                        for n, v in res["timer_events"].items()) or "none",
              _f(res["probe"]["lag_p50_us"], 0), _f(res["probe"]["lag_p99_us"], 0),
              _f(res["probe"]["lag_max_us"], 0), res["probe"]["over_stall"]))
    st = res["probe"]["stalls"]
    if st["count"]:
        print("  late probes: %d, %.0f µs late in all; over their waits busbar ran %.0f µs, waited "
              "%.0f µs in the run queue, and %.0f µs were neither (the vCPU not running)" % (
                  st["count"], st["late_us"], st["own_cpu_us"], st["runqueue_us"], st["rest_us"]))
    k = res.get("kernel")
    if k:
        print("  core 0 over the phase: %s" % ", ".join("%s %s" % kv for kv in k.items()))


# --------------------------------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10000, help="recorded requests per case and --conns")
    ap.add_argument("--warm", type=int, default=1000, help="unrecorded requests before each phase")
    ap.add_argument("--conns", default="1,32", help="comma-separated connection counts")
    ap.add_argument("--only", help="run only the cases whose key contains one of these (comma "
                    "separated): %s" % ", ".join(CASES))
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="pause between a response and the next request on a connection")
    ap.add_argument("--probe-ms", type=float, default=1.0, help="the loop probe's period (0: off)")
    ap.add_argument("--stall-us", type=float, default=1000.0,
                    help="probe lateness counted as a loop stall")
    ap.add_argument("--top", type=int, default=20, help="at least this many slow rows")
    ap.add_argument("--no-pin", action="store_true", help="no taskset: nothing is pinned")
    ap.add_argument("--no-trace", action="store_true",
                    help="busbar without the tracing sitecustomize (client figures only)")
    ap.add_argument("--out", help="results folder (default bench/results/tail-<UTC stamp>)")
    args = ap.parse_args(argv)
    conns = [int(c) for c in args.conns.split(",") if c.strip()]
    cases = [k for k in CASES if not args.only or any(o in k for o in args.only.split(","))]
    if not cases:
        ap.error("--only matches none of %s" % ", ".join(CASES))
    if sys.platform != "linux":
        sys.exit("tail: needs Linux (/proc)")
    pin = not args.no_pin and shutil.which("taskset") is not None and os.cpu_count() >= 2
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = pathlib.Path(args.out) if args.out else BENCH / "results" / ("tail-" + stamp)
    trace_dir = out_dir / "trace"
    trace_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **payloads.MOCK_ENV, PYTHONPATH=str(ROOT),
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    env.setdefault("BUSBAR_LOG", "WARNING")
    started = []

    def start(name, argv, core, e):
        logf = open(out_dir / (name + ".log"), "wb")
        cmd = (["taskset", "-c", str(core)] if pin else []) + argv
        p = subprocess.Popen(cmd, cwd=str(ROOT), env=e, stdin=subprocess.DEVNULL, stdout=logf,
                             stderr=subprocess.STDOUT, start_new_session=True)
        logf.close()
        started.append(p)
        return p

    def _stop(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _stop)
    results = {}
    meta = {"commit": procs.git_head(), "cpu": procs.cpu_model(), "cores": os.cpu_count(),
            "command": shlex.join(getattr(sys, "orig_argv", [PY] + sys.argv)),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "n": args.n, "warm": args.warm, "conns": conns, "cases": cases, "gap_ms": args.gap_ms,
            "probe_ms": 0 if args.no_trace else args.probe_ms, "stall_us": args.stall_us,
            "trace": not args.no_trace,
            "pinning": "busbar on core 0; mock and load on core 1" if pin else "none"}
    try:
        if pin:
            os.sched_setaffinity(0, {1})
        mock_port, port, admin = procs.free_port(), procs.free_port(), procs.free_port()
        mock = start("mock", [PY, "-m", "busbar.cli", "mock", "--port", str(mock_port),
                              "--require-auth"], 1, env)
        why = procs.wait_http(mock_port, mock, "/healthz", 30)
        if why:
            sys.exit("tail: mock %s" % why)
        cfg = out_dir / "busbar.yaml"
        cfg.write_text(benchrun.BUSBAR_CONFIG.format(port=port, mock=mock_port)
                       + 'admin_listen: "127.0.0.1:%d"\n' % admin
                       + 'export: {access: {module: access-log, settings: {path: "off"}}}\n')
        benv = dict(env)
        if not args.no_trace:
            (trace_dir / "sitecustomize.py").write_text(TRACE)
            benv["PYTHONPATH"] = "%s:%s" % (ROOT, trace_dir)
            benv["BENCH_TAIL_DIR"] = str(trace_dir)
            benv["BENCH_TAIL_CAP"] = str(max(args.n, args.warm) + 1000)
            benv["BENCH_TAIL_PROBE_MS"] = str(args.probe_ms)
        bb = start("busbar", [PY, "-m", "busbar.cli", "serve", "--config", str(cfg),
                              "--workers", "1"], 0, benv)
        why = procs.wait_http(port, bb, "/healthz", 30)
        if why:
            sys.exit("tail: busbar %s; see %s" % (why, out_dir / "busbar.log"))
        seq = 0
        loop = uvloop.new_event_loop()
        asyncio.set_event_loop(loop)
        tag = 0
        for case in cases:
            for c in conns:
                name = "%s, %d connection%s" % (CASES[case][0], c, "" if c == 1 else "s")
                tag += 1
                log("%s: %d warm-up + %d requests" % (name, args.warm, args.n))
                loop.run_until_complete(load(port, case, c, args.warm, args.gap_ms / 1000, tag))
                time.sleep(0.2)
                if not args.no_trace:
                    seq += 1
                    request_dump(bb.pid, trace_dir, seq)      # what came before: discarded
                tag += 1
                k0 = core_counters(0)
                k0["busbar"] = procs.cpu_ticks(bb.pid)
                client, wall = loop.run_until_complete(
                    load(port, case, c, args.n, args.gap_ms / 1000, tag))
                k1 = core_counters(0)
                k1["busbar"] = procs.cpu_ticks(bb.pid)
                kern = {k: k1[k] - k0[k] for k in k1}
                if not args.no_trace:
                    time.sleep(0.05)
                    seq += 1
                    doc = request_dump(bb.pid, trace_dir, seq)
                    res = analyse(doc, client, args.stall_us, args.top)
                else:
                    outer = sorted(d for d, _ in client)
                    lat = sorted(l for _, l in client)
                    res = {"requests_sent": len(client),
                           "dur_us_client": {"p50": pct(outer, 50), "p99": pct(outer, 99),
                                             "p99.9": pct(outer, 99.9), "max": outer[-1]},
                           "latency_us_client": {"p50": pct(lat, 50), "p99": pct(lat, 99),
                                                 "p99.9": pct(lat, 99.9)}}
                res.update({"case": case, "label": CASES[case][0], "conns": c, "wall_s": wall,
                            "kernel": kern,
                            "rps": len(client) / wall,
                            "client": [(round(d, 3), round(l, 1)) for d, l in client]})
                results["%s/c%d" % (case, c)] = res
                print_phase(name, res)
        loop.close()
    except KeyboardInterrupt:
        log("interrupted")
        raise SystemExit(130) from None
    finally:
        for p in reversed(started):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in started:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    doc = {"meta": meta, "fields": list(FIELDS), "results": results}
    (out_dir / "tail.json").write_text(json.dumps(doc))
    try:
        shown = out_dir.relative_to(ROOT)
    except ValueError:
        shown = out_dir
    print("\nPinning: %s. JSON: %s" % (meta["pinning"], shown / "tail.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
