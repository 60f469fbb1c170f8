# Typed layout of busbar/engine/request.py's Request when compiled (Cython's augmenting .pxd).

cdef class Request:
    cdef public object method, path, query, headers, body
    cdef public long long t0
    cdef public bint keep_alive
