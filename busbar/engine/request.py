# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""A client's request as the ingress read it: what busbar/server/http.py hands to an exchange.

In the engine, not the server, so the exchange can type it (busbar/engine/exchange.pxd) while layers
still point one way (server -> engine). `credential(req)` reads the key a caller presented from the
request's headers alone: governance's gate and a passthrough lane's egress both ask it, and neither
is the other's layer."""
from __future__ import annotations


class Request:
    """method (bytes), path and query (str), headers ({lowercase bytes: bytes}), body (bytes),
    t0 (perf_counter_ns when its first byte was read), keep_alive."""

    def __init__(self, method, path, query, headers, body, t0, keep_alive):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.t0 = t0
        self.keep_alive = keep_alive


def new_request(method, path, query, headers, body, t0, keep_alive):
    """Request(...) as the server builds one per request (compiled: request.pxd types it, and the
    server cimports it): the members stored directly, without the constructor's call through
    Python and its argument parsing."""
    r = Request.__new__(Request)
    r.method = method
    r.path = path
    r.query = query
    r.headers = headers
    r.body = body
    r.t0 = t0
    r.keep_alive = keep_alive
    return r


def credential(req):
    """(kind, value) of what the caller presented, wherever its SDK puts it: `Authorization:
    Bearer` (OpenAI, Responses, Cohere; Anthropic's SDK may), `x-api-key` (Anthropic),
    `x-goog-api-key` or `?key=` (Gemini), or a SigV4 `Authorization` (Bedrock). The token is
    self-identifying (bbk_...), so no protocol decides where to look."""
    h = req.headers
    v = h.get(b"authorization")
    if v is not None:
        if v[:7].lower() == b"bearer ":
            return "token", v[7:].strip()
        if v.startswith(b"AWS4-HMAC-SHA256"):
            return "sigv4", v
    v = h.get(b"x-api-key")
    if v is None:
        v = h.get(b"x-goog-api-key")
    if v is not None:
        return "token", v.strip()
    q = req.query
    if q and "key=" in q:
        for part in q.split("&"):
            if part.startswith("key="):
                from urllib.parse import unquote
                return "token", unquote(part[4:]).encode("latin-1", "replace")
    return None, None
