# The Cohere v2 chat codec's stateful pieces (the module functions are in cohere.pyx).

from cbusbar.ir cimport Block, Event, Usage
from cbusbar.proto._common cimport SSEDecoder
from cbusbar.sequencer cimport BlockSequencer


cdef class StreamDecoder(SSEDecoder):
    """`done`: message-end (or an error frame) seen; `finished`: a message-end that is not an
    error seen; `usage`: message-end's."""
    cdef bint started           # MESSAGE_START emitted
    # the IR blocks: one open at a time, dense indexes; its `filled` says whether an open tool call
    # received argument bytes
    cdef BlockSequencer seq
    cdef int open_src           # which Cohere event family opened it (SRC_* in cohere.pyx)
    cdef object open_cohere     # Cohere's own index for it (content or tool-call index), or None
    cdef bint open_ended        # content-end seen, BLOCK_STOP deferred (citations arrive after it)

    cdef bint _same(self, object index)
    cdef void _start(self, list out, object id)
    cdef void _close_open(self, list out)
    cdef void _open(self, list out, int src, object cohere_index, Block block)
    cdef void _content_start(self, list out, dict doc)
    cdef void _content_delta(self, list out, dict doc)
    cdef void _plan_delta(self, list out, dict doc)
    cdef void _tool_start(self, list out, dict doc)
    cdef void _tool_delta(self, list out, dict doc)
    cdef void _citation(self, list out, dict doc)
    cdef void _end(self, list out, object delta)


cdef class StreamEncoder:
    cdef public str id
    cdef public str model
    cdef bint started           # message-start written
    cdef bint finished          # message-end or an error written; the stream is over
    cdef int content_n          # next Cohere content index (text and thinking share it)
    cdef int tool_n             # next Cohere tool-call index
    cdef int cite_n             # next Cohere citation index
    cdef dict blocks            # IR index -> (family, Cohere index)
    cdef Usage usage            # running totals (usage.merge_usage of MESSAGE_START and MESSAGE_DELTAs)
    cdef int stop_reason
    cdef bint have_delta        # a MESSAGE_DELTA arrived

    cpdef bytes encode(self, list events)
    cpdef bytes error(self, str kind, str message)
    cdef void _start(self, bytearray out)
    cdef void _block_start(self, bytearray out, Event e)
    cdef void _block_delta(self, bytearray out, Event e)
    cdef void _block_stop(self, bytearray out, int index)
    cdef void _end(self, bytearray out)
