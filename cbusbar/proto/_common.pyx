# cython: language_level=3
"""What the six codecs say alike, written once (docs/codecs.md "Shared helpers").

Each codec keeps the identical shape of docs/codecs.md; where the words or the loop are the same
in several, they come from here, as asyncpg's codecs share one buffer layer:

- `SSEDecoder`: the stream decoders' feed/close loop over an SSE upstream (cimport it and
  subclass: `_frame` reads one frame, `_eof` what upstream EOF means).
- `own_error_in`: a codec's `own_error`, read from the table of busbar's own refusals the codec
  declares (OWN_ERRORS).
- `error_object`: the envelope every `read_error_detail` starts from.
- The discovery answers of the protocols that need nothing of the engine: no forced tool, usage in
  every stream, no headers of their own, OpenAI's unknown-model words. A codec names each as its
  own (`forced_tool_name = no_forced_tool`), under a comment that says why it applies.
"""
import orjson

from cbusbar.framing import FramingError
from cbusbar.ir import STATUS_OF_KIND
from cbusbar.ir cimport Request
from cbusbar.jsonget cimport frame_too_large


# ---------------------------------------------------------------------------------------------
# Decoder: the loop over an SSE upstream stream


cdef inline list _frames(SSEParser parser, bytes chunk, bint eof):
    """The (event, data) frames of the next chunk, or the rest at upstream EOF; a frame over the
    parser's limit is the codecs' one CodecError for it."""
    try:
        return parser.close() if eof else parser.feed(chunk)
    except FramingError:
        raise frame_too_large() from None


cdef class SSEDecoder:

    def __cinit__(self, Py_ssize_t max_frame=0):
        self.parser = SSEParser(max_frame)

    cpdef list feed(self, bytes chunk):
        cdef list out = []
        cdef tuple frame
        if self.done:
            return out
        for frame in _frames(self.parser, chunk, False):
            self._frame(frame[0], <bytes>frame[1], out)
            if self.done:
                break
        return out

    cpdef list close(self):
        cdef list out = []
        cdef tuple frame
        if self.done:
            return out
        for frame in _frames(self.parser, None, True):
            self._frame(frame[0], <bytes>frame[1], out)
            if self.done:
                return out
        self._eof(out)
        return out

    cdef void _frame(self, object event, bytes data, list out) except *:
        pass

    cdef void _eof(self, list out) except *:
        pass


# ---------------------------------------------------------------------------------------------
# Errors: busbar's own refusals, the upstream's envelope


cdef tuple own_error_in(dict table, str kind):
    """A codec's own_error: (status, message) of busbar's own refusals in the vendor's words
    (SPEC §1.7, §5), from the table the codec declares (OWN_ERRORS, kind -> (status, message)):
    a bad, missing, disabled, expired or revoked key ("authentication", one answer for all five),
    a pool the key may not use ("permission") and an exhausted budget ("quota", never 402). The
    message is None where the caller supplies it. Any other kind answers with its canonical status
    (ir.STATUS_OF_KIND) and no message."""
    cdef object own = table.get(kind)
    return <tuple>own if own is not None else (STATUS_OF_KIND.get(kind, 400), None)


cdef dict error_object(bytes body, bint unwrap_array):
    """The JSON object of an upstream error body, or None when it is not one (read_error_detail
    never raises). unwrap_array: a one-element array around it counts (a few OpenAI-compatible
    servers, and Gemini's streamed JSON array, wrap the envelope so)."""
    cdef object obj
    try:
        obj = orjson.loads(body)
    except Exception:
        return None
    if unwrap_array and type(obj) is list and obj:
        obj = (<list>obj)[0]
    return <dict>obj if type(obj) is dict else None


# ---------------------------------------------------------------------------------------------
# Discovery: the answers of a protocol that needs nothing of the engine


def no_forced_tool(Request req):
    """forced_tool_name: the protocol has its own structured output (response_format,
    text.format, responseSchema), so it never becomes a forced tool."""
    return None


def usage_always_sent(Request req):
    """wants_stream_usage: the protocol's stream always carries the usage, nothing to ask."""
    return False


def body_as_is(bytes body, dict spans=None):
    """stream_usage_request: the stream always carries the usage, so the body goes as it is and
    the client's stream is relayed unfiltered."""
    return body, None


def no_response_headers(object upstream_headers, str request_id):
    """response_headers: the protocol's answers carry no header of their own."""
    return b""


def no_error_headers(str kind, str request_id):
    """error_headers: the protocol's errors carry no header of their own."""
    return b""


def model_not_found(str name, str api_version):
    """not_found_message in OpenAI's words, which every protocol but Gemini uses."""
    return "The model '%s' does not exist or you do not have access to it." % name


def error_code_type(doc):
    """What a provider's `error_map` is matched against in an OpenAI, Responses or Anthropic error
    body (`doc`, parsed), in order: `error.code`, then `error.type` (the reference gateway reads
    the same fields, so a catalog written for it means the same here)."""
    if not isinstance(doc, dict):
        return []
    err = doc.get("error")
    err = err if isinstance(err, dict) else {}
    return [s for s in (err.get("code"), err.get("type")) if isinstance(s, str) and s]
