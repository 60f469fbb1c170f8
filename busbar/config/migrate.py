"""`busbar --migrate-config FILE`: a config of an earlier grammar, converted to the current one (the
Rust gateway's 1.5.3 grammar, which busbar reads as its own: issue #36).

What it takes: every config the Rust gateway shipped from 0.9 to 1.5.2 (its 1.x markers and
retired keys, busbar/config/legacy.py), and busbar's own earlier spellings (`observability:`,
`auth.admin_tokens`, `store.kind`, `budget_usd`, rate cards in USD per million tokens, the
`upstream_pool_*` limits; such a config, when it counts anything and names no store, is given the
SQLite file busbar kept beside it by default, the default being `memory` now). It works on the
file's own text, never interpolated (`${VAR}` stays as written), and never drops what the operator
wrote without saying so: a decision it cannot make is a `TODO(migrate)` line with a placeholder
that still validates, a meaning that changed is a `WARNING(migrate)` line. Those lines head the
output (nothing heads it when there are none, so a migration that needed no decision reads like a
hand-written file). Comments of the input are not kept. A config already in the current grammar
comes back unchanged in meaning.

    from busbar.config import migrate
    text, m = migrate.migrate_text(old_text)    # m.todos, m.warnings, m.changes
    migrate.main(path)                          # the CLI: YAML on stdout, the report on stderr
"""
from __future__ import annotations

import copy
import os
import re
import sys

import yaml

from busbar import __version__

from .legacy import (BUSBAR_RETIRED_IN, EARLIER_DEFAULT_DB, RETIRED_FAILOVER, RETIRED_RATE,
                     RETIRED_SCOPES, RETIRED_STORE_MODULES, RETIRED_TLS, RETIRED_TRIP, STRATEGIES,
                     busbar_own)

# What a 1.x `metrics:` block (which had no buffer) gets for the Prometheus export's required
# `buffer_seconds`: the Rust docs' example value; a TODO says it was chosen here.
DEFAULT_BUFFER_SECONDS = 60
# The 1.4 governance database's default file name, when a `governance:` block named none.
GOVERNANCE_DB_DEFAULT = "busbar-governance.db"
# The environment variable a literal (non-interpolated) 1.x admin token is replaced by.
ADMIN_TOKEN_ENV = "BUSBAR_ADMIN_TOKEN"
_ENV_ONLY = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


class Migration:
    """What one migration did: `changes` (mechanical, for the report), `todos` (a decision is
    needed) and `warnings` (a meaning changed), each a 'path: message' line."""

    def __init__(self):
        self.changes = []
        self.todos = []
        self.warnings = []

    def change(self, path, msg):
        self.changes.append("%s: %s" % (path, msg))

    def todo(self, path, msg):
        self.todos.append("%s: %s" % (path, msg))

    def warn(self, path, msg):
        self.warnings.append("%s: %s" % (path, msg))


class MigrateError(Exception):
    """The input is not a config (unreadable, not YAML, not a mapping); str() is one line."""


def _map(value):
    return value if isinstance(value, dict) else {}


def _setdefault_map(doc, key):
    v = doc.get(key)
    if not isinstance(v, dict):
        v = doc[key] = {}
    return v


def _ref_from_text(value, path, m, fallback_env):
    """A 1.x secret written as text: `${VAR}` becomes {env: VAR}; a literal value cannot be kept
    (secrets are references now) and becomes {env: fallback_env} with a TODO."""
    if isinstance(value, dict):
        return value
    hit = _ENV_ONLY.match(str(value).strip()) if value is not None else None
    if hit:
        return {"env": hit.group(1)}
    m.todo(path, "a literal secret cannot be kept in the config: put it in the environment "
                 "variable %s (now referenced here)" % fallback_env)
    return {"env": fallback_env}


def _rename(d, old, new, path, m):
    """d[old] becomes d[new] in the same place (an existing d[new] wins)."""
    if isinstance(d, dict) and old in d:
        items = list(d.items())
        d.clear()
        for k, v in items:
            if k == old:
                if new not in dict(items):
                    d[new] = v
            else:
                d[k] = v
        m.change("%s.%s" % (path, old), "renamed %s" % new)


def _insert_after(doc, after, key, value):
    """Sets doc[key] = value, placed after `after` (or at the end) so the output keeps an order a
    reader expects."""
    if key in doc:
        doc[key] = value
        return
    items = list(doc.items())
    doc.clear()
    placed = False
    for k, v in items:
        doc[k] = v
        if k == after:
            doc[key] = value
            placed = True
    if not placed:
        doc[key] = value


# ------------------------------------------------------------------ sections
def _listeners(doc, m):
    if "admin_insecure" in doc:
        insecure = doc.pop("admin_insecure")
        if "admin_require_mtls" not in doc:
            doc["admin_require_mtls"] = not bool(insecure)
        m.change("admin_insecure", "became admin_require_mtls: %s" % str(not bool(insecure)).lower())
    for section in ("tls", "admin_tls"):
        tls = doc.get(section)
        if not isinstance(tls, dict):
            continue
        for old in RETIRED_TLS:
            if old in tls:
                new = old[:-len("_file")]
                tls[new] = {"file": tls.pop(old)}
                m.change("%s.%s" % (section, old), "became %s: {file: ...}" % new)


