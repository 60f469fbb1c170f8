# Typed layout of busbar/engine/records.py's Attempt when compiled (Cython's augmenting .pxd): the
# exchange fills it with struct writes; every member stays readable and writable from Python.

cimport cython

cdef class Attempt:
    cdef public object lane
    cdef public long long t_start, t_connected, t_headers, t_end
    cdef public int status
    cdef public object fault, reason
    cdef public long long bytes_in
    cdef public object retry_after, disposition, error_class


@cython.locals(a=Attempt)
cpdef Attempt new_attempt(lane, long long t_start)
