# Typed layout of busbar/routing/swrr.py when compiled (Cython's augmenting .pxd): a pick, a permit
# and its release are C calls on struct fields. Every member stays readable and writable from Python.
cimport cython

cdef class Lane:
    cdef public object model, name
    cdef public long long inflight
    cdef public object limit, _shared
    cdef public long long _slot
    cdef public object queue
    cpdef bint has_permit(self) except -1
    cpdef bint try_acquire(self) except -1
    cpdef bint take_queued(self) except -1
    cpdef release(self)

cdef class Target:
    cdef public object name
    cdef public bint is_pool
    cdef public tuple lanes, weights
    cdef public list current
    cdef public dict _reasoning, _lacking
    cdef public object cells, policy, excluded
    cdef public object plan     # busbar/routing/plan.py PoolPlan, or None: SWRR alone
    cdef public bint byok, passthrough
    cpdef lacking(self, op)
    cpdef bint eligible(self, Lane lane) except -1

    @cython.locals(lane=Lane, best=Py_ssize_t, i=Py_ssize_t, n=Py_ssize_t)
    cpdef pick(self, exclude=*)
    cpdef bint reasoning(self, Lane lane) except -1

cdef class Router:
    cdef public object config
    cdef public dict lanes, _targets
    cdef public list _names
    cpdef resolve(self, name)
