# cython: language_level=3
"""The allocator setting the gateway's workers make at start: glibc's mallopt, called directly
(the single-file executable carries no ctypes)."""

cdef extern from "malloc.h" nogil:
    int mallopt(int param, int value)
    int M_MMAP_THRESHOLD


cpdef bint set_mmap_threshold(int nbytes):
    """Allocations from `nbytes` up get their own mapping, returned to the system when freed; this
    also turns off glibc's adaptive threshold. True when glibc accepted it."""
    return mallopt(M_MMAP_THRESHOLD, nbytes) == 1
