"""Hostile memory soak: does busbar's memory stay bounded under big unique bodies at high concurrency,
and does it come back when the load ends?

    .venv/bin/python bench/soak_memory.py            # or: make soak-memory
    .venv/bin/python bench/soak_memory.py --diagnose # also tracemalloc + gc counts in every worker

busbar (`serve` with its default workers: one per core) in front of the built-in mock, Anthropic
Messages in, an OpenAI Chat lane out (translated both ways). A load generator in this process
(asyncio on uvloop, httptools, one keep-alive connection per client, RLIMIT_NOFILE raised to its
hard limit) keeps --connections clients busy for --duration seconds, each sending request after
request with a unique ~150 KB body (a counter in the last user message). PSS and RSS of busbar's
process tree (the parent and every child, from /proc/<pid>/smaps_rollup) are sampled every 0.5 s:
before the load (idle), during it, and for --after seconds after the last connection closed.

It passes iff the peak RSS of the tree stays ≤ --rss-max-mib (400) and its PSS is back within 20 %
of idle within 30 s after the load ended. It prints a table and writes soak_memory.json into
bench/results/soak-<UTC timestamp>/ (with every sample and each process's log). Nothing is
pinned: busbar's workers, the mock and the load generator share the machine's cores.

--diagnose puts a sitecustomize.py on busbar's PYTHONPATH that, in every busbar process, writes
every 5 s its gc counts and object count, glibc's mallinfo2() (heap bytes in use, free but kept,
mmapped), pymalloc's arena counts (sys._debugmallocstats) and its [heap] and anonymous RSS to
diag-<pid>.jsonl and .txt in the results folder; at the end (after the 30 s sample) each process
writes them once more, calls malloc_trim(0) and writes them again, and the soak samples the tree's
PSS after that trim: a diagnostic beside the verdict (which is taken before it), showing how much of
what stayed is free heap that glibc kept. --tracemalloc adds tracemalloc's top allocation sites
(it slows busbar down several times, so the load is far lighter then). --census gc|trace marks each
process just before the load and writes census-<pid>.txt at the end: gc object counts by type
against the mark, the gc's objects sitting in pymalloc pools the mark did not use (by type, with
samples and referrers), and with 'trace' tracemalloc (started at the mark) the small blocks the load
left alive, by traceback: what keeps the arenas the load made.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import resource
import shlex
import signal
import statistics
import sys
import threading
import time

BENCH = pathlib.Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

try:
    import httptools
    import uvloop

    import payloads  # noqa: E402
    import procs  # noqa: E402
    import report  # noqa: E402
except ImportError as _e:
    sys.exit("soak: %s; run it with busbar's venv: .venv/bin/python bench/soak_memory.py" % (_e,))

PY = sys.executable
AFTER_MARKS = (5, 10, 20, 30)

CONFIG = """\
listen: "127.0.0.1:{port}"
admin_listen: "127.0.0.1:{admin}"
providers:
  m-openai: {{protocol: openai, base_url: "http://127.0.0.1:{mock}", api_key: {{env: BENCH_MOCK_KEY}}}}
models:
  oai-model: {{provider: m-openai, upstream_model: gpt-4o-mini}}
