"""The SQLite store in the Rust gateway's schema (GetBusbar/store-sqlite, v6): a file written as the
Rust store writes it (plain sqlite3, the DDL below written from that schema's facts) reads as is;
a file busbar writes has exactly that schema (tables, columns, keys, indexes, triggers, CHECKs,
user_version) and rows as the Rust store reads them; a v5 file is carried to v6 as the Rust store
does; an earlier busbar's own file (tests/fixtures/stores/busbar-0.x-store.sql, made by busbar
before this schema) is carried over whole; what cannot be read is refused with a message."""
from __future__ import annotations

import asyncio
import pathlib
import sqlite3
import time

import orjson
import pytest

from busbar.governance.config import Governance, StoreConfig
from busbar.governance.model import (
    NANO, GroupRecord, KeyRecord, Limit, Rate, Usage, bucket_key, day_epoch, day_of, new_generation,
    new_key_id, rust_bucket, window, window_deltas, window_start)
from busbar.governance.plane import seed
from busbar.governance.store import SqliteStore, StoreError
from cbusbar.ledger import LimitTable

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "stores"

# The Rust store's schema v6, written here from its facts (columns, types, keys, constraints,
# indexes, triggers), independently of busbar/governance/store.py.
RUST_V6 = """
CREATE TABLE store_meta (k TEXT NOT NULL PRIMARY KEY, v TEXT NOT NULL) STRICT, WITHOUT ROWID;
CREATE TABLE store_revision (id INTEGER NOT NULL PRIMARY KEY CHECK (id = 0),
  revision INTEGER NOT NULL DEFAULT 0) STRICT;
CREATE TABLE keys (id TEXT NOT NULL PRIMARY KEY, name TEXT NOT NULL, key_group TEXT,
  allowed_pools TEXT, labels TEXT NOT NULL DEFAULT '{}', enabled INTEGER NOT NULL DEFAULT 1,
  generation_hash TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  expires_at INTEGER, deleted_at INTEGER, revision INTEGER NOT NULL DEFAULT 0,
  CHECK (enabled IN (0, 1)),
  CHECK (allowed_pools IS NULL OR (json_valid(allowed_pools) AND json_type(allowed_pools) = 'array')),
  CHECK (json_valid(labels) AND json_type(labels) = 'object' AND length(labels) <= 4096),
  CHECK (deleted_at IS NULL OR enabled = 0),
  CHECK (expires_at IS NULL OR expires_at > created_at)) STRICT;
CREATE INDEX keys_revision_idx ON keys (revision);
CREATE INDEX keys_group_live_idx ON keys (key_group) WHERE deleted_at IS NULL;
CREATE TABLE credentials (id TEXT NOT NULL PRIMARY KEY,
  key_id TEXT NOT NULL REFERENCES keys(id) ON DELETE CASCADE ON UPDATE RESTRICT,
  kind TEXT NOT NULL, slot INTEGER NOT NULL, public_id TEXT NOT NULL, secret TEXT,
  secret_form TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  expires_at INTEGER, revoked_at INTEGER, revoke_reason TEXT, revision INTEGER NOT NULL DEFAULT 0,
  CHECK (kind IN ('sigv4')), CHECK (slot IN (0, 1)),
  CHECK (secret_form IN ('none', 'recoverable', 'digest')),
  CHECK ((secret_form = 'none') = (secret IS NULL)),
  CHECK (kind <> 'sigv4' OR secret_form = 'recoverable'),
  CHECK (secret IS NULL OR secret GLOB 'v1:?*:?*'),
  CHECK (revoke_reason IS NULL OR revoked_at IS NOT NULL),
  CHECK (expires_at IS NULL OR expires_at > created_at)) STRICT;
CREATE UNIQUE INDEX cred_public_id_uq ON credentials (kind, public_id);
CREATE UNIQUE INDEX cred_slot_uq ON credentials (key_id, kind, slot);
CREATE INDEX cred_revision_idx ON credentials (revision);
CREATE TABLE denylist (sub TEXT NOT NULL PRIMARY KEY, reason TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL DEFAULT 0) STRICT, WITHOUT ROWID;
CREATE TABLE usage_windows (window_start INTEGER NOT NULL, bucket_id TEXT NOT NULL,
  model TEXT NOT NULL, requests INTEGER NOT NULL DEFAULT 0,
  billable_requests INTEGER NOT NULL DEFAULT 0, tokens_input INTEGER NOT NULL DEFAULT 0,
  tokens_output INTEGER NOT NULL DEFAULT 0, tokens_cache_read INTEGER NOT NULL DEFAULT 0,
  tokens_cache_write INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (window_start, bucket_id, model)) STRICT, WITHOUT ROWID;
CREATE TABLE usage_metering (bucket TEXT NOT NULL, key_id TEXT NOT NULL, provider TEXT NOT NULL,
  model TEXT NOT NULL, key_group_at_use TEXT NOT NULL DEFAULT '',
  pricing_version TEXT NOT NULL DEFAULT '', requests INTEGER NOT NULL DEFAULT 0,
  billable_requests INTEGER NOT NULL DEFAULT 0, tokens_input INTEGER NOT NULL DEFAULT 0,
  tokens_output INTEGER NOT NULL DEFAULT 0, tokens_cache_read INTEGER NOT NULL DEFAULT 0,
  tokens_cache_write INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (bucket, key_id, provider, model)) STRICT, WITHOUT ROWID;
CREATE INDEX um_key_bucket_idx ON usage_metering (key_id, bucket);
CREATE TABLE audit_log (seq INTEGER PRIMARY KEY, ts INTEGER NOT NULL, action TEXT NOT NULL,
  resource TEXT NOT NULL, outcome TEXT NOT NULL, principal TEXT NOT NULL,
  prev_hash TEXT NOT NULL, hash TEXT NOT NULL) STRICT;
CREATE INDEX audit_resource_seq_idx ON audit_log (resource, seq);
CREATE TRIGGER keys_guard_hard_delete BEFORE DELETE ON keys FOR EACH ROW
  WHEN EXISTS (SELECT 1 FROM usage_metering WHERE key_id = OLD.id)
  BEGIN SELECT RAISE(ABORT, 'no hard delete of a key with metering'); END;
CREATE TRIGGER keys_cascade_credentials AFTER DELETE ON keys FOR EACH ROW
  BEGIN DELETE FROM credentials WHERE key_id = OLD.id; END;
CREATE TRIGGER audit_log_no_update BEFORE UPDATE ON audit_log
  BEGIN SELECT RAISE(ABORT, 'append-only'); END;
CREATE TRIGGER audit_log_no_delete BEFORE DELETE ON audit_log
  BEGIN SELECT RAISE(ABORT, 'append-only'); END;
INSERT INTO store_revision (id, revision) VALUES (0, 0);
PRAGMA user_version = 6;
"""