def _providers(doc, m):
    for name, p in _map(doc.get("providers")).items():
        if isinstance(p, dict) and "api_key_env" in p:
            p["api_key"] = {"env": p.pop("api_key_env")}
            m.change("providers.%s.api_key_env" % name, "became api_key: {env: ...}")


def _identity(doc, name, definition):
    if not isinstance(doc.get("identity-providers"), dict):
        _insert_after(doc, "auth", "identity-providers", {})
    doc["identity-providers"].setdefault(name, definition)


def _plane_entries(doc, auth, plane, m):
    """Inline map entries of auth.chain / auth.admin_auth become identity-providers definitions
    named by their key, and the list keeps the bare names."""
    entries = auth.get(plane)
    if not isinstance(entries, list):
        return
    out = []
    for i, entry in enumerate(entries):
        path = "auth.%s[%d]" % (plane, i)
        if isinstance(entry, dict) and len(entry) == 1:
            (name, settings), = entry.items()
            settings = dict(settings or {}) if isinstance(settings, dict) else {}
            definition = {"module": settings.pop("module", name)}
            for k in ("token", "max_admin_scope", "browser_login"):
                if k in settings:
                    definition[k] = settings.pop(k)
            scope = definition.get("max_admin_scope")
            if scope in RETIRED_SCOPES:
                definition["max_admin_scope"] = "full"
                m.warn(path, "scope %s is folded into full" % scope)
            if settings:
                definition["settings"] = settings
            _identity(doc, name, definition)
            idps = doc["identity-providers"]
            if idps[name] != definition:
                m.todo(path, "identity provider %r is defined differently on the other plane; "
                             "this plane uses the first definition, check it" % name)
            out.append(name)
            m.change(path, "inline definition moved to identity-providers.%s" % name)
        elif entry in ("tokens", "static-tokens"):
            if "keys" not in out:
                out.append("keys")
            m.todo(path, "static client tokens are gone: callers need keys minted over the admin "
                         "API (chain: [keys])")
        else:
            out.append(entry)
    auth[plane] = out


def _auth(doc, m):
    # 1.x top-level admin_auth moves under auth (a token-bearing entry there wins).
    if "admin_auth" in doc:
        top = doc.pop("admin_auth")
        auth = _setdefault_map(doc, "auth")
        auth.setdefault("admin_auth", top)
        m.change("admin_auth", "moved to auth.admin_auth")
    auth = doc.get("auth")
    if not isinstance(auth, dict):
        return
    mode = auth.pop("mode", None)
    if mode is not None:
        if mode == "token":
            auth.setdefault("chain", ["keys"])
            m.todo("auth.mode", "static client tokens are gone: callers need keys minted over the "
                                "admin API (chain: [keys])")
        elif mode == "passthrough":
            pools = _setdefault_map(doc, "pools")
            pools.setdefault("upstream_credentials", "passthrough")
            m.change("auth.mode", "passthrough became pools.upstream_credentials: passthrough")
        else:
            m.change("auth.mode", "%s: no chain (an open relay)" % mode)
    if "token" in auth:      # 0.9's single static client token
        auth.pop("token")
        auth.setdefault("chain", ["keys"])
        m.todo("auth.token", "the static client token is gone: callers need keys minted over the "
                             "admin API (chain: [keys])")
    if "client_tokens" in auth:
        auth.pop("client_tokens")
        if mode != "token":     # auth.mode: token said it already
            m.todo("auth.client_tokens", "static client tokens are gone: callers need keys "
                                         "minted over the admin API")
    if "upstream_credentials" in auth:
        value = auth.pop("upstream_credentials")
        pools = _setdefault_map(doc, "pools")
        pools.setdefault("upstream_credentials", value)
        m.change("auth.upstream_credentials", "moved to pools.upstream_credentials")
    # busbar's own operator tokens -> admin-tokens identity providers.
    if "admin_tokens" in auth:
        tokens = auth.pop("admin_tokens") or []
        names = []
        for i, t in enumerate(tokens if isinstance(tokens, list) else []):
            t = _map(t)
            name = "admin-tokens" if i == 0 else str(t.get("name") or "admin-tokens-%d" % i)
            definition = {"module": "admin-tokens", "token": t.get("token")}
            if t.get("scope") not in (None, "full"):
                definition["max_admin_scope"] = t["scope"]
            _identity(doc, name, definition)
            names.append(name)
        auth.setdefault("admin_auth", names)
        first = _map(tokens[0]).get("name") if isinstance(tokens, list) and tokens else None
        m.change("auth.admin_tokens", "became identity-providers (module admin-tokens) named in "
                                      "auth.admin_auth%s" % (
                                          "; %r is now named admin-tokens" % first
                                          if first not in (None, "admin-tokens") else ""))
        if len(names) > 1:
            m.warn("auth.admin_tokens", "several operator tokens: the Rust gateway authenticates "
                                        "only the definition named admin-tokens")
    if "admin_open" in auth:
        if auth.pop("admin_open"):
            auth["admin_auth"] = []
        m.change("auth.admin_open", "became auth.admin_auth: []")
    for plane in ("chain", "admin_auth"):
        _plane_entries(doc, auth, plane, m)
    methods = auth.pop("methods", None)
    if isinstance(methods, dict):
        for name, spec in methods.items():
            spec = dict(spec or {})
            definition = {"module": spec.pop("module", name)}
            if "browser_login" in spec:
                definition["browser_login"] = spec.pop("browser_login")
            if spec:
                definition["settings"] = spec
            _identity(doc, name, definition)
            m.change("auth.methods.%s" % name, "moved to identity-providers.%s" % name)
        m.todo("auth.methods", "role_bindings are keyed by identity-provider name; check them")
    modules = auth.pop("modules", None)
    if isinstance(modules, dict):
        for name, spec in modules.items():
            spec = dict(spec or {})
            definition = {"module": spec.pop("module", name)}
            scope = spec.pop("max_admin_scope", None)
            if scope is not None:
                definition["max_admin_scope"] = "full" if scope in RETIRED_SCOPES else scope
                if scope in RETIRED_SCOPES:
                    m.warn("auth.modules.%s.max_admin_scope" % name,
                           "scope %s is folded into full" % scope)
            if "allowed_groups" in spec:
                m.todo("auth.modules.%s.allowed_groups" % name,
                       "no equivalent: restrict with auth.role_bindings")
                spec.pop("allowed_groups")
            if spec:
                definition["settings"] = spec
            _identity(doc, name, definition)
            m.change("auth.modules.%s" % name, "moved to identity-providers.%s" % name)
    group_map = auth.pop("group_map", None)
    if group_map is None:
        group_map = doc.pop("group_map", None)
    if isinstance(group_map, dict):
        _group_map(doc, auth, group_map, m)
    chain = auth.get("chain")
    if isinstance(chain, list) and "keys" in chain and "signing_key" not in auth:
        m.todo("auth.signing_key", "a [keys] chain needs a signing key (busbar "
                                   "--generate-signing-key); supply it as a secret reference")
    if not auth:
        doc.pop("auth")


