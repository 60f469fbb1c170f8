"""Where keys, groups and usage live: the store contract, and the stores of one node, `memory`
(tests; gone at exit) and `sqlite` (the default: one file, WAL, in the Rust gateway's schema). The
shared stores implement the same contract: Valkey/Redis in busbar/governance/redis_store.py,
PostgreSQL in busbar/governance/postgres_store.py.

The contract (what the admin API and busbar/governance/plane.py call; every method is async, a
store that cannot answer raises):

    open() / close()
    put_key(rec)              upsert a KeyRecord; its `state` decides the rows: "revoked" also puts
                              the id on the denylist and revokes its AWS credential; a tombstoned
                              key is never brought back (StoreError)
    get_key(id)               the KeyRecord (tombstoned ones too; `state` says so) or None
    key_by_aws(access_key_id) the KeyRecord whose live sigv4 credential has that id, or None
    list_keys()               every KeyRecord, tombstoned too, oldest first
    delete_key(id)            tombstone: the row stays (usage refers to it), enabled 0, deleted_at
                              set, the id denylisted, its credentials destroyed
    put_group / get_group / list_groups / delete_group
                              groups made through the admin API (GroupRecord); config groups
                              are the config's and never stored
    add_usage(rows, windows)  one batch, atomically: `rows` (model.Usage, provider filled in) into
                              the per-day metering; `windows` (model.window_deltas) into the
                              per-bucket ledger the limits start from after a restart
    usage_rows(day=None)      the metering as dicts {day, key_id, group, model, provider, and the
                              counts of model.USAGE_FIELDS}, of one UTC day or all
    usage_totals()            the same summed over every day per (key_id, group, model), day None
    window(bucket_id, start)  (local stores, synchronous) a bucket's ledger: (requests, billable,
                              {model: [input, output, cache read, cache write]})
    audit (busbar/admin/audit.py, which computes the hash chain; a store keeps records verbatim):
      local stores (audit_sync = True): append_audit_sync(rec), audit_tail_sync() -> the record
      of the highest seq or None, list_audit_sync() -> every record, oldest first;
      Redis: the same as coroutines append_audit, audit_tail, list_audit

Each key, credential, denylist entry, metering row and window is a row of the Rust store's own
tables, so a file one gateway wrote is read by the other as it is (docs/governance.md, "Stores").

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

import logging
import os
import sqlite3
import time

import orjson

from .model import (
    PLAIN_SECRET, USAGE_FIELDS, GroupRecord, KeyRecord, StoreError, Usage, credential_live,
    day_epoch, generation_marker, group_from_dict, group_to_dict, ledger_buckets,
    _cred_of_row, _usage_row, _vk_of_row, new_credential_id, record_of, usage_totals, window_deltas)

log = logging.getLogger("busbar.governance")
# Audit records the memory store keeps (busbar/admin/audit.py AUDIT_RING_MAX, the Rust ring size).
MEMORY_AUDIT_MAX = 1000


def _metering_key(u):
    return (day_epoch(u.day), u.key_id, u.provider or "", u.model or "")


# ---------------------------------------------------------------------------- memory
class MemoryStore:
    """The contract over dicts shaped like the Rust tables: nothing survives the process."""

    kind = "memory"

    def __init__(self):
        self.keys = {}          # id -> KeyRecord
        self.aws = {}           # access key id -> key id
        self.denylist = {}      # id -> reason
        self.groups = {}        # name -> GroupRecord (made through the admin API)
        self.metering = {}      # (bucket, key, provider, model) -> [group at use, 6 counts]
        self.windows = {}       # (bucket id, window start) -> [requests, billable, {model: [4]}]
        self.audit = []         # audit records (dicts), oldest first

    audit_sync = True

    async def open(self):
        pass

    def open_sync(self):
        pass

    async def close(self):
        pass

    # -- keys
    def _check_revival(self, rec):
        old = self.keys.get(rec.id)
        if old is not None and old.state == "tombstoned" and rec.state != "tombstoned":
            raise StoreError("key %s is deleted (tombstoned); it cannot be written back" % rec.id)

    def _put_key_mem(self, rec):
        old = self.keys.get(rec.id)
        if old is not None and old.aws_access_key_id and old.aws_access_key_id != rec.aws_access_key_id:
            self.aws.pop(old.aws_access_key_id, None)
        if rec.state in ("revoked", "tombstoned"):
            self.denylist.setdefault(rec.id, rec.state)
        self.keys[rec.id] = rec
        if rec.aws_access_key_id and rec.state not in ("revoked", "tombstoned"):
            self.aws[rec.aws_access_key_id] = rec.id
        elif rec.aws_access_key_id:
            self.aws.pop(rec.aws_access_key_id, None)

    async def put_key(self, rec: KeyRecord):
        self._check_revival(rec)
        self._put_key_mem(rec)

    async def get_key(self, key_id):
        return self.keys.get(key_id)

    async def key_by_aws(self, akid):
        kid = self.aws.get(akid)
        return None if kid is None else self.keys.get(kid)

    async def list_keys(self):
        return sorted(self.keys.values(), key=lambda k: (k.created or 0, k.id))

    def _tombstone_mem(self, key_id, now):
        rec = self.keys.get(key_id)
        if rec is None:
            raise StoreError("no key %s" % key_id)
        if rec.state == "tombstoned":
            return rec
        if rec.aws_access_key_id:
            self.aws.pop(rec.aws_access_key_id, None)
        rec = KeyRecord.from_dict(rec.to_dict())
        rec.state, rec.deleted = "tombstoned", now
        rec.aws_access_key_id = rec.aws_secret = rec.aws_cred_id = None
        self.keys[key_id] = rec
        self.denylist.setdefault(key_id, "deleted")
        return rec

    async def delete_key(self, key_id):
        self._tombstone_mem(key_id, int(time.time()))

    # -- groups (the *_sync forms: boot's overlay import, before any event loop runs)
    def put_group_sync(self, rec: GroupRecord):
        self.groups[rec.name] = rec

    async def put_group(self, rec: GroupRecord):
        self.put_group_sync(rec)

    async def get_group(self, name):
        return self.groups.get(name)

    async def list_groups(self):
        return sorted(self.groups.values(), key=lambda g: g.name)

    def delete_group_sync(self, name):
        self.groups.pop(name, None)

    async def delete_group(self, name):
        self.delete_group_sync(name)

    # -- usage
    async def add_usage(self, rows, windows=None):
        for u in rows:
            k = _metering_key(u)
            cur = self.metering.get(k)
            if cur is None:
                cur = self.metering[k] = [u.group or ""] + [0] * len(USAGE_FIELDS)
            for i, f in enumerate(USAGE_FIELDS):
                cur[i + 1] += getattr(u, f)
        for k, (req, bill, models) in (windows or {}).items():
            cur = self.windows.get(k)
            if cur is None:
                cur = self.windows[k] = [0, 0, {}]
            cur[0] += req
            cur[1] += bill
            for m, t in models.items():
                have = cur[2].setdefault(m, [0, 0, 0, 0])
                for i in range(4):
                    have[i] += t[i]

    async def usage_rows(self, day=None):
        want = day_epoch(day) if day is not None else None
        out = []
        for (bucket, kid, provider, model), vals in sorted(self.metering.items()):
            if want is not None and bucket != want:
                continue
            out.append(_usage_row(bucket, kid, vals[0], model, provider, vals[1:]))
        return out

    async def usage_totals(self):
        return usage_totals(await self.usage_rows())

    def window(self, bucket_id, start):
        cur = self.windows.get((bucket_id, start))
        if cur is None:
            return 0, 0, {}
        return cur[0], cur[1], {m: list(t) for m, t in cur[2].items()}


    # -- audit: the memory store keeps the last MEMORY_AUDIT_MAX records, as the Rust gateway's
    # RAM default keeps a ring (memory bounded; the chain's tail, which the next record links to,
    # is always kept)
    def append_audit_sync(self, rec: dict):
        self.audit.append(dict(rec))
        if len(self.audit) > MEMORY_AUDIT_MAX:
            del self.audit[:len(self.audit) - MEMORY_AUDIT_MAX]

    def audit_tail_sync(self):
        return dict(self.audit[-1]) if self.audit else None

    def list_audit_sync(self):
        return [dict(r) for r in self.audit]


# ---------------------------------------------------------------------------- sqlite: the schema
# The Rust store's schema (GetBusbar/store-sqlite store-sqlite/src/lib.rs), version 6 in PRAGMA
# user_version. The tables, columns, constraints and triggers are that store's; a Rust gateway
# opening a file busbar made finds its schema in place (its CREATE ... IF NOT EXISTS do nothing),
# and busbar reads a file it made. Groups made through busbar's admin API, which the Rust gateway
# keeps in its config overlay instead, are rows of store_meta (k `busbar.group:<name>`).
SCHEMA_VERSION = 6
GROUP_META = "busbar.group:"

_TABLES = """
CREATE TABLE IF NOT EXISTS store_meta (
  k TEXT NOT NULL PRIMARY KEY,
  v TEXT NOT NULL
) STRICT, WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS store_revision (
  id       INTEGER NOT NULL PRIMARY KEY CHECK (id = 0),
  revision INTEGER NOT NULL DEFAULT 0
) STRICT;

