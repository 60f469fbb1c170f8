"""Streamed time to first byte of several built busbar trees side by side, in the conditions of
bench/run.py's stream rows (a cold start each time: 5 ms of quiet before every request), without
the rest of the grid: for a before/after of one change to the relay's first-byte path, where a
run.py run puts only one busbar and one baseline in a row and moves by more than the change.

    cp -a busbar cbusbar /tmp/before/       # a built tree, before the change
    make build                              # the change
    .venv/bin/python bench/stream_ab.py before=/tmp/before now=. \\
        old=bench/.baseline/<sha> [--n 300] [--rounds 3] [--proto openai] [--lane anthropic]
        [--access-log] [--buffered]

Each NAME=TREE is a tree with built extensions, started with PYTHONPATH on it (as run.py does for
--baseline). The mock (--require-auth) and this client share core 1, the gateways core 0, as in
run.py. Per round: N streamed same-protocol requests (~1k-token body, bench/payloads.py) to each
target, interleaved with direct and in balanced orders behind it (bench/ttfb.py), waiting until the gateway
and the mock are idle for 5 ms after each; printed: direct's median TTFB, and per tree the median
of its paired differences to direct and its median busbar;dur (µs). --access-log gives each busbar
an access log file (a reader of usage: the OpenAI relay then asks the upstream for it); trees
without busbar/admin (older than the admin listener) get the config without that section.

--buffered: buffered calls of the same body instead, in run.py's concurrency-1 conditions (1 ms
of quiet after each request; the time is to the answer's first body byte, its only segment).

Two copies of one tree differ here by up to ~5 µs (3 x 300 streams); a run.py stream row by more.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import payloads  # noqa: E402
import procs  # noqa: E402
import ttfb  # noqa: E402
from run import _server_timing_ms  # noqa: E402

PY = sys.executable


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trees", nargs="+", metavar="NAME=TREE")
    ap.add_argument("--n", type=int, default=300, help="streams per target per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--proto", choices=sorted(payloads.LANES), default="openai")
    ap.add_argument("--access-log", action="store_true", help="each busbar writes an access log")
    ap.add_argument("--lane", choices=sorted(payloads.LANES),
                    help="the lane's protocol, when not --proto's own (a translated case)")
    ap.add_argument("--buffered", action="store_true",
                    help="buffered calls instead (run.py's concurrency-1 rows: 1 ms of quiet)")
    args = ap.parse_args(argv)
    trees = []
    for spec in args.trees:
        name, sep, tree = spec.partition("=")
        if not sep or not name or name == "direct":
            ap.error("expected NAME=TREE, got %r" % spec)
        tree = Path(tree).resolve()
        if not (tree / "busbar").is_dir() or not (tree / "cbusbar").is_dir():
            ap.error("%s: no busbar/ and cbusbar/ there" % tree)
        trees.append((name, tree))
    d = Path(tempfile.mkdtemp(prefix="stream-ab-"))
    ok = False
    run = procs.Processes(str(d))
    os.sched_setaffinity(0, {1})
    env = dict(os.environ, **payloads.MOCK_ENV)
    try:
        mport = procs.free_port()
        mock = run.start("mock", [PY, "-m", "busbar.cli", "mock", "--port", str(mport),
                                  "--require-auth"], 1, dict(env, PYTHONPATH=str(ROOT)), str(ROOT))
        why = procs.wait_http(mport, mock.proc, "/healthz", 30)
        if why:
            sys.exit("mock %s; log: %s" % (why, mock.log_tail()))
        lane = payloads.LANES[args.lane or args.proto]
        body = payloads.body(args.proto, lane, 4096, stream=not args.buffered)
        path = payloads.path(args.proto, lane, stream=not args.buffered)
        hdr = payloads.headers(args.proto)
        targets = {"direct": (mport, path, hdr, body)}
        started = {"direct": mock}
        for name, tree in trees:
            port = procs.free_port()
            extra = payloads.QUIET if (tree / "busbar" / "admin").is_dir() else ""
            if args.access_log:
                extra = extra.replace("access_log: off", "access_log: \"%s\"" % (d / ("access-%s.jsonl" % name)))
            cfg = d / ("%s.yaml" % name)
            cfg.write_text(payloads.GATEWAY_CONFIG.format(port=port, mock=mport) + extra)
            s = run.start(name, [PY, "-m", "busbar.cli", "serve", "--config", str(cfg),
                                 "--workers", "1"], 0, dict(env, PYTHONPATH=str(tree)), str(tree))
            why = procs.wait_http(port, s.proc, "/healthz", 30)
            if why:
                sys.exit("%s %s; log: %s" % (name, why, s.log_tail()))
            targets[name] = (port, path, hdr, body)
            started[name] = s

        window, bound = (0.001, 0.05) if args.buffered else (0.005, 0.5)   # as run.py's rows

        def quiet(name):
            procs.wait_idle([started[name], mock], window=window, bound=bound)

        diffs = {name: [] for name, _ in trees}
        for r in range(args.rounds):
            out, errors = ttfb.measure(targets, args.n, warmup=5, after_each=quiet, rotate=True)
            if errors:
                sys.exit("round %d: %s" % (r, errors))
            cells = ["round %d: direct %.0f" % (r, statistics.median(s[0] for s in out["direct"]) / 1000)]
            for name in diffs:
                bad = [s for s in out[name] if not 200 <= s[2] < 300]
                if bad:
                    sys.exit("%s answered %d: %r" % (name, bad[0][2], bad[0][4]))
                ds = [a[0] - b[0] for a, b in zip(out[name], out["direct"])]
                diffs[name] += ds
                durs = [_server_timing_ms(s[3]) * 1000 for s in out[name] if s[3]]
                cells.append("%s +%.0f (dur %.0f)" % (name, statistics.median(ds) / 1000,
                                                       statistics.median(durs) if durs else -1))
            print("  ".join(cells), flush=True)
        print("all rounds, TTFB over direct (median µs): " + "  ".join(
            "%s +%.1f" % (name, statistics.median(v) / 1000) for name, v in diffs.items()))
        ok = True
    finally:
        run.stop_all()
    if ok:
        shutil.rmtree(d, ignore_errors=True)    # kept, with the logs, when a run fails


if __name__ == "__main__":
    main()
