"""The admin API v1's server, topology and config-plane endpoints under /api/v1/admin, in the Rust
gateway's shapes (docs/admin-api.md): info, pools, models, providers, config (read, validate,
apply, reload, rollback, versions, diff, settings), overlay resets, restart, and openapi.json. The
named maps (hooks, identity providers, exporters, auth posture) are busbar/admin/named.py's, the
plugin catalog busbar/admin/plugins.py's. Reads come from the parent's current snapshot (every
worker runs the same one: swaps are acknowledged before they return)."""
from __future__ import annotations

import logging
import os
import signal

import orjson

from busbar.admin import overlay as fmt
from busbar.admin import views
from busbar.admin.site import PREFIX, PUBLIC, AdminError, Response, bump_plane
from busbar.admin.handlers import (audited, body_field, check_if_match, json_body, mutation,
                                   no_unknown, param, principal, query, with_etag)
from busbar.admin.site import compact_response as json_response
from busbar.admin.site import page as cursor_page

log = logging.getLogger("busbar.admin")

# GET config/versions: page size when none is asked, and the most one page holds (the Rust
# gateway's: docs/admin-api.md, Pagination).
VERSIONS_PAGE_DEFAULT = 100
VERSIONS_PAGE_MAX = 1000
# Environment variables whose presence means a process manager restarts busbar when it exits
# (systemd sets INVOCATION_ID for a unit's process, Kubernetes the service host in every pod): the
# Rust gateway's markers, so POST restart refuses or proceeds on the same hosts.
SUPERVISOR_MARKERS = ("INVOCATION_ID", "KUBERNETES_SERVICE_HOST")
# How long after the 202 is written the drain begins: time for the answer to leave the socket.
RESTART_DELAY_SECS = 0.05


# ---------------------------------------------------------------------- restart
def supervisor_detected(env=os.environ) -> bool:
    return any(k in env for k in SUPERVISOR_MARKERS)