-- key_group names a group of the config (not a foreign key); allowed_pools NULL = every pool, a
-- JSON array = exactly those; generation_hash is `binding:<id>:<generation>`.
CREATE TABLE IF NOT EXISTS keys (
  id              TEXT NOT NULL PRIMARY KEY,
  name            TEXT NOT NULL,
  key_group       TEXT,
  allowed_pools   TEXT,
  labels          TEXT NOT NULL DEFAULT '{}',
  enabled         INTEGER NOT NULL DEFAULT 1,
  generation_hash TEXT NOT NULL,
  created_at      INTEGER NOT NULL,
  updated_at      INTEGER NOT NULL,
  expires_at      INTEGER,
  deleted_at      INTEGER,
  revision        INTEGER NOT NULL DEFAULT 0,
  CONSTRAINT keys_enabled_bool CHECK (enabled IN (0,1)),
  CONSTRAINT keys_pools_json CHECK (allowed_pools IS NULL OR
                                   (json_valid(allowed_pools) AND json_type(allowed_pools)='array')),
  CONSTRAINT keys_labels_json CHECK (json_valid(labels) AND json_type(labels)='object' AND length(labels)<=4096),
  CONSTRAINT keys_tombstone_off CHECK (deleted_at IS NULL OR enabled = 0),
  CONSTRAINT keys_expiry_after CHECK (expires_at IS NULL OR expires_at > created_at)
) STRICT;
CREATE INDEX IF NOT EXISTS keys_revision_idx ON keys (revision);
CREATE INDEX IF NOT EXISTS keys_group_live_idx ON keys (key_group) WHERE deleted_at IS NULL;

