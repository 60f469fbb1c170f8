# Compiled (Cython's augmenting .pxd for status.py): the exchange cimports status_line and calls it
# in C for every answer's head, instead of a Python function call and its frame.

cdef dict _STATUS_LINES

cpdef bytes status_line(int status)
cpdef header(headers, name)
