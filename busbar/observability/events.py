"""Operational events: stable `key=value` fields after a fixed message, at INFO/WARNING.

- boot: listeners, workers, config version (a hash of the config file).
- lane_failed: every failed attempt at DEBUG (the hot path logs at DEBUG, SPEC §7); at WARNING when
  the lane refused busbar's credentials (401/403: an operator must act), at most once per lane per
  WARN_EVERY_SECS so a dead key does not flood the log.
- shedding: a WARNING when a worker starts refusing requests at the inbound concurrency cap
  (`limits.max_inbound_concurrent`), an INFO `shedding_stopped` with how many it refused once none
  was refused for SHED_QUIET_SECS: two lines per burst, however many requests it refused.
- reload (busbar/admin/live.py), lane_tripped / lane_probe_failed / lane_benched / lane_recovered
  (busbar/reliability/breaker.py), store_unreachable / store_reachable (busbar/governance/
  redis_store.py) are written where they happen, in the same `name key=value` shape.
"""
from __future__ import annotations

import hashlib
import logging
import os
import time

log = logging.getLogger("busbar.events")

# One warning per lane per minute for a lane refusing credentials: enough to be seen, not a flood.
WARN_EVERY_SECS = 60.0
# A shedding burst ends after this long without a refused request: longer than the Retry-After (1 s)
# shed requests carry, so clients retrying as told stay in one burst.
SHED_QUIET_SECS = 2.0


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


class Shedding:
    """The shedding event of one worker: `shed()` is the site's `on_shed`, called by the inbound
    cap for each request it refuses (busbar/engine/exchange.py), so nothing runs per request that
    is not refused."""

    def __init__(self, loop, site, clock=time.monotonic):
        self.loop = loop
        self.site = site
        self.clock = clock
        self.count = 0
        self.started = 0.0
        self.last = 0.0

    def shed(self):
        now = self.clock()
        self.last = now
        if not self.count:
            self.started = now
            event(logging.WARNING, "shedding", worker=os.getpid(),
                  max_inbound_concurrent=self.site.snapshot.max_inbound,
                  effect="503 with Retry-After: 1 until in-flight requests drop below the cap")
            self.loop.call_later(SHED_QUIET_SECS, self._check)
        self.count += 1

    def _check(self):
        quiet = self.clock() - self.last
        if quiet < SHED_QUIET_SECS:
            self.loop.call_later(SHED_QUIET_SECS - quiet, self._check)
            return
        event(logging.INFO, "shedding_stopped", worker=os.getpid(), shed=self.count,
              secs="%.1f" % (self.last - self.started))
        self.count = 0
