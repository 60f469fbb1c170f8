"""busbar (or the floor) and a keep-alive client in one process: CPU or instructions per request,
for repeatable figures on a shared machine.

bench/run.py measures the gateway's CPU from outside under wrk; on this 2-core machine, with another
engineer's runs beside it, its figures move by ±10 %. Here the gateway runs in this process on
uvloop (`busbar.supervisor.serve`, with its real hooks: access log, metrics, virtual keys), a
client on the same loop sends the bench's small Anthropic → Anthropic request over `--conns`
keep-alive connections (each body unique, as bench/load.lua makes them), and the mock answers from
its own process (`busbar.cli mock --require-auth`, not counted). The client's own cost is the same
for every configuration, so differences between rows are the gateway's.

    .venv/bin/python bench/inproc.py [--gateway busbar|floor] [--observe off|on|access|metrics]
                                     [--keys off|sqlite|valkey|postgres] [--n 20000] [--warm 2000]
                                     [--conns 8]
        CPU µs per request (process time over the measured requests), busbar;dur p50.
        --keys valkey / postgres: a loopback redis-server / PostgreSQL (tests/redis_server.py,
        tests/postgres_server.py) is started for the run and stopped after it; its CPU is not
        counted (it is another process), the store client's in busbar is. --pg-no-reset (an
        experiment): asyncpg's pool without its reset query on release.
    .venv/bin/python bench/inproc.py --callgrind [same options]
        instructions per request: runs itself under callgrind twice (N and 2N requests after the
        same warm-up) and prints the difference / N, so start-up, imports and warm-up cancel out.
        --keep DIR keeps the two callgrind files (callgrind_annotate DIR/cg.2n.out | head -60).
    .venv/bin/python bench/inproc.py --opcodes [same options] [--lines FILE:FUNC,...]
        Python bytecodes executed per request in each function of busbar/ (sys.settrace opcode
        events over the warm-up and the measured requests, client excluded): where the
        interpreter's share of a request goes, which callgrind shows only as one
        _PyEval_EvalFrameDefault line. --lines adds a per-line count for the functions named
        (e.g. engine/exchange.py:attempt). The tracer slows the run ~20 times; counts, not time.
        --opcodes-all counts every library's frames too (redis-py, asyncpg's Python side, asyncio,
        ...; the client in bench/ still excluded) and adds a total per package: where a store
        path's interpreter work goes.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import types

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)
sys.path.insert(0, BENCH)

import payloads  # noqa: E402
import procs  # noqa: E402


def start_mock(port):
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen([sys.executable, "-m", "busbar.cli", "mock", "--port", str(port),
                          "--require-auth"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    why = procs.wait_http(port, p, "/healthz", 30)
    if why:
        p.kill()
        raise SystemExit("inproc: mock %s" % why)
    return p


class Client(asyncio.Protocol):
    """One keep-alive connection sending requests one after another; `done` when `n` answered."""

    def __init__(self, head, tail, path, headers, n, tag, stats):
        self.prefix = b"POST %s HTTP/1.1\r\nHost: bench\r\n%sContent-Length: " % (path, headers)
        self.head, self.tail = head, tail
        self.n = n
        self.tag = tag
        self.stats = stats
        self.sent = 0
        self.buf = b""
        self.done = asyncio.get_event_loop().create_future()

    def connection_made(self, transport):
        self.transport = transport
        self.send()

    def send(self):
        self.sent += 1
        body = self.head + b"%dx%d" % (self.tag, self.sent) + self.tail
        self.transport.write(self.prefix + b"%d\r\n\r\n" % len(body) + body)

    def data_received(self, data):
        answers, self.buf = procs.take_responses(self.buf + data)
        for head, body in answers:
            if not head.startswith(b"HTTP/1.1 200"):
                self.done.set_exception(RuntimeError((head + b" | " + body[:300]).decode("latin-1")))
                return
            self.answered(head)
            if self.sent < self.n:
                self.next()
            elif not self.done.done():
                self.done.set_result(None)

    def answered(self, head):
        """An answer's head arrived (200): keeps its busbar;dur."""
        t = re.search(rb"busbar;dur=([0-9.]+)", head)
        if t is not None:
            self.stats.append(float(t.group(1)))

    def next(self):
        self.send()

    def connection_lost(self, exc):
        if not self.done.done():
            self.done.set_exception(RuntimeError("connection lost: %r" % (exc,)))


