# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""Ingress dispatch: (method, path, headers) → what the request is. Never sniffs the body (SPEC §1.1).

A data listener's `Dispatcher` looks, in this order, at the four fixed chat paths (the request
path's shortcut), at its route table (busbar/server/routes.py: what busbar answers itself), then
at the protocols' paths (`protocol_route`); a path no protocol takes is refused with the table's answer
for that refusal, in the caller's protocol.

The order of the header checks matters and is the reference's: a SigV4 Authorization header means
Bedrock, an anthropic-version/beta header means Anthropic, x-goog-api-key means Gemini, a bare
x-api-key means Anthropic; then the path decides.
"""
from __future__ import annotations

import functools
from urllib.parse import unquote

from busbar.engine.route import (  # noqa: F401 (the kinds are part of this module's answer)
    CHAT, COUNT_TOKENS, EMBED, LOCAL, METHOD, NOT_FOUND, UNSUPPORTED, Route)


def header_protocol(headers: dict) -> str | None:
    auth = headers.get(b"authorization")
    if auth is not None and auth.startswith(b"AWS4-HMAC-SHA256"):
        return "bedrock"
    if b"anthropic-version" in headers or b"anthropic-beta" in headers:
        return "anthropic"
    if b"x-goog-api-key" in headers:
        return "gemini"
    if b"x-api-key" in headers:
        return "anthropic"
    return None


# A route's model name, percent-decoded: the same few names arrive on every request (Bedrock's
# SDKs encode the ':' of every id), and urllib's unquote is Python, where a cache hit runs no
# bytecode. Names past 200 characters are decoded each time, so the cache stays small.
_unquote_cached = functools.lru_cache(maxsize=256)(unquote)


def _decoded(s):
    if "%" not in s:
        return s
    if len(s) > 200:
        return unquote(s)
    return _unquote_cached(s)


def _gemini(path: str, query: str, method: bytes) -> Route:
    # /v1/models/{model}:{action} or /v1beta/models/{model}:{action}; split on the last ':'.
    version, _, rest = path[1:].partition("/models/")
    model, sep, action = rest.rpartition(":")
    if not sep or not model:
        return Route(NOT_FOUND, "gemini")
    if method != b"POST":
        return Route(METHOD, "gemini")
    model = _decoded(model)
    if action in ("embedContent", "batchEmbedContents"):   # reach
        r = Route(EMBED, "gemini", model, False, name_in_body=False)
    elif action == "countTokens":
        r = Route(COUNT_TOKENS, "gemini", model, False, name_in_body=False)
    elif action == "generateContent":
        r = Route(CHAT, "gemini", model, False, name_in_body=False)
    elif action == "streamGenerateContent":
        r = Route(CHAT, "gemini", model, True, name_in_body=False)
        r.json_array = "alt=sse" not in query
    else:
        r = Route(UNSUPPORTED, "gemini", model)
    r.gemini_version = version
    return r


def _bedrock(path: str, method: bytes) -> Route:
    # /model/{modelId}/converse[-stream]; the id arrives percent-encoded (':' → %3A, '/' → %2F).
    body = path[len("/model/"):]
    model_enc, _, op = body.rpartition("/")
    if not model_enc:
        return Route(NOT_FOUND, "bedrock")
    if method != b"POST":
        return Route(METHOD, "bedrock")
    model = _decoded(model_enc)
    if op == "converse":
        return Route(CHAT, "bedrock", model, False, name_in_body=False)
    if op == "converse-stream":
        return Route(CHAT, "bedrock", model, True, name_in_body=False)
    # reach: InvokeModel with an Anthropic Messages body (anthropic.AnthropicBedrock).
    if op == "invoke":
        r = Route(CHAT, "bedrock-invoke", model, False, name_in_body=False)
        r.may_embed = True
        return r
    if op == "invoke-with-response-stream":
        return Route(CHAT, "bedrock-invoke", model, True, name_in_body=False)
    return Route(UNSUPPORTED, "bedrock", model)


# The four fixed body-model paths answered with POST: their Route never varies, so one shared
# (never mutated) instance each saves building it per request.
_FIXED_CHAT = {path: Route(CHAT, proto) for path, proto in (
    ("/v1/chat/completions", "openai"), ("/v1/responses", "responses"), ("/v2/chat", "cohere"),
    ("/v1/messages", "anthropic"))}


# reach: the body-model paths of operations other than chat.
_OPERATIONS = {"/v1/embeddings": (EMBED, "openai"), "/v2/embed": (EMBED, "cohere"),
               "/v1/messages/count_tokens": (COUNT_TOKENS, "anthropic")}


class Dispatcher:
    """A data listener's dispatch (the Gateway's `dispatch`): the fixed chat paths, then the
    listener's route table `routes`, then the protocols; a refusal gets the table's handler."""

    def __init__(self, routes):
        self.routes = routes

    def dispatch(self, method, path, query, headers):
        r = _FIXED_CHAT.get(path)
        if r is not None and method == b"POST":
            by_header = header_protocol(headers)
            if by_header is None or by_header == r.protocol:
                return r
        if ":" not in path:     # a Gemini `{model}:{action}` is a call, never a local answer
            found = self.routes.match(method, path)
            if found is not None:
                # (a handler reads what it needs from the exchange's request, its path included)
                r = Route(LOCAL, None)
                r.handler = found[0].handler
                return r
        r = protocol_route(method, path, query, headers)
        kind = r.kind
        if kind != CHAT and kind != EMBED and kind != COUNT_TOKENS:
            r.handler = self.routes.refusals[kind]
        return r


def protocol_route(method: bytes, path: str, query: str, headers: dict) -> Route:
    """The protocols' Route for a request off the fixed chat paths that the route table did not
    answer: a call, or its refusal (NOT_FOUND, METHOD, UNSUPPORTED) in the caller's protocol."""
    if path in ("/v1/models", "/v1beta/models"):
        # the list's paths (a local answer for GET): any other method is refused
        return Route(METHOD, "openai")
    by_header = header_protocol(headers)
    if method == b"POST" and path in _OPERATIONS:   # reach: embeddings, token counting
        kind, proto = _OPERATIONS[path]
        if by_header is None or by_header == proto:
            return Route(kind, proto)
    if path.startswith("/model/"):
        r = _bedrock(path, method)
        if by_header in (None, "bedrock"):
            return r
    if (path.startswith("/v1/models/") or path.startswith("/v1beta/models/")) and (
            by_header in (None, "gemini")):
        return _gemini(path, query, method)

    if path.endswith("/v1/chat/completions"):
        proto, kind = "openai", CHAT
    elif path.endswith("/v1/responses"):
        proto, kind = "responses", CHAT
    elif path.endswith("/v2/chat"):
        proto, kind = "cohere", CHAT
    elif path.endswith("/v1/messages"):
        proto, kind = "anthropic", CHAT
    elif path.endswith(("/v1/embeddings", "/v1/moderations")) or path.startswith(
            ("/v1/images/", "/v1/audio/")):
        proto, kind = "openai", UNSUPPORTED
    elif path.endswith(("/v1/chat", "/v2/embed", "/v2/rerank")):
        proto, kind = "cohere", UNSUPPORTED
    elif path.endswith("/v1/messages/count_tokens"):
        proto, kind = "anthropic", UNSUPPORTED
    else:
        return Route(NOT_FOUND, by_header or ("gemini" if path.startswith("/v1beta/") else "openai"))
    if by_header is not None and by_header != proto:
        # An Anthropic/Gemini/SigV4 header on another protocol's path routes to the header's
        # protocol, which has no such path: 404 in that dialect (SPEC §1.1).
        return Route(NOT_FOUND, by_header)
    if kind == UNSUPPORTED:
        return Route(UNSUPPORTED, proto)
    if method != b"POST":
        return Route(METHOD, proto)
    if proto == "anthropic":
        prefix = path[:-len("/v1/messages")]
        if prefix:
            # /{name}/v1/messages: the name in the URL decides routing, the body's model is ignored.
            name = _decoded(prefix[1:])
            if not name or "/" in name:
                return Route(NOT_FOUND, "anthropic")
            return Route(CHAT, "anthropic", name, False, name_in_body=False)
    elif len(path) != len({"openai": "/v1/chat/completions", "responses": "/v1/responses",
                           "cohere": "/v2/chat"}[proto]):
        return Route(NOT_FOUND, proto)
    return Route(CHAT, proto)
