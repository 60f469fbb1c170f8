"""The admin API v1's governance half and its surface-wide machinery (issue 38), through the real
gateway over real HTTP, against the Rust gateway's contract (GetBusbar/busbar 1a74c3b6):

- every keys error case the Rust gateway pins byte-for-byte (status, content type, body bytes), in
  the three postures it pins them in: signing key, governance on without one, governance off;
- the envelope on 404/405/401/403, scopes, mutation budgets with 429 + Retry-After: 60;
- key ETags and If-Match, cursors, idempotent mints, groups with config-plane ETags;
- the hash-chained audit log and GET /audit;
- terraform-provider-busbar's requests (method, path, headers, body bytes) for a key's whole
  life, and a group's with ETags chained (the busbar-python SDK itself drives the same surface in
  test_admin_v1_sdk_governance.py).
"""
from __future__ import annotations

import hashlib
import http.client
import json

import pytest

from tests.conftest import CONFIG, free_port, start_gateway, stop
from tests.integration.gov_helpers import ADMIN, gov_config, gov_env

PREFIX = "/api/v1/admin"
OVERLONG = "vk_" + "a" * 62          # 65 characters: one past the 64 cap
MISSING = "vk_0000000000000000"
STALE = '"00000000000000ff"'
GOV_OFF = ("governance is not enabled on this server; enable `governance:` in config.yaml to "
           "manage virtual keys")
STALE_KEY = "If-Match ETag is stale: the key changed since you read it (re-read and retry)"
BAD_IF_MATCH = "malformed If-Match: expected the key's ETag (16 hex chars, quoted) or *"

