"""The admin API v1's named definitions: hooks (`hooks:`), identity providers
(`identity-providers:`), exporters (`export:`), and the auth posture (`GET auth`, `GET|PUT
admin-auth`), in the Rust gateway's shapes (docs/admin-api.md).

What the API writes goes into the overlay (busbar/admin/overlay.py) and is live once every worker
swapped; a definition from config.yaml is the file's (a write to it is a terminal 409: the API never
shadows file config). No read shows a secret: settings bags are their sorted key names, a token
reference is `token_configured`.
"""
from __future__ import annotations

import time

from busbar.admin import overlay as fmt
from busbar.admin import views
from busbar.admin.handlers import (
    audited,
    body_field,
    check_if_match,
    json_body,
    mutation,
    no_unknown,
    param,
    principal,
    with_etag,
)
from busbar.admin.site import PREFIX, AdminError, Response
from busbar.admin.site import compact_response as json_response
from busbar.hooks.config import MODULES as HOOK_MODULES
from busbar.hooks.config import SETTINGS_KEYS as HOOK_SETTINGS_KEYS

# The fields of a hook a re-registration may not change (delete and register again instead).
HOOK_GRANTS = ("kind", "prompt", "user")
# The settings schema of busbar's one hook module, the sidecar forwarder (its `describe`).
FORWARDER_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object", "additionalProperties": False, "required": ["url"],
    "properties": {
        "url": {"type": "string", "description": "the sidecar's URL (https, or http on loopback)"},
        "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 5000,
                       "description": "the forwarder's own per-message bound"},
    },
}
SCOPE_RANK = {"read-only": 0, "full": 1}
SECTION_NAMES = {"identity-providers": "identity provider", "export": "exporter"}
# The audit log's and the history's name of a definition (`identity-provider:corp`): the Rust
# gateway's.
AUDIT_NOUNS = {"identity-providers": "identity-provider", "export": "exporter"}


def _rank(scope):
    return SCOPE_RANK.get(scope if scope is not None else "read-only", 0)


