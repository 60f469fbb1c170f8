"""The admin API through the real server (SPEC §2.4, §6): its own listener, tokens and scopes, the
error envelope, the read endpoints, validate/reload/apply/rollback swapped in every worker of a
`--workers 2` gateway, SIGHUP, restart-only keys, locked and the overlay, one busbar per address."""
import http.client
import json
import os
import signal
import subprocess
import time

import pytest

from tests.conftest import PY, ROOT, env, free_port, start_gateway, stop, wait_http

OPS = "ops-token-0123456789"
VIEW = "viewer-token-0123456789"

BASE = """\
listen: "127.0.0.1:{port}"
admin_listen: "127.0.0.1:{admin}"
providers:
  m: {{protocol: openai, base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
models:
  a: {{provider: m, upstream_model: {up}}}
  b: {{provider: m, upstream_model: model-b, max_concurrent: 4}}
pools:
  p:
    members:
      - {{model: a, weight: 1}}
identity-providers:
  ops: {{module: admin-tokens, token: {{env: ADMIN_TOKEN}}}}
  viewer: {{module: admin-tokens, token: {{env: VIEWER_TOKEN}}, max_admin_scope: read-only}}
auth:
  admin_auth: [ops, viewer]
{extra}"""


def admin_env():
    e = env()
    e["ADMIN_TOKEN"] = OPS
    e["VIEWER_TOKEN"] = VIEW
    return e


class Gw:
    def __init__(self, proc, port, admin, path):
        self.proc, self.port, self.admin, self.path = proc, port, admin, path


def start(tmp_path, mock_port, workers=2, up="model-a", extra="", name="c.yaml"):
    port, admin = free_port(), free_port()
    # stderr to a file, never an undrained pipe: the access log (stderr by default) fills a pipe
    # in a few hundred requests, and a full pipe blocks the gateway's own logging.
    with open(tmp_path / (name + ".stderr"), "wb") as err:
        gw = start_gateway(tmp_path, BASE.format(port=port, admin=admin, mock=mock_port, up=up,
                                                 extra=extra), workers, port=port,
                           base_env=admin_env(), stderr=err,
                           ready=lambda p, proc: (wait_http(p, proc), wait_http(admin, proc)))
    return Gw(gw.proc, port, admin, gw.config_path)