# The Rust gateway's pinned keys error wire (crates/busbar/src/admin/tests/keys_error_wire.json),
# as (posture, method, path, headers, body) -> (status, code, message). `{live}` is a minted key.
KEYS_ERROR_WIRE = [
    ("signing", "GET", "/keys?cursor=%21%21", {}, None,
     400, "invalid_request", "invalid or foreign pagination cursor"),
    ("signing", "GET", "/keys?enabled=maybe", {}, None,
     400, "invalid_request", "invalid `enabled` filter: expected true|false"),
    ("signing", "GET", "/keys?limit=lots", {}, None,
     400, "invalid_request", "invalid `limit`: expected an integer (max 1000)"),
    ("signing", "POST", "/keys", {}, "{",
     400, "invalid_request", "invalid JSON"),
    ("signing", "POST", "/keys", {}, '{"name":"k","labels":{"key":"v"}}',
     400, "invalid_request", 'label name \'key\' is reserved (busbar attaches it to metric series); '
     'reserved names are ["key", "bucket", "model", "tier"]'),
    ("signing", "POST", "/keys", {}, '{"name":"k","expires_in":"1h","expires_at":9999999999}',
     400, "invalid_request", "expires_in and expires_at are mutually exclusive; set at most one"),
    ("signing", "POST", "/keys", {}, '{"name":"k","expires_in":"1x"}',
     400, "invalid_request", "invalid duration unit 'x': use s|m|h|d"),
    ("signing", "POST", "/keys", {}, '{"name":"k","expires_at":1}',
     400, "invalid_request", "expires_at is in the past"),
    ("signing", "POST", "/keys", {}, '{"name":"k","parent":"team"}',
     400, "invalid_request", "`parent` was given without `group`; `parent` names the group to "
     "auto-provision `group` under, so `group` is required with it"),
    ("signing", "POST", "/keys", {}, '{"name":"k","group":"nope"}',
     400, "invalid_request", "group 'nope' does not exist in the top-level groups block; either "
     "configure it first, or pass `parent: <existing-group>` to auto-provision it as a leaf (e.g. "
     "`parent: team-payments` creates nope under team-payments and binds the key)"),
    ("signing", "POST", "/keys", {}, '{"name":"k","group":"leaf","parent":"nope"}',
     400, "invalid_request", "cannot auto-provision `leaf`: its `parent: nope` does not exist in "
     "the top-level groups block; name an existing team/org group"),
    ("nosigner", "POST", "/keys", {}, '{"name":"k"}',
     409, "conflict", "signed-token minting is unavailable: no signing key is configured (set "
     "auth.signing_key - busbar no longer auto-generates one; run `busbar "
     "--generate-signing-key`)"),
    ("off", "POST", "/keys", {}, '{"name":"k"}', 409, "conflict", GOV_OFF),
    ("signing", "GET", "/keys/" + OVERLONG, {}, None,
     400, "invalid_request", "id must be <= 64 characters"),
    ("signing", "GET", "/keys/" + MISSING, {}, None, 404, "not_found", "key not found"),
    ("off", "GET", "/keys/" + MISSING, {}, None,
     404, "not_found", "key not found (governance is not enabled on this server)"),
    ("signing", "PATCH", "/keys/" + OVERLONG, {}, "{}",
     400, "invalid_request", "id must be <= 64 characters"),
    ("signing", "PATCH", "/keys/" + MISSING, {"if-match": "not-an-etag"}, "{}",
     400, "invalid_request", BAD_IF_MATCH),
    ("signing", "PATCH", "/keys/" + MISSING, {}, "{", 400, "invalid_request", "invalid JSON"),
    ("signing", "PATCH", "/keys/" + MISSING, {}, '{"group":"nope"}',
     400, "invalid_request", "group 'nope' does not exist in the top-level groups block; configure "
     "it first (e.g. nope: { limits: [ { budget: 0, per: month } ] })"),
    ("signing", "PATCH", "/keys/" + MISSING, {}, "{}", 404, "not_found", "key not found"),
    ("signing", "PATCH", "/keys/{live}", {"if-match": STALE}, "{}",
     409, "version_conflict", STALE_KEY),
    ("off", "PATCH", "/keys/" + MISSING, {}, "{}", 409, "conflict", GOV_OFF),
    ("signing", "DELETE", "/keys/" + OVERLONG, {}, None,
     400, "invalid_request", "id must be <= 64 characters"),
    ("signing", "DELETE", "/keys/" + MISSING, {"if-match": "not-an-etag"}, None,
     400, "invalid_request", BAD_IF_MATCH),
    ("signing", "DELETE", "/keys/" + MISSING, {}, None, 404, "not_found", "key not found"),
    ("signing", "DELETE", "/keys/{live}", {"if-match": STALE}, None,
     409, "version_conflict", STALE_KEY),
    ("off", "DELETE", "/keys/" + MISSING, {}, None, 409, "conflict", GOV_OFF),
    ("signing", "GET", "/keys/%s/usage" % OVERLONG, {}, None,
     400, "invalid_request", "id must be <= 64 characters"),
    ("signing", "GET", "/keys/%s/usage" % MISSING, {}, None, 404, "not_found", "key not found"),
    ("off", "GET", "/keys/%s/usage" % MISSING, {}, None,
     404, "not_found", "key not found (governance is not enabled on this server)"),
    ("signing", "POST", "/keys/%s/rotate" % MISSING, {}, None, 404, "not_found", "key not found"),
    ("off", "POST", "/keys/%s/rotate" % MISSING, {}, None, 409, "conflict", GOV_OFF),
    ("signing", "POST", "/keys/%s/revoke" % OVERLONG, {}, None,
     400, "invalid_request", "id must be <= 64 characters"),
    ("signing", "POST", "/keys/%s/revoke" % MISSING, {}, None, 404, "not_found", "key not found"),
    ("off", "POST", "/keys/%s/revoke" % MISSING, {}, None, 409, "conflict", GOV_OFF),
    ("nosigner", "POST", "/signing-key/rotate", {}, None,
     409, "conflict", "no signing key is configured; nothing to rotate"),
    ("off", "POST", "/signing-key/rotate", {}, None, 409, "conflict", GOV_OFF),
]

GROUPS = """
groups:
  team: {limits: [{requests: 1000, per: minute}]}
store: {module: memory}
rate_card:
""" + "".join("  %s: {input_utok: 1.0, output_utok: 2.0}\n" % m for m in (
    "oai-model", "resp-model", "ant-model", "gem-model", "coh-model", "bed-model", "dead-model",
    "one-slot"))


class Client:
    def __init__(self, port, token=ADMIN):
        self.port = port
        self.token = token

    def raw(self, method, path, body=None, headers=None, token=True):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=15)
        h = {}
        if token and self.token:
            h["x-admin-token"] = self.token
        if body is not None:
            h["content-type"] = "application/json"
            if not isinstance(body, (str, bytes)):
                body = json.dumps(body)
        h.update(headers or {})
        c.request(method, PREFIX + path, body, h)
        r = c.getresponse()
        data = r.read()
        hd = {k.lower(): v for k, v in r.getheaders()}
        c.close()
        return r.status, hd, data

    def call(self, method, path, body=None, headers=None):
        s, h, data = self.raw(method, path, body, headers)
        return s, h, (json.loads(data) if data else None)


