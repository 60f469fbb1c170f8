"""busbar/governance/resp.py, the pipelined client of the ledger's request path, against a real
redis-server (tests/redis_server.py) and against scripted fake servers: concurrent admissions
share one connection and stay exact; AUTH and SELECT from the URL; NOSCRIPT reloads the script;
a server that drops the connection in the middle of a reply, or never answers, fails the
commands in flight (the ledger: 503 "unavailable", down, the settles kept) and the next call
connects again."""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from busbar.governance.redis_store import UNAVAILABLE, RedisLedger, RedisStore
from busbar.governance.resp import RespClient
from cbusbar.resp import RespError

from .test_redis_store import CARD, check, raw_client, usage


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def prefix():
    return "r%s:" % uuid.uuid4().hex[:8]


def test_concurrent_admissions_pipeline_on_one_connection_and_stay_exact(redis_server):
    """40 admissions at once against a limit of 10: exactly 10 admitted, all on one connection
    (replies matched in order), and the settles that follow land."""
    async def go():
        p = prefix()
        led = RedisLedger(redis_server.url, prefix=p)
        st = RedisStore(redis_server.url, prefix=p)
        await led.start()
        await st.open()
        try:
            now = time.time()
            rate = check("g", "requests", 10, 1, "minute", now)
            conc = check("g", "concurrent", 1000, 1)
            conn = led._c.conn
            res = await asyncio.gather(*(led.admit([rate, conc], now, CARD) for _ in range(40)))
            assert sum(1 for r in res if r is None) == 10
            assert all(r.kind == "requests" for r in res if r is not None)
            assert led._c.conn is conn and conn._sent >= 42 and conn._got == conn._sent
            for r in res:
                if r is None:
                    led.settle([rate, conc], 0, usage(inp=3), True)
            await led.flush()
            assert await st.check_values([rate, conc], CARD) == [10, 0]
            [row] = await st.usage_rows()
            assert (row["requests"], row["input_tokens"]) == (10, 30)
        finally:
            await led.close()
            await st.close()
    run(go())


def test_noscript_reloads_and_select_and_auth_from_the_url(own_redis):
    async def go():
        r = await raw_client(own_redis.url)
        await r.config_set("requirepass", "s3cret")
        await r.aclose()
        base = "127.0.0.1:%d" % own_redis.port
        # a wrong password: the connection's setup is refused, as "down"
        bad = RespClient("redis://:nope@%s/0" % base, 0.5)
        with pytest.raises(ConnectionError, match="setup"):
            await bad.call(b"PING")
        bad.close()
        for url in ("redis://:s3cret@%s/3" % base, "redis://default:s3cret@%s?db=3" % base):
            p = prefix()
            led = RedisLedger(url, prefix=p)
            await led.start()
            try:
                now = time.time()
                rate = check("g", "requests", 2, 1, "minute", now)
                assert await led.admit([rate], now, CARD) is None
                await led._c.call(b"SCRIPT", b"FLUSH")        # the scripts are gone...
                assert await led.admit([rate], now, CARD) is None    # ...loaded again
                assert (await led.admit([rate], now, CARD)).kind == "requests"
                led.settle([rate], 0, usage(inp=1), True)
                await led.flush()
                key = "%susage:group:g@minute:%d" % (p, rate[4])
                c = RespClient("redis://:s3cret@%s/3" % base, 0.5)
                assert await c.call(b"HGET", key, b"requests") == b"2"
                assert await c.call(b"SELECT", 0) == b"OK"
                assert await c.call(b"EXISTS", key) == 0           # db 3, not 0
                with pytest.raises(RespError):
                    await c.call(b"NOSUCHCOMMAND")
                assert await c.call(b"PING") == b"PONG"              # still usable
                c.close()
            finally:
                await led.close()
    run(go())


