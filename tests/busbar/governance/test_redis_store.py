"""The Redis store against a real redis-server (tests/redis_server.py): records and usage round trip,
invalidation reaches every worker's cache within 1 s, admission is exact across processes and
all-or-nothing, windows roll and expire, and both fail modes hold when redis-server is stopped in
the middle of a run and started again."""
from __future__ import annotations

import ast
import asyncio
import logging
import math
import multiprocessing
import os
import pathlib
import subprocess
import sys
import time
import uuid

import pytest

from busbar.governance.model import (
    NANO, GroupRecord, KeyRecord, Limit, Usage, day_of, new_key_id, window)
from busbar.governance.redis_store import (
    EXPIRE_MARGIN, MISS, UNAVAILABLE, RedisDirectory, RedisLedger, RedisStore, group_from_dict,
    group_to_dict)

ROOT = pathlib.Path(__file__).resolve().parents[3]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def prefix():
    """Each test's own key space on the shared server."""
    return "t%s:" % uuid.uuid4().hex[:8]


def check(bucket, kind, limit, charge, per="minute", now=None, group="g", wid=None):
    if kind == "concurrent":
        per = None
    w, roll = window(per, now if now is not None else time.time())
    return (bucket, kind, limit, charge, w if wid is None else wid, roll, group, per)


