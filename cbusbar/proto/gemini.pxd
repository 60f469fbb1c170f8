# The Gemini (generateContent) codec's stateful halves. The module functions (read_request,
# write_request, read_response, write_response, read_usage, write_error, read_error_detail,
# write_model_list, upstream_path, mint_id) follow docs/codecs.md and live in gemini.pyx.

from cbusbar.ir cimport Usage
from cbusbar.framing cimport JsonArrayParser
from cbusbar.proto._common cimport SSEDecoder
from cbusbar.sequencer cimport BlockSequencer


cdef class StreamDecoder(SSEDecoder):
    """Upstream GenerateContentResponse chunks -> IR events. The chunks come as SSE `data:` frames
    (what busbar asks for with ?alt=sse; SSEDecoder's parser) or, from an upstream that ignores
    alt=sse, as one streamed JSON array. Gemini's stream is flat, so block boundaries are
    synthesised. `done`: MESSAGE_STOP or EV_ERROR emitted; `finished`: a candidate's finishReason
    (or a blocked prompt) seen; `usage`: the latest usageMetadata."""
    cdef JsonArrayParser array      # JSON-array mode
    cdef int mode                   # 0 undecided, 1 SSE, 2 JSON array
    cdef bint started               # MESSAGE_START emitted
    cdef bint saw_tool              # a functionCall part arrived (finish STOP then means tool use)
    cdef bint sealed                # the open thinking block already got its signature
    cdef BlockSequencer seq         # the IR blocks: one open at a time, dense indexes
    cdef int tool_count             # functionCall parts seen (seeds their minted ids)
    cdef str response_id            # the upstream responseId (seeds minted tool-call ids)

    cpdef list feed(self, bytes chunk)
    cdef void _chunk(self, dict chunk, list out) except *
    cdef void _part(self, dict part, object logprobs, list out) except *
    cdef void _fail(self, str kind, str message, list out) except *


cdef class StreamEncoder:
    """IR events -> GenerateContentResponse chunks for a Gemini client: SSE `data:` frames, or a
    streamed JSON array when `json_array` is set (the client did not ask for ?alt=sse)."""
    cdef public bint json_array     # frame as `[chunk,\r\nchunk]` instead of SSE
    cdef readonly str id
    cdef readonly str model
    cdef bint wrote                 # a chunk went out (JSON-array mode: the `[` is written)
    cdef bint finished              # the final chunk or an error went out
    cdef int stop_reason            # from MESSAGE_DELTA
    cdef Usage usage                # running totals: usage.merge_usage of MESSAGE_START and MESSAGE_DELTAs
    cdef dict tools                 # IR block index -> [call id, name, list of JSON fragments]

    cpdef bytes encode(self, list events)
    cpdef bytes error(self, str kind, str message)
    cdef bytes _frame(self, dict chunk)
    cdef bytes _parts_chunk(self, list parts, object logprobs)
    cdef bytes _final_chunk(self)
