"""The governance figures /metrics shows (busbar/observability/metrics.py renders them), read from
the store's ledger as the Rust gateway reads its own: per virtual key its attribution bucket (the
key's id, one window for all time): spend, tokens, tokens per (model, tier); per (group, window,
pool scope) enforcement bucket (`group:<name>@<window>`, `#pool:<pool>` when its limits are scoped
to a pool) the same in its current window, and what its budget leaves. Spend is derived, never
stored: the ledger's tokens priced with the running rate card, plus per_request_fee per billable
request, in whole cents (nano-units // NANO_PER_CENT), so a corrected rate re-prices the next
figures.

Computed by the parent (busbar/governance/plane.py) every few seconds, off the request path.
"""
from __future__ import annotations

import inspect
import time

from .model import NANO_PER_CENT, limit_value, rust_bucket, window_start


class KeyFigures:
    __slots__ = ("id", "labels", "spend_cents", "tokens", "models")

    def __init__(self, id, labels, ledger, card, fee=0):
        self.id = id
        self.labels = labels
        self.models = ledger[2]      # model -> [input, output, cache_read, cache_write]
        self.spend_cents = limit_value("budget_usd", ledger, card, fee) // NANO_PER_CENT
        self.tokens = sum(sum(t) for t in self.models.values())


class BucketFigures:
    __slots__ = ("id", "group", "window", "spend_cents", "remaining_cents", "models")

    def __init__(self, id, group, window, ledger, card, cap, fee=0):
        self.id = id
        self.group = group
        self.window = window
        self.models = ledger[2]
        self.spend_cents = limit_value("budget_usd", ledger, card, fee) // NANO_PER_CENT
        # The budget's cap less that spend (None: no budget limit in this bucket).
        self.remaining_cents = None if cap is None else max(0, cap // NANO_PER_CENT -
                                                             self.spend_cents)


class Figures:
    __slots__ = ("keys", "buckets")

    def __init__(self, keys, buckets):
        self.keys = keys
        self.buckets = buckets


async def _ledger(store, bucket_id, start):
    """(requests, billable, {model: [4 tiers]}) of a bucket's window: a local store answers at
    once, Redis in a round trip (and adds its reservations in flight, which are no spend yet)."""
    got = store.window(bucket_id, start)
    if inspect.isawaitable(got):
        got = await got
    return tuple(got[:3])


def buckets_of(groups: dict):
    """[(bucket id, group, window word, pool, budget cap in nano-units or None)] of every group's
    windowed limits, one per (group, window, pool scope); a concurrent limit has none."""
    out = {}
    for name in sorted(groups):
        for lim in groups[name].limits:
            if lim.per is None:
                continue
            k = (name, lim.per, lim.pool)
            cap = out.get(k)
            if lim.kind == "budget_usd" and (cap is None or lim.amount < cap):
                cap = lim.amount
            out[k] = cap
    return [(rust_bucket(n, per, pool), n, per, pool, cap) for (n, per, pool), cap in out.items()]


async def compute(gov, store, keys, groups: dict, now: float | None = None) -> Figures:
    """`keys`: every KeyRecord (a tombstoned one has no series); `groups`: name -> GroupRecord,
    the config's and the admin API's."""
    now = time.time() if now is None else now
    card = gov.rate_card
    fee = getattr(gov, "fee", 0)
    kf = [KeyFigures(k.id, k.labels, await _ledger(store, k.id, 0), card, fee)
          for k in keys if k.state != "tombstoned"]
    bf = [BucketFigures(bid, g, per, await _ledger(store, bid, window_start(per, now)), card, cap,
                        fee)
          for bid, g, per, _pool, cap in buckets_of(groups)]
    bf.sort(key=lambda b: b.id)
    return Figures(kf, bf)
