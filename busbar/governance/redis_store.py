"""Governance in Valkey/Redis (`store: {module: valkey, settings: {url}}`), in the key layout of
the Rust gateway's valkey store (GetBusbar/store-valkey), so both gateways can share one Valkey
during a rolling swap; one budget and one rate limit, exact across a fleet of busbar gateways.

Three objects, all talking to the same Redis:

- `RedisStore` (the parent, admin API): keys, credentials, the denylist, groups and usage, in the
  store contract of busbar/governance/store.py; every change is published on the invalidation
  channel in the same atomic step as the write.
- `RedisLedger` (every worker, hot path): admission is ONE Lua script (EVALSHA) that tests every
  check of a request against the ledger and charges all of them or none; settlement is ONE script
  per batch, sent in the background (the settles of one event-loop turn are merged into one round
  trip).
- `RedisDirectory` (every worker): key and group policy cached per worker, dropped on the
  invalidation message of a change, and re-read after POLICY_TTL at the latest (a Rust gateway
  sharing the store publishes nothing: its revocations are seen that late).

Layout (prefix `busbar:`; the tests give each their own):
    schema                      "6" (the Rust store's marker; it wipes a namespace without it)
    revision                    counter stamped into key and credential rows
    key:<id>                    the Rust VirtualKey JSON; `keys` (set) and `keys:byrev` (zset)
    cred:<key id>:sigv4:<slot>  the Rust CredentialSecret JSON of an AWS pair ("v1:plain:<secret>"),
                                cred:pub:sigv4:<access key id> and cred:id:<id> -> "<key>:sigv4:<slot>",
                                cred:ids:<key id> (set of "sigv4:<slot>"), creds:byrev (zset)
    denylist:<id>, denylist     a revoked or deleted key's id (reason; the set of all)
    usage:<bucket>:<start>      the ledger (hash): `requests`, `billable_requests`, and
                                `m:<model>:<tier>` tokens (input, output, cache_read, cache_write),
                                per bucket (a key's own: its id, start 0; a group's:
                                `group:<name>@<per>[#pool:<pool>]`, the window's first second)
    metering:<day>              set of the day's rows; metering:<day>:<key>|<model>|<provider>
                                (hash, `\\` and `|` escaped): requests, billable_requests,
                                tokens_input/output/cache_read/cache_write, key_id, model,
                                provider, key_group_at_use, pricing_version
busbar's own, in the same namespace (the Rust store reads none of them):
    bb:groups                   groups made through the admin API (hash name -> JSON)
    bb:conc:<group>             a group's requests in flight (a concurrent limit)
    bb:rates:<digest>           a rate card, nano-units per token per model: the admission script
                                prices the ledger's tokens with it (spend is derived, as there)
    field bb:reserved           of a ledger hash: the budget reservations of requests in flight
    bb:inval                    channel: "key:<id>", "group:<name>", "all"

The limits: requests are the ledger's `requests` of the bucket's window; tokens its tokens of all
four tiers (the Rust ledger's total); a budget its tokens priced at the current rate card plus the reservations in
flight; all of them as the Rust gateway's nodes write them too, so what a Rust node has flushed
counts here. Minute and hour ledgers expire at their window's roll + EXPIRE_MARGIN (the Rust store
keeps every hash; a roll-over ledger is never read again).

Unreachable Redis (refused, reset, or no answer within `timeout`, 0.5 s): the ledger logs one
WARNING ("store unreachable"), stops asking Redis on the hot path and probes in the background.
fail_mode "closed" answers "unavailable" (the engine's 503); "open" admits against a local
in-process count of the same limits, seeded with the last values this worker saw in Redis. Settles
are never lost: whatever could not be written (settles, and in "open" the local charges) is kept
in the worker and pushed to Redis in one script when it answers again, before admission goes back
to Redis (INFO "store reachable again"). A write that failed after it was sent is ambiguous (Redis
may have applied it); it is pushed again, so an outage can over-count, never under-count. Counts
never go below 0.

redis-py is imported only when one of these objects is started (`_redis()`), so a gateway without
Redis pays nothing for it. No connection is made before `start()`/`open()`: construct the objects
anywhere, start them in the event loop that will use them (after the fork, in each worker).
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time

import orjson

from busbar.governance.resp import DOWN, RespClient, RespError, redis_py
from cbusbar.respledger import LedgerLayout
from cbusbar.respledger import Writes as _Writes
from busbar.governance.model import (
    C_BUCKET, C_GROUP, C_KIND, C_LIMIT, C_PER, C_ROLL, C_WINDOW, USAGE_FIELDS, Denial, GroupRecord,
    KeyRecord, StoreError, Usage, credential_live, day_epoch, day_of_bucket, group_from_dict,
    group_to_dict, new_credential_id, record_of, sigv4_credential, usage_totals, virtual_key,
    window_deltas)

log = logging.getLogger("busbar.governance")

UNAVAILABLE = "unavailable"     # what admit and the directory return when Redis cannot answer
MISS = object()                 # RedisDirectory.cached_key: nothing cached for that id
DEFAULT_TIMEOUT = 0.5           # connect and read timeout of every Redis call, seconds
EXPIRE_MARGIN = 60              # a minute or hour ledger lives this long past its window's roll
NEGATIVE_TTL = 0.5              # an unknown key id / group is remembered this long
PROBE_INTERVAL = 0.2            # while Redis is unreachable, how often it is asked again
PUBSUB_PING = 2.0               # the invalidation subscription pings this often when idle...
PUBSUB_DEAD = 5.0               # ...and is declared dead (cache dropped) after this long silent
# A cached key or group is read again after this long even without an invalidation message: a
# Rust gateway sharing the store publishes none (the Rust side re-reads its denylist every 5 s,
# REVOCATION_SYNC_TTL_SECS, so a revocation reaches either gateway as late).
POLICY_TTL = 5.0
PREFIX = "busbar:"
# An audit record's fields, in the Rust AuditRecord's order (its JSON in the `audit` sorted set).
AUDIT_FIELDS = ("seq", "ts", "action", "resource", "outcome", "principal", "prev_hash", "hash")
SCHEMA_VERSION = 6
TIERS = ("input", "output", "cache_read", "cache_write")
# A CAS write (a key row changed between its read and its write) is tried again this often.
CAS_TRIES = 8


class StoreUnavailable(RuntimeError):
    """RedisStore (admin side) could not reach Redis."""


# ---------------------------------------------------------------------------- redis-py, lazily
_redis = redis_py     # busbar/governance/resp.py: redis-py's asyncio package, imported on first use


def _connect(url: str, timeout: float, retry: bool):
    """A client that fails fast: short timeouts, bytes replies. `retry`: a command that meets a
    closed connection (a pooled one that a Redis restart left behind) is sent once more on a new
    one; only for idempotent use (reads, the admin API). The ledger never retries: an EVALSHA
    resent after an ambiguous failure could charge twice."""
    ra = _redis()
    import redis.exceptions
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    return ra.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout,
                             retry=Retry(NoBackoff(), 1 if retry else 0,
                                         (redis.exceptions.ConnectionError,)),
                             decode_responses=False, health_check_interval=0)


def _down_errors():
    """Exceptions that mean "Redis did not answer" (as opposed to a Redis error reply)."""
    import redis.exceptions as e
    return (e.ConnectionError, e.TimeoutError, OSError, asyncio.TimeoutError)


# ---------------------------------------------------------------------------- the layout
def usage_key(p: str, bucket: str, start: int) -> str:
    return "%susage:%s:%d" % (p, bucket, start)


def conc_key(p: str, group: str) -> str:
    return "%sbb:conc:%s" % (p, group)


def metering_set(p: str, bucket: int) -> str:
    return "%smetering:%d" % (p, bucket)


# A metering row's key (`metering:<day>:<key>|<model>|<provider>`, `\\` and `|` escaped) is
# named by cbusbar/respledger.pyx (Writes.meter), as its day's set, and the ledger keys of the
# request path (LedgerLayout.key, the same names as ledger_key below).


def ledger_key(p: str, check) -> str:
    """The Redis key a check counts in: its bucket's ledger hash, or its group's gauge."""
    if check[C_KIND] == "concurrent":
        return conc_key(p, check[C_GROUP])
    return usage_key(p, check[C_BUCKET], check[C_WINDOW])


def _ledger_ttl(per, roll) -> int:
    """Seconds a minute or hour ledger hash lives: to its window's roll plus the margin; 0 (no
    expiry) for the day, month and total ones, which the Rust store keeps."""
    if per in ("minute", "hour") and roll is not None:
        return math.ceil(roll) + EXPIRE_MARGIN
    return 0


def _per_of(bucket_id: str) -> str | None:
    """The window word of a group bucket id (`group:<name>@<per>[#<scope>]`)."""
    if not bucket_id.startswith("group:"):
        return None
    return bucket_id.rpartition("@")[2].partition("#")[0]


def rates_key(p: str, card, fee: int = 0) -> tuple[str, dict]:
    """The hash a rate card is kept in for the admission script, and its fields: per model the
    nano-units per token of input, output, cache read, cache write (Rate's USD per million tokens
    x 1000), `_` so that an empty card exists too, and `bb:fee`, the per_request_fee in
    nano-units per billable request, when there is one. Named by its content: instances with
    different cards price with their own."""
    fields = {b"_": b"1"}
    if fee:
        fields[b"bb:fee"] = b"%d" % fee
    for model, rate in sorted((card or {}).items()):
        fields[model.encode()] = ("%r,%r,%r,%r" % (1000.0 * rate.input, 1000.0 * rate.output,
                                                  1000.0 * rate.cache_read,
                                                  1000.0 * rate.cache_write)).encode()
    digest = hashlib.sha256(b"\n".join(k + b"=" + v for k, v in sorted(fields.items()))).hexdigest()
    return "%sbb:rates:%s" % (p, digest[:16]), fields


# ---------------------------------------------------------------------------- scripts
# KEYS: nb ledger hashes, nc gauges, the rate card hash. ARGV: nb, nc, per hash (ttl, reserve),
# then per check (kind code, key index, limit). A budget's spend is its tokens at the card, its
# billable requests at the card's fee, and its reservations; admission tests it with the
# reservation and the fee added. Tests every check, then charges every bucket
# (requests +1, billable +1, its budget reservation) and gauge (+1), or nothing: returns {0, v1..vn}
# (each check's value before the charge), {i, v1..vi} with i the first failing check (1-based), or
# {-1} when a budget is checked and the rate card hash is missing (the caller writes it, retries).
ADMIT_LUA = """
local nb, nc = tonumber(ARGV[1]), tonumber(ARGV[2])
local rates = KEYS[nb + nc + 1]
local a = 3
local ttl, reserve = {}, {}
for i = 1, nb do
  ttl[i] = tonumber(ARGV[a]); reserve[i] = tonumber(ARGV[a + 1]); a = a + 2
