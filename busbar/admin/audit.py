"""The admin audit log: every mutation attempt on /api/v1/admin, applied or rejected, with who made
it, hash-chained for tamper evidence, and `GET /api/v1/admin/audit` to read it.

A record is the Rust gateway's (its store's `audit_log` table and the valkey store's `busbar:audit`
sorted set hold the same fields): `{seq, ts, action, resource, outcome, principal, prev_hash, hash}`
with `hash = sha256_hex("prev_hash|seq|ts|action|resource|outcome|principal")` and `prev_hash` the
preceding record's hash ("" for the first). Recomputing the chain (`verify`) detects an altered,
reordered or deleted record; it does not prevent a rewrite of the whole chain on a compromised host.

Where it lives: in the governance store when there is one (memory: the process's list; SQLite: the
`audit_log` table of the v6 schema, which refuses UPDATE and DELETE; Redis: the `busbar:audit`
sorted set scored by seq), so the chain continues across restarts and a file either gateway wrote
reads in the other. With governance off there is no store: the last AUDIT_RING_MAX records are kept
in memory, as the Rust gateway does without a durable store.

Records carry action/resource/outcome/principal only: never a token, a secret or a request body.
Only the parent process serves the admin API, so it is the log's one writer.
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import time

log = logging.getLogger("busbar.admin")

APPLIED = "applied"
REJECTED = "rejected"
# Records kept in memory when there is no store to hold them (the Rust gateway's ring size): bounds
# memory, not history, which is the store's.
AUDIT_RING_MAX = 1000
FIELDS = ("seq", "ts", "action", "resource", "outcome", "principal", "prev_hash", "hash")
# How long GET /audit waits for a shared store to open at boot (as governance's calls wait).
STORE_READY_SECS = 10.0


def record_hash(prev_hash: str, seq: int, ts: int, action: str, resource: str, outcome: str,
                principal: str) -> str:
    canonical = "%s|%d|%d|%s|%s|%s|%s" % (prev_hash, seq, ts, action, resource, outcome, principal)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def verify(records) -> int | None:
    """The seq of the first record (oldest first) whose hash or link is wrong, or None when the
    chain holds. The oldest record's own link is not checked (its predecessor may be gone)."""
    prev = None
    for r in records:
        if r["hash"] != record_hash(r["prev_hash"], r["seq"], r["ts"], r["action"], r["resource"],
                                    r["outcome"], r["principal"]):
            return r["seq"]
        if prev is not None and r["prev_hash"] != prev:
            return r["seq"]
        prev = r["hash"]
    return None


