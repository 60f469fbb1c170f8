"""The data plane's side of governance, one per worker: who is calling (a signed virtual key, or a
SigV4 signature made with the AWS pair issued with one), may they use this pool, and may this
request start under every limit of their group chain (SPEC §5; issue 10).

The engine calls three things, all from busbar/engine/exchange.py:
- `enter(ex, cont)` before anything else of a data request: authenticates and sets `ex.principal`,
  then calls `cont()`; a bad key ends the request with the vendor's own auth error.
- `admit(ex, cont)` once the target is known: pool ACL, rate card, then the group chain's limits,
  taken all or nothing (requests and concurrency counted, the worst-case cost reserved); then
  `cont()`, or the native 429/403/400.
- `settle(ex, outcome)` from `Exchange.finish`, on every path: the concurrency slot comes back,
  the reservation becomes the actual cost, tokens are added, and the usage row goes to the store.

With a local store (memory, SQLite) every step is synchronous: keys and groups are pushed to each
worker by the parent, counters are in shared memory (cbusbar/ledger.pyx). The steps a request takes
every time are in C there too: a token already verified is accepted by `Credentials`, the group
chain's limits for a pool are one cached `Plan` that `Admission` takes at once with the reservation
`Pricing` computes, settlement and the usage rows (`UsageRows`) likewise; Python here decides what
is cached and answers every refusal. With Redis, a key not yet cached and the admission are one
round trip each (busbar/governance/redis_store.py).
"""
from __future__ import annotations

import logging
import time

from cbusbar.framing import FramingError, scan_top

from busbar.engine.request import credential

from .model import (C_GROUP, C_KIND, C_PER, C_ROLL, Denial, Usage, bucket_key, day_of,
                    rust_bucket, verify_token, window, window_start)

log = logging.getLogger("busbar.governance")

# Token bytes accepted: a bbk_ token is ~150 bytes; anything far longer is not one of ours.
MAX_TOKEN_BYTES = 1024
# Input tokens are estimated from the body for a budget reservation: JSON and English text run
# 3.5-4.5 bytes per token; 3 bytes per token over-reserves, which settlement refunds.
BYTES_PER_TOKEN = 3
UNAVAILABLE = "unavailable"     # a store that cannot answer (redis_store.UNAVAILABLE)

# Verified tokens and group chains kept per worker: bounded, cleared whole when full (a worker
# sees far fewer distinct keys and (group, pool) pairs than this in any real deployment).
TOKEN_CACHE_MAX = 8192
CHAIN_CACHE_MAX = 4096
# A remote store's checks for a (group, pool) are reused for at most this long within their
# windows: their seconds-to-the-roll (what a minute or hour ledger's expiry is set from) is then
# up to this much early, which keeps the ledger hash a second longer at most.
PLAN_REUSE_SECS = 1.0
ACL_MESSAGE = "Your API key does not have permission to access this resource."


class LocalDirectory:
    """Keys and API-made groups as the parent pushed them (busbar/governance/plane.py)."""

    remote = False

    def __init__(self, keys=(), groups=()):
        self.version = 0            # bumped by every change: the gate's caches follow it
        self.keys = {}
        self.aws = {}
        self.groups = {}
        for k in keys:
            self.put_key(k)
        for g in groups:
            self.groups[g.name] = g

    def put_key(self, rec):
        old = self.keys.get(rec.id)
        if old is not None and old.aws_access_key_id:
            self.aws.pop(old.aws_access_key_id, None)
        self.keys[rec.id] = rec
        if rec.aws_access_key_id:
            self.aws[rec.aws_access_key_id] = rec

    def drop_key(self, key_id):
        old = self.keys.pop(key_id, None)
        if old is not None and old.aws_access_key_id:
            self.aws.pop(old.aws_access_key_id, None)

    def apply(self, msg: dict):
        self.version += 1
        for rec in msg.get("keys", ()):
            self.put_key(rec)
        for kid in msg.get("drop_keys", ()):
            self.drop_key(kid)
        for g in msg.get("groups", ()):
            self.groups[g.name] = g
        for name in msg.get("drop_groups", ()):
            self.groups.pop(name, None)

    def key(self, key_id):
        return self.keys.get(key_id)

    def key_by_aws(self, akid):
        return self.aws.get(akid)

    def group(self, name):
        return self.groups.get(name)


