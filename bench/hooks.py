"""In-process cost of the observability hooks per request (no server, no load generator): the
access log's line (`AccessLog.on_finish`, the loop's share: building and queueing the line), the
metrics' counting (`Metrics.on_finish`, attempts included), and the event hook, on a
RequestRecord and Attempt shaped like a small same-protocol call's (busbar/engine/exchange.py
`record`). The writer thread runs, writing to /dev/null, as in the server; the buffer is emptied
between chunks of calls (untimed), as the thread does every 0.1 s. A tight loop keeps everything in
cache: measured around the same hooks in the server under load, each costs 2-3 times as much.

    .venv/bin/python bench/hooks.py [--n 200000] [--repeat 7]

Prints the best of `repeat` runs of `n` calls, in µs per call (best-of: the machine is shared)."""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from busbar import config as cfgmod  # noqa: E402
from busbar.engine.records import Attempt, RequestRecord  # noqa: E402

CONFIG = """
listen: "127.0.0.1:1"
providers:
  a: {protocol: anthropic, base_url: "http://127.0.0.1:9", api_key: {env: K}}
  o: {protocol: openai, base_url: "http://127.0.0.1:9", api_key: {env: K}}
models:
  ant-model: {provider: a, upstream_model: claude-haiku-4-5}
  oai-model: {provider: o, upstream_model: gpt-4o-mini}
pools:
  mixed: {members: [{model: oai-model}, {model: ant-model}]}
export:
  access: {module: access-log, settings: {path: /dev/null}}
  metrics: {module: prometheus, settings: {buffer_seconds: 60}}
"""


class Site:
    def __init__(self, config):
        from busbar.engine.snapshot import Snapshot
        self.snapshot = Snapshot(config)
        self.gov_spend = None


class Ex:
    __slots__ = ("target",)

    def __init__(self, target):
        self.target = target


def record(snap, i):
    from cbusbar.ir import Usage
    lane = snap.router.lanes["ant-model"]
    a = Attempt(lane, 1000)
    a.t_connected, a.t_headers, a.t_end, a.status = 2000, 150000, 160000, 200
    r = RequestRecord()
    r.request_id = "req_%024x" % i
    r.ingress = r.egress = "anthropic"
    r.target = "ant-model"
    r.attempts = (a,)
    r.lane = "ant-model"
    r.model = "claude-haiku-4-5"
    r.status = 200
    r.outcome = "ok"
    r.usage = Usage(12, 8, 0, 0, 0)
    r.t0, r.t_end = 0, 171000
    r.upstream_ns = 158000
    r.busbar_ns = 13000
    r.bytes_out = 420
    r.client = "127.0.0.1"
    return r, a


# The access log's buffer is emptied (untimed) after each chunk of this many calls, as the writer
# thread does every 0.1 s in the server: without it, a tight loop fills the 16 MiB buffer in a
# fraction of a second and then measures dropping lines, not writing them.
CHUNK = 10000


def timeit(fn, args, n, repeat, between=None):
    best = None
    for _ in range(repeat):
        spent = 0.0
        for i in range(0, n, CHUNK):
            part = args[i:i + CHUNK]
            t0 = time.perf_counter()
            for x in part:
                fn(x)
            spent += time.perf_counter() - t0
            if between is not None:
                between()
        dt = spent / n
        best = dt if best is None or dt < best else best
    return best * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args(argv)
    config = cfgmod.load(text=CONFIG, env={"K": "k" * 24})
    site = Site(config)
    from cbusbar.shared import SharedCounters
    from busbar.observability.access_log import AccessLog
    from busbar.observability.events import LaneEvents
    from busbar.observability.metrics import Layout, Metrics
    layout = Layout(config, 1)
    m = Metrics(layout, SharedCounters(layout.size))
    m.site = site
    log = AccessLog("/dev/null")
    lane_ev = LaneEvents()
    n = args.n
    recs = [record(site.snapshot, i) for i in range(n)]
    target = site.snapshot.router.resolve("ant-model")
    ex = Ex(target)
    rows = [
        ("access log: AccessLog.on_finish", log.on_finish, [r for r, _ in recs]),
        ("metrics: Metrics.on_finish", m.on_finish, [r for r, _ in recs]),
        ("events: LaneEvents.on_attempt", lambda a: lane_ev.on_attempt(ex, a), [a for _, a in recs]),
    ]
    print("observability hooks, µs per call (best of %d × %d calls), %s" % (
        args.repeat, n, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    total = 0.0
    for name, fn, xs in rows:
        us = timeit(fn, xs, n, args.repeat, log.writer.flush if name.startswith("access") else None)
        total += us
        print("  %-34s %6.3f" % (name, us))
    print("  %-34s %6.3f" % ("all of the above", total))
    if log.writer.dropped:
        print("  (the access log dropped %d lines: the figures are not valid)" % log.writer.dropped)
    log.close()


if __name__ == "__main__":
    main()