def mount(site, live):
    r = site.routes
    gw = live.gw

    def doc():
        return views.doc_of(gw.snapshot)

    def overlay():
        path = live.control.overlay
        try:
            return fmt.read(path) if path else fmt.empty()
        except fmt.OverlayError:
            return fmt.empty()

    # ------------------------------------------------------------------ auth posture
    def auth(req):
        return json_response(views.auth_view(gw.snapshot))

    def admin_auth(req):
        return with_etag(json_response(views.admin_auth_view(gw.snapshot)), live)

    async def put_admin_auth(req):
        check_if_match(req, live)
        body = json_body(req)
        no_unknown(body, ("admin_auth",))
        chain = body.get("admin_auth")
        if not isinstance(chain, list) or not all(isinstance(c, str) for c in chain):
            raise AdminError(400, "malformed body: `admin_auth` must be a list of module names")
        idps = views.named_map(doc(), "identity-providers")
        for name in chain:
            if name not in idps and name != "admin-tokens":
                raise AdminError(400, "unknown admin auth module `%s`: name an identity provider "
                                 "defined in identity-providers" % name)
        new = dict(doc())
        new["auth"] = dict(new.get("auth") or {}, admin_auth=chain)
        # Self-lockout guard: the caller's own credential must still hold `full` under the new
        # chain, or nothing changes.
        if live.control.locked:
            raise AdminError(400, "config mutation refused: the config is immutable "
                             "(config.locked: true)")
        config, errors, _ = live.build_text(live._apply_doc(new))
        if config is None:
            raise AdminError(400, "invalid config; nothing changed: " + "; ".join(errors[:20]))
        ctl = config.control
        if not (ctl.admin_open and not ctl.admin_tokens):
            from busbar.admin.site import TokenCheck, presented_token
            tok = TokenCheck(ctl.admin_tokens).principal(presented_token(req.headers))
            if tok is None or tok.scope != "full":
                raise AdminError(409, "the new admin_auth chain would lock the caller out (its "
                                 "credential would not hold `full` under it); nothing changed")
        await mutation(live, live.apply(new, None, principal(req), "auth.admin_chain_put"))
        view = views.admin_auth_view(gw.snapshot)
        view.update(applied=True, config_version=live.current,
                    note="live until the next reload or restart, which return to config.yaml")
        return with_etag(json_response(view), live)

    # ------------------------------------------------------------------ hooks
    def _hook(name):
        hooks = views.hooks_of(doc())
        if name not in hooks:
            raise AdminError(404, "hook `%s` not found" % name)
        return views.hook_view(name, hooks[name], set(views.global_hooks(doc())))

    def hooks(req):
        return with_etag(json_response(views.page(views.hook_views(doc()))), live)

    def hook(req):
        return with_etag(json_response(_hook(req.params["name"])), live)

    def _hook_body(body, name):
        cfg = body.get("config")
        if not isinstance(cfg, dict):
            raise AdminError(400, "malformed body: `config` must be an object (a hooks: entry)")
        cfg = dict(cfg)
        glob = cfg.pop("global", None)
        if glob is not None and not isinstance(glob, bool):
            raise AdminError(400, "invalid `config.global`: expected a boolean")
        return cfg, glob

    def _base_defined(name, ov):
        return name in views.hooks_of(doc()) and name not in ov["hooks"]

    async def _put_hook(req, name, cfg, glob, creating):
        ov = overlay()
        if _base_defined(name, ov):
            raise AdminError(409, "hook `%s` is defined in config.yaml (edit it there)" % name)
        existing = ov["hooks"].get(name)
        if existing is None and not creating:
            raise AdminError(404, "hook `%s` not found (POST hooks registers a new one)" % name)
        if existing is not None:
            for g in HOOK_GRANTS:
                if existing.get(g) != cfg.get(g):
                    raise AdminError(409, "hook `%s`: `%s` is immutable (delete the hook and "
                                     "register it again to change it)" % (name, g))

        def mutate(o):
            o = dict(o)
            o["hooks"] = dict(o["hooks"], **{name: cfg})
            o["deleted"] = [n for n in o["deleted"] if n != name]
            g = [n for n in o["global_hooks"] if n != name]
            was_global = name in o["global_hooks"]
            if glob or (glob is None and was_global):
                g.append(name)
            o["global_hooks"] = g
            return o
        await mutation(live, live.mutate_overlay(
            mutate, principal(req), "hook.%s hook:%s" % ("register" if creating else "replace", name)))
        return existing is None

    async def post_hook(req):
        check_if_match(req, live)
        body = json_body(req)
        no_unknown(body, ("name", "config"))
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise AdminError(400, "malformed body: `name` must be a non-empty string")
        cfg, glob = _hook_body(body, name)
        new = await _put_hook(req, name, cfg, glob, True)
        return with_etag(json_response(_hook(name), 201 if new else 200), live)

    async def put_hook(req):
        check_if_match(req, live)
        name = req.params["name"]
        body = json_body(req)
        no_unknown(body, ("config",))
        cfg, glob = _hook_body(body, name)
        await _put_hook(req, name, cfg, glob, False)
        return with_etag(json_response(_hook(name)), live)

    def api_hook(name):
        """A hook the API made (in the overlay), or the 409 of a config.yaml hook, or 404."""
        if name not in overlay()["hooks"]:
            if name in views.hooks_of(doc()):
                raise AdminError(409, "hook `%s` is defined in config.yaml (edit it there)" % name)
            raise AdminError(404, "hook `%s` not found" % name)

    async def delete_hook(req):
        check_if_match(req, live)
        name = req.params["name"]
        api_hook(name)

        def mutate(o):
            o = dict(o)
            o["hooks"] = {k: v for k, v in o["hooks"].items() if k != name}
            o["global_hooks"] = [n for n in o["global_hooks"] if n != name]
            return o
        await mutation(live, live.mutate_overlay(mutate, principal(req),
                                                 "hook.delete hook:%s" % name))
        return with_etag(Response(204, b""), live)

    async def patch_hook_settings(req):
        check_if_match(req, live)
        name = req.params["name"]
        body = json_body(req)
        no_unknown(body, ("settings",))
        bag = body.get("settings")
        if not isinstance(bag, dict):
            raise AdminError(400, "malformed body: `settings` must be an object")
        api_hook(name)

        def mutate(o):
            o = dict(o)
            o["hooks"] = dict(o["hooks"], **{name: dict(o["hooks"][name], settings=bag)})
            return o
        await mutation(live, live.mutate_overlay(mutate, principal(req),
                                                 "hook.settings hook:%s" % name))
        return with_etag(json_response(_hook(name)), live)

    def hook_health(req):
        v = _hook(req.params["name"])
        module = v["transport"]["target"]
        ok = module in HOOK_MODULES
        return json_response({
            "name": v["name"], "transport": v["transport"], "reachable": ok,
            "detail": ("resolves to busbar's built-in sidecar forwarder (%s); the sidecar itself "
                       "is not probed" % module) if ok else
                      "module `%s` is not a hook module busbar has" % module})

    def hook_schema(req):
        v = _hook(req.params["name"])
        known = v["transport"]["target"] in HOOK_MODULES
        return json_response({"name": v["name"], "schema": FORWARDER_SCHEMA if known else None})

    def hook_status(req):
        name = req.params["name"]
        v = _hook(name)
        ver = 0
        for rec in live.versions:
            if (rec.document or {}).get("hooks", {}).get(name) != \
                    doc().get("hooks", {}).get(name):
                continue
            ver = rec.version
            break
        return json_response({
            "name": name,
            "desired": {"settings_keys": v["settings_keys"], "settings_version": ver},
            "reported": None, "drift": None, "drift_keys": [], "metrics": [],
            "as_of": int(time.time()), "source": "live",
            "note": "the sidecar forwarder does not answer `status`: only the desired settings "
                    "are known (keys: %s)" % ", ".join(sorted(HOOK_SETTINGS_KEYS))})

    # ------------------------------------------------------------------ named maps
    def named_routes(section):
        what = SECTION_NAMES[section]
        noun = AUDIT_NOUNS[section]
        base = PREFIX + "/" + section

        def entries():
            return views.named_map(doc(), section)

        def one(name):
            m = entries()
            if name not in m:
                raise AdminError(404, "%s `%s` not found" % (what, name))
            return views.named_view(section, name, m[name])

        def listing(req):
            return json_response(views.page(views.named_view(section, n, d)
                                            for n, d in sorted(entries().items())))

        def get(req):
            return json_response(one(req.params["name"]))

        def _pending(view):
            # Exporters' writers (request-log sinks, OTLP, the metrics route) are made when a
            # worker starts: a stored change takes effect on the next restart.
            if section == "export":
                view["reload_to_apply"] = ["export.%s" % view["name"]]
                view["note"] = ("stored durably; exporters start with the process: POST restart "
                                "to make this change live")
            return view

        def _overlay_own(name, ov):
            own = (ov["named_maps"].get(section) or {})
            return name in own and own[name] is not None

        def _check_base(name, ov):
            if name in entries() and not _overlay_own(name, ov):
                raise AdminError(409, "%s `%s` is defined in config.yaml (edit it there)" % (
                    what, name))

        async def _store(req, name, definition, verb="replace"):
            def mutate(o):
                o = dict(o)
                maps = dict(o["named_maps"])
                maps[section] = dict(maps.get(section) or {}, **{name: definition})
                o["named_maps"] = maps
                return o
            await mutation(live, live.mutate_overlay(mutate, principal(req),
                                                     "%s.%s %s:%s" % (noun, verb, noun, name)))

        async def put(req):
            check_if_match(req, live)
            name = req.params["name"]
            body = json_body(req)
            ov = overlay()
            _check_base(name, ov)
            if section == "identity-providers":
                old = entries().get(name)
                before = old.get("max_admin_scope") if isinstance(old, dict) else None
                if old is not None and _rank(body.get("max_admin_scope")) > _rank(before):
                    raise AdminError(409, "raising max_admin_scope is refused over the admin "
                                     "API: the trust ceiling is operator file policy (lower it "
                                     "here, raise it in config.yaml)")
            await _store(req, name, body)
            return with_etag(json_response(_pending(one(name))), live)

        async def patch_settings(req):
            check_if_match(req, live)
            name = req.params["name"]
            body = json_body(req)
            no_unknown(body, ("settings",))
            bag = body.get("settings")
            if not isinstance(bag, dict):
                raise AdminError(400, "malformed body: `settings` must be an object")
            if name not in entries():
                raise AdminError(404, "%s `%s` not found" % (what, name))
            ov = overlay()
            _check_base(name, ov)
            await _store(req, name, dict(ov["named_maps"][section][name], settings=bag), "settings")
            return with_etag(json_response(_pending(one(name))), live)

        async def delete(req):
            check_if_match(req, live)
            name = req.params["name"]
            if name not in entries():
                raise AdminError(404, "%s `%s` not found" % (what, name))
            ov = overlay()
            _check_base(name, ov)
            if section == "identity-providers":
                auth = doc().get("auth") if isinstance(doc().get("auth"), dict) else {}
                for key in ("chain", "admin_auth"):
                    if name in (auth.get(key) or ()):
                        raise AdminError(409, "identity provider `%s` is still referenced by "
                                         "auth.%s (remove the reference first)" % (name, key))

            def mutate(o):
                o = dict(o)
                maps = dict(o["named_maps"])
                own = {k: v for k, v in (maps.get(section) or {}).items() if k != name}
                if own:
                    maps[section] = own
                else:
                    maps.pop(section, None)
                o["named_maps"] = maps
                return o
            await mutation(live, live.mutate_overlay(mutate, principal(req),
                                                     "%s.delete %s:%s" % (noun, noun, name)))
            return with_etag(Response(204, b""), live)

        r.add("GET", base, listing, summary="every %s definition" % what)
        r.add("GET", base + "/{name}", get, summary="one %s definition" % what)
        r.add("PUT", base + "/{name}", audited(noun + ".replace", param(noun, "name"))(put),
              summary="create or replace an API-owned %s" % what)
        r.add("DELETE", base + "/{name}", audited(noun + ".delete", param(noun, "name"))(delete),
              summary="remove an API-owned %s" % what)
        r.add("PATCH", base + "/{name}/settings",
              audited(noun + ".settings", param(noun, "name"))(patch_settings),
              summary="replace an API-owned %s's settings bag" % what)

    r.add("GET", PREFIX + "/auth", auth, summary="the ingress auth chain and upstream credentials")
    r.add("GET", PREFIX + "/admin-auth", admin_auth, summary="the admin auth chain")
    r.add("PUT", PREFIX + "/admin-auth",
          audited("auth.admin_chain_put", "auth:admin_auth")(put_admin_auth),
          summary="replace the admin auth chain")
    r.add("GET", PREFIX + "/hooks", hooks, summary="the hook registry")
    r.add("POST", PREFIX + "/hooks", audited("hook.register", body_field("hook:%s", "name"))(post_hook),
          summary="register a hook")
    r.add("GET", PREFIX + "/hooks/{name}", hook, summary="one hook")
    r.add("PUT", PREFIX + "/hooks/{name}", audited("hook.replace", param("hook", "name"))(put_hook),
          summary="replace an API-registered hook")
    r.add("DELETE", PREFIX + "/hooks/{name}", audited("hook.delete", param("hook", "name"))(delete_hook),
          summary="remove an API-registered hook")
    r.add("PATCH", PREFIX + "/hooks/{name}/settings",
          audited("hook.settings", param("hook", "name"))(patch_hook_settings),
          summary="replace a hook's settings")
    r.add("GET", PREFIX + "/hooks/{name}/health", hook_health, summary="a hook's module")
    r.add("GET", PREFIX + "/hooks/{name}/schema", hook_schema, summary="a hook's settings schema")
    r.add("GET", PREFIX + "/hooks/{name}/status", hook_status, summary="desired vs reported")
    named_routes("export")
    named_routes("identity-providers")
