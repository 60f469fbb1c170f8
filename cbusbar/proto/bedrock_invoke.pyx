"""Claude through Bedrock InvokeModel (protocol name "bedrock-invoke"), docs/codecs.md's contract.

Wire format, from anthropic/lib/bedrock/_client.py and _stream_decoder.py (the SDK's own Bedrock
client): the body is an Anthropic Messages body without `model` and `stream` (the model is in the
path, streaming is the path's -with-response-stream) and with `anthropic_version:
bedrock-2023-05-31`. Buffered answers are Anthropic Messages JSON. A stream is an AWS eventstream
of `chunk` events whose payload `{"bytes": base64}` decodes to one Anthropic SSE event's data;
a failure is an exception frame, as ConverseStream ends one. Errors are Bedrock's `{"message"}`.

Everything about the Messages shape is the anthropic codec's; this module only re-envelopes.
"""
import base64
from urllib.parse import quote

import orjson

from cbusbar cimport ir
from cbusbar.eventstream cimport EventStreamParser, encode_frame, encode_headers
from cbusbar.eventstream import EventStreamError
from cbusbar.ir import EVENT_ERROR, CodecError
from cbusbar.framing import SSEParser
from cbusbar.proto import anthropic as _a
from cbusbar.proto import bedrock as _b
from cbusbar.proto._common import body_as_is, usage_always_sent

NAME = "bedrock-invoke"
CONTENT_TYPE = b"application/json"
STREAM_CONTENT_TYPE = b"application/vnd.amazon.eventstream"
# anthropic.lib.bedrock._client.DEFAULT_VERSION
BEDROCK_ANTHROPIC_VERSION = "bedrock-2023-05-31"
# The model travels in the path; the Messages API requires max_tokens.
BODY_MODEL = False
NEEDS_MAX_TOKENS = True
# The top-level members the engine reads without parsing (one scan of the body): the model,
# stream, and where the caller's output cap lives; MAX_TOKENS_PATH is that cap's path, one level
# deep at most (governance reserves a budget for it before the call).
SCAN_KEYS = (b"model", b"stream", b"max_tokens")
MAX_TOKENS_PATH = ((b"max_tokens",),)
PROBE_MAX_TOKENS = 1        # health probes: Anthropic Messages through InvokeModel, max_tokens >= 1
# Egress: what busbar/engine/egress.py sends this API besides the body, and the API's cloud
# forms (docs/codecs.md "Egress").
USER_AGENT = b"Anthropic/Python 0.39.0"   # AnthropicBedrock is the anthropic SDK
API_HEADERS = ()
BETA_HEADERS = ()
AZURE_FORMS = ()
VERTEX_PUBLISHER = None
vertex_body = None

cdef bytes _CHUNK_HEADERS = encode_headers({
    ":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"})


cpdef ir.Request read_request(bytes body):
    """The body is Anthropic's; anthropic_version lands in req.extra (same-protocol only)."""
    return _a.read_request(body)


cpdef bytes write_request(ir.Request req):
    cdef dict d = orjson.loads(_a.write_request(req))
    d.pop("model", None)
    d.pop("stream", None)
    d["anthropic_version"] = BEDROCK_ANTHROPIC_VERSION
    return orjson.dumps(d)


cpdef object forced_tool_name(ir.Request req):
    return _a.forced_tool_name(req)


cpdef str upstream_path(str model, bint stream):
    # One path segment, escaped as botocore does (see bedrock.upstream_path).
    return "/model/" + quote(model, safe="") + ("/invoke-with-response-stream" if stream else "/invoke")


cpdef ir.Response read_response(bytes body):
    return _a.read_response(body)


cpdef bytes write_response(ir.Response resp):
    return _a.write_response(resp)


cpdef ir.Usage read_usage(bytes body):
    return _a.read_usage(body)


cpdef bytes write_error(int status, str kind, str message, str request_id=None):
    return _b.write_error(status, kind, message, request_id)


cpdef str mint_id():
    return _a.mint_id()