from cbusbar.ledger import (DENIED_FULL, PERIOD_INDEX, Admission, Credentials, Pass,  # noqa: E402
                            Plan, Price, Pricing, UsageRows)
from cbusbar.ledger import Ticket as LocalTicket  # noqa: E402


class LocalLedger:
    """The shared-memory LimitTable of a local store (cbusbar/ledger.pyx), taken through
    `admission`: a group chain's checks as one Plan, a LocalTicket back."""

    remote = False

    def __init__(self, table):
        self.table = table
        self.admission = Admission(table, window)


def requested_max_tokens(codec, body: bytes, spans) -> int | None:
    """The caller's output cap, read from the body's scanned members where the codec says it
    lives (MAX_TOKENS_PATH): no parse of the request."""
    if spans is None:
        return None
    for path in codec.MAX_TOKENS_PATH:
        sp = spans.get(path[0])
        if sp is None:
            continue
        raw = body[sp[0]:sp[1]]
        if len(path) == 2:
            try:
                sub = scan_top(raw, (path[1],))
            except FramingError:
                continue
            sp = sub.get(path[1])
            if sp is None:
                continue
            raw = raw[sp[0]:sp[1]]
        if raw.isdigit() and len(raw) < 12:
            return int(raw)
    return None


def denial_of(c) -> Denial:
    roll = c[C_ROLL]
    ra = None
    if c[C_KIND] in ("requests", "tokens") and roll is not None:
        ra = max(1, int(roll + 0.999))
    return Denial(c[C_KIND], c[C_GROUP], c[C_PER], ra)


class UsageBatcher(UsageRows):
    """Sums usage rows per (day, key, group, model, pool) and hands them on every flush interval:
    to the parent over the worker's usage channel, or (in the parent) straight to the store.
    `add(key_id, group, model, pool, usage)` is cbusbar.ledger.UsageRows (in C, dated there)."""

    def __init__(self, loop, flush_secs, sink):
        super().__init__(day_of)
        self.loop = loop
        self.flush_secs = flush_secs
        self.sink = sink            # callable(list[Usage]) -> None (may schedule a task)

    def schedule(self):
        self.handle = self.loop.call_later(self.flush_secs, self.flush)

    def flush(self):
        self.handle = None
        rows = [Usage(*k, *v) for k, v in self.rows.items()]
        self.rows = {}
        if rows:
            try:
                self.sink(rows)
            except Exception:
                log.exception("governance: usage batch of %d rows lost", len(rows))


class _Priced:
    """A target's lanes against one rate card: the first lane without a rate (refused), and the
    reservation's prices (cbusbar.ledger.Pricing)."""

    __slots__ = ("card", "default", "unpriced", "pricing")

    def __init__(self, card, default, lanes, prices):
        self.card = card
        self.default = default
        self.unpriced = None
        priced = []
        for lane in lanes:
            price = prices.get(lane.name)
            if price is None:
                if self.unpriced is None:
                    self.unpriced = lane.name
                continue
            priced.append((price, lane.model.default_max_tokens or default))
        self.pricing = Pricing(priced)


# Denial -> the busbar_admission_denied_total gate it counts under
DENIED_GATE = {"disabled": "group_disabled", "missing": "budget", "budget_usd": "budget",
               "concurrent": "concurrent", "requests": "rate_limit", "tokens": "rate_limit"}


class Ticket:
    __slots__ = ("checks", "reserve", "now", "pool")

    def __init__(self, checks, reserve, now, pool):
        self.checks = checks
        self.reserve = reserve
        self.now = now
        self.pool = pool


