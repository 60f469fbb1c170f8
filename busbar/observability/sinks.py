"""Request-log sinks: the request record as JSON (access-log fields plus egress protocol, stream,
reasoning tokens, bytes out and each failed attempt), to a file (JSONL, rotated by size) or a
webhook (fire-and-forget POST per record, at most `max_inflight` deliveries at once, each bounded by
`timeout_ms`; a record that finds the sink saturated is dropped and counted in
`busbar_records_dropped_total{sink}`). `fields:` projects the record onto the named fields.
No prompt or completion text is ever part of the record."""
from __future__ import annotations

import logging
import time

import orjson

from busbar.observability.access_log import full_fields
from busbar.observability.lines import LineWriter

log = logging.getLogger("busbar")


def _project(d, fields):
    return d if fields is None else {k: d.get(k) for k in fields}


class FileSink:
    def __init__(self, settings, state):
        self.fields = settings.fields
        self.name = "file"
        self.state = state
        self.writer = LineWriter(settings.path, settings.rotate_mb * 1024 * 1024,
                                 on_drop=lambda: state.dropped(self.name))

    def on_finish(self, rec):
        self.writer.write(orjson.dumps(_project(full_fields(rec, time.time()), self.fields),
                                       option=orjson.OPT_APPEND_NEWLINE))

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
        if len(self.inflight) >= self.max_inflight:
            self.state.dropped(self.name)
            return
        body = orjson.dumps(_project(full_fields(rec, time.time()), self.fields))
        t = self.gw.loop.create_task(self._post(body))
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