end
local cache = {}
local function ledger(i)
  local L = cache[i]
  if L then return L end
  L = {req = 0, tok = 0, res = 0, bill = 0, models = {}}
  local h = redis.call('HGETALL', KEYS[i])
  for j = 1, #h, 2 do
    local f, v = h[j], tonumber(h[j + 1]) or 0
    if f == 'requests' then L.req = v
    elseif f == 'billable_requests' then L.bill = v
    elseif f == 'bb:reserved' then L.res = v
    else
      local m, tier = string.match(f, '^m:(.*):([%a_]+)$')
      if m then
        local t = L.models[m]
        if not t then t = {0, 0, 0, 0}; L.models[m] = t end
        if tier == 'input' then t[1] = v; L.tok = L.tok + v
        elseif tier == 'output' then t[2] = v; L.tok = L.tok + v
        elseif tier == 'cache_read' then t[3] = v; L.tok = L.tok + v
        elseif tier == 'cache_write' then t[4] = v; L.tok = L.tok + v end
      end
    end
  end
  cache[i] = L
  return L
end
local fee
local function spend(L)
  if L.spend then return L.spend end
  local s = L.res + L.bill * fee
  for m, t in pairs(L.models) do
    local r = redis.call('HGET', rates, m)
    if r then
      local ri, ro, rr, rw = string.match(r, '^([^,]*),([^,]*),([^,]*),([^,]*)$')
      s = s + t[1] * tonumber(ri) + t[2] * tonumber(ro) + t[3] * tonumber(rr) + t[4] * tonumber(rw)
    end
  end
  L.spend = s
  return s
end
local out = {0}
local n = 0
for c = a, #ARGV, 3 do
  n = n + 1
  local kind, i, lim = ARGV[c], tonumber(ARGV[c + 1]), tonumber(ARGV[c + 2])
  local v
  if kind == 'c' then
    v = tonumber(redis.call('GET', KEYS[i]) or '0')
    out[n + 1] = v
    if v + 1 > lim then out[1] = n return out end
  elseif kind == 'r' then
    v = ledger(i).req
    out[n + 1] = v
    if v + 1 > lim then out[1] = n return out end
  elseif kind == 't' then
    v = ledger(i).tok
    out[n + 1] = v
    if v >= lim then out[1] = n return out end
  else
    if redis.call('EXISTS', rates) == 0 then return {-1} end
    if not fee then fee = tonumber(redis.call('HGET', rates, 'bb:fee') or '0') end
    v = spend(ledger(i))
    out[n + 1] = math.floor(v)
    if v + reserve[i] + fee > lim then out[1] = n return out end
  end
end
for i = 1, nb do
  redis.call('HINCRBY', KEYS[i], 'requests', 1)
  redis.call('HINCRBY', KEYS[i], 'billable_requests', 1)
  if reserve[i] > 0 then redis.call('HINCRBY', KEYS[i], 'bb:reserved', reserve[i]) end
  if ttl[i] > 0 and redis.call('TTL', KEYS[i]) == -1 then redis.call('EXPIRE', KEYS[i], ttl[i]) end
end
for g = nb + 1, nb + nc do redis.call('INCR', KEYS[g]) end
return out
"""

# KEYS: nh hashes, ng gauges, nm metering rows, the schema marker. ARGV: nh, ng, nm, then per
# hash (ttl, nf, nf x (field, delta, floor-at-0 flag)), per gauge (delta), per metering row (its
# day's set, key id, model, provider, group at use), the schema version. A hash or gauge this
# creates gets its ttl; a row's attribution fields are written once (HSETNX), as there.
SETTLE_LUA = """
local nh, ng, nm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local a = 4
for i = 1, nh do
  local k = KEYS[i]
  local ttl, nf = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  a = a + 2
  for q = 1, nf do
    local v = redis.call('HINCRBY', k, ARGV[a], ARGV[a + 1])
    if ARGV[a + 2] == '1' and v < 0 then redis.call('HSET', k, ARGV[a], 0) end
    a = a + 3
  end
  if ttl > 0 and redis.call('TTL', k) == -1 then redis.call('EXPIRE', k, ttl) end
end
for g = nh + 1, nh + ng do
  local v = redis.call('INCRBY', KEYS[g], ARGV[a])
  if v < 0 then redis.call('SET', KEYS[g], 0) end
  a = a + 1
end
for r = nh + ng + 1, nh + ng + nm do
  redis.call('SADD', ARGV[a], KEYS[r])
  redis.call('HSET', KEYS[r], 'key_id', ARGV[a + 1], 'model', ARGV[a + 2], 'provider', ARGV[a + 3])
  redis.call('HSETNX', KEYS[r], 'key_group_at_use', ARGV[a + 4])
  redis.call('HSETNX', KEYS[r], 'pricing_version', '')
  a = a + 5
end
redis.call('SETNX', KEYS[nh + ng + nm + 1], ARGV[a])
return 1
"""

# A key's rows, written only if the key row and its credential row are still what the caller
# read (else 'RETRY'): the key (its revision stamped from the counter), its sigv4 credential and
# pointers (when a new one is given), the denylist (a revoked key), the schema marker, and the
# invalidation message.
# KEYS: 1 key row, 2 keys set, 3 keys:byrev, 4 revision, 5 cred row, 6 cred ids, 7 creds:byrev,
# 8 new pub pointer, 9 new id pointer, 10 old pub pointer, 11 old id pointer, 12 denylist set,
# 13 denylist entry, 14 schema.
# ARGV: 1 id, 2 key row read ('' none), 3 new key JSON (revision -1), 4 cred row read, 5 new
# cred JSON ('' unchanged), 6 cred pointer, 7 '1' to denylist, 8 channel, 9 schema version.
PUT_KEY_LUA = """
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[2] then return 'RETRY' end
if (redis.call('GET', KEYS[5]) or '') ~= ARGV[4] then return 'RETRY' end
local rev = redis.call('INCR', KEYS[4])
local stamp = '"revision":' .. rev
redis.call('SET', KEYS[1], (string.gsub(ARGV[3], '"revision":%-1', stamp, 1)))
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], rev, ARGV[1])
if ARGV[5] ~= '' then
  if KEYS[10] ~= KEYS[8] and redis.call('GET', KEYS[10]) == ARGV[6] then redis.call('DEL', KEYS[10]) end
  if KEYS[11] ~= KEYS[9] and redis.call('GET', KEYS[11]) == ARGV[6] then redis.call('DEL', KEYS[11]) end
  redis.call('SET', KEYS[5], (string.gsub(ARGV[5], '"revision":%-1', stamp, 1)))
  redis.call('SET', KEYS[8], ARGV[6])
  redis.call('SET', KEYS[9], ARGV[6])
  redis.call('SADD', KEYS[6], 'sigv4:0')
  redis.call('ZADD', KEYS[7], rev, ARGV[6])
