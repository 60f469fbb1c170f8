"""The Valkey/Redis store against a real redis-server (tests/redis_server.py), in the key layout of
the Rust gateway's valkey store: records and usage round trip and sit where and as that store
keeps them; a namespace written as that store writes it reads as is and its ledger counts in
admission; invalidation reaches every worker's cache within 1 s; admission is exact across
processes and all-or-nothing; windows roll and expire; both fail modes hold when redis-server is
stopped in the middle of a run and started again."""
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

import orjson
import pytest

from busbar.governance.model import (
    NANO, GroupRecord, KeyRecord, Limit, Rate, Usage, day_epoch, day_of, new_generation,
    new_key_id, rust_bucket, window, window_deltas, window_start)
from busbar.governance.redis_store import (
    EXPIRE_MARGIN, MISS, UNAVAILABLE, RedisDirectory, RedisLedger, RedisStore)
from busbar.governance.store import StoreError

ROOT = pathlib.Path(__file__).resolve().parents[3]
CARD = {"m": Rate(1.0, 2.0)}        # nano-units per token: 1000 input, 2000 output


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def prefix():
    """Each test's own key space on the shared server."""
    return "t%s:" % uuid.uuid4().hex[:8]


def check(group, kind, limit, charge, per="minute", now=None, pool=None):
    """A check as the gate makes it for Redis: the Rust ledger bucket and the window start."""
    if kind == "concurrent":
        return (group, kind, limit, charge, 0, None, group, None)
    now = now if now is not None else time.time()
    _, roll = window(per, now)
    return (rust_bucket(group, per, pool), kind, limit, charge, window_start(per, now), roll, group,
            per)


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


def usage(key_id="vk_x", group="g", model="m", inp=0, out=0, day=None):
    return Usage(day or day_of(time.time()), key_id, group, model, None, 1, inp, out, 0, 0, 1,
                 "prov")


