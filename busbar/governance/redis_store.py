"""Governance in Redis: one budget and one rate limit, exact across a fleet of gateways.

Three objects, all talking to the same Redis (`store: {module: valkey, settings: {url: ...}}`):

- `RedisStore` (the parent, admin API): keys, groups and usage rows; every change is published on
  the invalidation channel in the same atomic step as the write.
- `RedisLedger` (every worker, hot path): admission is ONE Lua script (EVALSHA) that tests every
  check of a request and charges all of them or none; settlement is ONE script per batch, sent in
  the background (the settles of one event-loop turn are merged into one round trip).
- `RedisDirectory` (every worker): key and group policy cached per worker, dropped on the
  invalidation message of a change, so PATCH/revoke take effect everywhere within 1 s.

Layout (prefix `bb:`, configurable so that two fleets can share one Redis):
    bb:keys        hash  key id -> KeyRecord JSON
    bb:aws         hash  AWS access key id -> key id
    bb:groups      hash  group name -> GroupRecord JSON
    bb:c:<bucket>:<window>   string counter (requests, tokens, nano-dollars, in-flight); a
                   windowed one expires at its window roll + EXPIRE_MARGIN, window 0 never
    bb:u:<day>     hash  usage of one UTC day: field JSON [key_id, group, model, pool, metric]
                   -> integer; bb:udays is the set of days present
    bb:inval       channel: "key:<id>", "group:<name>", "all"

Unreachable Redis (refused, reset, or no answer within `timeout`, 0.5 s): the ledger logs one
WARNING ("store unreachable"), stops asking Redis on the hot path and probes in the background.
fail_mode "closed" answers "unavailable" (the engine's 503); "open" admits against a local
in-process count of the same limits, seeded with the last values this worker saw in Redis. Settles
are never lost: whatever could not be written (settle deltas, and in "open" the local charges and
usage) accumulates in the worker and is pushed to Redis in one script when it answers again, before
admission goes back to Redis (INFO "store reachable again"). A write that failed after it was sent
is ambiguous (Redis may have applied it); it is pushed again, so an outage can over-count, never
under-count. Concurrency gauges never go below 0.

redis-py is imported only when one of these objects is started (`_redis()`), so a gateway without
Redis pays nothing for it. No connection is made before `start()`/`open()`: construct the objects
anywhere, start them in the event loop that will use them (after the fork, in each worker).
"""
from __future__ import annotations

import asyncio
import logging
import math
import sys
import time

import orjson

from busbar.governance.model import group_from_dict, group_to_dict  # noqa: F401
from busbar.governance.model import (
    C_BUCKET, C_CHARGE, C_GROUP, C_KIND, C_LIMIT, C_PER, C_ROLL, C_WINDOW, USAGE_FIELDS,
    Denial, GroupRecord, KeyRecord, Usage)

log = logging.getLogger("busbar.governance")

UNAVAILABLE = "unavailable"     # what admit and the directory return when Redis cannot answer
MISS = object()                 # RedisDirectory.cached_key: nothing cached for that id
DEFAULT_TIMEOUT = 0.5           # connect and read timeout of every Redis call, seconds
EXPIRE_MARGIN = 60              # a windowed counter lives this long past its window's roll
NEGATIVE_TTL = 0.5              # an unknown key id / group is remembered this long
PROBE_INTERVAL = 0.2            # while Redis is unreachable, how often it is asked again
PUBSUB_PING = 2.0               # the invalidation subscription pings this often when idle...
PUBSUB_DEAD = 5.0               # ...and is declared dead (cache dropped) after this long silent

_KIND_CODE = {"requests": "r", "tokens": "t", "budget_usd": "b", "concurrent": "c"}


class StoreUnavailable(RuntimeError):
    """RedisStore (admin side) could not reach Redis."""


