# Typed layout of busbar/engine/snapshot.py's Snapshot when compiled (Cython's augmenting .pxd): what
# a request reads from its config snapshot is a struct field. Every member stays readable from Python.
from busbar.routing.swrr cimport Router

cdef class Snapshot:
    cdef public object config, governance
    cdef public long long version
    cdef public object limits
    cdef public Router router
    cdef public dict egress
    cdef public bint server_timing
    cdef public int max_attempts
    cdef public dict beta_headers, wire_json
    cdef public object mask, max_inbound
    cdef public object routing      # the worker's busbar/routing/plan.py RoutingState
    cpdef bytes wire(self, name)