def _group_map(doc, auth, group_map, m):
    chain = [c for c in auth.get("chain") or [] if c not in ("keys", "admin-tokens")]
    provider = chain[0] if len(chain) == 1 else "<module>"
    if provider == "<module>":
        m.todo("auth.role_bindings", "group_map had no single identity provider to key it by: "
                                     "replace <module> with the provider's name")
    bindings = _setdefault_map(_setdefault_map(auth, "role_bindings"), provider)
    groups = _setdefault_map(doc, "groups")
    for role, spec in group_map.items():
        spec = _map(spec)
        binding = {}
        if "allowed_pools" in spec:
            binding["allowed_pools"] = spec["allowed_pools"]
            if spec["allowed_pools"] == []:
                m.warn("auth.role_bindings.%s.%s.allowed_pools" % (provider, role),
                       "[] meant every pool in 1.x and means none now")
        group = spec.get("budget_group", spec.get("group"))
        limits = []
        if "rpm_limit" in spec:
            limits.append({"requests": spec["rpm_limit"], "per": "minute"})
        if "tpm_limit" in spec:
            limits.append({"tokens": spec["tpm_limit"], "per": "minute"})
        if "max_budget_cents" in spec:
            limits.append({"budget": spec["max_budget_cents"],
                           "per": _period(spec.get("budget_period", "month"),
                                          "group_map.%s.budget_period" % role, m)})
        if limits:
            gname = "migrated-%s" % role
            groups.setdefault(gname, {"limits": limits})
            if group:
                groups[gname]["parent"] = group
            group = gname
            m.todo("groups.%s" % gname, "generated from group_map.%s's limits; check it" % role)
        if group:
            binding["group"] = group
        bindings[role] = binding
    m.change("group_map", "became auth.role_bindings.%s" % provider)


def _period(period, path, m):
    if period in ("minute", "hour", "day", "month", "total"):
        return period
    m.todo(path, "period %r has no equivalent; month used (check the amount)" % period)
    return "month"


