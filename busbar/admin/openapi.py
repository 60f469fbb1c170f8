"""The admin API as an OpenAPI 3.1 document (GET /api/v1/admin/openapi.json), built from the admin
site's route table and the operation and schema definitions below, which follow the Rust gateway's
v1 contract (docs/admin-api.md): every operation's id, required scope (`x-busbar-required-scope`),
query parameters, If-Match guard, request body and responses, and the component schemas by name.
A route on the table is documented when it is an /api/v1/admin route; one the contract does not
name gets a generic entry (a test keeps the two lists equal).

Schemas are written with a few constructors: S string, B boolean, F number, U64/U32/U16/U8/U
unsigned and I64/I32 signed integers, N(x) x or null, A(x) array of x, R(name) a reference, NR(name)
a reference or null, E(...) a string enum, O(props, req=[...], extra=...) an object.
"""

from __future__ import annotations

from busbar import __version__
from busbar.admin.site import PREFIX, PUBLIC, required_scope

# The error envelope's frozen codes (docs/admin-api.md, "The error contract").
ERROR_CODES = [
    "not_found",
    "unauthorized",
    "method_not_allowed",
    "forbidden",
    "invalid_request",
    "version_conflict",
    "conflict",
    "rate_limited",
    "internal",
]

S = {"type": "string"}
B = {"type": "boolean"}
F = {"format": "double", "type": "number"}
ANY: dict = {}


def _int(fmt, lo=None, hi=None):
    s = {"format": fmt, "type": "integer"}
    if lo is not None:
        s["minimum"] = lo
    if hi is not None:
        s["maximum"] = hi
    return s


U64, U32, U = _int("uint64", 0), _int("uint32", 0), _int("uint", 0)
U16, U8 = _int("uint16", 0, 65535), _int("uint8", 0, 255)
I64, I32 = _int("int64"), _int("int32")


def N(s):
    s = dict(s)
    s["type"] = [s["type"], "null"]
    return s


def A(items):
    return {"items": items, "type": "array"}


def R(name):
    return {"$ref": "#/components/schemas/" + name}


def NR(name):
    return {"anyOf": [R(name), {"type": "null"}]}


def E(*values):
    return {"enum": list(values), "type": "string"}


def O(props, req=None, extra=None):  # noqa: E743
    s = {"type": "object"}
    if props:
        s["properties"] = props
    if req:
        s["required"] = list(req)
    if extra is not None:
        s["additionalProperties"] = extra
    return s


def page_of(name):
    """A cursor page of `name` items (the Page_<name> schemas)."""
    return O({"items": A(R(name)), "next_cursor": N(S)}, req=["items", "next_cursor"])


