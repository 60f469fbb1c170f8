"""Active health probing per provider (SPEC §4.2): `health: {mode: none|dead|active, interval_secs,
timeout_secs}`.

A probe is a one-token chat request in the lane's own protocol, built through the IR and the lane's
codec like any request (`PROBE_MAX_TOKENS` of the codec: the smallest the API accepts), sent with
the provider's own credentials over the gateway's upstream pool. `dead` probes only lanes with a
tripped cell (open or half-open), so a lane recovers without a live request being its half-open
probe; `active` probes every lane every interval (billable: one token each).

What a probe's outcome does, to every breaker cell of the lane (every pool's and the direct one):
- answered (a 2xx its codec reads, or a 4xx the lane answered for itself: client_fault,
  context_length): the cells close, cooldown and streak cleared (`Cell.probe_ok`);
- failed (classified as an attempt would be: transient, attempt timeout, hard down): a tripped
  cell's cooldown is re-armed and lengthened, a closed cell counts it toward tripping
  (`Cell.probe_failed`).

Probes and live traffic: a probe never takes the half-open slot (the CAS on a cell's cooldown that
admits one live request), a lane permit or the lane's request budget: it reads the cells before it
is sent and writes its outcome after. So a probe in flight holds nothing live traffic could wait
for, and with a probe interval shorter than the cooldown (the defaults: 10 s against >= 30 s) a
dead lane's cooldown is re-armed by failing probes before it runs out, and a recovered lane is
closed by a probe before any live request is sent to it. The upstream sees at most one probe per
lane beyond `max_concurrent`.

Never counted as client requests: a probe is not an Exchange; it reaches neither the attempt nor
the finish hooks (metrics, access log, request records, governance), nor the cells' ok/err
counters. `/stats` shows probes apart (`probes_ok`, `probes_failed` per lane).

One probe per lane per interval across all workers: every worker ticks every TICK_SECS, and a lane
is probed by the worker that wins a compare-and-swap of the lane's `L_PROBE_AT` slot (shared
memory, the lane's reliability block) from the last probe time to now, once interval_secs have
passed; the others see the new time and skip. A worker that dies mid-probe costs one interval.
The first tick is skipped (SPEC §4.2): the first claim only records the time. In `dead` mode a lane
with no tripped cell keeps its clock current without probing, so a lane that trips is first probed
one interval after it tripped (it has just failed), not at once.
"""
from __future__ import annotations

import logging

from cbusbar import ir
from cbusbar.proto import codec as _codec

from busbar.reliability.breaker import L_PROBE_AT, L_PROBE_FAIL, L_PROBE_OK
from busbar.engine.classify import (D_ATTEMPT_TIMEOUT, D_CLIENT_FAULT, D_CONTEXT, D_TRANSIENT,
                                    classify_status)

log = logging.getLogger("busbar")

# Half the 1 s floor of interval_secs: a probe starts at most half a second after it is due. A
# tick reads two slots per lane of a provider with health (and nothing else).
TICK_SECS = 0.5
# What the probe asks. One token of answer is all that is paid for.
PROBE_TEXT = "ping"


def probe_request(codec, wire_model: str) -> tuple[bytes, str]:
    """(body, path) of a one-token, non-streaming chat request for `wire_model` in the codec's
    protocol, written through the IR like any request."""
    req = ir.Request()
    req.model = wire_model
    req.stream = False
    req.max_tokens = codec.PROBE_MAX_TOKENS
    req.messages = [ir.Message(ir.USER, [ir.Block(ir.TEXT, PROBE_TEXT)])]
    return codec.write_request(req), codec.upstream_path(wire_model, False)