# Claude's stream always carries usage: nothing for the client to ask, nothing to hide.
wants_stream_usage = usage_always_sent
stream_usage_request = body_as_is


cpdef StreamEncoder stream_encoder(str id, str model, bint include_usage, bint json_array):
    return StreamEncoder(id, model)


cpdef bytes response_headers(object upstream_headers, str request_id):
    return _b.response_headers(upstream_headers, request_id)


cpdef bytes error_headers(str kind, str request_id):
    return _b.error_headers(kind, request_id)


own_error = _b.own_error
not_found_message = _b.not_found_message


cpdef tuple read_error_detail(bytes body):
    # Bedrock's own {"message"}; a model error relayed by Bedrock can be Anthropic's envelope.
    cdef tuple d = _b.read_error_detail(body)
    if d[0] is None:
        return _a.read_error_detail(body)
    return d


cdef class StreamDecoder:

    def __cinit__(self, Py_ssize_t max_frame=0):
        self.parser = EventStreamParser(max_frame) if max_frame else EventStreamParser()
        self.inner = _a.StreamDecoder(max_frame=max_frame)
        self.done = False

    @property
    def finished(self):
        """The inner Anthropic stream ended with message_stop."""
        return self.inner.finished

    @property
    def usage(self):
        return self.inner.usage

    cpdef list feed(self, bytes chunk):
        cdef list out = []
        cdef list frames
        cdef dict headers
        cdef bytes payload
        if self.done:
            return out
        try:
            frames = self.parser.feed(chunk)
        except EventStreamError:
            raise CodecError("The upstream event stream is malformed.")
        for headers, payload in frames:
            mtype = headers.get(":message-type")
            if mtype == "event":
                if headers.get(":event-type") != "chunk":
                    continue
                try:
                    data = base64.b64decode(orjson.loads(payload)["bytes"])
                    event = orjson.loads(data).get("type", "")
                except (ValueError, KeyError, TypeError, AttributeError):
                    raise CodecError("The upstream sent a chunk busbar could not read.")
                out.extend(self.inner.feed(b"event: %s\ndata: %s\n\n" % (event.encode(), data)))
            else:
                # An exception frame (:exception-type, payload {"message"}) ends the stream.
                try:
                    msg = orjson.loads(payload).get("message")
                except (ValueError, AttributeError):
                    msg = None
                kind = "overloaded" if headers.get(":exception-type") in (
                    "throttlingException", "serviceUnavailableException") else "api_error"
                out.append(ir.ev_error(kind, msg if isinstance(msg, str) and msg else
                                       "The upstream stream failed."))
                self.done = True
                break
        return out

    cpdef list close(self):
        if self.done:
            return []
        return self.inner.close()


cdef class StreamEncoder:

    def __init__(self, str id, str model):
        self.id = id
        self.model = model
        self.inner = _a.StreamEncoder(id, model)
        self.sse = SSEParser()
        self.done = False

    cdef bytes _frames(self, bytes sse):
        cdef list out = []
        for _event, data in self.sse.feed(sse):
            out.append(encode_frame(_CHUNK_HEADERS, orjson.dumps(
                {"bytes": base64.b64encode(data if isinstance(data, bytes) else data.encode()).decode()})))
        return b"".join(out)

    cpdef bytes encode(self, list events):
        if self.done:
            return b""
        for e in events:
            if (<ir.Event>e).kind == EVENT_ERROR:
                before = self._frames(self.inner.encode([ev for ev in events if ev is not e]))
                return before + self.error((<ir.Event>e).error_kind, (<ir.Event>e).message)
        return self._frames(self.inner.encode(events))

    cpdef bytes error(self, str kind, str message):
        if self.done:
            return b""
        self.done = True
        return _b.StreamEncoder("", "").error(kind, message)


def error_signals(doc):
    """Bedrock's, then a Messages error's relayed by InvokeModel (error.code, error.type)."""
    return _b.error_signals(doc) + _a.error_signals(doc)