class AuditLog:
    """The parent's audit log. `record` is synchronous (a refusal happens before any handler runs);
    with a local store the record is written in the call, with Redis by one writer task in order."""

    def __init__(self, gw, clock=time.time):
        self.gw = gw
        self.clock = clock
        self.ring = collections.deque(maxlen=AUDIT_RING_MAX)
        self.seq = None             # the last seq given out (None: not restored yet)
        self.prev = ""
        self._store_seen = None     # the store the chain was restored from
        self._queue = []            # Redis: records waiting for the writer
        self._writer = None

    def _boot(self):
        return getattr(self.gw, "gov_boot", None)

    def store(self):
        """The local store (memory, SQLite) the log is kept in, or None."""
        boot = self._boot()
        if boot is None or not boot.local:
            return None
        return boot.store

    # ------------------------------------------------------------------ write
    def record(self, action: str, resource: str, outcome: str, principal: str):
        entry = {"ts": int(self.clock()), "action": action, "resource": resource,
                 "outcome": outcome, "principal": principal}
        boot = self._boot()
        if boot is not None and not boot.local:
            # Redis, Postgres: chained by the one writer after the store's tail, once it is open
            # (a record made before, e.g. a refusal while it opens, waits for it in the queue)
            self._queue.append(entry)
            if len(self._queue) > AUDIT_RING_MAX:   # the store has been down that long
                log.warning("audit: the store is not answering; the oldest unstored record "
                            "(%s %s) is dropped", self._queue[0]["action"],
                            self._queue[0]["resource"])
                del self._queue[0]
            if self._writer is None or self._writer.done():
                self._writer = asyncio.ensure_future(self._write_remote(boot))
            return
        store = self.store()
        if store is not None and store is not self._store_seen:
            self._restore_local(store)
        self._chain(entry)
        if store is not None:
            try:
                store.append_audit_sync(entry)
            except Exception:
                log.exception("audit: record %d could not be stored", entry["seq"])
        self.ring.append(entry)

    def _chain(self, entry):
        if self.seq is None:
            self.seq, self.prev = 0, ""
        self.seq += 1
        entry["seq"] = self.seq
        entry["prev_hash"] = self.prev
        entry["hash"] = record_hash(self.prev, self.seq, entry["ts"], entry["action"],
                                    entry["resource"], entry["outcome"], entry["principal"])
        self.prev = entry["hash"]

    def _restore_local(self, store):
        tail = store.audit_tail_sync()
        self._store_seen = store
        if tail is not None:
            self.seq, self.prev = tail["seq"], tail["hash"]
        elif self.seq is None:
            self.seq, self.prev = 0, ""

    async def _write_remote(self, boot):
        try:
            await _opened(boot)
            store = boot.store
            tail = await store.audit_tail()
            if tail is not None and (self.seq is None or tail["seq"] >= self.seq):
                # Another node (or an earlier life of this one) wrote after us: continue its chain.
                self.seq, self.prev = tail["seq"], tail["hash"]
            while self._queue:
                entry = self._queue[0]
                seq, prev = self.seq, self.prev
                self._chain(entry)
                try:
                    await store.append_audit(entry)
                except BaseException:
                    # not stored: unchained again, kept for the next write (no hole in the chain)
                    self.seq, self.prev = seq, prev
                    raise
                self._queue.pop(0)
                self.ring.append(entry)
        except Exception as exc:
            from busbar.governance.redis_store import StoreUnavailable
            n = len(self._queue)
            if isinstance(exc, StoreUnavailable):   # the store's state, said once, no traceback
                log.warning("audit: %d record(s) not stored: %s", n, exc)
            else:
                log.exception("audit: %d record(s) could not be stored", n)

    # ------------------------------------------------------------------ read
    async def records(self) -> list:
        """Every record, oldest first: the store's, or the ring's without one."""
        boot = self._boot()
        if boot is not None and not boot.local:
            try:
                await asyncio.wait_for(_opened(boot), STORE_READY_SECS)
            except asyncio.TimeoutError:
                from busbar.admin.site import AdminError
                raise AdminError(503, "the governance store is not open yet") from None
            if self._writer is not None and not self._writer.done():
                await asyncio.shield(self._writer)
            return await boot.store.list_audit()
        store = self.store()
        if store is None:
            return list(self.ring)
        return store.list_audit_sync()


async def _opened(boot):
    """Until the parent's shared store (Redis, Postgres) is open: GovBoot.start makes `ready` and
    sets it once it is."""
    while True:
        ready = boot.ready
        if ready is not None and ready.is_set() and boot.store is not None:
            return
        if ready is None or ready.is_set():
            await asyncio.sleep(0.05)
        else:
            await ready.wait()


def mount(site):
    """GET /api/v1/admin/audit on the admin site: newest first, exact ?action= and ?resource=
    filters, cursor-paginated (default 200, at most 1000 a page)."""
    from busbar.admin.site import PREFIX, compact_response, page, page_params

    async def list_audit(req):
        start_limit = page_params(req)
        action = req.query_param("action")
        resource = req.query_param("resource")
        rows = [r for r in reversed(await site.audit_log.records())
                if (action is None or r["action"] == action)
                and (resource is None or r["resource"] == resource)]
        rows = [{f: r[f] for f in FIELDS} for r in rows]
        return compact_response(page(req, rows, start_limit=start_limit))

    site.routes.add("GET", PREFIX + "/audit", list_audit,
                    summary="the admin audit log, newest first (?action=, ?resource=, cursor pages)")
