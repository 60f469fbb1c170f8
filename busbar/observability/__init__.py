"""See what the gateway does: access log, Prometheus metrics over every worker, request-log sinks,
OTLP traces, and the live status page.

Everything here hangs off the lifecycle's two exits (`Gateway.attempt_hooks`,
`Gateway.finish_hooks`); nothing is installed for what the config leaves off, so an off feature
costs nothing. The gateway calls three functions:

- `prepare(config, workers)` in the parent before the workers fork: the shared-memory metrics
  mapping every worker will count into, and the board the governance gauges are written to;
- `install(gw)` in each worker once its Gateway exists: the hooks, the sinks' writers, the OTLP
  exporter, the periodic gauge publisher, and the routes (busbar/observability/routes.py: the
  status page, /metrics, /status.json and /stats in the admin listener's table, and `/metrics` in
  the data listener's behind its key chain), all through the Gateway's hook lists and route tables;
- `shutdown(gw)` after the drain: flushes the access log, sinks and spans.
"""
from __future__ import annotations

import logging

from busbar.observability.settings import Observability

_prepared = None      # (config, Layout, SharedCounters, GovBoard) made by prepare() before the fork


def settings(config) -> Observability:
    return getattr(config, "observability", None) or Observability()


def prepare(config, workers: int):
    """Creates the shared counters before the workers fork (so all of them map the same pages)."""
    global _prepared
    obs = settings(config)
    if not obs.metrics:
        _prepared = None
        return
    from cbusbar.shared import SharedCounters
    from busbar.observability.metrics import BOARD_BYTES, GovBoard, Layout
    layout = Layout(config, max(1, workers), _sink_names(obs), obs.buffer_seconds)
    board = GovBoard(BOARD_BYTES) if config.governance is not None else None
    _prepared = (config, layout, SharedCounters(layout.size), board)


def preload(config):
    """Imports, in the parent before the workers fork, every module `install` will import for
    `config`: a forked worker that imports a module writes to (and so copies) ~0.2-1 MiB of pages
    it shared with the parent (tests/busbar/server/test_prefork.py checks that it imports none)."""
    obs = settings(config)
    import busbar.observability.events  # noqa: F401
    import busbar.observability.routes  # noqa: F401 (also imports metrics: the /metrics renderer)
    if obs.access_log != "off":
        import busbar.observability.access_log  # noqa: F401
    if obs.request_logs:
        import busbar.observability.sinks  # noqa: F401
    if obs.otlp is not None:
        import busbar.observability.otlp  # noqa: F401


def plan(gw, config):
    """In the parent, before a reload's swap: the metrics' name tables with `config`'s new pools,
    pairs and lanes given spare slots, sent to every worker with the config (`adopt`), so all of
    them count a new pool into the same slots. None when metrics are off."""
    st = gw.observability
    m = st.metrics if st is not None else None
    if m is None:
        return None
    p = m.L.plan(config)
    if p["left_out"]:
        from busbar.observability.events import event
        event(logging.WARNING, "metrics_table_full", left_out=",".join(p["left_out"]),
              effect="counted under pool=unresolved until a restart")
    return p


def adopt(gw, plan):
    """In every worker, with a reload's swap: the parent's name tables (see `plan`)."""
    st = gw.observability
    if plan is not None and st is not None and st.metrics is not None:
        st.metrics.L.adopt(plan)


def _sink_names(obs):
    return ["request_log_%d_%s" % (i, s.kind) for i, s in enumerate(obs.request_logs)]