SCHEMAS = {
    "AdminAuthPutView": O(
        {"applied": B, "config_version": U64, "configured": B, "modules": A(S), "note": S},
        req=["configured", "modules", "applied", "config_version", "note"],
    ),
    "AdminAuthView": O({"configured": B, "modules": A(S)}, req=["configured", "modules"]),
    "AuditEntry": O(
        {
            "action": S,
            "hash": S,
            "outcome": S,
            "prev_hash": S,
            "principal": S,
            "resource": S,
            "seq": U64,
            "ts": U64,
        },
        req=["seq", "ts", "action", "resource", "outcome", "principal", "prev_hash", "hash"],
    ),
    "AuditPageView": O(
        {"items": A(R("AuditEntry")), "next_cursor": N(S)}, req=["items", "next_cursor"]
    ),
    "AuthView": O(
        {"chain": A(S), "open": B, "upstream_credentials": S},
        req=["chain", "upstream_credentials", "open"],
    ),
    "BuildInfo": O(
        {"auth_modules": A(S), "hook_plugins": A(S), "weighted_floor": B},
        req=["auth_modules", "hook_plugins", "weighted_floor"],
    ),
    "CacheFlushView": O({"flushed": U}, req=["flushed"]),
    "ConfigApplyView": O(
        {"applied": B, "config_version": U64, "note": S}, req=["applied", "config_version", "note"]
    ),
    "ConfigDiffGlobalHooks": O({"from": A(S), "to": A(S)}, req=["from", "to"]),
    "ConfigDiffHooks": O(
        {"added": A(S), "changed": A(S), "removed": A(S)}, req=["added", "removed", "changed"]
    ),
    "ConfigDiffView": O(
        {
            "from": U64,
            "global_hooks": NR("ConfigDiffGlobalHooks"),
            "hooks": R("ConfigDiffHooks"),
            "to": U64,
        },
        req=["from", "to", "hooks"],
    ),
    "ConfigReloadView": O(
        {"config_version": U64, "reloaded": B}, req=["reloaded", "config_version"]
    ),
    "ConfigRollbackView": O(
        {"config_version": U64, "restored_version": U64}, req=["restored_version", "config_version"]
    ),
    "ConfigSettingsView": O(
        {
            "applied": B,
            "config_version": U64,
            "note": N(S),
            "reload_to_apply": A(S),
            "settings": {},
        },
        req=["applied", "config_version", "settings"],
    ),
    "ConfigValidateView": O({"errors": A(S), "ok": B}, req=["ok", "errors"]),
    "ConfigVersion": O(
        {"principal": S, "summary": S, "ts": U64, "version": U64},
        req=["version", "ts", "principal", "summary"],
    ),
    "ConfigVersionDetailView": O(
        {
            "global_hooks": A(S),
            "hooks": O({}, extra=R("HookView")),
            "principal": S,
            "summary": S,
            "ts": U64,
            "version": U64,
        },
        req=["version", "ts", "principal", "summary", "hooks", "global_hooks"],
    ),
    "ConfigVersionPageView": O(
        {"items": A(R("ConfigVersion")), "next_cursor": N(S)}, req=["items", "next_cursor"]
    ),
    "CreateKeyReq": O(
        {
            "allowed_pools": N(A(S)),
            "expires_at": N(U64),
            "expires_in": N(S),
            "group": N(S),
            "issue_aws_credential": B,
            "labels": O({}, extra=S),
            "name": S,
            "parent": N(S),
        },
        req=["name"],
        extra=False,
    ),
    "CreatedKeyView": O(
        {
            "allowed_pools": N(A(S)),
            "aws_access_key_id": N(S),
            "aws_secret_access_key": N(S),
            "created_at": U64,
            "enabled": B,
            "expires_at": U64,
            "group": N(S),
            "group_provisioned": B,
            "id": S,
            "labels": O({}, extra=S),
            "name": S,
            "state": S,
            "token": S,
        },
        req=[
            "id",
            "name",
            "allowed_pools",
            "group",
            "enabled",
            "created_at",
            "labels",
            "state",
            "token",
            "expires_at",
            "group_provisioned",
        ],
    ),
    "EffectiveConfigView": O(
        {
            "auth": R("AuthView"),
            "global_hooks": A(S),
            "hooks": A(R("HookView")),
            "models": A(R("ModelView")),
            "pools": A(R("PoolView")),
            "providers": A(R("ProviderView")),
            "version": U64,
        },
        req=["version", "auth", "pools", "models", "providers", "hooks", "global_hooks"],
    ),
    "FlushCacheReq": O({"module": N(S)}),
    "GroupBucketUsageView": O(
        {
            "budget_cap": N(I64),
            "budget_remaining_cents": N(I64),
            "pool": N(S),
            "requests": U64,
            "requests_cap": N(U64),
            "spend_cents": I64,
            "tokens": U64,
            "tokens_cap": N(U64),
            "window": S,
        },
        req=["window", "requests", "tokens", "spend_cents"],
    ),
    "GroupUsageView": O(
        {"as_of": U64, "buckets": A(R("GroupBucketUsageView")), "enabled": B, "group": S},
        req=["group", "enabled", "buckets", "as_of"],
    ),
    "GroupView": O(
        {
            "child_default": N(A(R("LimitView"))),
            "enabled": B,
            "limits": A(R("LimitView")),
            "name": S,
            "parent": N(S),
        },
        req=["name", "enabled", "limits"],
    ),
    "HookDesiredStatus": O(
        {"settings_keys": A(S), "settings_version": U64}, req=["settings_keys", "settings_version"]
    ),
    "HookHealthView": O(
        {"detail": N(S), "name": S, "reachable": N(B), "transport": R("HookTransportView")},
        req=["name", "transport", "reachable", "detail"],
    ),
    "HookReportedStatus": O(
        {"settings_keys": N(A(S)), "settings_version": N(U64)},
        req=["settings_keys", "settings_version"],
    ),
    "HookSchemaView": O({"name": S, "schema": {}}, req=["name", "schema"]),
    "HookStatusView": O(
        {
            "as_of": U64,
            "desired": R("HookDesiredStatus"),
            "drift": N(B),
            "drift_keys": A(S),
            "metrics": A({}),
            "name": S,
            "note": N(S),
            "reported": NR("HookReportedStatus"),
            "source": S,
        },
        req=["name", "desired", "reported", "drift", "drift_keys", "metrics", "as_of", "source"],
    ),
    "HookTransportView": O({"kind": S, "target": N(S)}, req=["kind", "target"]),
    "HookView": O(
        {
            "at": N(S),
            "global": B,
            "kind": S,
            "name": S,
            "on_error": S,
            "priority": U16,
            "prompt": S,
            "settings_keys": A(S),
            "timeout_ms": U64,
            "transport": R("HookTransportView"),
            "user": S,
        },
        req=[
            "name",
            "kind",
            "transport",
            "prompt",
            "user",
            "priority",
            "at",
            "on_error",
            "timeout_ms",
            "settings_keys",
            "global",
        ],
    ),
    "InfoView": O(
        {
            "build": R("BuildInfo"),
            "config_persistence": B,
            "config_version": U64,
            "started_at": N(U64),
            "topology": R("TopologyInfo"),
            "uptime_seconds": N(U64),
            "version": S,
        },
        req=[
            "version",
            "build",
            "uptime_seconds",
            "started_at",
            "topology",
            "config_persistence",
            "config_version",
        ],
    ),
    "InspectPluginReq": O({"file": S, "tarball_b64": S}, req=["file", "tarball_b64"]),
    "InstallPluginReq": O({"file": S, "tarball_b64": S}, req=["file", "tarball_b64"]),
    "KeyMeteringView": O(
        {
            "as_of": U64,
            "budget_period": S,
            "group": N(S),
            "id": S,
            "rate_headroom": N(F),
            "requests": U64,
            "spend_cents": I64,
            "tokens": U64,
            "window_start": U64,
        },
        req=[
            "id",
            "budget_period",
            "window_start",
            "as_of",
            "group",
            "spend_cents",
            "tokens",
            "requests",
            "rate_headroom",
        ],
    ),
    "KeyPageView": O({"items": A(R("KeyView")), "next_cursor": N(S)}, req=["items", "next_cursor"]),
    "KeyUsageView": O(
        {
            "id": S,
            "name": N(S),
            "requests": U64,
            "spend_micros": I64,
            "tokens_cache_creation": U64,
            "tokens_cache_read": U64,
            "tokens_input": U64,
            "tokens_output": U64,
        },
        req=[
            "id",
            "name",
            "tokens_input",
            "tokens_output",
            "tokens_cache_read",
            "tokens_cache_creation",
            "requests",
            "spend_micros",
        ],
    ),
    "KeyView": O(
        {
            "allowed_pools": N(A(S)),
            "created_at": U64,
            "enabled": B,
            "group": N(S),
            "id": S,
            "labels": O({}, extra=S),
            "name": S,
            "state": S,
        },
        req=["id", "name", "allowed_pools", "group", "enabled", "created_at", "labels", "state"],
    ),
    "LimitView": O(
        {
            "amount": U64,
            "downgrade_to": N(S),
            "metric": S,
            "on_exhaust": N(S),
            "per": N(S),
            "pool": N(S),
        },
        req=["metric", "amount"],
    ),
    "ModelUsageView": O(
        {
            "model": S,
            "provider": S,
            "requests": U64,
            "spend_micros": I64,
            "tokens_cache_creation": U64,
            "tokens_cache_read": U64,
            "tokens_input": U64,
            "tokens_output": U64,
        },
        req=[
            "model",
            "provider",
            "tokens_input",
            "tokens_output",
            "tokens_cache_read",
            "tokens_cache_creation",
            "requests",
            "spend_micros",
        ],
    ),
    "ModelView": O({"model": S, "provider": S}, req=["model", "provider"]),
    "NamedDefView": O(
        {
            "browser_login_configured": N(B),
            "max_admin_scope": N(S),
            "module": S,
            "name": S,
            "settings_keys": A(S),
            "token_configured": N(B),
            "unparseable": N(S),
        },
        req=["name", "module", "settings_keys"],
    ),
    "NamedSettingsReq": O({"settings": O({}, extra=True)}, req=["settings"]),
    "OverlayResetView": O(
        {"changed": B, "config_version": U64, "reset": S},
        req=["reset", "config_version", "changed"],
    ),
    "Page_GroupView": page_of("GroupView"),
    "Page_HookView": page_of("HookView"),
    "Page_ModelView": page_of("ModelView"),
    "Page_NamedDefView": page_of("NamedDefView"),
    "Page_PluginView": page_of("PluginView"),
    "Page_PoolView": page_of("PoolView"),
    "Page_ProviderView": page_of("ProviderView"),
    "PatchSettingsReq": O({"settings": O({}, extra=True)}, req=["settings"]),
    "PluginInstallView": O(
        {
            "file": S,
            "interface_version": U32,
            "name": S,
            "note": S,
            "publisher": N(S),
            "trust": S,
            "version": N(S),
        },
        req=["file", "name", "interface_version", "trust", "note"],
    ),
    "PluginReloadView": O({"note": S, "plugins": A(R("PluginView"))}, req=["plugins", "note"]),
    "PluginRollbackReq": O({"file": S}, req=["file"]),
    "PluginRollbackView": O(
        {"config_version": U64, "file": S, "name": S, "note": S, "publisher": S, "version": S},
        req=["name", "file", "version", "publisher", "config_version", "note"],
    ),
    "PluginSchemaView": O(
        {
            "kind": N(S),
            "name": S,
            "restart_required_default": N(B),
            "schema": {},
            "schema_error": N(S),
            "source": S,
            "trust": S,
            "version": N(S),
        },
        req=["name", "schema", "schema_error", "trust", "source"],
    ),
    "PluginView": O(
        {
            "active": N(B),
            "error": N(S),
            "file": N(S),
            "has_schema": B,
            "interface_version": N(U32),
            "loader": S,
            "name": S,
            "publisher": N(S),
            "schema_error": N(S),
            "schema_url": N(S),
            "target": N(S),
            "trust": N(S),
            "type": S,
            "valid": N(B),
            "version": N(S),
        },
        req=["name", "type", "loader", "active", "target", "has_schema"],
    ),
    "PoolDetailView": O(
        {"members": A(R("PoolMemberStatusView")), "name": S}, req=["name", "members"]
    ),
    "PoolMemberStatusView": O(
        {
            "available_concurrency": U,
            "cooldown_remaining_seconds": U64,
            "dead": B,
            "err": U64,
            "inflight": I64,
            "last_trip_at": N(U64),
            "latency_ms": N(F),
            "model": S,
            "ok": U64,
            "trip_count": U64,
            "usable": B,
            "weight": U32,
        },
        req=[
            "model",
            "weight",
            "usable",
            "cooldown_remaining_seconds",
            "available_concurrency",
            "inflight",
            "latency_ms",
            "ok",
            "err",
            "dead",
            "trip_count",
            "last_trip_at",
        ],
    ),
    "PoolMemberView": O({"model": S, "weight": U32}, req=["model", "weight"]),
    "PoolView": O({"members": A(R("PoolMemberView")), "name": S}, req=["name", "members"]),
    "ProviderView": O({"model_count": U, "provider": S}, req=["provider", "model_count"]),
    "PutAuthBody": O({"admin_auth": A(S)}, req=["admin_auth"], extra=False),
    "RestartReq": O({"confirm": B}, extra=False),
    "RestartView": O(
        {"note": S, "restarting": B, "supervisor_detected": B},
        req=["restarting", "supervisor_detected", "note"],
    ),
    "RevokeView": O({"revoked": S}, req=["revoked"]),
    "RollbackReq": O({"version": U64}, req=["version"]),
    "RotatedKeyView": O(
        {
            "allowed_pools": N(A(S)),
            "created_at": U64,
            "enabled": B,
            "expires_at": N(U64),
            "group": N(S),
            "id": S,
            "labels": O({}, extra=S),
            "name": S,
            "secret": N(S),
            "state": S,
            "token": N(S),
        },
        req=["id", "name", "allowed_pools", "group", "enabled", "created_at", "labels", "state"],
    ),
    "SigningKeyRotateView": O(
        {"current_kid": S, "message": S, "revoke_all": B},
        req=["current_kid", "revoke_all", "message"],
    ),
    "TopologyInfo": O(
        {"models": U, "pools": U, "providers": U}, req=["pools", "models", "providers"]
    ),
    "UpdateKeyReq": O({"enabled": N(B), "group": N(S)}, extra=False),
    "UsageBreakdown": O(
        {
            "requests": U64,
            "spend_micros": I64,
            "tokens_cache_creation": U64,
            "tokens_cache_read": U64,
            "tokens_input": U64,
            "tokens_output": U64,
        },
        req=[
            "tokens_input",
            "tokens_output",
            "tokens_cache_read",
            "tokens_cache_creation",
            "requests",
            "spend_micros",
        ],
    ),
    "UsageView": O(
        {
            "as_of": U64,
            "by_key": A(R("KeyUsageView")),
            "by_key_truncated": B,
            "by_model": A(R("ModelUsageView")),
            "currency": S,
            "others": NR("UsageBreakdown"),
            "total": R("UsageBreakdown"),
            "window": R("UsageWindow"),
        },
        req=["window", "as_of", "currency", "total", "by_model", "by_key", "by_key_truncated"],
    ),
    "UsageWindow": O({"end": U64, "start": U64}, req=["start", "end"]),
}


