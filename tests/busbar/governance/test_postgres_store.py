"""The Postgres store against a real PostgreSQL (tests/postgres_server.py), in the schema of the
Rust gateway's postgres store: the tables and columns are that store's; records and usage round
trip into its rows; admission is all-or-nothing, exact across many concurrent ledgers (each its
own connection pool, as separate workers and instances are), and a cancelled admission leaves no
charge; settlement floors at zero; a newer or a pre-1.5.0 schema is refused and nothing is
deleted; an unreachable database is "unavailable" and the ledger recovers with nothing lost."""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from busbar.governance.model import (
    GroupRecord, KeyRecord, Limit, Rate, Usage, day_of, rust_bucket, window, window_start)
from busbar.governance.postgres_store import (
    UNAVAILABLE, PostgresDirectory, PostgresLedger, PostgresStore, safe_url)
from busbar.governance.redis_store import StoreUnavailable
from busbar.governance.store import StoreError

CARD = {"m": Rate(1.0, 2.0)}        # nano-units per token: 1000 input, 2000 output

# The Rust store's tables and columns (store-postgres v6), in order.
RUST_COLUMNS = {
    "busbar_schema": ["version"],
    "store_revision": ["only_row", "revision"],
    "keys": ["id", "generation_hash", "name", "allowed_pools", "enabled", "created_at",
             "key_group", "labels", "expires_at", "deleted_at", "revision"],
    "credentials": ["id", "key_id", "kind", "slot", "public_id", "secret", "secret_form",
                    "created_at", "updated_at", "expires_at", "revoked_at", "revoke_reason",
                    "revision"],
    "usage_windows": ["bucket_id", "window_start", "requests", "billable_requests"],
    "usage_ledger": ["bucket_id", "window_start", "model", "tokens_input", "tokens_output",
                     "tokens_cache_read", "tokens_cache_write"],
    "usage_metering": ["key_id", "bucket", "model", "provider", "tokens_input", "tokens_output",
                       "tokens_cache_read", "tokens_cache_write", "requests", "billable_requests",
                       "key_group_at_use", "pricing_version"],
    "audit_log": ["seq", "ts", "action", "resource", "outcome", "principal", "prev_hash", "hash"],
    "denylist": ["sub", "reason", "created_at"],
}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.fixture
def db(postgres_server):
    return postgres_server.create_database("t_" + uuid.uuid4().hex[:10])


async def fetch(url, sql, *args):
    import asyncpg
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


def check(group, kind, limit, charge, per="minute", now=None, pool=None):
    """A check as the gate makes it for a remote store: the Rust ledger bucket, window start."""
    if kind == "concurrent":
        return (group, kind, limit, charge, 0, None, group, None)
    now = now if now is not None else time.time()
    _, roll = window(per, now)
    return (rust_bucket(group, per, pool), kind, limit, charge, window_start(per, now), roll, group,
            per)


def test_the_schema_is_the_rust_stores(db):
    async def go():
        st = PostgresStore(db)
        await st.open()
        try:
            await st.ping()
        finally:
            await st.close()
        rows = await fetch(db, "SELECT table_name, column_name FROM information_schema.columns "
                               "WHERE table_schema = 'public' ORDER BY table_name, ordinal_position")
        cols = {}
        for t, c in rows:
            cols.setdefault(t, []).append(c)
        for table, want in RUST_COLUMNS.items():
            assert cols.pop(table) == want, table
        # busbar's own, beside them
        assert sorted(cols) == ["busbar_concurrency", "busbar_groups", "busbar_inflight"]
        assert [tuple(r) for r in await fetch(db, "SELECT version FROM busbar_schema")] == [(6,)]
        cons = {r[0] for r in await fetch(db, "SELECT conname FROM pg_constraint")}
        assert {"keys_tombstone_disabled", "credentials_public_id_uniq", "credentials_slot_uniq",
                "credentials_secret_form_matches"} <= cons
    run(go())


