"""With keys on, through the real server (two workers): /metrics and /stats on the data listener
need a virtual key, as any call does (the Rust gateway's auth check, THREAT_MODEL T2); a key with
allowed_pools sees only those pools in /stats. After real calls under group budgets, the
governance gauges carry the Rust gateway's names, labels and units: busbar_key_spend_cents and
busbar_key_tokens_total per key with its mint labels (the key_gauge_limit keys with the most
spend, a WARNING for the rest), busbar_bucket_tokens per (bucket, model, tier), and per (group,
window) bucket busbar_bucket_spend_cents and busbar_bucket_budget_remaining_cents; whichever
worker answers the scrape shows the same figures (the parent writes them to shared memory), and a
valkey store's ledger gives the same ones as the memory store's."""
from __future__ import annotations

import http.client
import json
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import CONFIG, free_port, start_gateway, stop, wait_http

MODELS = ["oai-model", "resp-model", "ant-model", "gem-model", "coh-model", "bed-model",
          "dead-model", "one-slot"]
SIGNING = "ab" * 32
ADMIN = "adm-" + "t" * 32
# Output at 1000 units per million tokens is 1e6 nano-units a token: a 10-token answer is one cent.
TAIL = """
admin_listen: "127.0.0.1:{admin}"
identity-providers:
  admin-tokens: {{module: admin-tokens, token: {{env: BB_ADMIN}}}}
auth:
  chain: [keys]
  admin_auth: [admin-tokens]
  signing_key: {{env: BB_SIGNING}}
groups:
  org:    {{limits: [{{budget: 100000, per: month}}]}}
  team:   {{parent: org, limits: [{{budget: 50, per: day}}, {{requests: 1000, per: minute}}]}}
  scoped: {{limits: [{{budget: 1000, per: total, pool: mixed}}]}}
store: {{module: memory}}
export:
  access: {{module: access-log, settings: {{path: "off"}}}}
  prom: {{module: prometheus, settings: {{buffer_seconds: 10, key_gauge_limit: 2}}}}
rate_card:
""" + "".join("  %s: {{input_utok: 0.0, output_utok: 1000.0}}\n" % m for m in MODELS)


class Gw:
    pass