# ---------------------------------------------------------------------------- records, usage
def test_keys_groups_usage_round_trip_in_the_rust_layout(redis_server):
    async def go():
        p = prefix()
        st = RedisStore(redis_server.url, prefix=p)
        r = await raw_client(redis_server.url)
        await st.open()
        try:
            now = int(time.time())
            gen = new_generation()
            k = KeyRecord(new_key_id(), "ci", group="team-a", allowed_pools=["fast"], created=10,
                          expires=2_000_000_000, gen=gen, aws_access_key_id="AKIA0000000000000001",
                          aws_secret="s3cret", aws_cred_id="cred_1", labels={"env": "ci"})
            k2 = KeyRecord(new_key_id(), "other", created=20, allowed_pools=[])
            await st.put_key(k)
            await st.put_key(k2)
            got = await st.get_key(k.id)
            assert got.to_dict() == dict(k.to_dict(), revision=got.revision) and got.revision > 0
            assert (await st.key_by_aws("AKIA0000000000000001")).id == k.id
            assert await st.key_by_aws("AKIA0000000000000009") is None
            assert [x.id for x in await st.list_keys()] == [k.id, k2.id]
            assert (await st.get_key(k2.id)).allowed_pools == []
            # where and as the Rust valkey store keeps them
            assert await r.get(p + "schema") == b"6"
            vk = orjson.loads(await r.get(p + "key:" + k.id))
            assert vk == {"id": k.id, "generation_hash": "binding:%s:%s" % (k.id, gen),
                          "name": "ci", "allowed_pools": ["fast"], "enabled": True,
                          "created_at": 10, "group": "team-a", "labels": {"env": "ci"},
                          "expires_at": 2_000_000_000, "deleted_at": None,
                          "revision": vk["revision"]}
            assert await r.smembers(p + "keys") == {k.id.encode(), k2.id.encode()}
            assert await r.zscore(p + "keys:byrev", k.id) == vk["revision"]
            cred = orjson.loads(await r.get(p + "cred:%s:sigv4:0" % k.id))
            assert cred["secret"] == "v1:plain:s3cret" and cred["meta"]["kind"] == "sigv4"
            assert (cred["meta"]["public_id"], cred["meta"]["secret_form"], cred["meta"]["slot"]) \
                == ("AKIA0000000000000001", "Recoverable", 0)
            assert await r.get(p + "cred:pub:sigv4:AKIA0000000000000001") == \
                ("%s:sigv4:0" % k.id).encode()
            assert await r.smembers(p + "cred:ids:" + k.id) == {b"sigv4:0"}
            # a new AWS pair on the same key: the old access key id no longer resolves
            k.aws_access_key_id, k.aws_secret = "AKIA0000000000000002", "other"
            k.state = "disabled"
            await st.put_key(k)
            assert await st.key_by_aws("AKIA0000000000000001") is None
            assert (await st.key_by_aws("AKIA0000000000000002")).state == "disabled"
            assert orjson.loads(await r.get(p + "key:" + k.id))["enabled"] is False
            # revoked: denylisted, its pair revoked (and its secret gone), never enabled again
            k.state = "revoked"
            await st.put_key(k)
            assert await r.sismember(p + "denylist", k.id)
            assert await st.key_by_aws("AKIA0000000000000002") is None
            cred = orjson.loads(await r.get(p + "cred:%s:sigv4:0" % k.id))
            assert cred["meta"]["revoked_at"] is not None and cred["secret"] == ""
            assert (await st.get_key(k.id)).state == "revoked"
            # deleted: a tombstone, its credentials gone, its id denylisted; never written back
            await st.delete_key(k2.id)
            await st.delete_key(k2.id)                      # idempotent
            gone = await st.get_key(k2.id)
            assert gone.state == "tombstoned" and gone.deleted >= now
            assert await r.sismember(p + "denylist", k2.id)
            with pytest.raises(StoreError):
                gone.state = "active"
                await st.put_key(gone)
            await st.delete_key(k.id)
            assert await r.get(p + "cred:%s:sigv4:0" % k.id) is None
            assert await r.get(p + "cred:pub:sigv4:AKIA0000000000000002") is None
            with pytest.raises(StoreError):
                await st.delete_key("vk_nobody")

            g = GroupRecord("team-a", parent="org", enabled=False, source="config", limits=[
                Limit("requests", 60, "minute"), Limit("budget_usd", 5 * NANO, "day", "fast"),
                Limit("concurrent", 4)])
            await st.put_group(g)
            await st.put_group(GroupRecord("org"))
            assert await st.get_group("team-a") == g
            assert [x.name for x in await st.list_groups()] == ["org", "team-a"]
            await st.delete_group("org")
            assert await st.get_group("org") is None
            assert [x.name for x in await st.list_groups()] == ["team-a"]

            # Usage: metering per UTC day, key, model and provider; the ledger per bucket.
            d1, d2 = "2026-01-01", "2026-01-02"
            rows = [Usage(d1, k.id, "team-a", "m1", "fast", 1, 100, 20, 5, 0, 1, "openai"),
                    Usage(d1, k.id, "team-a", "m1", "fast", 1, 50, 10, 0, 7, 0, "openai")]
            await st.add_usage(rows, window_deltas(rows, lambda g, pool: [], now))
            await st.add_usage([Usage(d1, k2.id, None, "m2", None, 1, 1, 2, 0, 0, 1, "x|y"),
                                Usage(d2, k.id, "team-a", "m1", "fast", 2, 3, 4, 0, 0, 2, "openai")])
            got = {r_["key_id"]: r_ for r_ in await st.usage_rows(d1)}
            assert got == {
                k.id: {"day": d1, "key_id": k.id, "group": "team-a", "model": "m1",
                       "provider": "openai", "requests": 2, "input_tokens": 150,
                       "output_tokens": 30, "cache_read_tokens": 5, "cache_write_tokens": 7,
                       "billable_requests": 1},
                k2.id: {"day": d1, "key_id": k2.id, "group": None, "model": "m2",
                        "provider": "x|y", "requests": 1, "input_tokens": 1, "output_tokens": 2,
                        "cache_read_tokens": 0, "cache_write_tokens": 0, "billable_requests": 1}}
            everything = await st.usage_rows()
            assert [(x["day"], x["requests"]) for x in everything if x["key_id"] == k.id] == [
                (d1, 2), (d2, 2)]
            assert await st.usage_rows("2025-12-31") == []
            b1 = day_epoch(d1)
            row = await r.hgetall(p + "metering:%d:%s|m2|x\\|y" % (b1, k2.id))
            assert row[b"provider"] == b"x|y" and row[b"tokens_output"] == b"2"
            assert await r.sismember(p + "metering:%d" % b1, p + "metering:%d:%s|m2|x\\|y"
                                     % (b1, k2.id))
            assert await st.window(k.id, 0) == (2, 1, {"m1": [150, 30, 5, 7]}, 0)
        finally:
            await r.aclose()
            await st.close()
    run(go())


