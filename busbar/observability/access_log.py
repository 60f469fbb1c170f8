"""The access log: one JSON line per request, from the request's `RequestRecord`.

Fields (stable; `docs/operating.md` in README): time (UTC, RFC 3339 with ms), request_id,
ingress_protocol, pool (a configured name or "unresolved"), lane, upstream_model, status, outcome,
attempts, busbar_us (the Server-Timing figure), upstream_ms, input/output/cached tokens, key_id and
group (null until the governance issue lands), client (the peer address). Never a token, a prompt
or a completion. Built with orjson and handed to a LineWriter: ~1-2 µs on the loop."""
from __future__ import annotations

import time

import orjson

from busbar.observability.lines import LineWriter

_dumps = orjson.dumps
_OPT = orjson.OPT_APPEND_NEWLINE


def _utc(ns_epoch: float) -> str:
    t = time.gmtime(ns_epoch)
    return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (t[0], t[1], t[2], t[3], t[4], t[5],
                                                     int((ns_epoch % 1) * 1000))


def fields(rec, now: float) -> dict:
    """The record as the access log and request-log sinks write it."""
    u = rec.usage
    atts = rec.attempts
    d = {
        "time": _utc(now),
        "request_id": rec.request_id,
        "ingress_protocol": rec.ingress,
        "pool": rec.target or "unresolved",
        "lane": rec.lane,
        "upstream_model": rec.model,
        "status": rec.status,
        "outcome": rec.outcome,
        "attempts": len(atts),
        "busbar_us": rec.busbar_ns // 1000,
        "upstream_ms": round(rec.upstream_ns / 1e6, 3),
        "input_tokens": u.input_tokens if u is not None else None,
        "output_tokens": u.output_tokens if u is not None else None,
        "cached_tokens": u.cache_read_tokens if u is not None else None,
        "key_id": getattr(rec, "key_id", None),
        "group": getattr(rec, "group", None),
        "client": rec.client,
    }
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
    def __init__(self, target: str, on_drop=None):
        self.writer = LineWriter(target, on_drop=on_drop)

    def on_finish(self, rec):
        self.writer.write(_dumps(fields(rec, time.time()), option=_OPT))

    def close(self):
        self.writer.close()
