# Typed layout of busbar/engine/deadlines.py when compiled (Cython's augmenting .pxd).
cimport cython

cdef class Timed:
    cdef public object _slot
    cpdef on_deadline(self)

cdef class Deadlines:
    cdef public object loop, handle
    cdef public double resolution
    cdef public dict slots
    cdef public long long swept, pruned, prune_every, next
    cdef public bint dirty

    @cython.locals(t=Timed, n=cython.longlong, now=cython.double, slot=dict, old=dict)
    cpdef arm(self, owner, double secs)

    @cython.locals(t=Timed, slot=dict)
    cpdef disarm(self, owner)
    cpdef _left(self)
    cpdef _wake_at(self, long long n, double now)
    cpdef long long _prune_slot(self, long long now)
