# Typed layout of busbar/engine/egress.py's Egress when compiled (Cython's augmenting .pxd): a
# request's upstream head is built by a C call on struct fields. Every member stays readable and
# writable from Python.

cdef class Egress:
    cdef public object provider, protocol
    cdef public tuple key
    cdef public object host, prefix
    cdef public bytes head_json, head_stream, bare_json, bare_stream
    cdef public object signer, source
    cdef public bint ready
    cdef public dict _lines, _paths
    cdef public bytes _base, _auth
    cdef public object vertex_publisher, vertex_body, accept_stream, path_base
    cdef public bint passthrough
    cpdef bytes request(self, path, bytes body, bint stream, bytes extra=*)
    cpdef bytes forward(self, path, bytes body, bint stream, bytes extra, req)
    cdef bytes _write(self, path, bytes body, bint stream, bytes extra, signer, bint own)