def test_a_namespace_the_rust_store_wrote_is_read_and_counted(redis_server):
    """Keys, credentials, the denylist and ledger hashes written as the Rust valkey store writes
    them (raw commands, its JSON): busbar's directory and store read them, and its admission
    counts what the Rust ledger holds."""
    async def go():
        p = prefix()
        r = await raw_client(redis_server.url)
        now = int(time.time())
        live, gen = new_key_id(), new_generation()
        await r.set(p + "schema", 6)
        await r.set(p + "key:" + live, orjson.dumps({
            "id": live, "generation_hash": "binding:%s:%s" % (live, gen), "name": "rust",
            "allowed_pools": None, "enabled": True, "created_at": now - 50, "group": "team",
            "labels": {}, "expires_at": None, "deleted_at": None, "revision": 3}))
        await r.set(p + "key:vk_gone", orjson.dumps({
            "id": "vk_gone", "generation_hash": "binding:vk_gone:" + gen, "name": "",
            "enabled": True, "created_at": now - 50}))     # the optional fields left out
        await r.sadd(p + "keys", live, "vk_gone")
        await r.set(p + "cred:%s:sigv4:0" % live, orjson.dumps({
            "meta": {"id": "cred_r", "key_id": live, "kind": "sigv4", "slot": 0,
                     "public_id": "AKIARUSTRUSTRUST0000", "secret_form": "Recoverable",
                     "created_at": now, "updated_at": now, "expires_at": None,
                     "revoked_at": None, "revoke_reason": None, "revision": 4},
            "secret": "v1:plain:rust-secret"}))
        await r.set(p + "cred:pub:sigv4:AKIARUSTRUSTRUST0000", "%s:sigv4:0" % live)
        await r.set(p + "denylist:vk_gone", "leaked")
        await r.sadd(p + "denylist", "vk_gone")
        minute = window_start("minute", now)
        await r.hset(p + "usage:group:team@minute:%d" % minute, mapping={
            "requests": 3, "billable_requests": 3, "m:m:input": 400, "m:m:output": 100,
            "m:m:cache_read": 7, "m:m:cache_write": 3})

        st = RedisStore(redis_server.url, prefix=p)
        d = RedisDirectory(redis_server.url, prefix=p)
        led = RedisLedger(redis_server.url, prefix=p)
        await st.open()
        await d.start()
        await led.start()
        try:
            rec = await d.key(live)
            assert (rec.name, rec.group, rec.gen, rec.state, rec.allowed_pools) == (
                "rust", "team", gen, "active", None)
            assert (await d.key_by_aws("AKIARUSTRUSTRUST0000")).aws_secret == "rust-secret"
            assert (await d.key("vk_gone")).state == "revoked"
            assert (await st.get_key("vk_gone")).labels == {}
            rate = check("team", "requests", 5, 1, "minute", now)
            tok = check("team", "tokens", 511, 0, "minute", now)
            budget = check("team", "budget_usd", 700_001, 0, "minute", now)
            # 3 requests, 510 tokens (every tier, as the Rust ledger's total counts a tokens limit),
            # 400 x 1000 + 100 x 2000 = 600000 nano already counted (CARD prices no cache tier)
            assert await st.check_values([rate, tok, budget], CARD) == [3, 510, 600_000]
            assert await led.admit([rate, tok, budget], now, CARD, 100_000) is None
            den = await led.admit([rate, tok, budget], now, CARD, 100_000)
            assert den.kind == "budget_usd"                  # 600000 + 100000 + 100000 > 700001
            led.settle([rate, tok, budget], 100_000, usage("vk_x", "team", "m", 1, 0), True, 1000)
            await led.flush()
            assert await st.check_values([rate, tok, budget], CARD) == [4, 511, 601_000]
            assert (await led.admit([rate], now, CARD)) is None
            assert (await led.admit([tok], now, CARD)).kind == "tokens"
            h = await r.hgetall(p + "usage:group:team@minute:%d" % minute)
            assert h[b"requests"] == b"5" and h[b"m:m:input"] == b"401" and h[b"bb:reserved"] == b"0"
        finally:
            await led.close()
            await d.close()
            await st.close()
            await r.aclose()
    run(go())


