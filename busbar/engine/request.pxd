# Typed layout of busbar/engine/request.py's Request when compiled (Cython's augmenting .pxd).

cimport cython

cdef class Request:
    cdef public object method, path, query, headers, body
    cdef public long long t0
    cdef public bint keep_alive


@cython.locals(r=Request)
cpdef Request new_request(method, path, query, headers, body, long long t0, bint keep_alive)
