"""Where a relayed stream's time to first byte goes, per gateway tree: the medians (and p90) of the
phases recorded by the A/B probe in bench/ab/trace-stream.patch (this tree) and
bench/ab/trace-stream-85eaf0e.patch (the baseline), one file per gateway process.

    git apply bench/ab/trace-stream.patch && make build
    BUSBAR_TRACE=/tmp/tr/t .venv/bin/python bench/run.py --baseline 85eaf0e \\
        --baseline-patch bench/ab/trace-stream-85eaf0e.patch \\
        --no-c1 --no-scaling --no-features --only anthropic-anthropic-100
    .venv/bin/python bench/stream_phases.py /tmp/tr/t.*
    git apply -R bench/ab/trace-stream.patch && make build

Phases (µs): request = request start -> upstream send (busbar's own work before the upstream);
upstream = send -> the upstream's head parsed; head-body = head -> first body chunk in the
exchange; first write = first body chunk -> first client write returned (what the relay does to
the chunk before its first byte leaves); total = request start -> first write.
"""
from __future__ import annotations

import statistics
import sys


def phases(path):
    rows = [[int(x) for x in line.split()] for line in open(path) if line.strip()]
    out = {"request": [], "upstream": [], "head-body": [], "first write": [], "total": []}
    for t0, t_send, rtt, b1, w1 in rows:
        if not w1:
            continue
        out["request"].append(t_send - t0)
        out["upstream"].append(rtt)
        out["head-body"].append(b1 - t_send - rtt)
        out["first write"].append(w1 - b1)
        out["total"].append(w1 - t0)
    return out


def main(paths):
    if not paths:
        print(__doc__)
        return 2
    for path in paths:
        ph = phases(path)
        n = len(ph["total"])
        if not n:
            print("%s: no stream recorded" % path)
            continue
        cells = []
        for name, xs in ph.items():
            xs = sorted(xs)
            cells.append("%s %.1f (p90 %.1f)" % (name, statistics.median(xs) / 1000,
                                                 xs[int(0.9 * (n - 1))] / 1000))
        print("%s: %d streams; %s" % (path, n, "; ".join(cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
