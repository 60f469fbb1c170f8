# cython: language_level=3
"""Amazon Bedrock Converse (`POST /model/{modelId}/converse[-stream]`): the codec contract of
docs/codecs.md.

Wire authority: botocore's service model (data/bedrock-runtime/2023-09-30/service-2.json, shapes
ConverseRequest, ConverseResponse, ConverseStreamOutput) and botocore/eventstream.py.

Bedrock is a path-model protocol: the model id travels percent-encoded in the URL and the body has
no `model` or `stream`, so read_request leaves both for the engine. Blobs (image and document
bytes, redacted reasoning) are base64 text in the JSON body, the same shape the IR keeps.
Usage follows Anthropic: `inputTokens` excludes the cache buckets, so the reader adds
`cacheReadInputTokens` and `cacheWriteInputTokens` in and the writer takes them out again.

Streams are binary AWS event stream frames (cbusbar/eventstream.pyx). Each event frame carries the
headers `:event-type`, `:content-type: application/json`, `:message-type: event`; a failure is a
frame with `:message-type: exception` and `:exception-type` naming a member of the
ConverseStreamOutput union (`throttlingException`, ...), which is how botocore picks the error it
raises."""

from urllib.parse import quote

import orjson

from cbusbar cimport ids

from cbusbar.ir cimport (
    Usage, Block, Message, Tool, Request, Response, Event,
    ev_message_start, ev_message_delta,
    ev_message_stop, ev_error, text_block,
    B_TEXT, B_IMAGE, B_DOCUMENT, B_TOOL_USE, B_TOOL_RESULT, B_THINKING,
    SRC_BASE64, SRC_URL, SRC_VENDOR, ROLE_USER, ROLE_ASSISTANT,
    TC_AUTO, TC_NONE, TC_REQUIRED, TC_TOOL,
    RF_JSON_OBJECT, RF_JSON_SCHEMA,
    SR_UNSET, SR_END_TURN, SR_STOP_SEQUENCE, SR_MAX_TOKENS, SR_TOOL_USE, SR_SAFETY, SR_ERROR,
    SR_OTHER,
    EV_MESSAGE_START, EV_BLOCK_START, EV_BLOCK_DELTA, EV_BLOCK_STOP, EV_MESSAGE_DELTA,
    EV_MESSAGE_STOP, EV_ERROR,
    D_TEXT, D_INPUT_JSON, D_THINKING, D_SIGNATURE, D_CITATION,
)
from cbusbar.eventstream cimport EventStreamParser, encode_headers, encode_frame
from cbusbar.ir import CodecError
from cbusbar.eventstream import EventStreamError
from cbusbar.framing import FramingError
from cbusbar.framing cimport DEFAULT_MAX_FRAME, members, scan_top
from cbusbar cimport jsonget
from cbusbar.ir cimport text_is_empty
from cbusbar.jsonspan cimport text_value
from cbusbar.jsonget cimport (
    Shape, opt_dict, opt_int, opt_list, opt_number, str_or_none, count, J_STRINGS,
)
from cbusbar.jsonget import NOT_AN_OBJECT, UPSTREAM_BAD_FRAME, UPSTREAM_NOT_JSON
from cbusbar.usage cimport merge_usage
from cbusbar.arguments cimport ObjectStream, object_of
from cbusbar.reasoning cimport claude_budget, claude_top_p_ok
from cbusbar.proto._common cimport error_object, own_error_in
from cbusbar.proto._common import body_as_is, model_not_found, usage_always_sent

NAME = "bedrock"
CONTENT_TYPE = b"application/json"
STREAM_CONTENT_TYPE = b"application/vnd.amazon.eventstream"
BODY_MODEL = False          # the model id travels in the path
NEEDS_MAX_TOKENS = False    # inferenceConfig.maxTokens is optional
# The top-level members the engine reads without parsing (one scan of the body): the model,
# stream, and where the caller's output cap lives; MAX_TOKENS_PATH is that cap's path, one level
# deep at most (governance reserves a budget for it before the call).
SCAN_KEYS = (b"model", b"stream", b"inferenceConfig")
MAX_TOKENS_PATH = ((b"inferenceConfig", b"maxTokens"),)
PROBE_MAX_TOKENS = 1        # health probes: Converse accepts maxTokens >= 1
# Egress: what busbar/engine/egress.py sends this API besides the body, and the API's cloud
# forms (docs/codecs.md "Egress").
USER_AGENT = b"Boto3/1.35.0 md/Botocore#1.35.0"
API_HEADERS = ()
BETA_HEADERS = ()
AZURE_FORMS = ()
VERTEX_PUBLISHER = None
vertex_body = None

# The forced tool that carries structured output (busbar goes beyond the reference here: SPEC,
# "Where busbar goes beyond the reference"); cbusbar/transform.pyx unwraps it on the way back.
cdef str FORCED_TOOL = "structured_output"
cdef str FORCED_TOOL_DESCRIPTION = "Respond with a JSON object that matches this schema."

# ConverseRequest members with no IR home, kept verbatim for a same-protocol hop.
cdef tuple EXTRA_FIELDS = (
    "additionalModelRequestFields", "guardrailConfig", "performanceConfig", "promptVariables",
    "requestMetadata", "additionalModelResponseFieldPaths", "serviceTier", "outputConfig",
    "projectIdentifier",
)

# ImageFormat enum <-> media types.
cdef dict IMAGE_MEDIA = {"png": "image/png", "jpeg": "image/jpeg", "gif": "image/gif",
                         "webp": "image/webp"}
cdef dict IMAGE_FORMAT = {"image/png": "png", "image/jpeg": "jpeg", "image/jpg": "jpeg",
                          "image/gif": "gif", "image/webp": "webp"}
# DocumentFormat enum <-> media types.
cdef dict DOC_MEDIA = {
    "pdf": "application/pdf", "csv": "text/csv", "doc": "application/msword",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "xls": "application/vnd.ms-excel",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "html": "text/html", "txt": "text/plain", "md": "text/markdown",
}
cdef dict DOC_FORMAT = {v: k for k, v in DOC_MEDIA.items()}

# StopReason enum -> IR. A context-window overflow truncates the answer like max_tokens does;
# malformed model output or tool use is the model failing, not the caller.
cdef dict STOP_OF = {
    "end_turn": SR_END_TURN, "tool_use": SR_TOOL_USE, "max_tokens": SR_MAX_TOKENS,
    "stop_sequence": SR_STOP_SEQUENCE, "guardrail_intervened": SR_SAFETY,
    "content_filtered": SR_SAFETY, "malformed_model_output": SR_ERROR,
    "malformed_tool_use": SR_ERROR, "model_context_window_exceeded": SR_MAX_TOKENS,
}
# IR -> StopReason (SPEC 1.5: Safety -> content_filtered, everything else end_turn).
cdef dict STOP_NAME = {
    SR_END_TURN: "end_turn", SR_TOOL_USE: "tool_use", SR_MAX_TOKENS: "max_tokens",
    SR_STOP_SEQUENCE: "stop_sequence", SR_SAFETY: "content_filtered",
}

