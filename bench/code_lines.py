"""The code one request runs, by cache line and page: each gateway (this tree, and --baseline's)
serves N calls of one case under callgrind, and the distinct instruction addresses those calls ran
are counted in 64-byte lines and 4 KiB pages, per mapping (libpython, the extension, uvloop, ...)
and per function of the project's own extension.

    .venv/bin/python bench/code_lines.py [--baseline 85eaf0e] [--proto anthropic] [--size 100]
                                         [--stream] [--n 50] [--top 20]

Why lines and not instructions: at concurrency 1 a request finds its code cold whenever another
process ran on its core in between, and pays for every cache line and page of it (docs/performance.md,
"Issue #13: what stands in the way"); a compiled function costs lines of its own,
where bytecode ran through interpreter code every request keeps warm. callgrind counts the same
for the same binary and inputs whatever else the machine does, so two builds compare exactly.

The gateway runs under `valgrind --tool=callgrind --instr-atstart=no --dump-instr=yes`; 300 calls
warm it up on one keep-alive connection, then `callgrind_control -i on`, N calls, `-i off`. The
mock runs natively. Work that runs now and then rather than per call (a garbage collection, the
deadline wheel's 1 s prune) falls into some runs and not others: totals move by up to ~8 % from
run to run (2,234-2,359 lines on the small call, 3,599-3,873 on Bedrock ~1k), the functions of
the request path not at all. --proto picks the request protocol and its same-protocol lane (bench/payloads.py);
--size the body's target bytes (100 small, 4096 ~1k tokens); --stream asks for a streamed answer
(the same-protocol relay: bench/run.py's stream rows).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
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

LINE, PAGE = 6, 12      # log2 of a cache line's and a page's bytes
WARM = 300


def parse(path):
    """callgrind output with --dump-instr=yes -> {(object, function): {instruction address: times
    it ran}}. Handles name compression ("(id) name", then "(id)") and relative positions ("+N",
    "-N", "*"); the cost line after a `calls=` line is the call's inclusive cost at its call site,
    so it adds the address but not its count."""
    names = {}
    out = collections.defaultdict(lambda: collections.defaultdict(int))
    ob = fn = None
    last = 0
    npos = 1
    after_call = False

    def name(kind, text):
        m = re.match(r"\((\d+)\)(?: (.*))?$", text)
        if not m:
            return text
        if m.group(2) is not None:
            names[(kind, m.group(1))] = m.group(2)
        return names.get((kind, m.group(1)), "?")
    with open(path) as f:
        for line in f:
            if line.startswith("positions:"):
                npos = len(line.split()) - 1
            elif line.startswith("calls="):
                after_call = True
            elif line.startswith("ob="):
                ob = name("ob", line[3:].rstrip("\n"))
            elif line.startswith("fn="):
                fn = name("fn", line[3:].rstrip("\n"))
            elif line.startswith("cob="):
                name("ob", line[4:].rstrip("\n"))
            elif line.startswith("cfn="):
                name("fn", line[4:].rstrip("\n"))
            elif line[:1] in "0123456789+-*" and ob is not None:
                toks = line.split()
                tok = toks[0]
                if tok == "*":
                    a = last
                elif tok[0] == "+":
                    a = last + int(tok[1:], 0)
                elif tok[0] == "-":
                    a = last - int(tok[1:], 0)
                else:
                    a = int(tok, 0)
                last = a
                ran = out[(ob, fn)]
                if after_call:
                    after_call = False
                    ran[a] += 0
                else:
                    ran[a] += int(toks[npos]) if len(toks) > npos else 0
    return out


def summarise(ran, own):
    """(per mapping: [(name, lines, pages)] most lines first, per function of a mapping whose path
    starts with `own` (the tree's extensions): [(name, lines, distinct instructions, instructions
    run)] most lines first, total lines, total pages)."""
    lines, pages = collections.defaultdict(set), collections.defaultdict(set)
    funcs = []
    for (ob, fn), counts in ran.items():
        own_lines = {a >> LINE for a in counts}
        short = ob.rsplit("/", 1)[-1]
        lines[short] |= own_lines
        pages[short].update(a >> PAGE for a in counts)
        if ob.startswith(own) and "/site-packages/" not in ob:     # not the venv's packages
            funcs.append((fn, len(own_lines), len(counts), sum(counts.values())))
    by = sorted(((k, len(v), len(pages[k])) for k, v in lines.items()), key=lambda r: -r[1])
    funcs.sort(key=lambda r: -r[1])
    return by, funcs, sum(r[1] for r in by), sum(r[2] for r in by)


def measure(name, tree, extra, proto, size, n, d, py, env, stream=False):
    """Runs one gateway under callgrind for `n` calls; the parsed output."""
    mock_port, port = procs.free_port(), procs.free_port()
    cfg = d / ("%s.yaml" % name)
    cfg.write_text(payloads.GATEWAY_CONFIG.format(port=port, mock=mock_port) + (extra or ""))
    out = d / ("callgrind.%s" % name)
    run = procs.Processes(str(d))
    try:
        run.start(name + "-mock", [py, "-m", "busbar.cli", "mock", "--port", str(mock_port)], 1,
                  dict(env, PYTHONPATH=str(ROOT)), str(ROOT))
        s = run.start(name, ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                             "--dump-instr=yes", "--callgrind-out-file=%s" % out, py, "-m",
                             "busbar.cli", "serve", "--config", str(cfg), "--workers", "1"], 0,
                      dict(env, PYTHONPATH=str(tree)), str(tree))
        why = procs.wait_http(port, s.proc, "/healthz", 300)
        if why:
            sys.exit("%s %s; log: %s" % (name, why, s.log_tail()))
        lane = payloads.LANES[proto]
        hdr = payloads.headers(proto)
        template = payloads.body(proto, lane, size, stream=stream)
        path = payloads.path(proto, lane, stream=stream)
        conn = ttfb._Conn(port)
        conn.sock.settimeout(60)

        def call(i):
            r = conn.request(ttfb._request_bytes(port, path, hdr,
                                                 template.replace(b"@SEQ@", b"cl%d" % i)))
            if r[2] != 200:
                sys.exit("%s answered %d: %r" % (name, r[2], r[4]))
        for i in range(WARM):
            call(i)
        ctl = ["callgrind_control", "-i"]
        subprocess.run(ctl + ["on", str(s.proc.pid)], check=True, timeout=60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for i in range(n):
            call(WARM + i)
        subprocess.run(ctl + ["off", str(s.proc.pid)], check=True, timeout=60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        conn.close()
        run.stop(s, timeout=60)     # callgrind writes its file at exit
    finally:
        run.stop_all()
    if not out.exists():
        sys.exit("%s: callgrind wrote no %s" % (name, out))
    return parse(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", metavar="REF", help="also an older busbar (bench/baseline.py)")
    ap.add_argument("--proto", choices=sorted(payloads.LANES), default="anthropic")
    ap.add_argument("--size", type=int, default=100, help="the body's target bytes")
    ap.add_argument("--stream", action="store_true", help="streamed calls")
    ap.add_argument("--n", type=int, default=50, help="calls counted")
    ap.add_argument("--top", type=int, default=20, help="own functions listed")
    args = ap.parse_args()
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            sys.exit("%s is missing (Debian's valgrind package)" % tool)
    py = sys.executable
    d = Path(tempfile.mkdtemp(prefix="busbar-lines-"))
    env = dict(os.environ, **payloads.MOCK_ENV, BUSBAR_LOG="WARNING", NO_PROXY="127.0.0.1",
               no_proxy="127.0.0.1")
    trees = [("busbar", ROOT, payloads.QUIET)]
    if args.baseline:
        trees.append(("baseline", Path(baseline.prepare(args.baseline, py, d).tree), None))
    print("code run by %d %scalls, %s → %s, ~%d B bodies, one keep-alive connection, after %d "
          "(distinct instruction addresses; lines of 64 B, pages of 4 KiB), per call:" % (
              args.n, "streamed " if args.stream else "", args.proto, args.proto, args.size, WARM))
    for name, tree, extra in trees:
        t0 = time.monotonic()
        by, funcs, lines, pages = summarise(measure(name, tree, extra, args.proto, args.size,
                                                    args.n, d, py, env, args.stream),
                                               str(tree) + os.sep)
        print("%s (%s, %.0f s): %d lines (%d KiB) in %d pages" % (
            name, tree, time.monotonic() - t0, lines, lines * 64 // 1024, pages))
        for m, nl, np_ in by[:10]:
            print("  %-48s %5d lines %4d pages" % (m, nl, np_))
        if funcs:
            print("  the tree's own extensions, functions with the most lines (lines, distinct "
                  "instructions, instructions run per call):")
            for fn, nl, ni, ir in funcs[:args.top]:
                print("    %4d %5d %7.0f  %s" % (nl, ni, ir / args.n,
                                            re.sub(r"\.lto_priv\.\d+|__pyx_", "", fn)[:100]))


if __name__ == "__main__":
    main()