def _start(tmp, text, env):
    g = start_gateway(tmp, text, 1, env)
    return g


@pytest.fixture(scope="module")
def signing(mock_port, tmp_path_factory):
    text, admin = gov_config(mock_port, GROUPS)
    g = _start(tmp_path_factory.mktemp("sig"), text, gov_env())
    g.admin = Client(admin)
    yield g
    stop(g.proc)


@pytest.fixture
def fresh(mock_port, tmp_path):
    """A gateway of its own: the mutation budget (60 a minute per principal) is per process, so a
    test with many mutations does not share one with the others."""
    text, admin = gov_config(mock_port, GROUPS)
    g = _start(tmp_path, text, gov_env())
    g.admin = Client(admin)
    yield g
    stop(g.proc)


@pytest.fixture(scope="module")
def nosigner(mock_port, tmp_path_factory):
    admin = free_port()
    text = CONFIG.format(port="{port}", mock=mock_port, dead=free_port()) + """
admin_listen: "127.0.0.1:%d"
identity-providers:
  ops: {module: admin-tokens, token: {env: BB_ADMIN}}
auth:
  admin_auth: [ops]
""" % admin + GROUPS
    g = _start(tmp_path_factory.mktemp("nosig"), text, gov_env())
    g.admin = Client(admin)
    yield g
    stop(g.proc)


@pytest.fixture(scope="module")
def off(mock_port, tmp_path_factory):
    admin = free_port()
    text = CONFIG.format(port="{port}", mock=mock_port, dead=free_port()) + """
admin_listen: "127.0.0.1:%d"
auth:
  admin_auth: []
""" % admin
    g = _start(tmp_path_factory.mktemp("off"), text, gov_env())
    g.admin = Client(admin, token=None)
    yield g
    stop(g.proc)


def test_keys_error_wire_is_the_rust_gateways_byte_for_byte(signing, nosigner, off):
    gws = {"signing": signing, "nosigner": nosigner, "off": off}
    s, _, live = signing.admin.call("POST", "/keys", {"name": "live"})
    assert s == 201, live
    for posture, method, path, headers, body, status, code, message in KEYS_ERROR_WIRE:
        path = path.replace("{live}", live["id"])
        s, h, data = gws[posture].admin.raw(method, path, body, headers)
        want = json.dumps({"error": {"code": code, "message": message}}, separators=(",", ":"),
                          ensure_ascii=False).encode()
        assert (s, h["content-type"], data) == (status, "application/json", want), (
            posture, method, path)


def test_envelope_on_unmatched_wrong_method_and_bad_credentials(signing):
    a = signing.admin
    s, _, d = a.call("GET", "/no-such-thing")
    assert s == 404 and d["error"]["code"] == "not_found"
    s, h, d = a.call("PUT", "/keys")
    assert s == 405 and d["error"]["code"] == "method_not_allowed" and "GET" in h["allow"]
    s, _, d = Client(a.port, "wrong").call("GET", "/keys")
    assert s == 401 and d["error"]["code"] == "unauthorized" and "wrong" not in json.dumps(d)
    s, _, d = Client(a.port, None).call("GET", "/keys")
    assert s == 401 and d["error"]["code"] == "unauthorized"


def test_read_only_token_reads_validates_and_is_refused_naming_full(mock_port, tmp_path):
    admin = free_port()
    text = CONFIG.format(port="{port}", mock=mock_port, dead=free_port()) + """
admin_listen: "127.0.0.1:%d"
identity-providers:
  ops: {module: admin-tokens, token: {env: BB_ADMIN}}
  ro: {module: admin-tokens, token: {env: BB_RO}, max_admin_scope: read-only}
auth:
  chain: [keys]
  signing_key: {env: BB_SIGNING}
  admin_auth: [ops, ro]
""" % admin + GROUPS
    g = start_gateway(tmp_path, text, 1, gov_env({"BB_RO": "ro-" + "r" * 32}))
    try:
        ro = Client(admin, "ro-" + "r" * 32)
        assert ro.call("GET", "/keys")[0] == 200
        s, _, d = ro.call("POST", "/keys", {"name": "x"})
        assert s == 403 and d["error"]["code"] == "forbidden" and "`full`" in d["error"]["message"]
        # an unknown method needs full too
        s, _, d = ro.call("PURGE", "/keys")
        assert s == 403 and d["error"]["code"] == "forbidden"
        # the refusal is audited, once per window
        s, _, d = Client(admin).call("GET", "/audit?action=admin.forbidden")
        assert s == 200 and len(d["items"]) == 1 and d["items"][0]["outcome"] == "rejected"
        assert d["items"][0]["principal"] == "admin"
    finally:
        stop(g.proc)


