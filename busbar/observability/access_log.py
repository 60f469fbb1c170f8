"""The access log: one JSON line per request, from the request's `RequestRecord`.

Fields (stable; `docs/operating.md` in README): time (UTC, RFC 3339 with ms), request_id,
ingress_protocol, pool (a configured name or "unresolved"), lane, upstream_model, status, outcome,
attempts, busbar_us (the Server-Timing figure), upstream_ms, input/output/cached tokens, key_id and
group (null until the governance issue lands), client (the peer address); for a pool with
hooks, hooks (its gates' decisions, "name:outcome,...") and hook_ms (the wait for them). Never a
token, a prompt or a completion. Written by cbusbar.accesslog into a LineWriter's buffer (bench/hooks.py
measures it); `fields()` is the same record as a dict, for the request-log sinks."""
from __future__ import annotations

import time

import orjson

from cbusbar.accesslog import AccessHook
from busbar.observability.lines import LineWriter

_dumps = orjson.dumps
_OPT = orjson.OPT_APPEND_NEWLINE

# The time field's text up to the second ("2026-12-03T12:21:07."), made once per second: formatting
# the whole timestamp per request (time.gmtime and a 7-field format) was ~1.1 µs of the line's ~2.7.
_second = [-1, ""]


def _utc(now: float) -> str:
    sec = int(now)
    if sec != _second[0]:
        _second[1] = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(sec))
        _second[0] = sec
    return "%s%03dZ" % (_second[1], (now - sec) * 1000)


def fields(rec, now: float) -> dict:
    """The record as the access log and request-log sinks write it."""
    u = rec.usage
    if u is not None:
        inp, out, cached = u.input_tokens, u.output_tokens, u.cache_read_tokens
    else:
        inp = out = cached = None
    d = {
        "time": _utc(now),
        "request_id": rec.request_id,
        "ingress_protocol": rec.ingress,
        "pool": rec.target or "unresolved",
        "lane": rec.lane,
        "upstream_model": rec.model,
        "status": rec.status,
        "outcome": rec.outcome,
        "attempts": len(rec.attempts),
        "busbar_us": rec.busbar_ns // 1000,
        "upstream_ms": rec.upstream_ns // 1000 / 1000,    # µs precision, as busbar_us
        "input_tokens": inp,
        "output_tokens": out,
        "cached_tokens": cached,
        "key_id": rec.key_id,
        "group": rec.group,
        "client": rec.client,
    }
    if rec.hooks is not None:
        # A pool with hooks (busbar/hooks/run.py): its gates' decisions, and the wait for them.
        d["hooks"] = rec.hooks
        d["hook_ms"] = rec.hook_ns // 1000 / 1000
    return d


def full_fields(rec, now: float) -> dict:
    """The request-log sinks' record: the access-log fields plus the rest of the record."""
    d = fields(rec, now)
    u = rec.usage
    d["egress_protocol"] = rec.egress
    d["stream"] = rec.stream
    d["reasoning_tokens"] = u.reasoning_tokens if u is not None else None
    d["bytes_out"] = rec.bytes_out
    d["failures"] = [{"lane": a.lane.name if a.lane else None, "status": a.status, "fault": a.fault,
                      "reason": a.reason} for a in rec.attempts if a.fault is not None]
    return d


class AccessLog:
    """`on_finish` is the finish hook: cbusbar.accesslog.AccessHook writes each line straight into
    the writer's buffer (the same fields as `fields()`; a test compares them), in C from the
    RequestRecord's typed slots, the time read there too: ~0.4 µs against ~1.7 µs for `fields()` +
    orjson in a tight loop (bench/hooks.py), and without the dict and a dozen small objects per
    request, which cost more than that again in the server under load."""

    def __init__(self, target: str, on_drop=None):
        self.writer = LineWriter(target, on_drop=on_drop)
        self.buf = self.writer.buf
        self.hook = AccessHook(self.buf, self.writer.drop)
        self.on_finish = self.hook.on_finish

    def close(self):
        self.writer.close()