export: {{access: {{module: access-log, settings: {{path: "off"}}}}}}
"""

DIAG = r'''
# Written by bench/soak_memory.py --diagnose: diagnostics inside every busbar process.
import gc, os, threading, time, tracemalloc
_OUT = os.environ.get("BENCH_DIAG_DIR")
def _dump(tag):
    pid = os.getpid()
    try:
        import json
        rec = {"tag": tag, "t": time.time(), "gc_count": gc.get_count(),
               "objects": len(gc.get_objects()), "mallinfo2_kib": _mallinfo(), "smaps_kib": _smaps()}
        rec["pymalloc"] = _pymalloc()
        with open(os.path.join(_OUT, "diag-%d.jsonl" % pid), "a") as f:
            f.write(json.dumps(rec) + "\n")
        tracing = tracemalloc.is_tracing() and os.environ.get("BENCH_DIAG_TRACEMALLOC")
        snap = tracemalloc.take_snapshot() if tracing else None
        with open(os.path.join(_OUT, "diag-%d.txt" % pid), "a") as f:
            f.write("=== %s pid %d t=%.1f ===\n" % (tag, pid, time.time()))
            f.write("gc.get_count() %r\n" % (gc.get_count(),))
            f.write("gc.get_stats() %r\n" % (gc.get_stats(),))
            f.write("gc.get_freeze_count() %r\n" % (gc.get_freeze_count(),))
            f.write("gc.get_objects() %d\n" % (len(gc.get_objects()),))
            f.write("mallinfo2 %s\n" % (_mallinfo(),))
            f.write("smaps %s\n" % (_smaps(),))
            if snap is not None:
                cur, peak = tracemalloc.get_traced_memory()
                f.write("traced current %d KiB peak %d KiB\n" % (cur // 1024, peak // 1024))
                for st in snap.statistics("lineno")[:25]:
                    f.write("  %s\n" % (st,))
                f.write("  -- by traceback (top 5, 6 frames)\n")
                for st in snap.statistics("traceback")[:5]:
                    f.write("  %d KiB in %d blocks\n" % (st.size // 1024, st.count))
                    for line in st.traceback.format()[-12:]:
                        f.write("      %s\n" % line)
    except Exception as e:  # diagnostics must never take the process down
        try:
            with open(os.path.join(_OUT, "diag-%d.err" % os.getpid()), "a") as f:
                f.write("%r\n" % (e,))
        except OSError:
            pass
def _mallinfo():
    """glibc's own account: arena = heap bytes from brk, hblkhd = bytes in mmapped chunks,
    uordblks = bytes in use, fordblks = free bytes it keeps (KiB)."""
    try:
        import ctypes
        class M(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                        "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
        f = ctypes.CDLL(None).mallinfo2
        f.restype = M
        m = f()
        return {n: getattr(m, n) // 1024 for n in ("arena", "hblkhd", "uordblks", "fordblks",
                                                    "keepcost")} | {"hblks": m.hblks}
    except Exception as e:
        return repr(e)
def _pymalloc():
    """The summary lines of sys._debugmallocstats() (pymalloc's arenas: allocated, in use, bytes
    in blocks, free), caught from fd 2 into a file for the moment of the call."""
    import sys, tempfile
    keep = {}
    try:
        with tempfile.TemporaryFile() as tmp:
            sys.stderr.flush()
            saved = os.dup(2)
            try:
                os.dup2(tmp.fileno(), 2)
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            tmp.seek(0)
            for line in tmp.read().decode("latin-1").splitlines():
                if line.startswith("# arenas") or line.startswith("# bytes in") or \
                        line.startswith("Total") or "bytes in available blocks" in line:
                    k, _, v = line.rpartition("=")
                    keep[k.strip(" #")] = v.strip().replace(",", "")
    except Exception as e:
        keep["error"] = repr(e)
    return keep
def _trim():
    """glibc's malloc_trim(0): gives the free pages inside the heap back to the system (what
    free() alone does only for the heap's top). Called once, at the end, to show what it frees."""
    try:
        import ctypes
        ctypes.CDLL(None).malloc_trim(0)
    except Exception:
        pass
def _smaps():
    """Rss (KiB) of [heap], of anonymous mappings, and of everything, from /proc/self/smaps."""
    out = {"heap": 0, "anon": 0, "total": 0}
    kind = None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and ":" not in parts[0]:
                kind = "heap" if parts[-1] == "[heap]" else ("anon" if len(parts) == 5 else "file")
            elif parts[0] == "Rss:":
                out["total"] += int(parts[1])
                if kind in out:
                    out[kind] += int(parts[1])
    return out

_POOL = 1 << 14     # pymalloc's pool (16 KiB on 64-bit CPython 3.10+; arenas are 1 MiB)
_MARK = {}
def _types():
    import collections
    c = collections.Counter()
    for o in gc.get_objects():
        c[type(o).__qualname__] += 1
    return c
def _mark():
    """Before the load: the types of the gc's objects and the pools they sit in; tracemalloc from
    here on (with BENCH_DIAG_CENSUS=trace), so a later snapshot holds only what the load left."""
    gc.collect()
    _MARK["types"] = _types()
    _MARK["pools"] = {id(o) & ~(_POOL - 1) for o in gc.get_objects()}
    if os.environ.get("BENCH_DIAG_CENSUS") == "trace" and not tracemalloc.is_tracing():
        tracemalloc.start(12)