def test_crud_budget_is_60_a_minute_then_429_with_retry_after(mock_port, tmp_path):
    text, admin = gov_config(mock_port, GROUPS)
    g = start_gateway(tmp_path, text, 1, gov_env())
    try:
        a = Client(admin)
        statuses = [a.raw("POST", "/keys/%s/revoke" % MISSING)[0] for _ in range(60)]
        # failed attempts spend budget too (all 404 here)
        assert statuses == [404] * 60
        s, h, data = a.raw("POST", "/keys", {"name": "x"})
        if s != 429:        # the minute rolled over between the two loops: spend it again
            for _ in range(60):
                s, h, data = a.raw("POST", "/keys/%s/revoke" % MISSING)
                if s == 429:
                    break
        assert s == 429 and h["retry-after"] == "60"
        assert json.loads(data)["error"]["code"] == "rate_limited"
        assert a.call("GET", "/keys")[0] == 200       # reads are unmetered
        s, _, d = a.call("GET", "/audit?action=admin.rate_limited")
        assert len(d["items"]) == 1 and d["items"][0]["resource"].startswith("crud:")
    finally:
        stop(g.proc)


def test_key_lifecycle_etags_pagination_and_idempotency(fresh):
    a = fresh.admin
    s, _, k = a.call("POST", "/keys", {"name": "etag", "group": "team", "labels": {"team": "x"},
                                       "expires_in": "7d"})
    assert s == 201 and k["state"] == "active" and k["group_provisioned"] is False
    assert isinstance(k["created_at"], int) and isinstance(k["expires_at"], int)
    assert k["token"].startswith("bbk_")
    s, h, view = a.call("GET", "/keys/" + k["id"])
    tag = h["etag"].strip('"')
    assert len(tag) == 16 and "token" not in view
    meta = {f: view[f] for f in ("id", "name", "allowed_pools", "group", "enabled", "created_at",
                                 "labels")}
    assert tag == hashlib.sha256(json.dumps(meta, sort_keys=True, separators=(",", ":"))
                                 .encode()).hexdigest()[:16]
    s, _, d = a.call("PATCH", "/keys/" + k["id"], {"enabled": False}, {"if-match": '"%s"' % tag})
    assert s == 200 and d["state"] == "disabled" and d["enabled"] is False
    s, _, d = a.call("PATCH", "/keys/" + k["id"], {"enabled": True}, {"if-match": '"%s"' % tag})
    assert s == 409 and d["error"]["code"] == "version_conflict"
    s, _, d = a.call("PATCH", "/keys/" + k["id"], {"group": None}, {"if-match": "*"})
    assert s == 200 and d["group"] is None
    # rotate: same id, a new token; revoke is permanent and idempotent
    s, _, r = a.call("POST", "/keys/%s/rotate" % k["id"])
    assert s == 200 and r["id"] == k["id"] and r["token"] != k["token"]
    assert a.call("POST", "/keys/%s/revoke" % k["id"])[2] == {"revoked": k["id"]}
    assert a.call("POST", "/keys/%s/revoke" % k["id"])[0] == 200
    assert a.call("GET", "/keys/" + k["id"])[2]["state"] == "revoked"
    # Idempotency-Key: the retry gets the first answer, token included; no second key
    hdr = {"idempotency-key": "mint-1"}
    s1, _, m1 = a.call("POST", "/keys", {"name": "idem"}, hdr)
    s2, _, m2 = a.call("POST", "/keys", {"name": "idem"}, hdr)
    assert s1 == s2 == 201 and m1 == m2
    # cursor pages, id-sorted
    for i in range(3):
        a.call("POST", "/keys", {"name": "page%d" % i})
    s, _, all_ = a.call("GET", "/keys?limit=1000")
    ids = [x["id"] for x in all_["items"]]
    assert ids == sorted(ids) and all_["next_cursor"] is None
    got, cursor = [], None
    while True:
        s, _, p = a.call("GET", "/keys?limit=2" + ("&cursor=" + cursor if cursor else ""))
        assert s == 200 and len(p["items"]) <= 2
        got += [x["id"] for x in p["items"]]
        cursor = p["next_cursor"]
        if cursor is None:
            break
    assert got == ids
    # delete: 204, the row stays for GET, the list omits it unless include=tombstoned
    s, h, tagged = a.call("GET", "/keys/" + m1["id"])
    s, _, _ = a.call("DELETE", "/keys/" + m1["id"], headers={"if-match": h["etag"]})
    assert s == 204
    assert a.call("GET", "/keys/" + m1["id"])[2]["state"] == "tombstoned"
    assert m1["id"] not in [x["id"] for x in a.call("GET", "/keys?limit=1000")[2]["items"]]
    assert m1["id"] in [x["id"] for x in
                        a.call("GET", "/keys?limit=1000&include=tombstoned")[2]["items"]]
    assert a.call("DELETE", "/keys/" + m1["id"])[0] == 404
    s, _, u = a.call("GET", "/keys/%s/usage" % k["id"])      # revoked: its usage stays readable
    assert s == 200 and set(u) == {"id", "budget_period", "window_start", "as_of", "group",
                                   "spend_cents", "tokens", "requests", "rate_headroom"}


