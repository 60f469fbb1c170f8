"""Governance across the processes of one gateway (issue 10).

Local stores (memory, SQLite) have one owner, the parent (worker 0, which also serves the admin
API): before the workers fork it opens the store, loads keys and groups (inherited by every worker)
and makes the shared-memory limit table (cbusbar/ledger.pyx) with the counts carried over from the
stored ledger (`seed`: the Rust gateway's per-bucket windows, so a file either gateway wrote starts
busbar's limits where they were). Afterwards:
- a key or group change made through the admin API is written to the store, then pushed to every
  worker over its control channel (busbar/admin/plane.py) and acknowledged before the call answers,
  so PATCH and revoke hold everywhere at once;
- every worker sums its usage rows and sends them to the parent every `store.flush_interval_ms`
  over a usage channel of its own (a socketpair made before the fork, 4-byte length + pickle, as
  the control channel), and the parent adds each batch to the store in one transaction: the rows
  to the per-day metering (with each lane's provider) and what they add to each bucket's window
  (model.window_deltas, the buckets of the key's group chain).

Redis: nothing is shared in the process; each worker connects after the fork (busbar/governance/
redis_store.py): its own policy cache with pub/sub invalidation, admission and settlement scripts.
Postgres the same way (busbar/governance/postgres_store.py): LISTEN/NOTIFY invalidation, admission
and settlement one statement each.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import time

from busbar.server.channel import frame, recv_msg

from .model import (bucket_key, ledger_buckets, limit_value, rust_bucket, spend_nano, usd, window,
                    window_deltas, window_start)

log = logging.getLogger("busbar.governance")
# How often the parent recomputes the governance series of /metrics from the stored usage.
SPEND_REFRESH_SECS = 5.0


class GovBoot:
    def __init__(self, config, workers: int):
        gov = config.governance
        self.gov = gov
        self.kind = gov.store.kind
        self.local = self.kind not in ("redis", "postgres")
        self.store = None
        self.table = None
        self.keys = []
        self.groups = []
        self.pairs = []             # (parent end, child end) per forked worker
        self.parent_ends = []
        self.child_end = None
        self.is_child = False
        self.readers = []
        self.ready = None           # an asyncio.Event, set once the store is open (start)
        self.spender = None         # the parent's spend refresh task (start)
        self.gw = None              # the process's gateway (install): its snapshot's config
        self.config = config        # the boot config (its overlay's groups: start)
        if self.local:
            from cbusbar.ledger import LimitTable

            from .config import DEFAULT_BUCKETS
            from .store import open_store
            models = config.models
            self.store = store = open_store(gov.store, gov.groups, lambda m: _provider(models, m))
            store.open_sync()
            from .overlay_groups import to_import
            puts, gone = to_import(config, dict(store.groups), False, log.warning)
            for g in puts:
                store.put_group_sync(g)
            for n in gone:
                store.delete_group_sync(n)
            if puts or gone:
                log.info("governance: %d group(s) imported from the config overlay, %d removed by "
                         "its tombstones", len(puts), len(gone))
            self.keys = list(store.keys.values())
            self.groups = list(store.groups.values())
            self.table = LimitTable(DEFAULT_BUCKETS)
            seed(self.table, gov, {g.name: g for g in self.groups}, store, time.time())

    # ------------------------------------------------------------------ fork
    def preload(self):
        """Imports, before the fork, what `install` and `start` import (see
        busbar/supervisor.py `_import_serving`: an import after the fork copies shared pages)."""
        from . import admin, gate  # noqa: F401
        if not self.local:
            from . import redis_store  # noqa: F401
            if self.kind == "postgres":
                from . import postgres_store  # noqa: F401

    def channel(self):
        if not self.local:
            return None
        pair = socket.socketpair()
        self.pairs.append(pair)
        return pair

    def forked(self, pair):
        if pair is not None:
            pair[1].close()
            pair[0].setblocking(False)
            self.parent_ends.append(pair[0])

    def child(self, pair):
        self.is_child = True
        if pair is not None:
            for p, c in self.pairs:
                if p is not pair[0]:
                    p.close()
                    if c is not pair[1]:
                        c.close()
            pair[0].close()
            self.child_end = pair[1]
        for s in self.parent_ends:
            s.close()
        self.parent_ends = []
        if self.table is not None:
            self.table.forked()
        self.store = None           # the parent's

    # ------------------------------------------------------------------ per process
    def install(self, gw):
        from .gate import Gate, LocalDirectory, LocalLedger, UsageBatcher
        self.gw = gw
        loop = gw.loop
        flush = self.gov.store.flush_secs
        if self.local:
            directory = LocalDirectory(self.keys, self.groups)
            ledger = LocalLedger(self.table)
            if self.is_child:
                sock = self.child_end
                sink = lambda rows: _send_blocking(sock, rows)      # noqa: E731
            else:
                sink = lambda rows: loop.create_task(self.add_usage(rows))  # noqa: E731
            batcher = UsageBatcher(loop, flush, sink)
        elif self.kind == "postgres":
            from .postgres_store import DEFAULT_POOL_SIZE, PostgresDirectory, PostgresLedger
            sc = self.gov.store
            directory = PostgresDirectory(sc.url, sc.socket_timeout_secs)
            ledger = PostgresLedger(sc.url, sc.socket_timeout_secs, sc.pool_size or DEFAULT_POOL_SIZE)
            batcher = None
        else:
            from .redis_store import RedisDirectory, RedisLedger
            sc = self.gov.store
            directory = RedisDirectory(sc.url)
            ledger = RedisLedger(sc.url, sc.fail_mode)
            batcher = None
        gw.gate = Gate(loop, directory, ledger, batcher)
        gw.gov_boot = self

    async def start(self, gw):
        gate = gw.gate
        self.ready = asyncio.Event()
        # Governance's admin routes are the admin site's (busbar/admin/site.py mounts them whether
        # or not governance is on); a call waits for the store to open (busbar/governance/admin.py).
        if not self.local:
            await gate.directory.start()
            await gate.ledger.start()
        if self.is_child:
            return
        if not self.local:
            from .store import open_store
            self.store = open_store(self.gov.store)
            await self.store.open()
            await self._import_overlay_groups()
        self.ready.set()
        for s in self.parent_ends:
            self.readers.append(gw.loop.create_task(self._read_usage(gw.loop, s)))
        self.spender = gw.loop.create_task(self._spend_loop(gw))

    async def _import_overlay_groups(self):
        """A shared store's boot import of the overlay's groups (busbar/governance/
        overlay_groups.py): the ones the store lacks; the store's own are the fleet's truth."""
        from .overlay_groups import to_import
        config, self.config = self.config, None
        try:
            stored = {g.name: g for g in await self.store.list_groups()}
            puts, _ = to_import(config, stored, True, log.warning)
            for g in puts:
                await self.store.put_group(g)
        except Exception as exc:
            log.warning("governance: the config overlay's groups were not imported into the "
                        "store: %s", exc)
            return
        if puts:
            log.info("governance: %d group(s) imported from the config overlay", len(puts))

    async def _spend_loop(self, gw):
        """The governance gauges of /metrics: every SPEND_REFRESH_SECS, the figures of every key
        and enforcement bucket (busbar/governance/figures.py) from the stored usage and the
        current rate card, into gw.gov_figures (a scrape shows the last ones)."""
        from .figures import compute
        while True:
            try:
                gov = gw.snapshot.governance
                if gov is not None:
                    groups = {g.name: g for g in await self.store.list_groups()}
                    groups.update(gov.groups)
                    gw.gov_figures = await compute(gov, self.store, await self.store.list_keys(),
                                                   groups)
            except Exception:
                log.debug("governance: the /metrics figures were not refreshed", exc_info=True)
            await asyncio.sleep(SPEND_REFRESH_SECS)

    async def _read_usage(self, loop, sock):
        while True:
            try:
                rows = await recv_msg(loop, sock)
            except (EOFError, OSError):
                return
            except Exception:
                log.exception("governance: a usage batch could not be read")
                return
            await self.add_usage(rows)

    async def close(self, gw):
        if self.spender is not None:
            self.spender.cancel()
        gate = gw.gate
        if gate is not None and gate.batcher is not None:
            gate.batcher.flush()
        if not self.local:
            try:
                await gate.ledger.close()
                await gate.directory.close()
            except Exception:
                pass
        if self.is_child:
            if self.child_end is not None:
                self.child_end.close()
            return
        # the other workers' last batches: they flush on their own SIGTERM and close the channel
        if self.readers:
            await asyncio.wait(self.readers, timeout=2.0)
        await asyncio.sleep(0)
        if self.store is not None:
            await self.store.close()


    async def add_usage(self, rows):
        """A batch into the store (the parent): each row's provider from the running config, and
        the ledger windows of the buckets of its key's group chain (config groups, then the ones
        made through the admin API)."""
        try:
            snap = self.gw.snapshot
            gov = snap.governance
            models = snap.config.models
            for u in rows:
                u.provider = _provider(models, u.model)
            groups = dict(getattr(self.store, "groups", None) or {})
            if gov is not None:
                groups.update(gov.groups)
            chains = {}

            def buckets_of(group, pool):
                b = chains.get((group, pool))
                if b is None:
                    b = chains[(group, pool)] = ledger_buckets(group, pool, groups.get)
                return b
            await self.store.add_usage(rows, window_deltas(rows, buckets_of, time.time()))
        except Exception:
            log.exception("governance: %d usage rows could not be stored", len(rows))


def _provider(models, model) -> str:
    """The provider of a lane (a `models:` entry) by name; '' for one the config no longer has."""
    m = models.get(model) if model else None
    return m.provider.name if m is not None else ""


def _send_blocking(sock, rows):
    sock.setblocking(True)
    try:
        sock.sendall(frame(rows))
    except OSError:
        log.error("governance: the parent is gone; %d usage rows lost", len(rows))
    finally:
        sock.setblocking(False)


def seed(table, gov, api_groups: dict, store, now: float):
    """Counts carried over a restart: each requests, tokens and budget limit starts from its
    bucket's ledger for the current window (the store's usage_windows, written by busbar or by the
    Rust gateway): the admitted requests, the tokens of all four tiers, the tokens priced at the
    current rate card. A concurrent limit starts at 0."""
    groups = dict(api_groups)
    groups.update(gov.groups)
    card = gov.rate_card
    carried = 0
    for name, g in groups.items():
        for i, lim in enumerate(g.limits):
            if lim.per is None or lim.kind == "concurrent":
                continue
            ledger = store.window(rust_bucket(name, lim.per, lim.pool), window_start(lim.per, now))
            value = limit_value(lim.kind, ledger, card, gov.fee)
            if value:
                wid, _ = window(lim.per, now)
                table.seed(bucket_key(name, i, lim), wid, value)
                carried += 1
    if carried:
        log.info("governance: %d limit counter(s) carried over from the store", carried)
    return carried


async def store_problem(gw) -> str | None:
    """Why the governance store cannot serve the admin API right now, or None: a Redis store that
    does not answer a PING (a local store is this process's own file or memory)."""
    boot = gw.gov_boot
    if boot is None or boot.local or boot.store is None:
        return None
    from .redis_store import StoreUnavailable
    from .model import StoreError
    try:
        await boot.store.ping()
    except StoreUnavailable as exc:
        return "the governance store is unreachable: %s" % exc
    except StoreError as exc:
        return "the governance store cannot be used: %s" % exc
    return None


async def spend_by_group(gw):
    """(spend, None) or (None, why). spend: [{"group": name or None, "usd": x}, ...] over every
    stored day, read from the governance store and priced with the running rate card; a key's
    spend counts under its own group (None: keys without one). The status page's spend table."""
    gov = gw.snapshot.governance
    boot = gw.gov_boot
    if gov is None or boot is None:
        return None, "governance is off (no keys, groups or rate_card in the config)"
    if not gov.rate_card:
        return None, "no rate_card: tokens are counted but not priced"
    ready = boot.ready
    if boot.store is None or (ready is not None and not ready.is_set()):
        return None, "the governance store is not open yet"
    gate = gw.gate
    if gate is not None and gate.batcher is not None:
        gate.batcher.flush()        # this process's last calls (the sink is a task: let it run)
        await asyncio.sleep(0)
    from .redis_store import StoreUnavailable
    try:
        rows = await boot.store.usage_totals()
    except StoreUnavailable as exc:     # the page says so; the rest of it still shows
        return None, "the governance store is unreachable: %s" % exc
    nano = {}
    for row in rows:
        g = row["group"] or None
        nano[g] = nano.get(g, 0) + spend_nano(gov, row)
    return [{"group": g, "usd": usd(nano[g])}
            for g in sorted(nano, key=lambda g: (g is None, g or ""))], None