end
if ARGV[7] == '1' then
  redis.call('SETNX', KEYS[13], 'revoked')
  redis.call('SADD', KEYS[12], ARGV[1])
end
redis.call('SETNX', KEYS[14], ARGV[9])
redis.call('PUBLISH', ARGV[8], 'key:' .. ARGV[1])
return 'OK'
"""

# A tombstone, if the key row is still what the caller read: the row (enabled false, deleted_at
# set, revision stamped), every credential of the key and its pointers gone, the key's own ledger
# gone (as the Rust store's delete_key does), the id on the denylist, the invalidation message.
# KEYS: 1 key row, 2 keys:byrev, 3 revision, 4 cred ids, 5 denylist set, 6 denylist entry, 7 the
# key's ledger hash. ARGV: 1 id, 2 key row read, 3 tombstone JSON (revision -1), 4 channel,
# 5 prefix.
DELETE_KEY_LUA = """
local cur = redis.call('GET', KEYS[1])
if not cur then return 'NOKEY' end
if cur ~= ARGV[2] then return 'RETRY' end
local rev = redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[1], (string.gsub(ARGV[3], '"revision":%-1', '"revision":' .. rev, 1)))
redis.call('ZADD', KEYS[2], rev, ARGV[1])
local p = ARGV[5]
for _, m in ipairs(redis.call('SMEMBERS', KEYS[4])) do
  local row = p .. 'cred:' .. ARGV[1] .. ':' .. m
  local raw = redis.call('GET', row)
  if raw then
    local ok, c = pcall(cjson.decode, raw)
    if ok and type(c) == 'table' and type(c['meta']) == 'table' then
      local meta = c['meta']
      redis.call('DEL', p .. 'cred:pub:' .. tostring(meta['kind']) .. ':' .. tostring(meta['public_id']))
      redis.call('DEL', p .. 'cred:id:' .. tostring(meta['id']))
    end
    redis.call('DEL', row)
  end
end
redis.call('DEL', KEYS[4])
redis.call('DEL', KEYS[7])
redis.call('SETNX', KEYS[6], 'deleted')
redis.call('SADD', KEYS[5], ARGV[1])
redis.call('PUBLISH', ARGV[4], 'key:' .. ARGV[1])
return 'OK'
"""

# A key as the directory needs it: KEYS: key row, denylist set, its sigv4 credential rows (slots
# 0 and 1). ARGV: id. -> {key JSON or false, denied 0/1, slot 0 JSON or false, slot 1 or false}.
KEY_READ_LUA = """
return {redis.call('GET', KEYS[1]), redis.call('SISMEMBER', KEYS[2], ARGV[1]),
        redis.call('GET', KEYS[3]), redis.call('GET', KEYS[4])}
"""

# The key of an AWS access key id: KEYS: its pub pointer. ARGV: prefix.
# -> nil, or {key id, key JSON or false, denied 0/1, credential JSON or false}.
KEY_BY_AWS_LUA = """
local ptr = redis.call('GET', KEYS[1])
if not ptr then return nil end
local key_id = string.match(ptr, '^(.*):[^:]*:[^:]*$')
if not key_id then return nil end
local p = ARGV[1]
return {key_id, redis.call('GET', p .. 'key:' .. key_id),
        redis.call('SISMEMBER', p .. 'denylist', key_id), redis.call('GET', p .. 'cred:' .. ptr)}
"""


# ---------------------------------------------------------------------------- records
def _cred_of(raw):
    if not raw:
        return None
    try:
        c = orjson.loads(raw)
        return c if isinstance(c, dict) and isinstance(c.get("meta"), dict) else None
    except orjson.JSONDecodeError:
        return None


def _live_cred(rows, now):
    """The credential of a key's slot rows that admits, else the first present (or None)."""
    creds = [c for c in (_cred_of(r) for r in rows) if c is not None]
    for c in creds:
        if credential_live(c["meta"], now):
            return c
    return creds[0] if creds else None