def test_keys_groups_usage_round_trip_in_the_rust_rows(db):
    async def go():
        st = PostgresStore(db)
        await st.open()
        try:
            now = int(time.time())
            k = KeyRecord("vk_" + "1" * 32, "alice", "team-a", ["fast"], "active", now - 5,
                          None, "a" * 32, "AKIAAAAAAAAAAAAAAAAA", "s3cret", labels={"env": "dev"})
            await st.put_key(k)
            got = await st.get_key(k.id)
            assert (got.name, got.group, got.allowed_pools, got.gen, got.state, got.labels) == (
                "alice", "team-a", ["fast"], "a" * 32, "active", {"env": "dev"})
            assert (await st.key_by_aws("AKIAAAAAAAAAAAAAAAAA")).aws_secret == "s3cret"
            (row,) = await fetch(db, "SELECT generation_hash, allowed_pools, enabled, labels "
                                     "FROM keys WHERE id = $1", k.id)
            assert tuple(row) == ("binding:%s:%s" % (k.id, "a" * 32), '["fast"]', True,
                                  '{"env":"dev"}')
            (cred,) = await fetch(db, "SELECT kind, slot, public_id, secret, secret_form, "
                                      "revoked_at FROM credentials WHERE key_id = $1", k.id)
            assert tuple(cred) == ("sigv4", 0, "AKIAAAAAAAAAAAAAAAAA", "v1:plain:s3cret",
                                   "recoverable", None)
            k.state = "revoked"
            await st.put_key(k)
            assert (await st.get_key(k.id)).state == "revoked"
            assert await st.key_by_aws("AKIAAAAAAAAAAAAAAAAA") is None
            assert [tuple(r) for r in await fetch(db, "SELECT sub, reason FROM denylist")] == [
                (k.id, "revoked")]
            await st.delete_key(k.id)
            gone = await st.get_key(k.id)
            assert gone.state == "tombstoned" and gone.deleted
            assert await fetch(db, "SELECT 1 FROM credentials") == []
            (row,) = await fetch(db, "SELECT enabled, deleted_at IS NOT NULL FROM keys")
            assert tuple(row) == (False, True)
            k.state = "active"
            with pytest.raises(StoreError, match="tombstoned"):
                await st.put_key(k)
            with pytest.raises(StoreError, match="no key"):
                await st.delete_key("vk_none")
            g = GroupRecord("api-team", "org", True, [Limit("requests", 2, "minute")])
            await st.put_group(g)
            assert [x.name for x in await st.list_groups()] == ["api-team"]
            assert (await st.get_group("api-team")).limits[0].amount == 2
            await st.delete_group("api-team")
            assert await st.get_group("api-team") is None
            d1 = day_of(now)
            await st.add_usage([Usage(d1, k.id, "team-a", "m1", "fast", 2, 150, 30, 5, 7, 1,
                                      "openai")],
                               {(k.id, 0): [2, 1, {"m1": [150, 30, 5, 7]}]})
            assert await st.usage_rows(d1) == [{
                "day": d1, "key_id": k.id, "group": "team-a", "model": "m1",
                "provider": "openai", "requests": 2, "input_tokens": 150, "output_tokens": 30,
                "cache_read_tokens": 5, "cache_write_tokens": 7, "billable_requests": 1}]
            assert await st.usage_rows("2025-12-31") == []
            assert await st.window(k.id, 0) == (2, 1, {"m1": [150, 30, 5, 7]}, 0)
            assert (await st.usage_totals())[0]["input_tokens"] == 150
        finally:
            await st.close()
    run(go())


