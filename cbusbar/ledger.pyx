# cython: language_level=3, boundscheck=False, wraparound=False
"""Governance counters shared by every worker of one gateway (SPEC §5; busbar/governance/ledger.py).

One anonymous MAP_SHARED mapping made before the workers fork (on Windows, where busbar runs in
one process, a private one: cbusbar.shared.anonymous_mapping): a lock word and an open-addressing
table of buckets (key hash, window id, value). Admission of one request takes every check of its
group chain at once under the lock: it finds (or claims) each bucket, rolls a bucket whose window
has passed to 0, tests all the checks, and charges them all or none. The critical section is C with
no Python call and no allocation, a few hundred nanoseconds, so a spin lock serves; a holder that
died (kill -9 in those nanoseconds) is detected by its pid and the lock is taken over.

Why not one atomic per counter: "all or nothing" across a chain of limits needs the test of every
counter and the charge of every counter to be one step, or two requests can each pass half.
"""
import os

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE
from cpython.mem cimport PyObject_Free, PyObject_Malloc
from libc.stdint cimport uint64_t

from cbusbar.ir cimport Usage
from cbusbar.shared import anonymous_mapping

cdef extern from *:
    """
    #include "port.h"
    static inline int bb_cas(long long *p, long long expected, long long v) {
        return bb_atomic_cas_acquire(p, &expected, v);
    }
    static inline long long bb_load(long long *p) { return bb_atomic_load_acquire(p); }
    static inline void bb_release(long long *p) { bb_atomic_store_release(p, 0); }
    static inline int bb_dead(long long pid) { return bb_pid_dead(pid); }
    static inline void bb_yield(void) { bb_sched_yield(); }
    """
    int bb_cas(long long *p, long long expected, long long v) nogil
    long long bb_load(long long *p) nogil
    void bb_release(long long *p) nogil
    int bb_dead(long long pid) nogil
    void bb_yield() nogil

# Check modes: FIT = value + charge <= limit (requests, concurrent, budget reservations);
# BELOW = value < limit (tokens: post-paid, the charge comes at settlement).
FIT = 0
BELOW = 1
DENIED_FULL = -2        # the table has no free bucket: admission fails closed
OK = -1

cdef enum:
    HEADER = 8           # lock word + spare
    STRIDE = 3           # per bucket: key hash (0 = empty), window id, value


cdef inline uint64_t _h(object key):
    cdef uint64_t h = <uint64_t>hash(key)
    # 0 marks an empty bucket: fold it away.
    return h if h != 0 else 1


cdef inline int _tokens(object usage, long long* inp, long long* out, long long* cr,
                        long long* cw) except -1:
    """The four token counts of an ir.Usage (typed reads), or of any object with those
    attributes."""
    cdef Usage u
    if isinstance(usage, Usage):
        u = <Usage>usage
        inp[0], out[0], cr[0], cw[0] = u.input_tokens, u.output_tokens, u.cache_read_tokens, \
            u.cache_write_tokens
    else:
        inp[0], out[0] = usage.input_tokens, usage.output_tokens
        cr[0], cw[0] = usage.cache_read_tokens, usage.cache_write_tokens
    return 0

