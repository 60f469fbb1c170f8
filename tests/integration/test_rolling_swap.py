"""A rolling swap from the Rust gateway to busbar, through real gateway processes over real HTTP,
on the stores both read (issue #37):

- SQLite, one node: a file as the Rust gateway leaves it (written here with plain sqlite3, as its
  store writes it: a key, the ledger of its group's requests and budget) is served by busbar as
  is: the Rust-minted token works and the limits go on from the Rust counts, exactly. A key minted
  by busbar works across a restart, a revoked one stays revoked, the budget stays exact; the file
  is left as the Rust store reads it.
- Valkey: two busbar instances on one redis-server, beside a key and ledger written as the Rust
  valkey store writes them: a key minted on one works on the other, the Rust key works on both,
  revoked on one it fails on both, and the budget is exact across both and the Rust ledger.

Config text is in the Rust gateway's grammar (identity-providers + auth.admin_auth, `store:
{module, settings}`, budgets in integer cents, `*_utok` rates).
"""
from __future__ import annotations

import http.client
import json
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor

import orjson

from busbar.governance.model import day_epoch, day_of, new_generation, new_key_id, window_start
from tests.busbar.governance.test_sqlite_store import RUST_V6
from tests.busbar.governance.test_tokens import independent_mint
from tests.conftest import free_port, start_gateway, stop, wait_http
from tests.integration.gov_helpers import Admin

SEED = bytes(range(100, 132))           # the fleet's ed25519 signing key
ADMIN = "swap-admin-" + "t" * 24

CONFIG = """\
listen: "127.0.0.1:{{port}}"
admin_listen: "127.0.0.1:{admin}"
identity-providers:
  admin-tokens: {{module: admin-tokens, token: {{env: BB_ADMIN}}}}
auth:
  chain: [keys]
  admin_auth: [admin-tokens]
  signing_key: {{env: BB_SIGNING}}
providers:
  m: {{protocol: openai, base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
models:
  oai-model: {{provider: m, upstream_model: gpt-4o-mini}}
groups:
  swap:  {{limits: [{{requests: 6, per: day}}]}}
  money: {{limits: [{{budget: 10, per: month}}]}}
# 1000 units per million output tokens: the mock's 10-token answer costs one cent
rate_card:
  oai-model: {{input_utok: 0.0, output_utok: 1000.0}}
{store}
"""


def _gateway(tmp_path, mock_port, store, extra_env, admin=None):
    admin = admin or free_port()
    text = CONFIG.format(admin=admin, mock=mock_port, store=store)
    env = {"BB_SIGNING": SEED.hex(), "BB_ADMIN": ADMIN}
    env.update(extra_env)
    gw = start_gateway(tmp_path, text, 2, env,
                       ready=lambda p, pr: (wait_http(p, pr), wait_http(admin, pr)))
    gw.admin = Admin(admin, ADMIN)
    return gw


