"""Concurrency 1, alone and taking turns: busbar's own time (`Server-Timing: busbar;dur` p50) for
small Anthropic → Anthropic calls sent one at a time, by busbar (this tree) and by --baseline's
tree, each measured alone with the mock (pairs "direct, gateway") and then interleaved request by
request on the same core ("direct, busbar, baseline"), as bench/run.py's concurrency-1 rows do.

What it separates: the work of a request (alone, each gateway's caches hold what it touched on the
previous request) from what the request pays when another process ran on its core in between and
evicted it (the footprint of its code and data).

    .venv/bin/python bench/c1_isolation.py --baseline 85eaf0e [--n 800] [--case small|stream]
                                           [--gap-ms 2] [--turns 6] [--also NAME=DIR ...]

--case stream: OpenAI → OpenAI streamed, ~1k tokens (bench/run.py's stream TTFB row), where
busbar;dur is the time to the answer's head. --gap-ms: the pause after each request (run.py waits
until the gateway and the mock have been idle 5 ms; the longer the pause, the colder the caches).
--footprint: instead of timing, the memory each gateway touches to serve one request on a
keep-alive connection, in KiB of pages (the kernel's referenced bits: /proc/PID/clear_refs, one
request, the `Referenced:` of /proc/PID/smaps), summed by mapping (each extension module's code and
data, the heap, libpython...): what a request finds cold after idle, page by page.

--also NAME=DIR: another tree, built already (a variant of this one: another build of it, an earlier
commit), started as one more gateway and taking turns with the others; --turns K repeats the
taking-turns round K times, the gateways' order reversed every other round, and prints each
gateway's gap to the baseline round by round (the machine's state drifts between rounds; within
one round every gateway sees the same).

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, metavar="REF")
    ap.add_argument("--n", type=int, default=800, help="requests per gateway and round")
    ap.add_argument("--case", choices=("small", "stream"), default="small")
    ap.add_argument("--gap-ms", type=float, default=2.0, help="pause after each request")
    ap.add_argument("--footprint", action="store_true", help="pages touched per request instead")
    ap.add_argument("--also", action="append", default=[], metavar="NAME=DIR",
                    help="another tree, built already (a variant of this one), taking turns too")
    ap.add_argument("--turns", type=int, default=1, metavar="K",
                    help="taking-turns rounds (the order of the gateways reversed every other one)")
    args = ap.parse_args()
    py = sys.executable
    d = Path(tempfile.mkdtemp(prefix="busbar-c1-"))
    base_tree = baseline.prepare(args.baseline, py, d).tree
    env = dict(os.environ, **payloads.MOCK_ENV, BUSBAR_LOG="WARNING", NO_PROXY="127.0.0.1",
               no_proxy="127.0.0.1")
    mock_port = procs.free_port()
    run = procs.Processes(str(d))
    try:
        run.start("mock", [py, "-m", "busbar.cli", "mock", "--port", str(mock_port)], 1,
                  dict(env, PYTHONPATH=str(ROOT)), str(ROOT))
        ports = {"direct": mock_port}
        pids = {}
        also = [tuple(a.split("=", 1)) for a in args.also]
        also_names = [a[0] for a in also]
        if (any(len(a) != 2 or a[0] in ("", "direct", "busbar", "baseline") for a in also)
                or len(set(also_names)) != len(also_names)):
            sys.exit("--also NAME=DIR: NAME not empty, not direct, busbar or baseline, each once")
        trees = [("busbar", ROOT, payloads.QUIET)] + [(n, Path(t).resolve(), payloads.QUIET)
                                                       for n, t in also]
        for name, tree, extra in trees + [("baseline", Path(base_tree), None)]:
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
            pids[name] = s.proc.pid     # --workers 1 serves in this process (no fork)
        if args.case == "stream":
            proto, direct_model, lane, size, what = (
                "openai", "gpt-4o-mini", "oai-model", 4096, "streamed OpenAI → OpenAI, ~1k tok")
        else:
            proto, direct_model, lane, size, what = (
                "anthropic", "claude-haiku-4-5", "ant-model", 100, "small Anthropic → Anthropic")
        stream = args.case == "stream"
        hdr = payloads.headers(proto)

        def target(name):
            model = direct_model if name == "direct" else lane
            return (ports[name], payloads.path(proto, model, stream=stream), hdr,
                    payloads.body(proto, model, size, stream=stream))

        def round_(names):
            samples, errors = ttfb.measure({nm: target(nm) for nm in names}, args.n, warmup=50,
                                           after_each=lambda nm: time.sleep(args.gap_ms / 1000))
            if errors:
                sys.exit("errors: %s" % errors)
            out = {}
            for nm in names[1:]:
                dur = [_server_timing_ms(x[3]) * 1000 for x in samples[nm] if x[3]]
                out[nm] = statistics.median(dur)
            return out

        gateways = [t[0] for t in trees] + ["baseline"]
        if args.footprint:
            for name in gateways:
                kib, by = footprint(pids[name], target(name), min(args.n, 50))
                print("%s: %.0f KiB of pages touched per request, %s; by mapping (KiB): %s" % (
                    name, kib, what, ", ".join("%s %.0f" % kv for kv in by[:14])))
            return
        print("busbar;dur p50 (µs), %s, concurrency 1, %d requests each, %.0f ms apart; "
              "busbar = this tree, baseline = %s%s" % (
                  what, args.n, args.gap_ms, args.baseline,
                  "".join(", %s = %s" % a for a in also)))
        turns = [["direct"] + (gateways if k % 2 == 0 else gateways[::-1])
                 for k in range(max(args.turns, 1))]
        rounds = [["direct", "busbar"], ["direct", "baseline"]] + turns + [
            ["direct", "busbar"], ["direct", "baseline"]]
        taking = {}
        for names in rounds:
            r = round_(names)
            if len(names) > 2:
                for nm in gateways:
                    taking.setdefault(nm, []).append(r[nm])
            print("  %-32s %s" % (" + ".join(names[1:]) + (" (taking turns)" if len(names) > 2
                                                            else " (alone)"),
                                  ", ".join("%s %.1f" % (nm, r[nm]) for nm in gateways
                                            if nm in r)))
        if len(turns) > 1:
            print("  taking turns, median of %d rounds: %s" % (len(turns), ", ".join(
                "%s %.1f" % (nm, statistics.median(v)) for nm, v in taking.items())))
            for nm in gateways[:-1]:
                print("  %s - baseline, each round: %s" % (nm, " ".join(
                    "%+.1f" % (a - b) for a, b in zip(taking[nm], taking["baseline"]))))
    finally:
        run.stop_all()


def _referenced(pid):
    """KiB of pages referenced since the last clear_refs, by mapping name (file name or [anon])."""
    out, cur = {}, None
    with open("/proc/%d/smaps" % pid) as f:
        for line in f:
            head = line.split(None, 6)
            if "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                cur = head[5].strip().rsplit("/", 1)[-1] if len(head) > 5 else "[anon]"
            elif line.startswith("Referenced:"):
                out[cur] = out.get(cur, 0) + int(line.split()[1])
    return out


def footprint(pid, target, n):
    """(mean KiB touched per request, [(mapping, KiB)] largest first) over n requests on one
    keep-alive connection, after 200 warm-up requests on it."""
    port, path, headers, template = target
    conn = ttfb._Conn(port)
    seq = 0

    def one():
        nonlocal seq
        seq += 1
        conn.request(ttfb._request_bytes(port, path, headers,
                                         template.replace(b"@SEQ@", b"f%d" % seq)))
    for _ in range(200):
        one()
    total = {}
    for _ in range(n):
        with open("/proc/%d/clear_refs" % pid, "w") as f:
            f.write("1")
        time.sleep(0.01)
        one()
        for k, v in _referenced(pid).items():
            total[k] = total.get(k, 0) + v
    by = sorted(((k, v / n) for k, v in total.items()), key=lambda kv: -kv[1])
    return sum(v for _, v in by), by


if __name__ == "__main__":
    main()