def test_busbars_earlier_layout_is_carried_into_a_fresh_namespace(redis_server):
    """busbar's earlier Redis layout (as its code before this one wrote it: JSON docs in the hashes
    <p>keys and <p>groups, usage per day in <p>u:<day> with JSON fields [key, group, model, pool,
    metric], the days in <p>udays; the docs here are the ones of the SQLite fixture, made by that
    code): the first open of a fresh namespace carries keys, groups and usage over."""
    import re
    sql = (ROOT / "tests" / "fixtures" / "stores" / "busbar-0.x-store.sql").read_text()
    docs = [d.replace("''", "'") for d in re.findall(r"INSERT INTO keys VALUES\('[^']*',[^,]*,'(.*)'\);", sql)]
    [group] = re.findall(r"INSERT INTO \"groups\" VALUES\('[^']*','(.*)'\);", sql)
    usage_rows = re.findall(r"INSERT INTO usage VALUES\((.*)\);", sql)

    async def go():
        old, p = prefix(), prefix()
        r = await raw_client(redis_server.url)
        for d in docs:
            await r.hset(old + "keys", orjson.loads(d)["id"], d)
        await r.hset(old + "groups", "api-made", group)
        want = {}
        for row in usage_rows:
            day, kid, grp, model, pool, *counts = [x.strip("'") for x in row.split(",")]
            await r.sadd(old + "udays", day)
            for metric, v in zip(("requests", "input_tokens", "output_tokens", "cache_read_tokens",
                                  "cache_write_tokens"), counts):
                await r.hincrby(old + "u:" + day, orjson.dumps([kid, grp, model, pool, metric]), int(v))
            want[(day, kid, model)] = [int(c) for c in counts]
        st = RedisStore(redis_server.url, prefix=p, earlier_prefix=old)
        await st.open()
        try:
            keys = {k.name: k for k in await st.list_keys()}
            assert {n: k.state for n, k in keys.items()} == {
                "live": "active", "aws": "active", "revoked": "revoked", "disabled": "disabled",
                "deleted": "tombstoned"}
            aws = keys["aws"]
            assert (await st.key_by_aws(aws.aws_access_key_id)).id == aws.id
            assert keys["live"].labels == {"env": "ci"} and keys["live"].group == "team"
            assert (await st.get_group("api-made")).parent == "org"
            got = {(x["day"], x["key_id"], x["model"]): [x[f] for f in (
                "requests", "input_tokens", "output_tokens", "cache_read_tokens",
                "cache_write_tokens")] for x in await st.usage_rows()}
            assert got == want
            live = keys["live"].id
            assert (await st.window(live, 0))[0] == sum(c[0] for k, c in want.items() if k[1] == live)
            assert await r.hlen(old + "keys") == len(docs)           # the old layout is left
        finally:
            await st.close()
            await r.aclose()
    run(go())