async def drive(loop, port, args, token):
    template = payloads.body("anthropic", "ant-model", 100)
    head, tail = template.split(payloads.MARK.encode())
    hdrs = payloads.headers("anthropic")
    if token:
        hdrs.pop("x-api-key", None)
        hdrs["Authorization"] = "Bearer " + token
    hb = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in hdrs.items())
    path = payloads.path("anthropic", "ant-model").encode()

    async def phase(n, tag):
        per = max(1, n // args.conns)
        stats = []
        clients = []
        for c in range(args.conns):
            _, cl = await loop.create_connection(
                lambda c=c: Client(head, tail, path, hb, per, tag * 1000 + c, stats), "127.0.0.1", port)
            clients.append(cl)
        t0, c0 = time.perf_counter(), time.process_time()
        await asyncio.gather(*(cl.done for cl in clients))
        t1, c1 = time.perf_counter(), time.process_time()
        for cl in clients:
            cl.transport.close()
        return per * args.conns, t1 - t0, c1 - c0, sorted(stats)

    await phase(args.warm, 1)
    n, wall, cpu, stats = await phase(args.n, 2)
    out = {"requests": n, "wall_s": wall, "cpu_us_per_req": cpu / n * 1e6,
           "dur_p50_us": stats[len(stats) // 2] * 1000 if stats else None}
    print("inproc: %s observe=%s keys=%s: %d requests, %.1f CPU µs/req (client included), "
          "%.0f req/s, busbar;dur p50 %s µs" % (
              args.gateway, args.observe, args.keys, n, out["cpu_us_per_req"], n / wall,
              "%.1f" % out["dur_p50_us"] if stats else "-"), flush=True)


def mint(loop, admin_port, admin_token):
    import http.client
    import json

    def call():
        c = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=30)
        c.request("POST", "/api/v1/admin/keys", json.dumps({"name": "bench", "group": "bench"}),
                  {"Authorization": "Bearer " + admin_token, "Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        if r.status != 201:
            raise SystemExit("inproc: minting the key failed: %d %s" % (r.status, body[:200]))
        return json.loads(body)["token"]
    return loop.run_in_executor(None, call)


def run_busbar(args, mock_port):
    import run as benchrun
    from busbar import config as cfgmod
    from busbar.supervisor import serve
    port = procs.free_port()
    env = {"BENCH_MOCK_KEY": "sk-bench-upstream",
           "BENCH_MOCK_AWS": "AKIDBENCHEXAMPLE:benchSecretKeyExample0123456789abcdefXYZ"}
    tmp = tempfile.mkdtemp(prefix="inproc-")
    o = args.observe
    observe = "export:\n  access: {module: access-log, settings: {path: %s}}\n" % (
        '"%s"' % os.path.join(tmp, "access.jsonl") if o in ("on", "access") else '"off"')
    if o in ("on", "metrics"):
        observe += "  metrics: {module: prometheus, settings: {buffer_seconds: 60}}\n"
    # The slice of bench/run.py's Bench that keys_config reads; the store's server (valkey,
    # postgres) was started by main(), its URL is --store-url.
    fake = types.SimpleNamespace(base_env=env, log_dir=_Dir(tmp), admin_port=procs.free_port())
    if args.keys in ("valkey", "postgres"):
        env["BENCH_STORE_URL"] = args.store_url
        fake.store_yaml = lambda keys, tag: (
            "store: {module: %s, settings: {url: {env: BENCH_STORE_URL}}}\n" % keys)
    else:
        fake.store_yaml = lambda keys, tag: benchrun.Bench.store_yaml(fake, keys, tag)
    keys = benchrun.Bench.keys_config(fake, args.keys, "inproc")
    admin = 'admin_listen: "127.0.0.1:%d"\n' % fake.admin_port
    text = benchrun.BUSBAR_CONFIG.format(port=port, mock=mock_port) + observe + keys + admin
    os.environ.update(env)
    os.environ.setdefault("BUSBAR_LOG", "WARNING")
    if args.pg_no_reset:
        # An experiment, not busbar's behaviour: asyncpg's pool sends its reset query
        # (pg_advisory_unlock_all, CLOSE ALL, UNLISTEN *, RESET ALL) on every release, one more
        # round trip per admission and per settlement batch; this is what leaving it out saves.
        import asyncpg
        asyncpg.Connection.get_reset_query = lambda self: ""
    config = cfgmod.load(text=text, env=dict(os.environ))
    if args.dilate != 1:
        # Under callgrind a request takes ~50 times as long: periodic work (gauges, the status
        # page's samples, the spend refresh, the usage flush) would be counted 50 times too often.
        from busbar.governance import plane
        from busbar.observability import metrics, routes
        metrics.PUBLISH_SECS *= args.dilate
        routes.SAMPLE_SECS *= args.dilate
        plane.SPEND_REFRESH_SECS *= args.dilate
        if config.governance is not None:
            config.governance.store.flush_secs *= args.dilate

    async def extra(loop):
        async def go():
            try:
                token = None
                if args.keys != "off":
                    token = await mint(loop, fake.admin_port, fake.admin_token)
                if args.opcodes:
                    with Opcodes(args.lines, args.opcodes_all) as counter:
                        await drive(loop, port, args, token)
                    counter.report(args.warm + args.n)
                else:
                    await drive(loop, port, args, token)
            finally:
                if args.dilate != 1:
                    # under callgrind: the measurement is over; leave at once (valgrind writes the
                    # profile at exit). A graceful stop with a Redis store sometimes never ended
                    # there (issue 41's profiling run), and what it would count is the same in the
                    # N and the 2N run anyway.
                    sys.stdout.flush()
                    os._exit(0)
                os.kill(os.getpid(), signal.SIGTERM)
        loop.create_task(go())

    serve(config, workers=1, extra=extra)


class Opcodes:
    """Counts the bytecodes each busbar/ function executes (sys.settrace with opcode events) while
    it is entered: the client's own frames (bench/) are not traced."""

    def __init__(self, lines, everything=False):
        import collections
        self.everything = everything
        self.ours = set()
        self.counts = collections.Counter()
        self.lines = collections.Counter()
        self.want = set(x for x in (lines or "").split(",") if x)

    def _trace(self, frame, event, arg):
        fn = frame.f_code.co_filename
        i = fn.rfind("/busbar/")
        if "/bench/" in fn:
            return None
        if i >= 0:
            key = "%s:%s" % (fn[i + 8:], frame.f_code.co_name)
            self.ours.add(key)
        elif not self.everything:
            return None
        else:
            j = fn.rfind("/site-packages/")
            where = fn[j + 15:] if j >= 0 else "stdlib/" + fn.rsplit("/lib/python3", 1)[-1].split(
                "/", 1)[-1]
            key = "%s:%s" % (where, frame.f_code.co_name)
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        counts, lines, per_line = self.counts, self.lines, key in self.want

        def local(frame, event, arg):
            if event == "opcode":
                counts[key] += 1
                if per_line:
                    lines[(key, frame.f_lineno or 0)] += 1
            return local
        return local

    def __enter__(self):
        sys.settrace(self._trace)
        return self

    def __exit__(self, *exc):
        sys.settrace(None)

    def report(self, requests):
        total = sum(self.counts.values())
        print("inproc: %.0f Python bytecodes per request in %s (%d requests traced)" % (
            total / requests, "busbar/ and the libraries" if self.everything else "busbar/",
            requests))
        if self.everything:
            import collections
            pkg = collections.Counter()
            for key, v in self.counts.items():
                if key in self.ours:
                    pkg["busbar/" + key.split("/", 1)[0].split(":")[0]] += v
                elif key.startswith("stdlib/"):
                    pkg["stdlib/" + key.split("/")[1].split(":")[0]] += v
                else:
                    pkg[key.split("/", 1)[0].split(":")[0]] += v
            print("per package (busbar's by folder, the standard library's by module):")
            for key, v in pkg.most_common(15):
                print("%8.1f  %s" % (v / requests, key))
            print("per function:")
        for key, v in self.counts.most_common():
            if v / requests < 0.5:
                break
            print("%8.1f  %s" % (v / requests, key))
        for (key, line), v in sorted(self.lines.items()):
            print("%8.1f  %s line %d" % (v / requests, key, line))


class _Dir:
    def __init__(self, path):
        self.path = path

    def __truediv__(self, name):
        return os.path.join(self.path, name)


def run_floor(args, mock_port):
    import uvloop
    import floor
    from busbar.upstream.pool import UpstreamPool
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    pool = UpstreamPool(loop, connect_timeout=10, max_idle_per_host=256, idle_timeout=90)
    key = ("http", "127.0.0.1", mock_port)
    host = b"127.0.0.1:%d" % mock_port
    port = procs.free_port()
    server = loop.run_until_complete(loop.create_server(
        lambda: floor.Floor(pool, key, host), "127.0.0.1", port, backlog=4096))
    loop.run_until_complete(drive(loop, port, args, None))
    server.close()
    pool.close()


# How much slower a request runs under callgrind (measured: ~50x); periodic work is spaced out by
# as much there (see run_busbar).
DILATE = 50


def callgrind(args, argv):
    """Instructions per request: N and 2N requests under callgrind, the difference / N."""
    keep = args.keep or tempfile.mkdtemp(prefix="inproc-cg-")
    os.makedirs(keep, exist_ok=True)
    totals = []
    base = [a for a in argv if a != "--callgrind"]
    for tag, n in (("n", args.n), ("2n", 2 * args.n)):
        out = os.path.join(keep, "cg.%s.out" % tag)
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
               sys.executable, os.path.abspath(__file__)] + base + [
            "--n", str(n), "--mock-port", str(args.mock_port), "--dilate", str(DILATE)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        m = re.search(r"Collected : (\d+)", r.stderr)
        if r.returncode != 0 or m is None:
            sys.exit("inproc: callgrind run failed:\n" + r.stdout[-2000:] + r.stderr[-2000:])
        totals.append(int(m.group(1)))
    per = (totals[1] - totals[0]) / args.n
    print("inproc: %s observe=%s keys=%s: %.0f instructions/request (callgrind, (2N - N) / N, "
          "N=%d, client included; files in %s)" % (args.gateway, args.observe, args.keys, per,
                                                   args.n, keep), flush=True)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gateway", choices=("busbar", "floor"), default="busbar")
    ap.add_argument("--observe", choices=("off", "on", "access", "metrics"), default="off")
    ap.add_argument("--keys", choices=("off", "sqlite", "valkey", "postgres"), default="off")
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--warm", type=int, default=2000)
    ap.add_argument("--conns", type=int, default=8)
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--opcodes", action="store_true")
    ap.add_argument("--opcodes-all", action="store_true",
                    help="with --opcodes: every library's frames too, and a total per package")
    ap.add_argument("--lines", help="with --opcodes: FILE:FUNC[,FILE:FUNC] counted per line")
    ap.add_argument("--keep")
    ap.add_argument("--mock-port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--store-url", help=argparse.SUPPRESS)
    ap.add_argument("--pg-no-reset", action="store_true",
                    help="with --keys postgres, an experiment: asyncpg's pool skips its reset query "
                    "on release (what that round trip costs)")
    ap.add_argument("--dilate", type=float, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    mock = None
    if not args.mock_port:
        args.mock_port = procs.free_port()
        mock = start_mock(args.mock_port)
    store = None
    try:
        if args.keys in ("valkey", "postgres") and not args.store_url:
            store, args.store_url = start_store(args.keys)
            argv = argv + ["--store-url", args.store_url]     # for callgrind's runs
        if args.callgrind:
            callgrind(args, argv)
        elif args.gateway == "floor":
            run_floor(args, args.mock_port)
        else:
            run_busbar(args, args.mock_port)
    finally:
        if mock is not None:
            mock.terminate()
            mock.wait()
        if store is not None:
            if args.keys == "valkey":
                server_side(store.port)
            store.close()


def server_side(port):
    """What redis-server itself spent per command over the whole run (INFO commandstats): the
    admission and settlement scripts' time inside Valkey, which no client library can save."""
    import redis
    try:
        stats = redis.Redis(host="127.0.0.1", port=port).info("commandstats")
    except Exception as e:  # the figures are extra; the run's own answer stands
        print("inproc: INFO commandstats failed: %r" % (e,))
        return
    for name, st in sorted(stats.items(), key=lambda kv: -kv[1].get("usec", 0))[:6]:
        print("inproc: redis-server %s: %d calls, %.1f µs per call inside the server" % (
            name.replace("cmdstat_", ""), st.get("calls", 0), st.get("usec_per_call", 0.0)))


def start_store(kind):
    """A loopback redis-server or PostgreSQL for --keys valkey/postgres (the tests' helpers), and
    the URL busbar's store is given: a fresh database of its own."""
    if kind == "valkey":
        from tests.redis_server import RedisServer
        srv = RedisServer().start()
        return srv, srv.url
    from tests.postgres_server import PostgresServer
    srv = PostgresServer().start()
    return srv, srv.create_database("inproc")


if __name__ == "__main__":
    main()
