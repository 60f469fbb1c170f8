# Counters in memory C code reads directly: SharedCounters (a MAP_SHARED mapping every worker
# shares, atomic operations) and LocalCounters (one process's, growable). See shared.pyx.


cdef class Slots:
    cdef long long* p
    cdef readonly int size


cdef class SharedCounters(Slots):
    cdef object mm
    cdef Py_buffer view

    cpdef bint try_acquire(self, int i, long long limit)
    cpdef long long release(self, int i)
    cpdef long long value(self, int i)
    cpdef long long add(self, int i, long long d)
    cpdef store(self, int i, long long v)
    cpdef list values(self, int start, int stop)
    cpdef bint cas(self, int i, long long expected, long long v)


cdef class LocalCounters(Slots):
    cpdef grow(self, int size)
    cpdef long long value(self, int i)
    cpdef long long add(self, int i, long long d)
    cpdef store(self, int i, long long v)
    cpdef list values(self, int start, int stop)
    cpdef bint cas(self, int i, long long expected, long long v)