# Canonical error kind -> the exception name of a buffered error (`__type`, x-amzn-errortype).
cdef dict ERROR_TYPE = {
    "invalid_request": "ValidationException",
    "authentication": "AccessDeniedException",
    "permission": "AccessDeniedException",
    "not_found": "ResourceNotFoundException",
    "request_too_large": "ValidationException",
    "rate_limit": "ThrottlingException",
    "quota": "ServiceQuotaExceededException",
    "api_error": "InternalServerException",
    "overloaded": "ServiceUnavailableException",
    "timeout": "ModelTimeoutException",
}
# Canonical error kind -> `:exception-type` of a stream exception frame. It must name a member of
# the ConverseStreamOutput union, or botocore raises a nameless error; the union has only these five.
cdef dict STREAM_EXCEPTION = {
    "invalid_request": "validationException",
    "authentication": "validationException",
    "permission": "validationException",
    "not_found": "validationException",
    "request_too_large": "validationException",
    "rate_limit": "throttlingException",
    "quota": "throttlingException",
    "api_error": "internalServerException",
    "overloaded": "serviceUnavailableException",
    "timeout": "modelStreamErrorException",
}
# Lower-cased exception name (buffered `__type` or stream `:exception-type`) -> canonical kind.
cdef dict KIND_OF_EXCEPTION = {
    "validationexception": "invalid_request",
    "accessdeniedexception": "permission",
    "resourcenotfoundexception": "not_found",
    "throttlingexception": "rate_limit",
    "servicequotaexceededexception": "quota",
    "modeltimeoutexception": "timeout",
    "serviceunavailableexception": "overloaded",
    "modelnotreadyexception": "overloaded",
    "internalserverexception": "api_error",
    "modelstreamerrorexception": "api_error",
    "modelerrorexception": "api_error",
}

# AWS pads every stream payload with a `"p"` field of letters so that frame sizes do not reveal
# token lengths. busbar pads each payload up to the next multiple of PAD_TO bytes: the same effect,
# and deterministic, so translated streams are reproducible byte for byte.
cdef bytes PAD = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
cdef Py_ssize_t PAD_TO = 32

cdef dict EVENT_HEADERS = {
    name: encode_headers({":event-type": name, ":content-type": "application/json",
                          ":message-type": "event"})
    for name in ("messageStart", "contentBlockStart", "contentBlockDelta", "contentBlockStop",
                 "messageStop", "metadata")
}


# Bedrock's wording of a shape error: `messages must be a list.`; an absent required member in
# AWS's own ValidationException words.
cdef tuple BEDROCK_WORDS = (None, "a string", "an integer", "a number", "a boolean", "an object",
                            "a list", "a string or a list", "a list of strings", "an object")


cdef class BedrockShape(Shape):

    cpdef object bad_type(self, str path, int expected, object value):
        return CodecError("%s must be %s." % (path, BEDROCK_WORDS[expected]))

    cpdef object missing(self, str path):
        return CodecError("1 validation error detected: Value null at '%s' failed to satisfy "
                          "constraint: Member must not be null" % path)


cdef BedrockShape SHAPE = BedrockShape()


# ---------------------------------------------------------------------------------------------
# Helpers


cdef Usage _unknown_usage():
    cdef Usage u = Usage.__new__(Usage)
    u.input_known = False
    return u


cdef Usage _usage_of(object raw):
    """A Converse `usage` object -> IR usage (not an object: zeros, input not known)."""
    cdef dict d
    if not isinstance(raw, dict):
        return Usage.__new__(Usage)
    d = raw
    return _usage_from(d.get("inputTokens"), d.get("outputTokens"), d.get("cacheReadInputTokens"),
                       d.get("cacheWriteInputTokens"))


cdef Usage _usage_from(object inp, object out, object cache_read, object cache_write):
    """The one mapping of Converse usage counts, from its dict (_usage_of) or read in place
    (read_usage): inputTokens excludes both cache buckets, the IR's input includes them."""
    cdef Usage u = Usage.__new__(Usage)
    u.cache_read_tokens = count(cache_read)
    u.cache_write_tokens = count(cache_write)
    u.input_tokens = count(inp) + u.cache_read_tokens + u.cache_write_tokens
    u.output_tokens = count(out)
    u.input_known = True
    return u


cdef dict _usage_json(Usage u):
    cdef long long cached = u.cache_read_tokens + u.cache_write_tokens
    cdef long long raw_in = u.input_tokens - cached
    cdef dict out
    if raw_in < 0:
        raw_in = 0
    out = {"inputTokens": raw_in, "outputTokens": u.output_tokens,
           "totalTokens": raw_in + cached + u.output_tokens}
    if u.cache_read_tokens:
        out["cacheReadInputTokens"] = u.cache_read_tokens
    if u.cache_write_tokens:
        out["cacheWriteInputTokens"] = u.cache_write_tokens
    return out


class CachePoint(dict):
    """The IR cache_control of a Bedrock cachePoint (Anthropic's shape, which carries a ttl too),
    typed so that write_request knows where it came from: these are written back. Another
    protocol's cache control (Anthropic's cache_control) becomes a cachePoint only for a lane whose
    model declares prompt_caching (Claude takes it; Nova refuses it with a 400), and is dropped
    otherwise: the request goes uncached rather than refused. The IR request is never mutated for
    it (the engine reuses it for the next lane)."""
    __slots__ = ()


cdef object _cache_control(object point):
    cdef object cc = CachePoint(type="ephemeral")
    if isinstance(point, dict):
        ttl = (<dict>point).get("ttl")
        if ttl == "5m" or ttl == "1h":
            cc["ttl"] = ttl
    return cc


cdef inline bint _writes_cache_point(object cache_control, bint caching):
    return type(cache_control) is CachePoint or (caching and cache_control is not None)


cdef dict _cache_point(object cache_control):
    cdef dict cp = {"type": "default"}
    if isinstance(cache_control, dict):
        ttl = (<dict>cache_control).get("ttl")
        if ttl == "5m" or ttl == "1h":
            cp["ttl"] = ttl
    return {"cachePoint": cp}


cdef str _document_name(str name, int n):
    """Bedrock accepts document names of letters, digits, single spaces, hyphens, parentheses and
    square brackets (1-200 chars); other characters become hyphens."""
    cdef list out = []
    cdef Py_ssize_t ln = 0
    cdef bint space = False
    if name:
        for ch in name:
            if ch.isspace():
                if not space and ln:
                    out.append(" ")
                    ln += 1
                space = True
                continue
            space = False
            out.append(ch if (ch.isascii() and ch.isalnum()) or ch in "-()[]" else "-")
            ln += 1
            if ln >= 200:
                break
    cleaned = "".join(out).strip()
    return cleaned if cleaned else "document-%d" % n


# ---------------------------------------------------------------------------------------------
# Helpers: reading content blocks (requests, responses and tool results share the ContentBlock union)