def test_groups_config_plane_etag_and_conflicts(fresh):
    a = fresh.admin
    s, h, lst = a.call("GET", "/groups")
    v0 = int(h["etag"].strip('"'))
    assert s == 200 and [g["name"] for g in lst["items"]][:1] and lst["next_cursor"] is None
    assert {"name": "team", "enabled": True,
            "limits": [{"metric": "requests", "amount": 1000, "per": "minute"}]} in lst["items"]
    s, h, g = a.call("POST", "/groups", {"name": "growth", "config": {
        "parent": "team", "limits": [{"budget": 500, "per": "month"}]}},
        {"if-match": '"%d"' % v0})
    assert s == 201 and g["limits"] == [{"metric": "budget", "amount": 500, "per": "month"}]
    v1 = int(h["etag"].strip('"'))
    assert v1 == v0 + 1
    # a group write is a config version: in the history, and GET config's ETag is the same one
    s, _, hist = a.call("GET", "/config/versions")
    assert hist["items"][0]["version"] == v1 and hist["items"][0]["principal"] == "admin"
    assert hist["items"][0]["summary"] == "group.create group:growth"
    assert a.call("GET", "/config")[1]["etag"] == '"%d"' % v1
    # a stale guard changes nothing
    s, _, d = a.call("PATCH", "/groups/growth", {"enabled": False}, {"if-match": '"%d"' % v0})
    assert s == 409 and d["error"]["code"] == "version_conflict"
    s, _, d = a.call("PATCH", "/groups/growth", {"enabled": False}, {"if-match": "oops"})
    assert s == 400 and d["error"]["code"] == "invalid_request"
    s, h, g = a.call("PATCH", "/groups/growth", {"enabled": False}, {"if-match": '"%d"' % v1})
    assert s == 200 and g["enabled"] is False and g["parent"] == "team"
    s, h, g = a.call("PUT", "/groups/growth", {"config": {"parent": "team"}},
                     {"if-match": h["etag"]})
    assert s == 200 and g["limits"] == [] and g["enabled"] is True
    assert a.call("POST", "/groups", {"name": "growth", "config": {}})[0] == 200   # upsert
    # base-defined groups are file-owned: a terminal conflict
    s, _, d = a.call("PATCH", "/groups/team", {"enabled": False})
    assert s == 409 and d["error"]["code"] == "conflict"
    # a group another still parents on cannot go
    a.call("POST", "/groups", {"name": "leaf", "config": {"parent": "growth"}})
    s, _, d = a.call("DELETE", "/groups/growth")
    assert s == 409 and d["error"]["code"] == "conflict" and "leaf" in d["error"]["message"]
    s, h, _ = a.call("DELETE", "/groups/leaf")
    assert s == 204 and h["etag"]
    assert "content-length" not in h and "content-type" not in h     # RFC 9110: none on a 204
    # a mint auto-provisions a leaf under an existing parent
    s, _, k = a.call("POST", "/keys", {"name": "self", "group": "user:ann", "parent": "growth"})
    assert s == 201 and k["group_provisioned"] is True
    assert a.call("GET", "/groups/user:ann")[2]["parent"] == "growth"
    assert a.call("GET", "/groups/user:ann")[2]["limits"] == []       # no template: inherit-only
    # the nearest child_default up the chain is the new leaf's limits
    s, _, g = a.call("POST", "/groups", {"name": "tmpl", "config": {
        "child_default": {"limits": [{"requests": 5, "per": "minute"}]}}})
    assert s == 201 and g["child_default"] == [{"metric": "requests", "amount": 5, "per": "minute"}]
    a.call("POST", "/groups", {"name": "sub", "config": {"parent": "tmpl"}})
    s, _, k = a.call("POST", "/keys", {"name": "bob", "group": "user:bob", "parent": "sub"})
    assert s == 201 and k["group_provisioned"] is True
    assert a.call("GET", "/groups/user:bob")[2]["limits"] == [
        {"metric": "requests", "amount": 5, "per": "minute"}]
    s, _, d = a.call("POST", "/keys", {"name": "b2", "group": "user:bob", "parent": "tmpl"})
    assert s == 409 and d["error"]["code"] == "conflict"        # a mint never re-homes a group
    s, _, u = a.call("GET", "/groups/team/usage")
    assert s == 200 and u["group"] == "team" and u["buckets"][0]["window"] == "minute"
    assert u["buckets"][0]["requests_cap"] == 1000
    s, _, u = a.call("GET", "/usage")
    assert s == 200 and u["currency"] == "USD" and u["window"]["end"] - u["window"]["start"] == 86400
    assert set(u["total"]) == {"tokens_input", "tokens_output", "tokens_cache_read",
                               "tokens_cache_creation", "requests", "spend_micros"}
    assert a.call("GET", "/usage?window=123")[0] == 400


