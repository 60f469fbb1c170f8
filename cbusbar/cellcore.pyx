# cython: language_level=3
"""The circuit breaker's happy path in C (busbar/reliability/breaker.py keeps the state machine).

Every attempt asks its breaker cell whether it may go (`CellCore.enter`) and tells it how it ended
(`CellCore.ok` on a whole answer). In Python those were a handful of method calls on the cell, the
lane's budget, the counter array and the error-rate window; measured with callgrind on small
requests through the whole server, 12.3k instructions a request (8.0k after fusing the calls),
against a control without the breaker (bench/ab/no-breaker.patch). Here they read and add to the
counters' memory directly (atomically: a SharedCounters mapping is every worker's), and the
error-rate window is C arrays: 1.9k instructions a request (151.3k against the control's 149.4k).

The slot layout constants are breaker.py's; `LAYOUT` lets it check they agree at import.
"""
from libc.stdlib cimport calloc, free
from libc.math cimport floor
from cbusbar.clock cimport monotonic

from cbusbar.record cimport AttemptHook
from cbusbar.shared cimport Slots

import time as _time

cdef extern from *:
    """
    #include "port.h"
    static inline long long bb_load(long long *p) { return bb_atomic_load_seq_cst(p); }
    static inline long long bb_add(long long *p, long long d) {
        return bb_atomic_add_fetch_seq_cst(p, d);
    }
    """
    long long bb_load(long long *p) nogil
    long long bb_add(long long *p, long long d) nogil

cdef enum:
    S_UNTIL = 1         # a cell's slots (breaker.py S_*)
    S_STREAK = 2
    S_OK = 3
    CELL_SLOTS = 8
    L_INFLIGHT = 1      # a lane's slots (breaker.py L_*)
    LANE_SLOTS = 8

LAYOUT = (S_UNTIL, S_STREAK, S_OK, CELL_SLOTS, L_INFLIGHT, LANE_SLOTS)

cdef object _monotonic = _time.monotonic


cdef inline double _now(object clock) except? -1.0:
    """The cell's clock: time.monotonic read in C (cbusbar/clock), an injected clock (tests)
    called."""
    if clock is _monotonic:
        return monotonic()
    return clock()


cdef class Window:
    """Outcomes of the last `secs` seconds in one-second buckets (ok, err): constant work per
    outcome, constant memory per cell."""
    cdef readonly int n
    cdef long long* sec
    cdef long long* okc
    cdef long long* errc

    def __cinit__(self, double secs):
        cdef int i
        cdef double c = floor(secs)
        self.n = max(1, <int>(c if c == secs else c + 1))
        self.sec = <long long*>calloc(self.n, sizeof(long long))
        self.okc = <long long*>calloc(self.n, sizeof(long long))
        self.errc = <long long*>calloc(self.n, sizeof(long long))
        if self.sec == NULL or self.okc == NULL or self.errc == NULL:
            raise MemoryError()
        for i in range(self.n):
            self.sec[i] = -1

    def __dealloc__(self):
        free(self.sec)
        free(self.okc)
        free(self.errc)

    cpdef add(self, double now, bint failed):
        cdef long long s = <long long>floor(now)
        cdef int i = <int>(s % self.n)
        if self.sec[i] != s:
            self.sec[i] = s
            self.okc[i] = 0
            self.errc[i] = 0
        if failed:
            self.errc[i] += 1
        else:
            self.okc[i] += 1

    cpdef tuple counts(self, double now):
        cdef long long lo = <long long>floor(now) - self.n
        cdef long long ok = 0, err = 0
        cdef int i
        for i in range(self.n):
            if self.sec[i] > lo:
                ok += self.okc[i]
                err += self.errc[i]
        return ok, err

    cpdef clear(self):
        cdef int i
        for i in range(self.n):
            self.sec[i] = -1
            self.okc[i] = 0
            self.errc[i] = 0


cdef class LaneCore:
    """A lane's budget block (breaker.py LaneState): its slots, their first index, the lifetime
    limit (None: unlimited)."""
    cdef public Slots slots
    cdef public int i
    cdef public object limit


cdef class CellCore:
    """A breaker cell's fields the happy path reads (breaker.py Cell adds the rest)."""
    cdef public Slots slots
    cdef public int base
    cdef public LaneCore budget
    cdef public Window window
    cdef public object clock
    cdef object _policy
    cdef bint error_rate

    @property
    def policy(self):
        return self._policy

    @policy.setter
    def policy(self, p):
        self._policy = p
        self.error_rate = p is not None and p.mode == "error_rate"

    cpdef bint enter(self) except -1:
        """usable() and claim() in one call for the common case: a closed cell with no cooldown on
        a lane without a lifetime budget; the lane's in-flight count is taken (give it back with
        budget.done(True) if the lane's permit is then refused). False: not that case, nothing
        taken; ask usable() and claim()."""
        cdef LaneCore bud = self.budget
        cdef Slots s = self.slots
        if bud is None or bud.limit is not None or self.base + CELL_SLOTS > s.size:
            return False
        if bb_load(s.p + self.base + S_UNTIL) != 0:
            return False
        if bud.i + LANE_SLOTS > bud.slots.size:
            return False
        bb_add(bud.slots.p + bud.i + L_INFLIGHT, 1)
        return True

    cpdef ok(self):
        """An attempt that ended in a whole answer: the lane's in-flight count down (no refund)
        and record_ok(), in one call."""
        cdef LaneCore bud = self.budget
        cdef Slots s = self.slots
        cdef long long* p
        if bud is None or bud.i + LANE_SLOTS > bud.slots.size or self.base + CELL_SLOTS > s.size:
            if bud is not None:
                bud.done(False)
            self.record_ok()
            return
        bb_add(bud.slots.p + bud.i + L_INFLIGHT, -1)
        p = s.p + self.base
        bb_add(p + S_OK, 1)
        if self.error_rate:
            self.window.add(_now(self.clock), False)
        if bb_load(p + S_STREAK) or bb_load(p + S_UNTIL):
            self._reset_ok()


cdef class CellHook(AttemptHook):
    """The breaker's attempt hook (busbar/reliability/state.py Reliability.hook): an attempt read
    whole goes to its cell's `ok()` from C; any other through `slow(exchange, attempt)`, the
    Python `Reliability.on_attempt`. The Python hook on the happy path was a Python call and ~33
    bytecodes per attempt, ~2k instructions (callgrind, bench/inproc.py); this is a handful of
    attribute reads."""
    cdef object slow

    def __init__(self, slow):
        self.slow = slow

    cpdef on_attempt(self, ex, a):
        cdef dict cells
        if a.fault is not None:
            self.slow(ex, a)
            return
        target = ex.target
        if target is None:
            return
        pol = target.policy
        if pol is None:
            return
        cells = pol.cell_of         # (state.py TargetPolicy: lane -> breaker.Cell, a CellCore)
        cell = cells.get(a.lane)
        if cell is not None:
            (<CellCore?>cell).ok()
