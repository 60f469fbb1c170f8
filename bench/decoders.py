"""The codecs' per-stream and per-refusal calls, each protocol alone: a timing driver for changes to
the stream decoders' feed/close loops and the error tables (cbusbar/proto/_common).

Each `stream-<protocol>` case feeds the mock's streamed answer (busbar/mock's own dialect, built
in-process: the bytes `busbar.cli mock` sends for `--tokens` words) to a fresh
`<codec>.StreamDecoder()`, one upstream read per frame as the mock writes them, then close();
`tap-openai` does the same through openai.StreamTap (the same-protocol relay's reader). `own_error`
is one `own_error("authentication")` of every codec; `error_detail` one `read_error_detail` of an
upstream error body in every codec's shape; `discovery` the four questions the engine asks a codec
per request (forced_tool_name, wants_stream_usage, stream_usage_request, response_headers) of
every codec.

Usage:
  python bench/decoders.py                  µs per call, min (and median) of 7 timeit repeats
  python bench/decoders.py --callgrind      instructions per call: each case runs under callgrind
        with N and 2N calls, the difference / N printed (start-up and set-up cancel out)
  python bench/decoders.py stream-openai    only the cases whose names contain an argument
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import timeit
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import orjson  # noqa: E402

from busbar.mock import answer as mock_answer  # noqa: E402
from busbar.mock import dialects as mock_dialects  # noqa: E402
from cbusbar.proto import codec  # noqa: E402

DIALECTS = {"openai": mock_dialects.OpenAIChat, "responses": mock_dialects.OpenAIResponses,
            "anthropic": mock_dialects.Anthropic, "gemini": mock_dialects.Gemini,
            "cohere": mock_dialects.Cohere, "bedrock": mock_dialects.Bedrock}
# A request each mock dialect reads (the answer depends only on the directives).
ASKS = {
    "openai": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
    "responses": {"model": "m", "input": "hi", "stream": True},
    "anthropic": {"model": "m", "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}],
                  "stream": True},
    "gemini": {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
    "cohere": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True},
    "bedrock": {"messages": [{"role": "user", "content": [{"text": "hi"}]}]},
}
ERROR_BODIES = {
    "openai": b'{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}',
    "responses": b'{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}',
    "anthropic": b'{"type":"error","error":{"type":"rate_limit_error","message":"Rate limit reached"}}',
    "gemini": b'{"error":{"code":429,"message":"Resource exhausted","status":"RESOURCE_EXHAUSTED"}}',
    "cohere": b'{"message":"You are using a Trial key"}',
    "bedrock": b'{"__type":"com.amazon#ThrottlingException","message":"Too many requests"}',
}


def stream_frames(proto: str, tokens: int) -> list:
    """The mock's streamed answer in `proto`, as the list of frames it writes."""
    dialect = DIALECTS[proto]()
    body = orjson.dumps(ASKS[proto])
    # the path-model protocols read the model and the stream mode from the route
    route = SimpleNamespace(model="m", stream=True, sse=True)
    ask = dialect.read(orjson.loads(body), route)
    ask.stream = True
    directives = mock_answer.read_directives({b"x-mock-tokens": str(tokens).encode()}, body)
    plan = mock_answer.plan(ask, directives, len(body), "")
    return [bytes(f) for f in dialect.frames(ask, plan, "0123456789abcdef00000001")]


def make_case(name: str, tokens: int):
    """A no-argument callable running one case, the same work every call."""
    kind, _, proto = name.partition("-")
    if kind in ("stream", "tap"):
        frames = stream_frames(proto, tokens)
        cls = codec(proto).StreamTap if kind == "tap" else codec(proto).StreamDecoder

        def run():
            dec = cls()
            for f in frames:
                dec.feed(f)
            dec.close()
    elif name == "own_error":
        fns = [codec(p).own_error for p in DIALECTS]

        def run():
            for fn in fns:
                fn("authentication")
    elif name == "error_detail":
        pairs = [(codec(p).read_error_detail, ERROR_BODIES[p]) for p in DIALECTS]

        def run():
            for fn, body in pairs:
                fn(body)
    elif name == "discovery":
        from cbusbar.ir import Request
        req = Request()
        body = b'{"model":"m","stream":true}'
        calls = [(codec(p).forced_tool_name, codec(p).wants_stream_usage, codec(p).stream_usage_request,
                  codec(p).response_headers) for p in DIALECTS]

        def run():
            for forced, wants, usage, headers in calls:
                forced(req)
                wants(req)
                usage(body, None)
                headers(None, "req_1")
    else:
        raise SystemExit("unknown case %r" % name)
    return run


CASES = (["stream-" + p for p in DIALECTS] + ["tap-openai", "own_error", "error_detail", "discovery"])


def _callgrind_ir(name: str, tokens: int, iters: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out,
                        sys.executable, os.path.abspath(__file__), "--case", name,
                        "--tokens", str(tokens), "--iters", str(iters)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env=dict(os.environ, PYTHONHASHSEED="0"))
        with open(out) as f:
            text = f.read()
    return int(re.search(r"^(?:summary|totals): (\d+)", text, re.M).group(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--callgrind", action="store_true", help="instructions per call, via valgrind")
    ap.add_argument("--tokens", type=int, default=200, help="words in each streamed answer")
    ap.add_argument("--case", help="run one case --iters times, print nothing (for valgrind)")
    ap.add_argument("--iters", type=int, default=0)
    ap.add_argument("only", nargs="*", help="substrings of the case names to run (default: all)")
    args = ap.parse_args()
    if args.case:
        run = make_case(args.case, args.tokens)
        for _ in range(args.iters):
            run()
        return
    cases = [c for c in CASES if not args.only or any(s in c for s in args.only)]
    if args.callgrind:
        print("%-18s %12s" % ("case", "Ir/call"))
        for name in cases:
            n = 20 if name.startswith(("stream", "tap")) else 2000
            a = _callgrind_ir(name, args.tokens, n)
            b = _callgrind_ir(name, args.tokens, 2 * n)
            print("%-18s %12d" % (name, round((b - a) / n)), flush=True)
        return
    print("%-18s %10s %10s" % ("case", "µs min", "µs median"))
    for name in cases:
        run = make_case(name, args.tokens)
        number = 200 if name.startswith(("stream", "tap")) else 20000
        per = sorted(t / number * 1e6 for t in timeit.repeat(run, number=number, repeat=7))
        print("%-18s %10.2f %10.2f" % (name, per[0], per[3]), flush=True)


if __name__ == "__main__":
    main()
