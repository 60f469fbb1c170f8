"""Operations other than chat: embeddings, token counting, model retrieve.

- Embeddings (POST /v1/embeddings, /v2/embed, Gemini :embedContent / :batchEmbedContents, Bedrock
  /model/{id}/invoke with a Titan or Cohere body): any of the four protocols reaches any lane that
  speaks one of them, through the embeddings IR (cbusbar/embed.pyx); same protocol (and, for
  Bedrock, the same body dialect) goes through byte for byte with the model spliced.
- Token counting (Anthropic /v1/messages/count_tokens, Gemini :countTokens): passed through to a
  lane of the same protocol, model spliced; a target with no such lane is a native 404.
- GET /v1/models/{id} and /v1beta/models/{name}: answered from the config, in the caller's shape.

A `Call` is one buffered upstream exchange with failover, the same rules as chat (SPEC §4.1:
429/408/5xx/connect errors/timeouts try the next lane, other errors are relayed or re-enveloped),
using the Exchange it belongs to for everything client-side (its lane slot, its upstream
connection, respond/error/final_error), so a client that goes away or a crash is handled by the
Exchange exactly as for chat. Lanes whose model does not list the operation (`operations:`) are
never candidates; an operation no lane of the target serves is a native 404.
"""
from __future__ import annotations

import time

import orjson

from cbusbar import embed
from cbusbar.framing import FramingError, scan_top, splice
from cbusbar.ir import CodecError
from busbar.server import dispatch as D

NOT_SERVED = "This endpoint does not support that operation."
PARSE_ERROR = "We could not parse the JSON body of your request."
MISSING_MODEL = "Missing required parameter: 'model'."

_perf_ns = time.perf_counter_ns


def start(ex, route) -> bool:
    """Takes over the Exchange `ex` when `route` is one of these operations (True), else leaves
    it to chat (False: an InvokeModel body that is Anthropic Messages)."""
    kind = route.kind
    if kind == D.MODEL_GET:
        model_get(ex, route)
        return True
    if kind == D.CHAT:
        # /model/{id}/invoke carries either Claude's Messages or an embedding model's body.
        if not embed.is_embed_body(ex.req.body):
            return False
        route = D.Route(D.EMBED, "bedrock", route.name, False, name_in_body=False)
        ex.proto = "bedrock"
    gw = ex.gw
    if gw.max_inbound and gw.inflight > gw.max_inbound:
        ex.error(503, "overloaded", "The gateway is at capacity. Please retry shortly.", retry_after=1)
        return True
    Call(ex, route).start()
    return True


def model_get(ex, route):
    name = route.name
    if ex.gw.router.resolve(name) is None:
        if route.protocol == "gemini":
            msg = "models/%s is not found for API version v1beta, or is not supported." % name
        else:
            msg = "The model '%s' does not exist or you do not have access to it." % name
        ex.error(404, "not_found", msg)
        return
    from busbar.engine.exchange import CODECS
    listing = orjson.loads(CODECS[route.protocol].write_model_list([name]))
    one = listing["models"][0] if route.protocol == "gemini" else listing["data"][0]
    ex.respond(200, b"application/json", orjson.dumps(one), ex.ingress_headers())


