"""Shapes of earlier config grammars and where each went: one table for the loader's refusals and
for `busbar --migrate-config` (busbar/config/migrate.py), so that the message a retired key gets
at boot and what the migrator does with it cannot drift apart.

Two families: the Rust gateway's grammar before its 1.5.3 lock (1.x markers and retired keys,
issue #36; the facts are collected in docs/contributing/rust-config-map.md §6 and §12) and
busbar's own earlier spellings, which the 1.5.3 grammar replaced ("the Rust shape wins").
`markers(doc)` lists every old shape a document still holds, each as (path, where it went).
"""
from __future__ import annotations

# Top-level keys that no longer exist, with their new home.
RETIRED_TOP = {
    "observability": "export: named instances (module prometheus, otlp, request-log-file, "
                     "request-log-webhook, access-log) and advanced.response_headers",
    "metrics": "export.<name>: {module: prometheus, settings: {buffer_seconds, key_gauge_limit}}",
    "admin_insecure": "admin_require_mtls (the opposite value)",
    "global_hooks": "hooks: definitions and pools.hooks: [names]",
    "governance": "store, rate_card, per_request_fee, groups, advanced and identity-providers",
    "group_map": "auth.role_bindings",
    "admin_auth": "auth.admin_auth",
}

# Keys retired inside a section: (section path, key) -> new home.
RETIRED_IN = {
    ("auth", "mode"): "auth.chain (token: [keys]; none: no chain; passthrough: "
                      "pools.upstream_credentials: passthrough)",
    ("auth", "token"): "auth.chain: [keys] with auth.signing_key (static client tokens are gone)",
    ("auth", "client_tokens"): "auth.chain: [keys] (static client tokens are gone; mint keys)",
    ("auth", "group_map"): "auth.role_bindings",
    ("auth", "modules"): "identity-providers.<name>",
    ("auth", "methods"): "identity-providers.<name> (settings, browser_login)",
    ("auth", "upstream_credentials"): "pools.upstream_credentials",
}

# busbar's own earlier spellings inside a section (before issue #36), in the same form.
BUSBAR_RETIRED_IN = {
    ("auth", "admin_tokens"): "identity-providers.<name>: {module: admin-tokens, token} and "
                              "auth.admin_auth: [<name>]",
    ("auth", "admin_open"): "auth.admin_auth: [] (an open admin API)",
    ("store", "kind"): "store.module (memory, sqlite, valkey, postgres) with its settings",
    ("store", "path"): "store: {module: sqlite, settings: {db_path}}",
    ("store", "url"): "store: {module: valkey, settings: {url}}",
    ("store", "fail_mode"): "store.settings.fail_mode (module valkey)",
    ("store", "socket_timeout_ms"): "store.settings.socket_timeout_ms (module valkey)",
    ("store", "flush_interval_ms"): "advanced.usage_flush_interval_ms",
    ("limits", "upstream_pool_max_idle_per_host"): "limits.pool_max_idle_per_host",
    ("limits", "upstream_pool_idle_timeout_secs"): "limits.pool_idle_timeout_secs",
    ("limits", "error_body_max_bytes"): "limits.upstream_error_body_max_bytes",
}
RETIRED_IN.update(BUSBAR_RETIRED_IN)

# Keys retired in every provider / member / breaker / failover / limit.
RETIRED_PROVIDER = {"api_key_env": "api_key: {env: NAME}"}
RETIRED_MEMBER = {"target": "model", "cost_per_mtok": "rate_card.<model>.*_utok"}
RETIRED_TRIP = {"window_s": "window_secs", "n": "consecutive_n"}
RETIRED_FAILOVER = {"deadline_secs": "timeout_secs", "cap": "max_hops"}
RETIRED_POOL = {"route": "hooks: [<strategy or hook name>]", "policy": "hooks: [...] and a "
                "hooks: definition", "hook": "hooks: [...]"}
RETIRED_LIMIT = {"budget_usd": "budget (integer cents: 100 per USD)"}
# busbar's rates were USD per million tokens: the same number as micro-units per token.
RETIRED_RATE = {k: "%s_utok (the same number: per million tokens = micro-units per token)" % k
                for k in ("input", "output", "cache_read", "cache_write")}
RETIRED_TLS = {"cert_file": "cert: {file: PATH}", "key_file": "key: {file: PATH}",
               "client_ca_file": "client_ca: {file: PATH}"}

# busbar's own store file before issue #36, beside the config: its default store was SQLite there,
# where the default is now `memory` (the Rust gateway's). The migrator names it explicitly and boot
# warns when it is found unused (busbar/config/loader.py).
EARLIER_DEFAULT_DB = "busbar.db"
# busbar's earlier `observability:` block held these keys (the Rust 1.x block held others:
# otlp_endpoint, otlp_url, request_log_webhook_url, ...).
BUSBAR_OBSERVABILITY = ("log_level", "access_log", "metrics", "metrics_public", "request_logs",
                        "otlp")

# Store modules that were renamed: old -> current.
RETIRED_STORE_MODULES = {"redis": "valkey", "busbar-store-redis": "valkey",
                         "busbar-store-redis-plugin": "valkey"}

# Admin scopes that were folded into `full`.
RETIRED_SCOPES = ("mint", "hooks-register")