# ---------------------------------------------------------------------------- redis-py, lazily
def _redis():
    """redis-py's asyncio package, imported on first use.

    The single-file executable (packaging/busbar.spec) leaves out importlib.metadata and what it
    imports (email, csv, zipfile). redis-py imports importlib.metadata at import time only to read
    its own version (redis.utils.get_lib_version, which already falls back when the distribution
    is not found), so when the module is absent a stand-in that says "not found" takes its place."""
    mod = sys.modules.get("redis.asyncio")
    if mod is not None:
        return mod
    try:
        import importlib.metadata  # noqa: F401
    except ImportError:
        import importlib
        import types

        stub = types.ModuleType("importlib.metadata")

        class PackageNotFoundError(ModuleNotFoundError):
            pass

        def version(name):
            raise PackageNotFoundError(name)

        stub.PackageNotFoundError = PackageNotFoundError
        stub.version = version
        sys.modules["importlib.metadata"] = stub
        importlib.metadata = stub
    import redis.asyncio
    return redis.asyncio


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


# ---------------------------------------------------------------------------- scripts
# KEYS: the counters. ARGV: per check (kind code, limit, charge, ttl). Tests every check, then
# charges every one, or none: returns {0, v1..vn} (values before the charge) when admitted, else
# {i, v1..vi} with i the first failing check (1-based).
ADMIT_LUA = """
local n = #KEYS
local out = {0}
for i = 1, n do
  local b = (i - 1) * 4
  local v = tonumber(redis.call('GET', KEYS[i]) or '0')
  out[i + 1] = v
  local lim = tonumber(ARGV[b + 2])
  if ARGV[b + 1] == 't' then
    if v >= lim then out[1] = i return out end
  elseif v + tonumber(ARGV[b + 3]) > lim then
    out[1] = i return out
  end
end
for i = 1, n do
  local b = (i - 1) * 4
  if ARGV[b + 3] ~= '0' then redis.call('INCRBY', KEYS[i], ARGV[b + 3]) end
  if ARGV[b + 4] ~= '0' then redis.call('EXPIRE', KEYS[i], ARGV[b + 4]) end
end
return out
"""

# KEYS: n counters, the days set, then one usage hash per day. ARGV: n, then per counter (delta,
# ttl, floor-at-0 flag), then per day (day, m, m x (field, amount)). A counter that this creates
# (its window's key had expired, or a tokens counter's first settle) gets the ttl.
SETTLE_LUA = """
local n = tonumber(ARGV[1])
local a = 2
for i = 1, n do
  local k = KEYS[i]
  local v = redis.call('INCRBY', k, ARGV[a])
  if ARGV[a + 2] == '1' and v < 0 then redis.call('SET', k, '0', 'KEEPTTL') end
  if ARGV[a + 1] ~= '0' and redis.call('TTL', k) == -1 then redis.call('EXPIRE', k, ARGV[a + 1]) end
  a = a + 3
end
for j = n + 2, #KEYS do
  redis.call('SADD', KEYS[n + 1], ARGV[a])
  local m = tonumber(ARGV[a + 1])
  a = a + 2
  for q = 1, m do
    redis.call('HINCRBY', KEYS[j], ARGV[a], ARGV[a + 1])
    a = a + 2
  end
end
return 1
"""

