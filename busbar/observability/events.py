"""Operational events: stable `key=value` fields after a fixed message, at INFO/WARNING.

- boot: listeners, workers, config version (a hash of the config file).
- lane_failed: every failed attempt at DEBUG (the hot path logs at DEBUG, SPEC §7); at WARNING when
  the lane refused busbar's credentials (401/403: an operator must act), at most once per lane per
  WARN_EVERY_SECS so a dead key does not flood the log.
The breaker's tripped/recovered/benched, reload, store and shedding events come with their issues
(reliability, control, governance) through `event()`.
"""
from __future__ import annotations

import hashlib
import logging
import time

log = logging.getLogger("busbar.events")

# One warning per lane per minute for a lane refusing credentials: enough to be seen, not a flood.
WARN_EVERY_SECS = 60.0


def event(level: int, name: str, **fields):
    if log.isEnabledFor(level):
        log.log(level, "%s %s", name, " ".join("%s=%s" % (k, _v(v)) for k, v in fields.items()))


def _v(v) -> str:
    s = str(v)
    return '"%s"' % s.replace('"', "'") if (" " in s or not s) else s


def config_version(config) -> str:
    try:
        with open(config.source, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()[:12]
    except (OSError, TypeError):
        return "inline"


class LaneEvents:
    def __init__(self):
        self.last_warn = {}

    def on_attempt(self, ex, a):
        if a.fault is None:
            return
        lane = a.lane.name if a.lane else "-"
        pool = ex.target.name if ex.target is not None else "unresolved"
        if a.status in (401, 403):
            now = time.monotonic()
            if now - self.last_warn.get(lane, -1e9) >= WARN_EVERY_SECS:
                self.last_warn[lane] = now
                event(logging.WARNING, "lane_failed", pool=pool, lane=lane, status=a.status,
                      fault=a.fault, reason="the provider refused busbar's credentials")
                return
        if log.isEnabledFor(logging.DEBUG):
            event(logging.DEBUG, "lane_failed", pool=pool, lane=lane, status=a.status,
                  fault=a.fault, reason=a.reason or "")