cdef Block _read_image(object v):
    cdef Block b
    cdef dict d, src
    if not isinstance(v, dict):
        raise CodecError("An image content block must be an object with format and source.")
    d = v
    fmt = d.get("format")
    if not isinstance(fmt, str):
        raise CodecError("An image content block needs a format (png, jpeg, gif or webp).")
    raw = d.get("source")
    if not isinstance(raw, dict):
        raise CodecError("An image content block needs a source.")
    src = raw
    b = Block.__new__(Block)
    b.kind = B_IMAGE
    b.media_type = IMAGE_MEDIA.get(fmt) or "image/" + <str>fmt
    data = src.get("bytes")
    if isinstance(data, str):
        b.src_kind = SRC_BASE64
        b.data = data
        return b
    s3 = src.get("s3Location")
    if isinstance(s3, dict) and isinstance((<dict>s3).get("uri"), str):
        b.src_kind = SRC_VENDOR
        b.data = (<dict>s3)["uri"]
        return b
    raise CodecError("An image source needs bytes or an s3Location.")


cdef Block _read_document(object v):
    cdef Block b
    cdef dict d, src
    cdef list parts
    if not isinstance(v, dict):
        raise CodecError("A document content block must be an object with name and source.")
    d = v
    raw = d.get("source")
    if not isinstance(raw, dict):
        raise CodecError("A document content block needs a source.")
    src = raw
    fmt = d.get("format")
    b = Block.__new__(Block)
    b.kind = B_DOCUMENT
    b.name = str_or_none(d.get("name"))
    b.media_type = DOC_MEDIA.get(fmt) if isinstance(fmt, str) else None
    data = src.get("bytes")
    if isinstance(data, str):
        b.src_kind = SRC_BASE64
        b.data = data
        if b.media_type is None:
            b.media_type = "application/pdf"
        return b
    text = src.get("text")
    if isinstance(text, str):
        b.text = text
        b.media_type = "text/plain"
        return b
    content = src.get("content")
    if isinstance(content, list):
        parts = []
        for item in content:
            if isinstance(item, dict) and isinstance((<dict>item).get("text"), str):
                parts.append((<dict>item)["text"])
        b.text = "".join(parts)
        b.media_type = "text/plain"
        return b
    s3 = src.get("s3Location")
    if isinstance(s3, dict) and isinstance((<dict>s3).get("uri"), str):
        b.src_kind = SRC_VENDOR
        b.data = (<dict>s3)["uri"]
        return b
    raise CodecError("A document source needs bytes, text, content or an s3Location.")


cdef Block _read_tool_result(object v):
    cdef Block b
    cdef dict d, part
    cdef list content = []
    if not isinstance(v, dict):
        raise CodecError("A toolResult content block must be an object.")
    d = v
    tid = d.get("toolUseId")
    if not isinstance(tid, str):
        raise CodecError("A toolResult content block needs a toolUseId.")
    raw = d.get("content")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise CodecError("A toolResult content must be a list.")
    for item in raw:
        if not isinstance(item, dict):
            raise CodecError("Each toolResult content item must be an object.")
        part = item
        if "text" in part:
            text = part["text"]
            if not isinstance(text, str):
                raise CodecError("A toolResult text item must hold a string.")
            content.append(text_block(text))
        elif "json" in part:
            # The IR has no JSON part: the document travels as its JSON text, which is what
            # every other protocol's tool result carries anyway.
            content.append(text_block(orjson.dumps(part["json"]).decode()))
        elif "image" in part:
            content.append(_read_image(part["image"]))
        elif "document" in part:
            content.append(_read_document(part["document"]))
    b = Block.__new__(Block)
    b.kind = B_TOOL_RESULT
    b.id = tid
    b.content = content
    b.is_error = d.get("status") == "error"
    return b


cdef Block _read_block(dict raw):
    """One ContentBlock union member as an IR block; None for members with no IR home (video,
    audio, searchResult, toolAddition/Removal): they are dropped."""
    cdef Block b
    cdef dict d
    cdef list parts
    if "text" in raw:
        v = raw["text"]
        if not isinstance(v, str):
            raise CodecError("A text content block must hold a string.")
        return text_block(v)
    if "toolUse" in raw:
        v = raw["toolUse"]
        if not isinstance(v, dict):
            raise CodecError("A toolUse content block must be an object.")
        d = v
        if not isinstance(d.get("toolUseId"), str) or not isinstance(d.get("name"), str):
            raise CodecError("A toolUse content block needs a toolUseId and a name.")
        b = Block.__new__(Block)
        b.kind = B_TOOL_USE
        b.id = d["toolUseId"]
        b.name = d["name"]
        b.input = d.get("input", {})
        return b
    if "toolResult" in raw:
        return _read_tool_result(raw["toolResult"])
    if "image" in raw:
        return _read_image(raw["image"])
    if "reasoningContent" in raw:
        v = raw["reasoningContent"]
        if not isinstance(v, dict):
            raise CodecError("A reasoningContent content block must be an object.")
        d = v
        b = Block.__new__(Block)
        b.kind = B_THINKING
        if "redactedContent" in d:
            if not isinstance(d["redactedContent"], str):
                raise CodecError("reasoningContent.redactedContent must be base64 text.")
            b.redacted = True
            b.data = d["redactedContent"]
            return b
        v = d.get("reasoningText")
        if not isinstance(v, dict) or not isinstance((<dict>v).get("text"), str):
            raise CodecError("reasoningContent needs reasoningText with a text, or redactedContent.")
        b.text = (<dict>v)["text"]
        b.signature = str_or_none((<dict>v).get("signature"))
        return b
    if "document" in raw:
        return _read_document(raw["document"])
    if "citationsContent" in raw:
        v = raw["citationsContent"]
        if not isinstance(v, dict):
            raise CodecError("A citationsContent content block must be an object.")
        d = v
        parts = []
        gen = d.get("content")
        if isinstance(gen, list):
            for item in gen:
                if isinstance(item, dict) and isinstance((<dict>item).get("text"), str):
                    parts.append((<dict>item)["text"])
        b = text_block("".join(parts))
        cites = d.get("citations")
        if isinstance(cites, list) and cites:
            b.citations = cites
        return b
    if "guardContent" in raw:
        # Text the caller marked for guardrail evaluation is still prompt text.
        v = raw["guardContent"]
        if isinstance(v, dict) and isinstance((<dict>v).get("text"), dict):
            text = (<dict>(<dict>v)["text"]).get("text")
            if isinstance(text, str):
                return text_block(text)
        return None
    return None


cdef list _read_content(object items):
    """A ContentBlocks list. A cachePoint marks the end of a cached prefix: it becomes the
    cache_control of the block before it."""
    cdef list out = []
    cdef Block b, last = None
    if not isinstance(items, list):
        raise CodecError("Each message needs a content list.")
    for raw in items:
        if not isinstance(raw, dict):
            raise CodecError("Each content block must be an object.")
        if "cachePoint" in raw:
            if last is not None:
                last.cache_control = _cache_control((<dict>raw)["cachePoint"])
            continue
        b = _read_block(<dict>raw)
        if b is not None:
            out.append(b)
            last = b
    return out


# ---------------------------------------------------------------------------------------------
# Request


