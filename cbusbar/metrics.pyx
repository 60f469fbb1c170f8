# cython: language_level=3
"""The metrics' hot path: counting one finished request into the shared counters
(busbar/observability/metrics.py lays the slots out, renders them, and keeps the rare paths).

`Counting.on_finish(rec)` is the finish hook. It reads the RequestRecord's typed slots
(cbusbar/record.pyx) and adds to the SharedCounters mapping with the CPU's atomic add, no Python
call in between: the Python hook it replaces made ten calls into `SharedCounters.add` (an int
object and an argument parse each) and a dozen int objects for the slot arithmetic, ~11k
instructions a request in a tight loop against ~1k here (callgrind). What is counted: the requests
row (busbar's outcome crossed with the answer's status class, so one add serves both
busbar_requests_total and busbar_request_outcomes_total), busbar's own time and the upstream time
histograms, the end-to-end time (cumulative sum and count, and the rolling window the quantiles
are read from), the attempt of a request that succeeded at once (failovers and failures go through
`Metrics._attempts`, the rare path, in Python), translations, tokens, and admission refusals.

The rolling window: the end-to-end times of the last `buffer_seconds` go into one of four rings
of log-spaced buckets (plus the ring's min and max), a ring per third of the window, chosen by the
request's end time (CLOCK_MONOTONIC, one clock for every worker). A ring is emptied by the first
request that finds it marked for an older third (a compare-and-swap on its marker decides which
worker empties it), so nothing runs between requests; a scrape reads the rings marked for the
current third and the two before it. The fourth ring is the one about to be reused. An add that
lands in the microseconds between a ring's new marker and the end of its emptying is lost: at most
a few requests per third of a window, and only from workers racing at its boundary.
"""
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject
from libc.string cimport memset

from cbusbar.ir cimport Usage
from cbusbar.record cimport RecordHook, RequestRecord
from cbusbar.shared cimport SharedCounters

cdef extern from *:
    """
    #include "port.h"
    static inline void bb_metrics_add(long long *p, long long d) {
        bb_atomic_add_fetch_relaxed(p, d);
    }
    static inline long long bb_metrics_load(long long *p) {
        return bb_atomic_load_relaxed(p);
    }
    static inline int bb_metrics_cas(long long *p, long long expected, long long v) {
        return bb_atomic_cas_seq_cst(p, &expected, v);
    }
    /* min (lower) or max (!lower) of a slot where 0 means "none yet" */
    static inline int bb_metrics_msb(unsigned long long v) {
        return 63 - bb_clzll(v);
    }
    static inline void bb_metrics_extreme(long long *p, long long v, int lower) {
        long long cur = bb_atomic_load_relaxed(p);
        while (cur == 0 || (lower ? v < cur : v > cur)) {
            if (bb_atomic_cas_relaxed(p, &cur, v))
                return;
        }
    }
    """
    void bb_metrics_add(long long *p, long long d) nogil
    long long bb_metrics_load(long long *p) nogil
    int bb_metrics_cas(long long *p, long long expected, long long v) nogil
    void bb_metrics_extreme(long long *p, long long v, int lower) nogil
    int bb_metrics_msb(unsigned long long v) nogil

DEF MAX_BOUNDS = 64
DEF PER_OCTAVE = 8          # metrics.py's E2E_PER_OCTAVE

# The status classes of busbar_requests_total's `outcome` (the Rust gateway's words, from the
# status the client was answered), and a fifth column for no answer at all (the client left
# first), which that series leaves out. metrics.py's STATUS_OUTCOMES names them in this order.
DEF R_OK = 0
DEF R_EXHAUSTED = 1
DEF R_CLIENT_ERROR = 2
DEF R_ERROR = 3
DEF R_NONE = 4
DEF N_R = 5


cdef inline int status_class(long long status) noexcept:
    if status == 0:
        return R_NONE
    if 200 <= status < 300:
        return R_OK
    if status == 503:
        return R_EXHAUSTED
    if 400 <= status < 500:
        return R_CLIENT_ERROR
    return R_ERROR


def status_outcome(long long status):
    """The `outcome` index of busbar_requests_total for a status (R_NONE: not counted there)."""
    return status_class(status)


cdef class Bases:
    """The slot bases of one (ingress, target, lane): see Metrics._bases."""
    cdef int req, hist, uph, fo, tok, ing, att, e2e, row


