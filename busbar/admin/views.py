"""The read shapes of the admin API v1 (the Rust gateway's views, docs/admin-api.md): topology,
auth posture, hooks and the named definition maps, projected from a config snapshot. Never a
secret: a settings bag is shown as its sorted key names (`settings_keys`), a token reference as a
boolean."""
from __future__ import annotations

import time

from busbar import __version__
from busbar.config.control import DEFAULT_ADMIN_AUTH, IDP_MODULES
from busbar.hooks.config import STRATEGIES
from busbar.routing.plan import UNBOUNDED

# What this build has built in (GET /info `build`, GET /plugins): the identity-provider modules and
# the ranking policies a pool's `hooks:` may name besides the always-present weighted floor.
AUTH_MODULES = list(IDP_MODULES)
HOOK_PLUGINS = [s for s in STRATEGIES if s != "weighted"]


def page(items) -> dict:
    """A topology list: bounded by the config, so one page (docs/admin-api.md, Pagination)."""
    return {"items": list(items), "next_cursor": None}


def settings_keys(bag) -> list:
    return sorted(bag) if isinstance(bag, dict) else []


def doc_of(snap) -> dict:
    return snap.config.document or {}


# ------------------------------------------------------------------ topology
# How often the parent looks at the breaker cells' trip counters to stamp `last_trip_at`: a second
# is the field's own unit (epoch seconds), and a pass reads one shared counter per cell.
TRIP_SAMPLE_SECS = 1.0


class TripClock:
    """`last_trip_at` of each (pool, model) cell: the breaker counts trips in memory every worker
    shares (busbar/reliability/breaker.py S_TRIPS) but keeps no time, so the admin process reads the
    counters once a second and stamps the second it saw one move (at most a second late)."""

    def __init__(self, gw):
        self.gw = gw
        self.seen = {}
        self.at = {}
        self.handle = None

    def start(self):
        self.tick()

    def tick(self):
        from busbar.reliability.breaker import S_TRIPS
        gw = self.gw
        rel = gw.reliability
        if rel is not None:
            now = None
            for key, cell in list(rel.cells.items()):
                n = cell.slots.value(cell.base + S_TRIPS)
                # A cell starts at 0 (boot, or a reload that added it): one first seen above 0
                # tripped since the last pass.
                before = self.seen.get(key, 0)
                if n > before:
                    now = now or int(time.time())
                    self.at[key] = now
                self.seen[key] = n
        if not gw.draining:
            self.handle = gw.loop.call_later(TRIP_SAMPLE_SECS, self.tick)

    def close(self):
        if self.handle is not None:
            self.handle.cancel()


def pool_view(pool) -> dict:
    return {"name": pool.name, "members": [{"model": m.model.name, "weight": m.weight}
                                           for m in pool.members]}