def call(port, method, path, body=None, token=OPS, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    h = dict(headers or {})
    if token is not None:
        h["authorization"] = "Bearer " + token
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    c.request(method, path, body, h)
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, data


def A(path):
    return "/api/v1/admin/" + path


def chat_model(port, name="p"):
    st, body = call(port, "POST", "/v1/chat/completions",
                    {"model": name, "messages": [{"role": "user", "content": "hi"}]}, token=None,
                    headers={"content-type": "application/json"})
    return st, (body.get("model") if isinstance(body, dict) else body)


@pytest.fixture(scope="module")
def gw(mock_port, tmp_path_factory):
    g = start(tmp_path_factory.mktemp("admin"), mock_port)
    yield g
    stop(g.proc)


def test_admin_routes_are_absent_from_the_data_listener_and_healthz_is_on_both(gw):
    st, body = call(gw.port, "GET", A("info"))
    assert st == 404 and "error" in body and body["error"].get("type") == "not_found_error"
    for port in (gw.port, gw.admin):
        st, body = call(port, "GET", "/healthz", token=None)
        assert (st, body) == (200, b"ok")


def test_tokens_and_scopes(gw):
    st, body = call(gw.admin, "GET", A("info"), token=None)
    assert st == 401 and body["error"]["code"] == "unauthorized"
    assert "an admin token is required" in body["error"]["message"]
    # A wrong token is told it is wrong (not that it is missing), and is never echoed.
    for h in ({"authorization": "Bearer wrong-token-0123456789"},
              {"x-admin-token": "wrong-token-0123456789"}):
        st, body = call(gw.admin, "GET", A("info"), token=None, headers=h)
        assert st == 401 and body["error"]["code"] == "unauthorized"
        msg = body["error"]["message"]
        assert "not valid" in msg and "required" not in msg and "wrong-token" not in msg
    st, _ = call(gw.admin, "GET", A("info"), token=None, headers={"x-admin-token": VIEW})
    assert st == 200
    st, body = call(gw.admin, "POST", A("config/reload"), token=VIEW)
    assert st == 403 and body["error"]["code"] == "forbidden" and "`full`" in body["error"]["message"]
    # validate is a read-only POST
    st, body = call(gw.admin, "POST", A("config/validate"), {"config": {"providers": {}, "models": {}}},
                    token=VIEW)
    assert st == 200 and body == {"ok": True, "errors": []}
    # unknown paths and methods: after auth, in the envelope
    assert call(gw.admin, "GET", A("nope"), token=None)[0] == 401
    st, body = call(gw.admin, "GET", A("nope"))
    assert st == 404 and body["error"]["code"] == "not_found"
    st, body = call(gw.admin, "DELETE", A("info"))
    assert st == 405 and body["error"]["code"] == "method_not_allowed"


def test_read_endpoints(gw):
    st, info = call(gw.admin, "GET", A("info"), token=VIEW)
    assert st == 200 and set(info) == {"version", "build", "uptime_seconds", "started_at", "topology",
                                       "config_persistence", "config_version"}
    assert info["build"]["weighted_floor"] is True and "admin-tokens" in info["build"]["auth_modules"]
    assert info["topology"] == {"pools": 1, "models": 2, "providers": 1}
    assert isinstance(info["started_at"], int) and abs(info["started_at"] - time.time()) < 600
    assert info["config_persistence"] is True     # mutable: the overlay beside the config file
    st, pools = call(gw.admin, "GET", A("pools"), token=VIEW)
    assert pools == {"items": [{"name": "p", "members": [{"model": "a", "weight": 1}]}],
                     "next_cursor": None}
    st, pool = call(gw.admin, "GET", A("pools/p"), token=VIEW)
    assert st == 200 and pool["name"] == "p" and pool["members"][0]["model"] == "a"
    assert set(pool["members"][0]) == {"model", "weight", "usable", "cooldown_remaining_seconds",
                                       "available_concurrency", "inflight", "latency_ms", "ok", "err",
                                       "dead", "trip_count", "last_trip_at"}
    st, detail = call(gw.admin, "GET", A("pools?detail=true"), token=VIEW)
    assert detail["items"][0]["members"][0].keys() == pool["members"][0].keys()
    assert call(gw.admin, "GET", A("pools?detail=yes"), token=VIEW)[0] == 400
    st, body = call(gw.admin, "GET", A("pools/zzz"), token=VIEW)
    assert st == 404 and body["error"]["code"] == "not_found"
    st, models = call(gw.admin, "GET", A("models"), token=VIEW)
    assert models == {"items": [{"model": "a", "provider": "m"}, {"model": "b", "provider": "m"}],
                      "next_cursor": None}
    st, provs = call(gw.admin, "GET", A("providers"), token=VIEW)
    assert provs == {"items": [{"provider": "m", "model_count": 2}], "next_cursor": None}
    c = http.client.HTTPConnection("127.0.0.1", gw.admin, timeout=30)
    c.request("GET", A("config"), headers={"authorization": "Bearer " + VIEW})
    r = c.getresponse()
    cfg = json.loads(r.read())
    assert r.getheader("ETag") == '"%d"' % cfg["version"] == '"%d"' % info["config_version"]
    assert set(cfg) == {"version", "auth", "pools", "models", "providers", "hooks", "global_hooks"}
    text = json.dumps(cfg)
    assert OPS not in text and VIEW not in text and "sk-test-key" not in text


def test_validate_reports_problems_with_paths(gw):
    bad = {"providers": {"m": {"protocol": "openai", "base_url": "http://127.0.0.1:9"}},
           "models": {"gpt": {"provider": "m", "max_concurent": 2}}}
    st, body = call(gw.admin, "POST", A("config/validate"), {"config": bad})
    assert st == 200 and body["ok"] is False
    assert "models.gpt.max_concurent: unknown key (did you mean 'max_concurrent'?)" in body["errors"]
    bad["models"] = {"x": {"provider": "m"}}
    st, body = call(gw.admin, "POST", A("config/validate"), {"config": bad})
    assert st == 200 and body == {"ok": True, "errors": []}
    # a catalog in the body: a provider of it is found by name
    st, body = call(gw.admin, "POST", A("config/validate"), {
        "config": {"providers": {"mine": {"catalog": "acme", "api_key": {"env": "MOCK_KEY"}}},
                   "models": {"x": {"provider": "mine"}}},
        "providers": {"acme": {"protocol": "openai", "base_url": "http://127.0.0.1:9"}}})
    assert st == 200 and body == {"ok": True, "errors": []}, body
    # only a malformed body is an HTTP error
    for raw in ("models: [", [], {"config": []}, {"config": {}, "extra": 1}, {"providers": {}}):
        st, body = call(gw.admin, "POST", A("config/validate"), raw)
        assert st == 400 and body["error"]["code"] == "invalid_request", raw


def _spread(port, n=30, name="p"):
    """The answers of n requests on fresh connections (the kernel spreads them over workers)."""
    return {chat_model(port, name)[1] for _ in range(n)}


def test_reload_swaps_every_worker_and_refuses_an_invalid_config(gw, mock_port):
    assert _spread(gw.port) == {"model-a"}
    text = gw.path.read_text()
    gw.path.write_text(text.replace("upstream_model: model-a", "upstream_model: model-a2"))
    st, body = call(gw.admin, "POST", A("config/reload"))
    assert st == 200 and body["reloaded"] is True
    assert _spread(gw.port) == {"model-a2"}       # both workers, at once
    v = body["config_version"]
    gw.path.write_text(text.replace("max_concurrent: 4", "max_concurent: 4"))
    st, body = call(gw.admin, "POST", A("config/reload"))
    assert st == 400 and "models.b.max_concurent: unknown key" in body["error"]["message"]
    assert _spread(gw.port) == {"model-a2"}       # the old config keeps serving
    assert call(gw.admin, "GET", A("info"))[1]["config_version"] == v
    gw.path.write_text(text)
    assert call(gw.admin, "POST", A("config/reload"))[0] == 200


def test_apply_versions_rollback_and_restart_only_keys(gw):
    import yaml
    doc = yaml.safe_load(gw.path.read_text())
    before = call(gw.admin, "GET", A("config"))[1]["version"]
    doc["models"]["a"]["upstream_model"] = "model-applied"
    doc["listen"] = "127.0.0.1:%d" % free_port()
    st, body = call(gw.admin, "POST", A("config/apply"), {"config": doc},
                    headers={"If-Match": '"%d"' % before})
    assert st == 200, body
    assert body["applied"] is True and body["config_version"] == before + 1 and body["note"]
    assert _spread(gw.port) == {"model-applied"}  # still served on the old listener
    st, vs = call(gw.admin, "GET", A("config/versions"), token=VIEW)
    assert vs["items"][0] == {"version": before + 1, "ts": vs["items"][0]["ts"], "principal": "admin",
                              "summary": "config.apply (request body)"}
    st, body = call(gw.admin, "POST", A("config/rollback"), {"version": before},
                    headers={"If-Match": '"%d"' % before})
    assert st == 409 and body["error"]["code"] == "version_conflict"
    st, body = call(gw.admin, "POST", A("config/rollback"), {"version": before})
    assert st == 200 and body == {"restored_version": before, "config_version": before + 2}, body
    assert _spread(gw.port) != {"model-applied"}
    st, body = call(gw.admin, "POST", A("config/rollback"), {"version": 9999})
    assert st == 404 and body["error"]["code"] == "not_found"
    st, body = call(gw.admin, "POST", A("config/rollback"), {"v": 1})
    assert st == 400 and body["error"]["code"] == "invalid_request"
    st, body = call(gw.admin, "POST", A("config/apply"), {"config": {"models": []}})
    assert st == 400 and "nothing changed" in body["error"]["message"]


def test_sighup_reloads_instead_of_killing(gw):
    text = gw.path.read_text()
    gw.path.write_text(text.replace("upstream_model: model-a", "upstream_model: model-hup"))
    try:
        v = call(gw.admin, "GET", A("info"))[1]["config_version"]
        os.kill(gw.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        while call(gw.admin, "GET", A("info"))[1]["config_version"] == v:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert gw.proc.poll() is None
        assert _spread(gw.port) == {"model-hup"}
    finally:
        gw.path.write_text(text)
        call(gw.admin, "POST", A("config/reload"))


def test_surviving_lanes_keep_their_identity():
    """In-process: a reload that keeps model b's config keeps its Lane (and inflight count) and its
    provider's Egress; a changed model gets a new Lane."""
    from busbar import config
    from busbar.admin.live import assign_slots, next_snapshot
    from busbar.engine.snapshot import Snapshot
    base = BASE.format(port=1, admin=2, mock=3, up="model-a", extra="").split("identity-providers:")[0]
    c1 = config.load(text=base, env={"MOCK_KEY": "k" * 20})
    c2 = config.load(text=base.replace("upstream_model: model-a", "upstream_model: z"),
                     env={"MOCK_KEY": "k" * 20})
    old = Snapshot(c1)
    held = old.router.lanes["b"]
    assert held.try_acquire()
    new, fresh = next_snapshot(old, c2, 2, None, assign_slots(old.router, c2, None))
    assert new.router.lanes["b"] is held and new.router.lanes["b"].inflight == 1
    assert new.router.lanes["a"] is not old.router.lanes["a"]
    assert new.egress["m"] is old.egress["m"] and fresh == []
    assert new.router.resolve("p").lanes[0] is new.router.lanes["a"]


def test_locked_refuses_mutations_and_the_overlay_persists_api_changes(tmp_path, mock_port):
    import yaml
    g = start(tmp_path, mock_port, workers=1, extra="config: {locked: true}\n")
    try:
        assert call(g.admin, "GET", A("info"))[1]["config_persistence"] is False
        doc = yaml.safe_load(g.path.read_text())
        for method, path, body in (("POST", "config/apply", {"config": doc}),
                                   ("POST", "config/rollback", {"version": 0}),
                                   ("PUT", "config/settings", {"routing": {}}),
                                   ("PUT", "export/x", {"module": "request-log-file"}),
                                   ("DELETE", "overlay/root", None)):
            st, resp = call(g.admin, method, A(path), body)
            assert st == 400 and "config.locked: true" in resp["error"]["message"], (path, resp)
        assert call(g.admin, "POST", A("config/reload"))[0] == 200   # the file is the source
    finally:
        stop(g.proc)
    overlay = tmp_path / "ov.json"
    g = start(tmp_path, mock_port, workers=1, extra="config: {overlay: {file: ov.json}}\n",
              name="o.yaml")
    log = tmp_path / "requests.log"
    try:
        st, body = call(g.admin, "PUT", A("config/settings"),
                        {"routing": {"default_policy_timeout_ms": 7},
                         "limits": {"max_inbound_concurrent": 50},
                         "admin_listen": "127.0.0.1:%d" % g.admin})
        assert st == 200, body
        assert body["settings"] == {"routing": {"default_policy_timeout_ms": 7},
                                    "limits": {"max_inbound_concurrent": 50},
                                    "admin_listen": "127.0.0.1:%d" % g.admin}
        assert body["reload_to_apply"] == ["admin_listen", "limits.max_inbound_concurrent"]
        st, body = call(g.admin, "PUT", A("export/reqlog"),
                        {"module": "request-log-file", "settings": {"path": str(log)}})
        assert st == 200 and body["reload_to_apply"] == ["export.reqlog"], body
        assert {k: body[k] for k in ("name", "module", "settings_keys")} == {
            "name": "reqlog", "module": "request-log-file", "settings_keys": ["path"]}
        assert call(g.admin, "GET", A("config/settings"))[1]["settings"]["routing"] == {
            "default_policy_timeout_ms": 7}
        data = json.loads(overlay.read_text())
        assert data["version"] == 1 and data["root"]["routing"] == {"default_policy_timeout_ms": 7}
        assert data["named_maps"]["export"]["reqlog"]["settings"] == {"path": str(log)}
        assert "reqlog" not in g.path.read_text()           # config.yaml never written
    finally:
        stop(g.proc)
    # reapplied over config.yaml at boot
    proc = subprocess.Popen([PY, "-m", "busbar.cli", "serve", "--config", str(g.path), "--workers",
                             "1"], cwd=ROOT, env=admin_env(), stdout=subprocess.DEVNULL)
    try:
        wait_http(g.port, proc)
        wait_http(g.admin, proc)
        assert call(g.admin, "GET", A("export/reqlog"))[1]["module"] == "request-log-file"
        chat_model(g.port)
        deadline = time.monotonic() + 10
        while not (log.exists() and log.read_text()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert json.loads(log.read_text().splitlines()[-1])["pool"] == "p"
        assert call(g.admin, "GET", A("config/settings"))[1]["settings"]["limits"] == {
            "max_inbound_concurrent": 50}
        # a section reset reverts to config.yaml, and is durable too
        st, body = call(g.admin, "DELETE", A("overlay/root"))
        assert st == 200 and body["reset"] == "root" and body["changed"] is True
        assert call(g.admin, "DELETE", A("overlay/root"))[1]["changed"] is False
        assert call(g.admin, "GET", A("config/settings"))[1]["settings"] == {}
        assert json.loads(overlay.read_text())["root"] == {}
        st, body = call(g.admin, "DELETE", A("overlay/nope"))
        assert st == 400 and body["error"]["code"] == "invalid_request"
    finally:
        stop(proc)


def test_no_admin_token_means_401(tmp_path, mock_port):
    port, admin = free_port(), free_port()
    proc = start_gateway(tmp_path, BASE.format(port=port, admin=admin, mock=mock_port, up="x",
                                               extra="").split("identity-providers:")[0], port=port,
                         base_env=admin_env(), ready=lambda p, pr: wait_http(admin, pr)).proc
    try:
        assert call(admin, "GET", A("info"), token=OPS)[0] == 401
        assert call(admin, "GET", "/healthz", token=None)[0] == 200
    finally:
        stop(proc)


def _serve(path, extra_env=None, *args):
    e = admin_env()
    e.update(extra_env or {})
    return subprocess.run([PY, "-m", "busbar.cli", "serve", "--config", str(path), *args], cwd=ROOT,
                          env=e, capture_output=True, text=True, timeout=30)


def test_boot_errors_for_admin_auth(tmp_path):
    base = BASE.format(port=free_port(), admin=free_port(), mock=9, up="x", extra="")
    p = tmp_path / "e.yaml"
    p.write_text(base)
    r = _serve(p, {"ADMIN_TOKEN": ""})
    assert r.returncode == 1 and "identity-providers.ops.token: resolves to an empty token" in r.stderr
    p.write_text(base.split("identity-providers:")[0].replace('admin_listen: "127.0.0.1',
                                                              'admin_listen: "0.0.0.0')
                 + "auth: {admin_auth: []}\n")
    r = _serve(p)
    assert r.returncode == 1
    assert "admin_listen: '0.0.0.0' is not loopback: set admin_tls with a client_ca" in r.stderr


def test_one_instance_per_address(gw, tmp_path):
    p = tmp_path / "second.yaml"
    p.write_text(gw.path.read_text())
    for workers in ("1", "2"):
        r = _serve(p, None, "--workers", workers)
        assert r.returncode == 1
        assert r.stderr.strip().splitlines()[-1] == "error: listen 127.0.0.1:%d: address already in use" % gw.port
        assert "Traceback" not in r.stderr
    p.write_text(gw.path.read_text().replace('listen: "127.0.0.1:%d"' % gw.port,
                                             'listen: "127.0.0.1:%d"' % free_port()))
    r = _serve(p)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == "error: admin_listen 127.0.0.1:%d: address already in use" % gw.admin
    r = _serve(p, None, "--listen", "foo")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == ['error: --listen: expected "HOST:PORT" (e.g. "0.0.0.0:8080")']


def test_openapi_document_is_valid_openapi_3_1(gw):
    from openapi_spec_validator import validate
    st, doc = call(gw.admin, "GET", A("openapi.json"), token=VIEW)
    assert st == 200 and doc["openapi"] == "3.1.0"
    validate(doc)
    assert doc["paths"]["/api/v1/admin/config/validate"]["post"]["x-busbar-required-scope"] == "read-only"
    assert doc["paths"]["/api/v1/admin/config/apply"]["post"]["x-busbar-required-scope"] == "full"
