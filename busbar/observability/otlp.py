"""OTLP/HTTP traces, JSON encoding (no protobuf dependency): one span per request and a child span
per upstream attempt, GenAI semantic-convention attributes (gen_ai.system, gen_ai.request.model,
gen_ai.response.model, gen_ai.usage.input_tokens/output_tokens), the failover reason on failed
attempts.

W3C trace context: a client's valid `traceparent` makes the request span its child (same trace id);
each attempt's upstream request carries a `traceparent` naming that attempt's span
(`site.trace_header`, called where the exchange builds the upstream request).

Spans are batched on the loop and POSTed with aiohttp, one delivery in flight at a time, every
FLUSH_SECS or at MAX_BATCH spans; past MAX_QUEUED waiting spans new ones are dropped and counted
(`busbar_records_dropped_total{sink="otlp"}`). `close()` flushes on shutdown, bounded."""
from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import time

import orjson

from busbar.observability.metrics import failover_reason

log = logging.getLogger("busbar")

FLUSH_SECS = 1.0
# Collectors' default max request size is 4 MiB (otelcol's confighttp); 512 spans of ~1 KiB stay
# well under it.
MAX_BATCH = 512
# ~8 batches waiting (a collector down for seconds at high load) before dropping.
MAX_QUEUED = 4096
DELIVERY_TIMEOUT_SECS = 5.0
SHUTDOWN_FLUSH_SECS = 3.0

_TRACEPARENT = re.compile(rb"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})\Z")
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16
# OTLP span kinds and status codes.
SERVER, CLIENT = 2, 3
STATUS_OK, STATUS_ERROR = 1, 2


class _Ctx:
    __slots__ = ("trace_id", "parent", "span_id", "sampled", "attempt_spans")

    def __init__(self, trace_id, parent, sampled):
        self.trace_id = trace_id
        self.parent = parent
        self.span_id = os.urandom(8).hex()
        self.sampled = sampled
        self.attempt_spans = []     # span id of each attempt, in order


def _attr(k, v):
    if isinstance(v, bool):
        return {"key": k, "value": {"boolValue": v}}
    if isinstance(v, int):
        return {"key": k, "value": {"intValue": str(v)}}
    return {"key": k, "value": {"stringValue": str(v)}}


