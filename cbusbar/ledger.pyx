# cython: language_level=3, boundscheck=False, wraparound=False
"""Governance counters shared by every worker of one gateway (SPEC §5; busbar/governance/ledger.py).

One anonymous MAP_SHARED mapping made before the workers fork: a lock word and an open-addressing
table of buckets (key hash, window id, value). Admission of one request takes every check of its
group chain at once under the lock: it finds (or claims) each bucket, rolls a bucket whose window
has passed to 0, tests all the checks, and charges them all or none. The critical section is C with
no Python call and no allocation, a few hundred nanoseconds, so a spin lock serves; a holder that
died (kill -9 in those nanoseconds) is detected by its pid and the lock is taken over.

Why not one atomic per counter: "all or nothing" across a chain of limits needs the test of every
counter and the charge of every counter to be one step, or two requests can each pass half.
"""
import mmap
import os

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE
from libc.stdint cimport int64_t, uint64_t

cdef extern from *:
    """
    #include <sched.h>
    #include <signal.h>
    #include <errno.h>
    static inline int bb_cas(long long *p, long long expected, long long v) {
        return __atomic_compare_exchange_n(p, &expected, v, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
    }
    static inline long long bb_load(long long *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
    static inline void bb_release(long long *p) { __atomic_store_n(p, 0, __ATOMIC_RELEASE); }
    static inline int bb_dead(long long pid) {
        return pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    }
    static inline void bb_yield(void) { sched_yield(); }
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
        self.mm = mmap.mmap(-1, 8 * (HEADER + STRIDE * buckets), mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
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
        cdef int k
        cdef long long* b
        for k in range(n):
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