class Gate:
    def __init__(self, loop, directory, ledger, batcher, metrics=None):
        self.loop = loop
        self.directory = directory
        self.ledger = ledger
        self.batcher = batcher
        self.metrics = metrics
        self._chains = {}           # (group, pool) -> the chain's limits, while _stamp holds
        self._stamp = None
        self._windows = {}          # per -> (window id, when it rolls)
        self._remote_plans = {}     # (group, pool) -> (chain, valid until, checks, has a budget)
        # (KeyRecord, Target) -> what a network store's admission of the pair reuses, while the
        # config, the directory's version and its time hold: (gov, version, valid until, checks,
        # the reservation's Pricing or None, pool, group lookup)
        self._rpasses = {}
        self._nowait = getattr(ledger, "admit_nowait", None)
        # whether the ledger's settle reads `cost` (Valkey's fail_mode open local count)
        self._needs_cost = getattr(ledger, "needs_cost", False)
        self._verified = {}         # token -> (key id, exp, gen, signing key): MACs checked
        self.credentials = Credentials()    # the same, by the raw header they came in (enter)
        self._targets = {}          # Target -> its _Priced (rate card coverage, reservation)
        self._card = None           # the last rate card seen, and its Prices (card_prices)
        self._card_prices = None
        self._plans = {}            # (group, pool) -> its Plan (local stores), while these hold:
        self._plan_gov = None
        self._plan_version = None
        self._passes = {}           # (KeyRecord, Target) -> its Pass (local stores), while:
        self._pass_gov = None
        self._pass_version = None

    def flush_credentials(self) -> int:
        """POST /auth/cache/flush: forget every verified token (and, with Redis, every cached key
        record), so the next request of each is verified against the store again. Returns how
        many entries were dropped. Refusals are never cached, so there is nothing else to drop."""
        n = len(self._verified) + len(self.credentials.by_auth)
        self._verified = {}
        self.credentials = Credentials()
        flush = getattr(self.directory, "flush_cache", None)
        if flush is not None:
            n += flush()
        return n

    # ------------------------------------------------------------------ who
    def enter(self, ex, gov, cont):
        # A token already verified, under the header the SDK put it in, for a key the local
        # directory holds and that is still good: accepted in C (cbusbar.ledger.Credentials).
        # Anything else (a first sight, a refusal, SigV4, Redis) takes `_enter`, the whole path.
        d = self.directory
        if not d.remote:
            rec = self.credentials.accept(ex.req.headers, gov.signing_key, d.keys, time.time())
            if rec is not None:
                ex.principal = rec
                cont()
                return
        return self._enter(ex, gov, cont)

    def _enter(self, ex, gov, cont):
        kind, value = credential(ex.req)
        now = time.time()
        if kind == "token":
            if len(value) > MAX_TOKEN_BYTES:
                return self._refuse(ex)
            try:
                token = value.decode("ascii")
            except UnicodeDecodeError:
                return self._refuse(ex)
            claims = self._verified.get(token)
            if claims is None or claims[3] is not gov.signing_key:
                claims = verify_token(gov.signing_key, token, now)
                if claims is None:
                    return self._refuse(ex)
                claims = claims + (gov.signing_key,)
                if len(self._verified) >= TOKEN_CACHE_MAX:
                    self._verified = {}
                self._verified[token] = claims
            self.credentials.remember(ex.req.headers, claims, TOKEN_CACHE_MAX)
            kid, exp, gen, _ = claims
            if exp is not None and exp <= now:
                return self._refuse(ex)
            d = self.directory
            if d.remote:
                rec = d.cached_key(kid)
                if rec is d.MISS:
                    self.loop.create_task(self._remote(
                        ex, d.key(kid), lambda rec: self._accept(ex, rec, gen, now, cont)))
                    return
            else:
                rec = d.key(kid)
            return self._accept(ex, rec, gen, now, cont)
        if kind == "sigv4":
            return self._enter_sigv4(ex, now, cont)
        return self._refuse(ex)

    async def _remote(self, ex, lookup, then):
        """A policy read from Redis (a cache miss), then `then(record)`; the store unreachable
        answers 503, a client gone meanwhile is left alone."""
        try:
            rec = await lookup
        except Exception:
            rec = UNAVAILABLE
        if ex.closed:
            return
        if rec == UNAVAILABLE:
            self._unavailable(ex)
            return
        try:
            then(rec)
        except Exception as exc:
            ex.crash(exc)

    def _accept(self, ex, rec, gen, now, cont):
        if rec is None or rec.gen != gen or not rec.usable(now):
            return self._refuse(ex)
        ex.principal = rec
        cont()

    def _enter_sigv4(self, ex, now, cont):
        from .sigv4_verify import parse_access_key
        akid = parse_access_key(ex.req.headers.get(b"authorization"))
        d = self.directory
        if d.remote and akid is not None:
            self.loop.create_task(self._remote(
                ex, d.key_by_aws(akid), lambda rec: self._sigv4_check(ex, rec, now, cont)))
            return
        rec = d.key_by_aws(akid) if akid is not None else None
        return self._sigv4_check(ex, rec, now, cont)

    def _sigv4_check(self, ex, rec, now, cont):
        from .sigv4_verify import verify
        req = ex.req
        secret = rec.aws_secret if rec is not None else None
        ok = verify(req.method, req.path, req.query, req.headers, req.body,
                    lambda akid: secret, now)
        if ok is None or rec is None or not rec.usable(now):
            return self._refuse(ex)
        ex.principal = rec
        cont()

    def _refuse(self, ex):
        ex.denied = "auth"
        status, message = ex.own_error("authentication")
        ex.error(status, "authentication", message)

    def _unavailable(self, ex):
        ex.denied = "store_unavailable"
        ex.error(503, "overloaded", "The service is temporarily unable to check your API key. "
                 "Please retry shortly.", retry_after=1)

    # ------------------------------------------------------------------ may it start
    def admit(self, ex, gov, cont):
        # A (key, target) pair this worker admitted before, under the same config and directory:
        # its Pass (cbusbar.ledger) holds every decision that does not change per request, so
        # only the reservation and the limits are taken, in C. The rest takes `_admit`.
        d = self.directory
        if d.remote:
            rp = self._rpasses.get((ex.principal, ex.target))
            if rp is not None:
                now = time.time()
                if rp[0] is gov and rp[1] == d.version and now < rp[2]:
                    pricing = rp[4]
                    reserve = 0 if pricing is None else pricing.reserve(
                        ex.req.body, ex.spans, ex.ingress, ex.op is not None, BYTES_PER_TOKEN,
                        requested_max_tokens)
                    self._admit_now(ex, gov, rp[3], reserve, now, rp[5], cont, rp[6])
                    return
            return self._admit(ex, gov, cont)
        if gov is self._pass_gov and d.version == self._pass_version:
            p = self._passes.get((ex.principal, ex.target))
            if p is not None:
                now = time.time()
                t = self.ledger.admission.take(p, ex.req.body, ex.spans, ex.ingress,
                                               ex.op is not None, now, BYTES_PER_TOKEN,
                                               requested_max_tokens)
                if t is None:
                    cont()
                elif t.__class__ is LocalTicket:
                    ex.ticket = t
                    cont()
                else:
                    self._refused(ex, gov, p.plan, t, now)
                return
        return self._admit(ex, gov, cont)

    def _admit(self, ex, gov, cont):
        key = ex.principal
        target = ex.target
        pool = target.name
        allowed = key.allowed_pools
        if allowed is not None and pool not in allowed:
            ex.denied = "pool_acl"
            status, _ = ex.own_error("permission")
            ex.error(status, "permission", ACL_MESSAGE)
            return
        card = gov.rate_card
        priced = None
        if card is not None:
            priced = self._targets.get(target)
            if priced is None or priced.card is not card or \
                    priced.default != ex.snap.limits.default_max_tokens:
                priced = self.priced(ex, card)
            if priced.unpriced is not None:
                ex.error(400, "invalid_request", "no configured rate for model '%s'" %
                         priced.unpriced)
                return
        group = key.group
        d = self.directory
        if group is None:
            if not d.remote:
                self._keep_pass(gov, key, target, Pass(None, None, pool, None))
            cont()
            return
        if d.remote:
            chain = self._cached_chain(gov, group)
            if chain is None:       # a group not cached: read it, in a task
                self.loop.create_task(self._admit_remote(ex, gov, group, pool, cont))
                return
            now = time.time()
            checks, reserve, why = self.plan(ex, gov, group, pool, now, chain.get)
            if why is not None:
                return self.deny(ex, why)
            if not checks:
                cont()
                return
            plan = self._remote_plans[(group, pool)]
            if len(self._rpasses) >= CHAIN_CACHE_MAX:
                self._rpasses = {}
            self._rpasses[(key, target)] = (
                gov, d.version, min(plan[1], now + PLAN_REUSE_SECS), checks,
                priced.pricing if plan[3] and priced is not None else None, pool, chain.get)
            self._admit_now(ex, gov, checks, reserve, now, pool, cont, chain.get)
            return
        plan = self.local_plan(gov, group, pool)
        if plan.__class__ is Denial:
            return self.deny(ex, plan)
        p = Pass(plan, priced.pricing if priced is not None else None, pool,
                 self.card_prices(card) if card is not None else None, gov.fee)
        self._keep_pass(gov, ex.principal, ex.target, p)
        return self.admit(ex, gov, cont)

    def _keep_pass(self, gov, key, target, p):
        d = self.directory
        if gov is not self._pass_gov or d.version != self._pass_version or \
                len(self._passes) >= CHAIN_CACHE_MAX:
            self._passes = {}
            self._pass_gov = gov
            self._pass_version = d.version
        self._passes[(key, target)] = p

    def _refused(self, ex, gov, plan, t, now):
        if t == DENIED_FULL:
            log.error("governance: the shared limit table is full (limits.max_limit_buckets); "
                      "refusing admission")
            self._unavailable(ex)
            return
        bucket, kind, amount, per, name = plan.chain[t]
        self.refuse(ex, gov, denial_of((bucket, kind, amount, None, None,
                                        self.ledger.admission.roll(PERIOD_INDEX[per], now),
                                        name, per)))

    async def _admit_remote(self, ex, gov, group, pool, cont):
        """Redis: the group chain from the worker's cache (a read on a miss), then one admission
        script."""
        chain = {}
        name = group
        r = None
        try:
            while name is not None and len(chain) < 9:
                g = gov.groups.get(name)
                if g is None:
                    g = await self.directory.group(name)
                if g == UNAVAILABLE:
                    r = UNAVAILABLE
                    break
                if g is None:
                    break
                chain[name] = g
                name = g.parent
        except Exception:
            r = UNAVAILABLE
        if ex.closed:
            return
        if r == UNAVAILABLE:
            self._unavailable(ex)
            return
        now = time.time()
        try:
            checks, reserve, why = self.plan(ex, gov, group, pool, now, chain.get)
        except Exception as exc:
            ex.crash(exc)
            return
        if why is not None:
            return self.deny(ex, why)
        if not checks:
            cont()
            return
        await self._admit_checks(ex, gov, checks, reserve, now, pool, cont, chain.get)

    def _admit_now(self, ex, gov, checks, reserve, now, pool, cont, lookup):
        """A network store's admission of `checks`: without a task where the ledger answers by
        callback (Valkey's pipelined client: the reply's callback continues the request),
        otherwise awaited in one."""
        nowait = self._nowait
        if nowait is None or not nowait(
                checks, now, gov.rate_card, reserve, gov.fee,
                lambda r: self._admit_answer(ex, gov, r, checks, reserve, now, pool, cont, lookup)):
            self.loop.create_task(self._admit_checks(ex, gov, checks, reserve, now, pool, cont,
                                                     lookup))

    async def _admit_checks(self, ex, gov, checks, reserve, now, pool, cont, lookup):
        try:
            r = await self.ledger.admit(checks, now, gov.rate_card, reserve, gov.fee)
        except Exception:
            log.exception("governance: admission failed")
            r = UNAVAILABLE
        self._admit_answer(ex, gov, r, checks, reserve, now, pool, cont, lookup)

    def _admit_answer(self, ex, gov, r, checks, reserve, now, pool, cont, lookup):
        """A remote admission's answer (None: admitted and charged, a Denial, or UNAVAILABLE)."""
        if ex.closed:
            if r is None:   # admitted for a client that left meanwhile: give it back
                self.ledger.undo(checks, reserve, gov.fee)
            return
        try:
            self._admitted(ex, gov, r, checks, reserve, now, pool, cont, lookup)
        except Exception as exc:
            ex.crash(exc)

    def _cached_chain(self, gov, name):
        """A remote directory's group chain {name: group} from config and the worker's cache, or
        None when a group of it is not cached (a read is needed)."""
        chain = {}
        groups = gov.groups
        cached = self.directory.cached_group
        miss = self.directory.MISS
        while name is not None and len(chain) < 9:
            g = groups.get(name)
            if g is None:
                g = cached(name)
                if g is miss:
                    return None
                if g is None:
                    break
            chain[name] = g
            name = g.parent
        return chain

    def _admitted(self, ex, gov, r, checks, reserve, now, pool, cont, lookup=None):
        """Redis: the admission script's answer."""
        if r is None:
            ex.ticket = Ticket(checks, reserve, now, pool)
            cont()
        elif r == UNAVAILABLE:
            self._unavailable(ex)
        else:
            self.refuse(ex, gov, r, lookup)

    def plan(self, ex, gov, group_name, pool, now, lookup):
        """Redis: the checks of the group chain for this request, and the reservation
        (nano-dollars). `lookup(name)`: a group made through the admin API (config groups come
        first). A check counts in its Rust ledger bucket and window start (model.rust_bucket,
        window_start); a concurrent one in its group's gauge. The chain's limits are cached per
        (group, pool) until the config or a group changes."""
        chain = self.chain(gov, group_name, pool, lookup, rust=True)
        if chain.__class__ is Denial:
            return None, None, chain
        k = (group_name, pool)
        got = self._remote_plans.get(k)
        if got is None or got[0] is not chain or now >= got[1]:
            got = self._remote_checks(chain, now)
            if len(self._remote_plans) >= CHAIN_CACHE_MAX:
                self._remote_plans = {}
            self._remote_plans[k] = got
        return got[2], (self.reservation(ex, gov) if got[3] else 0), None

    def _remote_checks(self, chain, now):
        """(chain, valid until, the checks, whether one is a budget) of a chain at `now`: valid
        until the first of its windows rolls, and PLAN_REUSE_SECS at most. A budget check's charge
        is the request's reservation, which admission and settlement are given beside the checks
        (C_CHARGE is 0 here)."""
        checks = []
        windows = self._windows
        until = now + PLAN_REUSE_SECS
        budget = False
        for bucket, kind, amount, per, name in chain:
            w = windows.get(per)
            if w is None or (w[1] is not None and now >= w[1]):
                _, roll = window(per, now)
                w = windows[per] = (window_start(per, now), None if roll is None else now + roll)
            roll = None
            if w[1] is not None:
                roll = w[1] - now
                until = min(until, w[1])
            if kind == "budget_usd":
                budget = True
            checks.append((bucket, kind, amount, 0 if kind in ("budget_usd", "tokens") else 1,
                           w[0], roll, name, per))
        return chain, until, tuple(checks), budget

    def chain(self, gov, group_name, pool, lookup, rust=False):
        """The limits of the group chain for `pool`: (bucket, kind, amount, per, group) each, the
        bucket busbar's own counter key (the shared-memory table), or with `rust` the Rust ledger
        bucket (the group's name for a concurrent limit: its gauge)."""
        d = self.directory
        stamp = (id(gov), d.version)
        if stamp != self._stamp:
            self._chains = {}
            self._stamp = stamp
        k = (group_name, pool, rust)
        out = self._chains.get(k)
        if out is not None:
            return out
        groups = gov.groups
        limits = []
        name = group_name
        depth = 0
        while name is not None:
            g = groups.get(name)
            if g is None:
                g = lookup(name)
            if g is None:
                # SPEC §5: a group missing from config fails closed, with the quota status.
                return Denial("budget_usd", name, None, reason="missing")
            if not g.enabled:
                return Denial(None, name, None, reason="disabled")
            for i, lim in enumerate(g.limits):
                if lim.pool is not None and lim.pool != pool:
                    continue
                if not rust:
                    bucket = bucket_key(name, i, lim)
                elif lim.per is None:
                    bucket = name
                else:
                    bucket = rust_bucket(name, lim.per, lim.pool)
                limits.append((bucket, lim.kind, lim.amount, lim.per, name))
            name = g.parent
            depth += 1
            if depth > 8:
                break
        out = self._chains[k] = tuple(limits)
        if len(self._chains) > CHAIN_CACHE_MAX:
            self._chains = {}
        return out

    def local_plan(self, gov, group_name, pool):
        """The group chain's limits for `pool` as a cbusbar.ledger.Plan (or the chain's Denial),
        cached with the chains."""
        d = self.directory
        if gov is not self._plan_gov or d.version != self._plan_version:
            self._plans = {}
            self._plan_gov = gov
            self._plan_version = d.version
        k = (group_name, pool)
        p = self._plans.get(k)
        if p is None:
            chain = self.chain(gov, group_name, pool, d.group)
            p = chain if chain.__class__ is Denial else Plan(chain)
            if len(self._plans) >= CHAIN_CACHE_MAX:
                self._plans = {}
            self._plans[k] = p
        return p

    def priced(self, ex, card):
        """The target's _Priced for this rate card and gateway default, cached per target."""
        target = ex.target
        default = ex.snap.limits.default_max_tokens
        p = self._targets.get(target)
        if p is None or p.card is not card or p.default != default:
            p = _Priced(card, default, target.lanes, self.card_prices(card))
            if len(self._targets) >= CHAIN_CACHE_MAX:
                self._targets = {}
            self._targets[target] = p
        return p

    def card_prices(self, card):
        """{model: cbusbar.ledger.Price} of a rate card, made once per card."""
        if card is not self._card:
            self._card_prices = {name: Price(rate) for name, rate in card.items()} \
                if card is not None else None
            self._card = card
        return self._card_prices

    def reservation(self, ex, gov) -> int:
        """Worst case: the input estimate plus max_tokens (or the lanes' default) at the dearest
        rate among the target's lanes."""
        card = gov.rate_card
        if not card:
            return 0
        return self.priced(ex, card).pricing.reserve(ex.req.body, ex.spans, ex.ingress,
                                                     ex.op is not None, BYTES_PER_TOKEN,
                                                     requested_max_tokens)

    def refuse(self, ex, gov, why: Denial, lookup=None):
        """A limit refused `ex`: the caller's answer (deny), or, when the limit is a pool-scoped
        budget with `on_exhaust: downgrade`, the request re-routed through its `downgrade_to` pool
        and admitted there (its limits, its charges: accounting follows the traffic), as the Rust
        gateway does. The key's pool ACL holds on every hop (a pool it may not use is the plain
        refusal) and a pool is downgraded to once per request (a cycle ends in a refusal)."""
        to = self.downgrade_target(ex, gov, why, lookup)
        if to is None:
            self.deny(ex, why)
            return
        log.info("governance: group '%s' budget per %s exhausted on pool %s; downgrading to %s "
                 "(on_exhaust: downgrade)", why.group, why.per, ex.target.name, to.name)
        ex.downgraded = (ex.downgraded or ()) + (to.name,)
        ex.target = to
        ex.tried.clear()        # no attempt yet: only the old target's lanes lacking the operation
        ex.routed()

    def downgrade_target(self, ex, gov, why: Denial, lookup=None):
        """The Target `ex` downgrades to after `why`, or None (refuse). The limit is the group's
        budget for the refused window scoped to the request's pool (the most restrictive, should
        there be several: the one that blocks)."""
        if why.kind != "budget_usd" or why.reason is not None or ex.target is None:
            return None
        g = gov.groups.get(why.group)
        if g is None and lookup is not None:
            g = lookup(why.group)
        if g is None and not self.directory.remote:
            g = self.directory.group(why.group)
        if g is None:
            return None
        pool = ex.target.name
        lim = None
        for x in g.limits:
            if x.kind == "budget_usd" and x.per == why.per and x.pool == pool and (
                    lim is None or x.amount < lim.amount):
                lim = x
        if lim is None or lim.downgrade_to is None:
            return None
        to = lim.downgrade_to
        visited = ex.downgraded or ()
        if to in visited or len(visited) >= len(ex.snap.config.pools):
            return None
        target = ex.snap.router.resolve(to)
        if target is None or not target.is_pool:
            return None
        allowed = ex.principal.allowed_pools if ex.principal is not None else None
        if allowed is not None and to not in allowed:
            return None
        return target

    def deny(self, ex, why: Denial):
        ex.denied = DENIED_GATE.get(why.reason or why.kind, "rate_limit")
        if why.reason == "disabled":
            status, _ = ex.own_error("permission")
            ex.error(status, "permission", "Your API key's group '%s' is disabled." % why.group)
            return
        kind = why.kind
        if kind == "budget_usd":
            status, _ = ex.own_error("quota")
            what = ("budget per %s exhausted" % why.per) if why.per else (
                "is not configured" if why.reason == "missing" else "budget exhausted")
            ex.error(status, "quota", "You have exceeded your current quota (group '%s' %s). "
                     "Please check your plan and billing details." % (why.group, what))
            return
        if kind == "concurrent":
            ex.error(429, "rate_limit", "Rate limit exceeded (group '%s': concurrent requests). "
                     "Please retry shortly." % why.group)
            return
        ex.error(429, "rate_limit", "Rate limit exceeded (group '%s': %s per %s). Please retry "
                 "after the indicated time." % (why.group, kind, why.per), retry_after=why.retry_after)

    # ------------------------------------------------------------------ after
    def settle(self, ex, ticket, gov, rec_key, lane_name, usage, status):
        ledger = self.ledger
        ok = status is not None and 200 <= status < 300
        if ledger.remote:
            pool = ticket.pool if ticket is not None else (ex.target.name if ex.target else None)
            self._settle_remote(ex, ticket, gov, rec_key, lane_name, pool, usage, ok)
            return
        if ticket is not None:
            ledger.admission.settle(ticket, usage, lane_name, ok)
            pool = ticket.pool
        else:
            pool = ex.target.name if ex.target else None
        if self.batcher is not None:
            self.batcher.add(rec_key.id, rec_key.group, lane_name, pool, usage, ok)

    def _settle_remote(self, ex, ticket, gov, rec_key, lane_name, pool, usage, ok):
        inp = out = cr = cw = 0
        if usage is not None:
            inp, out = usage.input_tokens, usage.output_tokens
            cr, cw = usage.cache_read_tokens, usage.cache_write_tokens
        checks = ticket.checks if ticket is not None else ()
        reserve = ticket.reserve if ticket is not None else 0
        cost = 0
        if reserve and self._needs_cost:
            card = gov.rate_card
            rate = card.get(lane_name) if (card and lane_name) else None
            cost = rate.nano(inp, out, cr, cw) if rate is not None else 0
        model = ex.snap.config.models.get(lane_name) if lane_name else None
        self.ledger.settle(checks, reserve, Usage(
            day_of(time.time()), rec_key.id, rec_key.group, lane_name, pool, 1, inp, out, cr, cw,
            1 if ok else 0, model.provider.name if model is not None else ""), ok, cost, gov.fee)