def member_status(gw, snap, pool_name, member) -> dict:
    """One member's live status (PoolMemberStatusView), read from the same shared cells /stats
    reads (busbar/reliability/stats.py), so every worker's traffic is in it."""
    from busbar.reliability.stats import lane_stats
    name = member.model.name
    lane = snap.router.lanes.get(name)
    cell = gw.reliability.cells.get((pool_name, name)) if gw.reliability is not None else None
    row = {"model": name, "weight": member.weight, "usable": lane is not None,
           "cooldown_remaining_seconds": 0, "available_concurrency": 0, "inflight": 0,
           "latency_ms": None, "ok": 0, "err": 0, "dead": False, "trip_count": 0,
           "last_trip_at": None}
    if lane is None or cell is None:
        return row
    s = lane_stats(pool_name, lane, cell)
    limit = lane.limit
    signals = getattr(getattr(snap, "routing", None), "signals", None)
    row.update({
        "usable": s["usable"],
        "cooldown_remaining_seconds": int(-(-s["cooldown_remaining_s"] // 1)),  # rounded up
        # An unlimited lane: the Rust gateway's unbounded semaphore (tokio's MAX_PERMITS) less
        # what is in flight, as the hooks' candidates say it (busbar/routing/plan.py).
        "available_concurrency": s["free_slots"] if limit is not None else
        UNBOUNDED - s["inflight"],
        "inflight": s["inflight"], "ok": s["ok"], "err": s["err"], "dead": s["dead"],
        "trip_count": s["trips"],
        "last_trip_at": _trip_at(gw, pool_name, name),
        "latency_ms": signals.latency_ms(lane) if signals is not None else None,
    })
    return row


def _trip_at(gw, pool, name):
    clock = getattr(getattr(gw, "live", None), "trips", None)
    return None if clock is None else clock.at.get((pool, name))


def pool_detail(gw, snap, pool) -> dict:
    return {"name": pool.name,
            "members": [member_status(gw, snap, pool.name, m) for m in pool.members]}


def model_view(m) -> dict:
    return {"model": m.name, "provider": m.provider.name}


def provider_views(cfg) -> list:
    counts: dict = {}
    for m in cfg.models.values():
        counts[m.provider.name] = counts.get(m.provider.name, 0) + 1
    return [{"provider": n, "model_count": counts.get(n, 0)} for n in sorted(cfg.providers)]


def info_view(live, snap) -> dict:
    cfg = snap.config
    ctl = live.control
    return {
        "version": __version__,
        "build": {"auth_modules": AUTH_MODULES, "hook_plugins": HOOK_PLUGINS,
                  "weighted_floor": True},
        "uptime_seconds": int(time.time() - live.started),
        "started_at": int(live.started),
        "topology": {"pools": len(cfg.pools), "models": len(cfg.models),
                     "providers": len(cfg.providers)},
        "config_persistence": not ctl.locked and ctl.overlay is not None,
        "config_version": live.current,
    }


# ------------------------------------------------------------------ auth posture
def auth_view(snap) -> dict:
    doc = doc_of(snap)
    auth = doc.get("auth") if isinstance(doc.get("auth"), dict) else {}
    chain = [c for c in (auth.get("chain") or []) if isinstance(c, str)]
    pools = doc.get("pools") if isinstance(doc.get("pools"), dict) else {}
    creds = pools.get("upstream_credentials")
    return {"chain": chain, "upstream_credentials": creds if isinstance(creds, str) else "own",
            "open": not chain}


def admin_chain(snap) -> list:
    auth = doc_of(snap).get("auth")
    chain = auth.get("admin_auth") if isinstance(auth, dict) else None
    if chain is None:
        return list(DEFAULT_ADMIN_AUTH)
    return [c for c in chain if isinstance(c, str)]


def admin_auth_view(snap) -> dict:
    chain = admin_chain(snap)
    return {"configured": bool(chain), "modules": chain}


# ------------------------------------------------------------------ hooks
def global_hooks(doc) -> list:
    pools = doc.get("pools") if isinstance(doc.get("pools"), dict) else {}
    g = pools.get("hooks")
    return [h for h in g if isinstance(h, str)] if isinstance(g, list) else []


def hook_view(name, raw, glob) -> dict:
    """A `hooks:` entry (its document form) as the Rust HookView."""
    raw = raw if isinstance(raw, dict) else {}
    kind = raw.get("kind", "gate")
    on_error = raw.get("on_error", "nothing")
    if isinstance(on_error, dict):
        on_error = on_error.get("hook", "nothing")
    phase = raw.get("phase")
    at = None
    if kind == "tap":
        at = phase[0] if isinstance(phase, list) and len(phase) == 1 else (
            phase if isinstance(phase, str) else None)
    module = raw.get("module")
    return {
        "name": name, "kind": kind,
        "transport": {"kind": "plugin" if module else "none", "target": module or None},
        "prompt": raw.get("prompt", "no"), "user": raw.get("user", "no"),
        "priority": raw.get("priority", 0), "at": at, "on_error": on_error,
        "timeout_ms": raw.get("timeout_ms", _default_timeout(raw)),
        "settings_keys": settings_keys(raw.get("settings")), "global": name in glob,
    }


def _default_timeout(raw) -> int:
    from busbar.hooks.config import SIDECAR_TIMEOUT_MS
    s = raw.get("settings")
    if isinstance(s, dict) and isinstance(s.get("timeout_ms"), int):
        return s["timeout_ms"]
    return SIDECAR_TIMEOUT_MS


def hooks_of(doc) -> dict:
    h = doc.get("hooks")
    return h if isinstance(h, dict) else {}


def hook_views(doc) -> list:
    glob = set(global_hooks(doc))
    return [hook_view(n, h, glob) for n, h in sorted(hooks_of(doc).items())]


# ------------------------------------------------------------------ named definition maps
def named_view(section, name, raw) -> dict:
    raw = raw if isinstance(raw, dict) else {}
    v = {"name": name, "module": raw.get("module", name if section == "identity-providers"
                                         else ""),
         "settings_keys": settings_keys(raw.get("settings"))}
    if section == "identity-providers":
        v["max_admin_scope"] = raw.get("max_admin_scope")
        v["token_configured"] = raw.get("token") is not None
        v["browser_login_configured"] = raw.get("browser_login") is not None
    return v


def named_map(doc, section) -> dict:
    m = doc.get(section)
    return m if isinstance(m, dict) else {}


def redact_settings(node):
    """A root-settings tree with every plugin `settings:` bag replaced by `settings_keys`."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k == "settings" and isinstance(v, dict):
                out["settings_keys"] = sorted(v)
            else:
                out[k] = redact_settings(v)
        return out
    if isinstance(node, list):
        return [redact_settings(v) for v in node]
    return node


def effective_config(live, snap) -> dict:
    cfg = snap.config
    doc = doc_of(snap)
    return {
        "version": live.current, "auth": auth_view(snap),
        "pools": [pool_view(p) for p in cfg.pools.values()],
        "models": [model_view(m) for m in cfg.models.values()],
        "providers": provider_views(cfg), "hooks": hook_views(doc),
        "global_hooks": global_hooks(doc),
    }
