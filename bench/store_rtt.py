"""One store round trip on this machine, the yardstick of issue #41's fleet target (busbar;dur p50 with
keys on Valkey or Postgres ≤ keys-on-SQLite's + one store round trip).

A loopback redis-server and PostgreSQL (the tests' helpers, tests/redis_server.py and
tests/postgres_server.py), each on the load core as in bench/run.py; the client on the gateway
core, one request at a time on one connection, on uvloop:

- `raw socket PING`: a RESP `PING` over an asyncio stream, no client library: what the kernel and
  the server cost, the least any client can pay;
- `redis-py PING`, `redis-py EVALSHA`: busbar's Redis client (redis.asyncio) sending a PING, and a
  one-line Lua script (`return 1`) by its SHA as the ledger's admission does;
- `asyncpg SELECT 1`: busbar's Postgres client, a prepared statement (asyncpg caches it).

    .venv/bin/python bench/store_rtt.py [--n 5000] [--only redis|postgres]

Prints µs per round trip, p50 and p99 (wall time), and the client process's CPU µs per round trip.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
sys.path.insert(0, ROOT)

GATEWAY_CORE, LOAD_CORE = 0, 1


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


async def timed(name, fn, n, warm=200):
    for _ in range(warm):
        await fn()
    lat = []
    c0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        lat.append(time.perf_counter() - t0)
    cpu = (time.process_time() - c0) / n
    print("%-22s p50 %7.1f µs   p99 %7.1f µs   client CPU %6.1f µs" % (
        name, 1e6 * pct(lat, 0.5), 1e6 * pct(lat, 0.99), 1e6 * cpu), flush=True)


async def redis_rows(port, n):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def raw():
        writer.write(b"*1\r\n$4\r\nPING\r\n")
        await reader.readuntil(b"\r\n")
    await timed("raw socket PING", raw, n)
    writer.close()
    import redis.asyncio as aioredis
    r = aioredis.Redis(host="127.0.0.1", port=port)
    sha = await r.script_load("return 1")
    await timed("redis-py PING", r.ping, n)
    await timed("redis-py EVALSHA", lambda: r.evalsha(sha, 0), n)
    await r.aclose()


async def postgres_rows(url, n):
    import asyncpg
    c = await asyncpg.connect(url)
    await timed("asyncpg SELECT 1", lambda: c.fetchval("SELECT 1"), n)
    await c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--only", choices=("redis", "postgres"))
    a = ap.parse_args()
    import uvloop
    from tests.postgres_server import PostgresServer
    from tests.redis_server import RedisServer
    cores = sorted(os.sched_getaffinity(0))
    two = len(cores) > 1 and {GATEWAY_CORE, LOAD_CORE} <= set(cores)
    if two:
        os.sched_setaffinity(0, {LOAD_CORE})     # the servers inherit the load core
    print("client on core %s, servers on core %s" % ((GATEWAY_CORE, LOAD_CORE) if two else
                                                     ("any", "any")))
    if a.only != "postgres":
        with RedisServer() as srv:
            if two:
                os.sched_setaffinity(0, {GATEWAY_CORE})
            uvloop.run(redis_rows(srv.port, a.n))
            if two:
                os.sched_setaffinity(0, {LOAD_CORE})
    if a.only != "redis":
        with PostgresServer() as srv:
            url = srv.create_database("rtt")
            if two:
                os.sched_setaffinity(0, {GATEWAY_CORE})
            uvloop.run(postgres_rows(url, a.n))


if __name__ == "__main__":
    main()