def mount(site, live, plane):
    r = site.routes
    gw = live.gw
    # admin tokens and the admin_auth chain follow the config (reload, apply, PUT admin-auth)
    live.on_swap.append(lambda config: site.set_auth(config.control or live.control))
    if live.trips is None:               # pools' last_trip_at (the plane starts it at boot)
        live.trips = views.TripClock(gw)
        live.trips.start()

    def snap():
        return gw.snapshot

    async def healthz(req):
        if not snap().router.lanes:
            return Response(503, b"no usable lanes", b"text/plain; charset=utf-8")
        from busbar.governance.plane import store_problem
        problem = await store_problem(gw)
        if problem is not None:     # keys cannot be minted or changed: say why
            return Response(503, problem.encode(), b"text/plain; charset=utf-8")
        return Response(200, b"ok", b"text/plain; charset=utf-8")

    # ------------------------------------------------------------------ topology
    def info(req):
        return json_response(views.info_view(live, snap()))

    def pools(req):
        detail = query(req).get("detail")
        if detail not in (None, "true", "false"):
            raise AdminError(400, "invalid `detail`: expected true|false")
        s = snap()
        if detail == "true":
            items = [views.pool_detail(gw, s, p) for p in s.config.pools.values()]
        else:
            items = [views.pool_view(p) for p in s.config.pools.values()]
        return json_response(views.page(items))

    def pool(req):
        s = snap()
        name = req.params["name"]
        p = s.config.pools.get(name)
        if p is None:
            raise AdminError(404, "pool `%s` not found" % name)
        return json_response(views.pool_detail(gw, s, p))

    def models(req):
        return json_response(views.page(views.model_view(m) for m in snap().config.models.values()))

    def providers(req):
        return json_response(views.page(views.provider_views(snap().config)))

    # ------------------------------------------------------------------ config plane
    def config(req):
        return with_etag(json_response(views.effective_config(live, snap())), live)

    def _proposed(req):
        """The {config, providers?} body of validate and apply."""
        body = json_body(req)
        no_unknown(body, ("config", "providers"))
        if "config" not in body:
            raise AdminError(400, "malformed body: missing field `config`")
        cfg, provs = body["config"], body.get("providers")
        if not isinstance(cfg, dict):
            raise AdminError(400, "malformed body: `config` must be an object (the config.yaml "
                             "document as JSON)")
        if provs is not None and not isinstance(provs, dict):
            raise AdminError(400, "malformed body: `providers` must be an object (a "
                             "providers.yaml document as JSON)")
        return cfg, provs

    def validate(req):
        cfg, provs = _proposed(req)
        config, errors, _ = live.build_text(orjson.dumps(cfg).decode(), provs)
        return json_response({"ok": config is not None, "errors": [] if config else errors})

    async def apply(req):
        check_if_match(req, live)
        cfg, provs = _proposed(req)
        done = await mutation(live, live.apply(cfg, provs, principal(req)))
        return with_etag(json_response({
            "applied": True, "config_version": live.current, **_acks(done),
            "note": "live until the next reload or restart, which return to the config files; "
                    "persist the change by updating config.yaml"}), live)

    async def reload(req):
        done = await mutation(live, live.reload(principal(req)))
        return with_etag(json_response({"reloaded": True, "config_version": live.current,
                                        **_acks(done)}), live)

    async def rollback(req):
        check_if_match(req, live)
        body = json_body(req)
        no_unknown(body, ("version",))
        v = body.get("version")
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise AdminError(400, "malformed body: expected {\"version\": N}")
        try:
            await mutation(live, live.rollback(v, principal(req)))
        except KeyError:
            raise AdminError(404, "config version %d not found (pruned or never recorded; GET "
                             "config/versions)" % v) from None
        return with_etag(json_response({"restored_version": v, "config_version": live.current}),
                         live)

    def versions(req):
        rows = [v.meta() for v in reversed(live.versions)]
        return json_response(cursor_page(req, rows, VERSIONS_PAGE_DEFAULT, VERSIONS_PAGE_MAX))

    def _version_arg(raw, what):
        try:
            v = int(raw)
            if v < 0:
                raise ValueError
            return v
        except (TypeError, ValueError):
            raise AdminError(400, "invalid `%s`: expected a config version number" % what) \
                from None

    def _hooks_at(ver):
        doc = ver.document or {}
        glob = set(views.global_hooks(doc))
        return ({n: views.hook_view(n, h, glob) for n, h in sorted(views.hooks_of(doc).items())},
                views.global_hooks(doc))

    def version(req):
        v = _version_arg(req.params["v"], "v")
        ver = live.version(v)
        if ver is None:
            raise AdminError(404, "config version %d not found (pruned or never recorded)" % v)
        hooks, glob = _hooks_at(ver)
        return json_response(dict(ver.meta(), hooks=hooks, global_hooks=glob))

    def diff(req):
        q = query(req)
        if "from" not in q or "to" not in q:
            raise AdminError(400, "missing `from` and `to` query parameters (config versions)")
        a, b = _version_arg(q["from"], "from"), _version_arg(q["to"], "to")
        va, vb = live.version(a), live.version(b)
        for n, ver in ((a, va), (b, vb)):
            if ver is None:
                raise AdminError(404, "config version %d not found (pruned or never recorded)" % n)
        ha, ga = _hooks_at(va)
        hb, gb = _hooks_at(vb)
        out = {"from": a, "to": b, "hooks": {
            "added": sorted(set(hb) - set(ha)), "removed": sorted(set(ha) - set(hb)),
            "changed": sorted(n for n in set(ha) & set(hb) if ha[n] != hb[n]
                              or (va.document or {}).get("hooks", {}).get(n)
                              != (vb.document or {}).get("hooks", {}).get(n))}}
        if ga != gb:
            out["global_hooks"] = {"from": ga, "to": gb}
        return json_response(out)

    def _root_settings():
        path = live.control.overlay
        try:
            ov = fmt.read(path) if path else fmt.empty()
        except fmt.OverlayError:
            ov = fmt.empty()        # unreadable: the read shows no overrides (a write refuses)
        return ov["root"]

    def settings(req):
        return with_etag(json_response({
            "applied": False, "config_version": live.current,
            "settings": views.redact_settings(_root_settings())}), live)

    async def put_settings(req):
        check_if_match(req, live)
        body = json_body(req)
        if "persist" in body:
            if not isinstance(body["persist"], bool):
                raise AdminError(400, "invalid `persist`: expected a boolean (it is accepted and "
                                 "has no effect: a mutable config is always durable)")
            body = {k: v for k, v in body.items() if k != "persist"}
        for k in body:
            if k not in fmt.ROOT_KEYS:
                raise AdminError(400, "unknown settings section `%s` (expected one of: %s)" % (
                    k, ", ".join(fmt.ROOT_KEYS)))
        for k, v in body.items():
            if k in fmt.PATCH_KEYS and not isinstance(v, dict):
                raise AdminError(400, "invalid `%s`: expected an object" % k)
            if _has_redacted(v):
                raise AdminError(400, "invalid `%s`: `settings_keys` is the redacted read of a "
                                 "settings bag, not a value to write; send `settings` itself" % k)

        def mutate(ov):
            ov = dict(ov)
            ov["root"] = fmt.merge_root(ov["root"], body)
            return ov
        done, ov = await mutation(live, live.mutate_overlay(
            mutate, principal(req), "config.settings (root section applied)",
            stored_if_restart=True))
        later = fmt.reload_to_apply(body)
        note = ("stored durably in the overlay and live now" if not later else
                "stored durably in the overlay; live now except %s, which take effect on the next "
                "restart (POST restart)" % ", ".join(later))
        if done and "needs_restart" in done:
            later = sorted(body)
            note = ("stored durably in the overlay; none of it is live yet: %s (POST restart)"
                    % done["needs_restart"].partition(": ")[2])
        return with_etag(json_response({
            "applied": True, "config_version": live.current,
            "settings": views.redact_settings(ov["root"]), "reload_to_apply": later,
            "note": note}), live)

    async def reset_overlay(req):
        section = req.params["section"]
        if section not in fmt.SECTIONS:
            raise AdminError(400, "unknown overlay section `%s` (expected `groups`|`hooks`|"
                             "`root`|`plugin_versions`)" % section)
        check_if_match(req, live)
        changed = False

        def mutate(ov):
            nonlocal changed
            if not fmt.has_state(ov, section):
                return None
            changed = True
            return fmt.clear(ov, section)
        summary = "overlay.reset %s (revert to config.yaml)" % section
        await mutation(live, live.mutate_overlay(mutate, principal(req), summary))
        # The groups section mirrors the API groups the governance store serves
        # (busbar/governance/overlay_groups.py): a reset takes them out of the store too.
        reset_groups = getattr(gw, "reset_api_groups", None)
        dropped = section == "groups" and reset_groups is not None and await reset_groups()
        if dropped and not changed:
            bump_plane(gw, principal(req), summary)
            changed = True
        return with_etag(json_response({"reset": section, "config_version": live.current,
                                        "changed": changed}), live)

    def restart(req):
        body = json_body(req, required=False)
        no_unknown(body, ("confirm",))
        confirm = body.get("confirm", False)
        if not isinstance(confirm, bool):
            raise AdminError(400, "invalid `confirm`: expected a boolean")
        supervised = supervisor_detected()
        if not supervised and not confirm:
            raise AdminError(409, "no process supervisor was detected (systemd, Kubernetes), so "
                             "exiting could leave busbar down; re-send with {\"confirm\": true} "
                             "to restart anyway (busbar re-executes itself after the drain)")
        plane.restart = True
        gw.loop.call_later(RESTART_DELAY_SECS, os.kill, os.getpid(), signal.SIGTERM)
        return json_response({
            "restarting": True, "supervisor_detected": supervised,
            "note": "draining: in-flight requests finish, then busbar starts again with the "
                    "same command line (same process id), reading config.yaml and its overlay "
                    "afresh; read this body before the connection closes"}, 202)

    def openapi(req):
        from busbar.admin.openapi import document
        return Response(200, orjson.dumps(document(site.routes)))

    r.add("GET", "/healthz", healthz, scope=PUBLIC,
          summary="any lane configured, and the governance store answering")
    r.add("GET", PREFIX + "/info", info, summary="version, build, uptime, topology, config version")
    r.add("GET", PREFIX + "/pools", pools, summary="pools and their members (?detail=true: live)")
    r.add("GET", PREFIX + "/pools/{name}", pool, summary="one pool's live member status")
    r.add("GET", PREFIX + "/models", models, summary="model lanes and their providers")
    r.add("GET", PREFIX + "/providers", providers, summary="providers and their lane counts")
    r.add("GET", PREFIX + "/config", config, summary="the effective config, redacted")
    r.add("POST", PREFIX + "/config/validate", validate, summary="dry-run validate a config")
    r.add("POST", PREFIX + "/config/reload", audited("config.reload", "config:disk")(reload),
          summary="re-read the config files and swap")
    r.add("POST", PREFIX + "/config/apply", audited("config.apply", "config:body")(apply),
          summary="apply a whole config (live only)")
    r.add("POST", PREFIX + "/config/rollback",
          audited("config.rollback", body_field("config:v%s", "version"))(rollback),
          summary="restore a retained version")
    r.add("GET", PREFIX + "/config/versions", versions, summary="config version history")
    r.add("GET", PREFIX + "/config/versions/{v}", version, summary="one retained version")
    r.add("GET", PREFIX + "/config/diff", diff, summary="hook-surface diff of two versions")
    r.add("GET", PREFIX + "/config/settings", settings, summary="the overlay's root settings")
    r.add("PUT", PREFIX + "/config/settings",
          audited("config.settings", "config:settings")(put_settings),
          summary="set root settings durably")
    r.add("DELETE", PREFIX + "/overlay/{section}",
          audited("overlay.reset", param("overlay", "section"))(reset_overlay),
          summary="revert one overlay section to config.yaml")
    r.add("POST", PREFIX + "/restart", audited("admin.restart", "process")(restart),
          summary="drain and start again")
    r.add("GET", PREFIX + "/openapi.json", openapi, summary="this API as OpenAPI 3.1")
    from busbar.admin import named, plugins
    named.mount(site, live)
    plugins.mount(site, live)


def _acks(done: dict) -> dict:
    """busbar's additions to a swap's answer (the contract's views only grow): how many worker
    processes acknowledged the new config, and how long the swap took."""
    return {"workers": done["workers"], "swap_ms": done["swap_ms"]}


def _has_redacted(node) -> bool:
    if isinstance(node, dict):
        return "settings_keys" in node or any(_has_redacted(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_redacted(v) for v in node)
    return False