def _governance(doc, m):
    gov = doc.pop("governance", None)
    if not isinstance(gov, dict):
        return
    gov.pop("enabled", None)
    if "db_path" in gov or "store" in gov or "sqlite_busy_timeout_ms" in gov:
        settings = {"db_path": gov.pop("db_path", GOVERNANCE_DB_DEFAULT)}
        if "sqlite_busy_timeout_ms" in gov:
            settings["busy_timeout_ms"] = gov.pop("sqlite_busy_timeout_ms")
        module = gov.pop("store", "sqlite")
        doc.setdefault("store", {"module": RETIRED_STORE_MODULES.get(module, module),
                                 "settings": settings})
        m.change("governance.db_path", "became store: {module: sqlite, settings}")
    if "rate_card" in gov:
        doc.setdefault("rate_card", gov.pop("rate_card"))
    if "price_per_request_cents" in gov:
        doc.setdefault("per_request_fee", gov.pop("price_per_request_cents"))
        m.change("governance.price_per_request_cents", "became per_request_fee")
    if "price_per_1k_tokens_cents" in gov:
        n = gov.pop("price_per_1k_tokens_cents")
        rate = float(n) * 10
        card = _setdefault_map(doc, "rate_card")
        for model in _map(doc.get("models")):
            card.setdefault(model, {"input_utok": rate, "output_utok": rate,
                                    "cache_read_utok": rate, "cache_write_utok": rate})
        m.todo("rate_card", "synthesized from price_per_1k_tokens_cents (%s cents per 1k tokens = "
                            "%s per token on every tier): set real prices" % (n, rate))
    for key in ("rate_sweep_interval", "usage_flush_interval_ms"):
        if key in gov:
            _setdefault_map(doc, "advanced").setdefault(key, gov.pop(key))
            m.change("governance.%s" % key, "moved to advanced.%s" % key)
    if "admin_token" in gov:
        token = _ref_from_text(gov.pop("admin_token"), "governance.admin_token", m,
                               ADMIN_TOKEN_ENV)
        _identity(doc, "admin-tokens", {"module": "admin-tokens", "token": token})
        auth = _setdefault_map(doc, "auth")
        admin = auth.setdefault("admin_auth", [])
        if isinstance(admin, list) and "admin-tokens" not in admin:
            admin.append("admin-tokens")
        m.change("governance.admin_token", "became identity-providers.admin-tokens")
    if "budget_groups" in gov:
        groups = _setdefault_map(doc, "groups")
        for name, spec in _map(gov.pop("budget_groups")).items():
            spec = _map(spec)
            limits = []
            if "max_budget_cents" in spec:
                limits.append({"budget": spec["max_budget_cents"], "per": _period(
                    spec.get("budget_period", "month"),
                    "governance.budget_groups.%s.budget_period" % name, m)})
            groups.setdefault(name, {"limits": limits} if limits else {})
        m.change("governance.budget_groups", "became groups")
    for key in list(gov):
        m.todo("governance.%s" % key, "no equivalent in the current grammar (%r dropped)"
               % (gov.pop(key),))
    m.change("governance", "the block is gone; its parts moved as listed")


def _pools(doc, m):
    pools = doc.get("pools")
    if not isinstance(pools, dict):
        return
    for name, pool in pools.items():
        if name in ("hooks", "upstream_credentials") or not isinstance(pool, dict):
            continue
        where = "pools.%s" % name
        for i, member in enumerate(pool.get("members") or []):
            if not isinstance(member, dict):
                continue
            _rename(member, "target", "model", "%s.members[%d]" % (where, i), m)
            if "cost_per_mtok" in member:
                cost = member.pop("cost_per_mtok")
                m.todo("%s.members[%d].cost_per_mtok" % (where, i),
                       "per-member prices moved to rate_card.%s (*_utok); %r was dropped"
                       % (member.get("model"), cost))
        trip = _map(_map(pool.get("breaker")).get("trip"))
        for old, new in RETIRED_TRIP.items():
            _rename(trip, old, new, "%s.breaker.trip" % where, m)
        for old, new in RETIRED_FAILOVER.items():
            _rename(pool.get("failover"), old, new, "%s.failover" % where, m)
        _on_exhausted(pool, where, m)
        _route(doc, pool, name, where, m)
        hooks = pool.get("hooks")
        if isinstance(hooks, list):
            pool["hooks"] = [_lift_hook(doc, h, "%s-%d" % (name, i), "%s.hooks[%d]" % (where, i), m)
                             for i, h in enumerate(hooks)]
            if pool["hooks"] == ["weighted"]:
                del pool["hooks"]


def _on_exhausted(pool, where, m):
    oe = pool.get("on_exhausted")
    if not isinstance(oe, dict) or "action" not in oe:
        return
    action = str(oe.get("action") or "")
    path = "%s.on_exhausted" % where
    if action.startswith("fallback_pool:"):
        pool["on_exhausted"] = {"fallback_pool": action.split(":", 1)[1].strip()}
    elif action in ("reject", "503", "status_503", "status503"):
        pool["on_exhausted"] = "reject"
    elif action in ("least_bad", "least-bad", "leastbad"):
        pool["on_exhausted"] = "least_bad"
    else:
        pool["on_exhausted"] = "reject"
        m.todo(path, "action %r has no equivalent; reject is used" % action)
        return
    m.change(path, "action %r became %r" % (action, pool["on_exhausted"]))


