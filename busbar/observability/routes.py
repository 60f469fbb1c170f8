"""The observability routes, registered by `mount(gw, obs)` when observability is installed in a
worker: into the admin listener's table (`gw.admin_routes`; read-only scope: every GET) and, with
a `prometheus` export, `/metrics` into the data listener's (`gw.routes`), where the data plane's
key chain guards it as the Rust gateway's does (open under `chain: []`). Both are the one route
table type (busbar/server/routes.py).

- `GET /metrics`: Prometheus text 0.0.4 over all workers (404 when no prometheus export is set).
- `GET /`: the status page (busbar/observability/status.html, self-contained).
- `GET /status.json`: the page's figures over the last minute: req/s, busbar-time percentiles,
  failovers, totals (from the shared counters' differences over time); and `spend_by_group`, USD
  per group read from the governance store and priced with the running rate card
  (`busbar.governance.plane.spend_by_group`), or null with `spend_off` saying why there is none.
- `GET /stats`: SPEC §7's lane table: the data listener's own `/stats` handler
  (busbar/server/local.py), so both say the same.

A handler here takes (gw, request) and is registered bound to its gateway; it returns a Response,
or a coroutine giving one (the admin listener awaits it; the data listener's entry is plain).
"""
from __future__ import annotations

import collections
import functools
import os
import time

import orjson

from busbar.observability.metrics import REQUEST_BUCKETS_S, render
from busbar.server import local
from busbar.server.routes import PUBLIC, Response

TEXT_004 = b"text/plain; version=0.0.4; charset=utf-8"
JSON = b"application/json"
# The status page's window (the issue: "over the last minute"), sampled every SAMPLE_SECS.
WINDOW_SECS = 60.0
SAMPLE_SECS = 2.0

_PAGE = None


def mount(gw, obs):
    """The status page (public: static HTML, it asks for a token itself), /metrics, /stats and
    /status.json (read-only); with metrics on, /metrics on the data listener too."""
    r = gw.admin_routes
    for path, handler, scope in (("/", page, PUBLIC),
                                 ("/metrics", metrics, None),
                                 ("/status.json", status_json, None),
                                 ("/stats", local.stats, None)):
        r.add("GET", path, functools.partial(handler, gw), scope=scope,
              summary="observability: " + (handler.__doc__ or path).strip().split("\n")[0])
    if obs.metrics:
        gw.routes.add("GET", "/metrics", functools.partial(data_metrics, gw))


def metrics(gw, req):
    """Prometheus text 0.0.4 over all workers."""
    st = gw.observability
    if st is None or st.metrics is None:
        return Response(404, b'{"error":{"code":"not_found","message":"metrics are off (no '
                        b'export instance of module prometheus)"}}', JSON)
    # The hooks' series (busbar/hooks/stats.py), when the config has hooks.
    hooks = gw.snapshot.routing.hooks.stats
    return Response(200, render(st.metrics) + hooks.prometheus(), TEXT_004)


def data_metrics(gw, ex):
    """/metrics on the data listener: once the data plane's key chain accepts the caller (anyone
    under `chain: []`), as on the admin listener, not to be cached."""
    local.gated(ex, functools.partial(_send_metrics, gw, ex))


def _send_metrics(gw, ex):
    r = metrics(gw, ex.req)
    ex.respond(r.status, r.ctype, r.body, b"Cache-Control: no-store\r\n")


def page(gw, req):
    """The status page."""
    global _PAGE
    if _PAGE is None:
        with open(os.path.join(os.path.dirname(__file__), "status.html"), "rb") as f:
            _PAGE = f.read()
    return Response(200, _PAGE, b"text/html; charset=utf-8")


class Recent:
    """Cumulative summaries sampled over time; a window's figures are the differences."""

    def __init__(self, state):
        self.state = state
        self.samples = collections.deque()
        if state.metrics is not None:
            # The window starts at boot: nothing happened before this worker counted.
            self.samples.append((time.monotonic(), state.metrics.summary()))

    def sample(self):
        m = self.state.metrics
        if m is None:
            return None
        now = time.monotonic()
        s = m.summary()
        self.samples.append((now, s))
        while len(self.samples) > 2 and now - self.samples[1][0] >= WINDOW_SECS:
            self.samples.popleft()
        return now, s

    def window(self) -> dict:
        cur = self.sample()
        if cur is None:
            return {"metrics": False}
        now, s = cur
        t0, s0 = self.samples[0]
        secs = max(now - t0, 1.0)
        d = [a - b for a, b in zip(s["busbar_buckets"], s0["busbar_buckets"])]
        n = s["requests"] - s0["requests"]
        return {
            "metrics": True,
            "window_s": round(secs, 1),
            "requests": n,
            "rps": round(n / secs, 2),
            "failovers": s["failovers"] - s0["failovers"],
            "busbar_ms": {q: _quantile(d, float(q[1:]) / 100) for q in ("p50", "p90", "p99")},
            "totals": {"requests": s["requests"], "failovers": s["failovers"]},
        }


def _quantile(counts, q):
    """The q-quantile in ms from bucket counts (linear within a bucket, as histogram_quantile)."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    cum = 0
    lo = 0.0
    for i, c in enumerate(counts):
        hi = REQUEST_BUCKETS_S[i] if i < len(REQUEST_BUCKETS_S) else REQUEST_BUCKETS_S[-1]
        if cum + c >= rank and c:
            return round((lo + (hi - lo) * (rank - cum) / c) * 1000, 3)
        cum += c
        lo = hi
    return round(REQUEST_BUCKETS_S[-1] * 1000, 3)


async def status_json(gw, req):
    """The status page's figures: the last minute from the counters, and spend by group from
    the governance store."""
    st = gw.observability
    body = st.recent.window() if st is not None and st.recent is not None else {"metrics": False}
    from busbar.governance.plane import spend_by_group
    body["spend_by_group"], body["spend_off"] = await spend_by_group(gw)
    return Response(200, orjson.dumps(body), JSON)
