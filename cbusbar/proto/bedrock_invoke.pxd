# Claude through Bedrock InvokeModel: Anthropic Messages bodies on Bedrock's /invoke paths, streams
# as eventstream `chunk` events each carrying one Anthropic SSE event's JSON (base64) — what
# anthropic.AnthropicBedrock sends and reads. The module functions follow docs/codecs.md and
# delegate to the anthropic codec; only the framing and the body's envelope differ.

from cbusbar.eventstream cimport EventStreamParser


cdef class StreamDecoder:
    """Upstream InvokeModelWithResponseStream frames -> IR events (through the anthropic decoder)."""
    cdef EventStreamParser parser
    cdef object inner               # anthropic.StreamDecoder
    cdef bint done                  # an exception frame was turned into EV_ERROR

    cpdef list feed(self, bytes chunk)
    cpdef list close(self)


cdef class StreamEncoder:
    """IR events -> `chunk` frames for an AnthropicBedrock client (through the anthropic encoder)."""
    cdef readonly str id
    cdef readonly str model
    cdef object inner               # anthropic.StreamEncoder
    cdef object sse                 # framing.SSEParser over the inner encoder's output
    cdef bint done

    cpdef bytes encode(self, list events)
    cpdef bytes error(self, str kind, str message)
    cdef bytes _frames(self, bytes sse)
