"""The hook wire: what busbar POSTs to a sidecar and how it reads the answer (docs/hooks.md).

Every message is one JSON object; `op` says what it is: `decide` (a gate's decision: answer it),
`transform` (a `prompt: rw` gate's rewrite pass: answer it), `notify` (a tap's observation: the
answer is not read). The shape is the Rust gateway's hook projection, key for key:

    {"request": {"request_id": 7, "pool": "chat", "ingress_protocol": "openai",
                 "message_count": 3, "has_tools": false, "total_chars": 1200,
                 "max_tokens": 256, "stream": true,
                 "system": "...", "messages": [{"role": "user", "text": "..."}],   # prompt: ro|rw
                 "user": {"key_id": "...", "key_name": "...", "user": "..."}},   # user: ro
     "candidates": [{"idx": 0, "model": "a", "provider": "p", "weight": 1, "tier": "primary",
                     "cost_per_mtok": 3.0, "latency_ms": 41.5,
                     "available_concurrency": 7, "budget_remaining": 10, "rate_headroom": 0.8,
                     "tags": ["baa"]}],
     "context": {},
     "stage": {"at": "routing", "model": "a", "attempt_number": 2, ...},        # taps' stages
     "op": "decide"}

An optional field is absent, never null. Prompt text comes from the request read into the IR by
the ingress codec, so it is the same for every protocol: text blocks, reasoning text (opaque
redacted reasoning as a fixed marker, never its bytes) and tool results' text, which all reach
the provider. A reply is read by presence: `reject` (a 400-499 status, 403 otherwise; a message
stripped of control and invisible characters and cut to 300), `restrict` ({tags_any: [...]}),
`order` ([idx, ...]), `rewrite` ({messages: [{role, content}]}), or `{}` / `{"abstain": true}`.
A gate that says reject means it: a malformed reject is a reject with the defaults.
"""
from __future__ import annotations

import orjson

from cbusbar import ir

OP_DECIDE = "decide"
OP_TRANSFORM = "transform"
OP_NOTIFY = "notify"

# What stands for opaque provider-encrypted reasoning (Anthropic redacted_thinking, Bedrock
# redactedContent) in a projection: busbar cannot read it, and its bytes must not leave.
REDACTED_REASONING = "[busbar:redacted_reasoning]"
# A reject's status is clamped to the client errors, so the caller's SDK raises the right class.
REJECT_STATUS_DEFAULT = 403
# A reject message long enough for a reason, short enough for an error body (the Rust bound).
REJECT_MESSAGE_MAX = 300
REJECT_MESSAGE_DEFAULT = "Request rejected by the routing policy."
# Characters a reject message loses: controls, the Unicode line separators (log record
# splitting), bidi overrides and isolates (spoofed log lines) and zero-widths (hidden text).
_STRIP = {c: None for c in list(range(0x20)) + list(range(0x7F, 0xA0)) +
          [0x2028, 0x2029, 0xFEFF] + list(range(0x200B, 0x2010)) + list(range(0x202A, 0x202F)) +
          list(range(0x2066, 0x206A))}

_ROLES = {ir.USER: "user", ir.ASSISTANT: "assistant"}
_FROM_ROLE = {"user": ir.USER, "assistant": ir.ASSISTANT, "model": ir.ASSISTANT}


# ---------------------------------------------------------------- what busbar sends

def block_text(b) -> str | None:
    """The text a content block carries to the provider, or None (an image, a tool call)."""
    k = b.kind
    if k == ir.TEXT:
        return b.text
    if k == ir.THINKING:
        return REDACTED_REASONING if b.redacted else b.text
    if k == ir.TOOL_RESULT:
        parts = [t for t in (block_text(c) for c in (b.content or ())) if t]
        return "\n".join(parts) if parts else None
    if k == ir.DOCUMENT and b.src_kind == ir.SRC_NONE_:
        return b.text
    return None


def flatten(blocks) -> str:
    return "\n".join(t for t in (block_text(b) for b in blocks) if t)


class Shape:
    """The request's projection fields, computed once from the IR and shared by every message of
    the request (its prompt text only for hooks granted it)."""

    __slots__ = ("request_id", "pool", "ingress", "message_count", "has_tools", "total_chars",
                 "max_tokens", "stream", "system", "messages", "user")

    def __init__(self, request_id, pool, ingress, req, stream, user):
        self.request_id = request_id
        self.pool = pool
        self.ingress = ingress
        self.stream = bool(stream)
        self.user = user
        if req is None:     # a body busbar could not read: shapes only, all empty
            self.message_count = 0
            self.has_tools = False
            self.total_chars = 0
            self.max_tokens = None
            self.system = None
            self.messages = []
            return
        self.system = flatten(req.system) or None
        self.messages = [{"role": _ROLES.get(m.role, "user"), "text": flatten(m.content)}
                         for m in req.messages]
        self.message_count = len(req.messages)
        self.has_tools = bool(req.tools)
        self.total_chars = len(self.system or "") + sum(len(m["text"]) for m in self.messages)
        mt = req.max_tokens
        self.max_tokens = mt if isinstance(mt, int) and not isinstance(mt, bool) else None

    def request(self, hook) -> dict:
        """The `request` object as `hook`'s grants allow."""
        d = {"request_id": self.request_id, "pool": self.pool, "ingress_protocol": self.ingress,
             "message_count": self.message_count, "has_tools": self.has_tools,
             "total_chars": self.total_chars}
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        d["stream"] = self.stream
        if hook.prompt != "no":
            if self.system:
                d["system"] = self.system
            d["messages"] = self.messages
        if hook.user == "ro" and self.user:
            d["user"] = self.user
        return d


