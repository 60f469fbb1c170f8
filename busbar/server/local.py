"""What the data listener answers itself, without an upstream: its entries in the gateway's route
table (busbar/server/routes.py), which `mount(gw)` registers when the Gateway is made.

- `/healthz` (any method): 200 "ok" while some lane is usable, else 503.
- `GET /stats`: SPEC §7's lane table, `busbar.reliability.stats.stats_snapshot` (the one
  producer; the admin listener's `/stats` shows it whole): behind the caller's key when keys
  exist, and then only the pools that key may call.
- `GET /v1/models`, `/v1beta/models`: the model list; `GET /v1/models/{id}`,
  `/v1beta/models/{name}`: one model's entry. Both in the shape of whoever asks (OpenAI,
  Anthropic or Gemini, from the path and headers), behind the governance gate when keys exist.
- The answers to what the protocol dispatch refuses (busbar/server/dispatch.py): an unknown path
  (404), a protocol path with the wrong method (405), an operation busbar does not serve (404);
  each in the caller's protocol.

None of these is an LLM call: the first three are no request record (Exchange.finish), the
refusals are (a call busbar refused). Each handler takes the Exchange and answers through it.
"""
from __future__ import annotations

import functools
from urllib.parse import unquote

import orjson

from busbar.engine.route import METHOD, NOT_FOUND, UNSUPPORTED
from busbar.engine.translate import CODECS
from busbar.server.dispatch import header_protocol
from busbar.server.routes import Response

JSON = b"application/json"


def mount(gw):
    """Registers the data listener's own answers in `gw.routes`."""
    r = gw.routes
    r.add("*", "/healthz", health, summary="any lane usable")
    r.add("GET", "/stats", caller_stats, summary="lanes and breaker cells")
    r.add("GET", "/v1/models", models, summary="the model list")
    r.add("GET", "/v1beta/models", models, summary="the model list (Gemini)")
    r.add("GET", "/v1/models/{model...}", model, summary="one model")
    r.add("GET", "/v1beta/models/{model...}", model, summary="one model (Gemini)")
    r.refuse(NOT_FOUND, not_found)
    r.refuse(METHOD, method_not_allowed)
    r.refuse(UNSUPPORTED, unsupported)


def health(ex):
    ok = bool(ex.snap.router.lanes) and ex.site.reliability.healthy()
    return Response(200 if ok else 503, b"ok" if ok else b"no usable lanes",
                    b"text/plain; charset=utf-8")


def stats(gw, req):
    """SPEC §7's lane table, every pool's (the admin listener's)."""
    from busbar.reliability.stats import stats_snapshot
    return Response(200, orjson.dumps(stats_snapshot(gw)), JSON)


def caller_stats(ex):
    """SPEC §7's lane table for the caller: with keys, a key is needed, and one with
    allowed_pools sees those pools only (the Rust gateway's /stats, THREAT_MODEL T2)."""
    gated(ex, functools.partial(_caller_stats, ex))


def _caller_stats(ex):
    from busbar.reliability.stats import stats_snapshot
    key = ex.principal
    ex.respond(200, JSON, orjson.dumps(stats_snapshot(
        ex.site, key.allowed_pools if key is not None else None)))


def gated(ex, answer):
    """`answer()` once the caller's key is accepted, when governance has keys; the gate's
    refusal is in the caller's protocol (`ex.proto`)."""
    gov = ex.snap.governance
    if gov is not None and gov.keys:
        ex.site.gate.enter(ex, gov, answer)
    else:
        answer()


def models(ex):
    """The model list, in the shape of the caller's SDK."""
    req = ex.req
    h = req.headers
    ex.proto = "gemini" if req.path == "/v1beta/models" or b"x-goog-api-key" in h else (
        "anthropic" if b"anthropic-version" in h else "openai")
    gated(ex, functools.partial(_model_list, ex))


def _model_list(ex):
    ex.respond(200, JSON, CODECS[ex.proto].write_model_list(ex.snap.router.names()))


def model(ex):
    """One model's entry (a pool's or a model's name), in the shape of the caller's SDK."""
    req = ex.req
    path = req.path
    by_header = header_protocol(req.headers)
    proto = ex.proto = "gemini" if path.startswith("/v1beta/") or by_header == "gemini" else (
        "anthropic" if by_header == "anthropic" else "openai")
    name = unquote(path[path.index("/models/") + 8:])
    if proto == "gemini" and name.startswith("models/"):
        name = name[7:]
    if not name:
        # No model named: an unknown path, refused (and so a request record) as any other.
        ex.route.kind = NOT_FOUND
        not_found(ex)
        return
    gated(ex, functools.partial(_model_entry, ex, name))


def _model_entry(ex, name):
    codec = CODECS[ex.proto]
    if ex.snap.router.resolve(name) is None:
        ex.error(404, "not_found", codec.not_found_message(name, None))
        return
    listing = orjson.loads(codec.write_model_list([name]))
    one = listing["models"][0] if "models" in listing else listing["data"][0]
    ex.respond(200, JSON, orjson.dumps(one), codec.response_headers(None, ex.rid()))


def not_found(ex):
    ex.error(404, "not_found", "Unknown request URL: %s %s." % (
        ex.req.method.decode("latin-1"), ex.req.path))


def method_not_allowed(ex):
    ex.error(405, "invalid_request", "Method %s not allowed for %s." % (
        ex.req.method.decode("latin-1"), ex.req.path))


def unsupported(ex):
    ex.error(404, "not_found", "This endpoint does not support that operation.")