def install(gw):
    """Wires this worker's hooks into its Gateway (see the module docstring)."""
    obs = settings(gw.config)
    logging.getLogger("busbar").setLevel(_level())
    state = gw.observability = State()
    if obs.metrics:
        from busbar.observability.metrics import Metrics
        prepared = _prepared
        if prepared is None or prepared[0] is not gw.config:
            prepare(gw.config, 1)
            prepared = _prepared
        m = state.metrics = Metrics(prepared[1], prepared[2], prepared[3], obs.key_gauge_limit)
        m.attach(gw)
        gw.finish_hooks.append(m.hook)     # a RecordHook: called in C by the exchange
        _every(gw.loop, _publish_period(), m.publish)
    from busbar.observability.events import LaneEvents, Shedding
    from cbusbar.record import FaultsOnly
    gw.attempt_hooks.append(FaultsOnly(LaneEvents().on_attempt))     # failed attempts only
    gw.on_shed = Shedding(gw.loop, gw).shed
    if obs.access_log != "off":
        from busbar.observability.access_log import AccessLog
        drop = (lambda: state.metrics.dropped("access_log")) if state.metrics else None
        a = state.access_log = AccessLog(obs.access_log, drop)
        gw.finish_hooks.append(a.hook)
        state.closers.append(a.close)
    if obs.request_logs:
        from busbar.observability.sinks import make_sinks
        for name, sink in zip(_sink_names(obs), make_sinks(gw, obs.request_logs, state)):
            sink.name = name
            gw.finish_hooks.append(sink.on_finish)
            state.closers.append(sink.close)
    if obs.otlp is not None:
        from busbar.observability.otlp import Tracer
        t = state.tracer = Tracer(gw, obs.otlp, state)
        gw.attempt_hooks.append(t.on_attempt)
        gw.finish_hooks.append(t.on_finish)
        state.closers.append(t.close)
    from busbar.observability.routes import SAMPLE_SECS, Recent, mount
    mount(gw, obs)
    state.recent = Recent(state)
    if state.metrics is not None:
        _every(gw.loop, SAMPLE_SECS, state.recent.sample)


async def shutdown(gw):
    state = gw.observability
    if state is None:
        return
    for close in state.closers:
        try:
            r = close()
            if hasattr(r, "__await__"):
                await r
        except Exception:   # one sink's failure must not stop the others' flush
            logging.getLogger("busbar").exception("observability shutdown")


class State:
    """This worker's observability objects (gw.observability)."""

    def __init__(self):
        self.metrics = None
        self.access_log = None
        self.tracer = None
        self.recent = None
        self.closers = []

    def dropped(self, sink, n=1):
        if self.metrics is not None:
            self.metrics.dropped(sink, n)

    def shed(self, gate, n=1):
        if self.metrics is not None:
            self.metrics.shed(gate, n)


def _level() -> int:
    """busbar's log level: BUSBAR_LOG's, else info (boot, reload and degraded states show; every
    attempt's failure shows at debug only, SPEC §7: the hot path logs at DEBUG)."""
    import os
    env = os.environ.get("BUSBAR_LOG")
    if env and env.upper() in ("DEBUG", "INFO", "WARNING", "ERROR"):
        return getattr(logging, env.upper())
    return logging.INFO


def _publish_period():
    from busbar.observability.metrics import PUBLISH_SECS
    return PUBLISH_SECS


def _every(loop, secs, fn):
    def tick():
        try:
            fn()
        finally:
            loop.call_later(secs, tick)
    loop.call_later(secs, tick)


def boot(config, workers: int, admin=None):
    """The boot event: listeners (`admin`: the admin listener's bound (host, port)), workers,
    config version."""
    from busbar.observability.events import config_version, event
    obs = settings(config)
    logging.getLogger("busbar").setLevel(_level())
    ctl = config.control
    admin = admin or ((ctl.admin_host, ctl.admin_port) if ctl is not None else None)
    event(logging.INFO, "boot", listen="%s:%d" % (config.listen_host, config.listen_port),
          admin_listen="%s:%d" % admin[:2] if admin else "none",
          tls="on" if ctl is not None and ctl.tls is not None else "off",
          workers=workers, config_version=config_version(config), access_log=obs.access_log,
          metrics=obs.metrics, otlp=obs.otlp is not None, request_logs=len(obs.request_logs))