def user_of(principal, req) -> dict:
    """The `user` grant's projection: the key's id and name (never its token) and the body's
    end-user field (OpenAI `user`, Anthropic `metadata.user_id`: the IR's `user`)."""
    d = {}
    if principal is not None:
        d["key_id"] = principal.id
        if principal.name:
            d["key_name"] = principal.name
    u = req.user if req is not None else None
    if u:
        d["user"] = u
    return d


def envelope(op: str, request: dict, candidates: list, stage: dict | None = None) -> bytes:
    """One message's body: the projection, then `op` (last, as the Rust forwarder writes it)."""
    d = {"request": request, "candidates": candidates, "context": {}}
    if stage is not None:
        d["stage"] = stage
    d["op"] = op
    return orjson.dumps(d)


# ---------------------------------------------------------------- what a sidecar answers

def sanitize(message) -> str:
    if not isinstance(message, str):
        return REJECT_MESSAGE_DEFAULT
    m = message.translate(_STRIP)[:REJECT_MESSAGE_MAX]
    return m if m.strip() else REJECT_MESSAGE_DEFAULT


def reject_of(value):
    """(status, message) of a reply's reject arm, or None when it does not reject. Any value but
    false (and null) rejects; a malformed detail falls back to the defaults."""
    if value is None or value is False:
        return None
    status = value.get("status") if isinstance(value, dict) else None
    if isinstance(status, bool) or not isinstance(status, int) or not 400 <= status <= 499:
        status = REJECT_STATUS_DEFAULT
    message = value.get("message") if isinstance(value, dict) else None
    return status, sanitize(message if message is not None else "")


def decision(reply, n: int):
    """A decide reply → ("reject", status, message) | ("restrict", tags) | ("order", [idx]) |
    ("abstain",). A malformed restrict restricts to nothing (its gate's on_empty decides), never
    to everything; an order keeps the known indexes, each once."""
    if not isinstance(reply, dict):
        raise ValueError("the reply is not a JSON object")
    rj = reject_of(reply.get("reject"))
    if rj is not None:
        return ("reject",) + rj
    rs = reply.get("restrict")
    if rs is not None and rs is not False:
        tags = rs.get("tags_any") if isinstance(rs, dict) else None
        tags = tuple(t.strip() for t in tags if isinstance(t, str) and t.strip()) \
            if isinstance(tags, list) else ()
        return ("restrict", tags)
    if reply.get("abstain") is True:
        return ("abstain",)
    order = reply.get("order")
    if not isinstance(order, list):
        return ("abstain",)
    seen = []
    for i in order:
        if isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n and i not in seen:
            seen.append(i)
    return ("order", seen) if seen else ("abstain",)


def transformed(reply):
    """A transform reply → ("reject", status, message) | ("rewrite", [ir.Message]) | ("abstain",);
    reject first, then rewrite (restrict and order belong to decide and are ignored here).
    Raises ValueError for a rewrite that is not well formed (the gate's on_error decides)."""
    if not isinstance(reply, dict):
        raise ValueError("the reply is not a JSON object")
    rj = reject_of(reply.get("reject"))
    if rj is not None:
        return ("reject",) + rj
    rw = reply.get("rewrite")
    if rw is None or rw is False:
        return ("abstain",)
    msgs = rw.get("messages") if isinstance(rw, dict) else None
    if not isinstance(msgs, list) or not msgs:
        raise ValueError("a rewrite needs a non-empty messages list")
    return ("rewrite", [_message(m) for m in msgs])


def _message(m):
    """One rewrite message, in body form {role, content}: content a string or a list of text
    parts ({type: text, text}); role user or assistant (a Gemini-minded `model` is assistant)."""
    if not isinstance(m, dict):
        raise ValueError("a rewrite message is not an object")
    role = _FROM_ROLE.get(m.get("role"))
    if role is None:
        raise ValueError("a rewrite message's role is user or assistant")
    c = m.get("content")
    if isinstance(c, str):
        return ir.Message(role, [ir.text_block(c)])
    if isinstance(c, list) and c:
        blocks = []
        for part in c:
            t = part.get("text") if isinstance(part, dict) else part if isinstance(part, str) else None
            if not isinstance(t, str):
                raise ValueError("a rewrite message's content parts are text")
            blocks.append(ir.text_block(t))
        return ir.Message(role, blocks)
    raise ValueError("a rewrite message's content is text")
