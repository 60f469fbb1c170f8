"""Where keys, groups and usage live on one node: `memory` (tests; gone at exit) and `sqlite` (the
default: one file, WAL). The Redis store (several instances) is busbar/governance/redis_store.py
with the same methods.

Only the parent process (worker 0, which also runs the admin API) opens a local store: the admin
API writes keys and groups here and pushes them to the other workers, and every worker sends its
usage to the parent in batches (busbar/governance/plane.py), which adds them here in one
transaction per batch. One writer, so SQLite never sees a lock conflict. A crash (kill -9) loses
what was not yet written: at most one worker batch plus one parent batch, 2 x
`store.flush_interval_ms` (default 200 ms).

Tokens are the stored truth; spend is derived when read, from the current rate card
(SPEC §5: a rate fix reprices past data on the next read).
"""
from __future__ import annotations

import os
import sqlite3

import orjson

from .model import USAGE_FIELDS, GroupRecord, KeyRecord, group_from_dict, group_to_dict


def _ukey(u):
    return (u.day, u.key_id, u.group, u.model, u.pool)


class MemoryStore:
    kind = "memory"

    def __init__(self):
        self.keys = {}
        self.aws = {}
        self.groups = {}
        self.usage = {}         # (day, key_id, group, model, pool) -> [requests, in, out, cr, cw]

    async def open(self):
        pass

    async def close(self):
        pass

    # keys
    async def put_key(self, rec: KeyRecord):
        old = self.keys.get(rec.id)
        if old is not None and old.aws_access_key_id and old.aws_access_key_id != rec.aws_access_key_id:
            self.aws.pop(old.aws_access_key_id, None)
        self.keys[rec.id] = rec
        if rec.aws_access_key_id:
            self.aws[rec.aws_access_key_id] = rec.id

    async def get_key(self, key_id):
        return self.keys.get(key_id)

    async def key_by_aws(self, akid):
        kid = self.aws.get(akid)
        return None if kid is None else self.keys.get(kid)

    async def list_keys(self):
        return list(self.keys.values())

    async def delete_key(self, key_id):
        rec = self.keys.pop(key_id, None)
        if rec is not None and rec.aws_access_key_id:
            self.aws.pop(rec.aws_access_key_id, None)

    # groups
    async def put_group(self, rec: GroupRecord):
        self.groups[rec.name] = rec

    async def get_group(self, name):
        return self.groups.get(name)

    async def list_groups(self):
        return list(self.groups.values())

    async def delete_group(self, name):
        self.groups.pop(name, None)

    # usage
    async def add_usage(self, rows):
        for u in rows:
            k = _ukey(u)
            cur = self.usage.get(k)
            if cur is None:
                cur = self.usage[k] = [0, 0, 0, 0, 0]
            for i, f in enumerate(USAGE_FIELDS):
                cur[i] += getattr(u, f)

    async def usage_rows(self, day=None):
        out = []
        for (d, kid, grp, model, pool), vals in self.usage.items():
            if day is not None and d != day:
                continue
            row = {"day": d, "key_id": kid, "group": grp, "model": model, "pool": pool}
            row.update(zip(USAGE_FIELDS, vals))
            out.append(row)
        return out


_SCHEMA = """
CREATE TABLE IF NOT EXISTS keys (id TEXT PRIMARY KEY, aws TEXT UNIQUE, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS groups (name TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS usage (
  day TEXT NOT NULL, key_id TEXT NOT NULL, grp TEXT NOT NULL, model TEXT NOT NULL,
  pool TEXT NOT NULL, requests INTEGER NOT NULL DEFAULT 0, input_tokens INTEGER NOT NULL DEFAULT 0,
  output_tokens INTEGER NOT NULL DEFAULT 0, cache_read_tokens INTEGER NOT NULL DEFAULT 0,
  cache_write_tokens INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (day, key_id, grp, model, pool));
"""


class SqliteStore(MemoryStore):
    """The memory store's dicts as a cache of the file: reads never touch SQLite; every write goes
    to the file in the same call (keys and groups: one row; usage: one transaction per batch)."""

    kind = "sqlite"

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.db = None

    async def open(self):
        self.open_sync()

    def open_sync(self):
        if self.db is not None:
            return
        d = os.path.dirname(self.path)
        if d:
            os.makedirs(d, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a committed transaction survives a process crash (kill -9); only a
        # power loss can take the last ones back.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA busy_timeout=5000")
        db.executescript(_SCHEMA)
        self.db = db
        for (doc,) in db.execute("SELECT doc FROM keys"):
            rec = KeyRecord.from_dict(orjson.loads(doc))
            self._put_key_mem(rec)
        for (doc,) in db.execute("SELECT doc FROM groups"):
            g = group_from_dict(orjson.loads(doc))
            self.groups[g.name] = g
        for row in db.execute("SELECT day, key_id, grp, model, pool, requests, input_tokens, "
                              "output_tokens, cache_read_tokens, cache_write_tokens FROM usage"):
            self.usage[tuple(x if x != "" else None for x in row[:5])] = list(row[5:])

    async def close(self):
        if self.db is not None:
            self.db.close()
            self.db = None

    async def put_key(self, rec):
        self.db.execute("INSERT OR REPLACE INTO keys (id, aws, doc) VALUES (?, ?, ?)",
                        (rec.id, rec.aws_access_key_id, orjson.dumps(rec.to_dict()).decode()))
        await MemoryStore.put_key(self, rec)

    async def delete_key(self, key_id):
        self.db.execute("DELETE FROM keys WHERE id = ?", (key_id,))
        await MemoryStore.delete_key(self, key_id)

    async def put_group(self, rec):
        self.db.execute("INSERT OR REPLACE INTO groups (name, doc) VALUES (?, ?)",
                        (rec.name, orjson.dumps(group_to_dict(rec)).decode()))
        await MemoryStore.put_group(self, rec)

    async def delete_group(self, name):
        self.db.execute("DELETE FROM groups WHERE name = ?", (name,))
        await MemoryStore.delete_group(self, name)

    async def add_usage(self, rows):
        if not rows:
            return
        db = self.db
        db.execute("BEGIN")
        try:
            db.executemany(
                "INSERT INTO usage (day, key_id, grp, model, pool, requests, input_tokens, "
                "output_tokens, cache_read_tokens, cache_write_tokens) VALUES (?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (day, key_id, grp, model, pool) DO UPDATE SET "
                "requests = requests + excluded.requests, "
                "input_tokens = input_tokens + excluded.input_tokens, "
                "output_tokens = output_tokens + excluded.output_tokens, "
                "cache_read_tokens = cache_read_tokens + excluded.cache_read_tokens, "
                "cache_write_tokens = cache_write_tokens + excluded.cache_write_tokens",
                [(u.day, u.key_id, u.group or "", u.model or "", u.pool or "",
                  u.requests, u.input_tokens, u.output_tokens, u.cache_read_tokens,
                  u.cache_write_tokens) for u in rows])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        await MemoryStore.add_usage(self, rows)


def _put_key_mem(self, rec):
    self.keys[rec.id] = rec
    if rec.aws_access_key_id:
        self.aws[rec.aws_access_key_id] = rec.id


MemoryStore._put_key_mem = _put_key_mem


def open_store(store_config):
    """The parent's store object for a StoreConfig (not yet opened)."""
    kind = store_config.kind
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqliteStore(store_config.path)
    from .redis_store import RedisStore
    return RedisStore(store_config.url)