-- Credentials found by a public id on the wire; today only sigv4 (AccessKeyId -> secret).
CREATE TABLE IF NOT EXISTS credentials (
  id            TEXT NOT NULL PRIMARY KEY,
  key_id        TEXT NOT NULL REFERENCES keys(id) ON DELETE CASCADE ON UPDATE RESTRICT,
  kind          TEXT NOT NULL,
  slot          INTEGER NOT NULL,
  public_id     TEXT NOT NULL,
  secret        TEXT,
  secret_form   TEXT NOT NULL,
  created_at    INTEGER NOT NULL,
  updated_at    INTEGER NOT NULL,
  expires_at    INTEGER,
  revoked_at    INTEGER,
  revoke_reason TEXT,
  revision      INTEGER NOT NULL DEFAULT 0,
  CONSTRAINT cred_kind CHECK (kind IN ('sigv4')),
  CONSTRAINT cred_slot CHECK (slot IN (0,1)),
  CONSTRAINT cred_form CHECK (secret_form IN ('none','recoverable','digest')),
  CONSTRAINT cred_form_null CHECK ((secret_form='none') = (secret IS NULL)),
  CONSTRAINT cred_sigv4_recov CHECK (kind <> 'sigv4' OR secret_form = 'recoverable'),
  CONSTRAINT cred_secret_fmt CHECK (secret IS NULL OR secret GLOB 'v1:?*:?*'),
  CONSTRAINT cred_reason_ord CHECK (revoke_reason IS NULL OR revoked_at IS NOT NULL),
  CONSTRAINT cred_expiry_after CHECK (expires_at IS NULL OR expires_at > created_at)
) STRICT;
CREATE UNIQUE INDEX IF NOT EXISTS cred_public_id_uq ON credentials (kind, public_id);
CREATE UNIQUE INDEX IF NOT EXISTS cred_slot_uq ON credentials (key_id, kind, slot);
CREATE INDEX IF NOT EXISTS cred_revision_idx ON credentials (revision);

-- Revoked token subjects. No foreign key: a revocation is written whatever the key row's state.
CREATE TABLE IF NOT EXISTS denylist (
  sub        TEXT NOT NULL PRIMARY KEY,
  reason     TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL DEFAULT 0
) STRICT, WITHOUT ROWID;

-- The rate-limit ledger: requests on the model '' row, tokens on one row per model.
CREATE TABLE IF NOT EXISTS usage_windows (
  window_start       INTEGER NOT NULL,
  bucket_id          TEXT NOT NULL,
  model              TEXT NOT NULL,
  requests           INTEGER NOT NULL DEFAULT 0,
  billable_requests  INTEGER NOT NULL DEFAULT 0,
  tokens_input       INTEGER NOT NULL DEFAULT 0,
  tokens_output      INTEGER NOT NULL DEFAULT 0,
  tokens_cache_read  INTEGER NOT NULL DEFAULT 0,
  tokens_cache_write INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (window_start, bucket_id, model)
) STRICT, WITHOUT ROWID;

