# What the codecs say alike, written once (_common.pyx; docs/codecs.md "Shared helpers"), as
# asyncpg's codecs share one buffer layer (pgproto): the SSE stream decoders' feed/close loop as
# a base class, busbar's own refusals as a table each codec declares, and the upstream error
# body's envelope. The discovery answers most codecs share are plain functions there, imported.

from cbusbar.framing cimport SSEParser
from cbusbar.ir cimport Usage


cdef class SSEDecoder:
    """The base of the decoders of SSE upstream streams (openai's decoder and tap, responses,
    anthropic, gemini's SSE mode, cohere): feed and close read the frames and hand each to
    `_frame` until the stream is `done`; what a frame means is the subclass's. The contract is
    docs/codecs.md `StreamDecoder`."""
    cdef SSEParser parser
    cdef bint done                  # the end (or an error) was read: later bytes are not read
    cdef readonly bint finished     # the protocol's terminal frame was seen (docs/codecs.md)
    cdef readonly Usage usage       # the latest usage the stream reported, None until one

    cpdef list feed(self, bytes chunk)
    cpdef list close(self)
    # one frame's events
    cdef void _frame(self, object event, bytes data, list out) except *
    # upstream EOF after the last frame, not `done`: for a protocol whose stream may end without
    # its terminal frame
    cdef void _eof(self, list out) except *


cdef tuple own_error_in(dict table, str kind)         # own_error from the codec's OWN_ERRORS
cdef dict error_object(bytes body, bint unwrap_array)  # an error body's JSON object, or None