def op(
    method,
    path,
    op_id,
    scope,
    ok,
    errors,
    query=(),
    if_match=False,
    body=None,
    body_required=True,
    enums=None,
):
    return {
        "method": method,
        "path": path,
        "id": op_id,
        "scope": scope,
        "ok": ok,
        "errors": errors.split(),
        "query": list(query),
        "if_match": if_match,
        "body": body,
        "body_required": body_required,
        "enums": enums or {},
    }


def named_map_ops(path, name):
    """The five operations of a named-definition map (export, identity-providers): list, read,
    replace, delete, patch the settings; the same shapes for each map."""
    return [
        op("GET", path, "Get" + name, "read-only", {"200": "Page_NamedDefView"}, "401 403 500"),
        op("DELETE", path + "/{name}", "Delete%sName" % name, "full", {"204": None},
           "400 401 403 404 409 429 500", if_match=True),
        op("GET", path + "/{name}", "Get%sName" % name, "read-only", {"200": "NamedDefView"},
           "401 403 404 500"),
        op("PUT", path + "/{name}", "Put%sName" % name, "full", {"200": "NamedDefView"},
           "400 401 403 409 429 500", if_match=True, body=O({}, extra=True)),
        op("PATCH", path + "/{name}/settings", "Patch%sNameSettings" % name, "full",
           {"200": "NamedDefView"}, "400 401 403 404 409 429 500", if_match=True,
           body="NamedSettingsReq"),
    ]