cdef class Counting(RecordHook):
    cdef SharedCounters c
    cdef long long* p
    cdef int size
    cdef dict cache             # Metrics.cache: (ingress, target, lane) -> Bases
    cdef object metrics         # the Python Metrics: slot bases on a miss, the rare paths
    cdef dict out_i             # outcome -> index in the requests row
    cdef dict ing_i             # protocol -> index
    cdef dict gate_i            # denied gate -> index
    cdef long long req_bounds[MAX_BOUNDS]
    cdef long long up_bounds[MAX_BOUNDS]
    cdef int n_req, n_up
    cdef int n_ing, translations, admission, denied
    cdef long shed_i           # the shed outcome's index in out_i (-1: none)
    # The rolling window (see the module docstring): the rings' markers, the first ring's base,
    # one ring's size, a row's size (buckets, min, max), the buckets, the third of the window in ns,
    # and what emptying a ring takes: the rows of each ingress protocol for the pools named so far.
    cdef int markers, ring0, ring_size, row_size, n_e2e, rows_per_ingress
    cdef int n_rows_named
    cdef long long third_ns
    # A time's bucket without a logarithm: the bucket of 2**min_exp ns is 1, and each octave
    # above it has PER_OCTAVE, found from the top 8 bits under its highest set bit (`octave`:
    # floor(PER_OCTAVE * log2(1 + m/256)) for each; a time just past a bucket's edge may fall in
    # the one below, 0.4 % at most). A libm log2 was ~115 instructions a request (callgrind).
    cdef int min_exp
    cdef unsigned char octave[256]
    # The last (ingress, target, lane) and its Bases: the names are the config's own str objects,
    # the same ones request after request, so `is` finds them without the key tuple, its hash and
    # the dict lookup (~450 instructions). Forgotten with the cache (`forget`, Layout.adopt).
    cdef object last_ing, last_target, last_lane
    cdef Bases last

    def __init__(self, metrics, SharedCounters counters, req_bounds_ns, up_bounds_ns, dict out_i,
                 dict ing_i, dict gate_i, int translations, int admission, int denied, shed,
                 window):
        cdef int i
        if len(req_bounds_ns) > MAX_BOUNDS or len(up_bounds_ns) > MAX_BOUNDS:
            raise ValueError("too many histogram buckets")
        self.metrics = metrics
        self.c = counters
        self.p = counters.p
        self.size = counters.size
        self.cache = metrics.cache
        self.out_i = out_i
        self.ing_i = ing_i
        self.gate_i = gate_i
        self.n_req = len(req_bounds_ns)
        for i in range(self.n_req):
            self.req_bounds[i] = req_bounds_ns[i]
        self.n_up = len(up_bounds_ns)
        for i in range(self.n_up):
            self.up_bounds[i] = up_bounds_ns[i]
        self.n_ing = len(ing_i)
        self.translations = translations
        self.admission = admission
        self.denied = denied
        self.shed_i = out_i.get(shed, -1)
        (self.markers, self.ring0, self.ring_size, self.row_size, self.n_e2e,
         self.rows_per_ingress, self.third_ns, self.min_exp, octave) = window
        if len(octave) != 256 or not 9 <= self.min_exp < 60:
            raise ValueError("the end-to-end buckets' table")
        for i in range(256):
            self.octave[i] = octave[i]
        self.n_rows_named = 0

    cdef inline void add(self, long i, long long d) noexcept:
        if 0 <= i < self.size:
            bb_metrics_add(self.p + i, d)

    cdef Bases bases(self, key):
        cdef PyObject* hit = PyDict_GetItem(self.cache, key)
        if hit != NULL:
            return <Bases>hit
        t = self.metrics._bases(key)
        cdef Bases b = Bases.__new__(Bases)
        b.req, b.hist, b.uph, b.fo, b.tok, b.ing, b.att, b.e2e, b.row = t
        self.metrics.keep(key, b)
        return b

    def forget(self, int named_pools):
        """Drops the last names' bases; `named_pools`: how many pool names have slots now."""
        self.last = None
        self.n_rows_named = named_pools

    cdef void take_ring(self, int r, long long third) noexcept:
        """Empties ring r for `third` (whichever worker's compare-and-swap wins does it)."""
        cdef long long* m = self.p + self.markers + r
        cdef long long old = bb_metrics_load(m)
        cdef int i
        cdef long base
        if old >= third + 1 or not bb_metrics_cas(m, old, third + 1):
            return
        for i in range(self.n_ing):
            base = self.ring0 + <long>r * self.ring_size + <long>i * self.rows_per_ingress * \
                self.row_size
            if base >= 0 and base + <long>self.n_rows_named * self.row_size <= self.size:
                memset(self.p + base, 0, 8 * <size_t>self.n_rows_named * <size_t>self.row_size)

    cdef inline void end_to_end(self, Bases b, long long t_end, long long ns) noexcept:
        cdef long long third = t_end // self.third_ns
        cdef int r = <int>(third & 3)
        cdef int k, e
        cdef long row
        cdef long long m = bb_metrics_load(self.p + self.markers + r)
        self.add(b.e2e, ns)
        self.add(b.e2e + 1, 1)
        if m != third + 1:
            if m > third + 1:
                return      # the ring already serves a later third (a request that ended late)
            self.take_ring(r, third)
        if ns < 1:
            ns = 1
        if ns < (1LL << self.min_exp):
            k = 0
        else:
            e = bb_metrics_msb(<unsigned long long>ns)
            k = 1 + (e - self.min_exp) * PER_OCTAVE + self.octave[(ns >> (e - 8)) & 0xFF]
            if k >= self.n_e2e:
                k = self.n_e2e - 1
        row = self.ring0 + <long>r * self.ring_size + <long>b.row * self.row_size
        if 0 <= row and row + self.row_size <= self.size:
            bb_metrics_add(self.p + row + k, 1)
            bb_metrics_extreme(self.p + row + self.n_e2e, ns, 1)
            bb_metrics_extreme(self.p + row + self.n_e2e + 1, ns, 0)

    cpdef on_finish(self, RequestRecord rec):
        cdef Bases b = self.last
        if b is None or rec.ingress is not self.last_ing or rec.target is not self.last_target \
                or rec.lane is not self.last_lane:
            b = self.last = self.bases((rec.ingress, rec.target, rec.lane))
            self.last_ing, self.last_target, self.last_lane = rec.ingress, rec.target, rec.lane
        cdef PyObject* o = PyDict_GetItem(self.out_i, rec.outcome)
        cdef bint known = o != NULL
        cdef long oi = <long>(<object>o) if known else 0
        cdef int sc = status_class(rec.status)
        cdef long long ns = rec.busbar_ns
        cdef int k = 0
        self.add(b.req + oi * N_R + sc, 1)
        while k < self.n_req and self.req_bounds[k] < ns:     # bisect_left
            k += 1
        self.add(b.hist + k, 1)
        self.add(b.hist + self.n_req + 1, ns)
        if sc != R_NONE and b.e2e >= 0:
            self.end_to_end(b, rec.t_end, rec.t_end - rec.t0)
        ns = rec.upstream_ns
        if ns:
            k = 0
            while k < self.n_up and self.up_bounds[k] < ns:
                k += 1
            self.add(b.uph + k, 1)
            self.add(b.uph + self.n_up + 1, ns)
        # Attempts are counted here, at the request's end, not by an attempt hook: one hook call
        # less per attempt.
        atts = rec.attempts
        if rec.failed == 0 and len(atts) == 1:
            if b.att >= 0:
                self.add(b.att, 1)
        elif atts:
            self.metrics._attempts(rec, b.fo)
        eg = rec.egress
        if eg is not None and eg != rec.ingress:
            o = PyDict_GetItem(self.ing_i, eg)
            if o != NULL:
                self.add(self.translations + b.ing * self.n_ing + <long>(<object>o), 1)
        u = rec.usage
        cdef Usage usage
        if u is not None and b.tok >= 0:
            if isinstance(u, Usage):
                usage = <Usage>u
                if usage.input_tokens:
                    self.add(b.tok, usage.input_tokens)
                if usage.output_tokens:
                    self.add(b.tok + 1, usage.output_tokens)
                if usage.cache_read_tokens:
                    self.add(b.tok + 2, usage.cache_read_tokens)
            else:
                for k, x in enumerate((u.input_tokens, u.output_tokens, u.cache_read_tokens)):
                    if x:
                        self.add(b.tok + k, x)
        if known and oi == self.shed_i:
            self.add(self.admission, 1)      # gate "inbound": the first of metrics.py's GATES
        elif rec.denied is not None:
            o = PyDict_GetItem(self.gate_i, rec.denied)
            self.add(self.denied + (<long>(<object>o) if o != NULL else 0), 1)