cpdef Request read_request(bytes body):
    cdef Request req
    cdef dict obj, d
    cdef Message m
    cdef Block b, last
    cdef Tool t, last_tool
    cdef list content
    obj = jsonget.request_object(body, NOT_AN_OBJECT)
    req = Request()

    # Converse takes no messages when modelId is a prompt-management ARN, so they are optional.
    v = opt_list(obj, "messages", "messages", SHAPE)
    if v is not None:
        for item in v:
            if not isinstance(item, dict):
                raise CodecError("Each message must be an object with a role and content.")
            d = item
            role = d.get("role")
            content = _read_content(d.get("content"))
            if role == "user" or role == "assistant":
                m = Message.__new__(Message)
                m.role = ROLE_USER if role == "user" else ROLE_ASSISTANT
                m.content = content
                req.messages.append(m)
            elif role == "system":
                for b in content:
                    if b.kind == B_TEXT:
                        req.system.append(b)
            else:
                raise CodecError("Each message needs a role of user or assistant.")

    v = opt_list(obj, "system", "system", SHAPE)
    if v is not None:
        last = None
        for item in v:
            if not isinstance(item, dict):
                raise CodecError("Each system block must be an object.")
            d = item
            if "text" in d:
                if not isinstance(d["text"], str):
                    raise CodecError("A system text block must hold a string.")
                last = text_block(d["text"])
                req.system.append(last)
            elif "cachePoint" in d:
                if last is not None:
                    last.cache_control = _cache_control(d["cachePoint"])

    d = opt_dict(obj, "inferenceConfig", "inferenceConfig", SHAPE)
    if d is not None:
        req.max_tokens = opt_int(d, "maxTokens", "inferenceConfig.maxTokens", SHAPE)
        req.temperature = opt_number(d, "temperature", "inferenceConfig.temperature", SHAPE)
        req.top_p = opt_number(d, "topP", "inferenceConfig.topP", SHAPE)
        x = d.get("stopSequences")
        if x is not None:
            if type(x) is not list:
                raise SHAPE.bad_type("inferenceConfig.stopSequences", J_STRINGS, x)
            for item in x:
                if type(item) is not str:
                    raise SHAPE.bad_type("inferenceConfig.stopSequences", J_STRINGS, x)
            req.stop = list(x)

    v = opt_dict(obj, "toolConfig", "toolConfig", SHAPE)
    if v is not None:
        d = v
        tools = opt_list(d, "tools", "toolConfig.tools", SHAPE)
        last_tool = None
        for item in tools or ():
            if not isinstance(item, dict):
                raise CodecError("Each tool must be an object.")
            if "toolSpec" in item:
                spec = (<dict>item)["toolSpec"]
                if not isinstance(spec, dict) or not isinstance((<dict>spec).get("name"), str):
                    raise CodecError("Each toolSpec needs a name.")
                t = Tool.__new__(Tool)
                t.name = (<dict>spec)["name"]
                t.description = str_or_none((<dict>spec).get("description"))
                schema = (<dict>spec).get("inputSchema")
                t.schema = (<dict>schema).get("json") if isinstance(schema, dict) else None
                req.tools.append(t)
                last_tool = t
            elif "cachePoint" in item and last_tool is not None:
                last_tool.cache_control = _cache_control((<dict>item)["cachePoint"])
        choice = d.get("toolChoice")
        if choice is not None:
            if not isinstance(choice, dict):
                raise CodecError("toolConfig.toolChoice must be an object.")
            if "auto" in choice:
                req.tool_choice = TC_AUTO
            elif "any" in choice:
                req.tool_choice = TC_REQUIRED
            elif "tool" in choice:
                x = (<dict>choice)["tool"]
                if not isinstance(x, dict) or not isinstance((<dict>x).get("name"), str):
                    raise CodecError("toolConfig.toolChoice.tool needs a name.")
                req.tool_choice = TC_TOOL
                req.tool_choice_name = (<dict>x)["name"]

    for key in EXTRA_FIELDS:
        if key in obj:
            req.extra[key] = obj[key]

    # Anthropic-on-Bedrock knobs that have an IR home, so they survive a hop to another protocol.
    v = obj.get("additionalModelRequestFields")
    if isinstance(v, dict):
        x = (<dict>v).get("thinking")
        if isinstance(x, dict) and (<dict>x).get("type") == "enabled":
            budget = (<dict>x).get("budget_tokens")
            if isinstance(budget, int) and not isinstance(budget, bool):
                req.reasoning_budget = budget
        x = (<dict>v).get("top_k")
        if isinstance(x, int) and not isinstance(x, bool):
            req.top_k = x

    # Bedrock's native structured output (outputConfig.textFormat) maps onto response_format.
    v = obj.get("outputConfig")
    if isinstance(v, dict):
        fmt = (<dict>v).get("textFormat")
        if isinstance(fmt, dict) and (<dict>fmt).get("type") == "json_schema":
            st = (<dict>fmt).get("structure")
            js = (<dict>st).get("jsonSchema") if isinstance(st, dict) else None
            if isinstance(js, dict) and isinstance((<dict>js).get("schema"), str):
                try:
                    schema = orjson.loads((<dict>js)["schema"])
                except orjson.JSONDecodeError:
                    raise CodecError("outputConfig.textFormat jsonSchema.schema must be JSON text.")
                req.response_format = RF_JSON_SCHEMA
                req.rf_schema = schema
                req.rf_name = str_or_none((<dict>js).get("name"))
    return req


cdef bint _native_output(Request req):
    """A same-protocol request that asked for Bedrock's own outputConfig.textFormat: written back
    as it came, not as a forced tool."""
    v = req.extra.get("outputConfig")
    return isinstance(v, dict) and "textFormat" in <dict>v


cpdef object forced_tool_name(Request req):
    """The tool write_request forces to carry structured output, or None when it forces none."""
    if req.response_format != RF_JSON_SCHEMA and req.response_format != RF_JSON_OBJECT:
        return None
    if _native_output(req):
        return None
    return req.rf_name or FORCED_TOOL


cdef bint _tool_loop_without_thinking(list messages):
    """True mid tool loop (the last turn holds tool results) when the assistant turn that called
    the tools does not start with reasoning: Claude rejects enabling thinking then (history from a
    non-thinking vendor looks like this)."""
    cdef dict last, prev
    cdef list content
    if len(messages) < 2:
        return False
    last = messages[len(messages) - 1]
    prev = messages[len(messages) - 2]
    if last["role"] != "user" or prev["role"] != "assistant":
        return False
    for x in <list>last["content"]:
        if "toolResult" in x:
            break
    else:
        return False
    content = prev["content"]
    return not content or "reasoningContent" not in content[0]


cdef dict _image_json(Block b):
    """An image as Bedrock takes it: base64 bytes, or an s3:// reference (native to Bedrock);
    URLs and other vendors' references have no Converse form, so they are dropped (None)."""
    fmt = IMAGE_FORMAT.get(b.media_type.lower()) if b.media_type else None
    if fmt is None:
        return None
    if b.src_kind == SRC_BASE64 and b.data:
        return {"image": {"format": fmt, "source": {"bytes": b.data}}}
    if b.src_kind == SRC_VENDOR and b.data and b.data.startswith("s3://"):
        return {"image": {"format": fmt, "source": {"s3Location": {"uri": b.data}}}}
    return None