cdef class LimitTable:
    cdef object mm
    cdef Py_buffer view
    cdef long long* p
    cdef readonly int buckets
    cdef long long pid

    def __cinit__(self, int buckets):
        if buckets < 16:
            buckets = 16
        self.buckets = buckets
        self.mm = anonymous_mapping(8 * (HEADER + STRIDE * buckets))
        PyObject_GetBuffer(self.mm, &self.view, PyBUF_WRITABLE)
        self.p = <long long*>self.view.buf
        self.pid = os.getpid()

    def __dealloc__(self):
        if self.p != NULL:
            PyBuffer_Release(&self.view)
            self.p = NULL

    def forked(self):
        """Call in a forked worker: the lock is taken in this process's name."""
        self.pid = os.getpid()

    cdef void _lock(self):
        cdef long long spins = 0
        cdef long long owner
        while not bb_cas(self.p, 0, self.pid):
            spins += 1
            if spins % 64 == 0:
                bb_yield()
            if spins % 100000 == 0:
                owner = bb_load(self.p)
                if owner != 0 and bb_dead(owner):
                    bb_cas(self.p, owner, 0)

    cdef inline void _unlock(self):
        bb_release(self.p)

    cdef long long* _find(self, uint64_t h, bint claim):
        """The bucket of key hash h (claimed if absent and claim); NULL when absent / full.
        Caller holds the lock."""
        cdef int n = self.buckets
        cdef int i = <int>(h % <uint64_t>n)
        cdef int _probe
        cdef long long* b
        for _probe in range(n):
            b = self.p + HEADER + STRIDE * i
            if <uint64_t>b[0] == h:
                return b
            if b[0] == 0:
                if not claim:
                    return NULL
                b[0] = <long long>h
                b[1] = 0
                b[2] = 0
                return b
            i += 1
            if i == n:
                i = 0
        return NULL

    def admit(self, list checks):
        """checks: [(key, window, mode, limit, charge)]. Returns OK (-1) when every check passed
        and all were charged; else the index of the first failing check (nothing charged), or
        DENIED_FULL."""
        cdef int n = len(checks)
        cdef int i
        cdef long long* b
        cdef long long window, limit, charge, value
        cdef int mode
        cdef long long* found[64]
        if n > 64:
            raise ValueError("too many checks")
        self._lock()
        try:
            for i in range(n):
                key, w, m, lim, ch = checks[i]
                b = self._find(_h(key), True)
                if b == NULL:
                    return DENIED_FULL
                window = w
                if b[1] != window:
                    b[1] = window
                    b[2] = 0
                value = b[2]
                mode = m
                limit = lim
                charge = ch
                if mode == FIT:
                    if value + charge > limit:
                        return i
                elif value >= limit:
                    return i
                found[i] = b
            for i in range(n):
                found[i][2] += <long long>checks[i][4]
            return OK
        finally:
            self._unlock()

    def settle(self, list deltas):
        """deltas: [(key, window, delta)]: added to the bucket if it still holds that window (a
        window that rolled meanwhile keeps its fresh count)."""
        cdef long long* b
        cdef long long window, d
        self._lock()
        try:
            for key, w, dd in deltas:
                d = dd
                if d == 0:
                    continue
                b = self._find(_h(key), False)
                window = w
                if b != NULL and b[1] == window:
                    b[2] += d
        finally:
            self._unlock()

    def value(self, key, long long window):
        cdef long long* b
        self._lock()
        try:
            b = self._find(_h(key), False)
            if b == NULL or b[1] != window:
                return 0
            return b[2]
        finally:
            self._unlock()

    def seed(self, key, long long window, long long value):
        """Sets a bucket's window and value (boot: counts carried over from the store)."""
        cdef long long* b
        self._lock()
        try:
            b = self._find(_h(key), True)
            if b == NULL:
                return False
            b[1] = window
            b[2] = value
            return True
        finally:
            self._unlock()

    def used(self):
        cdef int i, n = 0
        for i in range(self.buckets):
            if self.p[HEADER + STRIDE * i] != 0:
                n += 1
        return n


# ---------------------------------------------------------------------------- admission plans
# What busbar/governance/gate.py's local path hands over per request: a Plan (one group chain's
# limits for one pool, built once and cached by the gate) and the reservation; what comes back
# is a Ticket (the windows and charges taken) or the index of the check that refused. Built in C
# so a request costs no tuple per check and no Python call per step: the tuple path (plan(),
# LocalLedger.admit, settle) was ~20k instructions of the ~64k the keys added (callgrind,
# bench/inproc.py --keys sqlite).

cdef extern from *:
    """
    #include <math.h>
    #include "port.h"
    /* No fused multiply-add: the result must be Python's, bit for bit. */
    BB_NO_FP_CONTRACT
    static long long bb_nano(double rin, double rout, double rcr, double rcw,
                             long long i, long long o, long long cr, long long cw) {
        BB_NO_FP_CONTRACT_BODY
        double x = (double)i * rin + (double)o * rout;
        x = x + (double)cr * rcr;
        x = x + (double)cw * rcw;
        return (long long)nearbyint(1000.0 * x);
    }
    """
    long long bb_nano(double rin, double rout, double rcr, double rcw,
                      long long i, long long o, long long cr, long long cw) nogil