OPERATIONS = [
    op("GET", "/admin-auth", "GetAdminAuth", "read-only", {"200": "AdminAuthView"}, "401 403 500"),
    op(
        "PUT",
        "/admin-auth",
        "PutAdminAuth",
        "full",
        {"200": "AdminAuthPutView"},
        "400 401 403 409 429 500",
        if_match=True,
        body="PutAuthBody",
    ),
    op(
        "GET",
        "/audit",
        "GetAudit",
        "read-only",
        {"200": "AuditPageView"},
        "400 401 403 500",
        query=[("action", False), ("resource", False), ("limit", False), ("cursor", False)],
    ),
    op("GET", "/auth", "GetAuth", "read-only", {"200": "AuthView"}, "401 403 500"),
    op(
        "POST",
        "/auth/cache/flush",
        "PostAuthCacheFlush",
        "full",
        {"200": "CacheFlushView"},
        "400 401 403 429 500",
        body="FlushCacheReq",
    ),
    op("GET", "/config", "GetConfig", "read-only", {"200": "EffectiveConfigView"}, "401 403 500"),
    op(
        "POST",
        "/config/apply",
        "PostConfigApply",
        "full",
        {"200": "ConfigApplyView"},
        "400 401 403 409 429 500",
        if_match=True,
        body=O(
            {"config": O({}, extra=True), "providers": O({}, extra=True)},
            req=["config"],
            extra=False,
        ),
    ),
    op(
        "GET",
        "/config/diff",
        "GetConfigDiff",
        "read-only",
        {"200": "ConfigDiffView"},
        "400 401 403 404 500",
        query=[("from", True), ("to", True)],
    ),
    op(
        "POST",
        "/config/reload",
        "PostConfigReload",
        "full",
        {"200": "ConfigReloadView"},
        "400 401 403 429 500",
    ),
    op(
        "POST",
        "/config/rollback",
        "PostConfigRollback",
        "full",
        {"200": "ConfigRollbackView"},
        "400 401 403 404 409 429 500",
        if_match=True,
        body="RollbackReq",
    ),
    op(
        "GET",
        "/config/settings",
        "GetConfigSettings",
        "read-only",
        {"200": "ConfigSettingsView"},
        "401 403 500",
    ),
    op(
        "PUT",
        "/config/settings",
        "PutConfigSettings",
        "full",
        {"200": "ConfigSettingsView"},
        "400 401 403 409 429 500",
        if_match=True,
        body=O({}, extra=True),
    ),
    op(
        "POST",
        "/config/validate",
        "PostConfigValidate",
        "read-only",
        {"200": "ConfigValidateView"},
        "400 401 403 429 500",
        body=O(
            {"config": O({}, extra=True), "providers": O({}, extra=True)},
            req=["config"],
            extra=False,
        ),
    ),
    op(
        "GET",
        "/config/versions",
        "GetConfigVersions",
        "read-only",
        {"200": "ConfigVersionPageView"},
        "400 401 403 500",
        query=[("limit", False), ("cursor", False)],
    ),
    op(
        "GET",
        "/config/versions/{v}",
        "GetConfigVersionsV",
        "read-only",
        {"200": "ConfigVersionDetailView"},
        "400 401 403 404 500",
    ),
    *named_map_ops("/export", "Export"),
    op("GET", "/groups", "GetGroups", "read-only", {"200": "Page_GroupView"}, "401 403 500"),
    op(
        "POST",
        "/groups",
        "PostGroups",
        "full",
        {"200": "GroupView", "201": "GroupView"},
        "400 401 403 409 429 500",
        if_match=True,
        body=O({"config": O({}, extra=True), "name": S}, req=["name", "config"], extra=False),
    ),
    op(
        "DELETE",
        "/groups/{name}",
        "DeleteGroupsName",
        "full",
        {"204": None},
        "400 401 403 404 409 429 500",
        if_match=True,
    ),
    op(
        "GET",
        "/groups/{name}",
        "GetGroupsName",
        "read-only",
        {"200": "GroupView"},
        "401 403 404 500",
    ),
    op(
        "PATCH",
        "/groups/{name}",
        "PatchGroupsName",
        "full",
        {"200": "GroupView"},
        "400 401 403 404 409 429 500",
        if_match=True,
        body=O(
            {
                "child_default": O({}, extra=True),
                "enabled": N(B),
                "limits": N(A(O({}, extra=True))),
                "parent": N(S),
            },
            extra=False,
        ),
    ),
    op(
        "PUT",
        "/groups/{name}",
        "PutGroupsName",
        "full",
        {"200": "GroupView"},
        "400 401 403 404 409 429 500",
        if_match=True,
        body=O({"config": O({}, extra=True)}, req=["config"], extra=False),
    ),
    op(
        "GET",
        "/groups/{name}/usage",
        "GetGroupsNameUsage",
        "read-only",
        {"200": "GroupUsageView"},
        "401 403 404 500",
    ),
    op("GET", "/hooks", "GetHooks", "read-only", {"200": "Page_HookView"}, "401 403 500"),
    op(
        "POST",
        "/hooks",
        "PostHooks",
        "full",
        {"200": "HookView", "201": "HookView"},
        "400 401 403 409 429 500",
        if_match=True,
        body=O({"config": O({}, extra=True), "name": S}, req=["name", "config"], extra=False),
    ),
    op(
        "DELETE",
        "/hooks/{name}",
        "DeleteHooksName",
        "full",
        {"204": None},
        "400 401 403 404 409 429 500",
        if_match=True,
    ),
    op("GET", "/hooks/{name}", "GetHooksName", "read-only", {"200": "HookView"}, "401 403 404 500"),
    op(
        "PUT",
        "/hooks/{name}",
        "PutHooksName",
        "full",
        {"200": "HookView"},
        "400 401 403 404 409 429 500",
        if_match=True,
        body=O({"config": O({}, extra=True)}, req=["config"], extra=False),
    ),
    op(
        "GET",
        "/hooks/{name}/health",
        "GetHooksNameHealth",
        "read-only",
        {"200": "HookHealthView"},
        "401 403 404 500",
    ),
    op(
        "GET",
        "/hooks/{name}/schema",
        "GetHooksNameSchema",
        "read-only",
        {"200": "HookSchemaView"},
        "401 403 404 500",
    ),
    op(
        "PATCH",
        "/hooks/{name}/settings",
        "PatchHooksNameSettings",
        "full",
        {"200": "HookView"},
        "400 401 403 404 409 429 500",
        if_match=True,
        body="PatchSettingsReq",
    ),
    op(
        "GET",
        "/hooks/{name}/status",
        "GetHooksNameStatus",
        "read-only",
        {"200": "HookStatusView"},
        "401 403 404 500",
    ),
    *named_map_ops("/identity-providers", "IdentityProviders"),
    op("GET", "/info", "GetInfo", "read-only", {"200": "InfoView"}, "401 403 500"),
    op(
        "GET",
        "/keys",
        "GetKeys",
        "read-only",
        {"200": "KeyPageView"},
        "400 401 403 500",
        query=[
            ("enabled", False),
            ("prefix", False),
            ("group", False),
            ("limit", False),
            ("cursor", False),
            ("include", False),
        ],
    ),
    op(
        "POST",
        "/keys",
        "PostKeys",
        "full",
        {"201": "CreatedKeyView"},
        "400 401 403 409 429 500",
        body="CreateKeyReq",
    ),
    op(
        "DELETE",
        "/keys/{id}",
        "DeleteKeysId",
        "full",
        {"204": None},
        "400 401 403 404 409 429 500",
        if_match=True,
    ),
    op("GET", "/keys/{id}", "GetKeysId", "read-only", {"200": "KeyView"}, "400 401 403 404 500"),
    op(
        "PATCH",
        "/keys/{id}",
        "PatchKeysId",
        "full",
        {"200": "KeyView"},
        "400 401 403 404 409 429 500",
        if_match=True,
        body="UpdateKeyReq",
    ),
    op(
        "POST",
        "/keys/{id}/revoke",
        "PostKeysIdRevoke",
        "full",
        {"200": "RevokeView"},
        "400 401 403 404 409 429 500",
    ),
    op(
        "POST",
        "/keys/{id}/rotate",
        "PostKeysIdRotate",
        "full",
        {"200": "RotatedKeyView"},
        "401 403 404 409 429 500",
    ),
    op(
        "GET",
        "/keys/{id}/usage",
        "GetKeysIdUsage",
        "read-only",
        {"200": "KeyMeteringView"},
        "400 401 403 404 500",
    ),
    op("GET", "/models", "GetModels", "read-only", {"200": "Page_ModelView"}, "401 403 500"),
    op("GET", "/openapi.json", "GetOpenapiJson", "read-only", {"200": O({})}, "401 403 500"),
    op(
        "DELETE",
        "/overlay/{section}",
        "DeleteOverlaySection",
        "full",
        {"200": "OverlayResetView"},
        "400 401 403 409 429 500",
        if_match=True,
        enums={"section": ["groups", "hooks", "root", "plugin_versions"]},
    ),
    op(
        "GET",
        "/plugins",
        "GetPlugins",
        "read-only",
        {"200": "Page_PluginView"},
        "400 401 403 500",
        query=[("type", True)],
    ),
    op(
        "POST",
        "/plugins",
        "PostPlugins",
        "full",
        {"201": "PluginInstallView"},
        "400 401 403 409 429 500",
        body="InstallPluginReq",
    ),
    op(
        "POST",
        "/plugins/inspect",
        "PostPluginsInspect",
        "read-only",
        {"200": "PluginSchemaView"},
        "400 401 403 429 500",
        body="InspectPluginReq",
    ),
    op(
        "POST",
        "/plugins/reload",
        "PostPluginsReload",
        "full",
        {"200": "PluginReloadView"},
        "400 401 403 429 500",
    ),
    op(
        "POST",
        "/plugins/rollback",
        "PostPluginsRollback",
        "full",
        {"200": "PluginRollbackView"},
        "400 401 403 404 409 429 500",
        if_match=True,
        body="PluginRollbackReq",
    ),
    op(
        "DELETE",
        "/plugins/{file}",
        "DeletePluginsFile",
        "full",
        {"204": None},
        "400 401 403 404 429 500",
    ),
    op(
        "GET",
        "/plugins/{file}/schema",
        "GetPluginsFileSchema",
        "read-only",
        {"200": "PluginSchemaView"},
        "401 403 404 500",
    ),
    op(
        "GET",
        "/pools",
        "GetPools",
        "read-only",
        {"200": "Page_PoolView"},
        "400 401 403 500",
        query=[("detail", False)],
    ),
    op(
        "GET",
        "/pools/{name}",
        "GetPoolsName",
        "read-only",
        {"200": "PoolDetailView"},
        "401 403 404 500",
    ),
    op(
        "GET",
        "/providers",
        "GetProviders",
        "read-only",
        {"200": "Page_ProviderView"},
        "401 403 500",
    ),
    op(
        "POST",
        "/restart",
        "PostRestart",
        "full",
        {"202": "RestartView"},
        "400 401 403 409 429 500",
        body="RestartReq",
        body_required=False,
    ),
    op(
        "POST",
        "/signing-key/rotate",
        "PostSigningKeyRotate",
        "full",
        {"200": "SigningKeyRotateView"},
        "401 403 409 429 500",
    ),
    op(
        "GET",
        "/usage",
        "GetUsage",
        "read-only",
        {"200": "UsageView"},
        "400 401 403 500",
        query=[("window", False)],
    ),
]