def _census():
    """After the load: what it left alive: type counts against the mark, the gc's objects that sit
    in pools the mark did not use (the ones that pin arenas the load made), and tracemalloc's
    small (pymalloc) blocks allocated since the mark, by traceback."""
    if "types" not in _MARK:
        return
    import collections
    gc.collect()
    snap = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
    now = _types()
    with open(os.path.join(_OUT, "census-%d.txt" % os.getpid()), "w") as f:
        f.write("gc objects: mark %d, now %d\n" % (sum(_MARK["types"].values()), sum(now.values())))
        diff = sorted(((now[k] - _MARK["types"].get(k, 0), k) for k in set(now) | set(_MARK["types"])),
                      reverse=True)
        f.write("-- type count growth since the mark (top 40)\n")
        for d, k in diff[:40]:
            f.write("  %+7d %s (now %d)\n" % (d, k, now[k]))
        f.write("-- type count drop (top 10)\n")
        for d, k in diff[-10:]:
            f.write("  %+7d %s\n" % (d, k))
        newp = collections.Counter()
        newpools = set()
        samples = collections.defaultdict(list)
        for o in gc.get_objects():
            pool = id(o) & ~(_POOL - 1)
            if pool not in _MARK["pools"]:
                k = type(o).__qualname__
                newp[k] += 1
                newpools.add(pool)
                if len(samples[k]) < 4:
                    samples[k].append(o)
        f.write("-- gc objects in pools unused at the mark: %d in %d pools, by type (top 40)\n"
                % (sum(newp.values()), len(newpools)))
        for k, n in newp.most_common(40):
            f.write("  %7d %s\n" % (n, k))
            for o in samples[k][:3]:
                try:
                    r = repr(o)[:160]
                except Exception as e:
                    r = "<repr failed %r>" % (e,)
                refs = []
                for rr in gc.get_referrers(o)[:4]:
                    if rr is samples or rr is samples[k]:
                        continue
                    shown = isinstance(rr, (dict, list, tuple)) and len(repr(rr)) < 200
                    refs.append(type(rr).__qualname__ + (":" + repr(rr)[:80] if shown else ""))
                f.write("          %s  <- %s\n" % (r, refs))
        del samples
        if snap is not None:
            traces = [t for t in snap.traces if t.size <= 512]
            f.write("-- tracemalloc: %d blocks alive allocated since the mark, %d of them <= 512 B (%d B)\n"
                    % (len(snap.traces), len(traces), sum(t.size for t in traces)))
            by = collections.defaultdict(lambda: [0, 0])
            for t in traces:
                e = by[t.traceback]
                e[0] += 1
                e[1] += t.size
            for tb, (n, b) in sorted(by.items(), key=lambda kv: -kv[1][0])[:40]:
                f.write("  %6d blocks %8d B\n" % (n, b))
                for line in tb.format(most_recent_first=True)[:16]:
                    f.write("      %s\n" % line)
def _loop():
    n = 0
    while True:
        time.sleep(0.5)
        n += 1
        if n % 10 == 0:
            _dump("periodic")
        if "types" not in _MARK and os.path.exists(os.path.join(_OUT, "mark-load")):
            try:
                _mark()
            except Exception as e:
                _MARK["error"] = repr(e)
        flag = os.path.join(_OUT, "dump-now")
        if os.path.exists(flag):
            seen = os.path.join(_OUT, "dumped-%d" % os.getpid())
            if not os.path.exists(seen):
                _dump("requested")
                try:
                    _census()
                except Exception as e:
                    with open(os.path.join(_OUT, "census-%d.err" % os.getpid()), "a") as f:
                        f.write("%r\n" % (e,))
                _trim()
                _dump("after malloc_trim(0)")
                open(seen, "w").close()
def _start():
    threading.Thread(target=_loop, daemon=True, name="bench-diag").start()
if _OUT:
    if os.environ.get("BENCH_DIAG_TRACEMALLOC"):
        tracemalloc.start(6)
    _start()
    os.register_at_fork(after_in_child=_start)
