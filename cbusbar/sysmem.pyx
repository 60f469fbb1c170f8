# cython: language_level=3
"""The allocator calls the gateway's workers make at start: glibc's mallopt, malloc_trim and
mallinfo2, called directly (the single-file executable carries no ctypes). They are glibc's own:
elsewhere (macOS, Windows, musl) each is a no-op that says so (False, 0)."""

cdef extern from *:
    """
    #if defined(__GLIBC__)
    #include <malloc.h>
    static int bb_set_mmap_threshold(int n) { return mallopt(M_MMAP_THRESHOLD, n) == 1; }
    static int bb_trim(void) { return malloc_trim(0) == 1; }
    static size_t bb_heap_free(void) { return mallinfo2().fordblks; }
    #else
    static int bb_set_mmap_threshold(int n) { (void)n; return 0; }
    static int bb_trim(void) { return 0; }
    static size_t bb_heap_free(void) { return 0; }
    #endif
    """
    int bb_set_mmap_threshold(int n) nogil
    int bb_trim() nogil
    size_t bb_heap_free() nogil


cpdef bint set_mmap_threshold(int nbytes):
    """Allocations from `nbytes` up get their own mapping, returned to the system when freed; this
    also turns off glibc's adaptive threshold. True when glibc accepted it."""
    return bb_set_mmap_threshold(nbytes)


cpdef bint trim():
    """Gives the heap's free pages back to the system (glibc's malloc_trim(0): the top of the heap
    and every whole free page inside it). True when some memory was released."""
    return bb_trim()


cpdef size_t heap_free():
    """Bytes the heap holds free (glibc's mallinfo2().fordblks): what trim() could give back at
    most."""
    return bb_heap_free()