def test_another_schema_is_refused(redis_server):
    async def go():
        p = prefix()
        r = await raw_client(redis_server.url)
        await r.set(p + "schema", 5)
        st = RedisStore(redis_server.url, prefix=p)
        await st.open()
        try:
            with pytest.raises(StoreError, match="schema v5; this busbar reads v6"):
                await st.list_keys()
            await r.set(p + "schema", 7)
            with pytest.raises(StoreError, match="v7.*newer"):
                await st.get_key("vk_a")
        finally:
            await st.close()
            await r.aclose()
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
            k = KeyRecord(new_key_id(), "ci", group="g1", aws_access_key_id="AKIA00000000000000AA",
                          aws_secret="s")
            assert d.cached_key(k.id) is MISS
            assert await d.key(k.id) is None                 # unknown: remembered briefly
            assert d.cached_key(k.id) is None
            await st.put_key(k)                              # ...and forgotten on its message
            assert await until(lambda: _eq(d.key(k.id), "active", "state"), 1.0)
            assert d.cached_key(k.id).state == "active"
            assert (await d.key_by_aws("AKIA00000000000000AA")).id == k.id

            t0 = time.monotonic()
            k.state = "revoked"
            await st.put_key(k)
            assert await until(lambda: _eq(d.key(k.id), "revoked", "state"), 1.0)
            assert time.monotonic() - t0 < 1.0
            assert await d.key_by_aws("AKIA00000000000000AA") is None     # its pair revoked too

            await st.put_group(GroupRecord("g1", limits=[Limit("requests", 1, "minute")]))
            assert (await d.group("g1")).enabled
            await st.put_group(GroupRecord("g1", enabled=False))
            assert await until(lambda: _eq(d.group("g1"), False, "enabled"), 1.0)
            await st.delete_group("g1")
            assert await until(lambda: _is_none(d.group("g1")), 1.0)

            # A raw write that published nothing (a Rust gateway's) stays unseen until "all" or
            # until POLICY_TTL.
            r = await raw_client(redis_server.url)
            raw = orjson.loads(await r.get(p + "key:" + k.id))
            raw["group"] = "g2"
            await r.set(p + "key:" + k.id, orjson.dumps(raw))
            assert (await d.key(k.id)).group == "g1"
            await st.invalidate_all()
            assert await until(lambda: _eq(d.key(k.id), "g2", "group"), 1.0)
            raw["group"] = "g3"
            await r.set(p + "key:" + k.id, orjson.dumps(raw))
            import busbar.governance.redis_store as rs
            for name, (rec, _) in list(d._keys.items()):      # as if POLICY_TTL had passed
                d._keys[name] = (rec, time.monotonic() - 1)
            assert (await d.key(k.id)).group == "g3"
            assert rs.POLICY_TTL <= 5.0
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
            reserve = 2 * NANO
            rate = check("g", "requests", 10, 1, "minute", now)
            budget = check("org", "budget_usd", 3 * NANO, reserve, "day", now)
            assert await led.admit([rate, budget], now, CARD, reserve) is None
            den = await led.admit([rate, budget], now, CARD, reserve)   # 2+2 > 3: refused
            assert (den.kind, den.group, den.per, den.retry_after) == (
                "budget_usd", "org", "day", None)
            assert await st.check_values([rate, budget], CARD) == [1, 2 * NANO]  # rate not charged

            # The request ends: the reservation goes, its tokens price it (0.5 USD at m's rates).
            tokens = NANO // 2 // 2000
            led.settle([rate, budget], reserve, usage(out=tokens), True, NANO // 2)
            await led.flush()
            assert await st.check_values([budget], CARD) == [NANO // 2]
            assert await led.admit([rate, budget], now, CARD, reserve) is None
            assert await st.check_values([rate, budget], CARD) == [2, NANO // 2 + 2 * NANO]
            # both buckets counted the admissions (requests, billable), as the Rust ledger does
            assert (await st.window(budget[0], budget[4]))[:2] == (2, 2)

            full = check("g1", "requests", 1, 1, "minute", now)
            assert await led.admit([full], now, CARD) is None
            den = await led.admit([rate, full], now, CARD)
            assert (den.kind, den.per) == ("requests", "minute")
            assert den.retry_after == math.ceil(rate[5])     # to the window's roll
            assert await st.check_values([rate], CARD) == [2]

            # tokens: post-paid, the request that crosses the limit passes, the next one not.
            tok = check("g2", "tokens", 100, 0, "hour", now)
            assert await led.admit([tok], now, CARD) is None
            led.settle([tok], 0, usage(group="g2", inp=100, out=50), True)
            await led.flush()
            den = await led.admit([tok], now, CARD)
            assert den.kind == "tokens" and den.retry_after == math.ceil(tok[5])
            # a non-2xx answer comes off the billable count, not the admitted one
            led.settle([tok], 0, usage(group="g2"), False)
            await led.flush()
            assert (await st.window(tok[0], tok[4]))[:2] == (1, 0)
            # the key's own bucket and the metering saw every settle
            assert (await st.window("vk_x", 0))[:2] == (3, 2)
            [row] = await st.usage_rows(day_of(now))
            assert (row["requests"], row["billable_requests"], row["output_tokens"]) == (
                3, 2, tokens + 50)
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
            conc = check("g", "concurrent", 1, 1)
            rate = check("g", "requests", 5, 1)
            t = asyncio.ensure_future(led.admit([conc, rate], time.time(), CARD))
            await asyncio.sleep(0)          # sent, not answered
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            assert await until(lambda: _values_are(st, [conc, rate], [0, 0]), 2.0)
            assert await led.admit([conc], time.time(), CARD) is None
        finally:
            await led.close()
            await st.close()
    run(go())


async def _values_are(st, checks, want):
    return await st.check_values(checks, CARD) == want


def test_window_roll_and_expiry(redis_server):
    async def go():
        p = prefix()
        led = RedisLedger(redis_server.url, prefix=p)
        r = await raw_client(redis_server.url)
        await led.start()
        try:
            now = time.time()
            this = check("g", "requests", 2, 1, "minute", now)
            assert await led.admit([this], now, CARD) is None
            assert await led.admit([this], now, CARD) is None
            assert (await led.admit([this], now, CARD)).kind == "requests"
            # The next minute's window is a new ledger: it starts from 0.
            nxt = check("g", "requests", 2, 1, "minute", now + 60)
            assert nxt[4] == this[4] + 60
            assert await led.admit([nxt], now + 60, CARD) is None
            key = "%susage:group:g@minute:%d" % (p, this[4])
            ttl = await r.ttl(key)
            assert 0 < ttl <= int(this[5]) + 1 + EXPIRE_MARGIN
            assert int(await r.hget("%susage:group:g@minute:%d" % (p, nxt[4]), "requests")) == 1
            # A day, month or total ledger is kept as the Rust store keeps it; settling a minute
            # ledger that does not exist yet creates it with its expiry.
            total = check("g", "budget_usd", 10, 1, "total", now)
            assert await led.admit([total], now, CARD, 1) is None
            assert await r.ttl("%susage:group:g@total:0" % p) == -1
            tok = check("g2", "tokens", 10, 0, "minute", now)
            led.settle([tok], 0, usage(group="g2", inp=7), True)
            await led.flush()
            assert 0 < await r.ttl("%susage:group:g2@minute:%d" % (p, tok[4])) <= \
                int(tok[5]) + 1 + EXPIRE_MARGIN
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
        reserve = max([c[3] for c in checks if c[1] == "budget_usd"] or [0])
        res = await asyncio.gather(*(led.admit(checks, now, CARD, reserve) for _ in range(n)))
        await led.close()
        return sum(1 for x in res if x is None), sum(1 for x in res if x == UNAVAILABLE)
    return asyncio.run(go())


def _proc_concurrent(url, p, chk, n, inflight, peak, lock):
    async def one(led):
        while True:
            if await led.admit([chk], time.time(), CARD) is None:
                break
            await asyncio.sleep(0.003)
        with lock:
            inflight.value += 1
            peak.value = max(peak.value, inflight.value)
        await asyncio.sleep(0.01)
        with lock:
            inflight.value -= 1
        led.settle([chk], 0, None)

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
    rate = check("team", "requests", 20, 1, "minute", now)
    start = time.time() + 0.3
    got = pool.starmap(_proc_admit, [(url, p, [rate], 15, start)] * 4)
    assert sum(a for a, _ in got) == 20 and sum(u for _, u in got) == 0

    p = prefix()
    reserve = 37 * NANO // 100                          # $0.37 a request, $3.70 in all: 10
    budget = check("team", "budget_usd", 10 * reserve, reserve, "month", now)
    start = time.time() + 0.3
    got = pool.starmap(_proc_admit, [(url, p, [budget], 15, start)] * 4)
    assert sum(a for a, _ in got) == 10

    p = prefix()
    conc = check("team", "concurrent", 3, 1)
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
            return await st.check_values([conc])
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
            rate = check("g", "requests", 100, 1, "minute", now)
            tok = check("g", "tokens", 10**6, 0, "total", now)
            assert await led.admit([rate, tok], now, CARD) is None
            own_redis.stop()
            t0 = time.monotonic()
            assert await led.admit([rate, tok], now, CARD) == UNAVAILABLE
            assert await led.admit([rate, tok], now, CARD) == UNAVAILABLE
            assert time.monotonic() - t0 < 1.0           # refused fast, not a timeout per call
            assert not led.up
            # A request admitted before the outage settles during it: kept, written later.
            led.settle([rate, tok], 0, usage(inp=40, out=2), True)
            await led.flush()
            own_redis.start()                            # empty: this server does not persist
            assert await until(lambda: _admitted(led, [rate, tok], now), 3.0)
            await led.flush()
            assert await st.check_values([rate, tok], CARD) == [1, 42]
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
    return await led.admit(checks, now, CARD) is None


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
            card = {"m": Rate(0.003, 0.0)}       # 3 nano-units an input token
            rate = check("g", "requests", 10, 1, "minute", now)
            budget = check("g", "budget_usd", 100, 5, "day", now)
            for _ in range(4):                   # reserve 5, cost 3
                assert await led.admit([rate, budget], now, card, 5) is None
                led.settle([rate, budget], 5, usage("vk_a", inp=1), True, 3)
            await led.flush()
            assert await st.check_values([rate, budget], card) == [4, 12]

            srv.stop()
            results = [await led.admit([rate, budget], now, card, 5) for _ in range(10)]
            assert not led.up
            admitted = sum(1 for x in results if x is None)
            assert admitted == 6                         # 4 seen in Redis + 6 local = the limit
            assert all(x.kind == "requests" for x in results if x is not None)
            for _ in range(admitted):
                led.settle([rate, budget], 5, usage("vk_a", inp=1), True, 3)
            await led.flush()

            srv.start()
            assert await until(lambda: _up(led), 3.0)
            await led.flush()
            assert await st.check_values([rate, budget], card) == [10, 30]
            rows = await st.usage_rows(day)
            assert [(r["requests"], r["input_tokens"]) for r in rows] == [(10, 10)]
            assert (await led.admit([rate], now, card)).kind == "requests"   # Redis enforces again
            await asyncio.sleep(0.3)
            assert await st.check_values([rate, budget], card) == [10, 30]   # reconciled once
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
    """packaging/busbar.spec leaves modules out of the single-file executable (redis-py's own
    Redis-module command sets, OCSP, multidb and OpenTelemetry hooks, and more); redis-py must
    still import and talk on the asyncio path without them. Also: importing the store module does
    not import redis-py."""
    spec = (ROOT / "packaging" / "busbar.spec").read_text()
    excludes = None
    for node in ast.parse(spec).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "EXCLUDES":
            excludes = ast.literal_eval(node.value)
    assert excludes and "redis.commands.search" in excludes
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
from busbar.governance.model import KeyRecord, window, window_start
async def go():
    st = rs.RedisStore(sys.argv[1], prefix="frozen" + str(time.time_ns()) + ":")
    await st.open()
    await st.put_key(KeyRecord("vk_0000000000000001", "n"))
    assert (await st.get_key("vk_0000000000000001")).name == "n"
    led = rs.RedisLedger(sys.argv[1], prefix=st.prefix)
    await led.start()
    w, roll = window_start("minute", time.time()), window("minute", time.time())[1]
    assert await led.admit([("group:g@minute", "requests", 1, 1, w, roll, "g", "minute")],
                           time.time(), {}) is None
    await led.close(); await st.close()
asyncio.run(go())
print("ok")
""" % (excludes,)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in sys.path if p]))
    out = subprocess.run([sys.executable, "-S", "-c", code, redis_server.url], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "ok"