def _record(key_raw, denied, cred_rows, now):
    if not key_raw:
        return None
    try:
        vk = orjson.loads(key_raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(vk, dict) or not isinstance(vk.get("id"), str):
        return None
    return record_of(vk, bool(denied), _live_cred(cred_rows, now), now)


def _json_with_revision_slot(d: dict) -> bytes:
    """JSON with `"revision":-1` for the script to stamp (orjson keeps the dict's order)."""
    d = dict(d)
    d["revision"] = -1
    return orjson.dumps(d)


def _usage_writes(p, rows, windows, now) -> _Writes:
    """What store.add_usage writes: the rows into the metering, the window deltas into the
    ledger hashes (a minute or hour one with its expiry)."""
    w = _Writes()
    for u in rows:
        w.meter(p, day_epoch(u.day), u.key_id, u.group, u.model or "", u.provider or "",
                [getattr(u, f) for f in USAGE_FIELDS])
    for (bucket, start), (req, bill, models) in (windows or {}).items():
        per = _per_of(bucket)
        ttl = 0
        if per in ("minute", "hour"):
            span = 60 if per == "minute" else 3600
            ttl = max(1, math.ceil(start + span - now)) + EXPIRE_MARGIN
        w.ledger(p, bucket, start, req, bill, models, ttl)
    return w


# ---------------------------------------------------------------------------- admin side
class RedisStore:
    """The store contract (busbar/governance/store.py) in the Rust valkey layout, for the admin
    API (the parent process). Every method raises StoreUnavailable when Redis does not answer."""

    kind = "redis"

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT, prefix: str = PREFIX,
                 earlier_prefix: str | None = None):
        self.url = url
        self.timeout = timeout
        self.prefix = prefix
        self.channel = prefix + "bb:inval"
        # busbar's earlier layout, carried over into a fresh namespace (_carry_busbar_v0): its
        # default prefix, beside the default namespace
        self.earlier_prefix = earlier_prefix if earlier_prefix is not None else (
            "bb:" if prefix == PREFIX else None)
        self._r = None

    async def open(self):
        """Connects; no I/O yet (a Redis down at boot does not hold the boot): the namespace's
        schema marker is checked by the first call that reaches Redis."""
        self._r = _connect(self.url, self.timeout, retry=True)
        self._down = _down_errors()
        self._put_key = self._r.register_script(PUT_KEY_LUA)
        self._del_key = self._r.register_script(DELETE_KEY_LUA)
        self._by_aws = self._r.register_script(KEY_BY_AWS_LUA)
        self._settle = self._r.register_script(SETTLE_LUA)
        self._checked = False

    async def _check_schema(self):
        """The namespace's schema marker: set on a fresh namespace; another version is refused
        (the Rust store wipes one below v6; busbar deletes nothing). Then the eviction policy."""
        p = self.prefix
        marker = await self._r.get(p + "schema")
        if marker is None:
            if await self._r.setnx(p + "schema", SCHEMA_VERSION) and self.earlier_prefix:
                await self._carry_busbar_v0(self.earlier_prefix)
        else:
            try:
                version = int(marker)
            except ValueError:
                version = -1
            if version != SCHEMA_VERSION:
                raise StoreError(
                    "valkey at %s: the %s namespace has store schema v%s; this busbar reads v%d%s"
                    % (_safe_url(self.url), p, marker.decode(errors="replace"), SCHEMA_VERSION,
                       " (written by a newer gateway)" if version > SCHEMA_VERSION else ""))
        await self._check_eviction()
        self._checked = True

    async def _carry_busbar_v0(self, old: str):
        """A fresh namespace beside busbar's earlier layout (prefix `bb:`: keys and groups as JSON
        in the hashes bb:keys and bb:groups, usage per day in bb:u:<day>): its keys (with their AWS
        pairs; revoked and deleted ones denylisted), groups and usage (the metering, and each
        key's own ledger) are written here once. The old keys are left where they are. Tokens of
        that layout were HMAC-signed: they must be rotated to verify again."""
        r = self._r
        docs = await r.hvals(old + "keys")
        groups = await r.hvals(old + "groups")
        days = sorted(d.decode() for d in await r.smembers(old + "udays"))
        if not (docs or groups or days):
            return
        now = int(time.time())
        for raw in docs:
            d = orjson.loads(raw)
            rec = KeyRecord(d["id"], d.get("name") or "", d.get("group"), d.get("allowed_pools"),
                            d.get("state") or "active", d.get("created") or now, d.get("expires"),
                            str(d["gen"]) if d.get("gen") is not None else None,
                            d.get("aws_access_key_id"), d.get("aws_secret"), None,
                            d.get("labels") or {})
            if rec.expires is not None and rec.expires <= rec.created:
                rec.expires = None
            if not rec.aws_secret:
                rec.aws_access_key_id = None
            tomb = rec.state == "tombstoned"
            if tomb:
                rec.state = "revoked"
            await self.put_key(rec)
            if tomb:
                await self.delete_key(rec.id)
        for raw in groups:
            await self.put_group(group_from_dict(orjson.loads(raw)))
        rows = {}
        for day in days:
            for field, value in (await r.hgetall(old + "u:" + day)).items():
                key_id, group, model, pool, metric = orjson.loads(field)
                u = rows.get((day, key_id, group, model, pool))
                if u is None:
                    u = rows[(day, key_id, group, model, pool)] = Usage(
                        day, key_id, group, model, pool, 0, billable_requests=0)
                if metric in USAGE_FIELDS:
                    setattr(u, metric, getattr(u, metric) + int(value))
        for u in rows.values():
            if not u.billable_requests:
                u.billable_requests = u.requests
        if rows:
            await self.add_usage(list(rows.values()), window_deltas(
                rows.values(), lambda group, pool: [], now))
        log.info("governance: busbar's earlier Redis layout (%s*) carried into %s*: %d key(s), "
                 "%d group(s), %d usage row(s)", old, self.prefix, len(docs), len(groups), len(rows))

    async def _check_eviction(self):
        """An eviction policy can drop a denylist entry (un-revoking a key) or a ledger hash with
        no error anywhere: the Rust store refuses to start on one; busbar says so loudly."""
        try:
            got = await self._r.config_get("maxmemory-policy")
        except Exception:
            log.warning("valkey at %s: CONFIG GET maxmemory-policy is not allowed; cannot check "
                        "that the server never evicts governance data (noeviction)",
                        _safe_url(self.url))
            return
        policy = got.get(b"maxmemory-policy") or got.get("maxmemory-policy")
        if isinstance(policy, bytes):
            policy = policy.decode()
        if policy and policy != "noeviction":
            log.warning("valkey at %s: maxmemory-policy is %s, not noeviction: under memory "
                        "pressure it can silently drop a revocation or a ledger count (the Rust "
                        "gateway refuses to start so); set noeviction", _safe_url(self.url), policy)

    async def close(self):
        if self._r is not None:
            await self._r.aclose()
            self._r = None

    async def _call(self, coro):
        try:
            if not self._checked:
                await self._check_schema()
            return await coro
        except self._down as e:
            raise StoreUnavailable("redis at %s: %s" % (_safe_url(self.url), e)) from None
        finally:
            if hasattr(coro, "close"):
                coro.close()        # not awaited when the check failed: no "never awaited"

    async def ping(self) -> None:
        await self._call(self._r.ping())

    # -- keys
    def _cred_keys(self, key_id):
        p = self.prefix
        return p + "cred:%s:sigv4:0" % key_id, p + "cred:%s:sigv4:1" % key_id

    async def put_key(self, rec: KeyRecord) -> None:
        p = self.prefix
        now = int(time.time())
        slot0 = self._cred_keys(rec.id)[0]
        pointer = "%s:sigv4:0" % rec.id
        for _ in range(CAS_TRIES):
            pipe = self._r.pipeline(transaction=False)
            pipe.get(p + "key:" + rec.id)
            pipe.get(slot0)
            old_key, old_cred = await self._call(pipe.execute())
            if old_key:
                old = orjson.loads(old_key)
                if old.get("deleted_at") is not None and rec.state != "tombstoned":
                    raise StoreError("key %s is deleted (tombstoned); it cannot be written back"
                                     % rec.id)
            cur = _cred_of(old_cred)
            new_cred = b""
            old_pub = old_id = ""
            if cur is not None:
                old_pub = p + "cred:pub:sigv4:%s" % cur["meta"].get("public_id")
                old_id = p + "cred:id:%s" % cur["meta"].get("id")
            if rec.state in ("revoked", "tombstoned"):
                if cur is not None and cur["meta"].get("revoked_at") is None:
                    meta = cur["meta"]
                    meta.update(revoked_at=now, revoke_reason="revoked", updated_at=now)
                    cur["secret"] = ""
                    new_cred = _json_with_meta_revision_slot(cur)
            elif rec.aws_access_key_id and rec.aws_secret and not (
                    cur is not None and cur["meta"].get("public_id") == rec.aws_access_key_id
                    and credential_live(cur["meta"], now)):
                if rec.aws_cred_id is None or (cur is not None and cur["meta"].get("id") ==
                                               rec.aws_cred_id):
                    rec.aws_cred_id = new_credential_id()
                new_cred = _json_with_meta_revision_slot(sigv4_credential(rec, now))
            cred_meta = _cred_of(new_cred)["meta"] if new_cred else (cur or {}).get("meta", {})
            keys = [p + "key:" + rec.id, p + "keys", p + "keys:byrev", p + "revision", slot0,
                    p + "cred:ids:" + rec.id, p + "creds:byrev",
                    p + "cred:pub:sigv4:%s" % cred_meta.get("public_id"),
                    p + "cred:id:%s" % cred_meta.get("id"), old_pub or p + "cred:pub:-",
                    old_id or p + "cred:id:-", p + "denylist", p + "denylist:" + rec.id,
                    p + "schema"]
            args = [rec.id, old_key or b"", _json_with_revision_slot(virtual_key(rec, now)),
                    old_cred or b"", new_cred, pointer,
                    "1" if rec.state in ("revoked", "tombstoned") else "", self.channel,
                    SCHEMA_VERSION]
            out = await self._call(self._put_key(keys=keys, args=args))
            if out != b"RETRY":
                return
        raise StoreError("key %s changed under every one of %d writes" % (rec.id, CAS_TRIES))

    async def _read_keys(self, ids) -> list[KeyRecord]:
        if not ids:
            return []
        p = self.prefix
        now = time.time()
        pipe = self._r.pipeline(transaction=False)
        pipe.smembers(p + "denylist")
        for kid in ids:
            pipe.get(p + "key:" + kid)
            for k in self._cred_keys(kid):
                pipe.get(k)
        got = await self._call(pipe.execute())
        denied = {d.decode() for d in got[0]}
        out = []
        for i, kid in enumerate(ids):
            key_raw, c0, c1 = got[1 + 3 * i: 4 + 3 * i]
            rec = _record(key_raw, kid in denied, (c0, c1), now)
            if rec is not None:
                out.append(rec)
        return out

    async def get_key(self, key_id) -> KeyRecord | None:
        got = await self._read_keys([key_id])
        return got[0] if got else None

    async def key_by_aws(self, access_key_id) -> KeyRecord | None:
        p = self.prefix
        got = await self._call(self._by_aws(keys=[p + "cred:pub:sigv4:" + access_key_id],
                                             args=[p]))
        if not got:
            return None
        rec = _record(got[1], got[2], (got[3],), time.time())
        return rec if rec is not None and rec.aws_access_key_id == access_key_id else None

    async def list_keys(self) -> list[KeyRecord]:
        ids = sorted(i.decode() for i in await self._call(self._r.smembers(self.prefix + "keys")))
        keys = await self._read_keys(ids)
        return sorted(keys, key=lambda k: (k.created or 0, k.id))

    async def delete_key(self, key_id) -> None:
        p = self.prefix
        now = int(time.time())
        for _ in range(CAS_TRIES):
            raw = await self._call(self._r.get(p + "key:" + key_id))
            if raw is None:
                raise StoreError("no key %s" % key_id)
            vk = orjson.loads(raw)
            if vk.get("deleted_at") is not None:
                return
            vk.update(enabled=False, deleted_at=now)
            keys = [p + "key:" + key_id, p + "keys:byrev", p + "revision", p + "cred:ids:" + key_id,
                    p + "denylist", p + "denylist:" + key_id, usage_key(p, key_id, 0)]
            out = await self._call(self._del_key(keys=keys, args=[
                key_id, raw, _json_with_revision_slot(vk), self.channel, p]))
            if out == b"OK":
                return
            if out == b"NOKEY":
                raise StoreError("no key %s" % key_id)
        raise StoreError("key %s changed under every one of %d writes" % (key_id, CAS_TRIES))

    # -- groups (made through busbar's admin API; the Rust gateway keeps these in its config)
    async def put_group(self, rec: GroupRecord) -> None:
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(self.prefix + "bb:groups", rec.name, orjson.dumps(group_to_dict(rec)))
        pipe.publish(self.channel, "group:" + rec.name)
        await self._call(pipe.execute())

    async def get_group(self, name) -> GroupRecord | None:
        raw = await self._call(self._r.hget(self.prefix + "bb:groups", name))
        return group_from_dict(orjson.loads(raw)) if raw else None

    async def list_groups(self) -> list[GroupRecord]:
        rows = await self._call(self._r.hvals(self.prefix + "bb:groups"))
        return sorted((group_from_dict(orjson.loads(r)) for r in rows), key=lambda g: g.name)

    async def delete_group(self, name) -> None:
        pipe = self._r.pipeline(transaction=True)
        pipe.hdel(self.prefix + "bb:groups", name)
        pipe.publish(self.channel, "group:" + name)
        await self._call(pipe.execute())

    async def invalidate_all(self) -> None:
        """Every worker drops its whole policy cache (e.g. after a bulk import)."""
        await self._call(self._r.publish(self.channel, "all"))

    # -- usage
    # -- audit: the valkey store's layout, a sorted set of the records' JSON scored by seq
    audit_sync = False

    async def append_audit(self, rec: dict) -> None:
        key = self.prefix + "audit"
        body = orjson.dumps({f: rec[f] for f in AUDIT_FIELDS})
        pipe = self._r.pipeline(transaction=True)
        pipe.zremrangebyscore(key, rec["seq"], rec["seq"])
        pipe.zadd(key, {body: rec["seq"]})
        await self._call(pipe.execute())

    async def audit_tail(self):
        rows = await self._call(self._r.zrange(self.prefix + "audit", -1, -1))
        return orjson.loads(rows[0]) if rows else None

    async def list_audit(self) -> list:
        return [orjson.loads(m) for m in await self._call(self._r.zrange(self.prefix + "audit", 0, -1))]

    async def add_usage(self, rows: list[Usage], windows=None) -> None:
        w = _usage_writes(self.prefix, rows, windows, time.time())
        if w:
            keys, args = w.script(self.prefix, SCHEMA_VERSION)
            await self._call(self._settle(keys=keys, args=args))

    async def usage_rows(self, day: str | None = None) -> list[dict]:
        p = self.prefix
        if day is not None:
            buckets = [day_epoch(day)]
        else:
            head = len(p) + len("metering:")
            buckets = sorted(int(t) for t in (k.decode()[head:] for k in await self._call(
                self._scan(p.replace("*", "\\*") + "metering:*", "SET"))) if t.isdigit())
        out = []
        for b in buckets:
            rows = sorted(await self._call(self._r.smembers(metering_set(p, b))))
            if not rows:
                continue
            pipe = self._r.pipeline(transaction=False)
            for r in rows:
                pipe.hgetall(r)
            for h in await self._call(pipe.execute()):
                if not h:
                    continue
                f = {k.decode(): v for k, v in h.items()}
                row = {"day": day_of_bucket(b), "key_id": f.get("key_id", b"").decode(),
                       "group": f.get("key_group_at_use", b"").decode() or None,
                       "model": f.get("model", b"").decode(),
                       "provider": f.get("provider", b"").decode()}
                for name, field in zip(USAGE_FIELDS, ("requests", "tokens_input", "tokens_output",
                                                      "tokens_cache_read", "tokens_cache_write",
                                                      "billable_requests")):
                    row[name] = max(0, int(f.get(field, 0)))
                out.append(row)
        return out

    async def usage_totals(self) -> list[dict]:
        return usage_totals(await self.usage_rows())

    async def _scan(self, match: str, kind: str) -> list:
        return [k async for k in self._r.scan_iter(match=match, _type=kind, count=1000)]

    async def window(self, bucket: str, start: int):
        """A bucket's ledger: (requests, billable, {model: [input, output, cache read, cache
        write]}), and busbar's reservations in flight as the fourth item."""
        h = await self._call(self._r.hgetall(usage_key(self.prefix, bucket, start)))
        requests = billable = reserved = 0
        models = {}
        for k, v in h.items():
            k, v = k.decode(), int(v)
            if k == "requests":
                requests = v
            elif k == "billable_requests":
                billable = v
            elif k == "bb:reserved":
                reserved = v
            elif k.startswith("m:"):
                model, _, tier = k[2:].rpartition(":")
                if tier in TIERS:
                    models.setdefault(model, [0, 0, 0, 0])[TIERS.index(tier)] = v
        return requests, billable, models, reserved

    async def check_values(self, checks, card=None) -> list[int]:
        """Each check's value as admission sees it (tests and diagnostics)."""
        out = []
        for c in checks:
            if c[C_KIND] == "concurrent":
                v = await self._call(self._r.get(conc_key(self.prefix, c[C_GROUP])))
                out.append(int(v or 0))
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