def test_audit_log_is_hash_chained_filterable_and_paginated(signing):
    a = signing.admin
    s, _, k = a.call("POST", "/keys", {"name": "audited"})
    a.call("PATCH", "/keys/" + k["id"], {"group": "nope"})
    s, _, d = a.call("GET", "/audit?resource=key:" + k["id"])
    assert s == 200
    assert [(e["action"], e["outcome"]) for e in d["items"]] == [
        ("key.patch", "rejected"), ("key.create", "applied")]
    s, _, d = a.call("GET", "/audit?limit=1000")
    items = list(reversed(d["items"]))
    for prev, e in zip(items, items[1:]):
        assert e["prev_hash"] == prev["hash"] and e["seq"] == prev["seq"] + 1
    for e in items:
        canon = "%s|%d|%d|%s|%s|%s|%s" % (e["prev_hash"], e["seq"], e["ts"], e["action"],
                                           e["resource"], e["outcome"], e["principal"])
        assert e["hash"] == hashlib.sha256(canon.encode()).hexdigest()
        assert e["principal"] == "admin" and "bbk_" not in json.dumps(e)
    s, _, p = a.call("GET", "/audit?limit=1")
    assert len(p["items"]) == 1 and p["next_cursor"]
    assert a.call("GET", "/audit?cursor=zz")[0] == 400


