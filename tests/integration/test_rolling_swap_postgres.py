"""A rolling swap from the Rust gateway to busbar on a shared PostgreSQL (issue #37), through real
gateway processes over real HTTP: a database as the Rust gateway's postgres store leaves it
(its v6 schema and rows written here with plain SQL: keys bound to the config's groups, a revoked
key, the ledger of the groups' requests and budget, a metering row) is served by two busbar
instances as it is: the Rust-minted token works on both, the revoked one on neither, and the limits
go on from the Rust counts, exactly, across both instances; a key minted on one works on the
other, a revoke holds on both, and the database is left as the Rust store reads it.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from busbar.governance.model import day_epoch, day_of, new_generation, new_key_id, window_start
from tests.busbar.governance.test_tokens import independent_mint
from tests.conftest import stop
from tests.integration.test_rolling_swap import SEED, _gateway, _safe_day, _until_refused, chat

# The Rust postgres store's schema v6 (GetBusbar/store-postgres), as it creates it.
RUST_PG_V6 = """
CREATE TABLE busbar_schema (version BIGINT PRIMARY KEY);
INSERT INTO busbar_schema (version) VALUES (6);
CREATE TABLE store_revision (only_row BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (only_row),
  revision BIGINT NOT NULL DEFAULT 0 CHECK (revision >= 0));
INSERT INTO store_revision (only_row, revision) VALUES (TRUE, 7);
CREATE TABLE keys (id TEXT PRIMARY KEY, generation_hash TEXT NOT NULL, name TEXT NOT NULL,
  allowed_pools TEXT, enabled BOOLEAN NOT NULL DEFAULT TRUE, created_at BIGINT NOT NULL,
  key_group TEXT, labels TEXT NOT NULL DEFAULT '{}', expires_at BIGINT, deleted_at BIGINT,
  revision BIGINT NOT NULL DEFAULT 0,
  CONSTRAINT keys_tombstone_disabled CHECK (deleted_at IS NULL OR enabled = FALSE));
CREATE INDEX idx_keys_revision ON keys (revision);
CREATE TABLE credentials (id TEXT PRIMARY KEY,
  key_id TEXT NOT NULL REFERENCES keys(id) ON DELETE CASCADE,
  kind TEXT NOT NULL CHECK (kind IN ('sigv4')), slot SMALLINT NOT NULL CHECK (slot IN (0, 1)),
  public_id TEXT NOT NULL, secret TEXT,
  secret_form TEXT NOT NULL CHECK (secret_form IN ('none', 'recoverable', 'digest')),
  created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, expires_at BIGINT, revoked_at BIGINT,
  revoke_reason TEXT, revision BIGINT NOT NULL DEFAULT 0,
  CONSTRAINT credentials_public_id_uniq UNIQUE (kind, public_id),
  CONSTRAINT credentials_slot_uniq UNIQUE (key_id, kind, slot),
  CONSTRAINT credentials_secret_form_matches CHECK ((secret_form = 'none') = (secret IS NULL)));
CREATE TABLE usage_windows (bucket_id TEXT NOT NULL, window_start BIGINT NOT NULL,
  requests BIGINT NOT NULL DEFAULT 0, billable_requests BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (bucket_id, window_start));
CREATE TABLE usage_ledger (bucket_id TEXT NOT NULL, window_start BIGINT NOT NULL,
  model TEXT NOT NULL, tokens_input BIGINT NOT NULL DEFAULT 0,
  tokens_output BIGINT NOT NULL DEFAULT 0, tokens_cache_read BIGINT NOT NULL DEFAULT 0,
  tokens_cache_write BIGINT NOT NULL DEFAULT 0, PRIMARY KEY (bucket_id, window_start, model));
