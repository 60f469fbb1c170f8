"""A worker's data-plane state: the per-process `Gateway` that exchanges share (the config
snapshot, the upstream pool, the deadline wheel, the open connections, the lifecycle hooks).

The processes themselves (binding, forking workers, signals, draining) are busbar/supervisor.py's.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time

from busbar.engine.deadlines import Deadlines
from busbar.engine.exchange import _req_id, new_exchange
from busbar.engine.snapshot import Snapshot
from busbar.engine.status import status_line
from busbar.engine.translate import CODECS
from busbar.server import local
from busbar.server.dispatch import Dispatcher
from busbar.server.http import BodyBudget, HttpConnection
from busbar.server.routes import Routes
from busbar.upstream.pool import UpstreamPool

log = logging.getLogger("busbar")


def _resolution(config) -> float:
    """A twentieth of the shortest configured timeout, between 5 ms and 100 ms. Not the error
    body's: that bound is short (250 ms) but coarse on purpose, and may end up to one resolution
    late; a finer wheel for it would cost every request a new slot more often."""
    lim = config.limits
    shortest = min(lim.header_read_timeout_secs, lim.idle_timeout_secs,
                   lim.upstream_request_timeout_secs)
    for m in config.models.values():
        if m.attempt_timeout_ms is not None:
            shortest = min(shortest, m.attempt_timeout_ms / 1000.0)
    for p in config.pools.values():     # reliability: a queue's max_ms is on the wheel too
        if p.on_exhausted.queue_max_ms is not None:
            shortest = min(shortest, p.on_exhausted.queue_max_ms / 1000.0)
    return min(0.1, max(0.005, shortest / 20))


class Gateway:
    """Per-process state of the data plane, and the site its connections serve: the current config
    snapshot (each request captures it when it starts), the upstream pool, the deadline wheel, the
    open connections, and the hooks run at the lifecycle's two exits."""

    def __init__(self, config, loop, shared=None):
        # Every attribute a Gateway has is set here, with what it means; the parts wired in from
        # outside (busbar/supervisor.py: observability, governance, the control plane) fill
        # theirs, and every reader reads them plainly (no getattr probes for a part not there).
        self.loop = loop
        self.shared = shared        # the workers' shared-memory counters (None: one process)
        self.snapshot = Snapshot(config, shared)    # replaced whole by a reload (admin/live.py)
        lim = config.limits
        self.pool = UpstreamPool(loop, connect_timeout=lim.upstream_connect_timeout_secs,
                                 max_idle_per_host=lim.pool_max_idle_per_host,
                                 idle_timeout=lim.pool_idle_timeout_secs)
        self.deadlines = Deadlines(loop, _resolution(config))
        self.connections = set()
        # Request-body bytes held by this worker's connections, bounded by
        # limits.inflight_body_bytes (busbar/server/http.py).
        self.bodies = BodyBudget(self)
        self.inflight = 0
        self.draining = False
        self.servers = []
        # Called with (exchange, Attempt) at every attempt's end, and with a RequestRecord at every
        # request's end (breaker, metrics, logs, settlement hang here).
        self.attempt_hooks = []
        self.finish_hooks = []
        # observe: exchange -> header bytes added to every upstream request (W3C traceparent), or
        # None (OTLP off: nothing is called).
        self.trace_header = None
        # observe: called when the inbound concurrency cap refuses a request (the shedding event,
        # busbar/observability/events.py), or None. Not a finish hook: with every observer off,
        # no finish hook means no RequestRecord is built at all.
        self.on_shed = None
        # observe: this worker's observability objects (busbar/observability State: metrics,
        # access log, tracer, the status page's samples), or None before install / in a bare
        # gateway (tests).
        self.observability = None
        # reliability: breaker cells and lane budgets, fed by every attempt's end
        # (busbar/reliability/state.py); a reloaded snapshot is attached again.
        from busbar.reliability.state import Reliability
        self.reliability = Reliability(config, shared)
        self.reliability.loop = loop
        self.reliability.deadlines = self.deadlines
        self.reliability.attach(self.snapshot)
        self.attempt_hooks.append(self.reliability.hook())
        # routing beyond weights (busbar/routing/plan.py: strategies, tiers, affinity, and the
        # pools' hooks, busbar/hooks/run.py): one RoutingState per worker, reached as
        # `snapshot.routing` (attach sets it on every snapshot), its `hooks` this worker's side of
        # the hook sidecars. Not an attribute of the gateway: one more of those (28 before this)
        # made every `site.x` the exchange reads per request a slower dict lookup in CPython 3.11,
        # +0.5-1.9 % of a small request's instructions (bench/inproc.py --callgrind).
        from busbar.hooks.run import HookPlan, HookRunner
        from busbar.hooks.stats import HookStats
        from busbar.routing.plan import RoutingState
        routing = RoutingState(config, HookPlan.of)
        routing.hooks = HookRunner(self, HookStats(config))
        routing.attach(self.snapshot, self)
        # reliability: the active health prober (busbar/reliability/health.py), made by start().
        self.prober = None
        # reach: the refresher of the boot config's dynamic upstream credentials (AWS chain, GCP
        # OAuth; busbar/upstream/refresh.py), made by start(); and those a reload started for the
        # providers it added (busbar/admin/live.py), each stopped when no provider uses it.
        self.credentials = None
        self.live_refreshers = []
        # new_exchange(conn, req, route): the request's Exchange with the snapshot current then;
        # engine's C function bound to this gateway, so no Python frame runs per request.
        self.new_exchange = functools.partial(new_exchange, self)
        # What the listeners answer themselves (busbar/server/routes.py): `routes` is the data
        # listener's table (busbar's own answers, busbar/server/local.py, and what the parts
        # add: observability's /metrics when public); `admin_routes` the admin listener's (the
        # admin API, governance's endpoints, observability's pages), filled in every worker by
        # the parts as they are wired in and served by the admin site where there is one.
        # dispatch(method, path, query, headers) -> Route: the data listener's dispatch over
        # `routes` (a compiled method: no Python frame per request).
        self.routes = Routes()
        self.admin_routes = Routes()
        local.mount(self)
        self.dispatch = Dispatcher(self.routes).dispatch
        self._debug = log.isEnabledFor(logging.DEBUG)
        # governance: keys, admission, settlement (busbar/governance/gate.py); None = no
        # governance section at start. gov_boot: the process's GovBoot (busbar/governance/plane.py:
        # the store, the usage channels), and gov_figures: the per-key and per-bucket figures the
        # parent recomputes every few seconds for /metrics (busbar/governance/figures.py; None:
        # not computed).
        self.gate = None
        self.gov_boot = None
        self.gov_figures = None
        # control: the live config (busbar/admin/live.py LiveConfig: reload, apply, rollback, and
        # the channels to the other workers), in the parent process (worker 0) only; None in the
        # others. (The admin listener's site is the control plane's own, busbar/admin/plane.py; it
        # serves `admin_routes`.)
        self.live = None

    @property
    def config(self):
        return self.snapshot.config

    def log_debug(self, msg, *args):
        if self._debug:
            log.debug(msg, *args)

    def write_error_response(self, conn, proto, status, kind, message, keep_alive, t0):
        """An error written straight from the HTTP layer (malformed request, limits)."""
        codec = CODECS[proto]
        rid = _req_id()
        body = codec.write_error(status, kind, message, rid)
        extra = codec.error_headers(kind, rid)
        timing = b""
        if self.snapshot.server_timing:
            timing = b"Server-Timing: busbar;dur=%.3f\r\n" % ((time.perf_counter_ns() - t0) / 1e6)
        conn.write(b"%bContent-Type: application/json\r\nContent-Length: %d\r\n%b%bConnection: close\r\n\r\n%b" % (
            status_line(status), len(body), extra, timing, body))
        conn.closed = True
        conn.transport.close()

    # ------------------------------------------------------------------ lifecycle
    async def start(self, sock):
        # reach hook: dynamic upstream credentials (AWS chain, GCP OAuth), first fetched here and
        # then refreshed in the background (busbar/upstream/refresh.py).
        from busbar.upstream.refresh import start_credentials
        self.credentials = await start_credentials(self.loop, self.snapshot.egress.values())
        # control hook: TLS on the data listener (config `tls:`, busbar/server/listen.py)
        from busbar.server.listen import protocol_factory, tls_options
        cfg_tls = getattr(self.config.control, "tls", None)
        tls = tls_options(cfg_tls, self.snapshot.limits)
        server = await self.loop.create_server(
            protocol_factory(lambda: HttpConnection(self), cfg_tls), sock=sock, backlog=4096, **tls)
        self.servers.append(server)
        # reliability: active health probes (providers' `health:`); one per lane per interval
        # over all workers (busbar/reliability/health.py).
        from busbar.reliability.health import HealthProber
        self.prober = HealthProber(self)
        self.prober.start()
        return server

    async def drain(self):
        """Stop accepting; finish in-flight requests; close idle keep-alive connections."""
        self.draining = True
        if self.prober is not None:
            self.prober.close()
        for s in self.servers:
            s.close()
        for c in list(self.connections):
            if c.exchange is None and not c.queue:
                c.closed = True
                c.transport.close()
        deadline = self.loop.time() + self.snapshot.limits.drain_timeout_secs
        while self.inflight > 0 and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for c in list(self.connections):
            c.transport.close()
        self.pool.close()
        self.deadlines.close()
        if self.credentials is not None:    # reach hook
            self.credentials.close()
        for r in self.live_refreshers:      # providers added by reloads
            r.close()