# KEYS: keys hash, aws index. ARGV: id, record JSON, aws access key id or '', channel.
PUT_KEY_LUA = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local ok, rec = pcall(cjson.decode, old)
  if ok and type(rec) == 'table' then
    local aws = rec['aws_access_key_id']
    if type(aws) == 'string' and aws ~= ARGV[3] and redis.call('HGET', KEYS[2], aws) == ARGV[1] then
      redis.call('HDEL', KEYS[2], aws)
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], ARGV[3], ARGV[1]) end
redis.call('PUBLISH', ARGV[4], 'key:' .. ARGV[1])
return 1
"""

# KEYS: keys hash, aws index. ARGV: id, channel.
DELETE_KEY_LUA = """
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  local ok, rec = pcall(cjson.decode, old)
  if ok and type(rec) == 'table' then
    local aws = rec['aws_access_key_id']
    if type(aws) == 'string' and redis.call('HGET', KEYS[2], aws) == ARGV[1] then
      redis.call('HDEL', KEYS[2], aws)
    end
  end
  redis.call('HDEL', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', ARGV[2], 'key:' .. ARGV[1])
return 1
"""

# KEYS: aws index, keys hash. ARGV: access key id. -> {key id, record JSON} or nil.
KEY_BY_AWS_LUA = """
local id = redis.call('HGET', KEYS[1], ARGV[1])
if not id then return nil end
return {id, redis.call('HGET', KEYS[2], id)}
"""


# ---------------------------------------------------------------------------- records
def _key_from_json(raw) -> KeyRecord:
    return KeyRecord.from_dict(orjson.loads(raw))


def counter_key(prefix: str, check) -> str:
    return "%sc:%s:%d" % (prefix, check[C_BUCKET], check[C_WINDOW])


def _ttl(check) -> int:
    """Seconds a check's counter should live: to its window's roll plus the margin; 0 = forever."""
    roll = check[C_ROLL]
    if not check[C_WINDOW] or roll is None:
        return 0
    return math.ceil(roll) + EXPIRE_MARGIN


def _usage_write(prefix: str, counters: dict, usage: dict):
    """(keys, args) of SETTLE_LUA for counters {key: [delta, ttl, floor]} and usage
    {(day, key_id, group, model, pool): [5 ints]}."""
    keys = []
    args = [0]
    for k, (delta, ttl, floor) in counters.items():
        if delta:
            keys.append(k)
            args += (delta, ttl, 1 if floor else 0)
    args[0] = len(keys)
    keys.append(prefix + "udays")
    days = {}
    for (day, key_id, group, model, pool), values in usage.items():
        fields = days.setdefault(day, [])
        for name, v in zip(USAGE_FIELDS, values):
            if v:
                fields.append(orjson.dumps([key_id, group, model, pool, name]))
                fields.append(v)
    for day, fields in days.items():
        if fields:
            keys.append(prefix + "u:" + day)
            args += (day, len(fields) // 2, *fields)
    return keys, args


def _usage_key(u: Usage):
    return (u.day, u.key_id, u.group, u.model, u.pool)


def _usage_values(u: Usage):
    return [getattr(u, f) for f in USAGE_FIELDS]


# ---------------------------------------------------------------------------- admin side
class RedisStore:
    """Keys, groups and usage in Redis, for the admin API (the parent process). Every method
    raises StoreUnavailable when Redis does not answer."""

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT, prefix: str = "bb:"):
        self.url = url
        self.timeout = timeout
        self.prefix = prefix
        self.channel = prefix + "inval"
        self._r = None

    async def open(self):
        self._r = _connect(self.url, self.timeout, retry=True)
        self._down = _down_errors()
        self._put_key = self._r.register_script(PUT_KEY_LUA)
        self._del_key = self._r.register_script(DELETE_KEY_LUA)
        self._by_aws = self._r.register_script(KEY_BY_AWS_LUA)
        self._settle = self._r.register_script(SETTLE_LUA)

    async def close(self):
        if self._r is not None:
            await self._r.aclose()
            self._r = None

    async def _call(self, coro):
        try:
            return await coro
        except self._down as e:
            raise StoreUnavailable("redis at %s: %s" % (_safe_url(self.url), e)) from None

    async def ping(self) -> None:
        await self._call(self._r.ping())

    # -- keys
    async def put_key(self, rec: KeyRecord) -> None:
        p = self.prefix
        await self._call(self._put_key(
            keys=[p + "keys", p + "aws"],
            args=[rec.id, orjson.dumps(rec.to_dict()), rec.aws_access_key_id or "", self.channel]))

    async def get_key(self, key_id) -> KeyRecord | None:
        raw = await self._call(self._r.hget(self.prefix + "keys", key_id))
        return _key_from_json(raw) if raw else None

    async def key_by_aws(self, access_key_id) -> KeyRecord | None:
        p = self.prefix
        got = await self._call(self._by_aws(keys=[p + "aws", p + "keys"], args=[access_key_id]))
        return _key_from_json(got[1]) if got and got[1] else None

    async def list_keys(self) -> list[KeyRecord]:
        rows = await self._call(self._r.hvals(self.prefix + "keys"))
        return sorted((_key_from_json(r) for r in rows), key=lambda k: (k.created or 0, k.id))

    async def delete_key(self, key_id) -> None:
        p = self.prefix
        await self._call(self._del_key(keys=[p + "keys", p + "aws"], args=[key_id, self.channel]))

    # -- groups
    async def put_group(self, rec: GroupRecord) -> None:
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(self.prefix + "groups", rec.name, orjson.dumps(group_to_dict(rec)))
        pipe.publish(self.channel, "group:" + rec.name)
        await self._call(pipe.execute())

    async def get_group(self, name) -> GroupRecord | None:
        raw = await self._call(self._r.hget(self.prefix + "groups", name))
        return group_from_dict(orjson.loads(raw)) if raw else None

    async def list_groups(self) -> list[GroupRecord]:
        rows = await self._call(self._r.hvals(self.prefix + "groups"))
        return sorted((group_from_dict(orjson.loads(r)) for r in rows), key=lambda g: g.name)

    async def delete_group(self, name) -> None:
        pipe = self._r.pipeline(transaction=True)
        pipe.hdel(self.prefix + "groups", name)
        pipe.publish(self.channel, "group:" + name)
        await self._call(pipe.execute())

    async def invalidate_all(self) -> None:
        """Every worker drops its whole policy cache (e.g. after a bulk import)."""
        await self._call(self._r.publish(self.channel, "all"))

    # -- usage and counters
    async def add_usage(self, rows: list[Usage]) -> None:
        acc = {}
        for u in rows:
            cur = acc.get(_usage_key(u))
            vals = _usage_values(u)
            if cur is None:
                acc[_usage_key(u)] = vals
            else:
                for i, v in enumerate(vals):
                    cur[i] += v
        keys, args = _usage_write(self.prefix, {}, acc)
        if len(keys) > 1:
            await self._call(self._settle(keys=keys, args=args))

    async def usage_rows(self, day: str | None = None) -> list[dict]:
        p = self.prefix
        if day is not None:
            days = [day]
        else:
            days = sorted(d.decode() for d in await self._call(self._r.smembers(p + "udays")))
        if not days:
            return []
        pipe = self._r.pipeline(transaction=False)
        for d in days:
            pipe.hgetall(p + "u:" + d)
        hashes = await self._call(pipe.execute())
        rows = {}
        for d, h in zip(days, hashes):
            for field, value in h.items():
                key_id, group, model, pool, metric = orjson.loads(field)
                row = rows.get((d, key_id, group, model, pool))
                if row is None:
                    row = rows[(d, key_id, group, model, pool)] = {
                        "day": d, "key_id": key_id, "group": group, "model": model, "pool": pool,
                        **{f: 0 for f in USAGE_FIELDS}}
                row[metric] = int(value)
        return [rows[k] for k in sorted(rows, key=lambda k: tuple(x or "" for x in k))]

    async def usage_totals(self) -> list[dict]:
        from .store import _totals
        return _totals(await self.usage_rows())

    async def bucket_values(self, checks) -> list[int]:
        if not checks:
            return []
        vals = await self._call(self._r.mget([counter_key(self.prefix, c) for c in checks]))
        return [int(v) if v is not None else 0 for v in vals]


def _safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        rest = rest.split("@", 1)[1]
    return scheme + sep + rest


# ---------------------------------------------------------------------------- worker: ledger
class RedisLedger:
    """Admission and settlement against counters in Redis (one worker's view). Construct anywhere;
    `await start()` in the worker's own event loop."""

    remote = True

    def __init__(self, url: str, fail_mode: str = "closed", timeout: float = DEFAULT_TIMEOUT,
                 prefix: str = "bb:"):
        if fail_mode not in ("closed", "open"):
            raise ValueError("fail_mode: expected closed or open, got %r" % (fail_mode,))
        self.url = url
        self.fail_mode = fail_mode
        self.timeout = timeout
        self.prefix = prefix
        self.up = True                  # False while Redis is unreachable
        self._r = None
        self._pend = {}                 # counter key -> [delta, ttl, floor-at-0]: not yet in Redis
        self._pend_u = {}               # usage row key -> [5 ints]: not yet in Redis
        self._seen = {}                 # counter key -> (last value seen in Redis, expires at)
        self._flusher = None            # the task writing the pending settles
        self._prober = None             # the task asking a down Redis again

    async def start(self):
        self._r = _connect(self.url, self.timeout, retry=False)
        self._down = _down_errors()
        self._admit = self._r.register_script(ADMIT_LUA)
        self._settle = self._r.register_script(SETTLE_LUA)
        try:    # load both scripts now, so the first request does not pay the NOSCRIPT detour
            await self._r.script_load(ADMIT_LUA)
            await self._r.script_load(SETTLE_LUA)
        except self._down as e:
            self._went_down(e)

    async def close(self, timeout: float = 2.0):
        """Writes what is pending (bounded by `timeout`), then disconnects."""
        if self._r is None:
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
        await self._r.aclose()
        self._r = None

    async def flush(self):
        """Waits until every settle so far is written to Redis, or could not be (Redis down:
        then it is kept for the reconcile)."""
        t = self._flusher
        if t is not None and not t.done():
            await asyncio.wait([t])
        if self.up and (self._pend or self._pend_u):
            self._kick()
            await asyncio.wait([self._flusher])

    # -- admission
    async def admit(self, checks, now: float):
        if not checks:
            return None
        if not self.up:
            return self._admit_local(checks, now) if self.fail_mode == "open" else UNAVAILABLE
        p = self.prefix
        keys = []
        args = []
        for c in checks:
            keys.append("%sc:%s:%d" % (p, c[C_BUCKET], c[C_WINDOW]))
            args += (_KIND_CODE[c[C_KIND]], c[C_LIMIT], c[C_CHARGE], _ttl(c))
        # Shielded: a caller cancelled mid-flight (its client went away) must not leave charges
        # nobody will settle; if the script admitted, the charges are refunded when it answers.
        call = asyncio.ensure_future(self._admit(keys=keys, args=args))
        try:
            out = await asyncio.shield(call)
        except asyncio.CancelledError:
            call.add_done_callback(lambda f: self._refund_if_admitted(f, checks))
            raise
        except self._down as e:
            self._went_down(e)
            return self._admit_local(checks, now) if self.fail_mode == "open" else UNAVAILABLE
        except Exception as e:
            _log_error("admission script failed: %r" % e)
            return UNAVAILABLE
        failed = out[0]
        seen = self._seen
        if len(seen) > 8192:
            self._prune(now)
        for i in range(len(out) - 1):
            c = checks[i]
            v = out[i + 1]
            if not failed:
                v += c[C_CHARGE]
            seen[keys[i]] = (v, now + c[C_ROLL] if c[C_WINDOW] and c[C_ROLL] is not None else None)
        if failed:
            return _denial(checks[failed - 1])
        return None

    def _refund_if_admitted(self, fut, checks):
        if fut.cancelled() or fut.exception() is not None or fut.result()[0]:
            return
        self.settle(checks, [-c[C_CHARGE] for c in checks], None)

    def _admit_local(self, checks, now):
        """fail_mode open: the same test against this worker's count (the last value it saw in
        Redis plus what it charged and settled since), charged to the pending writes."""
        p = self.prefix
        keys = []
        for c in checks:
            k = "%sc:%s:%d" % (p, c[C_BUCKET], c[C_WINDOW])
            keys.append(k)
            s = self._seen.get(k)
            v = (s[0] if s is not None else 0)
            pend = self._pend.get(k)
            if pend is not None:
                v += pend[0]
            if c[C_KIND] == "tokens":
                if v >= c[C_LIMIT]:
                    return _denial(c)
            elif v + c[C_CHARGE] > c[C_LIMIT]:
                return _denial(c)
        for k, c in zip(keys, checks):
            if c[C_CHARGE]:
                self._add(k, c, c[C_CHARGE])
        return None

    # -- settlement
    def settle(self, checks, deltas, usage: Usage | None = None) -> None:
        try:
            p = self.prefix
            for c, d in zip(checks, deltas):
                if d:
                    self._add("%sc:%s:%d" % (p, c[C_BUCKET], c[C_WINDOW]), c, d)
            if usage is not None:
                k = _usage_key(usage)
                cur = self._pend_u.get(k)
                vals = _usage_values(usage)
                if cur is None:
                    self._pend_u[k] = vals
                else:
                    for i, v in enumerate(vals):
                        cur[i] += v
            if self.up and (self._flusher is None or self._flusher.done()):
                self._kick()
        except Exception as e:
            _log_error("settle failed: %r" % e)

    def _add(self, key, check, delta):
        cur = self._pend.get(key)
        if cur is None:
            self._pend[key] = [delta, _ttl(check), check[C_KIND] == "concurrent"]
        else:
            cur[0] += delta

    def _kick(self):
        if self._r is not None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush_loop())

    async def _flush_loop(self):
        """Writes until nothing is pending (settles made meanwhile go in the next script)."""
        while self.up and (self._pend or self._pend_u):
            if await self._write_pending() is not None:
                return

    async def _write_pending(self):
        """One script with everything pending; on failure it stays pending. None when written,
        else the exception."""
        pend, pend_u = self._pend, self._pend_u
        self._pend, self._pend_u = {}, {}
        keys, args = _usage_write(self.prefix, pend, pend_u)
        try:
            if args[0] or len(keys) > 1:
                await self._settle(keys=keys, args=args)
        except BaseException as e:
            self._merge_back(pend, pend_u)
            if isinstance(e, asyncio.CancelledError):
                raise
            if isinstance(e, self._down):
                self._went_down(e)
            else:
                _log_error("settlement script failed (kept for the next attempt): %r" % e)
            return e
        for k, (delta, _ttl_secs, _floor) in pend.items():
            s = self._seen.get(k)
            if s is not None:
                self._seen[k] = (s[0] + delta, s[1])
        return None

    def _merge_back(self, pend, pend_u):
        for k, (delta, ttl, floor) in pend.items():
            cur = self._pend.get(k)
            if cur is None:
                self._pend[k] = [delta, ttl, floor]
            else:
                cur[0] += delta
        for k, vals in pend_u.items():
            cur = self._pend_u.get(k)
            if cur is None:
                self._pend_u[k] = vals
            else:
                for i, v in enumerate(vals):
                    cur[i] += v

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
        try:    # every pooled connection may be dead (a restart): start again from new ones
            await self._r.connection_pool.disconnect()
        except Exception:
            pass
        while True:
            await asyncio.sleep(PROBE_INTERVAL)
            try:
                await self._r.ping()
            except Exception:
                continue
            try:    # a restarted Redis has no scripts
                await self._r.script_load(ADMIT_LUA)
                await self._r.script_load(SETTLE_LUA)
            except Exception:
                continue
            pending = bool(self._pend or self._pend_u)
            if isinstance(await self._write_pending(), self._down):
                continue        # gone again; an error reply instead leaves it pending, Redis up
            self.up = True
            log.info("store_reachable store=redis url=%s reconciled=%s", _safe_url(self.url),
                     "true" if pending else "false")
            if self._pend or self._pend_u:
                self._kick()
            return

    def _prune(self, now):
        seen = self._seen
        for k in [k for k, (_, exp) in seen.items() if exp is not None and exp < now]:
            del seen[k]
        if len(seen) > 8192:
            seen.clear()


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
class RedisDirectory:
    """Key and group policy, cached in this worker, dropped on the invalidation channel.

    Lookups return the record, None (unknown), or UNAVAILABLE when Redis cannot be read and
    nothing usable is cached. While the invalidation subscription is down (Redis unreachable or
    restarting) lookups serve the copy kept from before the drop (nothing can change in a Redis
    nobody reaches, which is what lets fail_mode open keep serving known keys), read anything else
    from Redis without caching it, and give UNAVAILABLE when that fails. Once resubscribed the
    whole cache is dropped, so no policy from before a Redis restart survives it."""

    remote = True
    MISS = MISS     # what cached_key returns for an id not cached (the gate compares with it)

    @property
    def version(self):
        """Bumped by every invalidation: the gate's group-chain cache follows it."""
        return self._gen

    def __init__(self, url: str, timeout: float = DEFAULT_TIMEOUT, prefix: str = "bb:"):
        self.url = url
        self.timeout = timeout
        self.prefix = prefix
        self.channel = prefix + "inval"
        self.live = False               # subscribed, so cached entries are trustworthy
        self._r = None                  # reads (a read meeting a dead pooled connection retries)
        self._sub = None                # the subscription's client: never reconnects by itself
        self._keys = {}                 # key id -> KeyRecord
        self._groups = {}               # name -> GroupRecord
        self._aws = {}                  # access key id -> key id
        self._neg = {}                  # ("k"|"g"|"a", name) -> monotonic deadline
        self._stale = ({}, {}, {})      # keys, groups, aws from before the subscription dropped
        self._gen = 0                   # bumped on every invalidation: a read that straddles
                                        # one is not cached
        self._inflight = {}             # (kind, name) -> the task reading it
        self._listener = None
        self._subscribed = None

    async def start(self):
        self._r = _connect(self.url, self.timeout, retry=True)
        self._sub = _connect(self.url, self.timeout, retry=False)
        self._down = _down_errors()
        self._by_aws = self._r.register_script(KEY_BY_AWS_LUA)
        self._subscribed = asyncio.Event()
        self._listener = asyncio.get_running_loop().create_task(self._listen())
        try:    # normally subscribed within a round trip; a down Redis does not hold the boot
            await asyncio.wait_for(self._subscribed.wait(), self.timeout * 2)
        except asyncio.TimeoutError:
            pass

    async def close(self):
        if self._listener is not None:
            self._listener.cancel()
            try:
                await self._listener
            except (asyncio.CancelledError, Exception):
                pass
            self._listener = None
        for t in list(self._inflight.values()):
            t.cancel()
        if self._r is not None:
            await self._r.aclose()
            await self._sub.aclose()
            self._r = self._sub = None

    # -- lookups
    def cached_key(self, key_id):
        rec = self._keys.get(key_id, MISS)
        if rec is MISS:
            dl = self._neg.get(("k", key_id))
            if dl is not None and dl > time.monotonic():
                return None
        return rec

    async def key(self, key_id):
        rec = self._keys.get(key_id, MISS)
        if rec is not MISS:
            return rec
        return await self._lookup("k", key_id)

    async def group(self, name):
        rec = self._groups.get(name, MISS)
        if rec is not MISS:
            return rec
        return await self._lookup("g", name)

    async def key_by_aws(self, access_key_id):
        key_id = self._aws.get(access_key_id)
        if key_id is not None:
            rec = self._keys.get(key_id, MISS)
            if rec is not MISS:
                return rec
        return await self._lookup("a", access_key_id)

    async def _lookup(self, kind, name):
        if not self.live:
            rec = self._fallback(kind, name)
            if rec is not UNAVAILABLE:
                return rec
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

    async def _read(self, kind, name):
        gen = self._gen
        live = self.live
        p = self.prefix
        try:
            if kind == "k":
                raw = await self._r.hget(p + "keys", name)
                rec = _key_from_json(raw) if raw else None
            elif kind == "g":
                raw = await self._r.hget(p + "groups", name)
                rec = group_from_dict(orjson.loads(raw)) if raw else None
            else:
                got = await self._by_aws(keys=[p + "aws", p + "keys"], args=[name])
                rec = _key_from_json(got[1]) if got and got[1] else None
        except self._down:
            return self._fallback(kind, name)
        except Exception as e:
            _log_error("policy read failed: %r" % e)
            return UNAVAILABLE
        if live and self.live and gen == self._gen:
            if rec is None:
                if len(self._neg) > 10000:
                    self._neg.clear()
                self._neg[(kind, name)] = time.monotonic() + NEGATIVE_TTL
            elif kind == "g":
                self._groups[name] = rec
            else:
                self._keys[rec.id] = rec
                if rec.aws_access_key_id:
                    self._aws[rec.aws_access_key_id] = rec.id
        return rec

    def _fallback(self, kind, name):
        """The copy kept when the subscription dropped, if any: served only until the
        subscription is back (PROBE_INTERVAL after Redis answers again), then dropped."""
        keys, groups, aws = self._stale
        if kind == "k":
            rec = keys.get(name, MISS)
        elif kind == "g":
            rec = groups.get(name, MISS)
        else:
            key_id = aws.get(name)
            rec = keys.get(key_id, MISS) if key_id is not None else MISS
        return UNAVAILABLE if rec is MISS else rec

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