# Strategies a pool's `hooks:` list may name (at most one).
STRATEGIES = ("weighted", "cheapest", "fastest", "least_busy", "usage")


def _mapping(value):
    return value if isinstance(value, dict) else {}


def _list(value):
    return value if isinstance(value, list) else []


def markers(doc) -> list[tuple[str, str]]:
    """Every retired shape `doc` still holds: [(config path, where it went)], section by section.
    Empty for a config in the current grammar. Any document is safe to pass: a wrong-shaped section
    holds no marker (the loader says what is wrong with it)."""
    out = []
    if not isinstance(doc, dict):
        return out
    for key in doc:
        if key in RETIRED_TOP:
            out.append((key, RETIRED_TOP[key]))
    for (section, key), home in RETIRED_IN.items():
        if key in _mapping(doc.get(section)):
            out.append(("%s.%s" % (section, key), home))
    auth = _mapping(doc.get("auth"))
    for plane in ("chain", "admin_auth"):
        for i, entry in enumerate(_list(auth.get(plane))):
            if isinstance(entry, dict):
                out.append(("auth.%s[%d]" % (plane, i), "identity-providers.<name> and a bare name"))
            elif entry in ("tokens", "static-tokens"):
                out.append(("auth.%s[%d]" % (plane, i), "keys (static tokens are gone)"))
    for name, p in _mapping(doc.get("providers")).items():
        for key, home in RETIRED_PROVIDER.items():
            if key in _mapping(p):
                out.append(("providers.%s.%s" % (name, key), home))
    for section in ("tls", "admin_tls"):
        for key, home in RETIRED_TLS.items():
            if key in _mapping(doc.get(section)):
                out.append(("%s.%s" % (section, key), home))
    store = _mapping(doc.get("store"))
    if isinstance(store.get("module"), str) and store["module"] in RETIRED_STORE_MODULES:
        out.append(("store.module", RETIRED_STORE_MODULES[store["module"]]))
    for name, pool in _mapping(doc.get("pools")).items():
        if name in ("hooks", "upstream_credentials") or not isinstance(pool, dict):
            continue
        where = "pools.%s" % name
        for key, home in RETIRED_POOL.items():
            if key in pool:
                out.append(("%s.%s" % (where, key), home))
        for i, m in enumerate(_list(pool.get("members"))):
            for key, home in RETIRED_MEMBER.items():
                if key in _mapping(m):
                    out.append(("%s.members[%d].%s" % (where, i, key), home))
        trip = _mapping(_mapping(pool.get("breaker")).get("trip"))
        for key, home in RETIRED_TRIP.items():
            if key in trip:
                out.append(("%s.breaker.trip.%s" % (where, key), home))
        for key, home in RETIRED_FAILOVER.items():
            if key in _mapping(pool.get("failover")):
                out.append(("%s.failover.%s" % (where, key), home))
        if "action" in _mapping(pool.get("on_exhausted")):
            out.append(("%s.on_exhausted.action" % where, "on_exhausted: reject | least_bad | "
                        "{fallback_pool: P} | {queue: {max_ms: N}}"))
        for i, h in enumerate(_list(pool.get("hooks"))):
            if isinstance(h, dict):
                out.append(("%s.hooks[%d]" % (where, i), "a hooks: definition and a bare name"))
    for name, g in _mapping(doc.get("groups")).items():
        for i, lim in enumerate(_list(_mapping(g).get("limits"))):
            for key, home in RETIRED_LIMIT.items():
                if key in _mapping(lim):
                    out.append(("groups.%s.limits[%d].%s" % (name, i, key), home))
    for model, rate in _mapping(doc.get("rate_card")).items():
        for key, home in RETIRED_RATE.items():
            if key in _mapping(rate):
                out.append(("rate_card.%s.%s" % (model, key), home))
    export = _mapping(doc.get("export"))
    for name, inst in export.items():
        if name in ("prometheus", "otlp") and isinstance(inst, dict) and "module" not in inst:
            out.append(("export.%s" % name, "a named instance: export.<name>: {module: %s, "
                        "settings}" % name))
    hooks = doc.get("hooks")
    if isinstance(hooks, dict) and any(isinstance(h, dict) and "module" not in h
                                       for h in hooks.values()):
        out.append(("hooks", "named definitions with module: (a 1.x hooks registry)"))
    return out


def busbar_own(doc) -> bool:
    """Whether `doc` holds one of busbar's own earlier spellings (and not only shapes of the Rust
    gateway's 1.x grammar): such a config was written for busbar before issue #36, when its
    default store was SQLite beside the config."""
    if not isinstance(doc, dict):
        return False
    if any(k in _mapping(doc.get("observability")) for k in BUSBAR_OBSERVABILITY):
        return True
    if any(key in _mapping(doc.get(section)) for section, key in BUSBAR_RETIRED_IN):
        return True
    if any(key in _mapping(rate) for rate in _mapping(doc.get("rate_card")).values()
           for key in RETIRED_RATE):
        return True
    return any(key in _mapping(lim) for g in _mapping(doc.get("groups")).values()
               for lim in _list(_mapping(g).get("limits")) for key in RETIRED_LIMIT)