def _json_with_meta_revision_slot(cred: dict) -> bytes:
    cred = dict(cred)
    cred["meta"] = dict(cred["meta"], revision=-1)
    return orjson.dumps(cred)


def _safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        rest = rest.split("@", 1)[1]
    return scheme + sep + rest


# ---------------------------------------------------------------------------- worker: ledger
class RedisLedger:
    """Admission and settlement against the ledger in Redis (one worker's view). Construct
    anywhere; `await start()` in the worker's own event loop.

    A check is (bucket, kind, limit, charge, window start, seconds to the roll, group, per): the
    bucket a Rust ledger bucket id (model.rust_bucket) counted in `usage:<bucket>:<window start>`,
    or, for a concurrent limit, the group's gauge."""

    remote = True

    def __init__(self, url: str, fail_mode: str = "closed", timeout: float = DEFAULT_TIMEOUT,
                 prefix: str = PREFIX):
        if fail_mode not in ("closed", "open"):
            raise ValueError("fail_mode: expected closed or open, got %r" % (fail_mode,))
        self.url = url
        self.fail_mode = fail_mode
        # fail_mode open keeps a local count (_seen, _drift) to admit against while Redis is
        # down; closed never reads one, so the request path does not keep it
        self._local = fail_mode == "open"
        self.needs_cost = self._local     # settle's `cost` moves that count only (gate.py)
        self.timeout = timeout
        self.prefix = prefix
        self.up = True                  # False while Redis is unreachable
        self._c = None                  # the RespClient (busbar/governance/resp.py), once started
        self._pend = _Writes()          # not yet in Redis
        self._drift = {}                # (ledger key, kind) -> what _pend adds to that value
        self._seen = {}                 # (ledger key, kind) -> (last value seen, expires at)
        self._rates = {}                # id(rate card) -> (the card, its hash key, written)
        # the request path's key names and commands, in C (cbusbar/respledger.pyx)
        self._lay = LedgerLayout(prefix, EXPIRE_MARGIN, day_epoch)
        self._lkey = self._lay.key
        self._flusher = None            # the task writing the pending settles
        self._prober = None             # the task asking a down Redis again

    async def start(self):
        # busbar's own pipelined client (resp.py), not redis-py: the request path's commands are
        # framed in C and share one connection, no task or timeout object per command.
        self._c = RespClient(self.url, self.timeout)
        self._down = DOWN
        self._admit_sha = self._c.script(ADMIT_LUA)
        self._settle_sha = self._c.script(SETTLE_LUA)
        try:    # load both scripts now, so the first request does not pay the NOSCRIPT detour
            await self._c.load(self._admit_sha)
            await self._c.load(self._settle_sha)
        except self._down as e:
            self._went_down(e)

    async def close(self, timeout: float = 2.0):
        """Writes what is pending (bounded by `timeout`), then disconnects."""
        if self._c is None:
            return
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except asyncio.TimeoutError:
            pass
        for t in (self._flusher, self._prober):
            if t is not None and not t.done():
                t.cancel()
                try:
                    await t
                except (asyncio.CancelledError, Exception):
                    pass
        self._c.close()
        self._c = None

    async def flush(self):
        """Waits until every settle so far is written to Redis, or could not be (Redis down:
        then it is kept for the reconcile)."""
        t = self._flusher
        if t is not None and not t.done():
            await asyncio.wait([t])
        if self.up and self._pend:
            self._kick()
            await asyncio.wait([self._flusher])

    # -- admission
    def _rate_card(self, card, fee=0):
        got = self._rates.get((id(card), fee))
        if got is None or got[0] is not card:
            key, fields = rates_key(self.prefix, card, fee)
            if len(self._rates) > 16:
                self._rates.clear()
            got = self._rates[(id(card), fee)] = [card, key, fields, False]
        return got

    async def admit(self, checks, now: float, card=None, reserve: int = 0, fee: int = 0):
        """None when admitted (charged), a Denial, or UNAVAILABLE. `reserve`: the budget
        reservation (nano-units) charged to every budget bucket; `card`: the rate card a budget's
        tokens are priced with; `fee`: per_request_fee (nano-units), which a budget counts per
        billable request."""
        if not checks:
            return None
        if not self.up:
            return self._admit_local(checks, now, reserve, fee) if self.fail_mode == "open" \
                else UNAVAILABLE
        rc = self._rate_card(card, fee)
        frame, lkeys = self._lay.admit(self._admit_sha, checks, reserve, rc[1])
        try:
            out = await self._run_admit(frame, rc, checks, reserve, fee)
        except asyncio.CancelledError:
            raise
        except self._down as e:
            self._went_down(e)
            return self._admit_local(checks, now, reserve, fee) if self.fail_mode == "open" \
                else UNAVAILABLE
        except Exception as e:
            _log_error("admission script failed: %r" % e)
            return UNAVAILABLE
        failed = out[0]
        if not self._local:
            return _denial(checks[failed - 1]) if failed else None
        seen = self._seen
        if len(seen) > 8192:
            self._prune(now)
        for i in range(len(out) - 1):
            c = checks[i]
            v = out[i + 1]
            if not failed:
                v += _charge(c, reserve, fee)
            exp = now + c[C_ROLL] if c[C_WINDOW] and c[C_ROLL] is not None else None
            seen[(lkeys[i], c[C_KIND])] = (v, exp)
        if failed:
            return _denial(checks[failed - 1])
        return None

    def admit_nowait(self, checks, now, card, reserve, fee, done) -> bool:
        """`admit` without a coroutine, where it is one script on a connection that is up and the
        rate card is written: `done(None | Denial | UNAVAILABLE)` is called from the reply, and
        True is returned. False: take `await admit(...)` instead (fail_mode open's local count,
        Redis down, no connection yet, a rate card not written). A reply that asks for more (the
        script or the card gone after a Redis restart) continues in `admit`, in a task."""
        if self._local or not self.up or not checks:
            return False
        c = self._c
        conn = c.conn if c is not None else None
        if conn is None or conn._closed is not None:
            return False
        rc = self._rate_card(card, fee)
        if not rc[3]:
            for x in checks:
                if x[C_KIND] == "budget_usd":
                    return False
        frame, _ = self._lay.admit(self._admit_sha, checks, reserve, rc[1])
        conn.send(frame).add_done_callback(
            lambda f: self._admit_reply(f, checks, now, card, reserve, fee, done))
        return True

    def _admit_reply(self, f, checks, now, card, reserve, fee, done):
        try:
            out = f.result()
        except asyncio.CancelledError:     # nobody cancels it; were it so, it did not answer
            done(UNAVAILABLE)
            return
        except RespError as e:
            if e.code != "NOSCRIPT":
                _log_error("admission script failed: %r" % e)
                done(UNAVAILABLE)
                return
            out = None
        except self._down as e:
            self._went_down(e)
            done(UNAVAILABLE)
            return
        except Exception as e:
            _log_error("admission script failed: %r" % e)
            done(UNAVAILABLE)
            return
        if out is None or not out or out[0] == -1:     # NOSCRIPT, or the card's hash is gone
            if out:
                self._rate_card(card, fee)[3] = False
            asyncio.get_running_loop().create_task(self._admit_again(checks, now, card, reserve,
                                                                     fee, done))
            return
        failed = out[0]
        done(_denial(checks[failed - 1]) if failed else None)

    async def _admit_again(self, checks, now, card, reserve, fee, done):
        try:
            r = await self.admit(checks, now, card, reserve, fee)
        except Exception as e:
            _log_error("admission failed: %r" % e)
            r = UNAVAILABLE
        done(r)

    async def _run_admit(self, frame, rc, checks, reserve, fee=0):
        """The admission script, the rate card written first where it may be missing. Shielded: a
        caller cancelled mid-flight (its client went away) must not leave charges nobody will
        settle; if the script admitted, they are given back when it answers."""
        for _ in range(2):
            if not rc[3] and any(c[C_KIND] == "budget_usd" for c in checks):
                fields = []
                for f, v in rc[2].items():
                    fields += (f, v)
                await self._c.call(b"HSET", rc[1], *fields)
                rc[3] = True
            out = await self._send_admit(frame, checks, reserve, fee)
            if out is None:                 # NOSCRIPT (a restarted Redis): load, send again
                await self._c.load(self._admit_sha)
                out = await self._send_admit(frame, checks, reserve, fee)
                if out is None:
                    raise RuntimeError("the admission script could not be loaded into Redis")
            if out and out[0] == -1:         # the card's hash is gone (a Redis restart): again
                rc[3] = False
                continue
            return out
        raise RuntimeError("the rate card could not be written to Redis")

    async def _send_admit(self, frame, checks, reserve, fee):
        """The admission script's reply, None on NOSCRIPT (it did not run). A caller cancelled
        while it is in flight leaves it to be answered: its charges are given back then."""
        conn = self._c.conn
        if conn is None or conn._closed is not None:
            conn = await self._c.connection()
        fut = conn.send(frame)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.cancelled():     # still in flight: undone when its reply comes
                conn.orphaned(fut, lambda r: self._undo_if_admitted(r, checks, reserve, fee))
            elif fut.exception() is None:   # answered, but the caller is gone: undone now
                self._undo_if_admitted(fut.result(), checks, reserve, fee)
            raise
        except RespError as e:
            if e.code == "NOSCRIPT":
                return None
            raise

    def _undo_if_admitted(self, reply, checks, reserve, fee=0):
        if reply.__class__ is list and reply and reply[0] == 0:
            self.undo(checks, reserve, fee)

    def _value(self, key, kind):
        s = self._seen.get((key, kind))
        return (s[0] if s is not None else 0) + self._drift.get((key, kind), 0)

    def _admit_local(self, checks, now, reserve, fee=0):
        """fail_mode open: the same test against this worker's count (the last value it saw in
        Redis plus what it charged and settled since), charged to the pending writes."""
        p = self.prefix
        for c in checks:
            v = self._value(ledger_key(p, c), c[C_KIND])
            if c[C_KIND] == "tokens":
                if v >= c[C_LIMIT]:
                    return _denial(c)
            elif v + _charge(c, reserve, fee) > c[C_LIMIT]:
                return _denial(c)
        self._take(checks, reserve, 1, fee)
        return None

    def _take(self, checks, reserve, sign, fee=0):
        """Admission's charges (sign 1) or their refund (-1), as pending writes (the fee rides on
        the billable request count; the local count takes it at once)."""
        p = self.prefix
        w = self._pend
        done = set()
        for c in checks:
            k = ledger_key(p, c)
            kind = c[C_KIND]
            if kind == "concurrent":
                if k not in done:
                    w.gauge(k, sign)
                    self._drift_add(k, "concurrent", sign)
            else:
                ttl = _ledger_ttl(c[C_PER], c[C_ROLL])
                if k not in done:
                    w.hinc(k, "requests", sign, True, ttl)
                    w.hinc(k, "billable_requests", sign, True, ttl)
                    self._drift_add(k, "requests", sign)
                if kind == "budget_usd" and (k, "b") not in done and (reserve or fee):
                    if reserve:
                        w.hinc(k, "bb:reserved", sign * reserve, True, ttl)
                    self._drift_add(k, "budget_usd", sign * (reserve + fee))
                    done.add((k, "b"))
            done.add(k)
        if self.up and (self._flusher is None or self._flusher.done()):
            self._kick()

    def _drift_add(self, key, kind, delta):
        if delta and self._local:
            self._drift[(key, kind)] = self._drift.get((key, kind), 0) + delta

    def undo(self, checks, reserve: int = 0, fee: int = 0) -> None:
        """An admission that was not used (its client left before it started): every charge back."""
        try:
            self._take(checks, reserve, -1, fee)
        except Exception as e:
            _log_error("undo failed: %r" % e)

    # -- settlement
    def settle(self, checks, reserve: int, usage: Usage | None, ok: bool = True,
               cost: int = 0, fee: int = 0) -> None:
        """A request's end: its tokens into every ledger bucket of its checks (and, as the Rust
        ledger has it, into the key's own bucket, which also counts it), its reservation replaced
        by nothing (the tokens now price it), a non-2xx answer taken off the billable count, its
        concurrency slots back, and its metering row. `cost` (its tokens at the rate card) moves
        the local count fail_mode open uses."""
        try:
            self._lay.settle(self._pend, checks, reserve, usage, ok)     # the writes, in C
            if self._local:
                self._settle_local(checks, reserve, usage, ok, cost, fee)
            if self.up and (self._flusher is None or self._flusher.done()):
                self._kick()
        except Exception as e:
            _log_error("settle failed: %r" % e)

    def _settle_local(self, checks, reserve, usage, ok, cost, fee):
        """fail_mode open: what a settle moves in the local count (as its writes do in Redis)."""
        tokens = 0
        if usage is not None:
            tokens = (usage.input_tokens + usage.output_tokens + usage.cache_read_tokens
                      + usage.cache_write_tokens)
        done = set()
        for c in checks:
            k = self._lkey(c)
            kind = c[C_KIND]
            if kind == "concurrent":
                if k not in done:
                    self._drift_add(k, "concurrent", -1)
                    done.add(k)
                continue
            if k not in done:
                done.add(k)
                self._drift_add(k, "tokens", tokens)
            if kind == "budget_usd" and (k, "b") not in done:
                done.add((k, "b"))
                # (a non-2xx answer leaves the billable count, and its fee with it)
                self._drift_add(k, "budget_usd", cost - reserve - (0 if ok else fee))

    def _kick(self):
        if self._c is not None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self):
        """Writes until nothing is pending (settles made meanwhile go in the next script)."""
        while self.up and self._pend:
            if await self._write_pending() is not None:
                return

    async def _write_pending(self):
        """One script with everything pending; on failure it stays pending. None when written,
        else the exception."""
        pend, drift = self._pend, self._drift
        self._pend, self._drift = _Writes(), {}
        try:
            if pend:
                keys, args = pend.script(self.prefix, SCHEMA_VERSION)
                await self._c.evalsha(self._settle_sha, keys, args)
        except BaseException as e:
            pend.merge(self._pend)
            self._pend = pend
            for k, d in self._drift.items():
                drift[k] = drift.get(k, 0) + d
            self._drift = drift
            if isinstance(e, asyncio.CancelledError):
                raise
            if isinstance(e, self._down):
                self._went_down(e)
            else:
                _log_error("settlement script failed (kept for the next attempt): %r" % e)
            return e
        for k, d in drift.items():
            s = self._seen.get(k)
            if s is not None:
                self._seen[k] = (s[0] + d, s[1])
        return None

    # -- reachability
    def _went_down(self, err):
        if not self.up:
            return
        self.up = False
        # Operational event, fields as busbar/observability/events.py writes them.
        log.warning('store_unreachable store=redis url=%s error="%s" fail_mode=%s effect="%s"',
                    _safe_url(self.url),
                    str(err.__class__.__name__ if not str(err) else err).replace('"', "'"),
                    self.fail_mode, "refusing with 503" if self.fail_mode == "closed" else
                    "admitting against local counts, to be reconciled")
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe())

    async def _probe(self):
        """While down: ask Redis again every PROBE_INTERVAL; once it answers, push everything
        counted meanwhile (one script), then send admission back to Redis."""
        self._c.close()     # the connection may be dead (a restart): start again from a new one
        while True:
            await asyncio.sleep(PROBE_INTERVAL)
            try:
                await self._c.call(b"PING")
            except Exception:
                continue
            try:    # a restarted Redis has no scripts, and may have lost the rate cards
                await self._c.load(self._admit_sha)
                await self._c.load(self._settle_sha)
            except Exception:
                continue
            for rc in self._rates.values():
                rc[3] = False
            pending = bool(self._pend)
            if isinstance(await self._write_pending(), self._down):
                continue        # gone again; an error reply instead leaves it pending, Redis up
            self.up = True
            log.info("store_reachable store=redis url=%s reconciled=%s", _safe_url(self.url),
                     "true" if pending else "false")
            if self._pend:
                self._kick()
            return

    def _prune(self, now):
        seen = self._seen
        for k in [k for k, (_, exp) in seen.items() if exp is not None and exp < now]:
            del seen[k]
        if len(seen) > 8192:
            seen.clear()