cdef dict _document_json(Block b, int n):
    cdef str name = _document_name(b.name, n)
    fmt = DOC_FORMAT.get(b.media_type.lower()) if b.media_type else None
    if b.src_kind == SRC_BASE64 and b.data:
        if fmt is None:
            return None
        return {"document": {"format": fmt, "name": name, "source": {"bytes": b.data}}}
    if b.src_kind == SRC_VENDOR and b.data and b.data.startswith("s3://") and fmt is not None:
        return {"document": {"format": fmt, "name": name, "source": {"s3Location": {"uri": b.data}}}}
    if b.text is not None and b.src_kind != SRC_URL and b.src_kind != SRC_VENDOR:
        return {"document": {"format": fmt if fmt in ("txt", "md", "html", "csv") else "txt",
                             "name": name, "source": {"text": b.text}}}
    return None


cdef void _write_block(Block b, list out, int* docs, bint upstream, bint caching=False) except *:
    """Appends the ContentBlock(s) of one IR block (and its cachePoint) to out. upstream: the
    block goes into a request (history replayed to a model), not to a client; caching: the
    lane's model takes cache points (Request.prompt_caching)."""
    cdef dict item = None
    cdef dict d
    cdef list inner
    cdef Block c
    cdef int k = b.kind
    if k == B_TEXT:
        # Bedrock rejects blank text blocks ("The text field in the ContentBlock object is blank").
        if not text_is_empty(b):
            item = {"text": text_value(b)}      # a client's literal stays one (jsonspan)
    elif k == B_TOOL_USE:
        item = {"toolUse": {"toolUseId": b.id or "", "name": b.name or "",
                            "input": object_of(b.input)}}
    elif k == B_TOOL_RESULT:
        inner = []
        for c in (b.content or ()):
            if c.kind == B_TEXT:
                inner.append({"text": text_value(c)})
            elif c.kind == B_IMAGE:
                d = _image_json(c)
                if d is not None:
                    inner.append(d)
            elif c.kind == B_DOCUMENT:
                docs[0] += 1
                d = _document_json(c, docs[0])
                if d is not None:
                    inner.append(d)
        d = {"toolUseId": b.id or "", "content": inner}
        if b.is_error:
            d["status"] = "error"
        item = {"toolResult": d}
    elif k == B_THINKING:
        if b.redacted:
            if b.data:
                item = {"reasoningContent": {"redactedContent": b.data}}
        elif b.signature:
            item = {"reasoningContent": {"reasoningText": {"text": b.text or "",
                                                           "signature": b.signature}}}
        elif not upstream:
            item = {"reasoningContent": {"reasoningText": {"text": b.text or ""}}}
        # Unsigned reasoning replayed upstream (another vendor's) is dropped: Claude behind
        # Converse rejects it, as Anthropic itself does.
    elif k == B_IMAGE:
        item = _image_json(b)
    elif k == B_DOCUMENT:
        docs[0] += 1
        item = _document_json(b, docs[0])
    if item is None:
        return
    out.append(item)
    if _writes_cache_point(b.cache_control, caching):
        out.append(_cache_point(b.cache_control))


cpdef bytes write_request(Request req):
    cdef dict body = {}
    cdef list messages = []
    cdef list content, system, tools
    cdef dict cfg, amrf, prev = None
    cdef Message m
    cdef Block b
    cdef Tool t
    cdef int docs = 0
    cdef str role
    cdef object forced = forced_tool_name(req)
    cdef bint caching = req.prompt_caching

    for m in req.messages:
        content = []
        for b in m.content:
            _write_block(b, content, &docs, True, caching)
        if not content:
            continue
        role = "assistant" if m.role == ROLE_ASSISTANT else "user"
        # Converse requires strictly alternating roles; the IR may hold two user turns in a row
        # (OpenAI tool messages followed by a user message), and Bedrock wants them as one.
        if prev is not None and prev["role"] == role:
            (<list>prev["content"]).extend(content)
            continue
        prev = {"role": role, "content": content}
        messages.append(prev)
    body["messages"] = messages

    system = []
    for b in req.system:
        if not text_is_empty(b):
            system.append({"text": text_value(b)})
            if _writes_cache_point(b.cache_control, caching):
                system.append(_cache_point(b.cache_control))
    if system:
        body["system"] = system

    cfg = {}
    if req.max_tokens is not None:
        cfg["maxTokens"] = req.max_tokens
    if req.temperature is not None:
        # Converse's range is [0, 1] (InferenceConfigurationTemperatureFloat); OpenAI's and
        # Gemini's go to 2.
        cfg["temperature"] = 1.0 if req.temperature > 1 else (0.0 if req.temperature < 0 else req.temperature)
    if req.top_p is not None:
        cfg["topP"] = req.top_p
    if req.stop:
        cfg["stopSequences"] = list(req.stop)

    tools = []
    for t in req.tools:
        d = {"name": t.name, "inputSchema": {
            "json": t.schema if t.schema is not None else {"type": "object", "properties": {}}}}
        if t.description:
            d["description"] = t.description
        tools.append({"toolSpec": d})
        if _writes_cache_point(t.cache_control, caching):
            tools.append(_cache_point(t.cache_control))
    user_tools = len(req.tools) > 0
    if forced is not None:
        schema = req.rf_schema if req.response_format == RF_JSON_SCHEMA and req.rf_schema is not None \
            else {"type": "object"}
        tools.append({"toolSpec": {"name": forced, "description": FORCED_TOOL_DESCRIPTION,
                                   "inputSchema": {"json": schema}}})
    choice = None
    if tools:
        if forced is not None:
            if user_tools and req.tool_choice == TC_TOOL and req.tool_choice_name:
                choice = {"tool": {"name": req.tool_choice_name}}
            elif user_tools and req.tool_choice != TC_NONE:
                # The caller's tools stay callable; `any` makes the model either call one of them
                # or answer through the schema tool, never in free text (as the anthropic codec).
                choice = {"any": {}}
            else:
                choice = {"tool": {"name": forced}}
        elif req.tool_choice == TC_AUTO:
            choice = {"auto": {}}
        elif req.tool_choice == TC_REQUIRED:
            choice = {"any": {}}
        elif req.tool_choice == TC_TOOL:
            choice = {"tool": {"name": req.tool_choice_name}} if req.tool_choice_name else {"any": {}}
        # TC_NONE has no Converse form (SPEC 1.5): the tools stay, the choice is dropped.
        body["toolConfig"] = {"tools": tools, "toolChoice": choice} if choice is not None \
            else {"tools": tools}

    for key in EXTRA_FIELDS:
        if key in req.extra:
            body[key] = req.extra[key]

    # Thinking rides in additionalModelRequestFields as Anthropic-on-Bedrock expects it, under the
    # rules the anthropic codec applies (Claude enforces the same ones behind Converse). A caller's
    # own additionalModelRequestFields.thinking (same protocol) is left as sent.
    v = body.get("additionalModelRequestFields")
    budget = claude_budget(req.reasoning_budget, req.reasoning_effort, req.max_tokens)
    if budget is not None and not (isinstance(v, dict) and "thinking" in <dict>v) \
            and not (choice is not None and ("any" in choice or "tool" in choice)) \
            and not _tool_loop_without_thinking(messages):
        amrf = dict(<dict>v) if isinstance(v, dict) else {}
        amrf["thinking"] = {"type": "enabled", "budget_tokens": budget}
        body["additionalModelRequestFields"] = amrf
        # Thinking is incompatible with a temperature change, and takes top_p only in [0.95, 1].
        cfg.pop("temperature", None)
        if not claude_top_p_ok(cfg.get("topP")):
            del cfg["topP"]
    if cfg:
        body["inferenceConfig"] = cfg
    return orjson.dumps(body)


