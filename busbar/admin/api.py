"""The admin API's endpoints under /api/v1/admin (SPEC §6), mounted on the admin site's route
table. Reads come from the parent's current snapshot (every worker runs the same one: swaps are
acknowledged before they return)."""
from __future__ import annotations

import os
import time

import orjson
import yaml

from busbar import __version__
from busbar.admin.live import Locked, NoSlot, WorkersFailed
from busbar.config.checks import problem_list
from busbar.admin.site import PREFIX, PUBLIC, AdminError, Response, error_response, json_response
from busbar.config import ConfigError


def _pool(snap, name, pool):
    lanes = snap.router.lanes
    return {
        "name": name,
        "members": [{
            "model": m.model.name, "weight": m.weight, "provider": m.model.provider.name,
            "protocol": m.model.provider.protocol,
            "inflight": lanes[m.model.name].inflight if m.model.name in lanes else 0,
            "max_concurrent": m.model.max_concurrent,
        } for m in pool.members],
    }


def _model(m):
    return {"name": m.name, "provider": m.provider.name, "protocol": m.provider.protocol,
            "upstream_model": m.upstream_model, "max_concurrent": m.max_concurrent,
            "operations": list(m.operations), "reasoning": m.reasoning,
            "default_max_tokens": m.default_max_tokens, "attempt_timeout_ms": m.attempt_timeout_ms}


def secret_refs(node, path=""):
    """The secret references in a config subtree as "env:NAME" / "file:PATH" (never a value)."""
    out = []
    if isinstance(node, dict):
        if len(node) == 1 and next(iter(node)) in ("env", "file") and isinstance(
                next(iter(node.values())), str):
            k, v = next(iter(node.items()))
            return [{"key": path, "ref": "%s:%s" % (k, v)}]
        for k, v in node.items():
            out += secret_refs(v, "%s.%s" % (path, k) if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += secret_refs(v, "%s[%d]" % (path, i))
    return out


def _provider(p, doc):
    return {"name": p.name, "protocol": p.protocol, "base_url": p.base_url, "auth": p.auth,
            "region": p.region, "secrets": secret_refs(doc or {}),
            "header_names": [n for n, _ in p.headers]}


def _parse_body(req):
    """A config in the body: YAML or JSON (JSON is YAML) → (text, document)."""
    if not req.body:
        raise AdminError(400, "expected a config (YAML or JSON) in the body")
    try:
        text = req.body.decode("utf-8")
    except UnicodeDecodeError:
        raise AdminError(400, "the body is not UTF-8") from None
    return text


def _problems(e: ConfigError, status=400):
    return error_response(status, "invalid config: %d problem(s); the running config is unchanged"
                          % len(e.problems), problems=problem_list(e.problems))


def mount(site, live, plane):
    r = site.routes
    gw = live.gw

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

    def info(req):
        s = snap()
        ctl = live.control
        cfg = s.config
        return json_response({
            "version": __version__, "config_version": s.version,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(live.started)),
            "uptime_secs": round(time.time() - live.started, 3),
            "workers": 1 + len(live.workers), "pid": os.getpid(),
            "listeners": {
                "data": "%s://%s:%d" % ("https" if ctl.tls else "http", cfg.listen_host, cfg.listen_port),
                "admin": "%s://%s:%d" % ("https" if ctl.admin_tls else "http", ctl.admin_host,
                                         ctl.admin_port)},
            "config": {"source": live.path, "locked": ctl.locked, "overlay": ctl.overlay},
        })

    def pools(req):
        s = snap()
        return json_response({"items": [_pool(s, n, p) for n, p in s.config.pools.items()]})

    def pool(req):
        s = snap()
        name = req.params["name"]
        p = s.config.pools.get(name)
        if p is None:
            raise AdminError(404, "no pool '%s'" % name)
        return json_response(_pool(s, name, p))

    def models(req):
        return json_response({"items": [_model(m) for m in snap().config.models.values()]})

    def providers(req):
        cfg = snap().config
        docs = (cfg.document or {}).get("providers") or {}
        return json_response({"items": [_provider(p, docs.get(n)) for n, p in cfg.providers.items()]})

    def config(req):
        s = snap()
        return json_response({"version": s.version, "config": s.config.document})

    def validate(req):
        config, errors, warnings = live.build_text(_parse_body(req))
        if config is None:
            return _problems(ConfigError(errors, warnings))
        return json_response({"ok": True, "warnings": problem_list(warnings)})

    async def _mutation(coro):
        try:
            return json_response(await coro)
        except ConfigError as e:
            return _problems(e)
        except Locked:
            return error_response(409, "the config is locked (config.locked: true): "
                                  "change config.yaml and reload")
        except NoSlot as e:
            return error_response(409, str(e))
        except WorkersFailed as e:
            return error_response(500, str(e))

    async def reload(req):
        return await _mutation(live.reload())

    async def apply(req):
        text = _parse_body(req)
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            return _problems(ConfigError(["<body>: not YAML or JSON: %s" % getattr(e, "problem", e)]))
        if not isinstance(doc, dict):
            return _problems(ConfigError(["<body>: expected a mapping with providers and models"]))
        return await _mutation(live.apply(doc))

    def versions(req):
        return json_response({"items": [v.summary() for v in reversed(live.versions)],
                              "current": snap().version})

    async def rollback(req):
        body = req.json()
        v = body.get("version") if isinstance(body, dict) else None
        if not isinstance(v, int) or isinstance(v, bool):
            raise AdminError(400, "expected {\"version\": N}")
        try:
            return await _mutation(live.rollback(v))
        except KeyError:
            raise AdminError(404, "no config version %d (GET config/versions)" % v) from None

    def openapi(req):
        from busbar.admin.openapi import document
        return Response(200, orjson.dumps(document(site.routes)))

    r.add("GET", "/healthz", healthz, scope=PUBLIC,
          summary="any lane configured, and the governance store answering")
    r.add("GET", PREFIX + "/info", info, summary="version, config version, start time, workers, listeners")
    r.add("GET", PREFIX + "/pools", pools, summary="every pool with its members")
    r.add("GET", PREFIX + "/pools/{name}", pool, summary="one pool")
    r.add("GET", PREFIX + "/models", models, summary="every model (lane)")
    r.add("GET", PREFIX + "/providers", providers, summary="providers; secret references, never values")
    r.add("GET", PREFIX + "/config", config, summary="the effective config, secrets as references")
    r.add("POST", PREFIX + "/config/validate", validate, summary="validate a config (YAML or JSON body)")
    r.add("POST", PREFIX + "/config/reload", reload, summary="re-read the config file and swap it in every worker")
    r.add("POST", PREFIX + "/config/apply", apply, summary="apply a whole config from the body")
    r.add("GET", PREFIX + "/config/versions", versions, summary="the configs this process has run")
    r.add("POST", PREFIX + "/config/rollback", rollback, summary="re-apply an earlier version {version}")
    r.add("GET", PREFIX + "/openapi.json", openapi, summary="this API as OpenAPI 3.1")