@pytest.fixture(scope="module")
def gw(mock_port, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("govseries")
    admin = free_port()
    text = CONFIG.format(port="{port}", mock=mock_port, dead=free_port()) + TAIL.format(admin=admin)
    err = tmp / "stderr.log"
    with open(err, "wb") as f:
        g = start_gateway(tmp, text, 2, {"BB_SIGNING": SIGNING, "BB_ADMIN": ADMIN}, stderr=f,
                          ready=lambda port, proc: (wait_http(port, proc), wait_http(admin, proc)))
    out = Gw()
    out.proc, out.port, out.admin, out.err = g.proc, g.port, admin, err
    yield out
    stop(g.proc)


def call(port, method, path, body=None, token=None, prefix=""):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    h = {"content-type": "application/json"}
    if token is not None:
        h["authorization"] = "Bearer " + token
    try:
        c.request(method, prefix + path, None if body is None else json.dumps(body), h)
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def mint(gw, **body):
    s, d = call(gw.admin, "POST", "/keys", body, ADMIN, "/api/v1/admin")
    assert s == 201, d
    return json.loads(d)


def chat(gw, token, model, n=1):
    for i in range(n):
        s, _ = call(gw.port, "POST", "/v1/chat/completions", {
            "model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "c%d" % i}]},
            token)
        assert s == 200


def scrape(gw, token):
    s, body = call(gw.port, "GET", "/metrics", token=token)
    assert s == 200, body
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    return fams, [(x.name, x.labels, x.value) for f in fams.values() for x in f.samples]


def value(samples, name, **labels):
    got = [v for n, ls, v in samples if n == name and all(ls.get(k) == x for k, x in labels.items())]
    return sum(got) if got else None


def test_metrics_and_stats_need_a_key_and_stats_shows_its_pools(gw):
    k = mint(gw, name="all")
    narrow = mint(gw, name="narrow", allowed_pools=["mixed"])
    for path in ("/metrics", "/stats"):
        s, body = call(gw.port, "GET", path)
        assert s == 401 and b"invalid_api_key" in body, body
        assert call(gw.port, "GET", path, token="bbk_not.a.key")[0] == 401
    assert call(gw.port, "GET", "/metrics", token=k["token"])[0] == 200
    s, body = call(gw.port, "GET", "/stats", token=k["token"])
    full = json.loads(body)
    assert s == 200 and set(full["pools"]) == {"mixed", "failover"}
    assert {x["pool"] for x in full["lanes"]} == {"mixed", "failover", ""}
    s, body = call(gw.port, "GET", "/stats", token=narrow["token"])
    mine = json.loads(body)
    assert s == 200 and mine["pools"] == {"mixed": ["oai-model", "ant-model"]}
    assert {(x["pool"], x["model"]) for x in mine["lanes"]} == {("mixed", "oai-model"),
                                                                ("mixed", "ant-model")}
    # advanced.response_headers.server_timing (on in this config) reaches every answer, the
    # data listener's own and the admin listener's.
    for port, token in ((gw.port, k["token"]), (gw.admin, ADMIN)):
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/stats", headers={"authorization": "Bearer " + token})
        r = c.getresponse()
        r.read()
        c.close()
        timing = r.getheader("server-timing") or ""
        assert r.status == 200 and timing.startswith("busbar;dur="), (port, timing)
        assert 0 < float(timing.split("=")[1]) < 5000
    # The operator's view on the admin listener is whole.
    s, body = call(gw.admin, "GET", "/stats", token=ADMIN)
    ops = json.loads(body)
    assert s == 200 and ops["pools"] == full["pools"]
    assert {(x["pool"], x["model"]) for x in ops["lanes"]} == \
        {(x["pool"], x["model"]) for x in full["lanes"]}


def test_spend_tokens_and_buckets_per_key_and_group(gw):
    k1 = mint(gw, name="one", group="team", labels={"team": "growth"})
    # a label that is no Prometheus name is refused at the mint, as the Rust gateway refuses it
    s, d = call(gw.admin, "POST", "/keys", {"name": "two", "labels": {"bad-label": "x"}}, ADMIN,
                "/api/v1/admin")
    assert s == 400 and json.loads(d)["error"]["code"] == "invalid_request"
    k2 = mint(gw, name="two", group="scoped", labels={"team": "ops"})
    k3 = mint(gw, name="three")
    mint(gw, name="idle")
    chat(gw, k1["token"], "oai-model", 3)
    chat(gw, k2["token"], "mixed", 2)
    chat(gw, k3["token"], "oai-model", 1)
    # The parent recomputes the figures every few seconds; every worker's scrape shows them.
    deadline = time.monotonic() + 15
    while True:
        fams, s = scrape(gw, k3["token"])
        if value(s, "busbar_key_spend_cents", key=k1["id"]) == 3 and \
                value(s, "busbar_key_spend_cents", key=k2["id"]) == 2:
            break
        assert time.monotonic() < deadline, [x for x in s if x[0].startswith("busbar_key")]
        time.sleep(0.3)
    for _ in range(4):      # fresh connections: both workers
        fams, s = scrape(gw, k3["token"])
        for name in ("busbar_key_spend_cents", "busbar_key_tokens_total", "busbar_bucket_tokens",
                     "busbar_bucket_spend_cents", "busbar_bucket_budget_remaining_cents"):
            assert fams[name].type == "gauge", name
        # key_gauge_limit 2: the two keys with the most spend, each with its mint labels.
        keyed = {ls["key"]: ls for n, ls, _ in s if n == "busbar_key_spend_cents"}
        assert set(keyed) == {k1["id"], k2["id"]}
        assert keyed[k1["id"]] == {"key": k1["id"], "team": "growth"}
        assert keyed[k2["id"]] == {"key": k2["id"], "team": "ops"}
        # Tokens: all of the key's, every tier; per (model, tier) in its bucket.
        out1 = value(s, "busbar_bucket_tokens", bucket=k1["id"], model="oai-model", tier="output")
        assert out1 == 30
        assert value(s, "busbar_key_tokens_total", key=k1["id"]) == \
            value(s, "busbar_bucket_tokens", bucket=k1["id"]) > out1
        # Group buckets in the current window: team's day budget (50 cents), org's month (k1 is
        # under team, under org), scoped's pool-scoped total; team's requests-only minute window
        # has its spend (what of it is still in this minute) and no budget left to show.
        day = dict(bucket="group:team@day", group="team", window="day")
        assert value(s, "busbar_bucket_spend_cents", **day) == 3
        assert value(s, "busbar_bucket_budget_remaining_cents", **day) == 47
        assert value(s, "busbar_bucket_tokens", tier="output", **day) == 30
        month = dict(bucket="group:org@month", group="org", window="month")
        assert value(s, "busbar_bucket_spend_cents", **month) == 3
        assert value(s, "busbar_bucket_budget_remaining_cents", **month) == 100000 - 3
        scoped = dict(bucket="group:scoped@total#pool:mixed", group="scoped", window="total")
        assert value(s, "busbar_bucket_spend_cents", **scoped) == 2
        assert value(s, "busbar_bucket_budget_remaining_cents", **scoped) == 998
        minute = dict(bucket="group:team@minute", group="team", window="minute")
        assert 0 <= value(s, "busbar_bucket_spend_cents", **minute) <= 3
        assert value(s, "busbar_bucket_budget_remaining_cents", **minute) is None
    time.sleep(0.5)
    warned = [x for x in gw.err.read_text().splitlines() if "key_gauge_limit" in x]
    assert warned and "virtual keys, per-key series for the 2 " in warned[0], warned
    assert " WARNING " in warned[0]
    assert ADMIN not in gw.err.read_text() and k1["token"] not in gw.err.read_text()


def test_the_same_figures_from_a_valkey_store(mock_port, tmp_path):
    """The ledger in Redis (the Rust valkey store's layout) gives the same series."""
    from tests.busbar.governance.conftest import _need_redis
    from tests.redis_server import RedisServer
    _need_redis()
    redis = RedisServer().start()
    admin = free_port()
    text = CONFIG.format(port="{port}", mock=mock_port, dead=free_port()) + TAIL.format(
        admin=admin).replace("store: {module: memory}",
                             "store: {module: valkey, settings: {url: {env: BB_REDIS}}}")
    g = start_gateway(tmp_path, text, 1, {"BB_SIGNING": SIGNING, "BB_ADMIN": ADMIN,
                                          "BB_REDIS": redis.url},
                      ready=lambda port, proc: (wait_http(port, proc), wait_http(admin, proc)))
    try:
        gw = Gw()
        gw.port, gw.admin = g.port, admin
        k = mint(gw, name="v", group="team", labels={"team": "blue"})
        chat(gw, k["token"], "oai-model", 2)
        deadline = time.monotonic() + 15
        while True:
            _, s = scrape(gw, k["token"])
            if value(s, "busbar_key_spend_cents", key=k["id"]) == 2:
                break
            assert time.monotonic() < deadline, [x for x in s if x[0].startswith("busbar_key")]
            time.sleep(0.3)
        assert value(s, "busbar_key_spend_cents", key=k["id"], team="blue") == 2
        day = dict(bucket="group:team@day", group="team", window="day")
        assert value(s, "busbar_bucket_spend_cents", **day) == 2
        assert value(s, "busbar_bucket_budget_remaining_cents", **day) == 48
        assert value(s, "busbar_bucket_tokens", bucket=k["id"], model="oai-model",
                     tier="output") == 20
    finally:
        stop(g.proc)
        redis.close()