# Limit kinds (busbar/governance/model.py LIMIT_KINDS) and periods (PERIODS; NONE: concurrent).
cdef enum:
    K_REQUESTS = 0
    K_TOKENS = 1
    K_BUDGET = 2
    K_CONCURRENT = 3
    MAX_CHECKS = 64
    N_PERIODS = 6

_KINDS = {"requests": K_REQUESTS, "tokens": K_TOKENS, "budget_usd": K_BUDGET,
          "concurrent": K_CONCURRENT}
PERIOD_INDEX = {None: 0, "minute": 1, "hour": 2, "day": 3, "month": 4, "total": 5}

cdef extern from "<math.h>" nogil:
    double INFINITY


cdef class Plan:
    """The checks of one group chain for one pool, in order: bucket, kind, limit, period.
    `chain` is the gate's tuple of (bucket key, kind, amount, per, group name), kept for refusals
    (which check, which group) and for the stores that take tuples (Redis)."""
    cdef readonly int n
    cdef readonly bint has_budget
    cdef readonly tuple chain
    cdef uint64_t hash[MAX_CHECKS]
    cdef int kind[MAX_CHECKS]
    cdef long long limit[MAX_CHECKS]
    cdef int per[MAX_CHECKS]

    def __init__(self, tuple chain):
        cdef int i
        if len(chain) > MAX_CHECKS:
            raise ValueError("too many checks")
        self.chain = chain
        self.n = len(chain)
        self.has_budget = False
        for i, (bucket, kind, amount, per, _name) in enumerate(chain):
            self.hash[i] = _h(bucket)
            self.kind[i] = _KINDS[kind]
            self.limit[i] = amount
            self.per[i] = PERIOD_INDEX[per]
            if self.kind[i] == K_BUDGET:
                self.has_budget = True


cdef class Ticket:
    """What one admission took: the window of each check and its charge (the reservation for a
    budget). Settled once, at the request's end."""
    cdef readonly Plan plan
    cdef readonly long long reserve
    cdef readonly double now
    cdef public object pool
    cdef public object prices           # the rate card as {model: Price}, for the actual cost
    cdef public long long fee           # per_request_fee reserved (nano-units), kept on a 2xx
    # plan.n windows then plan.n charges, in one small block: inline arrays for MAX_CHECKS made
    # the object 1 KiB, past pymalloc's 512 bytes (a malloc and a memset per request).
    cdef long long* window
    cdef long long* charge

    def __dealloc__(self):
        if self.window != NULL:
            PyObject_Free(self.window)
            self.window = NULL

    def charges(self):
        return [self.charge[i] for i in range(self.plan.n)] if self.window != NULL else []

    def windows(self):
        return [self.window[i] for i in range(self.plan.n)] if self.window != NULL else []


cdef class Pass:
    """What one key may take on one target, decided once by the gate (pool ACL, rate card
    coverage, the group chain): the chain's Plan (None: nothing to take), the reservation's
    Pricing (None: no rate card), the pool, the card's prices for settlement, and the flat
    `per_request_fee` in nano-units (charged to every budget with the tokens' reservation)."""
    cdef readonly Plan plan
    cdef readonly Pricing pricing
    cdef readonly object pool
    cdef readonly object prices
    cdef readonly long long fee

    def __init__(self, Plan plan, Pricing pricing, pool, prices, long long fee=0):
        self.plan = plan if plan is not None and plan.n else None
        self.pricing = pricing
        self.pool = pool
        self.prices = prices
        self.fee = fee


