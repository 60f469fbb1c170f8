# busbar/server/dispatch.py compiled (Cython's augmenting .pxd): the dispatch of every request.

cpdef header_protocol(headers)
cpdef dispatch(method, path, query, headers)
