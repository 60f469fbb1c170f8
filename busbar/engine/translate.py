"""The upstream request's body for a lane, and the translation steps between an ingress codec and
a lane's codec, as the engine runs them.

A lane of the caller's protocol gets the client's bytes with its wire model spliced in
(`with_model`) and the protocol's beta headers passed on (`forwarded`); any other lane gets the
client's request read once into the IR (`ClientRequest`) and written in its protocol
(`write_request`). Both the exchange and the golden runner (tests/cbusbar/test_golden.py) call these
functions, so a golden cannot pass while production translates differently. Everything here is
sans-IO: codec modules (docs/codecs.md), IR objects and bytes in, bytes out.
"""
from __future__ import annotations

from cbusbar import ir, transform
from cbusbar.framing import splice
from cbusbar.proto import codec as _codec


class _Codecs(dict):
    """protocol name → codec module, imported on first use."""

    def __missing__(self, name):
        mod = self[name] = _codec(name)
        return mod


CODECS = _Codecs()


def with_model(body, span, wire_json):
    """The client's body (a body-model protocol's) with `wire_json`, the lane's model as a JSON
    string, as its `model`: spliced over the client's (`span`, from the body's top-level scan),
    or inserted first when the body names none (/{name}/v1/messages)."""
    if span is None:
        i = body.index(b"{") + 1
        return body[:i] + b'"model":' + wire_json + (
            b"," if body[i:].strip() != b"}" else b"") + body[i:]
    if body[span[0]:span[1]] != wire_json:
        # Bytes compare, no parse: a client spelling of the same name with escapes just gets the
        # canonical spelling spliced in.
        return splice(body, span[0], span[1], wire_json)
    return body


def forwarded(names, headers):
    """Header lines passing the client's `names` headers on upstream (a protocol's beta headers,
    `advanced.beta_headers`); a value with CR or LF is not passed."""
    extra = b""
    for name in names:
        v = headers.get(name)
        if v is not None and b"\r" not in v and b"\n" not in v:
            extra += name + b": " + v + b"\r\n"
    return extra


class ClientRequest:
    """The client's request read into the IR once, with what every hop resets from it (a hop to one
    lane must not leak its defaults into the next lane's request)."""

    __slots__ = ("ir", "max_tokens", "effort", "budget", "stream_usage")

    def __init__(self, ingress, body: bytes):
        req = ingress.read_request(body)       # ir.CodecError: the caller's fault, say it
        self.ir = req
        self.max_tokens = req.max_tokens
        self.effort = req.reasoning_effort
        self.budget = req.reasoning_budget
        self.stream_usage = bool(ingress.wants_stream_usage(req))


def write_request(cr: ClientRequest, codec, wire_model: str, stream: bool, reasoning: bool,
                  default_max_tokens: int, prompt_caching: bool = False):
    """The upstream body for one lane: (body bytes, forced tool name or None). Protocol-only fields
    never cross protocols; max_tokens is injected only where the lane's API requires it; cache
    markers go where the dialect gates them on the model only when it declares prompt_caching."""
    req = cr.ir
    req.extra = {}
    req.model = wire_model
    req.stream = stream
    req.prompt_caching = prompt_caching
    if cr.max_tokens is None and codec.NEEDS_MAX_TOKENS:
        req.max_tokens = default_max_tokens
    else:
        req.max_tokens = cr.max_tokens
    if reasoning:
        req.reasoning_effort = cr.effort
        req.reasoning_budget = cr.budget
    else:
        req.reasoning_effort = None
        req.reasoning_budget = None
    body = codec.write_request(req)
    return body, codec.forced_tool_name(req)


def translate_response(codec, ingress, body: bytes, forced, response_id: str, model: str,
                       created=None):
    """A buffered upstream 2xx body → the ingress protocol's body: (bytes, ir.Usage). Raises
    ir.CodecError when the body is not the lane protocol's response (an upstream fault)."""
    resp = codec.read_response(body)
    if forced:
        transform.unwrap_forced_tool(resp, forced)
    resp.id = response_id
    if not resp.model:
        resp.model = model
    if created is not None:
        resp.created = created
    return ingress.write_response(resp), resp.usage


class StreamTranslation:
    """Upstream stream bytes (the lane's protocol) → client stream bytes (the ingress protocol),
    through IR events. `finished` turns true when the upstream's stream ended properly; `usage` is
    the latest running usage the upstream reported. feed/close raise ir.CodecError on a frame that
    is not the lane protocol's (an upstream fault)."""

    __slots__ = ("dec", "enc", "unwrap", "upstream_error", "mask")

    def __init__(self, codec, ingress, response_id: str, model: str, forced=None,
                 include_usage: bool = False, json_array: bool = False, created=None, mask=None):
        self.dec = codec.StreamDecoder()
        enc = ingress.stream_encoder(response_id, model, include_usage, json_array)
        if created is not None and hasattr(enc, "created"):
            enc.created = created
        self.enc = enc
        self.unwrap = transform.ForcedToolUnwrapper(forced) if forced else None
        self.upstream_error = None
        self.mask = mask

    def _events(self, events) -> bytes:
        if not events:
            return b""
        if self.unwrap is not None:
            events = self.unwrap.apply(events)
        for e in events:
            if e.kind == ir.EVENT_ERROR:
                # An error the upstream itself sent ends the stream natively, as it meant to.
                if self.mask and e.message:
                    e.message = self.mask.mask_text(e.message)
                self.upstream_error = e.message or ""
        return self.enc.encode(events)

    @property
    def finished(self) -> bool:
        return self.dec.finished or self.upstream_error is not None

    @property
    def usage(self):
        return self.dec.usage

    def feed(self, chunk: bytes) -> bytes:
        return self._events(self.dec.feed(chunk))

    def close(self) -> bytes:
        return self._events(self.dec.close())

    def error(self, kind: str, message: str) -> bytes:
        return self.enc.error(kind, message)