cdef class Admission:
    """One worker's admission against the shared LimitTable: the current window of each period
    (recomputed when it rolls, through `window_of(per, now)`: busbar/governance/model.py window)."""
    cdef readonly LimitTable table
    cdef object window_of
    cdef tuple periods
    cdef long long wid[N_PERIODS]
    cdef double roll_at[N_PERIODS]      # when the window rolls; INFINITY: never; -1: not known

    def __init__(self, LimitTable table, window_of):
        cdef int i
        self.table = table
        self.window_of = window_of
        self.periods = tuple(sorted(PERIOD_INDEX, key=PERIOD_INDEX.get))
        for i in range(N_PERIODS):
            self.roll_at[i] = -1

    cdef inline long long _window(self, int per, double now) except? -1:
        if self.roll_at[per] < 0 or now >= self.roll_at[per]:
            wid, roll = self.window_of(self.periods[per], now)
            self.wid[per] = wid
            self.roll_at[per] = INFINITY if roll is None else now + roll
        return self.wid[per]

    def roll(self, int per, double now):
        """Seconds until the window of period index `per` rolls (None: never), as of `now`."""
        if self.roll_at[per] < 0 or self.roll_at[per] == INFINITY:
            return None
        return self.roll_at[per] - now

    def take(self, Pass p, bytes body, spans, codec, bint no_output, double now,
             int bytes_per_token, fallback):
        """One request under a Pass: its reservation (Pricing.reserve, when the chain has a
        budget, plus the flat fee), then `admit`. None when there is nothing to take."""
        cdef Plan plan = p.plan
        cdef long long reserve = 0
        if plan is None:
            return None
        if plan.has_budget:
            if p.pricing is not None:
                reserve = p.pricing.reserve(body, spans, codec, no_output, bytes_per_token,
                                            fallback)
            reserve += p.fee
        t = self.admit(plan, reserve, now)
        if type(t) is Ticket:
            (<Ticket>t).pool = p.pool
            (<Ticket>t).prices = p.prices
            (<Ticket>t).fee = p.fee if plan.has_budget else 0
        return t

    def admit(self, Plan plan, long long reserve, double now):
        """Every check of `plan` taken at once (FIT: value + charge <= limit for requests, budget,
        concurrent; BELOW: value < limit for tokens), or none. A Ticket, or the index of the first
        check that refused, or DENIED_FULL."""
        cdef Ticket t = Ticket.__new__(Ticket)
        cdef int i, n = plan.n, k
        cdef long long* b
        cdef long long* found[MAX_CHECKS]
        cdef LimitTable table = self.table
        t.window = <long long*>PyObject_Malloc(sizeof(long long) * 2 * (n if n > 0 else 1))
        if t.window == NULL:
            raise MemoryError()
        t.charge = t.window + n
        t.plan = plan
        t.reserve = reserve
        t.now = now
        for i in range(n):
            t.window[i] = self._window(plan.per[i], now)
            k = plan.kind[i]
            t.charge[i] = reserve if k == K_BUDGET else (0 if k == K_TOKENS else 1)
        table._lock()
        try:
            for i in range(n):
                b = table._find(plan.hash[i], True)
                if b == NULL:
                    return DENIED_FULL
                if b[1] != t.window[i]:
                    b[1] = t.window[i]
                    b[2] = 0
                if plan.kind[i] == K_TOKENS:
                    if b[2] >= plan.limit[i]:
                        return i
                elif b[2] + t.charge[i] > plan.limit[i]:
                    return i
                found[i] = b
            for i in range(n):
                found[i][2] += t.charge[i]
        finally:
            table._unlock()
        return t

    def settle(self, Ticket t, usage, lane, bint ok=True):
        """The request's end: a concurrent slot back, its tokens added, the reservation replaced
        by the actual cost (`t.prices`: model name -> Price, the rate card; `lane`: the model that
        answered; the flat fee when `ok`, a 2xx: a refused request pays none); each to the bucket
        only if it still holds the window it was taken in (a window that rolled meanwhile keeps
        its fresh count)."""
        cdef Plan plan = t.plan
        cdef int i, k
        cdef long long d, inp = 0, out = 0, cr = 0, cw = 0, cost = 0
        cdef long long* b
        cdef LimitTable table = self.table
        cdef Price price
        if t.window == NULL:
            raise ValueError("not a ticket Admission.admit made")
        if usage is not None:
            _tokens(usage, &inp, &out, &cr, &cw)
        prices = t.prices
        if plan.has_budget and prices and lane:
            p = prices.get(lane)
            if p is not None:
                price = <Price?>p
                cost = bb_nano(price.input, price.output, price.cache_read, price.cache_write,
                               inp, out, cr, cw)
        if ok:
            cost += t.fee
        table._lock()
        try:
            for i in range(plan.n):
                k = plan.kind[i]
                if k == K_REQUESTS:
                    continue
                elif k == K_CONCURRENT:
                    d = -1
                elif k == K_TOKENS:
                    # every tier, as the Rust ledger's total_tokens counts a tokens limit
                    d = inp + out + cr + cw
                else:
                    d = cost - t.charge[i]
                if d == 0:
                    continue
                b = table._find(plan.hash[i], False)
                if b != NULL and b[1] == t.window[i]:
                    b[2] += d
        finally:
            table._unlock()


