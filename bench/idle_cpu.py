"""The CPU an idle gateway burns: busbar (this tree, or --tree's) with the bench's six lanes on the
mock, --workers 1 pinned to one core, serves `--requests` streamed ~1k-token calls on one keep-alive
connection (which it then holds, as SDK clients do), then sits idle for `--secs`; prints the CPU of
each of its threads over the idle window (schedstat's on-CPU ns, per second).

Periodic work in an idle worker (timer sweeps, writer threads, probes) is what this shows; the
bench's streaming rows bill it to each stream, as they pace their requests with idle gaps.

    .venv/bin/python bench/idle_cpu.py                       # the bench's plain config
    .venv/bin/python bench/idle_cpu.py --observe default     # observability left at its defaults
    .venv/bin/python bench/idle_cpu.py --tree bench/.baseline/<sha> --observe absent
"""
from __future__ import annotations

import argparse
import glob
import http.client
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import payloads  # noqa: E402
import procs  # noqa: E402
from run import BUSBAR_CONFIG  # noqa: E402

OBSERVE = {
    "off": payloads.QUIET,
    "on": 'admin_listen: "127.0.0.1:0"\nexport: {access: {module: access-log, settings: {path: '
          '"%(dir)s/access.jsonl"}}, metrics: {module: prometheus, settings: {buffer_seconds: 60}}}\n',
    "default": 'admin_listen: "127.0.0.1:0"\n',
    "absent": "",       # a --tree from before admin_listen and export existed
}


def threads(pid):
    """{(pid, tid): on-CPU ns} of pid and its descendants' threads."""
    out = {}
    for p in procs.descendants(pid):
        for t in glob.glob("/proc/%d/task/*" % p):
            try:
                with open(t + "/schedstat") as f:
                    out[(p, int(t.rsplit("/", 1)[1]))] = int(f.read().split()[0])
            except (OSError, ValueError):
                pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", default=str(ROOT), help="the busbar tree to run (default: this one)")
    ap.add_argument("--observe", choices=sorted(OBSERVE), default="off")
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--secs", type=float, default=10.0)
    ap.add_argument("--core", type=int, default=0)
    args = ap.parse_args()
    py = sys.executable
    d = tempfile.mkdtemp(prefix="busbar-idle-")
    mock_port, port = procs.free_port(), procs.free_port()
    env = dict(os.environ, **payloads.MOCK_ENV, PYTHONPATH=args.tree, BUSBAR_LOG="WARNING",
               NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    cfg = Path(d) / "busbar.yaml"
    cfg.write_text(BUSBAR_CONFIG.format(port=port, mock=mock_port) + OBSERVE[args.observe] % {"dir": d})
    other = 1 - args.core if os.cpu_count() > 1 else args.core
    run = procs.Processes(d)
    try:
        run.start("mock", [py, "-m", "busbar.cli", "mock", "--port", str(mock_port)], other, env,
                  args.tree)
        s = run.start("busbar", [py, "-m", "busbar.cli", "serve", "--config", str(cfg),
                                 "--workers", "1"], args.core, env, args.tree)
        gw = s.proc
        why = procs.wait_http(port, gw, "/healthz", 30)
        if why:
            sys.exit("busbar %s; log: %s" % (why, s.log_tail()))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:      # the mock accepts
            try:
                socket.create_connection(("127.0.0.1", mock_port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        body = payloads.body("openai", "oai-model", 4096, stream=True)
        path = payloads.path("openai", "oai-model", stream=True)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        for _ in range(args.requests):
            c.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            r.read()
            if r.status != 200:
                sys.exit("a request got %d" % r.status)
            time.sleep(0.02)
        time.sleep(1.0)         # the last request's after-work done
        a = threads(gw.pid)
        time.sleep(args.secs)
        b = threads(gw.pid)
        total = 0
        for k in sorted(b):
            us = (b[k] - a.get(k, b[k])) / 1000 / args.secs
            total += us
            print("  pid %d thread %d: %8.1f us/s" % (k[0], k[1], us))
        print("idle CPU (observe=%s, %s): %.1f us/s over %.0f s, holding one keep-alive connection"
              % (args.observe, args.tree, total, args.secs))
    finally:
        run.stop_all()

if __name__ == "__main__":
    main()