# upstream_path's escaped ids: a lane sends the same few ids on every request, and urllib's quote
# is Python (the one bytecode a Bedrock request ran besides the signature). Emptied when full:
# ids come from the config, or from callers on a pass-through, so it stays bounded either way.
cdef dict _SEGMENTS = {}


cpdef str upstream_path(str model, bint stream):
    # The model id is one path segment: `:` and `/` (inference profile ARNs) are escaped as
    # botocore does, and SigV4 then signs this path encoded once more (busbar/upstream/sigv4.py).
    cdef object seg = _SEGMENTS.get(model)
    if seg is None:
        seg = quote(model, safe="")
        if len(_SEGMENTS) >= 256:
            _SEGMENTS.clear()
        _SEGMENTS[model] = seg
    return "/model/" + <str>seg + ("/converse-stream" if stream else "/converse")


# ---------------------------------------------------------------------------------------------
# Response and usage (buffered)


cdef int _stop_of(object v):
    if v is None:
        return SR_UNSET
    return STOP_OF.get(v, SR_OTHER) if isinstance(v, str) else SR_OTHER


cdef str _stop_sequence_of(object fields):
    """Claude on Bedrock names the matched stop sequence in additionalModelResponseFields."""
    if isinstance(fields, dict):
        return str_or_none((<dict>fields).get("stop_sequence"))
    return None


cpdef Response read_response(bytes body):
    cdef Response resp
    cdef dict obj
    try:
        raw = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise CodecError(UPSTREAM_NOT_JSON)
    if not isinstance(raw, dict):
        raise CodecError(UPSTREAM_NOT_JSON)
    obj = raw
    resp = Response()
    out = obj.get("output")
    msg = (<dict>out).get("message") if isinstance(out, dict) else None
    if not isinstance(msg, dict):
        raise CodecError("The upstream response has no output message.")
    content = (<dict>msg).get("content")
    resp.content = _read_content(content) if content is not None else []
    resp.stop_reason = _stop_of(obj.get("stopReason"))
    resp.stop_sequence = _stop_sequence_of(obj.get("additionalModelResponseFields"))
    resp.usage = _usage_of(obj.get("usage"))
    return resp


cpdef bytes write_response(Response resp):
    cdef list content = []
    cdef Block b
    cdef int docs = 0
    cdef dict body
    for b in resp.content:
        _write_block(b, content, &docs, False)
    body = {
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": STOP_NAME.get(resp.stop_reason, "end_turn"),
        "usage": _usage_json(resp.usage if resp.usage is not None else Usage()),
        # Converse requires metrics; a translated answer has no Bedrock latency to report.
        "metrics": {"latencyMs": 0},
    }
    if resp.stop_reason == SR_STOP_SEQUENCE and resp.stop_sequence:
        body["additionalModelResponseFields"] = {"stop_sequence": resp.stop_sequence}
    return orjson.dumps(body)


cdef tuple _USAGE_KEY = (b"usage",)
cdef tuple _USAGE_NAMES = (b"inputTokens", b"outputTokens", b"cacheReadInputTokens",
                           b"cacheWriteInputTokens")


cpdef Usage read_usage(bytes body):
    """Usage of a same-protocol buffered body: the body is validated and the `usage` counts read
    in place (framing.members), no dict built."""
    cdef object span
    cdef list v
    try:
        span = scan_top(body, _USAGE_KEY).get(b"usage")
    except FramingError:
        raise CodecError(UPSTREAM_NOT_JSON)
    if span is None or body[<Py_ssize_t>span[0]] == 110:       # absent or null
        return _unknown_usage()
    v = members(body, span, _USAGE_NAMES)
    if v is None:
        return _usage_of(None)
    return _usage_from(v[0], v[1], v[2], v[3])


# ---------------------------------------------------------------------------------------------
# Errors and discovery


cpdef str error_type(str kind):
    """The exception name of a canonical kind, as the x-amzn-errortype header and `__type` carry
    it (boto3 raises the named exception class only when the header is present)."""
    return ERROR_TYPE.get(kind, "InternalServerException")


cdef str _error_type_of_status(int status):
    if status == 401 or status == 403:
        return "AccessDeniedException"
    if status == 404:
        return "ResourceNotFoundException"
    if status == 429:
        return "ThrottlingException"
    if status == 408 or status == 504:
        return "ModelTimeoutException"
    if status == 503:
        return "ServiceUnavailableException"
    if status >= 500:
        return "InternalServerException"
    return "ValidationException"


cpdef bytes write_error(int status, str kind, str message, str request_id=None):
    name = ERROR_TYPE.get(kind) if kind is not None else None
    if name is None:
        name = _error_type_of_status(status)
    return orjson.dumps({"__type": name, "message": message})


# busbar's own refusals in AWS's words (_common.own_error_in says what each kind is).
cdef dict OWN_ERRORS = {
    "authentication": (403, "The security token included in the request is invalid."),
    "permission": (403, None),
    "quota": (400, None),
}


cpdef tuple own_error(str kind):
    return own_error_in(OWN_ERRORS, kind)


cpdef tuple read_error_detail(bytes body):
    """(message, code) of an upstream error body; the code is the exception name of `__type`
    (ThrottlingException, ...), without the `namespace#` prefix some services put before it."""
    cdef dict raw = error_object(body, False)
    if raw is None:
        return (None, None)
    msg = raw.get("message")
    if not isinstance(msg, str):
        msg = raw.get("Message")
    code = raw.get("__type")
    if not isinstance(code, str):
        code = raw.get("code") if isinstance(raw.get("code"), str) else None
    if code is not None:
        code = (<str>code).rpartition("#")[2].partition(":")[0] or None
    return (msg if isinstance(msg, str) and msg else None, code)


cdef str _uuid4():
    return ids.uuid4()


cpdef bytes response_headers(object upstream_headers, str request_id):
    """`x-amzn-RequestId`: the upstream's own on a relayed answer, else a fresh UUID (boto3
    exposes it as ResponseMetadata.RequestId; AWS ids are UUIDs, busbar's request id is not)."""
    cdef object rid = None
    if upstream_headers is not None:
        for name, value in upstream_headers:
            if name == b"x-amzn-requestid":
                rid = value
                break
    if rid is None:
        rid = _uuid4().encode()
    return b"x-amzn-RequestId: " + rid + b"\r\n"


cpdef bytes error_headers(str kind, str request_id):
    """boto3 raises the named exception class only when x-amzn-ErrorType is present."""
    return b"x-amzn-RequestId: " + _uuid4().encode() + b"\r\nx-amzn-ErrorType: " + \
        error_type(kind).encode() + b"\r\n"


not_found_message = model_not_found

# ConverseStream always ends with a metadata event carrying usage: nothing for the client to ask,
# nothing to hide.
wants_stream_usage = usage_always_sent
stream_usage_request = body_as_is


cpdef StreamEncoder stream_encoder(str id, str model, bint include_usage, bint json_array):
    return StreamEncoder(id, model)