class FakeRedis:
    """A loopback server that answers SCRIPT LOAD, and then does `then` to every other command:
    'half' sends the start of an admission reply and closes the connection, 'mute' says
    nothing."""

    def __init__(self, then):
        self.then = then
        self.conns = 0

    async def start(self):
        self.srv = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = "redis://127.0.0.1:%d/0" % self.srv.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader, writer):
        from cbusbar.resp import RespParser
        self.conns += 1
        p = RespParser()
        while True:
            data = await reader.read(65536)
            if not data:
                break
            for cmd in p.feed(data):
                if cmd[0].upper() == b"SCRIPT":
                    writer.write(b"$40\r\n" + b"0" * 40 + b"\r\n")
                elif cmd[0].upper() == b"PING":
                    writer.write(b"+PONG\r\n")
                elif self.then == "half":
                    writer.write(b"*2\r\n:0\r\n")       # an admission reply, cut short
                    await writer.drain()
                    writer.close()
                    return
            await writer.drain()
        writer.close()

    def close(self):
        self.srv.close()


@pytest.mark.parametrize("then", ["half", "mute"])
def test_a_server_that_drops_or_stalls_mid_reply_fails_closed(then):
    async def go():
        fake = await FakeRedis(then).start()
        led = RedisLedger(fake.url, fail_mode="closed", timeout=0.3)
        await led.start()
        try:
            assert led.up
            now = time.time()
            rate = check("g", "requests", 10, 1, "minute", now)
            t0 = time.monotonic()
            res = await asyncio.gather(*(led.admit([rate], now, CARD) for _ in range(5)))
            took = time.monotonic() - t0
            assert res == [UNAVAILABLE] * 5                 # every command in flight failed
            assert not led.up
            if then == "mute":
                assert 0.3 <= took < 0.6                    # one deadline: timeout .. 1.5x
            else:
                assert took < 0.3
            led.settle([rate], 0, usage(inp=1), True)      # kept while down
            assert led._pend
            await led.flush()
            assert await led.admit([rate], now, CARD) == UNAVAILABLE
        finally:
            await led.close(timeout=0.2)
            fake.close()
    run(go())


def test_client_connects_again_after_the_connection_is_lost(own_redis):
    async def go():
        c = RespClient(own_redis.url, 0.5)
        assert await c.call(b"PING") == b"PONG"
        first = c.conn
        own_redis.stop()
        with pytest.raises((ConnectionError, OSError)):
            await c.call(b"PING")
        own_redis.start()
        assert await c.call(b"PING") == b"PONG"
        assert c.conn is not first
        c.close()
    run(go())


class _Transport:
    def __init__(self):
        self.written = []
        self.aborted = False

    def write(self, data):
        self.written.append(data)

    def abort(self):
        self.aborted = True


def test_a_cancelled_commands_reply_reaches_its_orphan_callback_in_either_order():
    """The admission's refund hangs on this: a caller cancelled while its command is in flight
    registers a callback; the reply may come before or after it does."""
    from busbar.governance.resp import RespConnection
    from cbusbar.resp import encode_command

    async def go():
        loop = asyncio.get_running_loop()
        conn = RespConnection(loop, 5.0)
        t = _Transport()
        conn.connection_made(t)
        a = conn.send(encode_command([b"EVALSHA", b"x", 0]))
        b = conn.send(encode_command([b"PING"]))
        c = conn.send(encode_command([b"PING"]))
        await asyncio.sleep(0)
        assert t.written == [b"".join([encode_command([b"EVALSHA", b"x", 0]),
                                       encode_command([b"PING"]) * 2])]   # one write a turn
        got = []
        a.cancel()
        conn.orphaned(a, got.append)                # registered first, reply after
        b.cancel()
        conn.data_received(b"*2\r\n:0\r\n:5\r\n+PONG\r\n+PO")
        assert got == [[0, 5]]
        conn.orphaned(b, got.append)                # reply first, registered after
        assert got == [[0, 5], b"PONG"]
        assert not c.done()
        conn.data_received(b"NG\r\n")
        assert c.result() == b"PONG"
        # a reply nothing asked for: the connection is unusable, dropped
        conn.data_received(b"+OK\r\n")
        assert t.aborted and not conn.alive
        d = conn.send(encode_command([b"PING"]))
        with pytest.raises(ConnectionError):
            await d
    run(go())


