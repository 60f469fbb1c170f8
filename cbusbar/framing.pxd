# Byte-level framing shared by every codec (framing.pyx): the SSE reader and writer, Gemini's
# streamed-JSON-array reader and writer, and the top-level JSON field scanner. Codecs cimport this,
# so a frame is read and written through C calls, not Python attribute lookups per chunk.

# The default cap on one upstream stream frame (an SSE event's data, a JSON-array element, an
# event stream message) a decoder buffers before giving up on the stream. Real frames are bytes to
# kilobytes (one delta); the largest legitimate ones carry a whole item at once: a Responses
# `response.completed` repeating the full output, or a Gemini image model's inline base64 image in
# one chunk (a few MiB each). 32 MiB is above AWS's own event stream payload cap (24 MiB, botocore
# _MAX_PAYLOAD_LENGTH) and twice the 16 MiB busbar used per SSE event before, so no real provider
# frame is refused, while an upstream that never ends a frame still cannot make busbar buffer
# without bound (one frame per stream at most). StreamDecoder(max_frame=N) overrides it.
cdef enum:
    DEFAULT_MAX_FRAME = 32 * 1024 * 1024


cdef class SSEParser:
    cdef bytearray buf
    cdef object event               # the `event:` field of the frame being read, bytes or None
    cdef list data                  # its `data:` lines
    cdef Py_ssize_t pending         # bytes of data buffered for the frame being read
    cdef readonly Py_ssize_t max_event

    cpdef list feed(self, bytes chunk)
    cpdef list close(self)
    cdef void _line(self, const unsigned char* p, Py_ssize_t s, Py_ssize_t e, list out) except *


cdef class JsonArrayParser:
    """Splits a streamed JSON array `[{...},\\r\\n{...}]` into its top-level elements as they
    arrive (Gemini's stream without ?alt=sse)."""
    cdef bytearray buf
    cdef Py_ssize_t scan            # next byte of buf to scan
    cdef Py_ssize_t start           # start of the element being scanned, -1 between elements
    cdef int depth                  # nesting depth inside the current element
    cdef bint in_str                # inside a JSON string
    cdef bint esc                   # the previous byte was a backslash inside a string
    cdef bint opened                # the opening `[` was seen
    cdef readonly Py_ssize_t max_element

    cpdef list feed(self, bytes chunk)
    cpdef Py_ssize_t buffered(self)


cpdef bytes sse_event(bytes event, bytes data)
cpdef bytes sse_data_crlf(bytes data)
cpdef bytes json_array_item(bytes data, bint first)
cpdef dict scan_top(bytes body, tuple keys)
cpdef bytes splice(bytes body, Py_ssize_t start, Py_ssize_t end, bytes replacement)
cpdef object top_field(bytes body, bytes key)
cpdef list members(bytes body, tuple span, tuple names)
