# The Anthropic Messages codec's stateful halves (the stream decoder and encoder). The module's
# functions are documented in docs/codecs.md; anthropic.pyx implements both.

from cbusbar cimport ir
from cbusbar.proto._common cimport SSEDecoder


cdef class StreamDecoder(SSEDecoder):
    """`usage`: running totals, IR convention (input includes the cache buckets), None until
    message_start; `finished`: message_stop seen; `done`: message_stop or an error seen."""
    cdef long long raw_input        # Anthropic's own input_tokens (cache buckets excluded)
    cdef dict blocks                # upstream content index -> IR block index (carried blocks only)
    cdef int next_index

    cdef void _block_start(self, dict obj, list out) except *
    cdef object _block(self, dict obj)
    cdef void _block_delta(self, dict obj, list out) except *
    cdef void _message_delta(self, dict obj, list out) except *


cdef class StreamEncoder:
    cdef readonly str id
    cdef readonly str model
    cdef bint started               # message_start (and its ping) written
    cdef bint delta_sent            # a message_delta written
    cdef bint done                  # message_stop or error written
    cdef ir.Usage start_usage       # what message_start reported, for the backfill
    cdef ir.Usage last_usage        # running totals: usage.merge_usage of start_usage and MESSAGE_DELTAs
    cdef dict wire_index            # IR block index -> wire index (dense, as the SDK indexes by it)
    cdef dict wire_kind             # wire index -> K_* shape of the block
    cdef dict pending_signature     # wire index -> signature to send before the block stops
    cdef set whole_input            # wire indices whose tool input arrived whole on BLOCK_START
    cdef dict arguments             # wire index -> ObjectStream of a tool block's streamed input
    cdef list open_blocks           # wire indices started and not yet stopped, in order
    cdef int next_index

    cpdef bytes encode(self, list events)
    cpdef bytes error(self, str kind, str message)
    cdef void _start(self, ir.Usage usage, list out) except *
    cdef int _open(self, int ir_index, ir.Block block, list out) except -2
    cdef void _close(self, int wire, list out) except *
    cdef void _close_all(self, list out) except *
    cdef void _delta(self, ir.Event ev, list out) except *
    cdef void _json_delta(self, int wire, str partial, list out) except *
    cdef void _message_delta(self, int stop_reason, str stop_sequence, ir.Usage usage, list out) except *
