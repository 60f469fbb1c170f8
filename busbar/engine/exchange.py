"""One client request from parse to last byte: route, attempt, fail over, relay or translate.

A state machine driven by callbacks from the ingress connection and the upstream pool; no task per
request. Failover is possible only until the first response byte is written to the client; after
that an upstream failure ends the client's stream with the ingress protocol's native error event.
"""
from __future__ import annotations

import os
import time

import orjson

from cbusbar import ir, transform
from cbusbar.framing import FramingError, scan_top, splice
from cbusbar.proto import codec as _codec
from busbar.server import dispatch as D
from busbar.server.http import status_line

_perf_ns = time.perf_counter_ns
_loads = orjson.loads
_dumps = orjson.dumps

class _Codecs(dict):
    """protocol name → codec module, imported on first use."""

    def __missing__(self, name):
        mod = self[name] = _codec(name)
        return mod


CODECS = _Codecs()
_WIRE_JSON = {}     # upstream model name → its JSON string (names come from config: bounded)
BODY_MODEL = frozenset(("openai", "responses", "cohere", "anthropic"))

# Response modes once upstream headers arrived
M_NONE = 0
M_RELAY_STREAM = 1     # same protocol, streamed: bytes through, chunked to the client
M_RELAY_BODY = 2       # same protocol, buffered, upstream gave a length: bytes through
M_BUFFER = 3           # same protocol, buffered without a length: collect, then answer
M_TRANSLATE_STREAM = 4
M_TRANSLATE_BODY = 5
M_ERROR = 6            # upstream non-2xx: collect (bounded), then fail over or answer

PARSE_ERROR = "We could not parse the JSON body of your request."
MISSING_MODEL = "Missing required parameter: 'model'."
OVERLOADED = "The service is temporarily overloaded. Please retry shortly."
STREAM_BROKE = "The upstream stream ended unexpectedly."

# Statuses worth another lane: rate limits, timeouts, overload and server errors (SPEC §4.1).
def _transient(status: int) -> bool:
    return status == 429 or status == 408 or status >= 500


def _req_id() -> str:
    return "req_" + os.urandom(12).hex()


