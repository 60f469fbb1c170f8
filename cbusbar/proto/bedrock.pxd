# The Bedrock Converse codec's stateful halves. The module functions (read_request, write_request,
# read_response, write_response, read_usage, write_error, error_type, read_error_detail,
# upstream_path, forced_tool_name, mint_id) follow docs/codecs.md and live in bedrock.pyx.

from cbusbar.ir cimport Usage
from cbusbar.eventstream cimport EventStreamParser
from cbusbar.sequencer cimport BlockSequencer


cdef class StreamDecoder:
    """Upstream ConverseStream event stream frames -> IR events. Bedrock opens only tool-use
    blocks explicitly (text and reasoning blocks start with their first delta), and reports usage
    in a `metadata` event after `messageStop`, so MESSAGE_DELTA waits for it."""
    cdef EventStreamParser parser
    cdef bint started               # MESSAGE_START emitted
    cdef bint stopped               # messageStop seen (stop reason known)
    cdef readonly bint finished     # messageStop seen: the answer is complete (metadata may follow)
    cdef bint done                  # MESSAGE_STOP or EV_ERROR emitted: later frames are ignored
    cdef int stop_reason
    cdef str stop_sequence
    cdef readonly Usage usage       # the metadata event's totals, None until it arrives
    cdef BlockSequencer seq         # the IR blocks: one open at a time, dense indexes
    cdef object open_wire           # Bedrock's contentBlockIndex of the open block (-1: unnamed)

    cpdef list feed(self, bytes chunk)
    cpdef list close(self)
    cdef void _frame(self, dict headers, bytes payload, list out) except *
    cdef void _start(self, list out) except *
    cdef bint _open_as(self, object wire, int kind)
    cdef void _open(self, object wire, int kind, list out) except *
    cdef void _close(self, object wire, list out) except *
    cdef void _finish(self, list out) except *


cdef class StreamEncoder:
    """IR events -> ConverseStream frames for a Bedrock client, as AWS sends them."""
    cdef readonly str id
    cdef readonly str model
    cdef bint started               # messageStart went out
    cdef bint done                  # messageStop + metadata, or an exception frame, went out
    cdef dict kinds                 # IR block index -> B_* kind of blocks started and not stopped
    cdef dict wire                  # IR block index -> contentBlockIndex, once a frame named it
    # IR index of a tool block -> 1 once input went out, 2 when it came whole on the block's start
    cdef dict input_sent
    cdef dict arguments             # IR index of a tool block -> ObjectStream of its fragments
    cdef dict signatures            # IR index of a thinking block -> signature held for its end
    cdef int next_index             # next contentBlockIndex
    cdef int stop_reason
    cdef str stop_sequence
    cdef Usage usage                # running totals: usage.merge_usage of MESSAGE_START and MESSAGE_DELTAs

    cpdef bytes encode(self, list events)
    cpdef bytes error(self, str kind, str message)
    cdef void _start(self, bytearray out) except *
    cdef int _wire(self, int index) except -1
    cdef void _stop_block(self, int index, bytearray out) except *
    cdef void _finish(self, bytearray out) except *
