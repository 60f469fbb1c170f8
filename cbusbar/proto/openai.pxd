# The OpenAI Chat Completions codec's stateful halves. The module functions (read_request,
# write_request, read_response, write_response, read_usage, write_error, read_error_detail,
# write_model_list, upstream_path, mint_id) follow docs/codecs.md and live in openai.pyx.

from cbusbar.ir cimport Usage
from cbusbar.proto._common cimport SSEDecoder
from cbusbar.sequencer cimport BlockSequencer


cdef class StreamDecoder(SSEDecoder):
    """Upstream `data:` chunks -> IR events. OpenAI's stream is flat, so block boundaries are
    synthesised: one block is open at a time, and a change of delta kind closes it. `done`:
    MESSAGE_STOP or EV_ERROR emitted; `finished`: [DONE], or a finish_reason then EOF; `usage`:
    the usage chunk's totals."""
    cdef bint started               # MESSAGE_START emitted
    cdef bint have_finish           # a finish_reason arrived
    cdef bint saw_tool              # a tool call was streamed (finish "stop" then means tool use)
    cdef bint saw_refusal           # delta.refusal text was streamed
    cdef int stop_reason            # IR stop reason of the remembered finish_reason
    cdef BlockSequencer seq         # the IR blocks: one open at a time, dense indexes
    cdef dict tools                 # OpenAI tool-call key (its `index`, else its id) -> IR block index
    cdef object last_tool           # key of the most recent tool call (fragments without index/id)
    cdef object _c_text             # _text_frame's scratch: the chunk's text and finish_reason
    cdef object _c_finish

    cdef bint _text_frame(self, bytes data, list out) except -1
    cdef void _choice(self, dict choice, list out) except *
    cdef void _tool_call(self, dict call, list out) except *
    cdef void _finish(self, list out) except *


cdef class StreamTap(SSEDecoder):
    """The same-protocol relay's tap (docs/codecs.md `StreamTap`): reads a relayed stream for what
    the engine needs of it (the usage, an error event, whether it ended properly), not for IR
    blocks; the client gets the upstream's bytes. `done`: [DONE] or an error event; `finished`
    and `usage` as StreamDecoder's."""
    cdef bint started               # a frame was read whole (the stream's start was valid JSON)
    cdef bint have_finish           # a finish_reason arrived


cdef class StreamEncoder:
    """IR events -> `data: {chat.completion.chunk}` frames for an OpenAI client, ending in
    `data: [DONE]`."""
    cdef public long long created   # unix seconds on every chunk (default: construction time)
    cdef public bint include_usage  # the client asked for stream_options.include_usage
    cdef readonly str id
    cdef readonly str model
    cdef bint started               # the role chunk went out
    cdef bint finished              # [DONE] or an error frame went out
    cdef int tool_count             # OpenAI tool-call indexes handed out so far
    cdef dict tool_of_block         # IR block index -> OpenAI tool-call index
    # IR indexes of refusal blocks (their text goes out as delta.refusal); None until the first
    cdef set refusal_blocks
    cdef Usage usage                # running totals: usage.merge_usage of MESSAGE_START and MESSAGE_DELTAs

    cpdef bytes encode(self, list events)
    cpdef bytes error(self, str kind, str message)
    cdef bytes _chunk(self, dict delta, object finish_reason, object logprobs)


cdef class UsageHider:
    """The relay filter for a same-protocol stream whose client did not ask for usage: drops the
    usage chunk and the `usage` members busbar's added include_usage makes the upstream send."""
    cdef bytearray buf              # bytes of the event being received
    cdef Py_ssize_t scan            # next byte of buf to scan
    cdef Py_ssize_t line            # start of the line being scanned
    cdef Py_ssize_t max_frame
    cdef bint passthrough           # an event outgrew max_frame: everything passes as it is
    cdef bint cr                    # a CR was seen: lines are scanned byte by byte from then on
    cdef char* out                  # the output being built (reused across feeds)
    cdef Py_ssize_t cap

    cpdef bytes feed(self, bytes chunk)
    cpdef bytes close(self)
    cdef bytes _feed_lf(self)
    cdef bytes _feed_any(self)
    cdef int _put(self, Py_ssize_t at, const char* src, Py_ssize_t n) except -1