CREATE TABLE usage_metering (key_id TEXT NOT NULL, bucket BIGINT NOT NULL, model TEXT NOT NULL,
  provider TEXT NOT NULL, tokens_input BIGINT NOT NULL DEFAULT 0,
  tokens_output BIGINT NOT NULL DEFAULT 0, tokens_cache_read BIGINT NOT NULL DEFAULT 0,
  tokens_cache_write BIGINT NOT NULL DEFAULT 0, requests BIGINT NOT NULL DEFAULT 0,
  billable_requests BIGINT NOT NULL DEFAULT 0, key_group_at_use TEXT NOT NULL DEFAULT '',
  pricing_version TEXT NOT NULL DEFAULT '', PRIMARY KEY (key_id, bucket, model, provider));
CREATE TABLE audit_log (seq BIGINT PRIMARY KEY, ts BIGINT NOT NULL, action TEXT NOT NULL,
  resource TEXT NOT NULL, outcome TEXT NOT NULL, principal TEXT NOT NULL, prev_hash TEXT NOT NULL,
  hash TEXT NOT NULL);
CREATE TABLE denylist (sub TEXT PRIMARY KEY, reason TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL DEFAULT 0);
"""


def _db(url, fn):
    import asyncpg

    async def go():
        conn = await asyncpg.connect(url)
        try:
            return await fn(conn)
        finally:
            await conn.close()
    return asyncio.run(go())


@pytest.fixture(scope="module")
def pg():
    from tests.busbar.governance.conftest import _need_postgres
    from tests.postgres_server import PostgresServer
    _need_postgres()
    srv = PostgresServer().start()
    yield srv
    srv.close()


def test_postgres_two_busbar_instances_on_the_rust_schema(mock_port, tmp_path, pg):
    _safe_day()
    url = pg.create_database("swap_" + uuid.uuid4().hex[:8])
    now = int(time.time())
    rust_id, rust_gen = new_key_id(), new_generation()
    spender_id, spender_gen = new_key_id(), new_generation()
    banned_id, banned_gen = new_key_id(), new_generation()
    day, month = window_start("day", now), window_start("month", now)
    meter_day = day_epoch(day_of(now))

    async def rust_writes(conn):
        await conn.execute(RUST_PG_V6)
        for kid, gen, group, rev in ((rust_id, rust_gen, "swap", 1), (spender_id, spender_gen,
                                                                      "money", 2),
                                     (banned_id, banned_gen, None, 3)):
            await conn.execute(
                "INSERT INTO keys (id, generation_hash, name, allowed_pools, enabled, created_at, "
                "key_group, labels, revision) VALUES ($1, $2, 'from-rust', NULL, TRUE, $3, $4, "
                "'{\"team\":\"x\"}', $5)", kid, "binding:%s:%s" % (kid, gen), now - 60, group, rev)
        await conn.execute("INSERT INTO denylist (sub, reason, created_at) VALUES ($1, 'leaked', "
                           "$2)", banned_id, now - 30)
        # The Rust gateway admitted 2 requests of `swap` today and spent 4 cents of `money` this
        # month (40 output tokens at 1000 units per million).
        await conn.executemany(
            "INSERT INTO usage_windows (bucket_id, window_start, requests, billable_requests) "
            "VALUES ($1, $2, $3, $3)", [("group:swap@day", day, 2), ("group:money@month", month, 4),
                                        (rust_id, 0, 2)])
        await conn.executemany(
            "INSERT INTO usage_ledger (bucket_id, window_start, model, tokens_input, tokens_output) "
            "VALUES ($1, $2, 'oai-model', $3, $4)", [("group:swap@day", day, 40, 20),
                                                     ("group:money@month", month, 0, 40),
                                                     (rust_id, 0, 40, 20)])
        await conn.execute(
            "INSERT INTO usage_metering (key_id, bucket, model, provider, tokens_input, "
            "tokens_output, requests, billable_requests, key_group_at_use) VALUES ($1, $2, "
            "'oai-model', 'm', 40, 20, 2, 2, 'swap')", rust_id, meter_day)
    _db(url, rust_writes)
    rust_token = independent_mint(SEED, rust_id, now + 3600, rust_gen)
    spender = independent_mint(SEED, spender_id, now + 3600, spender_gen)
    banned = independent_mint(SEED, banned_id, now + 3600, banned_gen)
    store = "store: {module: postgres, settings: {url: {env: BB_POSTGRES}}}"
    env = {"BB_POSTGRES": url}
    a = _gateway(tmp_path, mock_port, store, env)
    b = None
    try:
        b = _gateway(tmp_path, mock_port, store, env)
        assert chat(a, rust_token) == 200 and chat(b, rust_token) == 200
        assert chat(a, banned) == 401 and chat(b, banned) == 401     # revoked by the Rust node
        assert _until_refused([a, b], rust_token, 10) == 2           # 6 - 2 (Rust) - 2 (above)
        # the Rust key as busbar's admin API shows it, and its usage, Rust rows included
        status, key = a.admin.call("GET", "/keys/" + rust_id)
        assert status == 200 and (key["group"], key["labels"]) == ("swap", {"team": "x"})
        mine = a.admin.mint(name="busbar-minted", group="money")
        gone = b.admin.mint(name="to-revoke")
        assert chat(b, mine["token"]) == 200                         # minted on a, used on b
        assert chat(a, gone["token"]) == 200
        assert a.admin.call("POST", "/keys/%s/revoke" % gone["id"])[0] == 200
        deadline = time.monotonic() + 1.0
        while chat(b, gone["token"]) != 401:
            assert time.monotonic() < deadline, "the revoke did not reach the other instance in 1 s"
            time.sleep(0.05)
        # the budget: 10 cents, 4 spent by the Rust node, 1 above; 5 left across both
        # instances and both keys, under concurrency
        with ThreadPoolExecutor(12) as pool:
            out = list(pool.map(lambda i: chat((a, b)[i % 2], (mine["token"], spender)[i % 3 == 0]),
                                range(12)))
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

    async def rust_reads(conn):
        got = {}
        got["mine"] = await conn.fetchrow("SELECT key_group, enabled, generation_hash, deleted_at "
                                          "FROM keys WHERE id = $1", mine["id"])
        got["gone"] = await conn.fetchrow("SELECT enabled FROM keys WHERE id = $1", gone["id"])
        got["deny"] = await conn.fetch("SELECT sub, reason FROM denylist ORDER BY sub")
        got["swap"] = await conn.fetchval("SELECT requests FROM usage_windows WHERE "
                                          "bucket_id = 'group:swap@day' AND window_start = $1", day)
        got["money"] = await conn.fetchval("SELECT tokens_output FROM usage_ledger WHERE bucket_id "
                                           "= 'group:money@month' AND window_start = $1 AND "
                                           "model = 'oai-model'", month)
        got["meter"] = await conn.fetchrow("SELECT requests, key_group_at_use FROM usage_metering "
                                           "WHERE key_id = $1 AND bucket = $2 AND model = "
                                           "'oai-model' AND provider = 'm'", rust_id, meter_day)
        got["own"] = await conn.fetchval("SELECT requests FROM usage_windows WHERE bucket_id = $1 "
                                         "AND window_start = 0", rust_id)
        got["version"] = await conn.fetchval("SELECT max(version) FROM busbar_schema")
        return got
    got = _db(url, rust_reads)
    assert got["mine"][0] == "money" and got["mine"][1] is True
    assert got["mine"][2].startswith("binding:%s:" % mine["id"]) and got["mine"][3] is None
    assert got["gone"][0] is False
    assert sorted(tuple(r) for r in got["deny"]) == sorted([(banned_id, "leaked"),
                                                            (gone["id"], "revoked")])
    assert got["swap"] == 6
    assert got["money"] == 100          # 40 from the Rust node + 6 x 10 here: the 10 cents
    assert tuple(got["meter"]) == (2 + 4, "swap")      # the Rust row, added to
    assert got["own"] == 6 and got["version"] == 6
