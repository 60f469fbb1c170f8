"""What governance costs a request on the Postgres store (busbar/governance/postgres_store.py),
in-process against a real PostgreSQL on loopback (a throwaway cluster, tests/postgres_server.py,
fsync off; or --url): one admission (`SELECT busbar_admit_v2(...)`, one round trip; the
admissions of one event-loop turn go together in `busbar_admit_batch_v2`) and one settlement
(`SELECT busbar_settle_v2(...)`, batched likewise), the two statements every governed request adds.

- `admit`: one admission of a typical group chain (requests per minute, a budget per month: two
  ledger rows locked, the budget priced from the ledger), awaited one after another;
- `settle`: one request's settlement written alone (a batch of one: the worst case);
- `admit+settle`: both, one request after another (the sequential cost per request);
- `concurrent`: --tasks requests in flight over --ledgers ledgers (workers), each admitting and
  settling in a loop on one group's rows (the contended case: every admission of the fleet locks
  the same ledger row), admissions and settles batched as the gateway batches them: requests per
  second, and how many admissions and settles went in one statement on average.

Usage:
  python bench/postgres.py                   µs per statement (median, p99) and the throughput
  python bench/postgres.py --n 5000 --tasks 64 --ledgers 4
  python bench/postgres.py --url postgres://user@host/db
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from busbar.governance.model import Rate, Usage, day_of, rust_bucket, window, window_start  # noqa: E402
from busbar.governance.postgres_store import PostgresLedger, PostgresStore  # noqa: E402

CARD = {"m": Rate(3.0, 15.0)}


def checks(group, now):
    out = []
    for kind, limit, per in (("requests", 10 ** 9, "minute"), ("budget_usd", 10 ** 15, "month")):
        _, roll = window(per, now)
        out.append((rust_bucket(group, per, None), kind, limit, 1, window_start(per, now), roll,
                    group, per))
    return out


def counting(run, sent):
    """The ledger's statement runner, counting admission and settlement statements."""
    async def counted(sql, *args):
        sent["settle" if "settle" in sql else "admit"] += 1
        return await run(sql, *args)
    return counted


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))]


async def bench(url, n, tasks, ledgers):
    st = PostgresStore(url)
    await st.open()
    await st.ping()
    led = PostgresLedger(url)
    await led.start()
    now = time.time()
    cs = checks("bench", now)
    usage = Usage(day_of(now), "vk_bench", "bench", "m", None, 1, 100, 50, provider="p")
    for _ in range(200):                 # warm: connections, prepared statements, plans
        assert await led.admit(cs, now, CARD, 5000) is None
        led.settle(cs, 5000, usage, True)
        await led.flush()
    res = {"admit": [], "settle": [], "admit+settle": []}
    for _ in range(n):
        t0 = time.perf_counter()
        assert await led.admit(cs, now, CARD, 5000) is None
        t1 = time.perf_counter()
        led.settle(cs, 5000, usage, True)
        await led.flush()
        t2 = time.perf_counter()
        res["admit"].append(t1 - t0)
        res["settle"].append(t2 - t1)
        res["admit+settle"].append(t2 - t0)
    await led.close()
    for name, xs in res.items():
        print("%-14s median %7.1f us   p99 %7.1f us" % (name, 1e6 * statistics.median(xs),
                                                        1e6 * pct(xs, 0.99)))
    leds = [PostgresLedger(url) for _ in range(ledgers)]
    sent = {"admit": 0, "settle": 0}
    for x in leds:
        await x.start()
        x._run = counting(x._run, sent)
    done = 0
    stop_at = time.perf_counter() + 5.0

    async def loop(x):
        nonlocal done
        while time.perf_counter() < stop_at:
            r = await x.admit(cs, now, CARD, 5000)
            assert r is None, r
            x.settle(cs, 5000, usage, True)
            done += 1
    t0 = time.perf_counter()
    await asyncio.gather(*[loop(leds[i % ledgers]) for i in range(tasks)])
    for x in leds:
        await x.flush()
    secs = time.perf_counter() - t0
    print("%-14s %d in flight over %d ledgers: %.0f requests/s admitted and settled; "
          "%.1f admissions and %.1f settles a statement"
          % ("concurrent", tasks, ledgers, done / secs, done / max(1, sent["admit"]),
             done / max(1, sent["settle"])))
    for x in leds:
        await x.close()
    await st.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--ledgers", type=int, default=2)
    a = ap.parse_args()
    if a.url:
        asyncio.run(bench(a.url, a.n, a.tasks, a.ledgers))
        return
    from tests.postgres_server import PostgresServer
    with PostgresServer() as srv:
        url = srv.create_database("bench_" + uuid.uuid4().hex[:8])
        asyncio.run(bench(url, a.n, a.tasks, a.ledgers))


if __name__ == "__main__":
    main()
