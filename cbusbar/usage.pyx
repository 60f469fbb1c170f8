# cython: language_level=3
"""Stream usage totals for encoders (declared in usage.pxd)."""

from cbusbar.ir cimport Usage


cdef Usage merge_usage(Usage known, Usage latest):
    """The totals after `latest` (a MESSAGE_START or MESSAGE_DELTA usage, or None) given the totals
    so far (`known`, or None). Every count of `latest` is a running total, so it replaces; only
    when `latest` does not know the input side does the prompt side (input, cache read, cache
    write: input_tokens counts both caches, ir.pxd) come from `known`, so a prompt reported at the
    start is not written as 0 at the end (SPEC 1.5). No usage in `latest` keeps `known`. Never
    mutates its arguments (decoders keep updating the Usage they sent)."""
    cdef Usage u
    if latest is None:
        return known
    u = latest.copy()
    if not u.input_known and known is not None and known.input_known:
        u.input_tokens = known.input_tokens
        u.cache_read_tokens = known.cache_read_tokens
        u.cache_write_tokens = known.cache_write_tokens
        u.input_known = True
    return u