def test_admission_is_all_or_nothing_and_settles(db):
    async def go():
        st, led = PostgresStore(db), PostgresLedger(db)
        await st.open()
        await led.start()
        try:
            now = time.time()
            rate = check("g", "requests", 3, 1, "minute", now)
            tok = check("g", "tokens", 100, 0, "hour", now)
            budget = check("g", "budget_usd", 250_000, 100_000, "day", now)
            conc = check("g", "concurrent", 2, 1)
            checks = [rate, tok, budget, conc]
            assert await led.admit(checks, now, CARD, 100_000) is None
            assert await led.admit(checks, now, CARD, 100_000) is None
            assert await st.check_values(checks, CARD) == [2, 0, 200_000, 2]
            # the third: the budget (2 x 100000 reserved + 100000 > 250000) refuses, so nothing
            # of it is charged, not even the requests and the concurrency checked before it
            why = await led.admit(checks, now, CARD, 100_000)
            assert (why.kind, why.group) == ("budget_usd", "g")
            assert await st.check_values(checks, CARD) == [2, 0, 200_000, 2]
            u = Usage(day_of(now), "vk_x", "g", "m", "p", 1, 30, 20, 5, 5, provider="prov")
            led.settle(checks, 100_000, u, True)
            led.settle(checks, 100_000, u, False)       # a non-2xx: off the billable count
            await led.flush()
            # tokens: all four tiers (60 x 2); spend 2 x (30 x 1000 + 20 x 2000)
            assert await st.check_values(checks, CARD) == [2, 120, 140_000, 0]
            head = await fetch(db, "SELECT requests, billable_requests FROM usage_windows WHERE "
                                   "bucket_id = $1 AND window_start = $2", rate[0], rate[4])
            assert tuple(head[0]) == (2, 1)
            # the tokens limit is post-paid: 120 >= 100 refuses the next one
            why = await led.admit(checks, now, CARD, 100_000)
            assert (why.kind, why.per) == ("tokens", "hour")
            # the key's own bucket and the metering
            assert await st.window("vk_x", 0) == (2, 1, {"m": [60, 40, 10, 10]}, 0)
            (m,) = await st.usage_rows(day_of(now))
            assert (m["requests"], m["billable_requests"], m["group"], m["provider"]) == (
                2, 1, "g", "prov")
            # an undo more than was charged floors at 0
            for _ in range(3):
                led.undo([rate, conc], 0)
            await led.flush()
            assert (await st.check_values([rate, conc]))[:2] == [0, 0]
        finally:
            await led.close()
            await st.close()
    run(go())


def test_exact_across_many_concurrent_ledgers(db):
    """Eight ledgers, each its own pool (as 2 instances x 4 workers), 200 concurrent admissions
    against 25 requests and a budget of 10 reservations: exactly 25, and never past the budget."""
    async def go():
        st = PostgresStore(db)
        await st.open()
        leds = [PostgresLedger(db, pool_size=4) for _ in range(8)]
        for led in leds:
            await led.start()
        try:
            now = time.time()
            rate = check("fleet", "requests", 25, 1, "minute", now)
            out = await asyncio.gather(*[leds[i % 8].admit([rate], now) for i in range(200)])
            assert sum(r is None for r in out) == 25
            assert (await st.check_values([rate]))[0] == 25
            budget = check("cash", "budget_usd", 1_000_000, 100_000, "day", now)
            out = await asyncio.gather(*[leds[i % 8].admit([budget], now, CARD, 100_000)
                                         for i in range(100)])
            assert sum(r is None for r in out) == 10
            assert await st.check_values([budget], CARD) == [1_000_000]
        finally:
            for led in leds:
                await led.close()
            await st.close()
    run(go())


def test_admissions_of_one_turn_go_in_one_statement_each_all_or_nothing(db):
    """Sixty admissions asked for in one event-loop turn on one ledger, over two groups whose
    buckets interleave in the lock order: they go in a few statements (batches), each request is
    admitted all or nothing in the order asked, and the counts are exact: a request refused by
    its concurrent limit leaves its requests count and its reservation uncharged."""
    async def go():
        st, led = PostgresStore(db), PostgresLedger(db, pool_size=2)
        await st.open()
        await led.start()
        sent = []
        run_sql = led._run

        async def counting(sql, *args):
            sent.append(sql)
            return await run_sql(sql, *args)
        led._run = counting
        try:
            now = time.time()
            a = [check("a", "requests", 10, 1, "minute", now),
                 check("a", "budget_usd", 1_000_000, 50_000, "day", now)]
            b = [check("b", "requests", 1000, 1, "minute", now),
                 check("b", "budget_usd", 10 ** 12, 50_000, "day", now),
                 check("b", "concurrent", 3, 1)]
            out = await asyncio.gather(*[led.admit(a if i % 2 else b, now, CARD, 50_000)
                                         for i in range(60)])
            assert len(sent) < 10, len(sent)
            assert any("busbar_admit_batch_v2" in q for q in sent)
            got_a = [r for i, r in enumerate(out) if i % 2]
            got_b = [r for i, r in enumerate(out) if not i % 2]
            # first come, first admitted: the order asked is the order admitted
            assert got_a[:10] == [None] * 10
            assert {(r.kind, r.group) for r in got_a[10:]} == {("requests", "a")}
            assert got_b[:3] == [None] * 3
            assert {(r.kind, r.group) for r in got_b[3:]} == {("concurrent", "b")}
            assert await st.check_values(a, CARD) == [10, 500_000]
            assert await st.check_values(b, CARD) == [3, 150_000, 3]
        finally:
            await led.close()
            await st.close()
    run(go())


