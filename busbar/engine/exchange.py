# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""One client request from parse to last byte: route, attempt, fail over, relay or translate.

A state machine driven by callbacks from the ingress connection and the upstream pool; no task per
request. It reads configuration only from the snapshot it captured when it started.

Two exits, each taken exactly once:
- `end_attempt(fault, reason)` ends the current upstream attempt, whatever happened: it frees the
  lane's permit, stops the attempt's deadline, abandons an upstream connection whose response was
  not read whole, and hands the `Attempt` to the site's attempt hooks.
- `finish(outcome)` ends the request: it flushes the answer, builds the `RequestRecord` (usage read
  on every path) and hands it to the site's finish hooks, then gives the connection back.

Failover stays possible until the first byte of the answer is actually written to the client
(`sent`); a response head that is only queued does not count. After that an upstream failure ends
the client's answer with the ingress protocol's native error event.
"""
from __future__ import annotations

import orjson

from cbusbar import ir
from cbusbar.clock import now_ns
from cbusbar.ids import request_id
from cbusbar.framing import FramingError, scan_top
from cbusbar.h1 import response_head, server_timing
from cbusbar.record import AttemptHook, RecordHook, record_at

from busbar.engine import operations
from busbar.engine.deadlines import Timed
from busbar.engine.modes import Buffer, ErrorBody, Relay, Translate, TranslateStream
from busbar.engine.route import CHAT, COUNT_TOKENS, EMBED, LOCAL
from busbar.engine.records import (
    F_CANCELLED, F_CONNECT, F_CREDENTIALS, F_INTERNAL, F_MALFORMED, F_REFUSED, F_RESET,
    F_STATUS, F_TIMEOUT, F_TRUNCATED, O_BROKEN, O_CLIENT_ERROR, O_CLIENT_GONE, O_INTERNAL, O_OK,
    O_SHED, O_UPSTREAM_ERROR, new_attempt)
from busbar.engine.status import header, status_line
from busbar.engine.translate import CODECS, ClientRequest, forwarded, with_model, write_request
from busbar.engine import classify as RC
from busbar.routing.plan import pick as plan_pick

_loads = orjson.loads

# What the attempt's deadline waits for (Exchange.deadline, the one place it is armed).
D_ATTEMPT = 0       # the request written: the upstream's head, a buffered body, a stream's first byte
D_ERROR_BODY = 1    # a non-2xx head arrived: its body
D_STREAMING = 2     # a stream's first byte is the client's: the rest of it

# How an upstream answer reaches the client (busbar/engine/modes.py), one instance of each, chosen
# when the attempt's upstream head arrives.
ERROR_BODY = ErrorBody()
BUFFER = Buffer()
TRANSLATE = Translate()
RELAY = Relay(streams=True)
TRANSLATE_STREAM = TranslateStream(streams=True)

PARSE_ERROR = "We could not parse the JSON body of your request."
MISSING_MODEL = "Missing required parameter: 'model'."
STREAM_BROKE = "The upstream stream ended unexpectedly."
STREAM_TIMEOUT = "The upstream timed out."

# Request ids: "req_" + a per-process random prefix + a counter, made in C (cbusbar/ids.pyx).
_req_id = request_id


class Exchange(Timed):
    # Every member exchange.pxd declares and construction does not store starts as None, 0 or
    # False (the compiled class's tp_new), which is each one's meaning before the request sets it:
    # no parsed request (cr), target, name, attempt (att, lane, egress, codec, upconn, data), no
    # response mode before the upstream's head (mode: busbar/engine/modes.py), nothing collected
    # (chunks, size), nothing sent (sent, pending, bytes_out,
    # client_status), no deadline (_slot), no upstream status, error or usage yet, not closed;
    # op None = chat (an operations.Op for embeddings / token counting); fallbacks = on_exhausted
    # fallback_pool hops taken (a runtime loop guard); governance's principal (the caller's
    # KeyRecord once authenticated), ticket (what admission took, busbar/governance/gate.py) and
    # denied (the gate that refused); spans = the body's top-level members the codec names
    # (SCAN_KEYS); relay = a same-protocol stream's relay filter (codec.stream_usage_request);
    # queued = reliability's Waiter once on_exhausted queued the request; downgraded = the pools
    # a budget's on_exhaust: downgrade re-routed it to (None: none). Storing those defaults
    # again cost ~30 cache lines of code a request (bench/code_lines.py), code a request at
    # concurrency 1 finds cold.
    def __init__(self, site, conn, req, route, snap):
        self._setup(site, conn, req, route, snap)

    def _setup(self, site, conn, req, route, snap):
        self.site = site
        self.conn = conn
        self.req = req
        self.route = route
        self.snap = snap
        self.proto = route.protocol
        self.tried = set()
        self.attempts = []
        self.wheel = site.deadlines
        self.pool = site.pool

    # ================================================================== entry
    def start(self):
        route = self.route
        site = self.site
        kind = route.kind
        site.inflight += 1
        if kind == CHAT or kind == EMBED or kind == COUNT_TOKENS:
            mi = self.snap.max_inbound
            if mi and site.inflight > mi:
                if site.on_shed is not None:    # observe: the shedding event, once per burst
                    site.on_shed()
                self.error(503, "overloaded", "The gateway is at capacity. Please retry shortly.",
                           retry_after=1, outcome=O_SHED)
                return
            self.chat()
        else:
            # What busbar answers itself (its route table's entries, busbar/server/local.py and
            # what other parts registered), or a refusal of the protocol dispatch (404, 405):
            # the route's handler answers through this exchange, or returns the Response.
            out = route.handler(self)
            if out is not None:
                self.respond(out.status, out.ctype, out.body, out.headers)

    def own_error(self, kind):
        """(status, message) of busbar's own refusal in the caller's vendor's words."""
        return CODECS[self.proto or "openai"].own_error(kind)

    def chat(self):
        req = self.req
        route = self.route
        ingress = self.ingress = CODECS[self.proto]
        body = req.body
        try:
            spans = self.spans = scan_top(body, ingress.SCAN_KEYS)
        except FramingError:
            self.error(400, "invalid_request", PARSE_ERROR)
            return
        self.model_span = spans.get(b"model")
        if route.name_in_body:
            span = self.model_span
            name = _loads(body[span[0]:span[1]]) if span is not None else None
            if not isinstance(name, str) or not name:
                self.error(400, "invalid_request", MISSING_MODEL if name is None or name == "" else
                           "Invalid type for 'model': expected a string.")
                return
        else:
            name = route.name
        self.name = name
        if route.kind == CHAT and not route.may_embed:
            op = None       # a chat route is chat (what operations.select answers, without the call)
        else:
            op = self.op = operations.select(self)
        if op is not None:
            msg = op.begin(self, body)
            if msg is not None:
                self.error(400, "invalid_request", msg)
                return
        elif ingress.BODY_MODEL:
            s = spans.get(b"stream")
            self.stream = s is not None and body[s[0]:s[1]] == b"true"
        else:
            self.stream = route.stream
        target = self.target = self.snap.router.resolve(name)
        gov = self.snap.governance
        if gov is not None and gov.keys and not (target is not None and target.byok):
            # governance: who is calling, before anything else is said (an unknown model to a
            # caller without a key is a 401, not a 404); BYOK targets skip it.
            self.site.gate.enter(self, gov, self.routed)
            return
        self.routed()

    def routed(self):
        target = self.target
        op = self.op
        if target is None:
            self.error(404, "not_found", self.ingress.not_found_message(self.name,
                                                                        self.route.gemini_version))
            return
        # Lanes that do not serve the operation are never candidates; none left is a native 404.
        tried = self.tried
        tried.update(target.lacking(op.name if op is not None else "chat"))
        if op is not None:
            egress = self.snap.egress
            for lane in target.lanes:
                if not op.candidate(egress[lane.model.provider.name]):
                    tried.add(lane)
        if len(tried) >= len(target.lanes):
            self.error(404, "not_found", operations.NOT_SERVED)
            return
        plan = target.plan
        if plan is not None and plan.hooks is not None:
            # The pool's hooks (busbar/hooks/run.py): admission, then the hooks, then attempt().
            plan.hooks.start(self)
            return
        if self.principal is not None:
            self.site.gate.admit(self, self.snap.governance, self.attempt)
            return
        self.attempt()

    # ================================================================== attempts
    def attempt(self, lane=None):
        snap = self.snap
        if lane is None:
            # reliability (busbar/reliability/state.py): after a failed attempt, the target's hop
            # and time budgets (SPEC §4.3); with no lane to take the request, on_exhausted and the
            # caller's answer. Either answers the request itself when it says no.
            if self.attempts and not self.site.reliability.next_hop(self):
                return
            target = self.target
            if target.plan is None and self.routing is None:
                lane = target.pick(self.tried)
            else:
                # Strategy, tiers, affinity, a hook's decision (busbar/routing/plan.py).
                lane = plan_pick(self)
            if lane is None:
                self.site.reliability.exhausted(self)
                return
        self.lane = lane
        self.tried.add(lane)
        r = self.routing
        if r is not None and r.hooks is not None:
            r.hooks.routing(self, lane)     # the routing-stage taps
        now = now_ns()
        self.att = new_attempt(lane, now)
        model = lane.model
        eg = snap.egress[model.provider.name]
        self.egress = eg
        proto = eg.protocol
        codec = CODECS[proto]
        self.codec = codec
        wire = model.upstream_model
        self.last_model = wire
        if not eg.ready and not self.target.passthrough:
            # The provider's refreshed credentials (AWS chain, GCP OAuth) have not arrived yet
            # (a passthrough pool sends the caller's, and needs none of its own).
            self.end_attempt(F_CREDENTIALS, "no upstream credentials yet")
            self.attempt()
            return
        stream = self.stream
        extra = b""
        self.forced = None
        self.relay = None
        op = self.op
        if op is not None:
            try:
                body, path, self.same, extra = op.request(self, lane, eg)
            except ir.CodecError as e:
                self.end_attempt(F_REFUSED, "the request cannot be written for this lane")
                self.error(400, "invalid_request", str(e))
                return
            stream = False
        elif proto == self.proto:
            self.same = True
            body = self.req.body
            if codec.BODY_MODEL:
                body = with_model(body, self.model_span, snap.wire(wire))
            if stream and (self.principal is not None or self.site.finish_hooks):
                # Usage on every path that reads it (SPEC §5): a key's settlement and the finish
                # hooks (metrics, logs, traces). The codec makes the upstream send it, and gives
                # a filter that hides it again from a client that did not ask for it. With no
                # reader the client's body goes up as it came (the tap still reads a usage the
                # client asked for itself): rewriting it and hiding the answer's usage again cost
                # the relay's first byte 14 µs in the bench's cold regime, for nobody.
                body, self.relay = codec.stream_usage_request(body, self.spans)
            betas = snap.beta_headers.get(proto)
            if betas:
                extra = forwarded(betas, self.req.headers)
        else:
            self.same = False
            cr = self.cr
            if cr is None:
                try:
                    cr = self.cr = ClientRequest(self.ingress, self.req.body)
                except ir.CodecError as e:
                    self.end_attempt(F_REFUSED, "the request cannot be read")
                    self.error(400, "invalid_request", str(e) or PARSE_ERROR)
                    return
            try:
                body, self.forced = write_request(
                    cr, codec, wire, stream, self.target.reasoning(lane),
                    model.default_max_tokens or snap.limits.default_max_tokens,
                    model.prompt_caching)
            except ir.CodecError as e:
                self.end_attempt(F_REFUSED, "the request cannot be written for this lane")
                self.error(400, "invalid_request", str(e))
                return
        if op is None:
            path = codec.upstream_path(wire, stream)
        if self.site.trace_header is not None:    # observe: W3C traceparent upstream
            extra += self.site.trace_header(self)
        if eg.passthrough or self.target.passthrough:
            # upstream_credentials: passthrough (the pool's, or the provider's): the caller's key
            self.data = eg.forward(path, body, stream, extra, self.req)
        else:
            self.data = eg.request(path, body, stream, extra)
        self.deadline(D_ATTEMPT)
        # Upstream time starts here: a connect (and TLS handshake) the pool has to make is the
        # upstream's time, not busbar's (Server-Timing); a reused connection restarts it at the send.
        self.t_send = now_ns()
        self.pool.acquire(eg.key, self._on_conn, self._on_conn_error)

    def deadline(self, phase):
        """The one place this request's upstream deadline is armed (end_attempt disarms it), for
        what the attempt waits for (D_*):
        - D_ATTEMPT, the request written: connect + time to headers, and a buffered body or a
          stream's first byte (both before the client saw anything, so failover is still
          possible): the lane's attempt_timeout_ms (a pool member's own, else its model's) or
          limits.upstream_request_timeout_secs, and within what is left of the pool's
          failover.timeout_secs;
        - D_ERROR_BODY, a non-2xx head arrived: what is left of that bound, and at most
          limits.upstream_error_body_timeout_secs: the status already says what happened (mostly:
          fail over), and a body that does not come must not hold the next lane back;
        - D_STREAMING, a stream's first byte written to the client: the whole-request bound
          (limits.upstream_request_timeout_secs since the request was sent) only."""
        lim = self.snap.limits
        if phase == D_STREAMING:
            t = lim.upstream_request_timeout_secs - (now_ns() - self.t_send) / 1e9
        else:
            elapsed = 0.0 if phase == D_ATTEMPT else (now_ns() - self.att.t_start) / 1e9
            t = lim.upstream_request_timeout_secs - elapsed
            ato = self.lane.model.attempt_timeout_ms
            pol = self.target.policy
            if pol is not None:
                # reliability: a member's own attempt timeout, and what is left of the request's
                # budget.
                cell = pol.cell_of.get(self.lane)
                if cell is not None and cell.attempt_timeout_ms is not None:
                    ato = cell.attempt_timeout_ms
                left = pol.failover.timeout_secs - (now_ns() - self.req.t0) / 1e9
                if left < t:
                    t = left
            if ato is not None and ato / 1000.0 - elapsed < t:
                t = ato / 1000.0 - elapsed
            if phase == D_ERROR_BODY and lim.upstream_error_body_timeout_secs < t:
                t = lim.upstream_error_body_timeout_secs
        self.wheel.arm(self, t if t > 0.001 else 0.001)

    def _on_conn(self, conn):
        att = self.att
        if att is None or self.closed:
            # The attempt ended while connecting (timeout, client gone): the fresh connection has
            # carried nothing and is idle.
            self.pool.release(conn)
            return
        self.upconn = conn
        self.mode = None
        self.chunks = None
        self.size = 0
        att.t_connected = t = now_ns()
        if conn.idle_since:     # reused (a fresh connection's is 0.0): nothing to wait for
            self.t_send = t
        data = self.data
        self.data = None
        conn.send(self, data)

    def _on_conn_error(self, reason):
        if self.att is None or self.closed:
            return
        self.end_attempt(F_CONNECT, reason)
        self.attempt()

    def on_deadline(self):
        """A deadline of this request passed (called by the site's Deadlines sweep)."""
        if self.closed or self.att is None:
            return
        if not self.sent:
            if self.mode is ERROR_BODY:
                # An error body that stalls: the status alone decides (what came of the body is
                # not JSON one could relay).
                self.status_error(None)
                return
            self.end_attempt(F_TIMEOUT, "upstream timeout")
            self.attempt()
        else:
            self.broken(F_TIMEOUT, "timeout", STREAM_TIMEOUT)

    def end_attempt(self, fault, reason=None):
        """The one exit of an attempt: frees its lane and deadline, drops an upstream connection
        whose response was not read whole, records the outcome and hands it to the site's hooks.
        `fault` is one of records.F_* or None for an answer read whole."""
        a = self.att
        if a is None:
            return
        self.att = None
        a.t_end = now_ns()
        a.fault = fault
        a.reason = reason
        a.bytes_in = self.size
        c = self.upconn
        if c is not None:
            self.upconn = None
            c.abandon()
        if self._slot is not None:
            self.wheel.disarm(self)
        lane = self.lane
        if lane is not None:
            self.lane = None
            lane.release()
        self.attempts.append(a)
        hooks = self.site.attempt_hooks
        if hooks:
            for h in hooks:
                try:
                    if isinstance(h, AttemptHook):  # a hook written in C: called through its vtable
                        ah = h
                        ah.on_attempt(self, a)
                    else:
                        h(self, a)
                except Exception:   # an observer's bug never costs the request
                    _log_hook_failure(h)
        if fault is not None and fault != F_CANCELLED and fault != F_REFUSED:
            self.site.log_debug("attempt on %s failed: %s (%s)", a.lane.name, fault, reason)

    def fault(self, fault, reason):
        """The current attempt failed in a way another lane may not: fail over while the client has
        seen nothing, else end its answer natively."""
        if not self.sent:
            self.pending = None
            self.end_attempt(fault, reason)
            self.attempt()
        else:
            self.broken(fault, "api_error", STREAM_BROKE)

    # ================================================================== upstream callbacks
    def on_upstream_headers(self, status, headers):
        t = now_ns()
        att = self.att
        att.t_headers = t
        att.status = status
        self.rtt = t - self.t_send
        self.status = status
        self.up_headers = headers
        if status < 200 or status >= 300:
            self.mode = ERROR_BODY
            self.chunks = []
            self.deadline(D_ERROR_BODY)
            return
        # A 2xx body, or a stream up to its first byte to the client, counts against the attempt:
        # the deadline armed when the attempt started keeps running (not re-armed here).
        ct = None
        if self.stream:
            ct = header(headers, b"content-type")
            if ct is not None and not ct.startswith(self.codec.STREAM_CONTENT_TYPE):
                # An answer that is not a stream, to a stream request: the lane misbehaves.
                self.fault(F_MALFORMED, "a stream request answered with %s" % ct.decode("latin-1")[:64])
                return
            # The answer's mode (busbar/engine/modes.py), chosen for this attempt's lane.
            m = RELAY if self.same and not self.route.json_array else TRANSLATE_STREAM
        else:
            m = BUFFER if self.same else TRANSLATE
        self.mode = m
        m.begin(self, ct)

    def on_upstream_body(self, chunk):
        self.size += len(chunk)
        m = self.mode
        if m is not None:
            m.body(self, chunk)

    def _collect(self, chunk, cap):
        if self.chunks is None:
            return True
        if self.size > cap:
            self.chunks = None
            return False
        self.chunks.append(chunk)
        return True

    def on_upstream_complete(self):
        self.upconn = None      # the pool took the connection back (or closed it)
        m = self.mode
        if m is not None:
            m.complete(self)

    def status_error(self, body):
        """A non-2xx upstream answer: classified (busbar/engine/classify.py), its attempt
        ended with the disposition, then another lane or the caller's answer. `body` None: it did
        not come in time, the status alone decides, and the caller's answer is busbar's own
        error for that status, in its shape."""
        status = self.status
        f = RC.classify_status(self.codec, status, self.up_headers, body or b"",
                               self.egress.provider, self.target.passthrough)
        att = self.att
        att.disposition = d = f.disposition
        att.retry_after = f.retry_after
        att.error_class = f.cls
        lane = self.lane
        if body is None:
            self.end_attempt(F_STATUS, "upstream status %d (body timed out)" % status)
            le = (status, b"", self.up_headers, self.codec, False)
        else:
            self.end_attempt(F_STATUS, "upstream status %d" % status)
            le = (status, body, self.up_headers, self.codec, self.same)
        if d in RC.FAIL_OVER:
            self.last_error = le
            if d == RC.D_CONTEXT:
                self.site.reliability.context_exceeded(self, lane)
            self.attempt()
            return
        self.final_error(*le, outcome=O_UPSTREAM_ERROR)

    def truncated(self):
        """A 2xx stream that ended without its final event."""
        if not self.sent:
            self.pending = None
            self.end_attempt(F_TRUNCATED, "stream ended without its final event")
            self.attempt()
            return
        self.broken(F_TRUNCATED, "api_error", STREAM_BROKE)

    def on_upstream_error(self, reason):
        self.upconn = None
        if self.closed or self.att is None:
            return
        self.fault(F_RESET, reason)

    def broken(self, fault, kind, message):
        """The upstream failed after the client got bytes: end the client's answer natively."""
        self.end_attempt(fault, message)
        m = self.mode
        err = m.end_event(self, kind, message) if m is not None else None
        if err is None:
            # A length-delimited body cannot be completed: closing tells the client it is short.
            self.finish(O_BROKEN, keep_alive=False)
            return
        if err:
            self.chunk(err)
        self.end_chunks(O_BROKEN)

    def final_error(self, status, body, headers, codec, same, outcome=O_UPSTREAM_ERROR):
        mask = self.snap.mask
        # The upstream's own Retry-After goes with its error, relayed or re-enveloped: an SDK
        # that reads it waits as long as the provider asked.
        ra = _retry_after_lines(headers)
        if same:
            # Same-protocol upstream errors are relayed verbatim (SPEC §1.3), secrets masked.
            self.respond(status, header(headers, b"content-type") or b"application/json",
                         mask.mask(body), self.ingress.response_headers(headers, self.rid()) + ra,
                         outcome=outcome)
            return
        msg, _code = codec.read_error_detail(body)
        if msg:
            msg = mask.mask_text(msg)
        kind = ir.kind_of_status(status)
        self.error(status, kind, msg or "The upstream provider returned an error (%d)." % status,
                   outcome=outcome, extra=ra)

    # ================================================================== client side
    def pause_upstream(self):
        c = self.upconn
        if c is not None:
            c.pause()

    def resume_upstream(self):
        c = self.upconn
        if c is not None:
            c.resume()

    def client_gone(self):
        """The client closed (FIN or RST): cancel the attempt at once, free its lane."""
        if self.closed:
            return
        self.pending = None
        self.end_attempt(F_CANCELLED, "client closed the connection")
        self.finish(O_CLIENT_GONE, keep_alive=False)

    def rid(self):
        if self.request_id is None:
            self.request_id = _req_id()
        return self.request_id

    def _timing(self) -> bytes:
        if not self.snap.server_timing:
            return b""
        return server_timing(now_ns() - self.req.t0 - self.rtt)

    def head(self, status, ctype, length, extra=b""):
        self.client_status = status
        self.pending = response_head(status_line(status), ctype, length, extra, self._timing(),
                                     not self.req.keep_alive)

    def head_chunked(self, status, ctype, extra=b""):
        self.client_status = status
        self.pending = response_head(status_line(status), ctype, -1, extra, self._timing(),
                                     not self.req.keep_alive)

    def _w(self, data):
        """Writes to the client; a head not yet written goes out in the same call, so a small
        answer costs one send instead of two. The first write is the point of no return."""
        p = self.pending
        if p is not None:
            self.pending = None
            data = p + data
        self.bytes_out += len(data)
        if self.sent:
            self.conn.write(data)
            return
        self.sent = True
        self.conn.write(data)
        m = self.mode
        if self.att is not None and m is not None and m.streams:
            # Past the first byte a stream is bounded by the whole-request timeout only (re-armed
            # after the write: the first byte does not wait for the wheel).
            self.deadline(D_STREAMING)

    def chunk(self, data):
        """One piece of a chunked answer to the client (HTTP/1.1 chunked coding, RFC 9112 §7.1)."""
        self._w(b"%x\r\n%b\r\n" % (len(data), data))

    def end_chunks(self, outcome):
        """The last chunk of a chunked answer, then the request's end."""
        self._w(b"0\r\n\r\n")
        self.finish(outcome)

    def answer(self, ctype, body, extra):
        """An upstream answer read whole and good (buffered, relayed or translated): written
        before its attempt's bookkeeping (deadline, lane permit, hooks), which cannot change it
        and which the client need not wait for, then the request's end."""
        self.head(200, ctype, len(body), extra)
        self._w(body)
        self.end_attempt(None)
        self.finish(O_OK)

    def respond(self, status, ctype, body, extra=b"", outcome=None):
        self.head(status, ctype, len(body), extra)
        self._w(body)
        if outcome is None:
            outcome = O_OK if status < 400 else O_CLIENT_ERROR
        self.finish(outcome)

    def error(self, status, kind, message, retry_after=None, outcome=O_CLIENT_ERROR, extra=b""):
        """An error in the caller's own protocol shape (SPEC §1.7); `extra`: header lines."""
        if retry_after is not None:
            extra += b"Retry-After: %d\r\n" % retry_after
        codec = CODECS[self.proto or "openai"]
        rid = self.rid()
        body = codec.write_error(status, kind, message, rid)
        self.respond(status, b"application/json", body, extra + codec.error_headers(kind, rid),
                     outcome=outcome)

    def crash(self, exc):
        """An unexpected exception while handling this request: log it, free what it held and
        answer 500 in the caller's shape (or cut the connection if the answer already started)."""
        import logging
        logging.getLogger("busbar").error("internal error on %s %s: %r", self.req.method.decode(
            "latin-1"), self.req.path, exc, exc_info=exc)
        if self.closed:
            return
        self.end_attempt(F_INTERNAL, repr(exc)[:200])
        self.pending = None
        if not self.sent:
            self.error(500, "api_error", "The server had an error while processing your request.",
                       outcome=O_INTERNAL)
        else:
            self.finish(O_INTERNAL, keep_alive=False)

    def finish(self, outcome, keep_alive=True):
        """The one exit of a request: flush, record, hand the connection back."""
        if self.closed:
            return
        if self.pending is not None:
            self._w(b"")
        self.closed = True
        if self.att is not None:    # never expected: every path ends its attempt first
            self.end_attempt(F_INTERNAL, "request finished with an attempt open")
        if self.queued is not None:     # reliability: out of a wait queue (a client that left)
            self.queued.leave()
            self.queued = None
        if self.usage is None:
            # A stream that ended early (the client left after the last event, before the
            # upstream's end arrived; or a mid-stream failure) is billed what it reported so far.
            src = self.tap if self.tap is not None else self.tx
            if src is not None:
                self.usage = src.usage
        site = self.site
        site.inflight -= 1
        self.t_end = now_ns()
        r = self.routing
        if r is not None and r.hooks is not None:
            r.hooks.response(self, outcome)     # the response-stage taps (fire and forget)
        elif self.denied is not None:
            target = self.target
            if target is not None and target.plan is not None and target.plan.hooks is not None:
                target.plan.hooks.denied(self)
        key = self.principal
        if key is not None and (self.ticket is not None or self.attempts):
            atts = self.attempts
            try:
                site.gate.settle(self, self.ticket, self.snap.governance, key,
                                 atts[-1].lane.name if atts else None, self.usage, self.client_status)
            except Exception:
                _log_hook_failure(site.gate.settle)
            self.ticket = None
        hooks = site.finish_hooks
        if hooks and self.route.kind != LOCAL:
            # The RequestRecord, built in C; the attempts read here, where they are typed. Only
            # calls are records: what busbar answers about itself (/healthz, /stats, the model
            # list) is not an LLM request, and a Kubernetes probe every few seconds would drown
            # the real traffic in the counters, the access log and the request-log sinks.
            up = 0
            failed = 0
            a = None
            atts = self.attempts
            for a in atts:
                if a.t_connected:
                    up += a.t_end - a.t_connected
                if a.fault is not None:
                    failed += 1
            target = self.target
            rec = record_at(outcome, self.request_id, self.proto,
                            target.name if target is not None else None, atts,
                            a.lane if a is not None else None, up, failed, self.stream,
                            self.client_status, self.usage, self.req.t0, self.t_end,
                            self.bytes_out, self.conn.peer, self.principal, self.denied)
            r = self.routing
            if r is not None and r.hooks is not None:
                rec.hooks = r.hooks.decisions()     # the access log's `hooks` and `hook_ms`
                rec.hook_ns = r.hooks.ns
            for h in hooks:
                try:
                    if isinstance(h, RecordHook):   # a hook written in C: called through its vtable
                        ch = h
                        ch.on_finish(rec)
                    else:
                        h(rec)
                except Exception:   # an observer's bug never costs the request
                    _log_hook_failure(h)
        conn = self.conn
        req = self.req
        # The request body can be large: nothing keeps it once the answer is out.
        self.data = None
        self.chunks = None
        self.cr = None
        conn.exchange_done(keep_alive and req.keep_alive and outcome != O_CLIENT_GONE)


def new_exchange(site, conn, req, route):
    """The exchange of a request on `site`'s data listener, with the snapshot current now (the
    Gateway binds this as its `new_exchange`: a C call, no Python frame per request)."""
    ex = Exchange.__new__(Exchange)     # compiled: tp_new directly, no argument tuple to parse
    ex._setup(site, conn, req, route, site.snapshot)
    return ex


def _log_hook_failure(hook):
    import logging
    logging.getLogger("busbar").exception("lifecycle hook %r failed", hook)


def _retry_after_lines(headers):
    """An upstream answer's Retry-After (and OpenAI's retry-after-ms) as header lines, as sent."""
    out = b""
    for k, v in headers:
        if k == b"retry-after":
            out += b"Retry-After: " + v + b"\r\n"
        elif k == b"retry-after-ms":
            out += b"retry-after-ms: " + v + b"\r\n"
    return out