def test_signing_key_report_and_cache_flush_on_every_worker(mock_port, tmp_path):
    text, admin = gov_config(mock_port, GROUPS)
    g = start_gateway(tmp_path, text, 2, gov_env())
    try:
        a = Client(admin)
        s, _, d = a.call("POST", "/signing-key/rotate")
        assert s == 200 and d["current_kid"] == "k1" and d["revoke_all"] is True
        s, _, k = a.call("POST", "/keys", {"name": "cached"})
        from tests.integration.gov_helpers import post
        body = {"model": "oai-model", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(6):      # both workers see (and cache) the token
            assert post(g, "/v1/chat/completions", body,
                        {"authorization": "Bearer " + k["token"]})[0] == 200
        s, _, d = a.call("POST", "/auth/cache/flush", {})
        assert s == 200 and d["flushed"] >= 2
        s, _, d = a.call("POST", "/auth/cache/flush")
        assert s == 200 and d["flushed"] == 0
        assert a.call("POST", "/auth/cache/flush", "{")[0] == 400
    finally:
        stop(g.proc)


def test_terraform_style_crud_of_a_key_and_a_group(fresh):
    """terraform-provider-busbar's virtual_key resource, request for request: Go's net/http with
    `x-admin-token`, `Content-Type: application/json` only with a body, bodies as encoding/json
    writes them (compact; struct fields in declaration order with omitempty; maps key-sorted).
    Create = POST /keys (+ PATCH {"enabled":false} when the plan says so), Read = GET /keys/{id}
    (404 drops it from state), Update = PATCH with only what changed ("group":null unbinds) then
    GET, Delete = DELETE (204 or 404). Its ETag is read trimmed of quotes; a group cycle chains it
    back as If-Match."""
    a = fresh.admin
    go = {"user-agent": "Go-http-client/1.1", "accept-encoding": "gzip"}

    def do(method, path, raw=None, extra=None):
        h = dict(go, **(extra or {}))
        if raw is not None:
            h["content-type"] = "application/json"
        s, hd, data = a.raw(method, path, raw, h)
        return s, hd.get("etag", "").strip('"'), (json.loads(data) if data else None)

    s, tag, _ = do("GET", "/groups")
    s, tag, g = do("POST", "/groups", b'{"config":{"limits":[{"per":"minute","requests":10}]},'
                   b'"name":"tf"}', {"If-Match": '"%s"' % tag})
    assert s == 201 and g["limits"] == [{"metric": "requests", "amount": 10, "per": "minute"}]
    # createKeyReq{Name, AllowedPools, Group, Parent, ExpiresIn, ExpiresAt, Labels, IssueAWS...}
    s, _, k = do("POST", "/keys", b'{"name":"tf-key","allowed_pools":["mixed"],"group":"tf",'
                 b'"expires_in":"30d","labels":{"owner":"tf"}}')
    assert s == 201 and k["token"] and k["expires_at"] > k["created_at"]
    s, _, d = do("PATCH", "/keys/" + k["id"], b'{"enabled":false}')        # enabled = false
    assert s == 200 and d["state"] == "disabled"
    s, ktag, view = do("GET", "/keys/" + k["id"])
    assert s == 200 and view["group"] == "tf" and view["enabled"] is False and len(ktag) == 16
    # update: enabled back on and the group unbound, then the re-read
    s, _, d = do("PATCH", "/keys/" + k["id"], b'{"enabled":true,"group":null}')
    assert s == 200 and d["group"] is None and d["state"] == "active"
    s, ktag2, view = do("GET", "/keys/" + k["id"])
    assert s == 200 and ktag2 != ktag and view["labels"] == {"owner": "tf"}
    # the group: PATCH guarded by the ETag just read, a stale one refused
    s, gtag, _ = do("GET", "/groups/tf")
    s, gtag2, g = do("PATCH", "/groups/tf", b'{"limits":[{"per":"minute","requests":20}]}',
                     {"If-Match": '"%s"' % gtag})
    assert s == 200 and g["limits"][0]["amount"] == 20 and gtag2 != gtag
    s, _, d = do("PATCH", "/groups/tf", b'{"enabled":false}', {"If-Match": '"%s"' % gtag})
    assert s == 409 and d["error"]["code"] == "version_conflict"
    # destroy: the key (204, then 404 is also "gone" to the provider), then the group
    assert do("DELETE", "/keys/" + k["id"], None, {"If-Match": '"%s"' % ktag2})[0] == 204
    assert do("DELETE", "/keys/" + k["id"])[0] == 404
    s, _, _ = do("DELETE", "/groups/tf", None, {"If-Match": '"%s"' % gtag2})
    assert s == 204
    assert do("GET", "/groups/tf")[0] == 404

def test_audit_chain_is_in_the_sqlite_store_and_continues_after_a_restart(mock_port, tmp_path):
    import sqlite3
    tail = GROUPS.replace("store: {module: memory}",
                          "store: {module: sqlite, settings: {db_path: \"%s\"}}" % (
                              tmp_path / "gov.db"))
    text, admin = gov_config(mock_port, tail)
    port = free_port()
    for life in (1, 2):
        g = start_gateway(tmp_path, text, 1, gov_env(), port=port)
        try:
            s, _, k = Client(admin).call("POST", "/keys", {"name": "life%d" % life})
            assert s == 201
        finally:
            stop(g.proc)
    db = sqlite3.connect(str(tmp_path / "gov.db"))
    rows = db.execute("SELECT seq, action, prev_hash, hash FROM audit_log ORDER BY seq").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(1, "key.create"), (2, "key.create")]
    assert rows[1][2] == rows[0][3]         # the second life chained after the first
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        db.execute("UPDATE audit_log SET principal = 'someone-else'")
    db.close()


