# Typed layout of busbar/upstream/pool.py's connection and pool when compiled (Cython's augmenting
# .pxd: the .py stays the source). Every member stays readable and writable from Python (`public`).

from cbusbar.clock cimport monotonic
from cbusbar.h1 cimport parse_response as _fast_parse

cdef class UpstreamConnection:
    cdef public object pool, key, transport, parser, handler
    cdef public list headers
    cdef public double idle_since
    cdef public bint closed, paused, _interim, _reusable, _partial
    cdef public object _body
    cpdef data_received(self, data)
    cpdef _deliver(self)
    cpdef _complete(self, bint keep_alive)
    cpdef send(self, handler, data)
    cpdef pause(self)
    cpdef resume(self)
    cpdef abandon(self)
    cpdef _fail(self, reason)
    cpdef close(self)

cdef class UpstreamPool:
    cdef public object loop
    cdef public double connect_timeout, idle_timeout
    cdef public Py_ssize_t max_idle
    cdef public object ssl_context
    cdef public dict idle
    cdef public set all
    cdef public object _reaper
    cdef public object connection_class
    cpdef acquire(self, key, on_ready, on_error)
    cpdef release(self, UpstreamConnection conn)
    cpdef forget(self, UpstreamConnection conn)