# ---------------------------------------------------------------------------- prices
# The rate card's arithmetic in C, for the reservation (worst case over a target's lanes) and the
# settlement (the actual cost): busbar/governance/model.py Rate.nano exactly, the same double
# operations in the same order, rounded half to even as Python's round() (nearbyint in the
# default rounding mode), without a Python call, a float object and an int-to-float conversion
# per term.

cdef class Price:
    """A Rate (USD per million tokens) for C: `nano(...)` is Rate.nano."""
    cdef readonly double input, output, cache_read, cache_write

    def __init__(self, rate):
        self.input = rate.input
        self.output = rate.output
        self.cache_read = rate.cache_read
        self.cache_write = rate.cache_write

    cpdef long long nano(self, long long input_tokens, long long output_tokens,
                         long long cache_read=0, long long cache_write=0):
        return bb_nano(self.input, self.output, self.cache_read, self.cache_write,
                       input_tokens, output_tokens, cache_read, cache_write)


cdef bint _digits(bytes body, Py_ssize_t start, Py_ssize_t stop, long long* out):
    """body[start:stop] is 1-11 ASCII digits (bytes.isdigit, and shorter than 12): its value."""
    cdef Py_ssize_t n = stop - start, i
    cdef const unsigned char* s
    cdef long long v = 0
    if n < 1 or n >= 12 or start < 0 or stop > len(body):
        return False
    s = <const unsigned char*><const char*>body + start
    for i in range(n):
        if s[i] < 48 or s[i] > 57:
            return False
        v = v * 10 + (s[i] - 48)
    out[0] = v
    return True


cdef class Pricing:
    """A target's lanes for the budget reservation: each priced lane's rate and output cap when
    the caller set none (its model's default_max_tokens, else the gateway's)."""
    cdef int n
    cdef double rin[MAX_CHECKS]
    cdef double rout[MAX_CHECKS]
    cdef long long out_default[MAX_CHECKS]

    def __init__(self, lanes):
        """lanes: [(Price, default output tokens)], the lanes without a rate left out."""
        cdef Price p
        self.n = 0
        for p, out in lanes[:MAX_CHECKS]:
            self.rin[self.n] = p.input
            self.rout[self.n] = p.output
            self.out_default[self.n] = out
            self.n += 1

    def reserve(self, bytes body, spans, codec, bint no_output, int bytes_per_token, fallback):
        """The budget reservation of a request: its input estimated from the body's size, its
        output cap read where the codec says it lives (codec.MAX_TOKENS_PATH, top-level members
        of `spans`, the body's one scan; a nested path: `fallback(codec, body, spans)`, the gate's
        requested_max_tokens), each lane's default without one."""
        cdef long long est_in = len(body) // bytes_per_token + 1
        cdef long long max_out = 0
        if no_output:
            return self.worst(est_in, 0, True)
        paths = codec.MAX_TOKENS_PATH
        for path in paths:
            if len(path) != 1:
                max_out = fallback(codec, body, spans) or 0
                break
            sp = spans.get(path[0]) if spans is not None else None
            if sp is not None and _digits(body, sp[0], sp[1], &max_out):
                break
        return self.worst(est_in, max_out, False)

    cpdef long long worst(self, long long est_in, long long max_out, bint no_output):
        """The dearest lane's cost of est_in input tokens and max_out output tokens (0: each
        lane's default; no_output: none, as for embeddings)."""
        cdef int i
        cdef long long worst = 0, out, c
        for i in range(self.n):
            out = 0 if no_output else (max_out if max_out else self.out_default[i])
            c = bb_nano(self.rin[i], self.rout[i], 0.0, 0.0, est_in, out, 0, 0)
            if c > worst:
                worst = c
        return worst


