"""Concurrency 1, alone and taking turns: busbar's own time (`Server-Timing: busbar;dur` p50) for
small Anthropic → Anthropic calls sent one at a time, by busbar (this tree) and by --baseline's
tree, each measured alone with the mock (pairs "direct, gateway") and then interleaved request by
request on the same core ("direct, busbar, baseline"), as bench/run.py's concurrency-1 rows do.

What it separates: the work of a request (alone, each gateway's caches hold what it touched on the
previous request) from what the request pays when another process ran on its core in between and
evicted it (the footprint of its code and data).

    .venv/bin/python bench/c1_isolation.py --baseline 85eaf0e [--n 800]

The baseline tree is the one bench/run.py --baseline built (bench/.baseline/<sha>).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

import baseline  # noqa: E402
import payloads  # noqa: E402
import procs  # noqa: E402
import ttfb  # noqa: E402
from run import BUSBAR_CONFIG, _server_timing_ms  # noqa: E402

OWN = 'admin_listen: "127.0.0.1:0"\nobservability: {access_log: off, metrics: false}\n'


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, metavar="REF")
    ap.add_argument("--n", type=int, default=800, help="requests per gateway and round")
    args = ap.parse_args()
    py = sys.executable
    d = Path(tempfile.mkdtemp(prefix="busbar-c1-"))
    base_tree = baseline.prepare(args.baseline, py, d).tree
    env = dict(os.environ, BENCH_MOCK_KEY="sk-bench-upstream", BUSBAR_LOG="WARNING",
               BENCH_MOCK_AWS="AKIDBENCHEXAMPLE:benchSecretKeyExample0123456789abcdefXYZ",
               NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    mock_port = procs.free_port()
    run = procs.Processes(str(d))
    try:
        run.start("mock", [py, "-m", "busbar.cli", "mock", "--port", str(mock_port)], 1,
                  dict(env, PYTHONPATH=str(ROOT)), str(ROOT))
        ports = {"direct": mock_port}
        for name, tree, extra in (("busbar", ROOT, OWN), ("baseline", Path(base_tree), None)):
            port = procs.free_port()
            cfg = d / ("%s.yaml" % name)
            text = BUSBAR_CONFIG.format(port=port, mock=mock_port)
            cfg.write_text(text + (extra or ""))
            s = run.start(name, [py, "-m", "busbar.cli", "serve", "--config", str(cfg), "--workers",
                                 "1"], 0, dict(env, PYTHONPATH=str(tree)), str(tree))
            why = procs.wait_http(port, s.proc, "/healthz", 30)
            if why:
                sys.exit("%s %s; log: %s" % (name, why, s.log_tail()))
            ports[name] = port
        hdr = {"content-type": "application/json", "x-api-key": "sk-bench-upstream",
               "anthropic-version": "2023-06-01"}

        def target(name):
            model = "claude-haiku-4-5" if name == "direct" else "ant-model"
            return (ports[name], payloads.path("anthropic", model), hdr,
                    payloads.body("anthropic", model, 100))

        def round_(names):
            samples, errors = ttfb.measure({nm: target(nm) for nm in names}, args.n, warmup=50,
                                           after_each=lambda nm: time.sleep(0.002))
            if errors:
                sys.exit("errors: %s" % errors)
            out = {}
            for nm in names[1:]:
                dur = [_server_timing_ms(x[3]) * 1000 for x in samples[nm] if x[3]]
                out[nm] = statistics.median(dur)
            return out

        print("busbar;dur p50 (µs), small Anthropic → Anthropic, concurrency 1, %d requests each; "
              "busbar = this tree, baseline = %s" % (args.n, args.baseline))
        for names in (["direct", "busbar"], ["direct", "baseline"],
                      ["direct", "busbar", "baseline"],
                      ["direct", "busbar"], ["direct", "baseline"]):
            r = round_(names)
            print("  %-32s %s" % (" + ".join(names[1:]) + (" (taking turns)" if len(names) > 2
                                                            else " (alone)"),
                                  ", ".join("%s %.1f" % kv for kv in r.items())))
    finally:
        run.stop_all()


if __name__ == "__main__":
    main()
