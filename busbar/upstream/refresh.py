"""Keeps dynamic upstream credentials fresh, off the request path.

A source (AwsCredentialSource, GcpTokenSource) has a blocking `fetch()` → (value, expires_at or
None) and a `refresh_margin`; the Refresher runs each fetch on a worker thread and hands the value
to the owner's `apply(value)` on the event loop, where it swaps a prebuilt header or signer. A
request never awaits a credential: it finds one applied, or (before the first fetch succeeded)
its lane fails over.

Timing: the next fetch is `refresh_margin` before expiry, or halfway to expiry when the lifetime is
shorter than two margins; never sooner than MIN_DELAY. Failures retry with doubling backoff
(RETRY_FIRST … RETRY_MAX) while the old value stays in use until it expires.
"""
from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("busbar")

MIN_DELAY = 1.0
RETRY_FIRST = 1.0
# AWS and Google token endpoints are rate limited per caller; a minute between tries of a broken
# source keeps the log readable and the endpoint unbothered.
RETRY_MAX = 60.0
# Startup waits this long for the first credentials of every source before serving anyway (the
# affected lanes then fail over until their fetch succeeds). botocore's own connect timeout to STS
# is 60 s; a gateway that cannot start for a minute is worse than one lane failing over.
INITIAL_TIMEOUT = 10.0


def next_delay(expires_at, margin, now=None):
    """Seconds until the next refresh of a value expiring at `expires_at` (None: never)."""
    if expires_at is None:
        return None
    remaining = expires_at - (time.time() if now is None else now)
    if remaining > 2 * margin:
        delay = remaining - margin
    else:
        delay = remaining / 2
    return max(MIN_DELAY, delay)


class Refresher:
    """Every dynamic credential of one gateway process."""

    def __init__(self, loop):
        self.loop = loop
        self.entries = []       # (source, apply)
        self.owners = []        # id() of what each entry's `apply` updates (an Egress), or None
        self.tasks = []         # each entry's refresh loop, once started
        self.fetches = 0        # successful fetches, for tests and logs

    def add(self, source, apply, owner=None):
        self.entries.append((source, apply))
        self.owners.append(None if owner is None else id(owner))

    def retain(self, owners) -> int:
        """Stops the refresh loops of entries whose owner is not in `owners` (a set of id()s):
        a reload removed or replaced their provider. Returns how many stopped."""
        keep_e, keep_o, keep_t, stopped = [], [], [], 0
        for i, entry in enumerate(self.entries):
            owner = self.owners[i]
            task = self.tasks[i] if i < len(self.tasks) else None
            if owner is not None and owner not in owners:
                if task is not None:
                    task.cancel()
                stopped += 1
                continue
            keep_e.append(entry)
            keep_o.append(owner)
            if task is not None:
                keep_t.append(task)
        self.entries, self.owners, self.tasks = keep_e, keep_o, keep_t
        if stopped:
            log.info("credentials: %d refresher(s) stopped (their provider left the config)", stopped)
        return stopped

    async def start(self, timeout=INITIAL_TIMEOUT):
        """First fetch of every source (concurrently, bounded by `timeout`), then the background
        refresh loops."""
        if not self.entries:
            return
        firsts = [self.loop.create_task(self._first(src, apply)) for src, apply in self.entries]
        done, pending = await asyncio.wait(firsts, timeout=timeout)
        for t in pending:
            t.cancel()
        for (src, apply), t in zip(self.entries, firsts):
            delay = t.result() if t in done and not t.cancelled() else RETRY_FIRST
            self.tasks.append(self.loop.create_task(self._loop(src, apply, delay)))

    async def _first(self, src, apply):
        try:
            return self._apply(src, apply, await self.loop.run_in_executor(None, src.fetch))
        except Exception as exc:
            log.warning("credentials for %r: %s; retrying", src, exc)
            return RETRY_FIRST

    def _apply(self, src, apply, result):
        value, expires_at = result
        apply(value)
        self.fetches += 1
        return next_delay(expires_at, src.refresh_margin)

    async def _loop(self, src, apply, delay):
        backoff = RETRY_FIRST
        while delay is not None:
            await asyncio.sleep(delay)
            try:
                delay = self._apply(src, apply, await self.loop.run_in_executor(None, src.fetch))
                backoff = RETRY_FIRST
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("credentials for %r: refresh failed: %s; retrying in %.0f s", src, exc, backoff)
                delay = backoff
                backoff = min(RETRY_MAX, backoff * 2)

    def close(self):
        for t in self.tasks:
            t.cancel()
        self.tasks.clear()


async def start_credentials(loop, egresses, timeout=INITIAL_TIMEOUT):
    """A Refresher for every Egress with a credential source, started (first fetch awaited)."""
    r = Refresher(loop)
    for eg in egresses:
        if eg.source is not None:
            r.add(eg.source, eg.apply, eg)
    await r.start(timeout)
    return r
