"""Anthropic → OpenAI Chat translation, the engine's own calls, per body size: a profiling driver.

Runs exactly what busbar/engine/exchange.py runs on a cross-protocol hop (busbar/engine/translate.py),
on the bench's bodies (bench/payloads.py, the same three sizes as bench/run.py) and the mock's own
answers (busbar/mock, built in-process: the same bytes `busbar.cli mock` sends, no network):

  scan      framing.scan_top(body, anthropic.SCAN_KEYS): the one scan every request gets first
            (exchange.chat: model, stream and output cap spans), same-protocol or not
  request   ClientRequest(anthropic, body) + write_request(cr, openai, ...)      (the upstream body)
  response  translate_response(openai, anthropic, <mock chat.completion body>, ...)
  stream    StreamTranslation(openai, anthropic, ...) fed the mock's whole SSE answer (with the
            usage chunk busbar asks for) as one upstream read, then close()

Usage:
  python bench/translate_profile.py                  µs per call, timeit median of 7 repeats
  python bench/translate_profile.py --callgrind      instructions per call: each case runs under
        callgrind twice (N and 2N calls) and the difference / N is printed, so interpreter start,
        imports and set-up cancel out (repeatable on a busy machine, unlike wall clock)
  python bench/translate_profile.py --case request-32768 --iters 200
        one case, N calls, prints nothing: run it under valgrind yourself for callgrind_annotate:
        valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.out python bench/translate_profile.py \
            --case request-32768 --iters 200 && callgrind_annotate /tmp/cg.out | head -60
  python bench/translate_profile.py --dump DIR       write every case's output bytes to DIR (to
        compare two builds byte for byte)

Cases are <step>-<size>, step one of scan, request, request_stream (the streamed request's body),
response, stream; size one of 100, 4096, 32768 (bench/run.py's ~8, ~1k and ~12k tokens).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import orjson  # noqa: E402

from bench import payloads  # noqa: E402
from busbar.engine.translate import (  # noqa: E402
    CODECS, ClientRequest, StreamTranslation, translate_response, write_request)
from busbar.mock import answer as mock_answer  # noqa: E402
from cbusbar.framing import scan_top  # noqa: E402
from busbar.mock import dialects as mock_dialects  # noqa: E402

SIZES = (100, 4096, 32768)
STEPS = ("scan", "request", "request_stream", "response", "stream")
CLIENT_MODEL = "oai-model"          # the name the client asks for (bench/run.py's lane)
WIRE_MODEL = "gpt-4o-mini"          # the lane's upstream model
DEFAULT_MAX_TOKENS = 4096


def _mock_answer(upstream_body: bytes, stream: bool) -> bytes:
    """The mock's OpenAI answer to `upstream_body` (busbar/mock/server.py's steps, minus HTTP)."""
    dialect = mock_dialects.OpenAIChat()
    ask = dialect.read(orjson.loads(upstream_body), None)
    plan = mock_answer.plan(ask, mock_answer.read_directives({}, upstream_body), len(upstream_body), "")
    rid = "0123456789abcdef00000001"
    if not stream:
        return dialect.body(ask, plan, rid)
    return b"".join(dialect.frames(ask, plan, rid))


def make_case(step: str, size: int):
    """A no-argument callable running one engine step, the same work every call."""
    ant, oai = CODECS["anthropic"], CODECS["openai"]
    stream = step in ("request_stream", "stream")
    body = payloads.body("anthropic", CLIENT_MODEL, size, stream=stream).replace(
        payloads.MARK.encode(), b"1x1")
    cr = ClientRequest(ant, body)
    upstream, forced = write_request(cr, oai, WIRE_MODEL, stream, False, DEFAULT_MAX_TOKENS)

    if step == "scan":
        keys = ant.SCAN_KEYS

        def run():
            scan_top(body, keys)
            return b""
    elif step in ("request", "request_stream"):
        def run():
            c = ClientRequest(ant, body)
            return write_request(c, oai, WIRE_MODEL, stream, False, DEFAULT_MAX_TOKENS)[0]
    elif step == "response":
        answer = _mock_answer(upstream, False)

        def run():
            return translate_response(oai, ant, answer, forced, "msg_golden", WIRE_MODEL)[0]
    elif step == "stream":
        answer = _mock_answer(upstream, True)
        usage = cr.stream_usage

        def run():
            tx = StreamTranslation(oai, ant, "msg_golden", WIRE_MODEL, forced, usage, False)
            return tx.feed(answer) + tx.close()
    else:
        raise SystemExit("unknown step %r" % step)
    return run


def _cases(selected):
    out = []
    for step in STEPS:
        for size in SIZES:
            name = "%s-%d" % (step, size)
            if not selected or any(s in name for s in selected):
                out.append((name, step, size))
    return out


def _callgrind_ir(name: str, iters: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
                        sys.executable, os.path.abspath(__file__), "--case", name,
                        "--iters", str(iters)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, PYTHONHASHSEED="0"))   # the same dict layouts each run
        with open(out) as f:
            text = f.read()
    m = re.search(r"^(?:summary|totals): (\d+)", text, re.M)
    return int(m.group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--callgrind", action="store_true", help="instructions per call, via valgrind")
    ap.add_argument("--case", help="run one case --iters times, print nothing (for valgrind)")
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("--dump", metavar="DIR", help="write each case's output to DIR/<case>.out")
    ap.add_argument("only", nargs="*", help="substrings of the case names to run (default: all)")
    args = ap.parse_args()

    if args.case:
        step, size = args.case.rsplit("-", 1)
        run = make_case(step, int(size))
        for _ in range(args.iters):
            run()
        return

    cases = _cases(args.only)
    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        for name, step, size in cases:
            with open(os.path.join(args.dump, name + ".out"), "wb") as f:
                f.write(make_case(step, size)())
        return

    if args.callgrind:
        print("%-22s %14s" % ("case", "Ir/call"))
        for name, _step, size in cases:
            n = 100 if size < 32768 else 40
            a = _callgrind_ir(name, n)
            b = _callgrind_ir(name, 2 * n)
            print("%-22s %14d" % (name, round((b - a) / n)), flush=True)
        return

    print("%-22s %10s %10s" % ("case", "µs median", "µs min"))
    for name, step, size in cases:
        run = make_case(step, size)
        number = max(50, 20000 // (1 + size // 256))
        times = timeit.repeat(run, number=number, repeat=7)
        per = sorted(t / number * 1e6 for t in times)
        print("%-22s %10.2f %10.2f" % (name, per[3], per[0]), flush=True)


if __name__ == "__main__":
    main()