class Call:
    __slots__ = ("ex", "gw", "route", "proto", "embed", "ir", "target", "span", "tried", "hops",
                 "same", "codec", "eproto", "wire", "data", "status", "headers", "chunks", "size",
                 "t_send", "last_error", "_slot")

    def __init__(self, ex, route):
        self.ex = ex
        self.gw = ex.gw
        self.route = route
        self.proto = route.protocol
        self.embed = route.kind == D.EMBED
        self.ir = None
        self.tried = set()
        self.hops = 0
        self.last_error = None
        self._slot = None       # the gateway's deadline slot while an attempt's timeout runs
        self.chunks = None

    # ---------------------------------------------------------------- entry
    def start(self):
        ex, route, gw = self.ex, self.route, self.gw
        body = ex.req.body
        self.span = None
        if route.name_in_body:
            try:
                self.span = scan_top(body, (b"model",)).get(b"model")
            except FramingError:
                ex.error(400, "invalid_request", PARSE_ERROR)
                return
            name = orjson.loads(body[self.span[0]:self.span[1]]) if self.span is not None else None
            if not isinstance(name, str) or not name:
                ex.error(400, "invalid_request", MISSING_MODEL)
                return
        else:
            name = route.name
        ex.name = name
        target = gw.router.resolve(name)
        if target is None:
            if self.proto == "gemini":
                msg = ("models/%s is not found for API version %s, or is not supported for the "
                       "task you are trying to perform." % (name, route.gemini_version or "v1beta"))
            else:
                msg = "The model '%s' does not exist or you do not have access to it." % name
            ex.error(404, "not_found", msg)
            return
        op = "embeddings" if self.embed else "chat"
        tried = set(target.lacking(op))
        for lane in target.lanes:
            eg = gw.egress[lane.model.provider.name]
            if self.embed:
                ok = eg.protocol in embed.PROTOCOLS
            else:
                # Token counting has no translation: only lanes of the caller's protocol (and not
                # Claude on Vertex, whose count endpoint is another path).
                ok = eg.protocol == self.proto and not eg.vertex_anthropic
            if not ok:
                tried.add(lane)
        if len(tried) >= len(target.lanes):
            ex.error(404, "not_found", NOT_SERVED)
            return
        if self.embed:
            try:
                self.ir = embed.READ_REQUEST[self.proto](body)
            except CodecError as e:
                ex.error(400, "invalid_request", str(e) or PARSE_ERROR)
                return
        self.tried = tried
        self.target = target
        self.attempt()

    # ---------------------------------------------------------------- attempts
    def attempt(self):
        ex, gw = self.ex, self.gw
        if self.hops > gw.max_hops:
            self.exhausted()
            return
        lane = self.target.pick(self.tried)
        if lane is None:
            self.exhausted()
            return
        self.hops += 1
        self.tried.add(lane)
        ex.lane = lane          # the Exchange releases it (done, client gone, crash)
        eg = gw.egress[lane.model.provider.name]
        if not eg.ready:
            self.fail_over("no upstream credentials yet")
            return
        from busbar.engine.exchange import CODECS, _dumps
        eproto = eg.protocol
        wire = lane.model.upstream_model
        self.eproto = eproto
        self.wire = wire
        self.codec = CODECS[eproto]
        body = ex.req.body
        extra = b""
        if self.embed:
            self.same = embed.passthrough(self.proto, self.ir, eproto, wire)
            if self.same:
                if self.span is not None:
                    body = splice(body, self.span[0], self.span[1], _dumps(wire))
            else:
                self.ir.model = wire
                try:
                    body = embed.WRITE_REQUEST[eproto](self.ir)
                except CodecError as e:
                    ex.release_lane()
                    ex.error(400, "invalid_request", str(e))
                    return
                gw.count_translation(self.proto, eproto)
            path = embed.upstream_path(eproto, wire)
        else:
            self.same = True
            if self.span is not None:
                body = splice(body, self.span[0], self.span[1], _dumps(wire))
            if eproto == "gemini":
                path = "/v1beta/" + (wire if "/" in wire else "models/" + wire) + ":countTokens"
            else:
                path = "/v1/messages/count_tokens"
                v = ex.req.headers.get(b"anthropic-beta")
                if v is not None and b"\r" not in v and b"\n" not in v:
                    extra = b"anthropic-beta: " + v + b"\r\n"
        self.data = eg.request(path, body, False, extra)
        gw.pool.acquire(eg.key, self._on_conn, self._on_conn_error)

    def _on_conn(self, conn):
        ex = self.ex
        if ex.closed:
            self.gw.pool.release(conn)
            return
        ex.upconn = conn
        self.status = 0
        self.chunks = []
        self.size = 0
        t = self.gw.limits.upstream_request_timeout_secs
        ato = ex.lane.model.attempt_timeout_ms
        if ato is not None and ato / 1000.0 < t:
            t = ato / 1000.0
        self.gw.deadlines.arm(self, t)
        self.t_send = _perf_ns()
        conn.send(self, self.data)

    def _on_conn_error(self, reason):
        if not self.ex.closed:
            self.fail_over(reason)

    def on_deadline(self):
        ex = self.ex
        if ex.closed:
            return
        ex.abandon_upstream()
        self.fail_over("upstream timeout")

    def fail_over(self, reason):
        self.gw.log_debug("attempt failed on %s: %s", self.ex.lane.model.name if self.ex.lane else "-", reason)
        self.gw.deadlines.disarm(self)
        self.ex.release_lane()
        self.attempt()

    def exhausted(self):
        le = self.last_error
        if le is not None:
            self.ex.final_error(*le)
            return
        self.ex.error(503, "overloaded", "The service is temporarily overloaded. Please retry shortly.",
                      retry_after=2)

    # ---------------------------------------------------------------- upstream callbacks
    def on_upstream_headers(self, status, headers):
        self.ex.rtt = _perf_ns() - self.t_send
        self.status = status
        self.headers = headers
        if self.ex.lane.model.attempt_timeout_ms is not None and self._slot is not None:
            # attempt_timeout_ms caps the time to headers, never the body (SPEC §4.3).
            self.gw.deadlines.arm(self, self.gw.limits.upstream_request_timeout_secs)

    def on_upstream_body(self, chunk):
        if self.chunks is None:
            return
        lim = self.gw.limits
        cap = lim.request_body_max_bytes if 200 <= self.status < 300 else lim.error_body_max_bytes
        self.size += len(chunk)
        if self.size > cap:
            self.chunks = None
            if 200 <= self.status < 300:
                self.ex.abandon_upstream()
                self.gw.deadlines.disarm(self)
                self.ex.release_lane()
                self.ex.error(502, "api_error", "The upstream response exceeds the maximum size.")
            return
        self.chunks.append(chunk)

    def on_upstream_error(self, reason):
        ex = self.ex
        ex.upconn = None
        if not ex.closed:
            self.fail_over(reason)

    def on_upstream_complete(self):
        ex = self.ex
        ex.upconn = None
        self.gw.deadlines.disarm(self)
        if ex.closed or self.chunks is None:
            return
        status = self.status
        body = b"".join(self.chunks)
        if status < 200 or status >= 300:
            if status == 429 or status == 408 or status >= 500:
                self.last_error = (status, body, self.headers, self.codec, self.same)
                self.fail_over("upstream status %d" % status)
                return
            ex.release_lane()
            ex.final_error(status, body, self.headers, self.codec, self.same)
            return
        ex.release_lane()
        ex.rtt = _perf_ns() - self.t_send
        if self.same:
            from busbar.engine.exchange import _header
            ex.respond(200, _header(self.headers, b"content-type") or b"application/json", body,
                       ex.same_protocol_headers(self.headers))
            return
        try:
            resp = embed.READ_RESPONSE[self.eproto](body)
        except CodecError:
            ex.error(502, "api_error", "The upstream returned a response busbar could not read.")
            return
        if len(resp.vectors) != len(self.ir.inputs):
            ex.error(502, "api_error", "The upstream returned a different number of embeddings.")
            return
        if not resp.model:
            resp.model = self.wire
        ex.respond(200, b"application/json", embed.WRITE_RESPONSE[self.proto](resp, self.ir),
                   ex.ingress_headers())