def test_a_batch_reads_the_ledgers_tokens_and_spend(db):
    """A batch decides on what the ledger holds: a tokens limit already reached refuses every
    request of its group; a budget is the tokens spent at the card plus the reservations, those
    of the batch's earlier requests included (4 of 8 fit), and none of either is charged more."""
    async def go():
        st, led = PostgresStore(db), PostgresLedger(db, pool_size=2)
        await st.open()
        await led.start()
        try:
            now = time.time()
            tok = [check("t", "tokens", 100, 0, "hour", now)]
            cash = [check("s", "budget_usd", 1_000_000, 200_000, "day", now)]
            led.settle(tok, 0, Usage(day_of(now), "vk_t", "t", "m", None, 1, 100, 50,
                                     provider="p"), True)
            led.settle(cash, 0, Usage(day_of(now), "vk_s", "s", "m", None, 1, 100, 0,
                                      provider="p"), True)
            await led.flush()
            assert await st.check_values(cash, CARD) == [100_000]
            out = await asyncio.gather(*[led.admit(tok if i % 2 else cash, now, CARD, 200_000)
                                         for i in range(16)])
            assert {(r.kind, r.group) for r in out[1::2]} == {("tokens", "t")}
            assert out[0:8:2] == [None] * 4
            assert {(r.kind, r.group) for r in out[8::2]} == {("budget_usd", "s")}
            assert await st.check_values(cash, CARD) == [900_000]
            assert await st.check_values(tok, CARD) == [150]
        finally:
            await led.close()
            await st.close()
    run(go())


def test_a_connection_killed_mid_batch_fails_closed_and_counts_once(db):
    """A batch of admissions whose connection dies while it waits in the database (its ledger row
    held by another transaction): every request of it is answered unavailable (503, fail
    closed), nothing of it is charged (its transaction never committed), the ledger recovers,
    and the next admission counts once."""
    async def go():
        import asyncpg
        st, led = PostgresStore(db), PostgresLedger(db, pool_size=2)
        await st.open()
        await led.start()
        blocker = await asyncpg.connect(db)
        try:
            now = time.time()
            rate = check("k", "requests", 100, 1, "minute", now)
            assert await led.admit([rate], now) is None
            tx = blocker.transaction()
            await tx.start()
            await blocker.execute("SELECT 1 FROM usage_windows WHERE bucket_id = $1 AND "
                                  "window_start = $2 FOR UPDATE", rate[0], rate[4])
            calls = [asyncio.ensure_future(led.admit([rate], now)) for _ in range(8)]
            pid = None
            for _ in range(200):
                await asyncio.sleep(0.02)
                pid = await blocker.fetchval(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
                    "query LIKE '%busbar_admit_batch_v2%'")
                if pid is not None:
                    break
            assert pid is not None, "the batch never waited on the row"
            assert await blocker.fetchval("SELECT pg_terminate_backend($1)", pid)
            out = await asyncio.gather(*calls)
            assert out == [UNAVAILABLE] * 8
            await tx.rollback()
            assert (await st.check_values([rate]))[0] == 1
            for _ in range(100):
                if led.up:
                    break
                await asyncio.sleep(0.05)
            assert led.up
            assert await led.admit([rate], now) is None
            assert (await st.check_values([rate]))[0] == 2
        finally:
            await blocker.close()
            await led.close()
            await st.close()
    run(go())


def test_a_cancelled_admission_leaves_no_charge(db):
    async def go():
        st, led = PostgresStore(db), PostgresLedger(db)
        await st.open()
        await led.start()
        try:
            now = time.time()
            rate = check("c", "requests", 5, 1, "minute", now)
            t = asyncio.ensure_future(led.admit([rate], now))
            await asyncio.sleep(0)
            t.cancel()
            with pytest.raises(asyncio.CancelledError):
                await t
            for _ in range(50):
                await asyncio.sleep(0.02)
                await led.flush()
                if (await st.check_values([rate]))[0] == 0:
                    break
            assert (await st.check_values([rate]))[0] == 0
        finally:
            await led.close()
            await st.close()
    run(go())