def _charge(check, reserve, fee=0) -> int:
    """What admission adds to a check's value: 1 request or slot, the reservation and the fee,
    no tokens."""
    kind = check[C_KIND]
    if kind == "tokens":
        return 0
    if kind == "budget_usd":
        return reserve + fee
    return 1


_last_error = [0.0]


def _log_error(msg):
    """An unexpected Redis error reply (e.g. OOM), logged at most once every 10 s."""
    now = time.monotonic()
    if now - _last_error[0] >= 10.0:
        _last_error[0] = now
        log.error("%s", msg)


def _denial(c) -> Denial:
    roll = c[C_ROLL]
    kind = c[C_KIND]
    retry = math.ceil(roll) if roll is not None and kind in ("requests", "tokens") else None
    return Denial(kind, c[C_GROUP], c[C_PER], retry)


# ---------------------------------------------------------------------------- worker: policy cache
class PolicyCache:
    """Key and group policy cached in one worker: what the Redis and the Postgres directories
    share. A record is kept until its store's invalidation message drops it or POLICY_TTL passes;
    an unknown name is remembered NEGATIVE_TTL; one read per name at a time. Only a read that
    started and ended while the invalidation listener was live (`live`) and that no invalidation
    straddled is cached. A subclass reads its store in `_fetch(kind, name, now)` (kind "k" a key
    id, "g" a group, "a" an AWS access key id) and names its outage exceptions `_down`."""

    remote = True
    MISS = MISS     # what cached_key returns for an id not cached (the gate compares with it)
    # The most key records one worker caches before it starts again from empty (None: no bound).
    KEY_CACHE_MAX = None
    # Unknown names remembered before that memory is emptied (a flood of made-up ids).
    NEGATIVE_MAX = 10000

    def _init_cache(self):
        self.live = False               # listening, so cached entries are trustworthy
        self._keys = {}                 # key id -> (KeyRecord, monotonic deadline)
        self._groups = {}               # name -> (GroupRecord, monotonic deadline)
        self._aws = {}                  # access key id -> key id
        self._neg = {}                  # ("k"|"g"|"a", name) -> monotonic deadline
        self._gen = 0                   # bumped on every invalidation: a read that straddles
                                        # one is not cached
        self._inflight = {}             # (kind, name) -> the task reading it
        self._listener = None

    @property
    def version(self):
        """Bumped by every invalidation: the gate's group-chain cache follows it."""
        return self._gen

    def flush_cache(self) -> int:
        """POST /auth/cache/flush: drop the cached key records (the next request reads the
        store)."""
        n = len(self._keys) + len(self._aws)
        self._keys = {}
        self._aws = {}
        return n

    async def _stop_listener(self):
        if self._listener is not None:
            self._listener.cancel()
            try:
                await self._listener
            except (asyncio.CancelledError, Exception):
                pass
            self._listener = None
        for t in list(self._inflight.values()):
            t.cancel()

    # -- lookups
    def _fresh(self, table, name):
        got = table.get(name)
        if got is None:
            return MISS
        if got[1] < time.monotonic():
            del table[name]
            return MISS
        return got[0]

    def cached_key(self, key_id):
        rec = self._fresh(self._keys, key_id)
        if rec is MISS:
            dl = self._neg.get(("k", key_id))
            if dl is not None and dl > time.monotonic():
                return None
        return rec

    def cached_group(self, name):
        """A group from the cache without a read: the record, None (known not to exist), or MISS."""
        rec = self._fresh(self._groups, name)
        if rec is MISS:
            dl = self._neg.get(("g", name))
            if dl is not None and dl > time.monotonic():
                return None
        return rec

    async def key(self, key_id):
        rec = self._fresh(self._keys, key_id)
        if rec is not MISS:
            return rec
        return await self._lookup("k", key_id)

    async def group(self, name):
        rec = self._fresh(self._groups, name)
        if rec is not MISS:
            return rec
        return await self._lookup("g", name)

    async def key_by_aws(self, access_key_id):
        key_id = self._aws.get(access_key_id)
        if key_id is not None:
            rec = self._fresh(self._keys, key_id)
            if rec is not MISS and rec.aws_access_key_id == access_key_id:
                return rec
        return await self._lookup("a", access_key_id)

    async def _lookup(self, kind, name):
        dl = self._neg.get((kind, name))
        if dl is not None:
            if dl > time.monotonic():
                return None
            del self._neg[(kind, name)]
        # One read per name at a time, whoever asks meanwhile waits for it; a task of its own,
        # so a caller that is cancelled does not cancel it for the others.
        task = self._inflight.get((kind, name))
        if task is None:
            task = asyncio.get_running_loop().create_task(self._read(kind, name))
            self._inflight[(kind, name)] = task
            task.add_done_callback(lambda _t, k=(kind, name): self._inflight.pop(k, None))
        return await asyncio.shield(task)

    def _unreachable(self, kind, name):
        """What a lookup gives while the store cannot be reached."""
        return UNAVAILABLE

    async def _read(self, kind, name):
        gen = self._gen
        live = self.live
        try:
            rec = await self._fetch(kind, name, time.time())
        except self._down:
            return self._unreachable(kind, name)
        except Exception as e:
            _log_error("policy read failed: %r" % e)
            return UNAVAILABLE
        if live and self.live and gen == self._gen:
            if rec is None:
                if len(self._neg) > self.NEGATIVE_MAX:
                    self._neg.clear()
                self._neg[(kind, name)] = time.monotonic() + NEGATIVE_TTL
            elif kind == "g":
                self._groups[name] = (rec, time.monotonic() + POLICY_TTL)
            else:
                if self.KEY_CACHE_MAX is not None and len(self._keys) > self.KEY_CACHE_MAX:
                    self._keys.clear()
                    self._aws.clear()
                self._keys[rec.id] = (rec, time.monotonic() + POLICY_TTL)
                if rec.aws_access_key_id:
                    self._aws[rec.aws_access_key_id] = rec.id
        return rec

    # -- invalidation
    def _drop(self, msg: str):
        self._gen += 1
        kind, _, name = msg.partition(":")
        if kind == "key":
            self._keys.pop(name, None)
            self._neg.pop(("k", name), None)
            for a in [a for a, k in self._aws.items() if k == name]:
                del self._aws[a]
            for n in [n for n in self._neg if n[0] == "a"]:
                del self._neg[n]
        elif kind == "group":
            self._groups.pop(name, None)
            self._neg.pop(("g", name), None)
        else:
            self._drop_all()

    def _drop_all(self):
        self._gen += 1
        self._keys, self._groups, self._aws = {}, {}, {}
        self._neg.clear()