BY_ROUTE = {(o["method"], o["path"]): o for o in OPERATIONS}

_STATUS_TEXT = {
    "200": "OK",
    "201": "Created",
    "202": "Accepted: draining",
    "204": "No Content",
    "400": "`invalid_request`: a malformed body, parameter, cursor or If-Match; nothing changed",
    "401": "`unauthorized`: no or an invalid admin credential",
    "403": "`forbidden`: authenticated but under-scoped",
    "404": "`not_found`: no such resource",
    "409": "`version_conflict` (a stale If-Match: re-read and retry) or `conflict` (terminal)",
    "429": "`rate_limited`: the principal's per-minute mutation budget is spent (Retry-After)",
    "500": "`internal`: an internal failure (logged server-side, never returned)",
}
_IF_MATCH = {
    "in": "header",
    "name": "If-Match",
    "required": False,
    "schema": S,
    "description": "The resource's ETag from a prior read or mutation; stale is 409 "
    "`version_conflict`, absent or `*` is unconditional",
}


def _json(schema):
    return {"application/json": {"schema": R(schema) if isinstance(schema, str) else schema}}


def _operation(o, summary) -> dict:
    params = []
    for name in [p[1:-1] for p in o["path"].split("/") if p.startswith("{")]:
        schema = E(*o["enums"][name]) if name in o["enums"] else S
        params.append({"in": "path", "name": name, "required": True, "schema": schema})
    for name, required in o["query"]:
        params.append({"in": "query", "name": name, "required": required, "schema": S})
    if o["if_match"]:
        params.append(_IF_MATCH)
    responses = {}
    for status, schema in o["ok"].items():
        responses[status] = {"description": _STATUS_TEXT.get(status, "OK")}
        if schema is not None:
            responses[status]["content"] = _json(schema)
    for status in o["errors"]:
        responses[status] = {"description": _STATUS_TEXT[status], "content": _json("Error")}
    out = {
        "operationId": o["id"],
        "summary": summary,
        "x-busbar-required-scope": o["scope"],
        "security": [{"adminToken": []}, {"bearerAuth": []}],
        "responses": responses,
    }
    if params:
        out["parameters"] = params
    if o["body"] is not None:
        out["requestBody"] = {"required": o["body_required"], "content": _json(o["body"])}
    return out