cpdef str mint_id():
    """A request id (x-amzn-RequestId): Bedrock answers carry no body id, only this header."""
    return ids.uuid4()


cdef str _kind_of_exception(object name):
    if not isinstance(name, str):
        return "api_error"
    return KIND_OF_EXCEPTION.get((<str>name).lower(), "api_error")


# ---------------------------------------------------------------------------------------------
# Decoder: upstream frames -> IR


cdef class StreamDecoder:

    def __cinit__(self, Py_ssize_t max_frame=0):
        self.parser = EventStreamParser(max_frame if max_frame > 0 else DEFAULT_MAX_FRAME)
        self.seq = BlockSequencer()
        self.stop_reason = SR_UNSET

    cpdef list feed(self, bytes chunk):
        cdef list out = []
        cdef list frames
        cdef tuple frame
        if self.done:
            return out
        try:
            frames = self.parser.feed(chunk)
        except EventStreamError:
            raise CodecError(UPSTREAM_BAD_FRAME) from None
        for frame in frames:
            self._frame(<dict>frame[0], <bytes>frame[1], out)
            if self.done:
                break
        return out

    cpdef list close(self):
        """Upstream EOF. usage arrives in `metadata` after messageStop; a stream that ends after
        messageStop without it is still complete. Without messageStop the stream was cut, and the
        engine reports that itself."""
        cdef list out = []
        if not self.done and self.stopped:
            self._finish(out)
        return out

    cdef void _start(self, list out) except *:
        if not self.started:
            self.started = True
            out.append(ev_message_start(None, None, _unknown_usage()))

    cdef bint _open_as(self, object wire, int kind):
        """The open block is Bedrock's block `wire` and of `kind`."""
        return self.seq.open_index >= 0 and self.seq.open_kind == kind and self.open_wire == wire

    cdef void _open(self, object wire, int kind, list out) except *:
        self.seq.open(out, kind)
        self.open_wire = wire

    cdef void _close(self, object wire, list out) except *:
        if self.seq.open_index >= 0 and self.open_wire == wire:
            self.seq.close(out)

    cdef void _finish(self, list out) except *:
        self.seq.close(out)
        self._start(out)
        out.append(ev_message_delta(self.stop_reason if self.stop_reason != SR_UNSET else SR_END_TURN,
                                    self.stop_sequence,
                                    self.usage if self.usage is not None else _unknown_usage()))
        out.append(ev_message_stop())
        self.done = True

    cdef void _frame(self, dict headers, bytes payload, list out) except *:
        cdef dict obj, delta, x
        cdef Block b
        mtype = headers.get(":message-type")
        if mtype == "exception":
            try:
                raw = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raw = None
            msg = None
            if isinstance(raw, dict):
                msg = str_or_none((<dict>raw).get("message")) or str_or_none((<dict>raw).get("Message"))
            etype = headers.get(":exception-type")
            out.append(ev_error(_kind_of_exception(etype),
                                msg or str_or_none(etype) or "The upstream reported an error."))
            self.done = True
            return
        if mtype == "error":
            out.append(ev_error(_kind_of_exception(headers.get(":error-code")),
                                str_or_none(headers.get(":error-message")) or "The upstream reported an error."))
            self.done = True
            return
        if mtype != "event":
            return
        etype = headers.get(":event-type")
        obj = jsonget.frame_object(payload)
        wire = obj.get("contentBlockIndex")
        if not isinstance(wire, int) or isinstance(wire, bool):
            wire = -1  # a frame without a usable index still belongs to the one unnamed block
        if etype == "contentBlockDelta":
            self._start(out)
            v = obj.get("delta")
            if not isinstance(v, dict):
                return
            delta = v
            if "text" in delta:
                text = str_or_none(delta["text"])
                if text is None:
                    return
                if not self._open_as(wire, B_TEXT):
                    self._open(wire, B_TEXT, out)
                self.seq.text(out, text)
            elif "toolUse" in delta:
                v = delta["toolUse"]
                text = str_or_none((<dict>v).get("input")) if isinstance(v, dict) else None
                if text is None:
                    return
                if not self._open_as(wire, B_TOOL_USE):
                    self._open(wire, B_TOOL_USE, out)
                self.seq.tool_args(out, text)
            elif "reasoningContent" in delta:
                v = delta["reasoningContent"]
                if not isinstance(v, dict):
                    return
                x = v
                if "redactedContent" in x:
                    data = str_or_none(x["redactedContent"])
                    if data is None or (self.seq.open_index >= 0 and self.open_wire == wire):
                        return
                    b = Block.__new__(Block)
                    b.kind = B_THINKING
                    b.redacted = True
                    b.data = data
                    self.seq.start(out, b)
                    self.open_wire = wire
                    return
                if not self._open_as(wire, B_THINKING):
                    self._open(wire, B_THINKING, out)
                if "text" in x:
                    text = str_or_none(x["text"])
                    if text is not None:
                        self.seq.thinking(out, text)
                elif "signature" in x:
                    text = str_or_none(x["signature"])
                    if text is not None:
                        self.seq.delta(out, D_SIGNATURE, text)
            elif "citation" in delta:
                if not (self.seq.open_index >= 0 and self.open_wire == wire):
                    self._open(wire, B_TEXT, out)
                self.seq.delta(out, D_CITATION, None).data = delta["citation"]
        elif etype == "contentBlockStart":
            self._start(out)
            v = obj.get("start")
            if isinstance(v, dict) and isinstance((<dict>v).get("toolUse"), dict):
                x = (<dict>v)["toolUse"]
                self.seq.tool_start(out, str_or_none(x.get("toolUseId")), str_or_none(x.get("name")))
                self.open_wire = wire
        elif etype == "contentBlockStop":
            self._close(wire, out)
        elif etype == "messageStart":
            self._start(out)
        elif etype == "messageStop":
            self._start(out)
            self.seq.close(out)
            self.stopped = True
            self.finished = True
            self.stop_reason = _stop_of(obj.get("stopReason"))
            self.stop_sequence = _stop_sequence_of(obj.get("additionalModelResponseFields"))
            if self.usage is not None:
                self._finish(out)
        elif etype == "metadata":
            self.usage = _usage_of(obj.get("usage"))
            if self.stopped:
                self._finish(out)


# ---------------------------------------------------------------------------------------------
# Encoder: IR -> client frames


cdef bytes _padded(dict payload):
    cdef bytes raw = orjson.dumps(payload)
    cdef Py_ssize_t n = len(raw)
    cdef Py_ssize_t k = PAD_TO - (n + 7) % PAD_TO   # `,"p":""` is 7 bytes; k is 1..PAD_TO
    return raw[:n - 1] + b',"p":"' + PAD[:k] + b'"}'


cdef inline bytes _event(str etype, dict payload):
    return encode_frame(<bytes>EVENT_HEADERS[etype], _padded(payload))