class Tracer:
    def __init__(self, gw, settings, state):
        self.gw = gw
        self.url = settings.url
        self.headers = {"content-type": "application/json", **dict(settings.headers)}
        self.ratio = settings.sample_ratio
        self.state = state
        self.ctx = {}           # request id → _Ctx while the request runs
        self.queue = []
        self.sending = None
        self.session = None
        self.closed = False
        self.offset = time.time_ns() - time.perf_counter_ns()
        gw.trace_header = self.header
        self.handle = gw.loop.call_later(FLUSH_SECS, self._tick)

    # ------------------------------------------------------------------ lifecycle hooks
    def _context(self, ex):
        rid = ex.rid()
        c = self.ctx.get(rid)
        if c is None:
            tp = ex.req.headers.get(b"traceparent")
            m = _TRACEPARENT.match(tp.strip().lower()) if tp else None
            if m and m.group(1) != _ZERO_TRACE and m.group(2) != _ZERO_SPAN:
                c = _Ctx(m.group(1).decode(), m.group(2).decode(),
                         random.random() < self.ratio)
            else:
                c = _Ctx(os.urandom(16).hex(), None, random.random() < self.ratio)
            self.ctx[rid] = c
        return c

    def header(self, ex) -> bytes:
        c = self._context(ex)
        sid = os.urandom(8).hex()
        c.attempt_spans.append(sid)
        return b"traceparent: 00-%s-%s-%s\r\n" % (c.trace_id.encode(), sid.encode(),
                                                  b"01" if c.sampled else b"00")

    def on_attempt(self, ex, a):
        pass    # the attempt's span is written at finish, from the record's attempts

    def on_finish(self, rec):
        c = self.ctx.pop(rec.request_id, None) if rec.request_id else None
        if c is None:
            c = _Ctx(os.urandom(16).hex(), None, random.random() < self.ratio)
        if not c.sampled:
            return
        if len(self.queue) >= MAX_QUEUED:
            self.state.dropped("otlp", 1 + len(rec.attempts))
            return
        off = self.offset
        u = rec.usage
        attrs = [_attr("busbar.request_id", rec.request_id or ""),
                 _attr("busbar.ingress_protocol", rec.ingress or ""),
                 _attr("busbar.pool", rec.target or "unresolved"),
                 _attr("busbar.outcome", rec.outcome),
                 _attr("busbar.attempts", len(rec.attempts)),
                 _attr("http.response.status_code", rec.status),
                 _attr("gen_ai.operation.name", "chat")]
        if rec.target:
            attrs.append(_attr("gen_ai.request.model", rec.target))
        if rec.model:
            attrs.append(_attr("gen_ai.response.model", rec.model))
        if rec.egress:
            attrs.append(_attr("gen_ai.system", rec.egress))
        if u is not None:
            attrs.append(_attr("gen_ai.usage.input_tokens", u.input_tokens or 0))
            attrs.append(_attr("gen_ai.usage.output_tokens", u.output_tokens or 0))
        root = {"traceId": c.trace_id, "spanId": c.span_id, "name": "busbar %s" % (rec.target or "request"),
                "kind": SERVER, "startTimeUnixNano": str(rec.t0 + off),
                "endTimeUnixNano": str(rec.t_end + off), "attributes": attrs,
                "status": {"code": STATUS_OK if rec.outcome == "ok" else STATUS_ERROR}}
        if c.parent:
            root["parentSpanId"] = c.parent
        spans = [root]
        ids = c.attempt_spans
        for i, a in enumerate(rec.attempts):
            sid = ids[i] if i < len(ids) else os.urandom(8).hex()
            lane = a.lane
            aattrs = [_attr("busbar.lane", lane.name if lane else ""),
                      _attr("http.response.status_code", a.status)]
            if lane is not None:
                aattrs.append(_attr("gen_ai.system", lane.model.provider.protocol))
                aattrs.append(_attr("gen_ai.request.model", lane.model.upstream_model))
            if a.fault is not None:
                aattrs.append(_attr("error.type", a.fault))
                aattrs.append(_attr("busbar.failover_reason", failover_reason(a)))
                if a.reason:
                    aattrs.append(_attr("busbar.fault_reason", a.reason[:200]))
            spans.append({"traceId": c.trace_id, "spanId": sid, "parentSpanId": c.span_id,
                          "name": "upstream %s" % (lane.name if lane else "-"), "kind": CLIENT,
                          "startTimeUnixNano": str(a.t_start + off),
                          "endTimeUnixNano": str((a.t_end or rec.t_end) + off),
                          "attributes": aattrs,
                          "status": {"code": STATUS_ERROR if a.fault else STATUS_OK}})
        self.queue.extend(spans)
        if len(self.queue) >= MAX_BATCH:
            self._send()

    # ------------------------------------------------------------------ delivery
    def _tick(self):
        self.handle = None
        if self.queue:
            self._send()
        if not self.closed:
            self.handle = self.gw.loop.call_later(FLUSH_SECS, self._tick)

    def _send(self):
        if self.sending is not None and not self.sending.done():
            return
        batch, self.queue = self.queue[:MAX_BATCH], self.queue[MAX_BATCH:]
        self.sending = self.gw.loop.create_task(self._post(batch))

    def _body(self, spans) -> bytes:
        return orjson.dumps({"resourceSpans": [{
            "resource": {"attributes": [_attr("service.name", "busbar")]},
            "scopeSpans": [{"scope": {"name": "busbar"}, "spans": spans}]}]})

    async def _post(self, spans):
        import aiohttp
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=DELIVERY_TIMEOUT_SECS))
        try:
            async with self.session.post(self.url, data=self._body(spans), headers=self.headers,
                                         allow_redirects=False) as r:
                await r.read()
                if r.status >= 300:
                    self.state.dropped("otlp", len(spans))
        except Exception as e:
            self.state.dropped("otlp", len(spans))
            log.debug("otlp delivery failed: %r", e)

    async def close(self):
        self.closed = True
        if self.handle is not None:
            self.handle.cancel()
        deadline = time.monotonic() + SHUTDOWN_FLUSH_SECS
        try:
            while (self.queue or (self.sending is not None and not self.sending.done())) \
                    and time.monotonic() < deadline:
                if self.sending is not None and not self.sending.done():
                    await asyncio.wait_for(asyncio.shield(self.sending), deadline - time.monotonic())
                elif self.queue:
                    self._send()
        except asyncio.TimeoutError:
            pass
        if self.session is not None:
            await self.session.close()