TABLES = ("store_meta", "store_revision", "keys", "credentials", "denylist", "usage_windows",
          "usage_metering", "audit_log")


def rust_file(path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(RUST_V6)
    return db


def run(coro):
    return asyncio.run(coro)


def opened(path, **kw) -> SqliteStore:
    st = SqliteStore(str(path), **kw)
    st.open_sync()
    return st


# ------------------------------------------------------------------ a file the Rust store wrote
def test_a_file_written_as_the_rust_store_writes_reads_as_is(tmp_path):
    path = tmp_path / "rust.db"
    db = rust_file(path)
    now = int(time.time())
    live, gen = new_key_id(), new_generation()
    rows = [
        (live, "ci", "team", '["fast","slow"]', '{"env":"ci"}', 1, "binding:%s:%s" % (live, gen),
         None, 3),
        ("vk_disabled", "off", None, None, "{}", 0, "binding:vk_disabled:" + gen, None, 4),
        ("vk_revoked", "gone", "team", "[]", "{}", 0, "binding:vk_revoked:" + gen, None, 5),
        ("vk_deleted", "del", "team", None, "{}", 0, "binding:vk_deleted:" + gen, now - 5, 6),
        ("vk_old", "pre-generation", None, None, "{}", 1, "binding:vk_old", None, 7),
    ]
    for kid, name, grp, pools, labels, enabled, marker, deleted, rev in rows:
        db.execute("INSERT INTO keys (id, name, key_group, allowed_pools, labels, enabled, "
                   "generation_hash, created_at, updated_at, expires_at, deleted_at, revision) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)",
                   (kid, name, grp, pools, labels, enabled, marker, now - 100, now - 100, deleted,
                    rev))
    db.execute("INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, "
               "created_at, updated_at, revision) VALUES ('cred_1', ?, 'sigv4', 0, "
               "'AKIAABCDEFGHIJKLMNOP', 'v1:plain:s3cret/+40charsxxxxxxxxxxxxxxxxxxxx', "
               "'recoverable', ?, ?, 3)", (live, now - 100, now - 100))
    db.execute("INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, "
               "created_at, updated_at, revoked_at, revoke_reason, revision) VALUES ('cred_2', "
               "'vk_disabled', 'sigv4', 0, 'AKIAREVOKEDREVOKED00', 'v1:plain:x', 'recoverable', "
               "?, ?, ?, 'rotated', 4)", (now - 100, now - 100, now - 50))
    db.execute("INSERT INTO denylist (sub, reason, created_at) VALUES ('vk_revoked', 'leaked', ?)",
               (now,))
    db.execute("INSERT INTO denylist (sub, reason, created_at) VALUES ('vk_deleted', '', ?)", (now,))
    hour, day = window_start("hour", now), window_start("day", now)
    month = window_start("month", now)
    ledger = [
        (0, live, "", 9, 8, 0, 0, 0, 0),                   # the key's own bucket, all time
        (0, live, "m1", 0, 0, 900, 90, 9, 0),
        (hour, "group:team@hour", "", 4, 4, 0, 0, 0, 0),
        (hour, "group:team@hour", "m1", 0, 0, 1000, 500, 0, 0),
        (hour - 3600, "group:team@hour", "", 50, 50, 0, 0, 0, 0),   # the last hour: not carried
        (month, "group:org@month", "m1", 0, 0, 2_000_000, 1_000_000, 100, 0),
        (month, "group:org@month", "m2", 0, 0, 10, 10, 0, 0),       # no rate: costs 0
        (day, "group:team@day#pool:fast", "", 3, 2, 0, 0, 0, 0),
    ]
    db.executemany("INSERT INTO usage_windows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", ledger)
    today = day_of(now)
    db.execute("INSERT INTO usage_metering VALUES (?, ?, 'openai', 'm1', 'team', '', 9, 8, 900, "
               "90, 9, 0)", (str(day_epoch(today)), live))
    db.execute("INSERT INTO usage_metering VALUES ('86400', ?, 'openai', 'm1', 'team', 'v1', 1, 1, "
               "1, 1, 0, 0)", (live,))
    db.close()

    st = opened(path)
    k = st.keys[live]
    assert (k.name, k.group, k.allowed_pools, k.labels, k.state, k.gen) == (
        "ci", "team", ["fast", "slow"], {"env": "ci"}, "active", gen)
    assert run(st.key_by_aws("AKIAABCDEFGHIJKLMNOP")) is k
    assert k.aws_secret == "s3cret/+40charsxxxxxxxxxxxxxxxxxxxx"
    assert run(st.key_by_aws("AKIAREVOKEDREVOKED00")) is None        # that credential is revoked
    assert st.keys["vk_disabled"].state == "disabled"
    assert st.keys["vk_disabled"].aws_access_key_id is None
    assert st.keys["vk_revoked"].state == "revoked" and st.keys["vk_revoked"].allowed_pools == []
    assert st.keys["vk_deleted"].state == "tombstoned"
    assert st.keys["vk_old"].gen is None and st.keys["vk_old"].state == "active"
    [row] = run(st.usage_rows(today))
    assert row == {"day": today, "key_id": live, "group": "team", "model": "m1",
                   "provider": "openai", "requests": 9, "billable_requests": 8,
                   "input_tokens": 900, "output_tokens": 90, "cache_read_tokens": 9,
                   "cache_write_tokens": 0}
    assert [r["day"] for r in run(st.usage_rows())] == ["1970-01-02", today]
    assert st.window(live, 0) == (9, 8, {"m1": [900, 90, 9, 0]})

    # busbar's limits start where the Rust ledger says they are
    groups = {"org": GroupRecord("org", limits=[Limit("budget_usd", 10 * NANO, "month")]),
              "team": GroupRecord("team", parent="org", limits=[
                  Limit("requests", 5, "hour"), Limit("tokens", 10_000, "hour"),
                  Limit("requests", 3, "day", "fast"), Limit("concurrent", 2)])}
    gov = Governance(True, None, groups, {"m1": Rate(1.0, 2.0, 0.5)}, StoreConfig())
    table = LimitTable(64)
    seed(table, gov, {}, st, now)

    def value(name, i):
        lim = groups[name].limits[i]
        return table.value(bucket_key(name, i, lim), window(lim.per, now)[0])
    assert value("team", 0) == 4                          # requests admitted this hour
    assert value("team", 1) == 1500                       # input + output tokens this hour
    assert value("team", 2) == 3                          # the pool-scoped day bucket
    assert value("org", 0) == Rate(1.0, 2.0, 0.5).nano(2_000_000, 1_000_000, 100)
    assert value("team", 3) == 0
    run(st.close())


# ------------------------------------------------------------------ the file busbar writes
def _schema(db):
    """Everything about a schema that decides what a program reading it sees."""
    out = {"user_version": db.execute("PRAGMA user_version").fetchone()[0]}
    for t in TABLES:
        out[t, "columns"] = db.execute("PRAGMA table_xinfo(%s)" % t).fetchall()
        out[t, "fks"] = db.execute("PRAGMA foreign_key_list(%s)" % t).fetchall()
        out[t, "kind"] = db.execute("SELECT type, ncol, wr, strict FROM pragma_table_list "
                                    "WHERE name = ?", (t,)).fetchall()
        indexes = {}
        for _, name, unique, origin, partial in db.execute("PRAGMA index_list(%s)" % t):
            indexes[name if origin == "c" else origin] = (
                unique, partial, db.execute("PRAGMA index_xinfo(%s)" % name).fetchall())
        out[t, "indexes"] = indexes
    out["triggers"] = sorted(db.execute("SELECT name, tbl_name FROM sqlite_master "
                                        "WHERE type = 'trigger'").fetchall())
    out["tables"] = sorted(r[0] for r in db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'"))
    return out


# Writes the Rust schema refuses (its CHECKs, keys and triggers): each must fail on both files.
REFUSED = [
    "INSERT INTO keys (id, name, generation_hash, created_at, updated_at, enabled) "
    "VALUES ('x', '', '', 1, 1, 2)",
    "INSERT INTO keys (id, name, generation_hash, created_at, updated_at, allowed_pools) "
    "VALUES ('x', '', '', 1, 1, '{}')",
    "INSERT INTO keys (id, name, generation_hash, created_at, updated_at, labels) "
    "VALUES ('x', '', '', 1, 1, '[]')",
    "INSERT INTO keys (id, name, generation_hash, created_at, updated_at, labels) "
    "VALUES ('x', '', '', 1, 1, '{\"a\":\"%s\"}')" % ("x" * 4100),
    "INSERT INTO keys (id, name, generation_hash, created_at, updated_at, deleted_at) "
    "VALUES ('x', '', '', 1, 1, 5)",
    "INSERT INTO keys (id, name, generation_hash, created_at, updated_at, expires_at) "
    "VALUES ('x', '', '', 10, 10, 10)",
    "INSERT INTO keys (id, name, generation_hash, created_at, updated_at) VALUES ('x', '', '', 'a', 1)",
    "INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, created_at, "
    "updated_at) VALUES ('c', 'k', 'oauth', 0, 'p', 'v1:plain:s', 'recoverable', 1, 1)",
    "INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, created_at, "
    "updated_at) VALUES ('c', 'k', 'sigv4', 2, 'p', 'v1:plain:s', 'recoverable', 1, 1)",
    "INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, created_at, "
    "updated_at) VALUES ('c', 'k', 'sigv4', 0, 'p', 'plain', 'recoverable', 1, 1)",
    "INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, created_at, "
    "updated_at) VALUES ('c', 'k', 'sigv4', 0, 'p', 'v1:plain:s', 'digest', 1, 1)",
    "INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, created_at, "
    "updated_at) VALUES ('c', 'k', 'sigv4', 0, 'p', NULL, 'recoverable', 1, 1)",
    "INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, created_at, "
    "updated_at, revoke_reason) VALUES ('c', 'k', 'sigv4', 0, 'p', 'v1:plain:s', 'recoverable', "
    "1, 1, 'why')",
    "INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, created_at, "
    "updated_at) VALUES ('c2', 'k', 'sigv4', 1, 'AKIA1', 'v1:plain:s', 'recoverable', 1, 1)",
    "INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, created_at, "
    "updated_at) VALUES ('c', 'nokey', 'sigv4', 0, 'p', 'v1:plain:s', 'recoverable', 1, 1)",
    "INSERT INTO store_revision (id, revision) VALUES (1, 0)",
    "DELETE FROM keys WHERE id = 'k'",
    "UPDATE audit_log SET ts = 2",
    "DELETE FROM audit_log",
    "INSERT INTO usage_windows (window_start, bucket_id, model, requests) VALUES (0, 'b', '', 'x')",
]


def _fixture_rows(db):
    db.execute("INSERT INTO keys (id, name, generation_hash, created_at, updated_at) "
               "VALUES ('k', '', 'binding:k:g', 1, 1)")
    db.execute("INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, "
               "created_at, updated_at) VALUES ('c1', 'k', 'sigv4', 0, 'AKIA1', 'v1:plain:s', "
               "'recoverable', 1, 1)")
    db.execute("INSERT INTO usage_metering (bucket, key_id, provider, model) VALUES ('0', 'k', 'p', 'm')")
    db.execute("INSERT INTO audit_log VALUES (1, 1, 'a', 'r', 'applied', 'p', '', 'h')")


def test_the_file_busbar_writes_has_the_rust_schema_and_rows(tmp_path):
    st = opened(tmp_path / "busbar.db")
    now = int(time.time())
    gen = new_generation()
    k = KeyRecord(new_key_id(), "ci", "team", ["fast"], "active", now, None, gen,
                  "AKIAABCDEFGHIJKLMNOP", "s" * 40, "cred_" + "0" * 32, {"team": "growth"})
    run(st.put_key(k))
    gone = KeyRecord(new_key_id(), "gone", None, None, "active", now, None, new_generation(),
                     "AKIAZZZZZZZZZZZZZZZZ", "t" * 40, "cred_" + "1" * 32)
    run(st.put_key(gone))
    rev = KeyRecord(new_key_id(), "rev", None, [], "active", now, None, new_generation(),
                    "AKIAYYYYYYYYYYYYYYYY", "u" * 40, "cred_" + "2" * 32)
    run(st.put_key(rev))
    rev.state = "revoked"
    run(st.put_key(rev))
    run(st.delete_key(gone.id))
    run(st.put_group(GroupRecord("api", limits=[Limit("requests", 5, "hour")])))
    rows = [Usage(day_of(now), k.id, "team", "m1", "fast", 3, 100, 10, 5, 1, 2, provider="openai")]
    windows = window_deltas(rows, lambda g, p: [("group:team@minute", "minute")] if g else [], now)
    run(st.add_usage(rows, windows))
    run(st.close())

    busbar = sqlite3.connect(tmp_path / "busbar.db", isolation_level=None)
    rust = sqlite3.connect(":memory:", isolation_level=None)
    rust.executescript(RUST_V6)
    assert _schema(busbar) == _schema(rust)
    assert busbar.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    for db in (busbar, rust):       # the same CHECKs, keys and triggers: probed on copies
        probe = sqlite3.connect(":memory:", isolation_level=None)
        db.backup(probe)
        probe.execute("PRAGMA foreign_keys=ON")
        _fixture_rows(probe)
        for sql in REFUSED:
            with pytest.raises((sqlite3.IntegrityError, sqlite3.OperationalError)):
                probe.execute(sql)

    # the rows, as the Rust store reads them
    row = busbar.execute("SELECT id, name, key_group, allowed_pools, labels, enabled, "
                         "generation_hash, created_at, expires_at, deleted_at FROM keys "
                         "WHERE id = ?", (k.id,)).fetchone()
    assert row == (k.id, "ci", "team", '["fast"]', '{"team":"growth"}', 1,
                   "binding:%s:%s" % (k.id, gen), now, None, None)
    assert busbar.execute("SELECT key_id, kind, slot, public_id, secret, secret_form, revoked_at "
                          "FROM credentials WHERE key_id = ?", (k.id,)).fetchone() == (
        k.id, "sigv4", 0, "AKIAABCDEFGHIJKLMNOP", "v1:plain:" + "s" * 40, "recoverable", None)
    assert busbar.execute("SELECT enabled, deleted_at IS NOT NULL FROM keys WHERE id = ?",
                          (gone.id,)).fetchone() == (0, 1)
    assert busbar.execute("SELECT count(*) FROM credentials WHERE key_id = ?",
                          (gone.id,)).fetchone() == (0,)
    assert busbar.execute("SELECT enabled, deleted_at FROM keys WHERE id = ?",
                          (rev.id,)).fetchone() == (0, None)
    assert busbar.execute("SELECT revoked_at IS NOT NULL FROM credentials WHERE key_id = ?",
                          (rev.id,)).fetchone() == (1,)
    assert {r[0] for r in busbar.execute("SELECT sub FROM denylist")} == {gone.id, rev.id}
    revs = [r[0] for r in busbar.execute("SELECT revision FROM keys ORDER BY revision")]
    assert len(set(revs)) == 3 and busbar.execute(
        "SELECT revision FROM store_revision").fetchone()[0] == max(revs)
    assert busbar.execute("SELECT bucket, key_id, provider, model, key_group_at_use, requests, "
                          "billable_requests, tokens_input, tokens_output, tokens_cache_read, "
                          "tokens_cache_write FROM usage_metering").fetchall() == [
        (str(day_epoch(day_of(now))), k.id, "openai", "m1", "team", 3, 2, 100, 10, 5, 1)]
    assert sorted(busbar.execute("SELECT window_start, bucket_id, model, requests, "
                                 "billable_requests, tokens_input FROM usage_windows")) == sorted([
        (0, k.id, "", 3, 2, 0), (0, k.id, "m1", 0, 0, 100),
        (window_start("minute", now), "group:team@minute", "", 3, 2, 0),
        (window_start("minute", now), "group:team@minute", "m1", 0, 0, 100)])
    [(v,)] = busbar.execute("SELECT v FROM store_meta WHERE k = 'busbar.group:api'")
    assert orjson.loads(v)["limits"][0] == {"kind": "requests", "amount": 5, "per": "hour",
                                             "pool": None}

    # ...and busbar reads its own file back the same
    again = opened(tmp_path / "busbar.db")
    assert again.keys[k.id].to_dict() == dict(k.to_dict(), revision=again.keys[k.id].revision)
    assert again.keys[gone.id].state == "tombstoned" and again.keys[rev.id].state == "revoked"
    assert run(again.key_by_aws("AKIAYYYYYYYYYYYYYYYY")) is None
    assert again.groups["api"].limits == (Limit("requests", 5, "hour"),)
    with pytest.raises(StoreError):                 # a tombstone is never written back
        gone.state = "active"
        run(again.put_key(gone))


# ------------------------------------------------------------------ versions
def test_a_v5_file_is_carried_to_v6_as_the_rust_store_does(tmp_path):
    path = tmp_path / "v5.db"
    db = rust_file(path)
    db.execute("PRAGMA user_version = 5")
    db.executemany("INSERT INTO usage_windows (window_start, bucket_id, model, requests, "
                   "billable_requests, tokens_input) VALUES (?, ?, ?, ?, ?, ?)",
                   [(0, "vk_a", "", 7, 0, 0), (0, "vk_a", "m", 0, 0, 70), (0, "vk_b", "", 4, 2, 0)])
    db.execute("INSERT INTO usage_metering (bucket, key_id, provider, model, requests, "
               "billable_requests) VALUES ('0', 'vk_a', 'p', 'm', 7, 0)")
    db.close()
    st = opened(path)
    assert st.window("vk_a", 0) == (7, 7, {"m": [70, 0, 0, 0]})
    assert st.window("vk_b", 0) == (4, 2, {})
    assert run(st.usage_rows())[0]["billable_requests"] == 7
    run(st.close())
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 6


def test_what_cannot_be_read_is_refused_and_left_alone(tmp_path):
    newer = tmp_path / "v7.db"
    db = rust_file(newer)
    db.execute("PRAGMA user_version = 7")
    db.close()
    with pytest.raises(StoreError, match=r"schema v7, newer than the v6"):
        opened(newer)
    dev = tmp_path / "dev.db"
    db = sqlite3.connect(dev)
    db.execute("CREATE TABLE virtual_keys (id TEXT PRIMARY KEY, key_hash TEXT)")
    db.execute("INSERT INTO virtual_keys VALUES ('vk_1', 'h')")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="development build before Rust busbar 1.5.0.*move the file"):
        opened(dev)
    db = sqlite3.connect(dev)
    assert db.execute("SELECT * FROM virtual_keys").fetchall() == [("vk_1", "h")]
    assert db.execute("PRAGMA user_version").fetchone()[0] == 3


# ------------------------------------------------------------------ busbar's earlier file
def test_an_earlier_busbar_file_is_carried_over_whole(tmp_path):
    """The fixture is `sqlite3 .dump` of a file busbar wrote before this schema (keys minted,
    revoked, disabled and deleted through the admin API, an AWS pair, a group made through the
    API, usage of two keys): every key, group and count is in the v6 file after one open."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path)
    db.executescript((FIXTURES / "busbar-0.x-store.sql").read_text())
    db.close()
    keys = {d["name"]: d for d in (orjson.loads(r[0]) for r in sqlite3.connect(path).execute(
        "SELECT doc FROM keys"))}
    config = {"org": GroupRecord("org", limits=[Limit("budget_usd", 1000 * NANO, "month")]),
              "team": GroupRecord("team", parent="org", limits=[
                  Limit("requests", 1000, "minute"), Limit("tokens", 100000, "day", "oai-model")])}
    providers = {"oai-model": "m-openai", "ant-model": "m-anthropic"}
    st = opened(path, config_groups=config, provider_of=providers.get)
    by_name = {k.name: k for k in st.keys.values()}
    assert set(by_name) == set(keys)
    for name, state in (("live", "active"), ("aws", "active"), ("revoked", "revoked"),
                        ("disabled", "disabled"), ("deleted", "tombstoned")):
        k, d = by_name[name], keys[name]
        assert (k.id, k.state, k.group, k.allowed_pools, k.labels, k.created) == (
            d["id"], state, d["group"], d["allowed_pools"], d["labels"], d["created"]), name
    assert by_name["live"].expires == keys["live"]["expires"] and by_name["disabled"].expires is None
    aws = by_name["aws"]
    assert aws.aws_access_key_id == keys["aws"]["aws_access_key_id"]
    assert aws.aws_secret == keys["aws"]["aws_secret"]
    assert run(st.key_by_aws(aws.aws_access_key_id)) is aws
    assert st.groups["api-made"].parent == "org"
    assert set(st.denylist) == {by_name["revoked"].id, by_name["deleted"].id}

    old = sqlite3.connect(tmp_path / "ref.db")
    old.executescript((FIXTURES / "busbar-0.x-store.sql").read_text())
    want = {}
    for day, kid, _grp, model, _pool, *counts in old.execute("SELECT * FROM usage"):
        want[(day, kid, model)] = counts
    got = {(r["day"], r["key_id"], r["model"]): [r[f] for f in (
        "requests", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")]
        for r in run(st.usage_rows())}
    assert got == want
    assert {r["provider"] for r in run(st.usage_rows())} == {"m-openai", "m-anthropic"}
    assert all(r["group"] == "team" for r in run(st.usage_rows()))
    live = by_name["live"].id
    [(day, _, _, _, _, *cnt)] = [r for r in old.execute(
        "SELECT * FROM usage WHERE key_id = ? AND model = 'oai-model'", (live,))]
    requests, inp, out = cnt[0], cnt[1], cnt[2]
    total = st.window(live, 0)
    assert total[0] == sum(c[0] for k, c in want.items() if k[1] == live)
    assert total[2]["oai-model"][:2] == [inp, out]
    # the group windows the limits start from: team's day (pool-scoped), org's month
    start = day_epoch(day)
    assert st.window(rust_bucket("team", "day", "oai-model"), start)[2]["oai-model"][:2] == [
        sum(c[1] for k, c in want.items() if k[2] == "oai-model"),
        sum(c[2] for k, c in want.items() if k[2] == "oai-model")]
    assert st.window(rust_bucket("org", "month", None), window_start("month", start))[0] == sum(
        c[0] for c in want.values())
    assert st.window(rust_bucket("team", "minute", None), window_start("minute", start))[0] == 0
    usage = run(st.usage_rows())
    run(st.close())
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 6
    assert sorted(r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")) \
        == sorted(TABLES)
    assert requests >= 1
    # and the next open is a plain v6 open: nothing changes
    again = opened(path, config_groups=config, provider_of=providers.get)
    assert {k: v.to_dict() for k, v in again.keys.items()} == {
        k: v.to_dict() for k, v in st.keys.items()}
    assert run(again.usage_rows()) == usage