class HealthProber:
    """One worker's prober: ticks, claims due lanes, runs their probes."""

    def __init__(self, site, clock_ms=None):
        self.site = site
        self.loop = site.loop
        self.handle = None
        self.inflight = {}      # lane name → Probe (this worker's)
        self.clock_ms = clock_ms or site.reliability.now_ms
        self.closed = False
        self._config = None     # the config `_any` was computed for
        self._any = False       # whether any of its providers has probing on

    def start(self):
        self.config_changed()

    def config_changed(self):
        """Called at start and after every config swap: ticks only while a provider probes (an
        idle worker otherwise woke twice a second for nothing)."""
        if self._probing(self.site.snapshot.config) and self.handle is None:
            self._schedule()

    def _probing(self, config) -> bool:
        """Whether any provider of `config` has probing on (computed once per config)."""
        if config is not self._config:
            self._config = config
            self._any = any(p.health.mode != "none" for p in config.providers.values())
        return self._any

    def close(self):
        self.closed = True
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        for p in list(self.inflight.values()):
            p.abort()

    def _schedule(self):
        if not self.closed:
            self.handle = self.loop.call_later(TICK_SECS, self._tick)

    def _tick(self):
        self.handle = None
        try:
            self.tick()
        except Exception:   # the prober's bug never stops the ticks, nor costs a request
            log.exception("health prober tick failed")
        if self._any:       # (a swap to a config without probing stops the ticks)
            self._schedule()

    def tick(self):
        site = self.site
        snap = site.snapshot
        config = snap.config
        if not self._probing(config):
            return
        rel = site.reliability
        slots = rel.slots
        now = self.clock_ms()
        for name, lane in snap.router.lanes.items():
            # The current config's provider: `health` is not part of a provider's equality, so a
            # Lane a reload kept may carry a Provider object with older probe settings.
            prov = config.providers.get(lane.model.provider.name)
            h = prov.health if prov is not None else None
            if h is None or h.mode == "none" or "chat" not in lane.model.operations:
                continue    # (a probe is a chat request: an embeddings-only lane is not probed)
            ls = rel.lanes.get(name)
            if ls is None or ls.held(now) is not None:
                # (held: its provider asked for no call before then, Retry-After; a probe is one)
                continue
            i = ls.i + L_PROBE_AT
            last = slots.value(i)
            if last == 0:
                slots.cas(i, 0, now)    # the first tick is skipped
                continue
            cells = rel.cells_by_lane.get(name, ())
            if h.mode == "dead" and not any(c.tripped() for c in cells):
                if now > last:
                    slots.cas(i, last, now)     # not due: the clock restarts
                continue
            if now - last < h.interval_secs * 1000 or name in self.inflight:
                continue
            if not slots.cas(i, last, now):
                continue    # another worker probes this lane this interval
            eg = snap.egress.get(prov.name)
            if eg is None or not eg.ready or eg.passthrough:
                continue    # no credentials yet (or none of busbar's own): nothing to probe with
            Probe(self, name, lane, eg, prov, h.timeout_secs).start()

    def outcome(self, probe, disposition, retry_after, reason):
        """A probe ended: its outcome to every current cell of its lane."""
        self.inflight.pop(probe.name, None)
        site = self.site
        if self.closed:
            return
        lane = site.snapshot.router.lanes.get(probe.name)
        if lane is not probe.lane:
            return      # the lane was replaced or removed while the probe ran: stale
        rel = site.reliability
        ls = rel.lanes.get(probe.name)
        cells = rel.cells_by_lane.get(probe.name, ())
        if disposition is None:
            if ls is not None:
                rel.slots.add(ls.i + L_PROBE_OK, 1)
            for c in cells:
                c.probe_ok()
            return
        if ls is not None:
            rel.slots.add(ls.i + L_PROBE_FAIL, 1)
        site.log_debug("health probe of %s failed: %s (%s)", probe.name, disposition, reason)
        for c in cells:
            c.probe_failed(disposition, retry_after, reason)


