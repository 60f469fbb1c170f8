# busbar/server/dispatch.py compiled (Cython's augmenting .pxd): the dispatch of every request.

from busbar.server.routes cimport Routes

cdef class Dispatcher:
    cdef public Routes routes
    cpdef dispatch(self, method, path, query, headers)

cpdef header_protocol(headers)
cpdef protocol_route(method, path, query, headers)
