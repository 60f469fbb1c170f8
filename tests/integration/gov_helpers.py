"""Shared by the governance tests: a gateway on the mock with keys on, and an admin client."""
from __future__ import annotations

import http.client
import json
import time

from tests.conftest import CONFIG, free_port, start_gateway

# an ed25519 signing key in the form `busbar --generate-signing-key` prints (64 hex characters)
SIGNING = "ab" * 32
ADMIN = "adm-" + "t" * 32

GOV = """
admin_listen: "127.0.0.1:{admin}"
identity-providers:
  ops: {{module: admin-tokens, token: {{env: BB_ADMIN}}}}
auth:
  chain: [keys]
  signing_key: {{env: BB_SIGNING}}
  admin_auth: [ops]
"""


def gov_env(extra=None):
    e = {"BB_SIGNING": SIGNING, "BB_ADMIN": ADMIN}
    e.update(extra or {})
    return e


def gov_config(mock_port, tail="", admin=None):
    admin = admin or free_port()
    base = CONFIG.format(port="{port}", mock=mock_port, dead=free_port())
    return base + GOV.format(admin=admin) + tail, admin


class Admin:
    def __init__(self, port, token=ADMIN):
        self.port = port
        self.token = token

    def call(self, method, path, body=None, token=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        h = {"authorization": "Bearer " + (token or self.token)}
        data = None
        if body is not None:
            data = json.dumps(body)
            h["content-type"] = "application/json"
        c.request(method, "/api/v1/admin" + path, data, h)
        r = c.getresponse()
        raw = r.read()
        c.close()
        return r.status, (json.loads(raw) if raw else None)

    def mint(self, **body):
        body.setdefault("name", "k")
        s, d = self.call("POST", "/keys", body)
        assert s == 201, d
        return d


def start(tmp_path, mock_port, tail="", workers=1, extra_env=None):
    text, admin = gov_config(mock_port, tail)
    gw = start_gateway(tmp_path, text, workers, gov_env(extra_env))
    gw.admin = Admin(admin)
    return gw


def post(gw, path, body, headers):
    c = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=15)
    h = {"content-type": "application/json"}
    h.update(headers)
    c.request("POST", path, json.dumps(body), h)
    r = c.getresponse()
    data = r.read()
    hd = dict((k.lower(), v) for k, v in r.getheaders())
    c.close()
    return r.status, data, hd


def wait_usage(admin, path, pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        s, d = admin.call("GET", path)
        if s == 200 and pred(d):
            return d
        if time.monotonic() > deadline:
            return d
        time.sleep(0.1)


def key_day(admin, key_id, requests, timeout=5.0):
    """The key's row of today's GET /usage (the Rust UsageBreakdown: tokens_input, tokens_output,
    tokens_cache_read, tokens_cache_creation, requests, spend_micros) once it counts `requests`."""
    def row(d):
        return next((x for x in d.get("by_key", ()) if x["id"] == key_id), None)
    d = wait_usage(admin, "/usage", lambda d: (row(d) or {}).get("requests", 0) >= requests, timeout)
    return row(d)
