# cython: language_level=3
"""Counters shared by every worker process: an anonymous MAP_SHARED mapping created before the
workers fork, updated with the CPU's atomic instructions (no lock, no syscall). This is what makes a
lane's `max_concurrent` hold across all `--workers` processes together, not once per process."""
import mmap
import sys

from cpython.buffer cimport PyObject_GetBuffer, PyBuffer_Release, PyBUF_WRITABLE
from libc.stdlib cimport calloc, free, realloc
from libc.string cimport memset

cdef extern from *:
    """
    #include "port.h"
    static inline int busbar_cas_inc(long long *p, long long limit) {
        long long v = bb_atomic_load_seq_cst(p);
        while (v < limit) {
            if (bb_atomic_cas_seq_cst(p, &v, v + 1))
                return 1;
        }
        return 0;
    }
    static inline long long busbar_dec(long long *p) {
        return bb_atomic_sub_fetch_seq_cst(p, 1);
    }
    static inline long long busbar_load(long long *p) {
        return bb_atomic_load_seq_cst(p);
    }
    static inline long long busbar_add(long long *p, long long d) {
        return bb_atomic_add_fetch_seq_cst(p, d);
    }
    static inline void busbar_store(long long *p, long long v) {
        bb_atomic_store_seq_cst(p, v);
    }
    static inline int busbar_cas(long long *p, long long expected, long long v) {
        return bb_atomic_cas_seq_cst(p, &expected, v);
    }
    """
    int busbar_cas_inc(long long *p, long long limit) nogil
    long long busbar_dec(long long *p) nogil
    long long busbar_load(long long *p) nogil
    long long busbar_add(long long *p, long long d) nogil
    void busbar_store(long long *p, long long v) nogil
    int busbar_cas(long long *p, long long expected, long long v) nogil


cdef class Slots:
    """What SharedCounters and LocalCounters have in common (shared.pxd): the counters' memory,
    for C code that reads them directly (cbusbar/cellcore.pyx)."""
    pass


def anonymous_mapping(Py_ssize_t nbytes):
    """`nbytes` of zeroed memory, page-aligned: shared with the workers forked after it (MAP_SHARED);
    on Windows, where busbar runs in one process, the paging file's anonymous mapping (Python's
    mmap there takes no flags)."""
    if sys.platform == "win32":
        return mmap.mmap(-1, nbytes)
    return mmap.mmap(-1, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)


cdef class SharedCounters(Slots):

    def __cinit__(self, int size):
        if size < 1:
            size = 1
        self.size = size
        self.mm = anonymous_mapping(8 * size)
        PyObject_GetBuffer(self.mm, &self.view, PyBUF_WRITABLE)
        self.p = <long long*>self.view.buf

    def __dealloc__(self):
        if self.p != NULL:
            PyBuffer_Release(&self.view)
            self.p = NULL

    cpdef bint try_acquire(self, int i, long long limit):
        """Increments counter i unless it already reached `limit`; True when it did."""
        if i < 0 or i >= self.size:
            raise IndexError(i)
        return busbar_cas_inc(self.p + i, limit) == 1

    cpdef long long release(self, int i):
        if i < 0 or i >= self.size:
            raise IndexError(i)
        return busbar_dec(self.p + i)

    cpdef long long value(self, int i):
        if i < 0 or i >= self.size:
            raise IndexError(i)
        return busbar_load(self.p + i)

    # Breaker cells (busbar/reliability/cells.py) keep their state in these slots too, so a lane one
    # worker found dead is open for every worker, and a half-open lane's one probe is one per
    # gateway: the probe slot is taken by compare-and-swap.
    cpdef long long add(self, int i, long long d):
        """Adds d to counter i; returns the new value."""
        if i < 0 or i >= self.size:
            raise IndexError(i)
        return busbar_add(self.p + i, d)

    cpdef store(self, int i, long long v):
        if i < 0 or i >= self.size:
            raise IndexError(i)
        busbar_store(self.p + i, v)

    cpdef list values(self, int start, int stop):
        """Counters start..stop-1, each read atomically (the whole list is not one instant)."""
        cdef int i
        if start < 0 or stop > self.size or start > stop:
            raise IndexError((start, stop))
        return [busbar_load(self.p + i) for i in range(start, stop)]

    cpdef bint cas(self, int i, long long expected, long long v):
        """Sets counter i to v if it still holds `expected`; True when it did."""
        if i < 0 or i >= self.size:
            raise IndexError(i)
        return busbar_cas(self.p + i, expected, v) == 1


cdef class LocalCounters(Slots):
    """The SharedCounters interface over one process's memory (a single worker's breaker cells):
    plain loads and stores, and `grow`, since one process's table has no fixed capacity (a reload
    that adds cells extends it). In C rather than a Python list: the breaker reads and bumps these
    on every attempt (callgrind: a Python method per counter was a sixth of the breaker's cost on a
    small request)."""

    def __cinit__(self, int size):
        if size < 1:
            size = 1
        self.p = <long long*>calloc(size, 8)
        if self.p == NULL:
            raise MemoryError()
        self.size = size

    def __dealloc__(self):
        free(self.p)

    cpdef grow(self, int size):
        cdef long long* q
        if size <= self.size:
            return
        q = <long long*>realloc(self.p, 8 * <size_t>size)
        if q == NULL:
            raise MemoryError()
        memset(q + self.size, 0, 8 * <size_t>(size - self.size))
        self.p = q
        self.size = size

    cpdef long long value(self, int i):
        if i < 0 or i >= self.size:
            raise IndexError(i)
        return self.p[i]

    cpdef long long add(self, int i, long long d):
        if i < 0 or i >= self.size:
            raise IndexError(i)
        self.p[i] += d
        return self.p[i]

    cpdef store(self, int i, long long v):
        if i < 0 or i >= self.size:
            raise IndexError(i)
        self.p[i] = v

    cpdef list values(self, int start, int stop):
        if start < 0 or stop > self.size or start > stop:
            raise IndexError((start, stop))
        return [self.p[i] for i in range(start, stop)]

    cpdef bint cas(self, int i, long long expected, long long v):
        if i < 0 or i >= self.size:
            raise IndexError(i)
        if self.p[i] != expected:
            return False
        self.p[i] = v
        return True