async def until(cond, timeout=3.0, step=0.02):
    """Polls an async condition; True as soon as it holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await cond():
            return True
        await asyncio.sleep(step)
    return False


async def raw_client(url):
    import redis.asyncio
    return redis.asyncio.Redis.from_url(url)


# ---------------------------------------------------------------------------- records, usage
def test_keys_groups_usage_round_trip(redis_server):
    async def go():
        p = prefix()
        st = RedisStore(redis_server.url, prefix=p)
        await st.open()
        try:
            k = KeyRecord(new_key_id(), "ci", group="team-a", allowed_pools=["fast"], created=10,
                          expires=2_000_000_000, gen="0" * 32,
                          aws_access_key_id="BBAK0000000000000001", aws_secret="s3cret",
                          labels={"env": "ci"})
            k2 = KeyRecord(new_key_id(), "other", created=20)
            await st.put_key(k)
            await st.put_key(k2)
            got = await st.get_key(k.id)
            assert got.to_dict() == k.to_dict()
            assert (await st.key_by_aws("BBAK0000000000000001")).id == k.id
            assert await st.key_by_aws("BBAK0000000000000009") is None
            assert [x.id for x in await st.list_keys()] == [k.id, k2.id]
            # A new AWS credential on the same key: the old access key id no longer resolves.
            k.aws_access_key_id = "BBAK0000000000000002"
            k.state = "disabled"
            await st.put_key(k)
            assert await st.key_by_aws("BBAK0000000000000001") is None
            assert (await st.key_by_aws("BBAK0000000000000002")).state == "disabled"
            await st.delete_key(k.id)
            assert await st.get_key(k.id) is None
            assert await st.key_by_aws("BBAK0000000000000002") is None
            assert [x.id for x in await st.list_keys()] == [k2.id]

            g = GroupRecord("team-a", parent="org", enabled=False, source="config", limits=[
                Limit("requests", 60, "minute"), Limit("budget_usd", 5 * NANO, "day", "fast"),
                Limit("concurrent", 4)])
            assert group_from_dict(group_to_dict(g)) == g
            await st.put_group(g)
            await st.put_group(GroupRecord("org"))
            assert await st.get_group("team-a") == g
            assert [x.name for x in await st.list_groups()] == ["org", "team-a"]
            await st.delete_group("org")
            assert await st.get_group("org") is None
            assert [x.name for x in await st.list_groups()] == ["team-a"]

            # Usage is additive, per UTC day and (key, group, model, pool).
            d1, d2 = "2026-01-01", "2026-01-02"
            await st.add_usage([Usage(d1, k.id, "team-a", "m1", "fast", 1, 100, 20, 5, 0),
                                Usage(d1, k.id, "team-a", "m1", "fast", 1, 50, 10, 0, 7)])
            await st.add_usage([Usage(d1, k2.id, None, "m2", None, 1, 1, 2),
                                Usage(d2, k.id, "team-a", "m1", "fast", 2, 3, 4)])
            rows = {r["key_id"]: r for r in await st.usage_rows(d1)}
            assert rows == {
                k.id: {"day": d1, "key_id": k.id, "group": "team-a", "model": "m1",
                       "pool": "fast", "requests": 2, "input_tokens": 150, "output_tokens": 30,
                       "cache_read_tokens": 5, "cache_write_tokens": 7, "billable_requests": 2},
                k2.id: {"day": d1, "key_id": k2.id, "group": None, "model": "m2", "pool": None,
                        "requests": 1, "input_tokens": 1, "output_tokens": 2,
                        "cache_read_tokens": 0, "cache_write_tokens": 0, "billable_requests": 1}}
            everything = await st.usage_rows()
            assert [(r["day"], r["requests"]) for r in everything if r["key_id"] == k.id] == [
                (d1, 2), (d2, 2)]
            assert await st.usage_rows("2025-12-31") == []
        finally:
            await st.close()
    run(go())


def test_invalidation_reaches_directory_within_1s(redis_server):
    async def go():
        p = prefix()
        st = RedisStore(redis_server.url, prefix=p)
        d = RedisDirectory(redis_server.url, prefix=p)
        await st.open()
        await d.start()
        try:
            assert d.live
            k = KeyRecord(new_key_id(), "ci", group="g1", aws_access_key_id="BBAK00000000000000AA")
            assert d.cached_key(k.id) is MISS
            assert await d.key(k.id) is None                 # unknown: remembered briefly
            assert d.cached_key(k.id) is None
            await st.put_key(k)                              # ...and forgotten on its message
            assert await until(lambda: _eq(d.key(k.id), "active", "state"), 1.0)
            assert d.cached_key(k.id).state == "active"
            assert (await d.key_by_aws("BBAK00000000000000AA")).id == k.id

            t0 = time.monotonic()
            k.state = "revoked"
            await st.put_key(k)
            assert await until(lambda: _eq(d.key(k.id), "revoked", "state"), 1.0)
            assert time.monotonic() - t0 < 1.0
            assert (await d.key_by_aws("BBAK00000000000000AA")).state == "revoked"

            await st.put_group(GroupRecord("g1", limits=[Limit("requests", 1, "minute")]))
            assert (await d.group("g1")).enabled
            await st.put_group(GroupRecord("g1", enabled=False))
            assert await until(lambda: _eq(d.group("g1"), False, "enabled"), 1.0)
            await st.delete_group("g1")
            assert await until(lambda: _is_none(d.group("g1")), 1.0)

            # A raw write that published nothing stays unseen until "all".
            r = await raw_client(redis_server.url)
            k.group = "g2"
            import orjson
            await r.hset(p + "keys", k.id, orjson.dumps(k.to_dict()))
            assert (await d.key(k.id)).group == "g1"
            await st.invalidate_all()
            assert await until(lambda: _eq(d.key(k.id), "g2", "group"), 1.0)
            await r.aclose()
        finally:
            await d.close()
            await st.close()
    run(go())


async def _eq(aw, want, attr):
    rec = await aw
    return rec is not None and rec != UNAVAILABLE and getattr(rec, attr) == want


async def _is_none(aw):
    return (await aw) is None


def test_directory_across_a_redis_restart(own_redis):
    """The subscription drops with the server: known keys are still served while Redis is down,
    an unknown one is UNAVAILABLE (not None: the engine answers 503, not 401), and after the
    restart nothing cached from before survives (this server has no persistence: the key is gone)."""
    async def go():
        st = RedisStore(own_redis.url)
        d = RedisDirectory(own_redis.url)
        await st.open()
        await d.start()
        try:
            k = KeyRecord(new_key_id(), "ci")
            await st.put_key(k)
            assert await until(lambda: _cached(d, k.id), 1.0)   # read after its own message
            own_redis.stop()
            assert await until(lambda: _not_live(d), 2.0)
            assert (await d.key(k.id)).id == k.id
            assert await d.key(new_key_id()) == UNAVAILABLE
            own_redis.start()
            assert await until(lambda: _is_none(d.key(k.id)), 2.0)
            assert d.live
        finally:
            await d.close()
            await st.close()
    run(go())


async def _cached(d, key_id):
    await d.key(key_id)
    return d.cached_key(key_id) not in (MISS, None)


async def _not_live(d):
    return not d.live


# ---------------------------------------------------------------------------- admission
def test_multi_check_admission_is_all_or_nothing(redis_server):
    async def go():
        p = prefix()
        led = RedisLedger(redis_server.url, prefix=p)
        st = RedisStore(redis_server.url, prefix=p)
        await led.start()
        await st.open()
        try:
            now = time.time()
            rate = check("g#0", "requests", 10, 1, "minute", now)
            budget = check("org#0", "budget_usd", 3 * NANO, 2 * NANO, "day", now, group="org")
            assert await led.admit([rate, budget], now) is None
            den = await led.admit([rate, budget], now)       # 2+2 > 3: the budget refuses
            assert (den.kind, den.group, den.per, den.retry_after) == (
                "budget_usd", "org", "day", None)
            assert await st.bucket_values([rate, budget]) == [1, 2 * NANO]   # rate not charged

            # Settle the reservation down to the actual cost: room for one more.
            led.settle([rate, budget], [0, -(2 * NANO) + NANO // 2], None)
            await led.flush()
            assert await st.bucket_values([budget]) == [NANO // 2]
            assert await led.admit([rate, budget], now) is None
            assert await st.bucket_values([rate, budget]) == [2, NANO // 2 + 2 * NANO]

            full = check("g#1", "requests", 1, 1, "minute", now)
            assert await led.admit([full], now) is None
            den = await led.admit([rate, full], now)
            assert (den.kind, den.per) == ("requests", "minute")
            assert den.retry_after == math.ceil(rate[5])     # to the window's roll
            assert await st.bucket_values([rate]) == [2]

            # tokens: post-paid, the request that crosses the limit passes, the next one not.
            tok = check("g#2", "tokens", 100, 0, "hour", now)
            assert await led.admit([tok], now) is None
            led.settle([tok], [150], None)
            await led.flush()
            den = await led.admit([tok], now)
            assert den.kind == "tokens" and den.retry_after == math.ceil(tok[5])
        finally:
            await led.close()
            await st.close()
    run(go())


def test_cancelled_admission_leaves_no_charge(redis_server):
    """A caller cancelled while its admission is in flight (its client went away) never settles:
    whatever the script charged is refunded."""
    async def go():
        p = prefix()
        led = RedisLedger(redis_server.url, prefix=p)
        st = RedisStore(redis_server.url, prefix=p)
        await led.start()
        await st.open()
        try:
            conc = check("g#0", "concurrent", 1, 1)
            t = asyncio.ensure_future(led.admit([conc], time.time()))
            await asyncio.sleep(0)          # sent, not answered
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            assert await until(lambda: _values_are(st, [conc], [0]), 2.0)
            assert await led.admit([conc], time.time()) is None
        finally:
            await led.close()
            await st.close()
    run(go())


async def _values_are(st, checks, want):
    return await st.bucket_values(checks) == want


def test_window_roll_and_expiry(redis_server):
    async def go():
        p = prefix()
        led = RedisLedger(redis_server.url, prefix=p)
        r = await raw_client(redis_server.url)
        await led.start()
        try:
            now = time.time()
            this = check("g#0", "requests", 2, 1, "minute", now)
            assert await led.admit([this], now) is None
            assert await led.admit([this], now) is None
            assert (await led.admit([this], now)).kind == "requests"
            # The next minute's window is a new counter: it starts from 0.
            w, _ = window("minute", now)
            nxt = (this[0], "requests", 2, 1, w + 1, 60.0, "g", "minute")
            assert await led.admit([nxt], now + 60) is None
            key = "%sc:g#0:%d" % (p, w)
            ttl = await r.ttl(key)
            assert 0 < ttl <= int(this[5]) + 1 + EXPIRE_MARGIN
            assert int(await r.get("%sc:g#0:%d" % (p, w + 1))) == 1
            # A window-0 counter (total, concurrent) never expires; settling a windowed counter
            # that does not exist yet creates it with its expiry.
            total = check("g#1", "budget_usd", 10, 1, "total", now)
            assert await led.admit([total], now) is None
            assert await r.ttl("%sc:g#1:0" % p) == -1
            tok = check("g#2", "tokens", 10, 0, "day", now)
            led.settle([tok], [7], None)
            await led.flush()
            assert 0 < await r.ttl("%sc:g#2:%d" % (p, tok[4])) <= int(tok[5]) + 1 + EXPIRE_MARGIN
        finally:
            await r.aclose()
            await led.close()
    run(go())


# Several gateways in separate processes against one Redis.
def _proc_admit(url, p, checks, n, start_at):
    async def go():
        led = RedisLedger(url, prefix=p)
        await led.start()
        await asyncio.sleep(max(0.0, start_at - time.time()))
        now = time.time()
        res = await asyncio.gather(*(led.admit(checks, now) for _ in range(n)))
        await led.close()
        return sum(1 for x in res if x is None), sum(1 for x in res if x == UNAVAILABLE)
    return asyncio.run(go())


def _proc_concurrent(url, p, chk, n, inflight, peak, lock):
    async def one(led):
        while True:
            if await led.admit([chk], time.time()) is None:
                break
            await asyncio.sleep(0.003)
        with lock:
            inflight.value += 1
            peak.value = max(peak.value, inflight.value)
        await asyncio.sleep(0.01)
        with lock:
            inflight.value -= 1
        led.settle([chk], [-1], None)

    async def go():
        led = RedisLedger(url, prefix=p)
        await led.start()
        await asyncio.gather(*(one(led) for _ in range(n)))
        await led.close()
        return n
    return asyncio.run(go())


@pytest.fixture(scope="module")
def procs():
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        yield ctx, pool


def test_exact_across_processes(redis_server, procs):
    ctx, pool = procs
    url = redis_server.url
    now = time.time()

    p = prefix()
    rate = check("team#0", "requests", 20, 1, "minute", now)
    start = time.time() + 0.3
    got = pool.starmap(_proc_admit, [(url, p, [rate], 15, start)] * 4)
    assert sum(a for a, _ in got) == 20 and sum(u for _, u in got) == 0

    p = prefix()
    reserve = 37 * NANO // 100                          # $0.37 a request, $3.70 in all: 10
    budget = check("team#1", "budget_usd", 10 * reserve, reserve, "month", now)
    start = time.time() + 0.3
    got = pool.starmap(_proc_admit, [(url, p, [budget], 15, start)] * 4)
    assert sum(a for a, _ in got) == 10

    p = prefix()
    conc = check("team#2", "concurrent", 3, 1)
    inflight, peak, lock = ctx.Value("i", 0, lock=False), ctx.Value("i", 0, lock=False), ctx.Lock()
    # Values and the lock go to the forked workers through Process args, not a Pool's pickling.
    workers = [ctx.Process(target=_proc_concurrent, args=(url, p, conc, 8, inflight, peak, lock))
               for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(20)
        assert w.exitcode == 0
    assert 1 <= peak.value <= 3
    assert inflight.value == 0

    async def left():
        st = RedisStore(url, prefix=p)
        await st.open()
        try:
            return await st.bucket_values([conc])
        finally:
            await st.close()
    assert run(left()) == [0]                      # every slot released


# ---------------------------------------------------------------------------- fail modes
def test_fail_closed_refuses_then_recovers(own_redis, caplog):
    caplog.set_level(logging.INFO, "busbar.governance")

    async def go():
        led = RedisLedger(own_redis.url, fail_mode="closed")
        st = RedisStore(own_redis.url)
        await led.start()
        await st.open()
        try:
            now = time.time()
            rate = check("g#0", "requests", 100, 1, "minute", now)
            tok = check("g#1", "tokens", 10**6, 0, "total", now)
            assert await led.admit([rate, tok], now) is None
            own_redis.stop()
            t0 = time.monotonic()
            assert await led.admit([rate, tok], now) == UNAVAILABLE
            assert await led.admit([rate, tok], now) == UNAVAILABLE
            assert time.monotonic() - t0 < 1.0           # refused fast, not a timeout per call
            assert not led.up
            # A request admitted before the outage settles during it: kept, written later.
            led.settle([rate, tok], [0, 42], Usage(day_of(now), "vk_x", "g", "m", None, 1, 40, 2))
            await led.flush()
            own_redis.start()                            # empty: this server does not persist
            assert await until(lambda: _admitted(led, [rate, tok], now), 3.0)
            await led.flush()
            assert await st.bucket_values([rate, tok]) == [1, 42]
            rows = await st.usage_rows()
            assert [(r["input_tokens"], r["output_tokens"]) for r in rows] == [(40, 2)]
        finally:
            await led.close()
            await st.close()
    run(go())
    msgs = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "busbar.governance"]
    assert [m for lvl, m in msgs if lvl == logging.WARNING and "store_unreachable store=redis" in m].__len__() == 1
    assert sum(1 for lvl, m in msgs if lvl == logging.INFO and "store_reachable store=redis" in m) == 1


async def _admitted(led, checks, now):
    return await led.admit(checks, now) is None


def test_fail_open_counts_locally_and_reconciles(tmp_path, caplog):
    """fail_mode open: with Redis gone the worker keeps admitting against the same limit, counted
    from the last value it saw; when Redis is back the local counts land in it exactly once."""
    from tests.redis_server import RedisServer, redis_server_path
    if redis_server_path() is None:
        pytest.skip("redis-server not found: `make redis` installs Debian's redis-server")
    caplog.set_level(logging.INFO, "busbar.governance")
    srv = RedisServer(persist=True).start()          # a stop saves, the restart loads

    async def go():
        led = RedisLedger(srv.url, fail_mode="open")
        st = RedisStore(srv.url)
        await led.start()
        await st.open()
        try:
            now = time.time()
            day = day_of(now)
            rate = check("g#0", "requests", 10, 1, "minute", now)
            budget = check("g#1", "budget_usd", 100, 5, "day", now)
            for _ in range(4):
                assert await led.admit([rate, budget], now) is None
                led.settle([rate, budget], [0, -2], Usage(day, "vk_a", "g", "m", None, 1, 10, 1))
            await led.flush()
            assert await st.bucket_values([rate, budget]) == [4, 12]

            srv.stop()
            results = [await led.admit([rate, budget], now) for _ in range(10)]
            assert not led.up
            admitted = sum(1 for x in results if x is None)
            assert admitted == 6                         # 4 seen in Redis + 6 local = the limit
            assert all(x.kind == "requests" for x in results if x is not None)
            for _ in range(admitted):
                led.settle([rate, budget], [0, -2], Usage(day, "vk_a", "g", "m", None, 1, 10, 1))
            await led.flush()

            srv.start()
            assert await until(lambda: _up(led), 3.0)
            await led.flush()
            assert await st.bucket_values([rate, budget]) == [10, 30]
            rows = await st.usage_rows(day)
            assert [(r["requests"], r["input_tokens"]) for r in rows] == [(10, 100)]
            assert (await led.admit([rate], now)).kind == "requests"      # Redis enforces again
            await asyncio.sleep(0.3)
            assert await st.bucket_values([rate, budget]) == [10, 30]     # reconciled once
        finally:
            await led.close()
            await st.close()
    try:
        run(go())
    finally:
        srv.close()
    msgs = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "busbar.governance"]
    assert sum(1 for lvl, m in msgs if lvl == logging.WARNING and "store_unreachable store=redis" in m) == 1
    assert sum(1 for lvl, m in msgs if lvl == logging.INFO and "store_reachable store=redis" in m) == 1


async def _up(led):
    return led.up


# ---------------------------------------------------------------------------- packaging
def test_redis_py_works_without_the_executables_excluded_modules(redis_server):
    """packaging/busbar.spec leaves modules out of the single-file executable (importlib.metadata,
    email, csv, zipfile, ...); redis-py must still import and talk on the asyncio path without
    them. Also: importing the store module does not import redis-py."""
    spec = (ROOT / "packaging" / "busbar.spec").read_text()
    excludes = None
    for node in ast.parse(spec).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXCLUDES":
            excludes = ast.literal_eval(node.value)
    assert excludes and "importlib.metadata" in excludes
    code = r"""
import sys, importlib.abc
EXCLUDES = %r
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == e or name.startswith(e + ".") for e in EXCLUDES):
            raise ModuleNotFoundError("excluded from the executable: " + name, name=name)
        return None
loaded = [m for m in sys.modules if any(m == e or m.startswith(e + ".") for e in EXCLUDES)]
for m in loaded:
    del sys.modules[m]
sys.meta_path.insert(0, Block())
import asyncio, time
import busbar.governance.redis_store as rs
assert "redis" not in sys.modules
from busbar.governance.model import KeyRecord, window
async def go():
    st = rs.RedisStore(sys.argv[1], prefix="frozen:")
    await st.open()
    await st.put_key(KeyRecord("vk_0000000000000001", "n"))
    assert (await st.get_key("vk_0000000000000001")).name == "n"
    led = rs.RedisLedger(sys.argv[1], prefix="frozen:")
    await led.start()
    w, roll = window("minute", time.time())
    assert await led.admit([("g#0", "requests", 1, 1, w, roll, "g", "minute")], time.time()) is None
    await led.close(); await st.close()
asyncio.run(go())
print("ok")
""" % (excludes,)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in sys.path if p]))
    out = subprocess.run([sys.executable, "-S", "-c", code, redis_server.url], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