-- The billing ledger: per UTC day (bucket = the day's first epoch second, as text), key,
-- provider and model.
CREATE TABLE IF NOT EXISTS usage_metering (
  bucket             TEXT NOT NULL,
  key_id             TEXT NOT NULL,
  provider           TEXT NOT NULL,
  model              TEXT NOT NULL,
  key_group_at_use   TEXT NOT NULL DEFAULT '',
  pricing_version    TEXT NOT NULL DEFAULT '',
  requests           INTEGER NOT NULL DEFAULT 0,
  billable_requests  INTEGER NOT NULL DEFAULT 0,
  tokens_input       INTEGER NOT NULL DEFAULT 0,
  tokens_output      INTEGER NOT NULL DEFAULT 0,
  tokens_cache_read  INTEGER NOT NULL DEFAULT 0,
  tokens_cache_write INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (bucket, key_id, provider, model)
) STRICT, WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS um_key_bucket_idx ON usage_metering (key_id, bucket);

CREATE TABLE IF NOT EXISTS audit_log (
  seq       INTEGER PRIMARY KEY,
  ts        INTEGER NOT NULL,
  action    TEXT NOT NULL,
  resource  TEXT NOT NULL,
  outcome   TEXT NOT NULL,
  principal TEXT NOT NULL,
  prev_hash TEXT NOT NULL,
  hash      TEXT NOT NULL
) STRICT;
CREATE INDEX IF NOT EXISTS audit_resource_seq_idx ON audit_log (resource, seq);

-- Integrity that holds whatever the connection's pragmas (the sqlite3 shell has foreign keys off).
CREATE TRIGGER IF NOT EXISTS keys_guard_hard_delete BEFORE DELETE ON keys FOR EACH ROW
  WHEN EXISTS (SELECT 1 FROM usage_metering WHERE key_id = OLD.id)
  BEGIN SELECT RAISE(ABORT, 'keys: hard DELETE would orphan usage_metering rows; tombstone the key instead'); END;
CREATE TRIGGER IF NOT EXISTS keys_cascade_credentials AFTER DELETE ON keys FOR EACH ROW
  BEGIN DELETE FROM credentials WHERE key_id = OLD.id; END;
CREATE TRIGGER IF NOT EXISTS audit_log_no_update BEFORE UPDATE ON audit_log
  BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_log_no_delete BEFORE DELETE ON audit_log
  BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;
"""

# Tables of the Rust store's development schemas before v5 (1.5.0 was not released then): the
# Rust store drops them and starts empty; busbar deletes nothing and refuses (see _migrate).
_RUST_PRE_V5 = ("usage_counters", "virtual_keys", "aws_credentials", "usage_ledger")
# The default busy timeout (the Rust store's settings.busy_timeout_ms default): how long a write
# waits for a lock another process holds (the sqlite3 shell, a backup) before failing.
DEFAULT_BUSY_TIMEOUT_MS = 5000
# The Rust writer's page cache (64 MiB), WAL size cap (64 MiB) and checkpoint interval (2000
# pages), and its memory map (256 MiB; none on a path that looks like a network share).
_CACHE_KIB = 65536
_JOURNAL_LIMIT = 64 * 1024 * 1024
_CHECKPOINT_PAGES = 2000
_MMAP = 256 * 1024 * 1024
# Minute and hour windows older than this are deleted (they are never read again: only a
# window's own minute or hour starts a counter); day, month and total windows are kept, as the
# Rust store keeps every row. One sweep an hour at most.
WINDOW_KEEP_SECS = 2 * 86400
PRUNE_EVERY_SECS = 3600


class SqliteStore(MemoryStore):
    """The contract over one SQLite file in the Rust v6 schema. Keys, the denylist and API groups
    are also kept in the memory store's dicts (read without touching the file); usage is read from
    the file. Every write goes to the file in the call that makes it: a key mutation in one
    transaction with synchronous=FULL (as the Rust store writes them), a usage batch in one.

    `config_groups` ({name: GroupRecord}) and `provider_of(model)` (the parent's view of the
    config) are used only to carry the usage of a file of an earlier busbar into the ledger
    (_migrate_busbar_v0)."""

    kind = "sqlite"

    def __init__(self, path: str, busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
                 config_groups=None, provider_of=None):
        super().__init__()
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self.config_groups = config_groups or {}
        self.provider_of = provider_of
        self.db = None
        self._pruned = 0.0

    async def open(self):
        self.open_sync()

    def open_sync(self):
        if self.db is not None:
            return
        d = os.path.dirname(self.path)
        if d:
            os.makedirs(d, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._pragmas(db)
            self._migrate(db)
        except BaseException:
            db.close()
            raise
        self._untrust_schema(db)
        self.db = db
        self._load()

    def _untrust_schema(self, db):
        """trusted_schema=OFF (the Rust store's setting: the schema may call only functions
        marked innocuous), where this SQLite allows it for the schema's own CHECKs: an SQLite
        older than 3.45 does not mark json_valid() innocuous and would refuse every key write;
        there the default (ON) stays. Probed with a key write that is rolled back."""
        db.execute("PRAGMA trusted_schema=OFF")
        db.execute("SAVEPOINT probe")
        try:
            db.execute("INSERT INTO keys (id, name, generation_hash, created_at, updated_at, "
                       "allowed_pools) VALUES ('busbar-probe', '', '', 0, 0, '[]')")
        except sqlite3.OperationalError as e:
            if "unsafe use" not in str(e):
                raise
            db.execute("PRAGMA trusted_schema=ON")
        finally:
            db.execute("ROLLBACK TO probe")
            db.execute("RELEASE probe")

    def _pragmas(self, db):
        """The Rust store's pragma set, busy_timeout first (switching a file to WAL takes a lock)."""
        db.execute("PRAGMA busy_timeout=%d" % int(self.busy_timeout_ms))
        mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError("sqlite: %s could not be switched to WAL (journal_mode=%s); refusing to "
                             "run on a rollback journal" % (self.path, mode))
        db.execute("PRAGMA foreign_keys=ON")
        if db.execute("PRAGMA foreign_keys").fetchone()[0] != 1:
            raise StoreError("sqlite: foreign keys cannot be enabled in this SQLite build")
        # NORMAL in WAL mode: a committed transaction survives a process crash (kill -9); key
        # mutations and usage batches switch to FULL, which survives a power loss too.
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA temp_store=MEMORY")
        db.execute("PRAGMA cache_size=-%d" % _CACHE_KIB)
        db.execute("PRAGMA mmap_size=%d" % (0 if "//" in self.path else _MMAP))
        db.execute("PRAGMA secure_delete=FAST")
        db.execute("PRAGMA recursive_triggers=OFF")
        db.execute("PRAGMA journal_size_limit=%d" % _JOURNAL_LIMIT)
        db.execute("PRAGMA wal_autocheckpoint=%d" % _CHECKPOINT_PAGES)

    # -- schema versions
    def _migrate(self, db):
        """Bring the file to v6 in one transaction: create it; carry a v5 file over as the Rust
        store does; carry a file of an earlier busbar (its own schema) over whole; refuse a newer
        schema and the Rust store's pre-v5 development ones."""
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError("sqlite: %s has store schema v%d, newer than the v%d this busbar "
                             "reads; use the gateway that wrote it, or a newer busbar"
                             % (self.path, version, SCHEMA_VERSION))
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        busbar_v0 = version == 0 and "keys" in tables and "doc" in {
            r[1] for r in db.execute("PRAGMA table_info(keys)")}
        if version < 5 and not busbar_v0 and tables & set(_RUST_PRE_V5):
            raise StoreError(
                "sqlite: %s has a store schema from a development build before Rust busbar 1.5.0 "
                "(v%d); the Rust store would drop it and start empty, and busbar deletes no data: "
                "move the file away to start with an empty store" % (self.path, version))
        now = int(time.time())
        db.execute("BEGIN IMMEDIATE")
        try:
            if busbar_v0:
                for t in ("keys", "groups", "usage"):
                    if t in tables:
                        db.execute("ALTER TABLE %s RENAME TO busbar_v0_%s" % (t, t))
            for stmt in _statements(_TABLES):
                db.execute(stmt)
            db.execute("INSERT INTO store_revision (id, revision) VALUES (0, 0) "
                       "ON CONFLICT (id) DO NOTHING")
            if busbar_v0:
                self._migrate_busbar_v0(db, tables, now)
            elif 0 < version < 6:
                # v5 -> v6, as the Rust store does it once: a v5 row whose billable count was
                # never split from the admitted one gets it.
                db.execute("UPDATE usage_windows SET billable_requests = requests "
                           "WHERE model = '' AND billable_requests = 0 AND requests > 0")
                db.execute("UPDATE usage_metering SET billable_requests = requests "
                           "WHERE billable_requests = 0 AND requests > 0")
            db.execute("PRAGMA user_version=%d" % SCHEMA_VERSION)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if busbar_v0:
            log.info("governance: %s carried over from busbar's earlier store schema to the Rust "
                     "gateway's (v%d)", self.path, SCHEMA_VERSION)

    def _migrate_busbar_v0(self, db, tables, now):
        """busbar's own earlier file (tables keys(id, aws, doc), groups(name, doc), usage(day, ...))
        into v6, keeping every key, group and count: keys become keys rows (revoked ones on the
        denylist), AWS pairs sigv4 credentials, groups store_meta rows, usage metering rows and
        the ledger windows it implies (a key's total; its groups' day, month and total windows,
        for the config's groups and the file's; minute and hour windows were never kept)."""
        groups = {}
        if "groups" in tables:
            for name, doc in db.execute("SELECT name, doc FROM busbar_v0_groups"):
                g = group_from_dict(orjson.loads(doc))
                groups[g.name] = g
                db.execute("INSERT INTO store_meta (k, v) VALUES (?, ?)", (GROUP_META + name, doc))
        for (doc,) in db.execute("SELECT doc FROM busbar_v0_keys").fetchall():
            d = orjson.loads(doc)
            rec = KeyRecord(d["id"], d.get("name") or "", d.get("group"), d.get("allowed_pools"),
                            d.get("state") or "active", d.get("created") or now, d.get("expires"),
                            str(d.get("gen")) if d.get("gen") is not None else None,
                            d.get("aws_access_key_id"), d.get("aws_secret"), None,
                            d.get("labels") or {})
            if rec.expires is not None and rec.expires <= rec.created:
                rec.expires = None
            if rec.state == "tombstoned":
                rec.deleted = now
                rec.aws_access_key_id = rec.aws_secret = None
            if rec.aws_access_key_id and not rec.aws_secret:
                rec.aws_access_key_id = None
            if rec.aws_access_key_id:
                rec.aws_cred_id = new_credential_id()
            self._write_key(db, rec, now)
        if "usage" in tables:
            lookup = dict(groups, **self.config_groups).get
            rows = []
            for row in db.execute("SELECT day, key_id, grp, model, pool, requests, input_tokens, "
                                  "output_tokens, cache_read_tokens, cache_write_tokens "
                                  "FROM busbar_v0_usage"):
                day, kid, grp, model, pool = (x if x != "" else None for x in row[:5])
                u = Usage(day, kid, grp, model, pool, *row[5:])
                u.provider = (self.provider_of(model) if self.provider_of and model else "") or ""
                rows.append(u)

            def buckets(group, pool):
                # Day, month and total windows only: those are what busbar kept per day.
                return [(b, per) for b, per in ledger_buckets(group, pool, lookup)
                        if per in ("day", "month", "total")]
            self._write_usage(db, rows, window_deltas(rows, buckets, now))
        for t in ("keys", "groups", "usage"):
            if t in tables:
                db.execute("DROP TABLE busbar_v0_%s" % t)

    def _load(self):
        db = self.db
        now = time.time()
        denied = dict(db.execute("SELECT sub, reason FROM denylist"))
        creds = {}
        for row in db.execute("SELECT id, key_id, kind, slot, public_id, secret, created_at, "
                              "updated_at, expires_at, revoked_at, revoke_reason, revision "
                              "FROM credentials WHERE kind = 'sigv4' ORDER BY slot"):
            cred = _cred_of_row(row)
            if credential_live(cred["meta"], now) or row[1] not in creds:
                creds[row[1]] = cred
        self.denylist = denied
        for row in db.execute("SELECT id, generation_hash, name, allowed_pools, enabled, "
                              "created_at, key_group, labels, expires_at, deleted_at, revision "
                              "FROM keys ORDER BY created_at"):
            rec = record_of(_vk_of_row(row), row[0] in denied, creds.get(row[0]), now)
            self.keys[rec.id] = rec
            if rec.aws_access_key_id and rec.state not in ("revoked", "tombstoned"):
                self.aws[rec.aws_access_key_id] = rec.id
        for (v,) in db.execute("SELECT v FROM store_meta WHERE substr(k, 1, ?) = ?",
                               (len(GROUP_META), GROUP_META)):
            g = group_from_dict(orjson.loads(v))
            self.groups[g.name] = g

    async def close(self):
        if self.db is not None:
            self.db.close()
            self.db = None

    # -- keys
    def _tx_full(self):
        """A write transaction at synchronous=FULL (set outside it: SQLite refuses inside)."""
        return _FullSync(self.db)

    def _write_key(self, db, rec, now):
        """The rows of one key, inside the caller's transaction: the keys row (revision bumped),
        the denylist entry of a revoked or deleted key, its sigv4 credential (revoked with the
        key, destroyed with a tombstone)."""
        rev = db.execute("UPDATE store_revision SET revision = revision + 1 WHERE id = 0 "
                         "RETURNING revision").fetchone()[0]
        rec.revision = rev
        old = db.execute("SELECT deleted_at FROM keys WHERE id = ?", (rec.id,)).fetchone()
        if old is not None and old[0] is not None and rec.state != "tombstoned":
            raise StoreError("key %s is deleted (tombstoned); it cannot be written back" % rec.id)
        tomb = rec.state == "tombstoned"
        deleted = int(rec.deleted or now) if tomb else None
        db.execute(
            "INSERT INTO keys (id, generation_hash, name, allowed_pools, enabled, created_at, "
            "key_group, labels, expires_at, deleted_at, updated_at, revision) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
            "generation_hash = excluded.generation_hash, name = excluded.name, "
            "allowed_pools = excluded.allowed_pools, enabled = excluded.enabled, "
            "key_group = excluded.key_group, labels = excluded.labels, "
            "expires_at = excluded.expires_at, deleted_at = excluded.deleted_at, "
            "updated_at = ?, revision = excluded.revision",
            (rec.id, generation_marker(rec.id, rec.gen), rec.name,
             orjson.dumps(rec.allowed_pools).decode() if rec.allowed_pools is not None else None,
             1 if rec.state == "active" else 0, int(rec.created or now), rec.group,
             orjson.dumps(rec.labels or {}, option=orjson.OPT_SORT_KEYS).decode(),
             int(rec.expires) if rec.expires else None, deleted, int(rec.created or now), rev, now))
        if rec.state in ("revoked", "tombstoned"):
            db.execute("INSERT INTO denylist (sub, reason, created_at) VALUES (?, ?, ?) "
                       "ON CONFLICT (sub) DO NOTHING",
                       (rec.id, "deleted" if tomb else "revoked", now))
        if tomb:
            db.execute("DELETE FROM credentials WHERE key_id = ?", (rec.id,))
            return
        cur = db.execute("SELECT id, public_id, revoked_at FROM credentials "
                         "WHERE key_id = ? AND kind = 'sigv4' AND slot = 0", (rec.id,)).fetchone()
        if rec.state == "revoked":
            db.execute("UPDATE credentials SET revoked_at = ?, revoke_reason = 'revoked', "
                       "updated_at = ?, revision = ? WHERE key_id = ? AND revoked_at IS NULL",
                       (now, now, rev, rec.id))
            return
        if not rec.aws_access_key_id or not rec.aws_secret:
            return
        if cur is not None and cur[1] == rec.aws_access_key_id and cur[2] is None:
            return                  # the same live pair, already stored
        if rec.aws_cred_id is None or (cur is not None and cur[0] == rec.aws_cred_id
                                       and cur[1] != rec.aws_access_key_id):
            rec.aws_cred_id = new_credential_id()
        db.execute(
            "INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, "
            "created_at, updated_at, expires_at, revoked_at, revoke_reason, revision) "
            "VALUES (?, ?, 'sigv4', 0, ?, ?, 'recoverable', ?, ?, NULL, NULL, NULL, ?) "
            "ON CONFLICT (key_id, kind, slot) DO UPDATE SET id = excluded.id, "
            "public_id = excluded.public_id, secret = excluded.secret, "
            "created_at = excluded.created_at, updated_at = excluded.updated_at, "
            "expires_at = NULL, revoked_at = NULL, revoke_reason = NULL, "
            "revision = excluded.revision",
            (rec.aws_cred_id, rec.id, rec.aws_access_key_id, PLAIN_SECRET + rec.aws_secret,
             now, now, rev))

    async def put_key(self, rec):
        self._check_revival(rec)
        now = int(time.time())
        with self._tx_full() as db:
            self._write_key(db, rec, now)
        self._put_key_mem(rec)

    async def delete_key(self, key_id):
        now = int(time.time())
        rec = self.keys.get(key_id)
        if rec is None:
            raise StoreError("no key %s" % key_id)
        if rec.state == "tombstoned":
            return
        gone = KeyRecord.from_dict(rec.to_dict())
        gone.state, gone.deleted = "tombstoned", now
        with self._tx_full() as db:
            self._write_key(db, gone, now)
        self._tombstone_mem(key_id, now)
        self.keys[key_id].revision = gone.revision

    # -- groups
    def put_group_sync(self, rec):
        self.db.execute("INSERT INTO store_meta (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE "
                        "SET v = excluded.v",
                        (GROUP_META + rec.name, orjson.dumps(group_to_dict(rec)).decode()))
        MemoryStore.put_group_sync(self, rec)

    def delete_group_sync(self, name):
        self.db.execute("DELETE FROM store_meta WHERE k = ?", (GROUP_META + name,))
        MemoryStore.delete_group_sync(self, name)

    # -- audit: the v6 schema's audit_log, append-only (its triggers refuse UPDATE and DELETE)
    _AUDIT_COLS = "seq, ts, action, resource, outcome, principal, prev_hash, hash"

    def append_audit_sync(self, rec: dict):
        self.db.execute("INSERT INTO audit_log (%s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)" % self._AUDIT_COLS,
                        (rec["seq"], rec["ts"], rec["action"], rec["resource"], rec["outcome"],
                         rec["principal"], rec["prev_hash"], rec["hash"]))

    def audit_tail_sync(self):
        row = self.db.execute("SELECT %s FROM audit_log ORDER BY seq DESC LIMIT 1"
                              % self._AUDIT_COLS).fetchone()
        return None if row is None else dict(zip(self._AUDIT_COLS.split(", "), row))

    def list_audit_sync(self):
        cols = self._AUDIT_COLS.split(", ")
        return [dict(zip(cols, r)) for r in self.db.execute(
            "SELECT %s FROM audit_log ORDER BY seq" % self._AUDIT_COLS)]

    # -- usage
    def _write_usage(self, db, rows, windows):
        merged = {}
        for u in rows:
            k = _metering_key(u)
            cur = merged.get(k)
            if cur is None:
                merged[k] = [u.group or ""] + [getattr(u, f) for f in USAGE_FIELDS]
            else:
                for i, f in enumerate(USAGE_FIELDS):
                    cur[i + 1] += getattr(u, f)
        if merged:
            db.executemany(
                "INSERT INTO usage_metering (bucket, key_id, provider, model, key_group_at_use, "
                "pricing_version, requests, tokens_input, tokens_output, tokens_cache_read, "
                "tokens_cache_write, billable_requests) VALUES (?, ?, ?, ?, ?, '', ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (bucket, key_id, provider, model) DO UPDATE SET "
                "requests = requests + excluded.requests, "
                "billable_requests = billable_requests + excluded.billable_requests, "
                "tokens_input = tokens_input + excluded.tokens_input, "
                "tokens_output = tokens_output + excluded.tokens_output, "
                "tokens_cache_read = tokens_cache_read + excluded.tokens_cache_read, "
                "tokens_cache_write = tokens_cache_write + excluded.tokens_cache_write",
                [(str(b), kid, prov, model, v[0], *v[1:]) for (b, kid, prov, model), v in merged.items()])
        heads, tokens = [], []
        for (bid, start), (req, bill, models) in (windows or {}).items():
            heads.append((start, bid, req, bill))
            for m, t in models.items():
                tokens.append((start, bid, m, *t))
        if heads:
            db.executemany(
                "INSERT INTO usage_windows (window_start, bucket_id, model, requests, "
                "billable_requests) VALUES (?, ?, '', MAX(0, ?), MAX(0, ?)) "
                "ON CONFLICT (window_start, bucket_id, model) DO UPDATE SET "
                "requests = MAX(0, requests + excluded.requests), "
                "billable_requests = MAX(0, billable_requests + excluded.billable_requests)", heads)
        if tokens:
            db.executemany(
                "INSERT INTO usage_windows (window_start, bucket_id, model, tokens_input, "
                "tokens_output, tokens_cache_read, tokens_cache_write) VALUES (?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (window_start, bucket_id, model) DO UPDATE SET "
                "tokens_input = tokens_input + excluded.tokens_input, "
                "tokens_output = tokens_output + excluded.tokens_output, "
                "tokens_cache_read = tokens_cache_read + excluded.tokens_cache_read, "
                "tokens_cache_write = tokens_cache_write + excluded.tokens_cache_write", tokens)

    async def add_usage(self, rows, windows=None):
        if not rows and not windows:
            return
        with self._tx_full() as db:
            self._write_usage(db, rows, windows)
        now = time.time()
        if now - self._pruned >= PRUNE_EVERY_SECS:
            self._pruned = now
            self.prune_windows(now)

    def prune_windows(self, now: float) -> int:
        """Deletes minute and hour windows that ended more than WINDOW_KEEP_SECS ago."""
        cur = self.db.execute(
            "DELETE FROM usage_windows WHERE window_start < ? AND (bucket_id GLOB '*@minute' OR "
            "bucket_id GLOB '*@minute#*' OR bucket_id GLOB '*@hour' OR bucket_id GLOB '*@hour#*')",
            (int(now) - WINDOW_KEEP_SECS,))
        return cur.rowcount

    async def usage_rows(self, day=None):
        sql = ("SELECT bucket, key_id, key_group_at_use, model, provider, requests, tokens_input, "
               "tokens_output, tokens_cache_read, tokens_cache_write, billable_requests "
               "FROM usage_metering")
        args = ()
        if day is not None:
            sql += " WHERE bucket = ?"
            args = (str(day_epoch(day)),)
        sql += " ORDER BY CAST(bucket AS INTEGER), key_id, provider, model"
        return [_usage_row(r[0], r[1], r[2], r[3], r[4], r[5:]) for r in self.db.execute(sql, args)]

    async def usage_totals(self):
        out = []
        for kid, grp, model, *counts in self.db.execute(
                "SELECT key_id, key_group_at_use, model, SUM(requests), SUM(tokens_input), "
                "SUM(tokens_output), SUM(tokens_cache_read), SUM(tokens_cache_write), "
                "SUM(billable_requests) FROM usage_metering GROUP BY key_id, key_group_at_use, model"):
            row = {"day": None, "key_id": kid, "group": grp or None, "model": model, "provider": None}
            row.update(zip(USAGE_FIELDS, counts))
            out.append(row)
        return out

    def window(self, bucket_id, start):
        requests = billable = 0
        models = {}
        for m, req, bill, inp, out, cr, cw in self.db.execute(
                "SELECT model, requests, billable_requests, tokens_input, tokens_output, "
                "tokens_cache_read, tokens_cache_write FROM usage_windows "
                "WHERE window_start = ? AND bucket_id = ?", (int(start), bucket_id)):
            if m == "":
                requests, billable = max(0, req), max(0, bill)
            else:
                models[m] = [max(0, inp), max(0, out), max(0, cr), max(0, cw)]
        return requests, billable, models


class _FullSync:
    """`with _FullSync(db) as db:` one BEGIN IMMEDIATE ... COMMIT at synchronous=FULL (a key
    mutation or a usage batch survives a power loss), NORMAL again afterwards whatever happened."""

    def __init__(self, db):
        self.db = db

    def __enter__(self):
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, exc, tb):
        try:
            self.db.execute("COMMIT" if exc_type is None else "ROLLBACK")
        finally:
            self.db.execute("PRAGMA synchronous=NORMAL")
        return False


def _statements(script: str):
    """The statements of a DDL script, to run one by one inside a transaction (sqlite3's
    executescript would COMMIT first); comment lines left out."""
    out, cur = [], []
    for line in script.splitlines():
        if not line.strip() or line.lstrip().startswith("--"):
            continue
        cur.append(line)
        if sqlite3.complete_statement("\n".join(cur)):
            out.append("\n".join(cur))
            cur = []
    return out


def open_store(store_config, config_groups=None, provider_of=None):
    """The parent's store object for a StoreConfig (not yet opened)."""
    kind = store_config.kind
    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SqliteStore(store_config.path, store_config.busy_timeout_ms, config_groups,
                           provider_of)
    if kind == "postgres":
        from .postgres_store import PostgresStore
        return PostgresStore(store_config.url, store_config.socket_timeout_secs)
    from .redis_store import RedisStore
    return RedisStore(store_config.url)
