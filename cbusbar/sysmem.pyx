# cython: language_level=3
"""The allocator calls the gateway's workers make at start: glibc's mallopt and malloc_trim, called
directly (the single-file executable carries no ctypes)."""

cdef extern from "malloc.h" nogil:
    int mallopt(int param, int value)
    int malloc_trim(size_t pad)
    int M_MMAP_THRESHOLD


cpdef bint set_mmap_threshold(int nbytes):
    """Allocations from `nbytes` up get their own mapping, returned to the system when freed; this
    also turns off glibc's adaptive threshold. True when glibc accepted it."""
    return mallopt(M_MMAP_THRESHOLD, nbytes) == 1


cpdef bint trim():
    """Gives the heap's free pages back to the system (glibc's malloc_trim(0): the top of the heap
    and every whole free page inside it). True when some memory was released."""
    return malloc_trim(0) == 1


cdef extern from "malloc.h" nogil:
    struct mallinfo2:
        size_t arena       # bytes the main heap took from the system (brk)
        size_t fordblks    # bytes free in it
    mallinfo2 c_mallinfo2 "mallinfo2"()


cpdef size_t heap_free():
    """Bytes the heap holds free (glibc's mallinfo2().fordblks): what trim() could give back at
    most."""
    return c_mallinfo2().fordblks