cdef class StreamEncoder:

    def __init__(self, str id, str model):
        self.id = id
        self.model = model
        self.kinds = {}
        self.wire = {}
        self.input_sent = {}
        self.arguments = {}
        self.signatures = {}
        self.stop_reason = SR_UNSET

    cdef void _start(self, bytearray out) except *:
        if not self.started:
            self.started = True
            out += _event("messageStart", {"role": "assistant"})

    cdef int _wire(self, int index) except -1:
        w = self.wire.get(index)
        if w is None:
            w = self.next_index
            self.next_index += 1
            self.wire[index] = w
        return <int>w

    cdef void _stop_block(self, int index, bytearray out) except *:
        kind = self.kinds.pop(index, None)
        w = self.wire.pop(index, None)
        sig = self.signatures.pop(index, None)
        sent = self.input_sent.pop(index, False)
        args = self.arguments.pop(index, None)
        if w is None:
            return
        if args is not None:
            text = (<ObjectStream>args).close()
            if text:
                sent = True
                out += _event("contentBlockDelta", {"contentBlockIndex": w,
                                                    "delta": {"toolUse": {"input": text}}})
        if kind == B_TOOL_USE and not sent:
            # Clients join the input deltas and parse the result; a call without arguments still
            # needs an object to parse.
            out += _event("contentBlockDelta", {"contentBlockIndex": w,
                                                "delta": {"toolUse": {"input": "{}"}}})
        if sig is not None:
            out += _event("contentBlockDelta", {"contentBlockIndex": w,
                                                "delta": {"reasoningContent": {"signature": sig}}})
        out += _event("contentBlockStop", {"contentBlockIndex": w})

    cdef void _finish(self, bytearray out) except *:
        cdef dict stop
        self._start(out)
        for index in list(self.kinds):
            self._stop_block(<int>index, out)
        stop = {"stopReason": STOP_NAME.get(self.stop_reason, "end_turn")}
        if self.stop_reason == SR_STOP_SEQUENCE and self.stop_sequence:
            stop["additionalModelResponseFields"] = {"stop_sequence": self.stop_sequence}
        out += _event("messageStop", stop)
        out += _event("metadata", {
            "usage": _usage_json(self.usage if self.usage is not None else Usage()),
            # A translated stream has no Bedrock latency; clients read the field, so it is present.
            "metrics": {"latencyMs": 0},
        })
        self.done = True

    cpdef bytes encode(self, list events):
        cdef bytearray out = bytearray()
        cdef Event ev
        cdef Block b
        cdef int k, w, kind
        for ev in events:
            if self.done:
                break
            k = ev.kind
            if k == EV_BLOCK_DELTA:
                self._start(out)
                kind = self.kinds.get(ev.index, 0)
                if ev.delta_kind == D_TEXT:
                    if not ev.text or (kind != B_TEXT and kind != 0):
                        continue
                    w = self._wire(ev.index)
                    self.kinds[ev.index] = B_TEXT
                    out += _event("contentBlockDelta", {"contentBlockIndex": w,
                                                        "delta": {"text": ev.text}})
                elif ev.delta_kind == D_INPUT_JSON:
                    if kind != B_TOOL_USE or not ev.text or self.input_sent.get(ev.index) == 2:
                        continue
                    # Clients join the input deltas and parse them as one object: ObjectStream
                    # keeps them one (arguments.pxd).
                    args = self.arguments.get(ev.index)
                    if args is None:
                        args = ObjectStream()
                        self.arguments[ev.index] = args
                    text = (<ObjectStream>args).feed(ev.text)
                    if not text:
                        continue
                    w = self._wire(ev.index)
                    self.input_sent[ev.index] = 1
                    out += _event("contentBlockDelta", {"contentBlockIndex": w,
                                                        "delta": {"toolUse": {"input": text}}})
                elif ev.delta_kind == D_THINKING:
                    if not ev.text or (kind != B_THINKING and kind != 0):
                        continue
                    w = self._wire(ev.index)
                    self.kinds[ev.index] = B_THINKING
                    out += _event("contentBlockDelta", {"contentBlockIndex": w,
                                                        "delta": {"reasoningContent": {"text": ev.text}}})
                elif ev.delta_kind == D_SIGNATURE:
                    if kind == B_THINKING and ev.text:
                        self.signatures[ev.index] = ev.text
                # Citations: the IR carries other vendors' raw citation objects, which are not
                # Bedrock CitationsDelta shapes; the cited text itself still streams.
            elif k == EV_BLOCK_START:
                self._start(out)
                b = ev.block
                if b is None:
                    continue
                if b.kind == B_TOOL_USE:
                    w = self._wire(ev.index)
                    self.kinds[ev.index] = B_TOOL_USE
                    out += _event("contentBlockStart", {
                        "contentBlockIndex": w,
                        "start": {"toolUse": {"toolUseId": b.id or "", "name": b.name or ""}}})
                    # Protocols whose calls arrive whole (Gemini) put the input on the start.
                    if b.input is not None and b.input != {}:
                        self.input_sent[ev.index] = 2
                        out += _event("contentBlockDelta", {
                            "contentBlockIndex": w,
                            "delta": {"toolUse": {"input": orjson.dumps(object_of(b.input)).decode()}}})
                elif b.kind == B_TEXT:
                    self.kinds[ev.index] = B_TEXT
                    if b.text:
                        w = self._wire(ev.index)
                        out += _event("contentBlockDelta", {"contentBlockIndex": w,
                                                            "delta": {"text": b.text}})
                elif b.kind == B_THINKING:
                    self.kinds[ev.index] = B_THINKING
                    if b.redacted:
                        if b.data:
                            w = self._wire(ev.index)
                            out += _event("contentBlockDelta", {
                                "contentBlockIndex": w,
                                "delta": {"reasoningContent": {"redactedContent": b.data}}})
                    else:
                        if b.text:
                            w = self._wire(ev.index)
                            out += _event("contentBlockDelta", {
                                "contentBlockIndex": w,
                                "delta": {"reasoningContent": {"text": b.text}}})
                        if b.signature:
                            self.signatures[ev.index] = b.signature
            elif k == EV_BLOCK_STOP:
                self._stop_block(ev.index, out)
            elif k == EV_MESSAGE_START:
                self.usage = merge_usage(self.usage, ev.usage)
                self._start(out)
            elif k == EV_MESSAGE_DELTA:
                self.stop_reason = ev.stop_reason
                self.stop_sequence = ev.stop_sequence
                self.usage = merge_usage(self.usage, ev.usage)
            elif k == EV_MESSAGE_STOP:
                self._finish(out)
            elif k == EV_ERROR:
                out += self.error(ev.error_kind or "api_error", ev.message or "")
        return bytes(out)

    cpdef bytes error(self, str kind, str message):
        """An exception frame, as ConverseStream ends a failed stream; nothing may follow it."""
        if self.done:
            return b""
        self.done = True
        return encode_frame(
            encode_headers({":exception-type": STREAM_EXCEPTION.get(kind, "internalServerException"),
                            ":content-type": "application/json", ":message-type": "exception"}),
            orjson.dumps({"message": message}))


def error_signals(doc):
    """What an error_map is matched against in a Bedrock error body (`doc`, parsed): `message`,
    then the exception name of `__type`."""
    if not isinstance(doc, dict):
        return []
    kind = doc.get("__type")
    if isinstance(kind, str):
        kind = kind.replace("/", "#").rpartition("#")[2]
    return [s for s in (doc.get("message"), kind) if isinstance(s, str) and s]