def test_self_service_caps_keys_per_group_and_auto_provisioned_groups(mock_port, tmp_path):
    """limits.max_keys_per_principal (live keys per group, on a mint and on a rebind or
    re-enable) and limits.max_auto_provisioned_groups (the group count a mint may grow to)."""
    tail = GROUPS.replace("  team: {limits: [{requests: 1000, per: minute}]}\n",
                          "  team: {limits: [{requests: 1000, per: minute}]}\n  other: {}\n")
    text, admin = gov_config(mock_port, tail)
    text = text.replace("limits:\n", "limits:\n  max_keys_per_principal: 2\n"
                        "  max_auto_provisioned_groups: 3\n", 1)
    g = start_gateway(tmp_path, text, 1, gov_env())
    try:
        a = Client(admin)
        k1 = a.call("POST", "/keys", {"name": "a", "group": "team"})[2]
        assert a.call("POST", "/keys", {"name": "b", "group": "team"})[0] == 201
        s, _, d = a.call("POST", "/keys", {"name": "c", "group": "team"})
        assert s == 409 and "max_keys_per_principal" in d["error"]["message"]
        # a disabled key frees its slot; re-enabling it into a full group is refused
        assert a.call("PATCH", "/keys/" + k1["id"], {"enabled": False})[0] == 200
        assert a.call("POST", "/keys", {"name": "c", "group": "team"})[0] == 201
        s, _, d = a.call("PATCH", "/keys/" + k1["id"], {"enabled": True})
        assert s == 409 and d["error"]["code"] == "conflict"
        # a rebind into a full group is refused too
        k4 = a.call("POST", "/keys", {"name": "d", "group": "other"})[2]
        assert a.call("PATCH", "/keys/" + k4["id"], {"group": "team"})[0] == 409
        # two config groups; one leaf makes three, the ceiling
        assert a.call("POST", "/keys", {"name": "u1", "group": "user:1", "parent": "team"})[0] == 201
        s, _, d = a.call("POST", "/keys", {"name": "u2", "group": "user:2", "parent": "team"})
        assert s == 409 and "max_auto_provisioned_groups" in d["error"]["message"]
    finally:
        stop(g.proc)


def test_spend_figures_count_the_per_request_fee(mock_port, tmp_path):
    """per_request_fee (cents per 2xx request) is in every spend the admin API shows, as in the
    budget it is charged to: no rate card, so the fee is the whole spend."""
    from tests.integration.gov_helpers import post, wait_usage
    text, admin = gov_config(mock_port, "per_request_fee: 3\ngroups:\n"
                             "  team: {limits: [{budget: 100, per: month}]}\n"
                             "store: {module: memory}\n")
    g = start_gateway(tmp_path, text, 1, gov_env())
    try:
        a = Client(admin)
        k = a.call("POST", "/keys", {"name": "fee", "group": "team"})[2]
        body = {"model": "oai-model", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
        for text_ in ("a", "b", "c #mock:status=400"):
            body["messages"][0]["content"] = text_
            post(g, "/v1/chat/completions", body, {"authorization": "Bearer " + k["token"]})

        class A:        # wait_usage's client shape
            def call(self, method, path):
                s, _, d = a.call(method, path)
                return s, d
        day = wait_usage(A(), "/usage", lambda d: d["total"]["requests"] >= 3)
        assert day["total"]["requests"] == 3 and day["total"]["spend_micros"] == 60000   # 2 x 3c
        assert a.call("GET", "/keys/%s/usage" % k["id"])[2]["spend_cents"] == 6
        bucket = a.call("GET", "/groups/team/usage")[2]["buckets"][0]
        assert (bucket["spend_cents"], bucket["budget_cap"], bucket["budget_remaining_cents"]) == (
            6, 100, 94)
    finally:
        stop(g.proc)