def _route(doc, pool, name, where, m):
    route = pool.pop("route", None)
    policy = pool.pop("policy", None)
    hook = pool.pop("hook", None)
    if route is None and policy is None and hook is None:
        return
    names = list(pool.get("hooks") or [])
    if isinstance(policy, str):          # 1.3 pre-release: policy: <strategy>
        names.append(policy)
        policy = None
    if route in STRATEGIES:
        if route != "weighted":
            names.append(route)
    elif route == "native":
        strategy = _map(policy).get("name")
        if strategy in STRATEGIES:
            if strategy != "weighted":
                names.append(strategy)
        else:
            m.todo("%s.policy.name" % where, "native policy %r has no strategy equivalent"
                   % strategy)
        if "timeout_ms" in _map(policy):
            m.todo("%s.policy.timeout_ms" % where, "a strategy has no timeout; %r dropped"
                   % _map(policy)["timeout_ms"])
        policy = None
    elif route in ("webhook", "socket", "script"):
        spec = dict(_map(policy))
        definition = {"module": _TRANSPORT_MODULE.get(route, route), "kind": "gate"}
        for k in ("url", "path", "command"):
            if k in spec:
                definition.setdefault("settings", {})[k] = spec.pop(k)
        if spec.pop("send_prompt", False):
            definition["prompt"] = "ro"
        if spec.pop("send_user", False):
            definition["user"] = "ro"
        if "timeout_ms" in spec:
            definition["timeout_ms"] = spec.pop("timeout_ms")
        if spec:
            definition.setdefault("settings", {}).update(spec)
        hook_name = "%s-policy" % name
        _setdefault_map(doc, "hooks").setdefault(hook_name, definition)
        names.append(hook_name)
        if route != "webhook":
            m.todo("hooks.%s" % hook_name, "a %s routing policy became a hook of module %r: busbar "
                                          "needs that module (or a busbar-webrequest-hook sidecar)"
                   % (route, route))
        policy = None
    elif route is not None:
        m.todo("%s.route" % where, "route %r has no equivalent; weighted is used" % route)
    if isinstance(policy, dict) and policy:
        m.todo("%s.policy" % where, "policy settings %r have no equivalent" % (policy,))
    if hook is not None:
        names.append(hook)
    if names:
        pool["hooks"] = names
    m.change("%s.route" % where, "became hooks: %s" % (names or "[] (weighted)"))


def _lift_hook(doc, entry, name, path, m):
    """An inline hook map in a hooks: list becomes a named definition; the list keeps its name."""
    if not isinstance(entry, dict):
        return entry
    definition = dict(entry)
    hook_name = definition.pop("name", None) or name
    if "module" not in definition:
        for transport, key in (("webhook", "url"), ("socket", "path")):
            if transport in definition:
                definition = {"module": _TRANSPORT_MODULE.get(transport, transport),
                              "settings": {key: definition.pop(transport)}, **definition}
                break
    _hook_stage(definition, "hooks.%s" % hook_name, m)
    _setdefault_map(doc, "hooks").setdefault(hook_name, definition)
    m.todo(path, "an inline hook became the definition hooks.%s; check its module and grants"
           % hook_name)
    return hook_name


_STAGES = {"route": "candidate", "attempt": "routing", "completion": "response"}
# The 1.x webhook transport's successor is the sidecar forwarder busbar runs (the same wire, one
# POST per message); a socket or script transport has none in busbar.
_TRANSPORT_MODULE = {"webhook": "busbar-webrequest-hook"}


def _hook_stage(definition, path, m):
    at = definition.pop("at", None)
    if at is not None:
        stages = at if isinstance(at, list) else [at]
        definition["phase"] = [_STAGES.get(s, s) for s in stages]
        m.change(path, "at: became phase: %s" % definition["phase"])


def _hooks(doc, m):
    hooks = doc.get("hooks")
    if isinstance(hooks, dict):
        for name, spec in hooks.items():
            if not isinstance(spec, dict) or "module" in spec:
                continue
            definition = {}
            for transport, key in (("webhook", "url"), ("socket", "path")):
                if transport in spec:
                    definition = {"module": _TRANSPORT_MODULE.get(transport, transport),
                                  "settings": {key: spec.pop(transport)}}
            if not definition:
                definition = {"module": spec.pop("module", name)}
            tap = spec.get("kind") == "tap" or ("kind" not in spec and "at" in spec)
            if spec.pop("global", False):
                pools = _setdefault_map(doc, "pools")
                lst = pools.setdefault("hooks", [])
                if name not in lst:
                    lst.append(name)
            for k in ("default", "signals"):
                if k in spec:
                    m.todo("hooks.%s.%s" % (name, k), "no equivalent (%r dropped)" % (spec.pop(k),))
            if tap and "at" not in spec and "phase" not in spec:
                spec["phase"] = ["request"]
            if isinstance(spec.get("settings"), dict) and "settings" in definition:
                # the transport's own setting (url, path) joins the entry's settings, never lost
                spec["settings"] = dict(spec["settings"], **definition["settings"])
            definition.update(spec)
            _hook_stage(definition, "hooks.%s" % name, m)
            hooks[name] = definition
            if definition["module"] not in _TRANSPORT_MODULE.values():
                m.todo("hooks.%s" % name, "a 1.x registry entry became a definition of module %r: "
                                          "busbar needs that module" % definition["module"])
    global_hooks = doc.pop("global_hooks", None)
    if global_hooks is not None:
        pools = _setdefault_map(doc, "pools")
        names = pools.setdefault("hooks", [])
        for i, entry in enumerate(global_hooks or []):
            if isinstance(entry, dict):
                kindless = "kind" not in entry
                hook_name = _lift_hook(doc, entry, "global-%d" % i, "global_hooks[%d]" % i, m)
                if kindless:   # a kind-less inline global entry was a tap in 1.5.0-1.5.2
                    doc["hooks"][hook_name].setdefault("kind", "tap")
                names.append(hook_name)
            else:
                names.append(entry)
        if not names:
            del pools["hooks"]
            if not pools:
                doc.pop("pools")
        m.change("global_hooks", "became pools.hooks")


