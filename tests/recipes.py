"""The hook recipes of docs/hooks.md, as the small sidecars an operator runs beside busbar: each is a
function from the message busbar POSTs (op, request, candidates, ...) to the reply.

- `redact`: a `prompt: rw` gate that replaces e-mail addresses in the conversation with
  "[email]" before the request is routed (every lane and every failover hop get the redacted
  text; a conversation without one is left alone: the gate abstains);
- `guard`: a `prompt: ro` gate that refuses a banned phrase with a 403 the caller's SDK raises as
  its own permission error (wire it with `on_error: reject`, so an unscreened request never
  passes when the sidecar is down);
- `route`: a decision gate for custom routing, after the Rust project's smart-router example:
  long prompts and tool calls go to the `large` tier first, fastest first; everything else goes
  cheapest first.

Run them as one sidecar: `python -m tests.recipes 8787` (paths /redact, /guard, /route).
"""
from __future__ import annotations

import re
import sys

EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")
BANNED = "project nightingale"
REFUSAL = "This request mentions a restricted project."
# A prompt this long (or one with tools) is a job for the large tier.
LARGE_CHARS = 2000


def redact(msg: dict) -> dict:
    messages = msg["request"].get("messages")
    if not messages:
        return {}
    out = []
    changed = False
    for m in messages:
        text = EMAIL.sub("[email]", m["text"])
        changed = changed or text != m["text"]
        out.append({"role": m["role"], "content": text})
    return {"rewrite": {"messages": out}} if changed else {}


def guard(msg: dict) -> dict:
    req = msg["request"]
    text = " ".join([req.get("system", "")] + [m["text"] for m in req.get("messages", [])])
    if BANNED in text.lower():
        return {"reject": {"status": 403, "message": REFUSAL}}
    return {}


def route(msg: dict) -> dict:
    req = msg["request"]
    cands = msg["candidates"]
    if req["total_chars"] > LARGE_CHARS or req["has_tools"]:
        ranked = sorted(cands, key=lambda c: (c.get("tier") != "large",
                                              c.get("latency_ms", float("inf")), c["idx"]))
    else:
        ranked = sorted(cands, key=lambda c: (c.get("cost_per_mtok", float("inf")), c["idx"]))
    return {"order": [c["idx"] for c in ranked]}


ROUTES = {"/redact": redact, "/guard": guard, "/route": route}


if __name__ == "__main__":
    import threading

    from tests.sidecar import Sidecar
    s = Sidecar(ROUTES, port=int(sys.argv[1]) if len(sys.argv) > 1 else 8787)
    print("hook recipes on %s (/redact, /guard, /route)" % s.url)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        s.close()
