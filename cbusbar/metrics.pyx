# cython: language_level=3
"""The metrics' hot path: counting one finished request into the shared counters
(busbar/observability/metrics.py lays the slots out, renders them, and keeps the rare paths).

`Counting.on_finish(rec)` is the finish hook. It reads the RequestRecord's typed slots
(cbusbar/record.pyx) and adds to the SharedCounters mapping with the CPU's atomic add, no Python
call in between: the Python hook it replaces made ten calls into `SharedCounters.add` (an int
object and an argument parse each) and a dozen int objects for the slot arithmetic, ~11k
instructions a request in a tight loop against ~1k here (callgrind). What is counted is unchanged:
the requests row by outcome, busbar's own time and the upstream time histograms, the attempt of a
request that succeeded at once (failovers and failures go through `Metrics._attempts`, the rare
path, in Python), translations, tokens, and admission refusals.
"""
from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

from cbusbar.ir cimport Usage
from cbusbar.record cimport RecordHook, RequestRecord
from cbusbar.shared cimport SharedCounters

cdef extern from *:
    """
    static inline void bb_metrics_add(long long *p, long long d) {
        __atomic_add_fetch(p, d, __ATOMIC_RELAXED);
    }
    """
    void bb_metrics_add(long long *p, long long d) nogil

DEF MAX_BOUNDS = 64


cdef class Bases:
    """The slot bases of one (ingress, target, lane): see Metrics._bases."""
    cdef int req, hist, uph, fo, tok, ing, att


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
    cdef int n_ing, translations, admission
    cdef long shed_i           # the shed outcome's index in out_i (-1: none)
    # The last (ingress, target, lane) and its Bases: the names are the config's own str objects,
    # the same ones request after request, so `is` finds them without the key tuple, its hash and
    # the dict lookup (~450 instructions). Forgotten with the cache (`forget`, Layout.adopt).
    cdef object last_ing, last_target, last_lane
    cdef Bases last

    def __init__(self, metrics, SharedCounters counters, req_bounds_ns, up_bounds_ns, dict out_i,
                 dict ing_i, dict gate_i, int translations, int admission, shed):
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
        self.shed_i = out_i.get(shed, -1)

    cdef inline void add(self, long i, long long d):
        if 0 <= i < self.size:
            bb_metrics_add(self.p + i, d)

    cdef Bases bases(self, key):
        cdef PyObject* hit = PyDict_GetItem(self.cache, key)
        if hit != NULL:
            return <Bases>hit
        t = self.metrics._bases(key)
        cdef Bases b = Bases.__new__(Bases)
        b.req, b.hist, b.uph, b.fo, b.tok, b.ing, b.att = t
        self.metrics.keep(key, b)
        return b

    def forget(self):
        self.last = None

    cpdef on_finish(self, RequestRecord rec):
        cdef Bases b = self.last
        if b is None or rec.ingress is not self.last_ing or rec.target is not self.last_target \
                or rec.lane is not self.last_lane:
            b = self.last = self.bases((rec.ingress, rec.target, rec.lane))
            self.last_ing, self.last_target, self.last_lane = rec.ingress, rec.target, rec.lane
        cdef PyObject* o = PyDict_GetItem(self.out_i, rec.outcome)
        cdef bint known = o != NULL
        cdef long oi = <long>(<object>o) if known else 0
        cdef long long ns = rec.busbar_ns
        cdef int k = 0
        self.add(b.req + oi, 1)
        while k < self.n_req and self.req_bounds[k] < ns:     # bisect_left
            k += 1
        self.add(b.hist + k, 1)
        self.add(b.hist + self.n_req + 1, ns)
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
            self.metrics._attempts(rec.target, atts, b.fo)
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
            self.add(self.admission, 1)
        elif rec.denied is not None:
            o = PyDict_GetItem(self.gate_i, rec.denied)
            self.add(self.admission + (<long>(<object>o) if o != NULL else 0), 1)
