"""Governance in PostgreSQL (`store: {module: postgres, settings: {url}}`), in the schema of the Rust
gateway's postgres store (GetBusbar/store-postgres, schema version 6), so both gateways can share
one database during a rolling swap; one budget and one rate limit, exact across a fleet of busbar
gateways (N instances x M workers on one database).

Three objects, all talking to the same database through asyncpg (a Cython driver on the worker's
own event loop; every statement is prepared once per connection and reused):

- `PostgresStore` (the parent, admin API): keys, credentials, the denylist, groups and usage, in the
  store contract of busbar/governance/store.py; every change sends a NOTIFY on the invalidation
  channel inside the transaction that writes it (delivered at its commit).
- `PostgresLedger` (every worker, hot path): admission is ONE statement, `SELECT
  busbar_admit_v2(...)`, a server-side function that locks the ledger rows of the request's
  buckets in one global order, tests every check of the request and charges all of them or none;
  the admissions asked for in one event-loop turn go in one statement together
  (`busbar_admit_batch_v2`: the batch's rows locked in that order first, then each request in
  turn, all or nothing);
  settlement is ONE statement per batch, `SELECT busbar_settle_v2(...)`, sent in the background
  (the settles made while one is in flight go in the next). Its connections are a set of its own
  (`_Conns`), not asyncpg's pool, whose reset query on release would be one more round trip per
  use (busbar leaves no session state on these connections: no LISTEN, SET, cursor or advisory
  lock outlives a call) and whose acquire/release cost ~360 bytecodes a call; the directory's pool
  skips the reset query likewise.
- `PostgresDirectory` (every worker): key and group policy cached per worker, dropped on the
  invalidation NOTIFY (a LISTEN connection of its own), and read again after POLICY_TTL at the
  latest (a Rust gateway sharing the database sends none: its revocations are seen that late).

The Rust tables (busbar writes and reads them as the Rust store does; see SCHEMA):
    busbar_schema (version)          6
    store_revision                   the counter stamped into key and credential rows
    keys, credentials, denylist      a key (`generation_hash` = `binding:<id>:<generation>`), its
                                     AWS pair (kind sigv4, slot 0, `v1:plain:<secret>`), revocations
    usage_windows, usage_ledger      per bucket and window: requests and 2xx requests; tokens per
                                     model and tier (a key's own bucket: its id, window 0; a
                                     group's: `group:<name>@<per>[#pool:<pool>]`, the window start)
    usage_metering                   per key, UTC day (`bucket`, its first second), model, provider
    audit_log                        the admin audit log, hash-chained (busbar/admin/audit.py)
busbar's own (the Rust store reads none of them; its CREATE ... IF NOT EXISTS leaves them alone):
    busbar_groups (name, doc)        groups made through the admin API (JSON)
    busbar_inflight                  per ledger bucket and window: budget reservations in flight
    busbar_concurrency               per group: requests in flight (a concurrent limit)
    busbar_admit_v2(), busbar_settle_v2()  the admission and settlement functions (FUNCTIONS_
                                     VERSION 2; version 1, busbar_admit/busbar_settle, is left
                                     for busbar gateways of the version before during an upgrade)
    NOTIFY channel busbar_inval      "key:<id>", "group:<name>", "all"

The limits: requests are the ledger's `requests` of the bucket's window; tokens its tokens of all
four tiers (as the Rust ledger's total); a budget its tokens priced at the current rate card plus
the reservations in flight; what a Rust node has flushed to the ledger counts here too. Lock order,
the same in every function (so no two transactions wait on each other in a cycle): usage_windows
rows, then busbar_concurrency, then busbar_inflight, then usage_ledger, then usage_metering, each
table's rows in byte order of their key.

Unreachable database (refused, reset, or no answer within `timeout`): admission answers
"unavailable" (the engine's 503: fail closed, as the Rust store has no other mode) and the admin
API a 503 naming the URL without its password. Settles are never dropped: a batch that could not be
written is kept and sent again (merged with the later ones) every PROBE_INTERVAL; a batch that
failed after it was sent is ambiguous (the database may have applied it) and is sent again, so an
outage can over-count, never under-count. Counts never go below 0.

asyncpg is imported only when one of these objects is started, so a gateway without Postgres pays
nothing for it. No connection is made before `start()`/`open()`.
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
import math
import time
from operator import itemgetter

import orjson

from busbar.governance.model import (
    C_BUCKET, C_GROUP, C_KIND, C_LIMIT, C_WINDOW, PLAIN_SECRET, USAGE_FIELDS, GroupRecord,
    KeyRecord, StoreError, Usage, credential_live, day_epoch, generation_marker, group_from_dict,
    group_to_dict, new_credential_id, record_of)
from busbar.governance.redis_store import (
    UNAVAILABLE, PolicyCache, StoreUnavailable, _denial, _log_error)

log = logging.getLogger("busbar.governance")

SCHEMA_VERSION = 6
# busbar's own functions' version, in their names (busbar_admit_v2): they are (re)created at every
# boot (CREATE OR REPLACE), and a new version gets new names, so gateways of both versions run side
# by side on one database during an upgrade.
FUNCTIONS_VERSION = 2
CHANNEL = "busbar_inval"
# Every statement's deadline, seconds (settings.timeout_ms): an admission waiting on a contended
# ledger row for longer than this is answered 503 rather than holding the client. 5 s: far past
# any lock wait a healthy database has (an admission holds its rows for well under a millisecond).
DEFAULT_TIMEOUT = 5.0
# Connections per worker (settings.pool_size): an admission batch or a settlement batch holds one
# for one round trip (~0.3 ms on loopback; pool size - 1 send admissions, one is left for the
# settlements), so 4 serve thousands of admissions a second per worker,
# and 4 x (instances x workers) stays well within a server's max_connections (100 by default).
DEFAULT_POOL_SIZE = 4
# Admissions in one statement at most (busbar_admit_batch_v2): a batch holds its ledger rows for
# its whole transaction (~10-30 us of database work per request), so 64 keep one well under a few
# milliseconds, and a worker's senders (pool size - 1) take 192 per round trip, past what one
# event-loop turn gathers.
ADMIT_BATCH_MAX = 64
# A ledger connection idle longer than this is closed instead of used (asyncpg's pool did the
# same at 60 s): a server's idle_session_timeout or a proxy may have dropped it, and a statement
# sent on a dead connection is a batch answered 503.
IDLE_SECS = 60.0
PROBE_INTERVAL = 0.2            # while the database is unreachable, how often it is asked again
LISTEN_PING = 2.0               # the invalidation connection is checked this often
# A cached key or group is read again after redis_store.POLICY_TTL (5 s) even without a NOTIFY:
# a Rust gateway sharing the database notifies nothing (the Rust side re-reads its denylist every
# 5 s, REVOCATION_SYNC_TTL_SECS, so a revocation reaches either gateway as late).
# Minute and hour windows older than this are deleted by the parent (never read again), once an
# hour at most; day, month and total windows are kept, as the Rust store keeps every row.
WINDOW_KEEP_SECS = 2 * 86400
PRUNE_EVERY_SECS = 3600
# The Rust store's migration lock (pg_advisory_lock key, ASCII "busbar_p"): a busbar and a Rust
# gateway booting on one database at once create the schema one after the other.
MIGRATE_LOCK_KEY = 0x6275_7362_6172_5f70

_KIND_CODE = {"requests": "r", "tokens": "t", "budget_usd": "b", "concurrent": "c"}

# ---------------------------------------------------------------------------- the schema
# The Rust store's tables, columns and constraints (store-postgres/src/lib.rs, SCHEMA_VERSION 6);
# CREATE ... IF NOT EXISTS, so a database the Rust gateway made is taken as it is.
RUST_SCHEMA = """
CREATE TABLE IF NOT EXISTS busbar_schema (version BIGINT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS store_revision (
  only_row BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (only_row),
  revision BIGINT NOT NULL DEFAULT 0 CHECK (revision >= 0)
);
INSERT INTO store_revision (only_row, revision) VALUES (TRUE, 0) ON CONFLICT (only_row) DO NOTHING;
CREATE TABLE IF NOT EXISTS keys (
  id              TEXT PRIMARY KEY,
  generation_hash TEXT NOT NULL,
  name            TEXT NOT NULL,
  allowed_pools   TEXT,
  enabled         BOOLEAN NOT NULL DEFAULT TRUE,
  created_at      BIGINT NOT NULL,
  key_group       TEXT,
  labels          TEXT NOT NULL DEFAULT '{}',
  expires_at      BIGINT,
  deleted_at      BIGINT,
  revision        BIGINT NOT NULL DEFAULT 0,
  CONSTRAINT keys_tombstone_disabled CHECK (deleted_at IS NULL OR enabled = FALSE)
);
CREATE INDEX IF NOT EXISTS idx_keys_revision ON keys (revision);
CREATE TABLE IF NOT EXISTS credentials (
  id            TEXT PRIMARY KEY,
  key_id        TEXT NOT NULL REFERENCES keys(id) ON DELETE CASCADE,
  kind          TEXT NOT NULL CHECK (kind IN ('sigv4')),
  slot          SMALLINT NOT NULL CHECK (slot IN (0, 1)),
  public_id     TEXT NOT NULL,
  secret        TEXT,
  secret_form   TEXT NOT NULL CHECK (secret_form IN ('none', 'recoverable', 'digest')),
  created_at    BIGINT NOT NULL,
  updated_at    BIGINT NOT NULL,
  expires_at    BIGINT,
  revoked_at    BIGINT,
  revoke_reason TEXT,
  revision      BIGINT NOT NULL DEFAULT 0,
  CONSTRAINT credentials_public_id_uniq UNIQUE (kind, public_id),
  CONSTRAINT credentials_slot_uniq UNIQUE (key_id, kind, slot),
  CONSTRAINT credentials_secret_form_matches CHECK ((secret_form = 'none') = (secret IS NULL))
);
CREATE INDEX IF NOT EXISTS idx_credentials_revision ON credentials (revision);
CREATE INDEX IF NOT EXISTS idx_credentials_key_id ON credentials (key_id);
CREATE TABLE IF NOT EXISTS usage_windows (
  bucket_id         TEXT NOT NULL,
  window_start      BIGINT NOT NULL,
  requests          BIGINT NOT NULL DEFAULT 0,
  billable_requests BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (bucket_id, window_start)
);
CREATE TABLE IF NOT EXISTS usage_ledger (
  bucket_id          TEXT NOT NULL,
  window_start       BIGINT NOT NULL,
  model              TEXT NOT NULL,
  tokens_input       BIGINT NOT NULL DEFAULT 0,
  tokens_output      BIGINT NOT NULL DEFAULT 0,
  tokens_cache_read  BIGINT NOT NULL DEFAULT 0,
  tokens_cache_write BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (bucket_id, window_start, model)
);
CREATE TABLE IF NOT EXISTS usage_metering (
  key_id             TEXT NOT NULL,
  bucket             BIGINT NOT NULL,
  model              TEXT NOT NULL,
  provider           TEXT NOT NULL,
  tokens_input       BIGINT NOT NULL DEFAULT 0,
  tokens_output      BIGINT NOT NULL DEFAULT 0,
  tokens_cache_read  BIGINT NOT NULL DEFAULT 0,
  tokens_cache_write BIGINT NOT NULL DEFAULT 0,
  requests           BIGINT NOT NULL DEFAULT 0,
  billable_requests  BIGINT NOT NULL DEFAULT 0,
  key_group_at_use   TEXT NOT NULL DEFAULT '',
  pricing_version    TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (key_id, bucket, model, provider)
);
CREATE INDEX IF NOT EXISTS idx_usage_metering_bucket ON usage_metering (bucket);
CREATE TABLE IF NOT EXISTS audit_log (
  seq       BIGINT PRIMARY KEY,
  ts        BIGINT NOT NULL,
  action    TEXT NOT NULL,
  resource  TEXT NOT NULL,
  outcome   TEXT NOT NULL,
  principal TEXT NOT NULL,
  prev_hash TEXT NOT NULL,
  hash      TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS denylist (
  sub        TEXT PRIMARY KEY,
  reason     TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL DEFAULT 0
);
"""

# busbar's own tables and functions (see the module doc).
BUSBAR_SCHEMA = r"""
CREATE TABLE IF NOT EXISTS busbar_groups (
  name TEXT PRIMARY KEY,
  doc  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS busbar_inflight (
  bucket_id    TEXT NOT NULL,
  window_start BIGINT NOT NULL,
  reserved     BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (bucket_id, window_start)
);
CREATE TABLE IF NOT EXISTS busbar_concurrency (
  group_name TEXT PRIMARY KEY,
  in_flight  BIGINT NOT NULL DEFAULT 0
);

-- busbar's functions are versioned by name (FUNCTIONS_VERSION): a new version is created next to
-- the old one, so busbar gateways of either version can share the database during an upgrade (the
-- functions agree on the tables, their meaning and the lock order).
--
-- Admission. b_*: the request's ledger buckets (sorted), b_budget 1 for a bucket a budget is
-- checked on (it is charged `reserve`, nano-units); g_names: the groups whose concurrent limit
-- applies (sorted); k_*: the checks (kind r|t|b|c, index into b_* or g_names, limit); r_*: the
-- rate card, nano-units per token. Returns {0, v1..vn}: admitted and charged, each check's value
-- before; {i, v1..vi}: check i (1-based) failed, nothing charged.
-- Each bucket's request count is charged first (an upsert that locks the row, in order: from
-- then on no other admission of these buckets runs, and each later statement reads what
-- committed before), then every check is tested; a failed check takes the charges back in the
-- same transaction, so nothing of it is ever seen.
CREATE OR REPLACE FUNCTION busbar_admit_v2(
  b_ids TEXT[], b_starts BIGINT[], b_budget INT[], g_names TEXT[],
  k_kind TEXT[], k_idx INT[], k_limit BIGINT[],
  r_models TEXT[], r_in FLOAT8[], r_out FLOAT8[], r_cr FLOAT8[], r_cw FLOAT8[], reserve BIGINT)
RETURNS BIGINT[] LANGUAGE plpgsql AS $fn$
DECLARE
  nb INT := coalesce(array_length(b_ids, 1), 0);
  ng INT := coalesce(array_length(g_names, 1), 0);
  req BIGINT[];
  conc BIGINT[];
  res BIGINT[] := ARRAY[0]::BIGINT[];
  got BIGINT;
  v FLOAT8;
  i INT;
  failed INT := 0;
BEGIN
  FOR i IN 1..nb LOOP
    INSERT INTO usage_windows AS w (bucket_id, window_start, requests, billable_requests)
      VALUES (b_ids[i], b_starts[i], 1, 1)
      ON CONFLICT (bucket_id, window_start) DO UPDATE
      SET requests = w.requests + 1, billable_requests = w.billable_requests + 1
      RETURNING w.requests - 1 INTO got;
    req[i] := greatest(got, 0);
  END LOOP;
  FOR i IN 1..ng LOOP
    INSERT INTO busbar_concurrency AS c (group_name, in_flight) VALUES (g_names[i], 1)
      ON CONFLICT (group_name) DO UPDATE SET in_flight = greatest(c.in_flight, 0) + 1
      RETURNING c.in_flight - 1 INTO got;
    conc[i] := got;
  END LOOP;
  FOR k IN 1..coalesce(array_length(k_kind, 1), 0) LOOP
    i := k_idx[k];
    IF k_kind[k] = 'r' THEN
      res := res || req[i];
      IF req[i] + 1 > k_limit[k] THEN failed := k; EXIT; END IF;
    ELSIF k_kind[k] = 'c' THEN
      res := res || conc[i];
      IF conc[i] + 1 > k_limit[k] THEN failed := k; EXIT; END IF;
    ELSIF k_kind[k] = 't' THEN
      SELECT coalesce(sum(greatest(tokens_input, 0) + greatest(tokens_output, 0) +
                          greatest(tokens_cache_read, 0) + greatest(tokens_cache_write, 0)), 0)
        INTO got FROM usage_ledger WHERE bucket_id = b_ids[i] AND window_start = b_starts[i];
      res := res || got;
      IF got >= k_limit[k] THEN failed := k; EXIT; END IF;
    ELSE
      -- one statement: the reservations and the tokens read in one snapshot
      SELECT coalesce((SELECT greatest(reserved, 0) FROM busbar_inflight
                        WHERE bucket_id = b_ids[i] AND window_start = b_starts[i]), 0)
           + coalesce((SELECT sum(greatest(l.tokens_input, 0) * r.ri +
                                  greatest(l.tokens_output, 0) * r.ro +
                                  greatest(l.tokens_cache_read, 0) * r.rr +
                                  greatest(l.tokens_cache_write, 0) * r.rw)
                         FROM usage_ledger l
                         JOIN unnest(r_models, r_in, r_out, r_cr, r_cw) AS r(m, ri, ro, rr, rw)
                           ON r.m = l.model
                        WHERE l.bucket_id = b_ids[i] AND l.window_start = b_starts[i]), 0)
        INTO v;
      res := res || floor(v)::BIGINT;
      IF v + reserve > k_limit[k] THEN failed := k; EXIT; END IF;
    END IF;
  END LOOP;
  IF failed > 0 THEN
    IF nb > 0 THEN
      UPDATE usage_windows w
        SET requests = w.requests - 1, billable_requests = w.billable_requests - 1
        FROM unnest(b_ids, b_starts) AS t(b, s) WHERE w.bucket_id = t.b AND w.window_start = t.s;
    END IF;
    IF ng > 0 THEN
      UPDATE busbar_concurrency SET in_flight = in_flight - 1 WHERE group_name = ANY(g_names);
    END IF;
    res[1] := failed;
    RETURN res;
  END IF;
  IF reserve > 0 THEN
    FOR i IN 1..nb LOOP
      IF b_budget[i] > 0 THEN
        INSERT INTO busbar_inflight AS f (bucket_id, window_start, reserved)
          VALUES (b_ids[i], b_starts[i], reserve)
          ON CONFLICT (bucket_id, window_start)
          DO UPDATE SET reserved = greatest(f.reserved, 0) + reserve;
      END IF;
    END LOOP;
  END IF;
  RETURN res;
END
$fn$;

-- Admission of a batch (the requests a worker admits in one event-loop turn, one round trip and
-- one transaction). u_*: every ledger bucket and concurrency group of the batch (sorted): their
-- rows are locked first, in that one global order (made when missing), and their counts read
-- (from then on no other admission of these buckets runs); then, in one statement after the
-- locks, every bucket's tokens, spend at the card and reservations. The requests are then
-- decided one after another in memory, in the order of the arrays, each all or nothing against
-- the counts as the requests before it left them, exactly as busbar_admit_v2 would one by one;
-- the charges of the admitted ones are written at the end, one statement per table.
-- Per request j: n_checks[j] checks in c_* (kind r|t|b|c, index into u_ids or u_groups, limit),
-- n_buckets[j] buckets in q_* (index into u_ids; 1 if it is charged the reservation), n_groups[j]
-- groups in h_idx, its reservation reserve[j]. Returns each request's status: 0 admitted, else
-- its failed check (1-based, in its own checks).
CREATE OR REPLACE FUNCTION busbar_admit_batch_v2(
  u_ids TEXT[], u_starts BIGINT[], u_groups TEXT[],
  n_checks INT[], c_kind TEXT[], c_idx INT[], c_limit BIGINT[],
  n_buckets INT[], q_idx INT[], q_budget INT[], n_groups INT[], h_idx INT[], reserve BIGINT[],
  r_models TEXT[], r_in FLOAT8[], r_out FLOAT8[], r_cr FLOAT8[], r_cw FLOAT8[])
RETURNS INT[] LANGUAGE plpgsql AS $fn$
DECLARE
  nu INT := coalesce(array_length(u_ids, 1), 0);
  ng INT := coalesce(array_length(u_groups, 1), 0);
  req BIGINT[];
  conc BIGINT[];
  tok BIGINT[];
  spend FLOAT8[];
  d_req BIGINT[] := array_fill(0::BIGINT, ARRAY[nu]);
  d_res BIGINT[] := array_fill(0::BIGINT, ARRAY[nu]);
  d_conc BIGINT[] := array_fill(0::BIGINT, ARRAY[ng]);
  res INT[] := '{}';
  c INT := 0;
  q INT := 0;
  h INT := 0;
  failed INT;
  i INT;
BEGIN
  IF nu > 0 THEN
    WITH up AS (
      INSERT INTO usage_windows AS w (bucket_id, window_start)
        SELECT b, s FROM unnest(u_ids, u_starts) AS t(b, s)
        ON CONFLICT (bucket_id, window_start) DO UPDATE SET requests = w.requests
        RETURNING w.bucket_id, w.window_start, w.requests)
    SELECT array_agg(greatest(up.requests, 0) ORDER BY t.o) INTO req
      FROM unnest(u_ids, u_starts) WITH ORDINALITY AS t(b, s, o)
      JOIN up ON up.bucket_id = t.b AND up.window_start = t.s;
  END IF;
  IF ng > 0 THEN
    WITH up AS (
      INSERT INTO busbar_concurrency AS cc (group_name)
        SELECT g FROM unnest(u_groups) AS t(g)
        ON CONFLICT (group_name) DO UPDATE SET in_flight = cc.in_flight
        RETURNING cc.group_name, cc.in_flight)
    SELECT array_agg(greatest(up.in_flight, 0) ORDER BY t.o) INTO conc
      FROM unnest(u_groups) WITH ORDINALITY AS t(g, o) JOIN up ON up.group_name = t.g;
  END IF;
  IF nu > 0 THEN
    SELECT array_agg(coalesce(x.tk, 0) ORDER BY t.o),
           array_agg(coalesce(x.sp, 0) + coalesce(f.r, 0) ORDER BY t.o)
      INTO tok, spend
      FROM unnest(u_ids, u_starts) WITH ORDINALITY AS t(b, s, o)
      LEFT JOIN LATERAL (
        SELECT sum(greatest(l.tokens_input, 0) + greatest(l.tokens_output, 0) +
                   greatest(l.tokens_cache_read, 0) + greatest(l.tokens_cache_write, 0)) AS tk,
               sum(greatest(l.tokens_input, 0) * r.ri + greatest(l.tokens_output, 0) * r.ro +
                   greatest(l.tokens_cache_read, 0) * r.rr +
                   greatest(l.tokens_cache_write, 0) * r.rw) AS sp
          FROM usage_ledger l
          LEFT JOIN unnest(r_models, r_in, r_out, r_cr, r_cw) AS r(m, ri, ro, rr, rw)
            ON r.m = l.model
         WHERE l.bucket_id = t.b AND l.window_start = t.s) x ON TRUE
      LEFT JOIN LATERAL (
        SELECT greatest(fi.reserved, 0) AS r FROM busbar_inflight fi
         WHERE fi.bucket_id = t.b AND fi.window_start = t.s) f ON TRUE;
  END IF;
  FOR j IN 1..coalesce(array_length(reserve, 1), 0) LOOP
    failed := 0;
    FOR k IN c + 1 .. c + n_checks[j] LOOP
      i := c_idx[k];
      IF c_kind[k] = 'r' THEN
        IF req[i] + 1 > c_limit[k] THEN failed := k - c; EXIT; END IF;
      ELSIF c_kind[k] = 'c' THEN
        IF conc[i] + 1 > c_limit[k] THEN failed := k - c; EXIT; END IF;
      ELSIF c_kind[k] = 't' THEN
        IF tok[i] >= c_limit[k] THEN failed := k - c; EXIT; END IF;
      ELSE
        IF spend[i] + reserve[j] > c_limit[k] THEN failed := k - c; EXIT; END IF;
      END IF;
    END LOOP;
    c := c + n_checks[j];
    IF failed = 0 THEN
      FOR k IN q + 1 .. q + n_buckets[j] LOOP
        i := q_idx[k];
        req[i] := req[i] + 1;
        d_req[i] := d_req[i] + 1;
        IF q_budget[k] > 0 AND reserve[j] > 0 THEN
          spend[i] := spend[i] + reserve[j];
          d_res[i] := d_res[i] + reserve[j];
        END IF;
      END LOOP;
      FOR k IN h + 1 .. h + n_groups[j] LOOP
        i := h_idx[k];
        conc[i] := conc[i] + 1;
        d_conc[i] := d_conc[i] + 1;
      END LOOP;
    END IF;
    q := q + n_buckets[j];
    h := h + n_groups[j];
    res := res || failed;
  END LOOP;
  IF nu > 0 THEN
    UPDATE usage_windows w
      SET requests = w.requests + t.d, billable_requests = w.billable_requests + t.d
      FROM unnest(u_ids, u_starts, d_req) AS t(b, s, d)
     WHERE t.d <> 0 AND w.bucket_id = t.b AND w.window_start = t.s;
    INSERT INTO busbar_inflight AS f (bucket_id, window_start, reserved)
      SELECT b, s, d FROM unnest(u_ids, u_starts, d_res) AS t(b, s, d) WHERE d > 0
      ON CONFLICT (bucket_id, window_start)
      DO UPDATE SET reserved = greatest(f.reserved, 0) + EXCLUDED.reserved;
  END IF;
  IF ng > 0 THEN
    UPDATE busbar_concurrency cc SET in_flight = greatest(cc.in_flight, 0) + t.d
      FROM unnest(u_groups, d_conc) AS t(g, d) WHERE t.d <> 0 AND cc.group_name = t.g;
  END IF;
  RETURN res;
END
$fn$;

-- Settlement of a batch, one JSON document of five arrays of rows (each sorted by its key, deltas
-- merged per key): w usage_windows [bucket, start, requests, 2xx requests]; g concurrency [group,
-- delta]; i reservations [bucket, start, delta]; l tokens [bucket, start, model, input, output,
-- cache read, cache write]; m metering [key, day bucket, model, provider, group at use, requests,
-- 2xx requests, the four tiers]. Rows are written in the document's order (the lock order).
-- Counts floor at 0.
CREATE OR REPLACE FUNCTION busbar_settle_v2(d JSONB)
RETURNS INT LANGUAGE plpgsql AS $fn$
DECLARE
  e JSONB;
BEGIN
  FOR e IN SELECT x FROM jsonb_array_elements(d->'w') AS t(x) LOOP
    INSERT INTO usage_windows AS u (bucket_id, window_start, requests, billable_requests)
      VALUES (e->>0, (e->>1)::BIGINT, greatest((e->>2)::BIGINT, 0), greatest((e->>3)::BIGINT, 0))
      ON CONFLICT (bucket_id, window_start) DO UPDATE
      SET requests = greatest(u.requests + (e->>2)::BIGINT, 0),
          billable_requests = greatest(u.billable_requests + (e->>3)::BIGINT, 0);
  END LOOP;
  FOR e IN SELECT x FROM jsonb_array_elements(d->'g') AS t(x) LOOP
    INSERT INTO busbar_concurrency AS c (group_name, in_flight)
      VALUES (e->>0, greatest((e->>1)::BIGINT, 0))
      ON CONFLICT (group_name) DO UPDATE
      SET in_flight = greatest(c.in_flight + (e->>1)::BIGINT, 0);
  END LOOP;
  FOR e IN SELECT x FROM jsonb_array_elements(d->'i') AS t(x) LOOP
    INSERT INTO busbar_inflight AS f (bucket_id, window_start, reserved)
      VALUES (e->>0, (e->>1)::BIGINT, greatest((e->>2)::BIGINT, 0))
      ON CONFLICT (bucket_id, window_start) DO UPDATE
      SET reserved = greatest(f.reserved + (e->>2)::BIGINT, 0);
  END LOOP;
  FOR e IN SELECT x FROM jsonb_array_elements(d->'l') AS t(x) LOOP
    INSERT INTO usage_ledger AS l (bucket_id, window_start, model, tokens_input, tokens_output,
                                   tokens_cache_read, tokens_cache_write)
      VALUES (e->>0, (e->>1)::BIGINT, e->>2, greatest((e->>3)::BIGINT, 0),
              greatest((e->>4)::BIGINT, 0), greatest((e->>5)::BIGINT, 0),
              greatest((e->>6)::BIGINT, 0))
      ON CONFLICT (bucket_id, window_start, model) DO UPDATE
      SET tokens_input = greatest(l.tokens_input + (e->>3)::BIGINT, 0),
          tokens_output = greatest(l.tokens_output + (e->>4)::BIGINT, 0),
          tokens_cache_read = greatest(l.tokens_cache_read + (e->>5)::BIGINT, 0),
          tokens_cache_write = greatest(l.tokens_cache_write + (e->>6)::BIGINT, 0);
  END LOOP;
  FOR e IN SELECT x FROM jsonb_array_elements(d->'m') AS t(x) LOOP
    INSERT INTO usage_metering AS m (key_id, bucket, model, provider, key_group_at_use, requests,
                                     billable_requests, tokens_input, tokens_output,
                                     tokens_cache_read, tokens_cache_write, pricing_version)
      VALUES (e->>0, (e->>1)::BIGINT, e->>2, e->>3, e->>4, (e->>5)::BIGINT, (e->>6)::BIGINT,
              (e->>7)::BIGINT, (e->>8)::BIGINT, (e->>9)::BIGINT, (e->>10)::BIGINT, '')
      ON CONFLICT (key_id, bucket, model, provider) DO UPDATE
      SET requests = m.requests + EXCLUDED.requests,
          billable_requests = m.billable_requests + EXCLUDED.billable_requests,
          tokens_input = m.tokens_input + EXCLUDED.tokens_input,
          tokens_output = m.tokens_output + EXCLUDED.tokens_output,
          tokens_cache_read = m.tokens_cache_read + EXCLUDED.tokens_cache_read,
          tokens_cache_write = m.tokens_cache_write + EXCLUDED.tokens_cache_write;
  END LOOP;
  RETURN 1;
END
$fn$;
"""

# The admission's arrays go as text (Postgres array literals, cast in the statement): built once
# per request shape and rate card and kept, where array parameters would be encoded (and every
# element type-checked in Python by asyncpg) on each call.
ADMIT_SQL = ("SELECT busbar_admit_v2($1::text::text[], $2::text::bigint[], $3::text::int[], "
             "$4::text::text[], $5::text::text[], $6::text::int[], $7::text::bigint[], "
             "$8::text::text[], $9::text::float8[], $10::text::float8[], $11::text::float8[], "
             "$12::text::float8[], $13::bigint)")
ADMIT_BATCH_SQL = ("SELECT busbar_admit_batch_v2(%s)" % ", ".join(
    "$%d::text::%s" % (i + 1, t) for i, t in enumerate(
        ("text[]", "bigint[]", "text[]",
         "int[]", "text[]", "int[]", "bigint[]",
         "int[]", "int[]", "int[]", "int[]", "int[]", "bigint[]",
         "text[]", "float8[]", "float8[]", "float8[]", "float8[]"))))
SETTLE_SQL = "SELECT busbar_settle_v2($1::text::jsonb)"

_KEY_COLUMNS = ("k.id, k.generation_hash, k.name, k.allowed_pools, k.enabled, k.created_at, "
                "k.key_group, k.labels, k.expires_at, k.deleted_at, k.revision")
_CRED_COLUMNS = ("c.id, c.key_id, c.kind, c.slot, c.public_id, c.secret, c.created_at, "
                 "c.updated_at, c.expires_at, c.revoked_at, c.revoke_reason, c.revision")
KEY_READ_SQL = ("SELECT %s, EXISTS (SELECT 1 FROM denylist d WHERE d.sub = k.id), %s FROM keys k "
                "LEFT JOIN credentials c ON c.key_id = k.id AND c.kind = 'sigv4' "
                "WHERE k.id = $1 ORDER BY c.slot" % (_KEY_COLUMNS, _CRED_COLUMNS))
KEY_BY_AWS_SQL = ("SELECT %s, EXISTS (SELECT 1 FROM denylist d WHERE d.sub = k.id), %s "
                  "FROM credentials c JOIN keys k ON k.id = c.key_id "
                  "WHERE c.kind = 'sigv4' AND c.public_id = $1" % (_KEY_COLUMNS, _CRED_COLUMNS))
GROUP_READ_SQL = "SELECT doc FROM busbar_groups WHERE name = $1"


# ---------------------------------------------------------------------------- asyncpg, lazily
def _asyncpg():
    import asyncpg
    return asyncpg


def _down_errors() -> tuple:
    """Exceptions that mean "the database did not answer" (as opposed to an SQL error)."""
    a = _asyncpg()
    return (OSError, asyncio.TimeoutError, a.PostgresConnectionError, a.InterfaceError,
            a.CannotConnectNowError, a.OperatorInterventionError, a.TooManyConnectionsError)


async def _no_reset(conn) -> None:
    """A pooled connection back from a call of busbar's worker side: nothing to undo (asyncpg
    itself still rolls back a transaction left open)."""


async def _pool(url: str, timeout: float, size: int, reset: bool = True):
    """A pool that connects on first use (a database down at boot does not hold the boot).
    `reset=False`: no reset query on release (asyncpg's default sends `pg_advisory_unlock_all();
    CLOSE ALL; UNLISTEN *; RESET ALL` each time, a round trip): for the worker's pools, whose calls
    leave no session state."""
    return await _asyncpg().create_pool(
        url, min_size=0, max_size=size, timeout=timeout, command_timeout=timeout,
        max_inactive_connection_lifetime=60.0, server_settings={"application_name": "busbar"},
        reset=None if reset else _no_reset)


def safe_url(url: str) -> str:
    """The URL without its password or parameters, for messages."""
    scheme, sep, rest = url.partition("://")
    rest = rest.split("?", 1)[0]
    if sep and "@" in rest:
        userinfo, _, host = rest.rpartition("@")
        rest = userinfo.split(":", 1)[0] + "@" + host
    return scheme + sep + rest


def _scrub(message: str, url: str) -> str:
    """An error text with the URL's password taken out (a driver may quote its DSN)."""
    from urllib.parse import unquote, urlsplit
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    for p in {password, unquote(password) if password else None} - {None, ""}:
        message = message.replace(p, "<redacted>")
    return message


async def ensure_schema(conn) -> None:
    """The Rust store's tables (made when missing, under its migration lock), then busbar's own
    tables and functions. A database of a newer schema, or of a Rust development schema from
    before 1.5.0 (which the Rust store drops and starts empty), is refused: busbar deletes
    nothing. A v5 database gets the Rust store's one-time billable backfill on its way to v6."""
    a = _asyncpg()
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATE_LOCK_KEY)
    try:
        await conn.execute("CREATE TABLE IF NOT EXISTS busbar_schema (version BIGINT PRIMARY KEY)")
        version = await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM busbar_schema")
        if version > SCHEMA_VERSION:
            raise StoreError("postgres: the database has store schema v%d, written by a newer "
                             "gateway; this busbar reads v%d" % (version, SCHEMA_VERSION))
        if version < 5 and await conn.fetchval(
                "SELECT to_regclass('usage_counters') IS NOT NULL OR "
                "to_regclass('virtual_keys') IS NOT NULL OR "
                "to_regclass('aws_credentials') IS NOT NULL"):
            raise StoreError("postgres: the database holds a Rust gateway development schema from "
                             "before 1.5.0 (virtual_keys/usage_counters), which the Rust store "
                             "would drop; busbar deletes nothing: move it aside or point store."
                             "settings.url at another database")
        async with conn.transaction():
            await conn.execute(RUST_SCHEMA)
            if version < SCHEMA_VERSION:
                await conn.execute("UPDATE usage_windows SET billable_requests = requests "
                                   "WHERE billable_requests = 0 AND requests > 0")
                await conn.execute("INSERT INTO busbar_schema (version) VALUES ($1) "
                                   "ON CONFLICT (version) DO NOTHING", SCHEMA_VERSION)
            try:
                await conn.execute(BUSBAR_SCHEMA)
            except a.InsufficientPrivilegeError as e:
                raise StoreError("postgres: busbar's tables and functions cannot be created "
                                 "(%s); grant CREATE on the schema to the store's user" % e) \
                    from None
    finally:
        try:
            await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATE_LOCK_KEY)
        except BaseException:
            # a pool without the reset query must not keep this connection holding the lock
            conn.terminate()
            raise


# ---------------------------------------------------------------------------- records
def _record_of_rows(rows, now):
    """A KeyRecord from KEY_READ_SQL / KEY_BY_AWS_SQL rows (one per sigv4 slot), or None."""
    if not rows:
        return None
    from .model import _cred_of_row, _vk_of_row
    first = rows[0]
    vk = _vk_of_row(tuple(first[:11]))
    creds = [_cred_of_row(tuple(r[12:24])) for r in rows if r[12] is not None]
    cred = next((c for c in creds if credential_live(c["meta"], now)), creds[0] if creds else None)
    return record_of(vk, bool(first[11]), cred, now)


async def _read_key(conn, key_id, now):
    return _record_of_rows(await conn.fetch(KEY_READ_SQL, key_id), now)


async def _read_by_aws(conn, access_key_id, now):
    rec = _record_of_rows(await conn.fetch(KEY_BY_AWS_SQL, access_key_id), now)
    return rec if rec is not None and rec.aws_access_key_id == access_key_id else None


async def _read_group(conn, name):
    raw = await conn.fetchval(GROUP_READ_SQL, name)
    return group_from_dict(orjson.loads(raw)) if raw else None


# ---------------------------------------------------------------------------- pending writes
class _Writes:
    """Increments not yet in the database, merged per row, in the shape busbar_settle_v2 takes."""

    __slots__ = ("windows", "gauges", "inflight", "tokens", "meter", "settled")

    def __init__(self):
        self.windows = {}       # (bucket, start) -> [requests, billable]
        self.gauges = {}        # group -> delta
        self.inflight = {}      # (bucket, start) -> reservation delta
        self.tokens = {}        # (bucket, start, model) -> [input, output, cache read, write]
        self.meter = {}         # (key, day bucket, model, provider) -> [group, 6 counts]
        # settles summed per (request shape, key, day bucket, model, provider, group), not yet
        # spread over the rows above (spread()): [requests, 2xx, the four tiers, reservation
        # delta]; a request's settle is one sum here, its rows are made once per batch
        self.settled = {}

    def __bool__(self):
        return bool(self.windows or self.gauges or self.inflight or self.tokens or self.meter
                    or self.settled)

    def settle(self, sp, key, day, model, provider, group, ok, t, reserve_delta):
        k = (sp, key, day, model, provider, group)
        cur = self.settled.get(k)
        if cur is None:
            self.settled[k] = [1, ok, t[0], t[1], t[2], t[3], reserve_delta]
        else:
            cur[0] += 1
            cur[1] += ok
            cur[2] += t[0]
            cur[3] += t[1]
            cur[4] += t[2]
            cur[5] += t[3]
            cur[6] += reserve_delta

    def spread(self):
        """The summed settles into their rows: each request's concurrency slot back, its tokens
        into every ledger bucket of its checks and the key's own, a non-2xx off the billable
        counts, the reservation deltas, the key's request counts and its metering row."""
        settled, self.settled = self.settled, {}
        for (sp, key, day, model, provider, group), (n, ok, i, o, cr, cw, d) in settled.items():
            t = (i, o, cr, cw)
            for g in sp.groups:
                self.gauge(g, -n)
            for b, s in sp.buckets:
                if model:
                    self.add_tokens(b, s, model, t)
                if n != ok:
                    self.window(b, s, 0, ok - n)
            if d:
                for b, s in sp.budget:
                    self.reserve(b, s, d)
            if key is not None:
                self.window(key, 0, n, ok)
                if model:
                    self.add_tokens(key, 0, model, t)
                self.add_meter(key, day, model, provider, group, (n, ok, i, o, cr, cw))

    def window(self, bucket, start, requests, billable):
        if requests or billable:
            cur = self.windows.setdefault((bucket, start), [0, 0])
            cur[0] += requests
            cur[1] += billable

    def gauge(self, group, delta):
        self.gauges[group] = self.gauges.get(group, 0) + delta

    def reserve(self, bucket, start, delta):
        if delta:
            k = (bucket, start)
            self.inflight[k] = self.inflight.get(k, 0) + delta

    def add_tokens(self, bucket, start, model, t):
        if t[0] or t[1] or t[2] or t[3]:
            k = (bucket, start, model)
            cur = self.tokens.get(k)
            if cur is None:
                self.tokens[k] = [t[0], t[1], t[2], t[3]]
            else:
                cur[0] += t[0]
                cur[1] += t[1]
                cur[2] += t[2]
                cur[3] += t[3]

    def add_meter(self, key_id, bucket, model, provider, group, counts):
        """counts: requests, billable, input, output, cache read, cache write."""
        cur = self.meter.get((key_id, bucket, model, provider))
        if cur is None:
            self.meter[(key_id, bucket, model, provider)] = [group or ""] + list(counts)
        else:
            for i, v in enumerate(counts):
                cur[i + 1] += v

    def merge(self, other: "_Writes"):
        if other.settled:
            other.spread()
        for (b, s), (r, bl) in other.windows.items():
            self.window(b, s, r, bl)
        for g, d in other.gauges.items():
            self.gauge(g, d)
        for (b, s), d in other.inflight.items():
            self.reserve(b, s, d)
        for (b, s, m), t in other.tokens.items():
            self.add_tokens(b, s, m, t)
        for (k, b, m, p), v in other.meter.items():
            self.add_meter(k, b, m, p, v[0], v[1:])

    def doc(self) -> str:
        """busbar_settle_v2's document: each table's rows in byte order of their key (the lock
        order; Python's str order is code point order, which is UTF-8 byte order, COLLATE "C"),
        rows whose deltas are all 0 left out."""
        if self.settled:
            self.spread()
        return orjson.dumps({
            "w": [[k[0], k[1], v[0], v[1]] for k, v in sorted(self.windows.items())
                  if v[0] or v[1]],
            "g": [[k, v] for k, v in sorted(self.gauges.items()) if v],
            "i": [[k[0], k[1], v] for k, v in sorted(self.inflight.items()) if v],
            "l": [[k[0], k[1], k[2], *v] for k, v in sorted(self.tokens.items())],
            "m": [[*k, *v] for k, v in sorted(self.meter.items())]}).decode()


def _usage_writes(rows, windows) -> _Writes:
    """What store.add_usage writes: the rows into the metering, the window deltas (model.
    window_deltas) into the ledger."""
    w = _Writes()
    for u in rows:
        w.add_meter(u.key_id, day_epoch(u.day), u.model or "", u.provider or "", u.group,
                    (u.requests, u.billable_requests, u.input_tokens, u.output_tokens,
                     u.cache_read_tokens, u.cache_write_tokens))
    for (bucket, start), (req, bill, models) in (windows or {}).items():
        w.window(bucket, start, req, bill)
        for model, t in models.items():
            w.add_tokens(bucket, start, model, t)
    return w


# ---------------------------------------------------------------------------- admission shapes
def _text_lit(xs) -> str:
    """A Postgres text[] literal (every element quoted, so any text round-trips)."""
    return "{%s}" % ",".join(['"%s"' % x.replace("\\", "\\\\").replace('"', '\\"')
                              for x in xs])


def _num_lit(xs) -> str:
    """A Postgres numeric array literal (int and float reprs are valid input)."""
    return "{%s}" % ",".join(map(repr, xs))


_NO_CARD = ("{}", "{}", "{}", "{}", "{}")
_NO_TOKENS = (0, 0, 0, 0)
# A check's shape: what the admission's arguments depend on (its charge and seconds to the roll
# vary per request and are not sent).
_SHAPE_OF = itemgetter(C_BUCKET, C_KIND, C_LIMIT, C_WINDOW, C_GROUP)
# Shapes kept per worker: one per (group chain, pool) in use and window start (a new one each
# minute for a per-minute limit), so the table is emptied when it reaches this many; 4096
# shapes are well under a megabyte.
SHAPES_MAX = 4096


class _Shape:
    """A request shape's admission arguments (busbar_admit_v2's first seven, as array literals,
    and its parts of a batch's) and what settling it touches: its ledger buckets, those a
    budget is checked on, its concurrent-limit groups."""

    __slots__ = ("args", "kinds", "limits", "refs", "flags", "counts", "buckets", "budget",
                 "groups")

    def __init__(self, checks):
        buckets = sorted({(c[C_BUCKET], c[C_WINDOW]) for c in checks
                          if c[C_KIND] != "concurrent"})
        groups = sorted({c[C_GROUP] for c in checks if c[C_KIND] == "concurrent"})
        budget = {(c[C_BUCKET], c[C_WINDOW]) for c in checks if c[C_KIND] == "budget_usd"}
        bidx = {b: i + 1 for i, b in enumerate(buckets)}
        gidx = {g: i + 1 for i, g in enumerate(groups)}
        idx = [gidx[c[C_GROUP]] if c[C_KIND] == "concurrent" else bidx[(c[C_BUCKET], c[C_WINDOW])]
               for c in checks]
        self.args = (_text_lit([b for b, _ in buckets]), _num_lit([s for _, s in buckets]),
                     _num_lit([1 if b in budget else 0 for b in buckets]), _text_lit(groups),
                     _text_lit([_KIND_CODE[c[C_KIND]] for c in checks]), _num_lit(idx),
                     _num_lit([int(c[C_LIMIT]) for c in checks]))
        # a batch's parts (busbar_admit_batch_v2), as the text its array literals join: each
        # check's kind code, limit and what it counts in (a group, or a bucket); each bucket's
        # budget flag; the counts
        self.kinds = tuple(_KIND_CODE[c[C_KIND]] for c in checks)
        self.limits = tuple(str(int(c[C_LIMIT])) for c in checks)
        self.refs = tuple((True, c[C_GROUP]) if c[C_KIND] == "concurrent"
                          else (False, (c[C_BUCKET], c[C_WINDOW])) for c in checks)
        self.flags = tuple("1" if b in budget else "0" for b in buckets)
        self.counts = (str(len(checks)), str(len(buckets)), str(len(groups)))
        self.buckets = tuple(buckets)
        self.budget = tuple(b for b in buckets if b in budget)
        self.groups = tuple(groups)


_days = {}


def _day_epoch(day: str) -> int:
    """model.day_epoch, kept (a worker settles in one or two days at a time)."""
    got = _days.get(day)
    if got is None:
        if len(_days) > 8:
            _days.clear()
        got = _days[day] = day_epoch(day)
    return got


# ---------------------------------------------------------------------------- admin side
class PostgresStore:
    """The store contract (busbar/governance/store.py) in the Rust postgres schema, for the admin
    API (the parent process). Every method raises StoreUnavailable when the database does not
    answer, StoreError when it refuses (a schema busbar does not read, a deleted key written
    back)."""

    kind = "postgres"

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT, pool_size: int = 2):
        self.url = url
        self.timeout = timeout
        self.pool_size = pool_size
        self._pool = None
        self._checked = False
        self._pruner = None

    async def open(self):
        """Makes the pool; no connection yet (a database down at boot does not hold the boot):
        the schema is made or checked by the first call that reaches the database."""
        self._down = _down_errors()
        self._pool = await _pool(self.url, self.timeout, self.pool_size)
        self._pruner = asyncio.get_running_loop().create_task(self._prune_loop())

    async def close(self):
        if self._pruner is not None:
            self._pruner.cancel()
            self._pruner = None
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), self.timeout)
            except Exception:
                self._pool.terminate()
            self._pool = None

    async def _call(self, fn):
        """fn(connection), on a pooled connection, after the schema check."""
        try:
            async with self._pool.acquire() as conn:
                if not self._checked:
                    await ensure_schema(conn)
                    self._checked = True
                return await fn(conn)
        except self._down as e:
            raise StoreUnavailable("postgres at %s: %s" % (
                safe_url(self.url), _scrub(str(e) or e.__class__.__name__, self.url))) from None

    async def ping(self) -> None:
        await self._call(lambda c: c.fetchval("SELECT 1"))

    # -- keys
    async def put_key(self, rec: KeyRecord) -> None:
        now = int(time.time())

        async def write(conn):
            async with conn.transaction():
                await self._write_key(conn, rec, now)
        await self._call(write)

    async def _write_key(self, conn, rec, now):
        """The rows of one key, inside the caller's transaction: the keys row (revision bumped),
        the denylist entry of a revoked or deleted key, its sigv4 credential (revoked with the
        key, destroyed with a tombstone), and the invalidation sent at commit."""
        rev = await conn.fetchval("UPDATE store_revision SET revision = revision + 1 "
                                  "WHERE only_row RETURNING revision")
        rec.revision = rev
        old = await conn.fetchval("SELECT deleted_at FROM keys WHERE id = $1 FOR UPDATE", rec.id)
        if old is not None and rec.state != "tombstoned":
            raise StoreError("key %s is deleted (tombstoned); it cannot be written back" % rec.id)
        tomb = rec.state == "tombstoned"
        await conn.execute(
            "INSERT INTO keys (id, generation_hash, name, allowed_pools, enabled, created_at, "
            "key_group, labels, expires_at, deleted_at, revision) "
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) ON CONFLICT (id) DO UPDATE SET "
            "generation_hash = EXCLUDED.generation_hash, name = EXCLUDED.name, "
            "allowed_pools = EXCLUDED.allowed_pools, enabled = EXCLUDED.enabled, "
            "key_group = EXCLUDED.key_group, labels = EXCLUDED.labels, "
            "expires_at = EXCLUDED.expires_at, deleted_at = EXCLUDED.deleted_at, "
            "revision = EXCLUDED.revision",
            rec.id, generation_marker(rec.id, rec.gen), rec.name,
            orjson.dumps(rec.allowed_pools).decode() if rec.allowed_pools is not None else None,
            rec.state == "active", int(rec.created or now), rec.group,
            orjson.dumps(rec.labels or {}, option=orjson.OPT_SORT_KEYS).decode(),
            int(rec.expires) if rec.expires else None,
            int(rec.deleted or now) if tomb else None, rev)
        await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, "key:" + rec.id)
        if rec.state in ("revoked", "tombstoned"):
            await conn.execute("INSERT INTO denylist (sub, reason, created_at) VALUES ($1, $2, $3) "
                               "ON CONFLICT (sub) DO NOTHING",
                               rec.id, "deleted" if tomb else "revoked", now)
        if tomb:
            await conn.execute("DELETE FROM credentials WHERE key_id = $1", rec.id)
            return
        if rec.state == "revoked":
            await conn.execute("UPDATE credentials SET revoked_at = $2, revoke_reason = 'revoked', "
                               "updated_at = $2, revision = $3 WHERE key_id = $1 AND "
                               "revoked_at IS NULL", rec.id, now, rev)
            return
        if not rec.aws_access_key_id or not rec.aws_secret:
            return
        cur = await conn.fetchrow("SELECT id, public_id, revoked_at FROM credentials "
                                  "WHERE key_id = $1 AND kind = 'sigv4' AND slot = 0", rec.id)
        if cur is not None and cur[1] == rec.aws_access_key_id and cur[2] is None:
            return                  # the same live pair, already stored
        if rec.aws_cred_id is None or (cur is not None and cur[0] == rec.aws_cred_id
                                       and cur[1] != rec.aws_access_key_id):
            rec.aws_cred_id = new_credential_id()
        await conn.execute(
            "INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, secret_form, "
            "created_at, updated_at, expires_at, revoked_at, revoke_reason, revision) "
            "VALUES ($1, $2, 'sigv4', 0, $3, $4, 'recoverable', $5, $5, NULL, NULL, NULL, $6) "
            "ON CONFLICT (key_id, kind, slot) DO UPDATE SET id = EXCLUDED.id, "
            "public_id = EXCLUDED.public_id, secret = EXCLUDED.secret, "
            "secret_form = EXCLUDED.secret_form, created_at = EXCLUDED.created_at, "
            "updated_at = EXCLUDED.updated_at, expires_at = NULL, revoked_at = NULL, "
            "revoke_reason = NULL, revision = EXCLUDED.revision",
            rec.aws_cred_id, rec.id, rec.aws_access_key_id, PLAIN_SECRET + rec.aws_secret, now,
            rev)

    async def get_key(self, key_id) -> KeyRecord | None:
        return await self._call(lambda c: _read_key(c, key_id, time.time()))

    async def key_by_aws(self, access_key_id) -> KeyRecord | None:
        return await self._call(lambda c: _read_by_aws(c, access_key_id, time.time()))

    async def list_keys(self) -> list[KeyRecord]:
        from .model import _cred_of_row, _vk_of_row

        async def read(conn):
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                keys = await conn.fetch("SELECT %s FROM keys k ORDER BY k.created_at, k.id"
                                        % _KEY_COLUMNS)
                denied = {r[0] for r in await conn.fetch("SELECT sub FROM denylist")}
                creds = await conn.fetch("SELECT %s FROM credentials c WHERE c.kind = 'sigv4' "
                                         "ORDER BY c.slot" % _CRED_COLUMNS)
            return keys, denied, creds
        keys, denied, creds = await self._call(read)
        now = time.time()
        by_key = {}
        for row in creds:
            c = _cred_of_row(tuple(row))
            if credential_live(c["meta"], now) or row[1] not in by_key:
                by_key[row[1]] = c
        return [record_of(_vk_of_row(tuple(r)), r[0] in denied, by_key.get(r[0]), now)
                for r in keys]

    async def delete_key(self, key_id) -> None:
        now = int(time.time())

        async def write(conn):
            async with conn.transaction():
                rec = await _read_key(conn, key_id, now)
                if rec is None:
                    raise StoreError("no key %s" % key_id)
                if rec.state == "tombstoned":
                    return
                rec.state, rec.deleted = "tombstoned", now
                rec.aws_access_key_id = rec.aws_secret = rec.aws_cred_id = None
                await self._write_key(conn, rec, now)
        await self._call(write)

    # -- groups (made through busbar's admin API; the Rust gateway keeps these in its config)
    async def put_group(self, rec: GroupRecord) -> None:
        async def write(conn):
            async with conn.transaction():
                await conn.execute("INSERT INTO busbar_groups (name, doc) VALUES ($1, $2) "
                                   "ON CONFLICT (name) DO UPDATE SET doc = EXCLUDED.doc",
                                   rec.name, orjson.dumps(group_to_dict(rec)).decode())
                await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, "group:" + rec.name)
        await self._call(write)

    async def get_group(self, name) -> GroupRecord | None:
        return await self._call(lambda c: _read_group(c, name))

    async def list_groups(self) -> list[GroupRecord]:
        rows = await self._call(lambda c: c.fetch("SELECT doc FROM busbar_groups ORDER BY name"))
        return [group_from_dict(orjson.loads(r[0])) for r in rows]

    async def delete_group(self, name) -> None:
        async def write(conn):
            async with conn.transaction():
                await conn.execute("DELETE FROM busbar_groups WHERE name = $1", name)
                await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, "group:" + name)
        await self._call(write)

    async def invalidate_all(self) -> None:
        """Every worker drops its whole policy cache (e.g. after a bulk import)."""
        await self._call(lambda c: c.execute("SELECT pg_notify($1, 'all')", CHANNEL))

    # -- audit: records as busbar/admin/audit.py chained them, appended (a seq another node took
    # first is a unique-key error: the writer re-reads the tail and chains after it)
    audit_sync = False
    _AUDIT_COLS = "seq, ts, action, resource, outcome, principal, prev_hash, hash"

    async def append_audit(self, rec: dict) -> None:
        await self._call(lambda c: c.execute(
            "INSERT INTO audit_log (%s) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)" % self._AUDIT_COLS,
            rec["seq"], rec["ts"], rec["action"], rec["resource"], rec["outcome"],
            rec["principal"], rec["prev_hash"], rec["hash"]))

    async def audit_tail(self):
        row = await self._call(lambda c: c.fetchrow(
            "SELECT %s FROM audit_log ORDER BY seq DESC LIMIT 1" % self._AUDIT_COLS))
        return None if row is None else dict(zip(self._AUDIT_COLS.split(", "), row))

    async def list_audit(self) -> list:
        cols = self._AUDIT_COLS.split(", ")
        rows = await self._call(lambda c: c.fetch(
            "SELECT %s FROM audit_log ORDER BY seq" % self._AUDIT_COLS))
        return [dict(zip(cols, r)) for r in rows]

    # -- usage
    async def add_usage(self, rows: list[Usage], windows=None) -> None:
        w = _usage_writes(rows, windows)
        if w:
            await self._call(lambda c: c.fetchval(SETTLE_SQL, w.doc()))

    async def usage_rows(self, day: str | None = None) -> list[dict]:
        from .model import _usage_row
        sql = ("SELECT bucket, key_id, key_group_at_use, model, provider, requests, tokens_input, "
               "tokens_output, tokens_cache_read, tokens_cache_write, billable_requests "
               "FROM usage_metering")
        args = ()
        if day is not None:
            sql += " WHERE bucket = $1"
            args = (day_epoch(day),)
        sql += ' ORDER BY bucket, key_id COLLATE "C", provider COLLATE "C", model COLLATE "C"'
        rows = await self._call(lambda c: c.fetch(sql, *args))
        return [_usage_row(r[0], r[1], r[2], r[3], r[4], [max(0, v) for v in r[5:]])
                for r in rows]

    async def usage_totals(self) -> list[dict]:
        rows = await self._call(lambda c: c.fetch(
            "SELECT key_id, key_group_at_use, model, SUM(requests), SUM(tokens_input), "
            "SUM(tokens_output), SUM(tokens_cache_read), SUM(tokens_cache_write), "
            "SUM(billable_requests) FROM usage_metering GROUP BY key_id, key_group_at_use, model "
            'ORDER BY key_id COLLATE "C", model COLLATE "C"'))
        out = []
        for kid, grp, model, *counts in rows:
            row = {"day": None, "key_id": kid, "group": grp or None, "model": model,
                   "provider": None}
            row.update(zip(USAGE_FIELDS, (int(c) for c in counts)))
            out.append(row)
        return out

    async def window(self, bucket: str, start: int):
        """A bucket's ledger: (requests, billable, {model: [input, output, cache read, cache
        write]}), and busbar's reservations in flight as the fourth item."""
        async def read(conn):
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                head = await conn.fetchrow("SELECT requests, billable_requests FROM usage_windows "
                                           "WHERE bucket_id = $1 AND window_start = $2",
                                           bucket, start)
                models = await conn.fetch(
                    "SELECT model, tokens_input, tokens_output, tokens_cache_read, "
                    "tokens_cache_write FROM usage_ledger WHERE bucket_id = $1 AND "
                    "window_start = $2", bucket, start)
                reserved = await conn.fetchval("SELECT reserved FROM busbar_inflight WHERE "
                                               "bucket_id = $1 AND window_start = $2",
                                               bucket, start)
            return head, models, reserved
        head, models, reserved = await self._call(read)
        requests, billable = (max(0, head[0]), max(0, head[1])) if head else (0, 0)
        return (requests, billable, {r[0]: [max(0, v) for v in r[1:]] for r in models},
                max(0, reserved or 0))

    async def check_values(self, checks, card=None) -> list[int]:
        """Each check's value as admission sees it (tests and diagnostics)."""
        out = []
        for c in checks:
            if c[C_KIND] == "concurrent":
                v = await self._call(lambda conn, g=c[C_GROUP]: conn.fetchval(
                    "SELECT in_flight FROM busbar_concurrency WHERE group_name = $1", g))
                out.append(max(0, v or 0))
                continue
            requests, _, models, reserved = await self.window(c[C_BUCKET], c[C_WINDOW])
            if c[C_KIND] == "requests":
                out.append(requests)
            elif c[C_KIND] == "tokens":
                out.append(sum(sum(t) for t in models.values()))
            else:
                spend = reserved
                for m, t in models.items():
                    rate = (card or {}).get(m)
                    if rate is not None:
                        spend += 1000 * (t[0] * rate.input + t[1] * rate.output +
                                         t[2] * rate.cache_read + t[3] * rate.cache_write)
                out.append(math.floor(spend))
        return out

    async def prune_windows(self, now: float) -> int:
        """Deletes minute and hour windows (ledger rows and reservations) that ended more than
        WINDOW_KEEP_SECS ago."""
        cut = int(now) - WINDOW_KEEP_SECS
        where = ("window_start < $1 AND (bucket_id LIKE '%@minute' OR bucket_id LIKE '%@minute#%' "
                 "OR bucket_id LIKE '%@hour' OR bucket_id LIKE '%@hour#%')")

        async def prune(conn):
            async with conn.transaction():
                n = await conn.execute("DELETE FROM usage_windows WHERE " + where, cut)
                await conn.execute("DELETE FROM usage_ledger WHERE " + where, cut)
                await conn.execute("DELETE FROM busbar_inflight WHERE " + where, cut)
            return int(n.split()[-1])
        return await self._call(prune)

    async def _prune_loop(self):
        while True:
            try:
                await self.prune_windows(time.time())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.debug("governance: the postgres window prune did not run", exc_info=True)
            await asyncio.sleep(PRUNE_EVERY_SECS)


# ---------------------------------------------------------------------------- worker: connections
class _Conns:
    """The ledger's connections, up to `size`, made on first need, each serving one statement at a
    time: asyncpg's pool without its per-call cost (acquire, release, the reset query, a timeout
    context: ~360 bytecodes a call). A connection a call failed on is thrown away (its state is
    unknown); expire() throws away the idle ones and marks the busy ones to go when they return
    (the database came back: they may be dead)."""

    def __init__(self, url: str, timeout: float, size: int):
        self.url = url
        self.timeout = timeout
        self.size = size
        self.idle = []                  # (connection, when it came back), newest last
        self.n = 0                      # connections open or being opened
        self.waiters = deque()          # futures of calls waiting for a connection
        self.gen = 0
        self.gen_of = {}                # connection -> the generation it was made in
        self.closed = False

    async def _connect(self):
        self.n += 1
        try:
            conn = await _asyncpg().connect(self.url, timeout=self.timeout,
                                            command_timeout=self.timeout,
                                            server_settings={"application_name": "busbar"})
        except BaseException:
            self.n -= 1
            self._wake()
            raise
        self.gen_of[conn] = self.gen
        return conn

    async def get(self):
        if self.closed:
            raise ConnectionError("the ledger is closed")
        while self.idle:
            conn, since = self.idle.pop()
            if conn.is_closed() or time.monotonic() - since > IDLE_SECS:
                self.drop(conn)         # the server (or a proxy) may have closed it meanwhile
                continue
            return conn
        if self.n < self.size:
            return await self._connect()
        fut = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            conn = await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled() and fut.result() is not None:
                self.put(fut.result())
            raise
        return conn if conn is not None else await self._connect()

    def _wake(self):
        """A connection slot came free: the first waiter opens a connection of its own."""
        while self.waiters:
            f = self.waiters.popleft()
            if not f.done():
                f.set_result(None)
                return

    def put(self, conn):
        if self.closed or conn.is_closed() or self.gen_of.get(conn) != self.gen:
            self.drop(conn)
            return
        while self.waiters:
            f = self.waiters.popleft()
            if not f.done():
                f.set_result(conn)
                return
        self.idle.append((conn, time.monotonic()))

    def drop(self, conn):
        """A connection thrown away (failed, expired or closing)."""
        self.gen_of.pop(conn, None)
        self.n -= 1
        conn.terminate()
        if not self.closed:
            self._wake()

    def expire(self):
        self.gen += 1
        idle, self.idle = self.idle, []
        for conn, _ in idle:
            self.drop(conn)

    async def close(self, timeout: float):
        self.closed = True
        idle, self.idle = self.idle, []
        for conn, _ in idle:
            self.gen_of.pop(conn, None)
            self.n -= 1
            try:
                await asyncio.wait_for(conn.close(), timeout)
            except Exception:
                conn.terminate()
        while self.waiters:
            f = self.waiters.popleft()
            if not f.done():
                f.set_exception(ConnectionError("the ledger is closed"))

    async def run(self, sql, args):
        """One statement on a connection of the set; its value."""
        conn = await self.get()
        try:
            out = await conn.fetchval(sql, *args)
        except BaseException:
            self.drop(conn)
            raise
        self.put(conn)
        return out

    async def schema(self):
        """ensure_schema on a connection of the set."""
        conn = await self.get()
        try:
            await ensure_schema(conn)
        except BaseException:
            self.drop(conn)
            raise
        self.put(conn)


# ---------------------------------------------------------------------------- worker: ledger
class PostgresLedger:
    """Admission and settlement against the ledger in Postgres (one worker's view). Construct
    anywhere; `await start()` in the worker's own event loop.

    A check is (bucket, kind, limit, charge, window start, seconds to the roll, group, per): the
    bucket a Rust ledger bucket id (model.rust_bucket) counted in its usage_windows row, or, for a
    concurrent limit, the group's busbar_concurrency row."""

    remote = True

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT,
                 pool_size: int = DEFAULT_POOL_SIZE):
        self.url = url
        self.timeout = timeout
        self.pool_size = pool_size
        self.up = False                 # the schema is checked and the database answers
        self._conns = None              # _Conns, from start()
        self._pend = _Writes()          # settles not yet in the database
        self._rates = {}                # id(rate card) -> (the card, its five array literals)
        self._shapes = {}               # a request's checks' shape -> _Shape
        self._loop = None
        self._queue = []                # admissions not yet sent: (shape, card, reserve, future,
                                        # checks)
        self._wake = False              # a sender is to start at the next loop turn
        self._senders = set()           # the tasks sending admission batches
        # admission senders at once: one pooled connection each, one left for the settlements
        self._max_senders = max(1, pool_size - 1)
        self._flusher = None            # the task writing the pending settles
        self._prober = None             # the task asking a down database again
        self._down = ()

    async def start(self):
        self._down = _down_errors()
        self._loop = asyncio.get_running_loop()
        self._conns = _Conns(self.url, self.timeout, self.pool_size)
        try:
            await self._conns.schema()
            self.up = True
        except self._down as e:
            self._went_down(e)
        except StoreError as e:
            log.error("governance: %s", e)
            self._went_down(e)

    async def close(self, timeout: float = 2.0):
        """Writes what is pending (bounded by `timeout`), then disconnects."""
        if self._conns is None:
            return
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except asyncio.TimeoutError:
            pass
        for t in (self._flusher, self._prober, *self._senders):
            if t is not None and not t.done():
                t.cancel()
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
        q, self._queue = self._queue, []
        self._answer(q, None)           # admissions never sent: unavailable
        await self._conns.close(timeout)
        self._conns = None

    async def flush(self):
        """Waits until every settle so far is written, or could not be (then it is kept)."""
        t = self._flusher
        if t is not None and not t.done():
            await asyncio.wait([t])
        if self.up and self._pend:
            self._kick()
            await asyncio.wait([self._flusher])

    # -- admission
    def _card(self, card) -> tuple:
        """busbar_admit_v2's rate card arguments (models, and nano-units per token of each tier),
        as array literals, kept per card."""
        got = self._rates.get(id(card))
        if got is None or got[0] is not card:
            items = sorted((card or {}).items())
            got = (card, _text_lit([m for m, _ in items]),
                   _num_lit([1000.0 * r.input for _, r in items]),
                   _num_lit([1000.0 * r.output for _, r in items]),
                   _num_lit([1000.0 * r.cache_read for _, r in items]),
                   _num_lit([1000.0 * r.cache_write for _, r in items]))
            if len(self._rates) > 16:
                self._rates.clear()
            self._rates[id(card)] = got
        return got

    def _shape(self, checks) -> _Shape:
        """What admission and settlement need of a request's checks, kept per shape (each check's
        bucket, kind, limit, window start and group: the same for every request of a key's
        group chain and pool within a window)."""
        shape = tuple(map(_SHAPE_OF, checks))
        got = self._shapes.get(shape)
        if got is None:
            got = _Shape(checks)
            if len(self._shapes) >= SHAPES_MAX:
                self._shapes.clear()
            self._shapes[shape] = got
        return got

    def admit_args(self, checks, card, reserve) -> list:
        """busbar_admit_v2's arguments for a request's checks."""
        sp = self._shape(checks)
        return [*sp.args, *(self._card(card)[1:] if sp.budget else _NO_CARD), reserve]

    async def admit(self, checks, now: float, card=None, reserve: int = 0, fee: int = 0):
        """None when admitted (charged), a Denial, or UNAVAILABLE. `reserve`: the budget
        reservation (nano-units) charged to every budget bucket; `card`: the rate card a budget's
        tokens are priced with; `fee`: per_request_fee (nano-units), reserved with it and kept in
        the bucket's busbar_inflight row by a 2xx settle (the spend admission reads is the
        reservations plus the tokens at the card).

        The admissions asked for in one event-loop turn go to the database together, one
        statement (busbar_admit_batch_v2, each request all or nothing, in the order asked); while
        every sender is waiting on the database the next ones gather for the next statement."""
        if not checks:
            return None
        if not self.up:
            return UNAVAILABLE
        reserve += fee
        fut = self._loop.create_future()
        self._queue.append((self._shape(checks), card, reserve, fut, checks))
        if not self._wake and len(self._senders) < self._max_senders:
            self._wake = True
            self._loop.call_soon(self._start_sender)
        # A caller cancelled meanwhile (its client went away) cancels `fut`; its admission still
        # runs, and what it charged is given back when the batch answers (_answer).
        failed = await fut
        if failed == 0:
            return None
        if failed < 0:
            return UNAVAILABLE
        return _denial(checks[failed - 1])

    def _start_sender(self):
        self._wake = False
        if self._queue and len(self._senders) < self._max_senders:
            t = self._loop.create_task(self._sender())
            self._senders.add(t)
            t.add_done_callback(self._senders.discard)

    async def _sender(self):
        """Sends the queued admissions, a batch at a time, until none is left."""
        while self._queue:
            if not self.up:
                q, self._queue = self._queue, []
                self._answer(q, None)
                return
            batch = self._take()
            if self._queue and not self._wake and len(self._senders) < self._max_senders:
                self._wake = True
                self._loop.call_soon(self._start_sender)
            await self._admit_batch(batch)

    def _take(self) -> list:
        """The next batch: up to ADMIT_BATCH_MAX queued admissions, those with a budget priced by
        one rate card (the statement takes one)."""
        q = self._queue
        card = _UNSET = object()
        n = 0
        for sp, c, _r, _f, _ch in q:
            if n == ADMIT_BATCH_MAX:
                break
            if sp.budget:
                if card is _UNSET:
                    card = c
                elif c is not card:
                    break
            n += 1
        batch = q[:n]
        del q[:n]
        return batch

    async def _admit_batch(self, batch):
        if len(batch) == 1:
            sp, card, reserve, _f, _c = batch[0]
            sql = ADMIT_SQL
            args = [*sp.args, *(self._card(card)[1:] if sp.budget else _NO_CARD), reserve]
        else:
            sql = ADMIT_BATCH_SQL
            args = self._batch_args(batch)
        out = None
        try:
            out = await self._run(sql, *args)
        except self._down as e:
            self._went_down(e)
        except asyncio.CancelledError:
            self._answer(batch, None)
            raise
        except Exception as e:
            _log_error("admission failed: %r" % e)
        self._answer(batch, out if out is None or len(batch) > 1 else out[:1])

    def _batch_args(self, batch) -> list:
        """busbar_admit_batch_v2's arguments: the batch's buckets and groups (sorted: the lock
        order), every request's checks, buckets and groups as indexes into them, its reservation,
        and the rate card."""
        union = sorted({b for it in batch for b in it[0].buckets})
        groups = sorted({g for it in batch for g in it[0].groups})
        uidx = {b: str(i + 1) for i, b in enumerate(union)}
        gidx = {g: str(i + 1) for i, g in enumerate(groups)}
        nc, kinds, cidx, limits, nb, qidx, flags, ng, hidx, res = ([] for _ in range(10))
        card = None
        mapped = {}                     # shape -> its indexes into this batch's buckets, groups
        for sp, c, reserve, _f, _ch in batch:
            m = mapped.get(sp)
            if m is None:
                m = mapped[sp] = ([gidx[k] if g else uidx[k] for g, k in sp.refs],
                                  [uidx[b] for b in sp.buckets], [gidx[g] for g in sp.groups])
            n = sp.counts
            nc.append(n[0])
            nb.append(n[1])
            ng.append(n[2])
            kinds += sp.kinds
            limits += sp.limits
            cidx += m[0]
            qidx += m[1]
            flags += sp.flags
            hidx += m[2]
            res.append(str(reserve))
            if sp.budget:
                card = c
        j = ",".join
        return [_text_lit([b for b, _ in union]), _num_lit([s for _, s in union]),
                _text_lit(groups), "{%s}" % j(nc), "{%s}" % j(kinds), "{%s}" % j(cidx),
                "{%s}" % j(limits), "{%s}" % j(nb), "{%s}" % j(qidx), "{%s}" % j(flags),
                "{%s}" % j(ng), "{%s}" % j(hidx), "{%s}" % j(res),
                *(self._card(card)[1:] if card is not None else _NO_CARD)]

    def _answer(self, batch, statuses):
        """Each admission's status to its caller (-1: unavailable); one whose caller left is given
        back if it was admitted."""
        for i, (_sp, _card, reserve, fut, checks) in enumerate(batch):
            st = -1 if statuses is None else statuses[i]
            if fut.cancelled():
                if st == 0:
                    self.undo(checks, reserve)
            elif not fut.done():
                fut.set_result(st)

    async def _run(self, sql, *args):
        return await self._conns.run(sql, args)

    def undo(self, checks, reserve: int = 0, fee: int = 0) -> None:
        """An admission that was not used (its client left before it started): every charge back."""
        try:
            sp = self._shape(checks)
            w = self._pend
            for g in sp.groups:
                w.gauge(g, -1)
            for b, s in sp.buckets:
                w.window(b, s, -1, -1)
            for b, s in sp.budget:
                w.reserve(b, s, -reserve - fee)
            self._kick_if_idle()
        except Exception as e:
            _log_error("undo failed: %r" % e)

    # -- settlement
    def settle(self, checks, reserve: int, usage: Usage | None, ok: bool = True,
               cost: int = 0, fee: int = 0) -> None:
        """A request's end: its tokens into every ledger bucket of its checks (and, as the Rust
        ledger has it, into the key's own bucket, which also counts it), its reservation taken back
        (the tokens now price it), a non-2xx answer taken off the billable count, its concurrency
        slot back, and its metering row. Written in the background, merged with the others."""
        try:
            sp = self._shape(checks)
            # a 2xx keeps its per_request_fee in the budget rows; anything else gets it back
            d = (-reserve - (0 if ok else fee)) if sp.budget else 0
            if usage is None:
                self._pend.settle(sp, None, 0, "", "", None, 1 if ok else 0, _NO_TOKENS, d)
            else:
                self._pend.settle(sp, usage.key_id, _day_epoch(usage.day), usage.model or "",
                                  usage.provider or "", usage.group, 1 if ok else 0,
                                  (usage.input_tokens, usage.output_tokens,
                                   usage.cache_read_tokens, usage.cache_write_tokens), d)
            self._kick_if_idle()
        except Exception as e:
            _log_error("settle failed: %r" % e)

    def _kick_if_idle(self):
        if self.up and self._conns is not None and (self._flusher is None or self._flusher.done()):
            self._kick()

    def _kick(self):
        self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self):
        """Writes until nothing is pending (settles made meanwhile go in the next statement); an
        SQL error (not an outage) is tried again after PROBE_INTERVAL."""
        while self.up and self._pend:
            err = await self._write_pending()
            if err is None:
                continue
            if isinstance(err, self._down):
                return
            await asyncio.sleep(PROBE_INTERVAL)

    async def _write_pending(self):
        """One statement with everything pending; on failure it stays pending. None when written,
        else the exception."""
        pend = self._pend
        self._pend = _Writes()
        try:
            await self._run(SETTLE_SQL, pend.doc())
        except BaseException as e:
            pend.merge(self._pend)
            self._pend = pend
            if isinstance(e, asyncio.CancelledError):
                raise
            if isinstance(e, self._down):
                self._went_down(e)
            else:
                _log_error("settlement failed (kept for the next attempt): %r" % e)
            return e
        return None

    # -- reachability
    def _went_down(self, err):
        was_up = self.up
        self.up = False
        if was_up or self._prober is None:
            # Operational event, fields as busbar/observability/events.py writes them.
            log.warning('store_unreachable store=postgres url=%s error="%s" fail_mode=closed '
                        'effect="refusing with 503"', safe_url(self.url),
                        _scrub(str(err) or err.__class__.__name__, self.url).replace('"', "'"))
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self):
        """While down: ask again every PROBE_INTERVAL; once it answers (schema checked), write
        everything kept meanwhile, then send admission back to the database."""
        while True:
            await asyncio.sleep(PROBE_INTERVAL)
            try:
                self._conns.expire()
                await self._conns.schema()
            except Exception:
                continue
            pending = bool(self._pend)
            self.up = True
            while self._pend:
                if await self._write_pending() is not None:
                    break
            if not self.up:
                continue
            log.info("store_reachable store=postgres url=%s reconciled=%s", safe_url(self.url),
                     "true" if pending else "false")
            if self._pend:
                self._kick()
            return


# ---------------------------------------------------------------------------- worker: policy cache
class PostgresDirectory(PolicyCache):
    """Key and group policy, cached in this worker (PolicyCache), dropped on the invalidation
    NOTIFY and read again after POLICY_TTL at the latest.

    Lookups return the record, None (unknown), or UNAVAILABLE when the database cannot be read.
    While the LISTEN connection is down nothing is cached (a change could not be heard of): every
    lookup reads the database; once listening again the cache starts empty."""

    KEY_CACHE_MAX = 100000

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT, pool_size: int = 2):
        self.url = url
        self.timeout = timeout
        self.pool_size = pool_size
        self._init_cache()
        self._pool = None
        self._listening = None

    async def start(self):
        self._down = _down_errors()
        self._pool = await _pool(self.url, self.timeout, self.pool_size, reset=False)
        self._listening = asyncio.Event()
        self._listener = asyncio.get_running_loop().create_task(self._listen())
        try:    # normally listening within a round trip; a down database does not hold the boot
            await asyncio.wait_for(self._listening.wait(), min(self.timeout, 1.0))
        except asyncio.TimeoutError:
            pass

    async def close(self):
        await self._stop_listener()
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), 2.0)
            except Exception:
                self._pool.terminate()
            self._pool = None

    async def _fetch(self, kind, name, now):
        async with self._pool.acquire() as conn:
            if kind == "k":
                return await _read_key(conn, name, now)
            if kind == "g":
                return await _read_group(conn, name)
            return await _read_by_aws(conn, name, now)

    async def _listen(self):
        """LISTEN on a connection of its own for as long as the database allows; every
        (re)subscription starts from an empty cache, and a connection that dies or stops answering
        is thrown away whole (with the cache: a change made meanwhile went unheard)."""
        a = _asyncpg()
        while True:
            conn = None
            dead = asyncio.Event()
            try:
                conn = await a.connect(self.url, timeout=self.timeout,
                                       command_timeout=self.timeout,
                                       server_settings={"application_name": "busbar-listen"})
                conn.add_termination_listener(lambda _c, d=dead: d.set())
                await conn.add_listener(CHANNEL, lambda _c, _pid, _ch, payload: self._drop(payload))
                self._drop_all()
                self.live = True
                self._listening.set()
                while True:
                    try:
                        await asyncio.wait_for(dead.wait(), LISTEN_PING)
                    except asyncio.TimeoutError:
                        await conn.fetchval("SELECT 1")
                        continue
                    raise ConnectionError("the invalidation connection closed")
            except asyncio.CancelledError:
                self.live = False
                if conn is not None:
                    conn.terminate()
                raise
            except Exception as e:
                if self.live:
                    log.debug("invalidation channel lost (%s); policy cache dropped", e)
                self.live = False
                self._drop_all()
                if conn is not None:
                    conn.terminate()
                await asyncio.sleep(PROBE_INTERVAL)