def chat(gw, token):
    c = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=15)
    c.request("POST", "/v1/chat/completions", json.dumps({
        "model": "oai-model", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
        {"content-type": "application/json", "authorization": "Bearer " + token})
    r = c.getresponse()
    r.read()
    c.close()
    return r.status


def _until_refused(gws, token, most):
    """How many calls pass before the first 429, alternating the gateways (at most `most`)."""
    n = 0
    while True:
        s = chat(gws[n % len(gws)], token)
        if s == 429:
            return n
        assert s == 200, s
        n += 1
        assert n <= most, "no 429 after %d calls" % most


def _safe_day():
    """The day and month windows must not roll during a test: wait out the last 20 s of a UTC day."""
    left = 86400 - time.time() % 86400
    if left < 20:
        time.sleep(left + 0.1)


# ------------------------------------------------------------------ SQLite, one node
def test_sqlite_rust_file_then_busbar_restarts(mock_port, tmp_path):
    _safe_day()
    now = int(time.time())
    db_path = tmp_path / "gov.db"
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(RUST_V6)
    rust_id, rust_gen = new_key_id(), new_generation()
    spender_id, spender_gen = new_key_id(), new_generation()
    for kid, gen, group in ((rust_id, rust_gen, "swap"), (spender_id, spender_gen, "money")):
        db.execute("INSERT INTO keys (id, name, key_group, labels, enabled, generation_hash, "
                   "created_at, updated_at, revision) VALUES (?, 'from-rust', ?, '{}', 1, ?, ?, ?, 1)",
                   (kid, group, "binding:%s:%s" % (kid, gen), now - 60, now - 60))
    day, month = window_start("day", now), window_start("month", now)
    # The Rust gateway admitted 2 requests of `swap` today and spent 4 cents of `money` this month.
    db.executemany("INSERT INTO usage_windows (window_start, bucket_id, model, requests, "
                   "billable_requests, tokens_input, tokens_output) VALUES (?, ?, ?, ?, ?, ?, ?)", [
                       (day, "group:swap@day", "", 2, 2, 0, 0),
                       (day, "group:swap@day", "oai-model", 0, 0, 40, 20),
                       (month, "group:money@month", "", 4, 4, 0, 0),
                       (month, "group:money@month", "oai-model", 0, 0, 80, 40)])
    db.execute("INSERT INTO usage_metering (bucket, key_id, provider, model, key_group_at_use, "
               "requests, billable_requests, tokens_input, tokens_output) VALUES (?, ?, 'm', "
               "'oai-model', 'swap', 2, 2, 40, 20)", (str(day_epoch(day_of(now))), rust_id))
    db.close()
    rust_token = independent_mint(SEED, rust_id, now + 3600, rust_gen)
    spender = independent_mint(SEED, spender_id, now + 3600, spender_gen)
    store = "store: {module: sqlite, settings: {db_path: %s}}" % db_path    # cwd-relative else
    env = {}

    gw = _gateway(tmp_path, mock_port, store, env)
    try:
        # the Rust key works; its group's requests limit goes on from the Rust count: 6 - 2
        assert _until_refused([gw], rust_token, 10) == 4
        mine = gw.admin.mint(name="busbar-minted", group="money")
        keep = gw.admin.mint(name="kept", group="swap")
        gone = gw.admin.mint(name="revoked")
        assert chat(gw, gone["token"]) == 200
        s, _ = gw.admin.call("POST", "/keys/%s/revoke" % gone["id"])
        assert s == 200 and chat(gw, gone["token"]) == 401
        # the budget: 10 cents, 4 spent by the Rust node, each call costs 1: two here...
        assert [chat(gw, mine["token"]) for _ in range(2)] == [200, 200]
        time.sleep(0.5)             # the parent's batch in the file (2 x flush interval)
    finally:
        stop(gw.proc)

    gw = _gateway(tmp_path, mock_port, store, env)          # the same file, restarted
    try:
        assert chat(gw, keep["token"]) == 429               # known, and `swap` spent for today
        assert chat(gw, gone["token"]) == 401               # still revoked
        # ...and exactly four more across both keys of `money` (the Rust one too)
        assert chat(gw, mine["token"]) == 200
        assert _until_refused([gw], spender, 10) == 3
        assert chat(gw, mine["token"]) == 429
        time.sleep(0.5)
    finally:
        stop(gw.proc)

    # the file as the Rust store reads it
    db = sqlite3.connect(db_path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 6
    row = db.execute("SELECT key_group, enabled, generation_hash, deleted_at FROM keys WHERE id = ?",
                     (mine["id"],)).fetchone()
    assert row[0] == "money" and row[1] == 1 and row[2].startswith("binding:%s:" % mine["id"])
    assert row[3] is None
    assert db.execute("SELECT enabled FROM keys WHERE id = ?", (gone["id"],)).fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM denylist WHERE sub = ?", (gone["id"],)).fetchone() == (1,)
    assert db.execute("SELECT requests FROM usage_windows WHERE window_start = ? AND "
                      "bucket_id = 'group:swap@day' AND model = ''", (day,)).fetchone() == (6,)
    spent = db.execute("SELECT tokens_output FROM usage_windows WHERE window_start = ? AND "
                       "bucket_id = 'group:money@month' AND model = 'oai-model'", (month,)).fetchone()
    assert spent == (100,)              # 40 from the Rust node + 6 x 10 here: the 10 cents


# ------------------------------------------------------------------ Valkey, two instances
def test_valkey_two_busbar_instances_beside_the_rust_layout(mock_port, tmp_path):
    from tests.busbar.governance.conftest import _need_redis
    from tests.redis_server import RedisServer
    _need_redis()
    import redis
    _safe_day()
    srv = RedisServer().start()
    r = redis.Redis.from_url(srv.url)
    now = int(time.time())
    rust_id, rust_gen = new_key_id(), new_generation()
    spender_id, spender_gen = new_key_id(), new_generation()
    r.set("busbar:schema", 6)
    for kid, gen, group in ((rust_id, rust_gen, "swap"), (spender_id, spender_gen, "money")):
        r.set("busbar:key:" + kid, orjson.dumps({
            "id": kid, "generation_hash": "binding:%s:%s" % (kid, gen), "name": "from-rust",
            "allowed_pools": None, "enabled": True, "created_at": now - 60, "group": group,
            "labels": {}, "expires_at": None, "deleted_at": None, "revision": 1}))
        r.sadd("busbar:keys", kid)
    day, month = window_start("day", now), window_start("month", now)
    r.hset("busbar:usage:group:swap@day:%d" % day, mapping={
        "requests": 2, "billable_requests": 2, "m:oai-model:input": 40, "m:oai-model:output": 20})
    r.hset("busbar:usage:group:money@month:%d" % month, mapping={
        "requests": 4, "billable_requests": 4, "m:oai-model:output": 40})
    rust_token = independent_mint(SEED, rust_id, now + 3600, rust_gen)
    spender = independent_mint(SEED, spender_id, now + 3600, spender_gen)
    store = "store: {module: valkey, settings: {url: {env: BB_REDIS}}}"
    env = {"BB_REDIS": srv.url}
    a = _gateway(tmp_path, mock_port, store, env)
    b = None
    try:
        b = _gateway(tmp_path, mock_port, store, env)
        assert chat(a, rust_token) == 200 and chat(b, rust_token) == 200
        assert _until_refused([a, b], rust_token, 10) == 2          # 6 - 2 (Rust) - 2 (above)
        mine = a.admin.mint(name="busbar-minted", group="money")
        gone = b.admin.mint(name="to-revoke")
        assert chat(b, mine["token"]) == 200                        # minted on a, used on b
        assert chat(a, gone["token"]) == 200
        assert a.admin.call("POST", "/keys/%s/revoke" % gone["id"])[0] == 200
        deadline = time.monotonic() + 1.0
        while chat(b, gone["token"]) != 401:
            assert time.monotonic() < deadline, "the revoke did not reach the other instance in 1 s"
            time.sleep(0.05)
        # the budget: 10 cents, 4 spent by the Rust node, 1 above; 5 left across both
        # instances and both keys, under concurrency
        with ThreadPoolExecutor(12) as pool:
            out = list(pool.map(lambda i: chat((a, b)[i % 2], (mine, {"token": spender})[i % 3 == 0]
                                               ["token"]), range(12)))
        ok = out.count(200)
        assert 1 <= ok <= 5 and out.count(429) == 12 - ok
        assert _until_refused([a, b], spender, 5) == 5 - ok
        # a rolling restart of one instance: the keys and the spent budget stay
        stop(a.proc)
        a = _gateway(tmp_path, mock_port, store, env)
        assert chat(a, mine["token"]) == 429 and chat(a, gone["token"]) == 401
        assert chat(a, rust_token) == 429
        time.sleep(0.3)
    finally:
        stop(a.proc)
        if b is not None:
            stop(b.proc)
    try:
        # the namespace as the Rust valkey store reads it
        vk = orjson.loads(r.get("busbar:key:" + mine["id"]))
        assert vk["group"] == "money" and vk["enabled"] is True and vk["deleted_at"] is None
        assert vk["generation_hash"].startswith("binding:%s:" % mine["id"])
        assert r.sismember("busbar:denylist", gone["id"])
        assert orjson.loads(r.get("busbar:key:" + gone["id"]))["enabled"] is False
        assert int(r.hget("busbar:usage:group:swap@day:%d" % day, "requests")) == 6
        assert int(r.hget("busbar:usage:group:money@month:%d" % month, "m:oai-model:output")) == 100
        assert int(r.hget("busbar:usage:group:money@month:%d" % month, "bb:reserved")) == 0
        rows = r.smembers("busbar:metering:%d" % day_epoch(day_of(now)))
        assert any(row.decode().endswith("%s|oai-model|m" % mine["id"]) for row in rows)
    finally:
        r.close()
        srv.close()