def _export(doc, m):
    export = doc.get("export")
    if isinstance(export, dict):
        for module in ("prometheus", "otlp"):
            inst = export.get(module)
            if isinstance(inst, dict) and "module" not in inst:
                export[module] = {"module": module, "settings": inst}
                m.change("export.%s" % module, "a type-keyed block became a named instance")
    obs = doc.pop("observability", None)
    if isinstance(obs, dict):
        _observability(doc, obs, m)
    metrics = doc.pop("metrics", None)
    if metrics is not None:
        settings = dict(metrics) if isinstance(metrics, dict) else {}
        settings.pop("enabled", None)
        if "buffer_seconds" not in settings:
            settings["buffer_seconds"] = DEFAULT_BUFFER_SECONDS
            m.todo("export.metrics.settings.buffer_seconds",
                   "the Prometheus export needs a buffer; %d s chosen here"
                   % DEFAULT_BUFFER_SECONDS)
        if metrics is not False:
            _setdefault_map(doc, "export").setdefault(
                "metrics", {"module": "prometheus", "settings": settings})
        m.change("metrics", "became export.metrics (module prometheus)")


def _observability(doc, obs, m):
    export = _setdefault_map(doc, "export")
    url = obs.pop("otlp_endpoint", None) or obs.pop("otlp_url", None)
    if url:
        export.setdefault("traces", {"module": "otlp", "settings": {"url": url}})
        m.change("observability.otlp_url", "became export.traces (module otlp)")
    hook = obs.pop("request_log_webhook_url", None)
    if hook:
        settings = {"url": hook}
        if "max_inflight_webhook_deliveries" in obs:
            settings["max_inflight_deliveries"] = obs.pop("max_inflight_webhook_deliveries")
        if "webhook_delivery_timeout_secs" in obs:
            settings["delivery_timeout_secs"] = obs.pop("webhook_delivery_timeout_secs")
        export.setdefault("req-log", {"module": "request-log-webhook", "settings": settings})
        m.change("observability.request_log_webhook_url", "became export.req-log "
                                                          "(module request-log-webhook)")
    if "emit_server_timing" in obs:
        rh = _setdefault_map(_setdefault_map(doc, "advanced"), "response_headers")
        rh.setdefault("server_timing", bool(obs.pop("emit_server_timing")))
        m.change("observability.emit_server_timing", "moved to advanced.response_headers")
    # busbar's own block
    metrics_on = bool(obs.pop("metrics", False))
    public = bool(obs.pop("metrics_public", False))
    if metrics_on:
        export.setdefault("metrics", {"module": "prometheus",
                                      "settings": {"buffer_seconds": DEFAULT_BUFFER_SECONDS}})
        m.todo("export.metrics.settings.buffer_seconds",
               "the Prometheus export needs a buffer; %d s chosen here" % DEFAULT_BUFFER_SECONDS)
        m.change("observability.metrics", "became export.metrics (module prometheus)")
        if not public:
            m.warn("observability.metrics", "/metrics is now also served on the data listener, "
                   + ("to callers with a key (auth.chain)" if _keyed(doc) else
                      "to anyone who reaches it (auth.chain is empty)"))
        elif _keyed(doc):
            m.warn("observability.metrics_public", "/metrics on the data listener now needs a "
                                                   "key, as every call behind auth.chain")
    for i, sink in enumerate(obs.pop("request_logs", None) or []):
        _request_log(export, dict(_map(sink)), "observability.request_logs[%d]" % i, i, m)
    otlp = obs.pop("otlp", None)
    if isinstance(otlp, dict):
        settings = {k: otlp[k] for k in ("url", "sample_ratio", "headers") if k in otlp}
        export.setdefault("traces", {"module": "otlp", "settings": settings})
        for k in sorted(set(otlp) - set(settings)):
            m.todo("observability.otlp.%s" % k, "no equivalent in the otlp export (dropped)")
        m.change("observability.otlp", "became export.traces (module otlp)")
    if "access_log" in obs:
        where = obs.pop("access_log")
        if where in (None, False):
            where = "off"
        if where != "stderr":       # stderr is the default without an instance
            export.setdefault("access-log", {"module": "access-log", "settings": {"path": where}})
        m.change("observability.access_log", "became export.access-log (busbar's module "
                                             "access-log)")
    if "log_level" in obs:
        level = obs.pop("log_level")
        if str(level).lower() == "info":
            m.change("observability.log_level", "info is the default (the level is RUST_LOG's or "
                                                "BUSBAR_LOG's now)")
        else:
            m.todo("observability.log_level", "the level is the environment's now: set "
                                              "RUST_LOG=%s (or BUSBAR_LOG)" % level)
    for key in list(obs):
        m.todo("observability.%s" % key, "no equivalent (%r dropped)" % (obs.pop(key),))
    if not export:
        doc.pop("export")