def test_cancelled_admissions_in_a_batch_leave_no_charge(db):
    """Ten admissions in one batch, four of them cancelled while it is in the database (their
    clients left): the six others are admitted, and what the batch charged for the four is given
    back (requests, reservation, concurrency slot), so only the six remain."""
    async def go():
        st, led = PostgresStore(db), PostgresLedger(db, pool_size=2)
        await st.open()
        await led.start()
        try:
            now = time.time()
            checks = [check("cb", "requests", 100, 1, "minute", now),
                      check("cb", "budget_usd", 10 ** 12, 1000, "day", now),
                      check("cb", "concurrent", 100, 1)]
            calls = [asyncio.ensure_future(led.admit(checks, now, CARD, 1000)) for _ in range(10)]
            await asyncio.sleep(0)      # queued, the batch sent at the next loop turn
            await asyncio.sleep(0)
            for t in calls[:4]:
                t.cancel()
            out = await asyncio.gather(*calls[4:])
            assert out == [None] * 6
            for t in calls[:4]:
                with pytest.raises(asyncio.CancelledError):
                    await t
            for _ in range(100):
                await led.flush()
                if await st.check_values(checks, CARD) == [6, 6000, 6]:
                    break
                await asyncio.sleep(0.02)
            assert await st.check_values(checks, CARD) == [6, 6000, 6]
        finally:
            await led.close()
            await st.close()
    run(go())


def test_the_ledgers_connections_serve_one_statement_each_in_turn(db):
    """The ledger's own connection set (_Conns): twelve statements over two connections, never
    more opened, each answered its own value; a waiter cancelled while waiting, or a statement
    that fails (its connection thrown away), leaks no slot: the set still serves, with two."""
    from busbar.governance.postgres_store import _Conns

    async def go():
        conns = _Conns(db, 5.0, 2)
        try:
            most = 0

            async def one(i):
                nonlocal most
                v = await conns.run("SELECT $1::int FROM pg_sleep(0.01)", (i,))
                most = max(most, conns.n)
                return v
            assert await asyncio.gather(*[one(i) for i in range(12)]) == list(range(12))
            assert most == 2 and conns.n == 2 and len(conns.idle) == 2
            busy = [asyncio.ensure_future(conns.run("SELECT 1 FROM pg_sleep(0.2)", ()))
                    for _ in range(2)]
            await asyncio.sleep(0.05)
            waiter = asyncio.ensure_future(conns.run("SELECT 2", ()))
            await asyncio.sleep(0.01)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            assert await asyncio.gather(*busy) == [1, 1]
            with pytest.raises(Exception, match="division by zero"):
                await conns.run("SELECT 1 / 0", ())
            assert conns.n == 1
            assert await asyncio.gather(*[one(i) for i in range(6)]) == list(range(6))
            assert conns.n == 2
            # an idle connection the server closed (idle_session_timeout, a proxy, a restart) is
            # not used: the next statement gets another
            import asyncpg
            pids = {await conns.run("SELECT pg_backend_pid()", ()) for _ in range(2)}
            admin = await asyncpg.connect(db)
            try:
                for pid in pids:
                    await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
            finally:
                await admin.close()
            await asyncio.sleep(0.2)
            assert await conns.run("SELECT 7", ()) == 7
            # and one idle past IDLE_SECS is closed rather than trusted
            from busbar.governance import postgres_store
            old = conns.idle[-1][0]
            saved, postgres_store.IDLE_SECS = postgres_store.IDLE_SECS, 0.0
            try:
                await asyncio.sleep(0.01)
                assert await conns.run("SELECT 8", ()) == 8
            finally:
                postgres_store.IDLE_SECS = saved
            assert old.is_closed() and conns.n <= 2
        finally:
            await conns.close(2.0)
        assert conns.n == 0
    run(go())