def _generic(method, path, scope, summary) -> dict:
    o = op(
        method,
        path,
        method.capitalize()
        + "".join(
            p.strip("{}").replace("-", " ").replace(".", " ").title().replace(" ", "")
            for p in path.split("/")
            if p
        ),
        scope,
        {"200": {"type": "object"}},
        "400 401 403 500",
    )
    return _operation(o, summary)


def document(routes) -> dict:
    paths: dict = {}
    for r in routes.table:
        full = "/" + "/".join(r.parts)
        if not full.startswith(PREFIX + "/") or r.scope == PUBLIC:
            continue
        path = full[len(PREFIX) :]
        o = BY_ROUTE.get((r.method, path))
        if o is not None:
            doc = _operation(o, r.summary or o["id"])
        else:
            doc = _generic(
                r.method, path, r.scope or required_scope(r.method, full), r.summary or path
            )
        paths.setdefault(full, {})[r.method.lower()] = doc
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Busbar Admin API",
            "version": __version__,
            "description": "The /api/v1/admin surface. Errors use the envelope "
            '{"error": {"code", "message"}}; branch on `code`.',
        },
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": dict(
                SCHEMAS,
                Error=O(
                    {"error": O({"code": E(*ERROR_CODES), "message": S}, req=["code", "message"])},
                    req=["error"],
                ),
            ),
            "securitySchemes": {
                "adminToken": {"in": "header", "name": "x-admin-token", "type": "apiKey"},
                "bearerAuth": {
                    "scheme": "bearer",
                    "type": "http",
                    "description": "the admin credential as Authorization: Bearer",
                },
            },
        },
    }