class Exchange:
    __slots__ = ("gw", "conn", "req", "route", "proto", "ingress", "name", "target", "stream",
                 "ir", "ir_max_tokens", "ir_effort", "ir_budget", "include_usage", "tried",
                 "hops", "lane", "egress", "codec", "same", "upconn", "data", "t_send", "rtt",
                 "mode", "chunks", "size", "dec", "enc", "unwrap", "finished", "sent", "_slot",
                 "status", "up_headers", "last_error", "closed", "forced", "model_span",
                 "request_id", "last_model", "pending")

    def __init__(self, gw, conn, req):
        self.gw = gw
        self.conn = conn
        self.req = req
        self.ir = None
        self.tried = set()
        self.hops = 0
        self.lane = None
        self.upconn = None
        self.mode = M_NONE
        self.chunks = None
        self.size = 0
        self.sent = False
        self._slot = None       # the gateway's deadline slot while an attempt's timeout runs
        self.last_error = None
        self.closed = False
        self.finished = False
        self.rtt = 0
        self.request_id = None
        self.include_usage = False
        self.unwrap = None
        self.dec = None
        self.enc = None
        self.pending = None

    # ================================================================== entry
    def start(self):
        req = self.req
        gw = self.gw
        route = D.dispatch(req.method, req.path, req.query, req.headers)
        self.route = route
        self.proto = route.protocol
        kind = route.kind
        gw.inflight += 1
        if kind >= D.EMBED or route.protocol == "bedrock-invoke":
            # reach hook: embeddings, token counting, model retrieve (busbar/engine/operations.py)
            from busbar.engine import operations
            if operations.start(self, route):
                return
        if kind == D.CHAT:
            if gw.max_inbound and gw.inflight > gw.max_inbound:
                self.error(503, "overloaded", "The gateway is at capacity. Please retry shortly.",
                           retry_after=1)
                return
            self.chat()
        elif kind == D.HEALTH:
            ok = bool(gw.router.lanes)
            self.respond(200 if ok else 503, b"text/plain; charset=utf-8",
                         b"ok" if ok else b"no usable lanes")
        elif kind == D.MODELS:
            self.respond(200, b"application/json", CODECS[self.proto].write_model_list(gw.router.names()))
        elif kind == D.METHOD:
            self.error(405, "invalid_request", "Method %s not allowed for %s." % (
                req.method.decode("latin-1"), req.path))
        elif kind == D.UNSUPPORTED:
            self.error(404, "not_found", "This endpoint does not support that operation.")
        else:
            self.error(404, "not_found", "Unknown request URL: %s %s." % (
                req.method.decode("latin-1"), req.path))

    def chat(self):
        req = self.req
        route = self.route
        proto = self.proto
        self.ingress = CODECS[proto]
        body = req.body
        try:
            spans = scan_top(body, (b"model", b"stream"))
        except FramingError:
            self.error(400, "invalid_request", PARSE_ERROR)
            return
        self.model_span = spans.get(b"model")
        if route.name_in_body:
            span = self.model_span
            name = _loads(body[span[0]:span[1]]) if span is not None else None
            if not isinstance(name, str) or not name:
                self.error(400, "invalid_request", MISSING_MODEL)
                return
        else:
            name = route.name
        self.name = name
        if proto == "gemini" or proto == "bedrock" or proto == "bedrock-invoke":  # reach: + invoke
            self.stream = route.stream
        else:
            s = spans.get(b"stream")
            self.stream = s is not None and body[s[0]:s[1]] == b"true"
        target = self.gw.router.resolve(name)
        if target is None:
            if proto == "gemini":
                msg = ("models/%s is not found for API version %s, or is not supported for the "
                       "task you are trying to perform." % (name, route.gemini_version or "v1beta"))
            else:
                msg = "The model '%s' does not exist or you do not have access to it." % name
            self.error(404, "not_found", msg)
            return
        self.target = target
        if not target.serves("chat"):   # reach hook: lanes without `chat` are never candidates
            self.error(404, "not_found", "This endpoint does not support that operation.")
            return
        self.tried.update(target.lacking("chat"))
        self.attempt()

    # ================================================================== attempts
    def attempt(self):
        gw = self.gw
        if self.hops > gw.max_hops:
            self.exhausted()
            return
        lane = self.target.pick(self.tried)
        if lane is None:
            self.exhausted()
            return
        self.hops += 1
        self.lane = lane
        self.tried.add(lane)
        model = lane.model
        eg = gw.egress[model.provider.name]
        self.egress = eg
        if not eg.ready:    # reach hook: the provider's refreshed credentials have not arrived yet
            self.fail_over("no upstream credentials yet")
            return
        proto = eg.protocol
        codec = CODECS[proto]
        self.codec = codec
        wire = model.upstream_model
        self.last_model = wire
        stream = self.stream
        extra = b""
        self.forced = None
        if proto == self.proto:
            self.same = True
            body = self.req.body
            if proto in BODY_MODEL:
                span = self.model_span
                if span is None:
                    # /{name}/v1/messages without a body model: insert it.
                    i = body.index(b"{") + 1
                    body = body[:i] + b'"model":' + _dumps(wire) + (
                        b"," if body[i:].strip() != b"}" else b"") + body[i:]
                else:
                    wj = _WIRE_JSON.get(wire)
                    if wj is None:
                        wj = _WIRE_JSON[wire] = _dumps(wire)
                    # Bytes compare, no parse: a client spelling of the same name with escapes
                    # just gets the canonical spelling spliced in.
                    if body[span[0]:span[1]] != wj:
                        body = splice(body, span[0], span[1], wj)
            betas = gw.beta_headers.get(proto)
            if betas:
                h = self.req.headers
                for hname in betas:
                    v = h.get(hname)
                    if v is not None and b"\r" not in v and b"\n" not in v:
                        extra += hname + b": " + v + b"\r\n"
        else:
            self.same = False
            ir_req = self.ir
            if ir_req is None:
                try:
                    ir_req = self.ingress.read_request(self.req.body)
                except ir.CodecError as e:
                    self.release_lane()
                    self.error(400, "invalid_request", str(e) or PARSE_ERROR)
                    return
                self.ir = ir_req
                self.ir_max_tokens = ir_req.max_tokens
                self.ir_effort = ir_req.reasoning_effort
                self.ir_budget = ir_req.reasoning_budget
                so = ir_req.extra.get("stream_options") if ir_req.extra else None
                self.include_usage = isinstance(so, dict) and so.get("include_usage") is True
            ir_req.extra = {}
            ir_req.model = wire
            ir_req.stream = stream
            if self.ir_max_tokens is None and proto == "anthropic":
                ir_req.max_tokens = model.default_max_tokens or gw.limits.default_max_tokens
            else:
                ir_req.max_tokens = self.ir_max_tokens
            if self.target.reasoning(lane):
                ir_req.reasoning_effort = self.ir_effort
                ir_req.reasoning_budget = self.ir_budget
            else:
                ir_req.reasoning_effort = None
                ir_req.reasoning_budget = None
            if proto == "bedrock":
                transform.clear_cache_control(ir_req)
            try:
                body = codec.write_request(ir_req)
            except ir.CodecError as e:
                self.release_lane()
                self.error(400, "invalid_request", str(e))
                return
            ftn = getattr(codec, "forced_tool_name", None)
            if ftn is not None:
                self.forced = ftn(ir_req)
            gw.count_translation(self.proto, proto)
        self.data = eg.request(codec.upstream_path(wire, stream), body, stream, extra)
        gw.pool.acquire(eg.key, self._on_conn, self._on_conn_error)

    def _on_conn(self, conn):
        if self.closed:
            self.gw.pool.release(conn)
            return
        self.upconn = conn
        self.mode = M_NONE
        self.chunks = None
        self.size = 0
        lim = self.gw.limits
        t = lim.upstream_request_timeout_secs
        ato = self.lane.model.attempt_timeout_ms
        if ato is not None and ato / 1000.0 < t:
            t = ato / 1000.0
        self.gw.deadlines.arm(self, t)
        self.t_send = _perf_ns()
        conn.send(self, self.data)

    def _on_conn_error(self, reason):
        if self.closed:
            return
        self.last_error = None
        self.fail_over(reason)

    def on_deadline(self):
        """The attempt's timeout passed (called by the gateway's Deadlines sweep)."""
        if self.closed:
            return
        if self.upconn is not None:
            conn = self.upconn
            self.upconn = None
            conn.abandon()
        if not self.sent:
            self.fail_over("upstream timeout")
        else:
            self.broken("timeout", "The upstream timed out.")

    def fail_over(self, reason):
        """This attempt failed before the client saw a byte: record it and try the next lane."""
        self.gw.log_debug("attempt failed on %s: %s", self.lane.model.name if self.lane else "-", reason)
        self.release_lane()
        self.attempt()

    def release_lane(self):
        lane = self.lane
        if lane is not None:
            self.lane = None
            lane.release()
        if self._slot is not None:
            self.gw.deadlines.disarm(self)

    def exhausted(self):
        le = self.last_error
        if le is not None:
            # Every lane failed: the caller gets the last upstream error (in its own shape), which
            # says more than a generic 503.
            self.final_error(*le)
            return
        self.error(503, "overloaded", OVERLOADED, retry_after=2)

    # ================================================================== upstream callbacks
    def on_upstream_headers(self, status, headers):
        t = _perf_ns()
        self.rtt = t - self.t_send
        self.status = status
        self.up_headers = headers
        lim = self.gw.limits
        if self.lane.model.attempt_timeout_ms is not None and self._slot is not None:
            # attempt_timeout_ms caps connect + time to headers, never the body (SPEC §4.3).
            self.gw.deadlines.arm(self, lim.upstream_request_timeout_secs)
        if status < 200 or status >= 300:
            self.mode = M_ERROR
            self.chunks = []
            return
        if self.same and not (self.stream and self.route.json_array):
            if self.stream:
                self.mode = M_RELAY_STREAM
                ct = _header(headers, b"content-type") or self.codec.STREAM_CONTENT_TYPE
                self.dec = self.codec.StreamDecoder()   # the usage tap
                self.head_chunked(200, ct, self.same_protocol_headers(headers))
            else:
                cl = _header(headers, b"content-length")
                if cl is not None and _header(headers, b"content-encoding") is None:
                    self.mode = M_RELAY_BODY
                    ct = _header(headers, b"content-type") or b"application/json"
                    self.head(200, ct, int(cl), self.same_protocol_headers(headers))
                else:
                    self.mode = M_BUFFER
                    self.chunks = []
        elif self.stream:
            self.mode = M_TRANSLATE_STREAM
            ing = self.ingress
            self.dec = self.codec.StreamDecoder()
            enc = ing.StreamEncoder(ing.mint_id(), self.lane.model.upstream_model)
            if self.proto == "openai":
                enc.include_usage = self.include_usage
            elif self.proto == "gemini":
                enc.json_array = self.route.json_array
            self.enc = enc
            if self.forced:
                self.unwrap = transform.ForcedToolUnwrapper(self.forced)
            ct = b"application/json" if self.route.json_array else ing.STREAM_CONTENT_TYPE
            self.head_chunked(200, ct, self.ingress_headers())
        else:
            self.mode = M_TRANSLATE_BODY
            self.chunks = []

    def on_upstream_body(self, chunk):
        mode = self.mode
        if mode == M_RELAY_STREAM:
            self._w(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            dec = self.dec
            if dec is not None:
                try:
                    dec.feed(chunk)
                except Exception:
                    self.dec = None     # the tap never breaks the relay
        elif mode == M_RELAY_BODY:
            self._w(chunk)
        elif mode == M_TRANSLATE_STREAM:
            try:
                events = self.dec.feed(chunk)
            except Exception:
                self.abandon_upstream()
                self.broken("api_error", STREAM_BROKE)
                return
            if events:
                self.emit(events)
        elif mode == M_ERROR:
            self._collect(chunk, self.gw.limits.error_body_max_bytes)
        else:
            if not self._collect(chunk, self.gw.limits.request_body_max_bytes):
                self.abandon_upstream()
                self.release_lane()
                self.error(502, "api_error", "The upstream response exceeds the maximum size.")

    def _collect(self, chunk, cap):
        if self.chunks is None:
            return True
        self.size += len(chunk)
        if self.size > cap:
            self.chunks = None
            return False
        self.chunks.append(chunk)
        return True

    def emit(self, events):
        if self.unwrap is not None:
            events = self.unwrap.apply(events)
        out = self.enc.encode(events)
        for e in events:
            k = e.kind
            if k == ir.MESSAGE_STOP or k == ir.EVENT_ERROR:
                self.finished = True
        if out:
            self._w(b"%x\r\n%b\r\n" % (len(out), out))

    def on_upstream_complete(self):
        self.upconn = None
        mode = self.mode
        if mode == M_ERROR:
            status = self.status
            body = b"".join(self.chunks) if self.chunks is not None else b""
            if _transient(status):
                self.last_error = (status, body, self.up_headers, self.codec, self.same)
                self.fail_over("upstream status %d" % status)
                return
            self.release_lane()
            self.final_error(status, body, self.up_headers, self.codec, self.same)
            return
        self.release_lane()
        if mode == M_RELAY_STREAM:
            dec = self.dec
            if dec is not None:
                try:
                    dec.close()
                except Exception:
                    pass
            self._w(b"0\r\n\r\n")
            self.done(True)
        elif mode == M_RELAY_BODY:
            self.done(True)
        elif mode == M_BUFFER:
            body = b"".join(self.chunks)
            headers = self.up_headers
            self.rtt = _perf_ns() - self.t_send
            self.respond(200, _header(headers, b"content-type") or b"application/json", body,
                         self.same_protocol_headers(headers))
        elif mode == M_TRANSLATE_STREAM:
            try:
                events = self.dec.close()
            except Exception:
                events = []
            if events:
                self.emit(events)
            if not self.finished:
                err = self.enc.error("api_error", STREAM_BROKE)
                if err:
                    self._w(b"%x\r\n%b\r\n" % (len(err), err))
            self._w(b"0\r\n\r\n")
            self.done(True)
        elif mode == M_TRANSLATE_BODY:
            # Buffered translation: the body download is upstream time, not busbar's (BENCHMARK.md).
            self.rtt = _perf_ns() - self.t_send
            try:
                resp = self.codec.read_response(b"".join(self.chunks))
            except ir.CodecError:
                self.error(502, "api_error", "The upstream returned a response busbar could not read.")
                return
            if self.forced:
                transform.unwrap_forced_tool(resp, self.forced)
            ing = self.ingress
            resp.id = ing.mint_id()
            if not resp.model:
                resp.model = self.last_model
            self.respond(200, b"application/json", ing.write_response(resp), self.ingress_headers())

    def on_upstream_error(self, reason):
        self.upconn = None
        if self.closed:
            return
        if not self.sent:
            self.fail_over(reason)
            return
        self.broken("api_error", STREAM_BROKE)

    def broken(self, kind, message):
        """The upstream failed after the client got bytes: end the client's answer natively."""
        self.release_lane()
        mode = self.mode
        if mode == M_TRANSLATE_STREAM:
            err = self.enc.error(kind, message)
        elif mode == M_RELAY_STREAM:
            err = self.ingress.StreamEncoder(self.ingress.mint_id(), self.name).error(kind, message)
        else:
            # A length-delimited body cannot be completed: closing tells the client it is short.
            self.done(False)
            return
        if err:
            self._w(b"%x\r\n%b\r\n" % (len(err), err))
        self._w(b"0\r\n\r\n")
        self.done(True)

    def final_error(self, status, body, headers, codec, same):
        if same:
            # Same-protocol upstream errors are relayed verbatim (SPEC §1.3).
            self.respond(status, _header(headers, b"content-type") or b"application/json", body,
                         self.same_protocol_headers(headers))
            return
        try:
            msg = codec.read_error(body)
        except Exception:
            msg = None
        kind = ir.kind_of_status(status)
        self.error(status, kind, msg or "The upstream provider returned an error (%d)." % status)

    # ================================================================== client side
    def pause_upstream(self):
        c = self.upconn
        if c is not None and c.transport is not None:
            c.transport.pause_reading()

    def resume_upstream(self):
        c = self.upconn
        if c is not None and c.transport is not None:
            c.transport.resume_reading()

    def abandon_upstream(self):
        c = self.upconn
        if c is not None:
            self.upconn = None
            c.abandon()

    def client_gone(self):
        if self.closed:
            return
        self.closed = True
        self.abandon_upstream()
        self.release_lane()
        self.gw.inflight -= 1

    def same_protocol_headers(self, up_headers) -> bytes:
        p = self.proto
        if p == "anthropic":
            rid = _header(up_headers, b"request-id")
            return b"request-id: " + (rid or _req_id().encode()) + b"\r\n"
        if p == "bedrock":
            rid = _header(up_headers, b"x-amzn-requestid")
            return b"x-amzn-RequestId: " + (rid or _uuid().encode()) + b"\r\n"
        return b""

    def ingress_headers(self) -> bytes:
        p = self.proto
        if p == "anthropic":
            return b"request-id: " + self.rid().encode() + b"\r\n"
        if p == "bedrock":
            return b"x-amzn-RequestId: " + _uuid().encode() + b"\r\n"
        return b""

    def rid(self):
        if self.request_id is None:
            self.request_id = _req_id()
        return self.request_id

    def _timing(self) -> bytes:
        if not self.gw.server_timing:
            return b""
        dur = _perf_ns() - self.req.t0 - self.rtt
        if dur < 0:
            dur = 0
        return b"Server-Timing: busbar;dur=%.3f\r\n" % (dur / 1e6)

    def head(self, status, ctype, length, extra=b""):
        self.sent = True
        ka = b"" if self.req.keep_alive else b"Connection: close\r\n"
        self.pending = (b"%bContent-Type: %b\r\nContent-Length: %d\r\n%b%b%b\r\n" % (
            status_line(status), ctype, length, extra, self._timing(), ka))

    def head_chunked(self, status, ctype, extra=b""):
        self.sent = True
        ka = b"" if self.req.keep_alive else b"Connection: close\r\n"
        self.pending = (b"%bContent-Type: %b\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\n%b%b%b\r\n" % (
            status_line(status), ctype, extra, self._timing(), ka))

    def _w(self, data):
        """Writes to the client; a head not yet written goes out in the same call, so a small
        answer costs one send instead of two."""
        p = self.pending
        if p is not None:
            self.pending = None
            data = p + data
        self.conn.write(data)

    def respond(self, status, ctype, body, extra=b""):
        self.head(status, ctype, len(body), extra)
        self._w(body)
        self.done(True)

    def error(self, status, kind, message, retry_after=None):
        """An error in the caller's own protocol shape (SPEC §1.7)."""
        proto = self.proto or "openai"
        extra = b""
        if retry_after is not None:
            extra += b"Retry-After: %d\r\n" % retry_after
        body, hdrs = self.gw.error_body(proto, status, kind, message, self.rid())
        self.respond(status, b"application/json", body, extra + hdrs)

    def crash(self, exc):
        """An unexpected exception while handling this request: log it, free what it held and
        answer 500 in the caller's shape (or cut the connection if the answer already started)."""
        import logging
        logging.getLogger("busbar").error("internal error on %s %s: %r", self.req.method.decode(
            "latin-1"), self.req.path, exc, exc_info=exc)
        if self.closed:
            return
        self.abandon_upstream()
        self.release_lane()
        if not self.sent:
            self.pending = None
            self.error(500, "api_error", "The server had an error while processing your request.")
        else:
            self.pending = None
            self.done(False)

    def done(self, keep_alive):
        if self.closed:
            return
        if self.pending is not None:
            self._w(b"")
        self.closed = True
        self.release_lane()
        self.gw.inflight -= 1
        self.conn.exchange_done(keep_alive)


def _header(headers, name):
    for k, v in headers:
        if k == name:
            return v
    return None


def _uuid() -> str:
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return "%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])