def test_another_schema_is_refused_and_nothing_deleted(postgres_server):
    async def go(url, setup, match):
        import asyncpg
        conn = await asyncpg.connect(url)
        await conn.execute(setup)
        await conn.close()
        st = PostgresStore(url)
        await st.open()
        try:
            with pytest.raises(StoreError, match=match):
                await st.list_keys()
        finally:
            await st.close()
    newer = postgres_server.create_database("newer_" + uuid.uuid4().hex[:8])
    run(go(newer, "CREATE TABLE busbar_schema (version BIGINT PRIMARY KEY); "
                  "INSERT INTO busbar_schema VALUES (7)", "schema v7, written by a newer"))
    old = postgres_server.create_database("old_" + uuid.uuid4().hex[:8])
    run(go(old, "CREATE TABLE virtual_keys (id TEXT PRIMARY KEY); "
                "INSERT INTO virtual_keys VALUES ('vk_old')", "before 1.5.0"))
    assert [tuple(r) for r in run(fetch(old, "SELECT id FROM virtual_keys"))] == [("vk_old",)]


def test_directory_invalidation_and_the_rust_rows(db):
    """Rows written as the Rust store writes them are read; a change made through the store
    reaches a worker's cache within a second (NOTIFY)."""
    async def go():
        import asyncpg
        st, d = PostgresStore(db), PostgresDirectory(db)
        await st.open()
        await st.ping()                   # the schema
        conn = await asyncpg.connect(db)
        now = int(time.time())
        await conn.execute("INSERT INTO keys (id, generation_hash, name, enabled, created_at, "
                           "key_group) VALUES ('vk_r', 'binding:vk_r:' || $1, 'rust', TRUE, $2, "
                           "'team')", "b" * 32, now)
        await conn.execute("INSERT INTO credentials (id, key_id, kind, slot, public_id, secret, "
                           "secret_form, created_at, updated_at) VALUES ('cred_r', 'vk_r', "
                           "'sigv4', 0, 'AKIARUSTRUSTRUST0000', 'v1:plain:rust-secret', "
                           "'recoverable', $1, $1)", now)
        await conn.close()
        await d.start()
        try:
            assert d.live
            rec = await d.key("vk_r")
            assert (rec.name, rec.group, rec.gen, rec.state) == ("rust", "team", "b" * 32, "active")
            assert (await d.key_by_aws("AKIARUSTRUSTRUST0000")).aws_secret == "rust-secret"
            assert d.cached_key("vk_r") is rec
            rec2 = KeyRecord.from_dict(rec.to_dict())
            rec2.state = "revoked"
            await st.put_key(rec2)
            deadline = time.monotonic() + 1.0
            while d.cached_key("vk_r") is rec:
                assert time.monotonic() < deadline, "no invalidation within 1 s"
                await asyncio.sleep(0.02)
            assert (await d.key("vk_r")).state == "revoked"
            assert await d.key("vk_missing") is None
        finally:
            await d.close()
            await st.close()
    run(go())


def test_unreachable_is_unavailable_then_recovers(postgres_server, caplog):
    """The server stopped mid-run: admission is "unavailable", the admin store raises
    StoreUnavailable (the URL without its password); settles made meanwhile are written when it is
    back."""
    url = postgres_server.create_database("down_" + uuid.uuid4().hex[:8])

    async def go():
        st, led = PostgresStore(url), PostgresLedger(url)
        await st.open()
        await led.start()
        try:
            now = time.time()
            rate = check("d", "requests", 10, 1, "hour", now)
            assert await led.admit([rate], now) is None
            await asyncio.to_thread(postgres_server.stop)
            led.settle([rate], 0, Usage(day_of(now), "vk_d", "d", "m", None, 1, 5, 5,
                                        provider="p"), True)
            assert await led.admit([rate], now) == UNAVAILABLE
            with pytest.raises(StoreUnavailable, match="postgres at postgres://busbar@"):
                await st.list_keys()
            await asyncio.to_thread(postgres_server.start)
            deadline = time.monotonic() + 10
            while await led.admit([rate], now) == UNAVAILABLE:
                assert time.monotonic() < deadline, "admission did not come back"
                await asyncio.sleep(0.1)
            await led.flush()
            assert await st.window("vk_d", 0) == (1, 1, {"m": [5, 5, 0, 0]}, 0)
            assert (await st.check_values([rate]))[0] == 2
        finally:
            await led.close()
            await st.close()
    run(go())
    assert "store_unreachable store=postgres" in caplog.text


def test_safe_url_hides_the_password():
    assert safe_url("postgres://u:p%40ss@h:5432/db?sslmode=disable&password=x") == \
        "postgres://u@h:5432/db"
