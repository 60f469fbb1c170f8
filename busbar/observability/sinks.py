"""Request-log sinks (export modules request-log-file and request-log-webhook): one JSON record per
request, to a file (JSONL, rotated by size) or a webhook (fire-and-forget POST per record, at most
`max_inflight` deliveries at once, each bounded by `timeout_ms`).

The record is the Rust gateway's: `{"ts": unix seconds, "ingress_protocol", "pool" (a configured
name or "unresolved"), "outcome" (ok, exhausted, client_error, error: from the status answered, as
busbar_requests_total), "latency_ms": end to end}`. An instance's `fields:` (a busbar extension)
chooses among those and busbar's own (settings.RECORD_FIELDS: the access-log fields, egress
protocol, stream, reasoning tokens, bytes out, each failed attempt, and `busbar_outcome`, busbar's
own outcome word). A request whose client left before any answer has no record (no status, as the
Rust gateway logs only what it answered); the access log has it.

A record that finds the sink full is dropped and counted: busbar_records_dropped_total{sink} and
busbar_admission_denied_total{gate} with busbar_webhook_logs_dropped_total or
busbar_file_logs_dropped_total; a webhook delivery that fails is counted in the first only. No
prompt or completion text is ever part of the record."""
from __future__ import annotations

import logging
import time

import orjson

from cbusbar.metrics import status_outcome

from busbar.observability.access_log import full_fields
from busbar.observability.lines import LineWriter
from busbar.observability.metrics import STATUS_OUTCOMES

log = logging.getLogger("busbar")


def record(rec, now: float, fields=None):
    """The request-log record of a RequestRecord, projected on `fields` (None: the Rust
    gateway's five); None for a request that was never answered."""
    s = status_outcome(rec.status)
    if s >= len(STATUS_OUTCOMES):
        return None
    d = {"ts": int(now), "ingress_protocol": rec.ingress, "pool": rec.target or "unresolved",
         "outcome": STATUS_OUTCOMES[s], "latency_ms": (rec.t_end - rec.t0) // 1_000_000}
    if fields is None:
        return d
    more = full_fields(rec, now)
    more["busbar_outcome"] = more.pop("outcome")
    more.update(d)
    return {k: more.get(k) for k in fields}


class FileSink:
    def __init__(self, settings, state):
        self.fields = settings.fields
        self.name = "file"
        self.state = state
        self.writer = LineWriter(settings.path, settings.rotate_mb * 1024 * 1024,
                                 on_drop=self._full)

    def _full(self):
        self.state.dropped(self.name)
        self.state.shed("request-log-file")

    def on_finish(self, rec):
        d = record(rec, time.time(), self.fields)
        if d is not None:
            self.writer.write(orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE))

    def close(self):
        self.writer.close()


class WebhookSink:
    def __init__(self, gw, settings, state):
        self.gw = gw
        self.url = settings.url
        self.fields = settings.fields
        self.max_inflight = settings.max_inflight
        self.timeout = settings.timeout_ms / 1000.0
        self.headers = {"content-type": "application/json"}
        if settings.auth_header:
            self.headers["authorization"] = settings.auth_header
        self.state = state
        self.name = "webhook"
        self.inflight = set()
        self.session = None

    def on_finish(self, rec):
        d = record(rec, time.time(), self.fields)
        if d is None:
            return
        if len(self.inflight) >= self.max_inflight:
            self.state.dropped(self.name)
            self.state.shed("webhook")
            return
        t = self.gw.loop.create_task(self._post(orjson.dumps(d)))
        self.inflight.add(t)
        t.add_done_callback(self.inflight.discard)

    async def _post(self, body):
        import aiohttp
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout))
        try:
            async with self.session.post(self.url, data=body, headers=self.headers,
                                         allow_redirects=False) as r:
                await r.read()
                if r.status >= 300:
                    self.state.dropped(self.name)
        except Exception as e:
            self.state.dropped(self.name)
            log.debug("request-log webhook delivery failed: %r", e)

    async def close(self):
        import asyncio
        if self.inflight:
            await asyncio.wait(list(self.inflight), timeout=self.timeout)
        if self.session is not None:
            await self.session.close()


def make_sinks(gw, sinks, state):
    return [FileSink(s, state) if s.kind == "file" else WebhookSink(gw, s, state) for s in sinks]