# ---------------------------------------------------------------------------- the gate's caches
cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec

# clock_gettime, or on Windows GetSystemTimePreciseAsFileTime (port.h)
cdef extern from "port.h" nogil:
    int BB_CLOCK_REALTIME
    int bb_clock_gettime(int clk, timespec *tp)


cdef class Credentials:
    """Tokens whose MAC busbar/governance/gate.py already verified, by the raw header value they
    came in: Authorization (a Bearer value) in `by_auth`; x-api-key or x-goog-api-key, when there
    is no Authorization header, in `by_key` (where credential() looks, in its order). Each maps
    to (key id, exp, generation, signing key)."""
    cdef public dict by_auth
    cdef public dict by_key

    def __init__(self):
        self.by_auth = {}
        self.by_key = {}

    def accept(self, headers, signing_key, dict keys, double now):
        """The KeyRecord of a remembered token, if it is still good (not expired, the key's
        generation, active, not past its own expiry); else None (the gate's whole path decides)."""
        v = headers.get(b"authorization")
        if v is not None:
            c = self.by_auth.get(v)
        else:
            v = headers.get(b"x-api-key")
            if v is None:
                v = headers.get(b"x-goog-api-key")
            c = self.by_key.get(v) if v is not None else None
        if c is None:
            return None
        kid, exp, gen, sk = <tuple>c
        if sk is not signing_key or (exp is not None and exp <= now):
            return None
        rec = keys.get(kid)
        if rec is None or rec.gen != gen or rec.state != "active":
            return None
        exp = rec.expires
        if exp is not None and exp <= now:
            return None
        return rec

    def remember(self, headers, tuple claims, int cap):
        v = headers.get(b"authorization")
        if v is not None:
            if v[:7].lower() != b"bearer ":
                return
            cache = self.by_auth
        else:
            v = headers.get(b"x-api-key")
            if v is None:
                v = headers.get(b"x-goog-api-key")
            if v is None:
                return
            cache = self.by_key
        if len(cache) >= cap:
            cache.clear()
        cache[v] = claims


cdef class UsageRows:
    """Usage summed per (day, key, group, model, pool): `rows` maps each to [requests, input,
    output, cache read, cache write, billable requests] (billable: answered 2xx, the Rust ledger's
    fee base; busbar/governance/model.py USAGE_FIELDS). `add` dates the row itself (UTC day, `day_of(now)` once a
    day) and calls `schedule()` when the first row of a batch arrives (busbar/governance/gate.py
    UsageBatcher flushes)."""
    cdef public dict rows
    cdef public object handle
    cdef object day_of
    cdef long long day_n
    cdef object day

    def __init__(self, day_of):
        self.rows = {}
        self.handle = None
        self.day_of = day_of
        self.day_n = -1
        self.day = None

    def schedule(self):
        """The subclass's hook, called with the first row of a batch: arm the flush
        (UsageBatcher.schedule does, on its event loop). UsageRows alone has no loop to arm."""
        raise NotImplementedError("UsageRows.schedule is the subclass's (UsageBatcher's)")

    def add(self, key_id, group, model, pool, usage, bint billable=True):
        cdef timespec ts
        cdef long long inp = 0, out = 0, cr = 0, cw = 0
        bb_clock_gettime(BB_CLOCK_REALTIME, &ts)
        if ts.tv_sec // 86400 != self.day_n:
            self.day = self.day_of(<double>ts.tv_sec + <double>ts.tv_nsec * 1e-9)
            self.day_n = ts.tv_sec // 86400
        if usage is not None:
            _tokens(usage, &inp, &out, &cr, &cw)
        k = (self.day, key_id, group, model, pool)
        cur = self.rows.get(k)
        if cur is None:
            self.rows[k] = [1, inp, out, cr, cw, 1 if billable else 0]
        else:
            row = <list>cur
            row[0] += 1
            row[1] += inp
            row[2] += out
            row[3] += cr
            row[4] += cw
            if billable:
                row[5] += 1
        if self.handle is None:
            self.schedule()
