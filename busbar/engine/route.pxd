# Typed layout of busbar/engine/route.py's Route when compiled (Cython's augmenting .pxd): the
# exchange reads its fields as struct fields. Every member stays readable and writable from Python.

cdef class Route:
    cdef public int kind
    cdef public object protocol, name
    cdef public bint stream
    cdef public object gemini_version
    cdef public bint json_array, name_in_body, may_embed
    cdef public object handler