class Probe:
    """One probe: the upstream handler protocol of busbar/upstream/pool.py, like an Exchange, but
    with nothing of a client's request around it."""

    __slots__ = ("prober", "name", "lane", "egress", "provider", "codec", "timeout", "timer", "conn",
                 "data", "status", "headers", "chunks", "size", "done")

    def __init__(self, prober, name, lane, egress, provider, timeout):
        self.prober = prober
        self.name = name
        self.lane = lane
        self.egress = egress
        self.provider = provider
        self.codec = _codec(egress.protocol)
        self.timeout = timeout
        self.timer = None
        self.conn = None
        self.data = None
        self.status = 0
        self.headers = None
        self.chunks = None
        self.size = 0
        self.done = False

    def start(self):
        prober = self.prober
        try:
            body, path = probe_request(self.codec, self.lane.model.upstream_model)
            self.data = self.egress.request(path, body, False)
        except Exception as e:  # (a codec that cannot write it, a signer that fails)
            log.warning("health probe of %s cannot be written: %r", self.name, e)
            return
        prober.inflight[self.name] = self
        self.timer = prober.loop.call_later(self.timeout, self._timed_out)
        prober.site.pool.acquire(self.egress.key, self._on_conn, self._on_conn_error)

    def _on_conn(self, conn):
        if self.done:
            self.prober.site.pool.release(conn)     # carried nothing: idle and reusable
            return
        self.conn = conn
        data = self.data
        self.data = None
        conn.send(self, data)

    def _on_conn_error(self, reason):
        self._end(D_TRANSIENT, None, "health probe: " + reason)

    def _timed_out(self):
        self.timer = None
        self._end(D_ATTEMPT_TIMEOUT, None, "health probe: no answer in %g s" % self.timeout)

    def abort(self):
        """The gateway is stopping: drop the probe without an outcome."""
        if self.done:
            return
        self.done = True
        self._drop()
        self.prober.inflight.pop(self.name, None)

    def _drop(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        c = self.conn
        if c is not None:
            self.conn = None
            c.abandon()

    def _end(self, disposition, retry_after, reason):
        if self.done:
            return
        self.done = True
        self._drop()
        self.chunks = None
        self.prober.outcome(self, disposition, retry_after, reason)

    # -- the upstream handler protocol
    def on_upstream_headers(self, status, headers):
        self.status = status
        self.headers = headers
        self.chunks = []

    def on_upstream_body(self, chunk):
        ch = self.chunks
        if ch is None:
            return
        self.size += len(chunk)
        if self.size > self.prober.site.snapshot.limits.upstream_error_body_max_bytes:
            self._end(D_TRANSIENT, None, "health probe: answer too large")
            return
        ch.append(chunk)

    def on_upstream_complete(self):
        self.conn = None        # the pool took the connection back (or closed it)
        if self.done:
            return
        body = b"".join(self.chunks or ())
        status = self.status
        if 200 <= status < 300:
            try:
                self.codec.read_response(body)
            except ir.CodecError:
                self._end(D_TRANSIENT, None, "health probe: a 2xx busbar could not read")
                return
            self._end(None, None, None)
            return
        f = classify_status(self.codec, status, self.headers, body, self.provider)
        if f.disposition == D_CLIENT_FAULT or f.disposition == D_CONTEXT:
            # The lane answered for itself (a model that wants other parameters is up).
            self._end(None, None, None)
            return
        self._end(f.disposition, f.retry_after, "health probe: upstream status %d" % status)

    def on_upstream_error(self, reason):
        self.conn = None
        self._end(D_TRANSIENT, None, "health probe: " + reason)

    def crash(self, exc):
        log.error("health probe of %s failed inside busbar: %r", self.name, exc, exc_info=exc)
        self.conn = None
        if not self.done:
            self.done = True
            self._drop()
            self.prober.inflight.pop(self.name, None)

    def pause_upstream(self):
        """The upstream pool's back-pressure call: a probe has no client to wait for, so its
        one-token answer is read at once."""

    def resume_upstream(self):
        """See pause_upstream: nothing was paused."""