def _request_log(export, sink, path, i, m):
    """busbar's `observability.request_logs[i]` -> an `export.request-log-<i>` instance; its
    `fields:` projection moves onto the instance."""
    kind = sink.pop("kind", None)
    if kind == "file":
        settings = {k: sink.pop(k) for k in ("path", "rotate_mb") if k in sink}
        module = "request-log-file"
    elif kind == "webhook":
        settings = {"url": sink.pop("url", None)}
        if "auth_header" in sink:
            ref = sink.pop("auth_header")
            env = _map(ref).get("env")
            if set(_map(ref)) == {"env"} and isinstance(env, str):
                # The reference held the Authorization header's whole value; ${VAR} is read as
                # the same variable.
                settings["auth_header"] = {"name": "authorization", "value": "${%s}" % env}
            else:
                m.todo(path + ".auth_header", "the webhook's credential is {name: authorization, "
                                              "value: \"${VAR}\"} now; %r was dropped" % (ref,))
        if "max_inflight" in sink:
            settings["max_inflight_deliveries"] = sink.pop("max_inflight")
        if "timeout_ms" in sink:
            settings["delivery_timeout_secs"] = max(1, -(-int(sink.pop("timeout_ms")) // 1000))
        module = "request-log-webhook"
    else:
        m.todo(path, "request-log kind %r has no equivalent" % kind)
        return
    instance = {"module": module, "settings": settings}
    if "fields" in sink:
        instance["fields"] = sink.pop("fields")
    export.setdefault("request-log-%d" % i, instance)
    if sink:
        m.todo(path, "%s have no equivalent (dropped)" % ", ".join(sorted(sink)))
    m.change(path, "became export.request-log-%d" % i)


def _keyed(doc):
    """Whether the data plane's chain (already migrated) asks callers for a key."""
    idps = _map(doc.get("identity-providers"))
    chain = _map(doc.get("auth")).get("chain")
    return isinstance(chain, list) and any(
        c == "keys" or (isinstance(c, str) and _map(idps.get(c)).get("module") == "keys")
        for c in chain)


def _store(doc, m):
    store = doc.get("store")
    if not isinstance(store, dict):
        return
    old = [key for section, key in BUSBAR_RETIRED_IN if section == "store" and key in store]
    if old:
        # busbar's own store block, {kind: memory|sqlite|redis, path, url, ...} (sqlite by
        # default), or its keys beside a module: each goes into the module's settings.
        kind = store.pop("kind", None)
        module = store.pop("module", None) or {"redis": "valkey"}.get(kind, kind) or "sqlite"
        settings = dict(_map(store.pop("settings", None)))
        if module in ("sqlite", "busbar-store-sqlite"):
            # busbar's sqlite default was busbar.db; the current one is named otherwise.
            settings.setdefault("db_path", store.pop("path", EARLIER_DEFAULT_DB))
        for k in list(store):
            if k == "flush_interval_ms":
                _setdefault_map(doc, "advanced").setdefault("usage_flush_interval_ms",
                                                            store.pop(k))
            else:
                settings.setdefault("db_path" if k == "path" else k, store.pop(k))
        store["module"] = module
        if settings:
            store["settings"] = settings
        m.change("store.%s" % old[0], "became store: {module: %s%s}" % (
            module, ", settings" if settings else ""))
    module = store.get("module")
    if isinstance(module, str) and module in RETIRED_STORE_MODULES:
        store["module"] = RETIRED_STORE_MODULES[module]
        m.change("store.module", "%s is now %s" % (module, store["module"]))


def _governed(doc):
    """Whether the (migrated) config has anything to count: keys, groups or a rate card."""
    return _keyed(doc) or bool(doc.get("groups")) or doc.get("rate_card") is not None


def _earlier_default_store(doc, m):
    """busbar's own earlier config kept keys, groups and spend in SQLite beside the config when
    it named no store; the default is memory now, so that file is named where it was implied."""
    if "store" not in doc and _governed(doc):
        doc["store"] = {"module": "sqlite", "settings": {"db_path": EARLIER_DEFAULT_DB}}
        m.change("store", "busbar's earlier default made explicit: SQLite in %s beside the config "
                          "(with no store: the store is memory now)" % EARLIER_DEFAULT_DB)


def _groups(doc, m):
    for name, g in _map(doc.get("groups")).items():
        for i, lim in enumerate(_map(g).get("limits") or []):
            if isinstance(lim, dict) and "budget_usd" in lim:
                usd = lim.pop("budget_usd")
                lim_items = list(lim.items())
                lim.clear()
                lim["budget"] = int(round(float(usd) * 100))
                lim.update(lim_items)
                m.change("groups.%s.limits[%d].budget_usd" % (name, i),
                         "became budget: %d (cents)" % lim["budget"])


def _rate_card(doc, m):
    for model, rate in _map(doc.get("rate_card")).items():
        if not isinstance(rate, dict):
            continue
        for old in RETIRED_RATE:     # USD per million tokens: the same number per micro-unit
            _rename(rate, old, old + "_utok", "rate_card.%s" % model, m)


def _limits(doc, m):
    limits = doc.get("limits")
    for (section, old), home in BUSBAR_RETIRED_IN.items():
        if section == "limits":
            _rename(limits, old, home.split(".", 1)[1], "limits", m)


STEPS = (_listeners, _providers, _governance, _auth, _pools, _hooks, _export, _store, _groups,
         _rate_card, _limits)


def migrate(doc: dict, base_dir: str | None = None) -> tuple[dict, Migration]:
    """The migrated copy of `doc` and what was done. `base_dir`: the folder of the config file, to
    which busbar's earlier grammar resolved a relative SQLite path."""
    m = Migration()
    out = copy.deepcopy(doc)
    for step in STEPS:
        step(out, m)
    if busbar_own(doc):
        _earlier_default_store(out, m)
        if base_dir is not None:
            _absolute_db_path(out, base_dir, m)
    return out, m


def _absolute_db_path(doc, base_dir, m):
    """busbar's earlier grammar read a relative SQLite path beside the config; the Rust grammar
    (and busbar now) reads it against the working directory: the same file, written absolute."""
    store = doc.get("store")
    settings = store.get("settings") if isinstance(store, dict) else None
    path = settings.get("db_path") if isinstance(settings, dict) else None
    if store.get("module") in ("sqlite", "busbar-store-sqlite") and isinstance(path, str) and \
            path != ":memory:" and not os.path.isabs(os.path.expanduser(path)):
        settings["db_path"] = os.path.join(base_dir, os.path.expanduser(path))
        m.change("store.settings.db_path", "%s made absolute (beside the config, as busbar read "
                 "it; a relative path is the working directory's now, as in the Rust gateway)"
                 % path)


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper, value):
    style = '"' if ("${" in value or value == "" or "\n" in value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(doc: dict, m: Migration) -> str:
    body = yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)
    if not (m.todos or m.warnings):
        return body
    head = ["# busbar %s config, migrated by `busbar --migrate-config`." % __version__,
            "# The items below need a decision; `busbar --validate` must pass before this "
            "config is used."]
    head += ["# WARNING(migrate): %s" % w for w in m.warnings]
    head += ["# TODO(migrate): %s" % t for t in m.todos]
    return "\n".join(head) + "\n\n" + body


def migrate_text(text: str, base_dir: str | None = None) -> tuple[str, Migration]:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = " (line %d)" % (mark.line + 1) if mark is not None else ""
        raise MigrateError("not YAML%s: %s" % (where, getattr(exc, "problem", None) or exc)) from None
    if not isinstance(doc, dict):
        raise MigrateError("not a config: the top level must be a mapping")
    out, m = migrate(doc, base_dir)
    return render(out, m), m


def main(path: str) -> int:
    """The CLI: the converted YAML on stdout, what was done on stderr; writes nothing. 0, or 1
    when the file is unreadable, not YAML or not a mapping."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        print("busbar: cannot read %s: %s" % (path, exc.strerror or exc), file=sys.stderr)
        return 1
    try:
        out, m = migrate_text(text, os.path.dirname(os.path.abspath(path)))
    except MigrateError as exc:
        print("busbar: %s: %s" % (path, exc), file=sys.stderr)
        return 1
    sys.stdout.write(out)
    err = sys.stderr
    print("migrated '%s': %d change(s), %d TODO, %d WARNING" % (
        path, len(m.changes), len(m.todos), len(m.warnings)), file=err)
    for title, lines in (("CHANGES", m.changes), ("WARNINGS", m.warnings), ("TODO", m.todos)):
        if lines:
            print("%s:" % title, file=err)
            for line in lines:
                print("  - %s" % line, file=err)
    if m.todos or m.warnings:
        print("Review the TODO(migrate) and WARNING(migrate) lines at the top of the output, then "
              "run busbar --validate on it.", file=err)
    return 0