'''


def log(msg):
    print("[soak %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def raise_nofile(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard == resource.RLIM_INFINITY else max(soft, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft != resource.RLIM_INFINITY and soft < need:
        sys.exit("soak: RLIMIT_NOFILE is %d (hard %d); %d connections need ~%d descriptors"
                 % (soft, hard, need // 3, need))
    return soft


# --------------------------------------------------------------------------------------- sampling

class TreeSampler(threading.Thread):
    """PSS and RSS of a process tree (the parent and every descendant), every `period` seconds."""

    def __init__(self, started, period=0.5):
        super().__init__(daemon=True)
        self.started = started
        self.period = period
        self.samples = []           # (monotonic, pss KiB, rss KiB, processes)
        self._halt = threading.Event()

    def sample(self):
        pids = procs.descendants(self.started.proc.pid) if self.started.alive() else []
        self.started.identities.update((p, procs.start_time(p)) for p in pids)
        pss = rss = 0
        for p in pids:
            r = procs.smaps_rollup(p)
            pss += r.get("Pss", 0)
            rss += r.get("Rss", 0)
        s = (time.monotonic(), pss, rss, len(pids))
        self.samples.append(s)
        return s

    def run(self):
        while not self._halt.wait(self.period):
            self.sample()

    def stop(self):
        self._halt.set()
        self.join(5)


# --------------------------------------------------------------------------------------- the load

class _Client(asyncio.Protocol):
    """One keep-alive connection: one request at a time, the answer parsed with httptools."""

    def __init__(self):
        self.transport = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter = None
        self.status = 0
        self.lost = None
        self.paused = False
        self.drained = None

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.lost = exc or ConnectionError("closed by the peer")
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(self.lost)
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        if self.drained is not None and not self.drained.done():
            self.drained.set_result(None)

    def data_received(self, data):
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            if self.waiter is not None and not self.waiter.done():
                self.waiter.set_exception(ConnectionError("malformed response: %s" % (e,)))

    def on_headers_complete(self):
        self.status = self.parser.get_status_code()

    def on_message_complete(self):
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.status)

    async def request(self, parts, timeout):
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        self.transport.writelines(parts)
        if self.paused:
            self.drained = loop.create_future()
            await asyncio.wait_for(self.drained, timeout)
        return await asyncio.wait_for(self.waiter, timeout)


class Load:
    def __init__(self, port, path, headers, template, connections, duration, timeout):
        self.port = port
        self.connections = connections
        self.duration = duration
        self.timeout = timeout
        cut = template.index(payloads.MARK.encode())
        self.head, self.tail = template[:cut], template[cut + len(payloads.MARK):]
        self.req_head = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % (path, port)
                         + "".join("%s: %s\r\n" % kv for kv in headers.items())).encode()
        self.ok = self.non2xx = self.failed = 0
        self.first_bad = None
        self.latencies = []
        self.errors = {}
        self.t_start = self.t_end = self.t_closed = None

    def _fail(self, why):
        self.failed += 1
        key = why.split(":")[0][:80]
        self.errors[key] = self.errors.get(key, 0) + 1

    async def _connect(self, loop):
        t, p = await asyncio.wait_for(
            loop.create_connection(_Client, "127.0.0.1", self.port), 10)
        return p

    async def client(self, i, loop, stop_at):
        conn, seq = None, 0
        while time.monotonic() < stop_at:
            if conn is None or conn.lost is not None:
                try:
                    conn = await self._connect(loop)
                except (OSError, asyncio.TimeoutError) as e:
                    self._fail("connect: %s" % (e.__class__.__name__,))
                    conn = None
                    await asyncio.sleep(0.2)
                    continue
            seq += 1
            mark = b"%dx%d" % (i, seq)
            n = len(self.head) + len(mark) + len(self.tail)
            parts = [self.req_head + b"Content-Length: %d\r\n\r\n" % n, self.head, mark, self.tail]
            t0 = time.monotonic()
            try:
                status = await conn.request(parts, self.timeout)
            except (OSError, asyncio.TimeoutError, ConnectionError) as e:
                self._fail("request: %s" % (e.__class__.__name__,))
                conn.transport.close()
                conn = None
                continue
            self.latencies.append(time.monotonic() - t0)
            if 200 <= status < 300:
                self.ok += 1
            else:
                self.non2xx += 1
                if self.first_bad is None:
                    self.first_bad = status
        if conn is not None and conn.transport is not None:
            conn.transport.close()

    async def run(self):
        loop = asyncio.get_running_loop()
        self.t_start = time.monotonic()
        stop_at = self.t_start + self.duration
        tasks = [loop.create_task(self.client(i, loop, stop_at)) for i in range(self.connections)]
        # Every client stops sending at stop_at and ends once its last answer is in (bounded by
        # its request timeout).
        await asyncio.wait(tasks, timeout=self.duration + self.timeout + 15)
        self.t_end = time.monotonic()
        for t in tasks:
            t.cancel()
        await asyncio.sleep(0.2)        # closes reach the server
        self.t_closed = time.monotonic()


# --------------------------------------------------------------------------------------- the soak

def evaluate(samples, t_idle_end, t_load_start, t_load_end, rss_max_kib, back_pct=20.0):
    """The soak's figures from (t, pss, rss, processes) samples: idle = median PSS/RSS of the
    samples before the load; peak = max during the load (through its end); after = the first
    sample at or after load end + k s for each k in AFTER_MARKS; back_within_s = seconds after
    the load ended until PSS first came within back_pct % of idle (None if never within 30 s)."""
    idle = [s for s in samples if s[0] <= t_idle_end]
    during = [s for s in samples if t_load_start <= s[0] <= t_load_end + 0.5]
    after = [s for s in samples if s[0] > t_load_end]
    if not idle or not during:
        raise ValueError("not enough samples (idle %d, during %d)" % (len(idle), len(during)))
    pss_idle = statistics.median(s[1] for s in idle)
    rss_idle = statistics.median(s[2] for s in idle)
    pss_peak = max(s[1] for s in during + after[:1])
    rss_peak = max(s[2] for s in during + after[:1])
    pss_after, rss_after = {}, {}
    for k in AFTER_MARKS:
        s = next((x for x in after if x[0] >= t_load_end + k), None)
        pss_after[str(k)] = s[1] if s else None
        rss_after[str(k)] = s[2] if s else None
    limit = pss_idle * (1 + back_pct / 100.0)
    back = next((x[0] - t_load_end for x in after if x[1] <= limit and x[0] <= t_load_end + 30),
                None)
    at30 = pss_after.get("30")
    passed = rss_peak <= rss_max_kib and at30 is not None and at30 <= limit
    why = []
    if rss_peak > rss_max_kib:
        why.append("peak RSS %.1f MiB > %.0f MiB" % (rss_peak / 1024, rss_max_kib / 1024))
    if at30 is None:
        why.append("no PSS sample 30 s after the load")
    elif at30 > limit:
        why.append("PSS 30 s after the load %.1f MiB > idle %.1f MiB + %.0f %%"
                   % (at30 / 1024, pss_idle / 1024, back_pct))
    return {"pss_idle_kib": pss_idle, "rss_idle_kib": rss_idle, "pss_peak_kib": pss_peak,
            "rss_peak_kib": rss_peak, "pss_after_kib": pss_after, "rss_after_kib": rss_after,
            "back_within_s": None if back is None else round(back, 1),
            "limit_rss_kib": rss_max_kib, "limit_back_pss_kib": limit, "passed": passed,
            "verdict": "PASS" if passed else "FAIL: " + "; ".join(why)}


def diagnosis(out_dir, trimmed):
    """What --diagnose found, per busbar process: glibc's heap (in use, free but kept, mmapped)
    and the heap's RSS at the peak of in-use bytes during the load, at the end (30+ s after the
    load) and after malloc_trim(0); and the tree's PSS/RSS after the trim."""
    out = {"pss_after_malloc_trim_kib": trimmed[1], "rss_after_malloc_trim_kib": trimmed[2],
           "processes": {}}
    for f in sorted(pathlib.Path(out_dir).glob("diag-*.jsonl")):
        recs = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        recs = [r for r in recs if isinstance(r.get("mallinfo2_kib"), dict)]
        if not recs:
            continue

        def brief(r):
            m, sm = r["mallinfo2_kib"], r["smaps_kib"]
            return {"heap_in_use_kib": m["uordblks"], "heap_free_kept_kib": m["fordblks"],
                    "heap_top_free_kib": m["keepcost"], "mmapped_kib": m["hblkhd"],
                    "heap_rss_kib": sm["heap"], "anon_rss_kib": sm["anon"],
                    "rss_kib": sm["total"], "gc_objects": r["objects"],
                    "gc_count": r["gc_count"], "pymalloc": r.get("pymalloc")}
        peak = max(recs, key=lambda r: r["mallinfo2_kib"]["uordblks"])
        end = [r for r in recs if r["tag"] == "requested"]
        trim = [r for r in recs if r["tag"].startswith("after malloc_trim")]
        out["processes"][f.stem.split("-", 1)[1]] = {
            "peak_in_use": brief(peak), "end": brief(end[-1]) if end else None,
            "after_malloc_trim": brief(trim[-1]) if trim else None}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--duration", type=int, default=60, help="seconds of load")
    ap.add_argument("--body-kb", type=int, default=150, help="request body size (KB, 1000 B)")
    ap.add_argument("--after", type=int, default=35, help="seconds sampled after the load")
    ap.add_argument("--workers", type=int, help="busbar --workers (default: busbar's, one per core)")
    ap.add_argument("--timeout", type=float, default=60.0, help="per-request timeout (seconds)")
    ap.add_argument("--rss-max-mib", type=float, default=400.0)
    ap.add_argument("--busbar-env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable for busbar's processes (repeatable), for "
                    "experiments such as PYTHONMALLOC=malloc; recorded in the results")
    ap.add_argument("--diagnose", action="store_true",
                    help="gc counts, glibc's mallinfo2 and smaps in busbar's processes, every 5 s "
                    "(see the docstring)")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="with --diagnose: tracemalloc's top allocation sites too (much slower: "
                    "the load is then far lighter)")
    ap.add_argument("--census", choices=("gc", "trace"),
                    help="with --diagnose: what the load left alive in each busbar process, "
                    "against a mark taken just before it (census-<pid>.txt): gc object counts by "
                    "type, the gc's objects in pymalloc pools unused at the mark; 'trace' also "
                    "starts tracemalloc at the mark (slower load) for the small blocks' sites")
    args = ap.parse_args(argv)
    if args.after < 31:
        ap.error("--after must be at least 31: the verdict needs the sample 30 s after the load")
    if sys.platform != "linux":
        sys.exit("soak: needs Linux (/proc)")
    nofile = raise_nofile(args.connections * 3 + 100)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    out_dir = BENCH / "results" / ("soak-" + stamp)
    log_dir = out_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log("results: %s (RLIMIT_NOFILE %d)" % (out_dir.relative_to(ROOT), nofile))
    pr = procs.Processes(str(log_dir))
    sampler = None

    def _stop(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGHUP, _stop)
    env = dict(os.environ, PYTHONPATH=str(ROOT), BENCH_MOCK_KEY="sk-bench-upstream",
               NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    env.setdefault("BUSBAR_LOG", "WARNING")
    all_cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    try:
        mock_port, port, admin = procs.free_port(), procs.free_port(), procs.free_port()
        mock = pr.start("mock", [PY, "-m", "busbar.cli", "mock", "--port", str(mock_port),
                                 "--require-auth"], all_cores, env, str(ROOT))
        why = procs.wait_http(mock_port, mock.proc, "/healthz", 30)
        if why:
            sys.exit("soak: mock %s; log: %s" % (why, mock.log_tail()))
        cfg = log_dir / "busbar.yaml"
        cfg.write_text(CONFIG.format(port=port, admin=admin, mock=mock_port))
        benv = dict(env)
        for item in args.busbar_env:
            name, sep, value = item.partition("=")
            if not sep or not name:
                sys.exit("soak: --busbar-env wants NAME=VALUE, got %r" % item)
            benv[name] = value
        if args.diagnose:
            diag = out_dir / "diag"
            diag.mkdir()
            (diag / "sitecustomize.py").write_text(DIAG)
            benv["PYTHONPATH"] = "%s:%s" % (ROOT, diag)
            benv["BENCH_DIAG_DIR"] = str(out_dir)
            if args.tracemalloc:
                benv["BENCH_DIAG_TRACEMALLOC"] = "1"
            if args.census:
                benv["BENCH_DIAG_CENSUS"] = args.census
        argv_bb = [PY, "-m", "busbar.cli", "serve", "--config", str(cfg)]
        if args.workers:
            argv_bb += ["--workers", str(args.workers)]
        bb = pr.start("busbar", argv_bb, all_cores, benv, str(ROOT))
        why = procs.wait_http(port, bb.proc, "/healthz", 30)
        if why:
            sys.exit("soak: busbar %s; log: %s" % (why, bb.log_tail()))
        template = payloads.body("anthropic", "oai-model", args.body_kb * 1000)
        path = payloads.path("anthropic", "oai-model")
        headers = payloads.headers("anthropic")
        # One request first: the case must answer 2xx, else there is nothing to soak.
        import http.client
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("POST", path, template.replace(b"@SEQ@", b"preflight"), headers)
        r = c.getresponse()
        data = r.read()
        c.close()
        if not 200 <= r.status < 300:
            sys.exit("soak: the preflight request answered %d: %s" % (r.status, data[:200]))
        # Idle: settle, then sample for a few seconds with nothing sent.
        sampler = TreeSampler(bb)
        time.sleep(3.0)
        sampler.start()
        time.sleep(4.0)
        t_idle_end = time.monotonic()
        log("idle PSS %.1f MiB over %d processes; load: %d connections, %d s, %d-byte bodies "
            "(Anthropic in, OpenAI lane)" % (sampler.samples[-1][1] / 1024, sampler.samples[-1][3],
                                             args.connections, args.duration, len(template)))
        if args.census:
            (out_dir / "mark-load").write_text("1")
            time.sleep(2.0)
        load = Load(port, path, headers, template, args.connections, args.duration, args.timeout)
        bb.refresh()
        cpu0 = bb.cpu_ticks()
        loop = uvloop.new_event_loop()
        try:
            loop.run_until_complete(load.run())
        finally:
            loop.close()
        bb.refresh()
        log("load ended: %d ok, %d non-2xx, %d failed in %.1f s; sampling %d s more"
            % (load.ok, load.non2xx, load.failed, load.t_end - load.t_start, args.after))
        t_end = load.t_closed
        while time.monotonic() < t_end + args.after:
            time.sleep(0.5)
        trimmed = None
        if args.diagnose:
            # Every busbar process dumps its state, calls malloc_trim(0) and dumps again: the PSS
            # then, beside the verdict's, shows how much of what stayed is free heap glibc kept.
            (out_dir / "dump-now").write_text("1")
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and len(list(out_dir.glob("dumped-*"))) < len(
                    procs.descendants(bb.proc.pid)):
                time.sleep(0.2)
            time.sleep(1.0)
            trimmed = sampler.sample()
        sampler.stop()
        alive = bb.alive()
        cpu1 = bb.cpu_ticks()
        res = evaluate(sampler.samples, t_idle_end, load.t_start, t_end, args.rss_max_mib * 1024)
        res["processes"] = max(s[3] for s in sampler.samples)
        if trimmed is not None:
            res["diagnose"] = diagnosis(out_dir, trimmed)
        res["busbar_alive_at_end"] = alive
        if not alive:
            res["passed"] = False
            res["verdict"] = "FAIL: busbar exited (code %s)" % bb.proc.returncode
        total = load.ok + load.non2xx
        lat = sorted(load.latencies)
        secs = load.t_end - load.t_start
        L = {"ingress": "Anthropic", "egress": "OpenAI Chat", "body_bytes": len(template) - 5,
             "connections": args.connections, "seconds": args.duration,
             "wall_s": round(secs, 1), "requests": total, "ok": load.ok,
             "non2xx": load.non2xx, "failed": load.failed, "first_bad_status": load.first_bad,
             "errors": load.errors, "rps": total / secs if secs else 0.0,
             "latency_ms": {"p50": 1000 * lat[len(lat) // 2] if lat else None,
                            "p99": 1000 * lat[int(len(lat) * 0.99)] if lat else None},
             "busbar_cpu_s": (cpu1 - cpu0) / procs.CLK_TCK}
        t0 = sampler.samples[0][0]
        meta = {"commit": procs.git_head(), "cpu": procs.cpu_model(), "cores": os.cpu_count(),
                "command": shlex.join(getattr(sys, "orig_argv", [PY] + sys.argv)),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "workers": args.workers or "default (one per core)", "diagnose": args.diagnose,
                "busbar_env": args.busbar_env,
                "pinning": "none: busbar's workers, the mock and the load generator share cores %s"
                           % all_cores,
                "rlimit_nofile": nofile}
        doc = {"meta": meta, "load": L, "result": res,
               "timeline": {"load_start_s": round(load.t_start - t0, 2),
                            "load_end_s": round(t_end - t0, 2),
                            "samples": [(round(t - t0, 2), p, r_, n) for t, p, r_, n in sampler.samples]}}
        (out_dir / "soak_memory.json").write_text(json.dumps(doc, indent=1))
    except KeyboardInterrupt:
        log("interrupted: stopping every process this soak started")
        raise SystemExit(130) from None
    finally:
        if sampler is not None and sampler.is_alive():
            sampler.stop()
        pr.stop_all()
    print("\n".join(report.soak_section(doc)))
    print()
    print("Pinning: %s. Samples every 0.5 s; JSON: %s" % (
        meta["pinning"], (out_dir / "soak_memory.json").relative_to(ROOT)))
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