class RedisDirectory(PolicyCache):
    """Key and group policy, cached in this worker (PolicyCache), dropped on the invalidation
    channel and read again after POLICY_TTL at the latest.

    Lookups return the record, None (unknown), or UNAVAILABLE when Redis cannot be read and
    nothing usable is cached. While the invalidation subscription is down (Redis unreachable or
    restarting) lookups serve the copy kept from before the drop (nothing can change in a Redis
    nobody reaches, which is what lets fail_mode open keep serving known keys), read anything else
    from Redis without caching it, and give UNAVAILABLE when that fails. Once resubscribed the
    whole cache is dropped, so no policy from before a Redis restart survives it."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT, prefix: str = PREFIX):
        self.url = url
        self.timeout = timeout
        self.prefix = prefix
        self.channel = prefix + "bb:inval"
        self._init_cache()
        self._r = None                  # reads (a read meeting a dead pooled connection retries)
        self._sub = None                # the subscription's client: never reconnects by itself
        self._stale = ({}, {}, {})      # keys, groups, aws from before the subscription dropped
        self._subscribed = None

    async def start(self):
        self._r = _connect(self.url, self.timeout, retry=True)
        self._sub = _connect(self.url, self.timeout, retry=False)
        self._down = _down_errors()
        self._read_key = self._r.register_script(KEY_READ_LUA)
        self._by_aws = self._r.register_script(KEY_BY_AWS_LUA)
        self._subscribed = asyncio.Event()
        self._listener = asyncio.get_running_loop().create_task(self._listen())
        try:    # normally subscribed within a round trip; a down Redis does not hold the boot
            await asyncio.wait_for(self._subscribed.wait(), self.timeout * 2)
        except asyncio.TimeoutError:
            pass

    async def close(self):
        await self._stop_listener()
        if self._r is not None:
            await self._r.aclose()
            await self._sub.aclose()
            self._r = self._sub = None

    # -- lookups
    async def _lookup(self, kind, name):
        if not self.live:
            rec = self._fallback(kind, name)
            if rec is not UNAVAILABLE:
                return rec
        return await super()._lookup(kind, name)

    def _unreachable(self, kind, name):
        return self._fallback(kind, name)

    async def _fetch(self, kind, name, now):
        p = self.prefix
        if kind == "k":
            got = await self._read_key(keys=[
                p + "key:" + name, p + "denylist", p + "cred:%s:sigv4:0" % name,
                p + "cred:%s:sigv4:1" % name], args=[name])
            return _record(got[0], got[1], (got[2], got[3]), now)
        if kind == "g":
            raw = await self._r.hget(p + "bb:groups", name)
            return group_from_dict(orjson.loads(raw)) if raw else None
        got = await self._by_aws(keys=[p + "cred:pub:sigv4:" + name], args=[p])
        rec = _record(got[1], got[2], (got[3],), now) if got else None
        return rec if rec is not None and rec.aws_access_key_id == name else None

    def _fallback(self, kind, name):
        """The copy kept when the subscription dropped, if any: served only until the
        subscription is back (PROBE_INTERVAL after Redis answers again), then dropped."""
        keys, groups, aws = self._stale
        if kind == "k":
            rec = keys.get(name, (MISS,))[0]
        elif kind == "g":
            rec = groups.get(name, (MISS,))[0]
        else:
            key_id = aws.get(name)
            rec = keys.get(key_id, (MISS,))[0] if key_id is not None else MISS
        return UNAVAILABLE if rec is MISS else rec

    async def _listen(self):
        """Subscribed for as long as Redis allows; every (re)subscription starts from an empty
        cache. A subscription that errors is thrown away whole (redis-py would otherwise reconnect
        it silently, and the messages sent meanwhile would be lost)."""
        while True:
            ps = self._sub.pubsub()
            try:
                await ps.subscribe(self.channel)
                last = time.monotonic()
                pinged = last
                while True:
                    msg = await ps.get_message(timeout=PUBSUB_PING / 2)
                    now = time.monotonic()
                    if msg is not None:
                        last = now
                        t = msg["type"]
                        if t == "subscribe":
                            self._drop_all()
                            self._stale = ({}, {}, {})
                            self.live = True
                            self._subscribed.set()
                        elif t == "message":
                            data = msg["data"]
                            self._drop(data.decode() if isinstance(data, bytes) else data)
                    if now - last > PUBSUB_DEAD:
                        raise TimeoutError("invalidation channel silent for %.0fs" % (now - last))
                    if now - pinged > PUBSUB_PING:
                        pinged = now
                        await ps.ping()
            except asyncio.CancelledError:
                await _quiet_close(ps)
                raise
            except Exception as e:
                if self.live:
                    log.debug("invalidation channel lost (%s); policy cache dropped", e)
                    # While Redis is away its copy is served whatever its age: nothing can change
                    # in a Redis nobody reaches.
                    self._stale = (self._keys, self._groups, self._aws)
                    self._keys, self._groups, self._aws = {}, {}, {}
                    self._neg.clear()
                    self._gen += 1
                self.live = False
                await _quiet_close(ps)
                await asyncio.sleep(PROBE_INTERVAL)


async def _quiet_close(ps):
    try:
        await ps.aclose()
    except Exception:
        pass
