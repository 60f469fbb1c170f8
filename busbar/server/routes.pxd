# busbar/server/routes.py compiled (Cython's augmenting .pxd): the data listener looks up its table
# for every request off the fixed chat paths (busbar/server/dispatch.py Dispatcher), in C.

cdef class Routes:
    cdef public list table, patterned
    cdef public dict exact, refusals

    cpdef match(self, method, path)