def test_url_forms():
    from busbar.governance.resp import Endpoint
    e = Endpoint("redis://user:p%40ss@10.0.0.5:6390/4")
    assert (e.host, e.port, e.username, e.password, e.db, e.path, e.ssl) == (
        "10.0.0.5", 6390, "user", "p@ss", 4, None, None)
    assert e.handshake() == [[b"AUTH", "user", "p@ss"], [b"SELECT", 4]]
    e = Endpoint("redis://localhost?db=2&client_name=bb")
    assert (e.port, e.db, e.handshake()) == (6379, 2, [[b"SELECT", 2], [b"CLIENT", b"SETNAME", "bb"]])
    e = Endpoint("unix:///run/valkey.sock?db=1")
    assert (e.path, e.db) == ("/run/valkey.sock", 1)
    e = Endpoint("rediss://:pw@cache.example:6380/0?ssl_cert_reqs=none")
    assert e.ssl is not None and not e.ssl.check_hostname and e.server_hostname is None
    assert e.handshake() == [[b"AUTH", "pw"]]
    e = Endpoint("rediss://cache.example:6380/0")
    assert e.ssl.check_hostname and e.server_hostname == "cache.example"
    with pytest.raises(ValueError):
        Endpoint("http://nope")


def test_a_failed_connect_is_not_the_next_calls_answer(own_redis):
    """A connect that failed while its caller was gone does not answer a later call: that call
    connects again."""
    async def go():
        own_redis.stop()
        c = RespClient(own_redis.url, 0.5)
        t = asyncio.ensure_future(c.call(b"PING"))
        await asyncio.sleep(0)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        await asyncio.sleep(0.1)                    # the connect fails meanwhile (refused)
        own_redis.start()
        assert await c.call(b"PING") == b"PONG"
        c.close()
    run(go())


def _nowait(led, checks, now, card, reserve=0):
    """admit_nowait as a future (None when it declined: the caller takes admit())."""
    fut = asyncio.get_running_loop().create_future()
    if not led.admit_nowait(checks, now, card, reserve, 0, fut.set_result):
        return None
    return fut


def test_admit_nowait_answers_by_callback_exactly_and_through_a_redis_restart(own_redis):
    """The gate's task-free admission (gate._admit): exact under 40 at once, the script flushed
    (NOSCRIPT) or the rate card's hash deleted (as after a Redis restart) continue through
    admit() and still answer; a budget check before the card is written, and a ledger that is
    down, decline (the caller awaits admit())."""
    async def go():
        p = prefix()
        led = RedisLedger(own_redis.url, prefix=p)
        await led.start()
        try:
            now = time.time()
            rate = check("g", "requests", 10, 1, "minute", now)
            budget = check("g", "budget_usd", 10 ** 12, 0, "day", now)
            assert _nowait(led, [budget], now, CARD, 5) is None      # card not written yet
            assert await led.admit([budget], now, CARD, 5) is None   # ...admit() writes it
            res = await asyncio.gather(*(_nowait(led, [rate, budget], now, CARD, 5)
                                         for _ in range(8)))
            assert res == [None] * 8
            await led._c.call(b"SCRIPT", b"FLUSH")
            assert await _nowait(led, [rate], now, CARD) is None      # NOSCRIPT: loaded again
            await led._c.call(b"DEL", led._rate_card(CARD)[1])
            assert await _nowait(led, [rate, budget], now, CARD, 5) is None    # card again
            assert (await _nowait(led, [rate], now, CARD)).kind == "requests"  # the 11th
            led.up = False
            assert _nowait(led, [rate], now, CARD) is None            # down: declines
        finally:
            await led.close()
    run(go())
