# cython: language_level=3
"""Anthropic Messages (`POST /v1/messages`) codec: client and upstream bodies, the SSE stream in both
directions, errors and the model list, all to and from the IR (docs/codecs.md). Sans-IO.

Wire authority: the `anthropic` SDK's types (anthropic/types/message_create_params.py, message.py,
raw_message_stream_event.py, shared/error_response.py)."""

from cpython.dict cimport PyDict_GetItem
from cpython.object cimport PyObject

import base64
import binascii

import orjson

from cbusbar cimport ids

from cbusbar cimport ir
from cbusbar.ir import CodecError, kind_of_status
from cbusbar.framing import FramingError
from cbusbar.framing cimport members, scan_top, sse_event
from cbusbar cimport jsonget
from cbusbar cimport jsonspan
from cbusbar.jsonspan cimport Marks
from cbusbar.jsonget cimport (
    Shape, as_dict, as_list, as_str, opt_bool, opt_dict, opt_int, opt_list, opt_number, opt_str,
    req_list, req_str, is_int, count, J_CONTENT,
)
from cbusbar.jsonget import NOT_AN_OBJECT, UPSTREAM_NOT_JSON
from cbusbar.usage cimport merge_usage
from cbusbar.arguments cimport ObjectStream, object_of
from cbusbar.reasoning cimport claude_budget, claude_top_p_ok
from cbusbar.proto._common cimport SSEDecoder, error_object, own_error_in
from cbusbar.proto._common import body_as_is, error_code_type, model_not_found, usage_always_sent

NAME = "anthropic"
CONTENT_TYPE = b"application/json"
STREAM_CONTENT_TYPE = b"text/event-stream"
BODY_MODEL = True           # the model name travels in the body
NEEDS_MAX_TOKENS = True     # the Messages API refuses a request without max_tokens
# The top-level members the engine reads without parsing (one scan of the body): the model,
# stream, and where the caller's output cap lives; MAX_TOKENS_PATH is that cap's path, one level
# deep at most (governance reserves a budget for it before the call).
SCAN_KEYS = (b"model", b"stream", b"max_tokens")
MAX_TOKENS_PATH = ((b"max_tokens",),)
PROBE_MAX_TOKENS = 1        # health probes: the Messages API accepts max_tokens >= 1
# Egress: what busbar/engine/egress.py sends this API besides the body, and the API's cloud
# forms (docs/codecs.md "Egress").
USER_AGENT = b"Anthropic/Python 0.39.0"
# The Messages API names its version in a header (not on Vertex: vertex_body).
API_HEADERS = (b"anthropic-version: 2023-06-01",)
BETA_HEADERS = (b"anthropic-beta",)
AZURE_FORMS = ()
# Claude on Vertex AI: Vertex's `anthropic` publisher, the request reshaped by vertex_body.
VERTEX_PUBLISHER = "anthropic"

# Anthropic rejects a request without max_tokens; the engine injects the configured default on a
# cross-protocol hop (SPEC 1.6), this is the last resort when nobody did.
DEFAULT_MAX_TOKENS = 4096

# Anthropic allows at most 4 cache_control breakpoints per request (SPEC 1.5 clamps egress to that).
cdef int MAX_BREAKPOINTS = 4

STRUCTURED_TOOL = "structured_output"
STRUCTURED_DESCRIPTION = "Respond with JSON that matches this schema."


# The citation shapes Anthropic's TextCitation union accepts; anything else would fail the SDK's
# discriminated union (and a request carrying it is rejected with a 400).
cdef frozenset CITATION_TYPES = frozenset((
    "char_location", "page_location", "content_block_location", "web_search_result_location",
    "search_result_location"))

# Stop reasons, both directions (SPEC 1.5). `model_context_window_exceeded` is the newer API's
# "ran out of room", which every other protocol calls a length stop.
cdef dict STOP_IN = {
    "end_turn": ir.SR_END_TURN, "max_tokens": ir.SR_MAX_TOKENS, "stop_sequence": ir.SR_STOP_SEQUENCE,
    "tool_use": ir.SR_TOOL_USE, "pause_turn": ir.SR_PAUSE_TURN, "refusal": ir.SR_REFUSAL,
    "model_context_window_exceeded": ir.SR_MAX_TOKENS,
}
cdef dict STOP_OUT = {
    ir.SR_END_TURN: "end_turn", ir.SR_MAX_TOKENS: "max_tokens", ir.SR_STOP_SEQUENCE: "stop_sequence",
    ir.SR_TOOL_USE: "tool_use", ir.SR_PAUSE_TURN: "pause_turn", ir.SR_REFUSAL: "refusal",
}

# Canonical error kinds (ir.ERROR_KINDS) <-> Anthropic error types (SPEC 1.7). Quota is a 429
# rate_limit_error, as Anthropic itself reports a reached spend limit (the SDK's
# EnforcedSpendLimitReachedError is a RateLimitError).
cdef dict ERROR_TYPE_OUT = {
    "invalid_request": "invalid_request_error", "authentication": "authentication_error",
    "permission": "permission_error", "not_found": "not_found_error",
    "request_too_large": "request_too_large", "rate_limit": "rate_limit_error",
    "quota": "rate_limit_error", "api_error": "api_error", "overloaded": "overloaded_error",
    "timeout": "timeout_error",
}
cdef dict ERROR_KIND_IN = {
    "invalid_request_error": "invalid_request", "authentication_error": "authentication",
    "permission_error": "permission", "not_found_error": "not_found",
    "request_too_large": "request_too_large", "rate_limit_error": "rate_limit",
    "billing_error": "quota", "api_error": "api_error", "overloaded_error": "overloaded",
    "timeout_error": "timeout",
}

# Request keys with an IR home; every other top-level key goes to req.extra.
cdef frozenset OWNED_KEYS = frozenset((
    "model", "system", "messages", "tools", "tool_choice", "max_tokens", "temperature", "top_p",
    "top_k", "stop_sequences", "stream", "metadata", "thinking"))


# Anthropic validates bodies with pydantic and words a shape error the pydantic way:
# `messages: Input should be a valid list`, `messages.0.content: Field required`.
cdef tuple PYDANTIC_WORDS = (None, "a valid string", "a valid integer", "a valid number",
                             "a valid boolean", "a valid dictionary", "a valid list",
                             "a valid string or list", "a valid string or list", "a valid dictionary")


cdef class AnthropicShape(Shape):

    cpdef object bad_type(self, str path, int expected, object value):
        return CodecError("%s: Input should be %s" % (path, PYDANTIC_WORDS[expected]))

    cpdef object missing(self, str path):
        return CodecError("%s: Field required" % path)


cdef AnthropicShape SHAPE = AnthropicShape()


# ---------------------------------------------------------------------------------------------
# Helpers


cpdef str mint_id():
    """A native message id: msg_01 followed by 22 base62 characters, like Anthropic's."""
    return "msg_01" + ids.b62(22)


cdef object _citation(object c):
    """One citation in a shape Anthropic accepts, or None. Anthropic's own pass through; an OpenAI
    url_citation (Chat nests it, Responses is flat) becomes a web_search_result_location."""
    cdef object t, u
    if not isinstance(c, dict):
        return None
    t = c.get("type")
    if type(t) is str and t in CITATION_TYPES:     # a list there is not a key (TypeError)
        return c
    if t == "url_citation":
        u = c.get("url_citation")
        if not isinstance(u, dict):
            u = c
        if isinstance(u.get("url"), str):
            return {"type": "web_search_result_location", "url": u["url"],
                    "title": u.get("title") if isinstance(u.get("title"), str) else None,
                    "cited_text": "", "encrypted_index": ""}
    return None


cdef list _citations(object cs):
    cdef list out = []
    cdef object c
    if not isinstance(cs, list):
        return out
    for c in cs:
        c = _citation(c)
        if c is not None:
            out.append(c)
    return out


# ---------------------------------------------------------------------------------------------
# Request: read_request


cdef str _path(object where):
    """An error path, built only when an error needs it: `where` is the path, or (parent, part)
    for `parent.part` (per-message and per-block paths stay tuples on the fast path)."""
    if type(where) is str:
        return where
    return f"{_path((<tuple>where)[0])}.{(<tuple>where)[1]}"


cdef inline str _field_str(dict d, str key, object where, bint required):
    """d[key] as a string; the path `where.key` is only built for the error (per-block fast path)."""
    cdef object v = d.get(key)
    if type(v) is str or (v is None and not required):
        return v
    return as_str(v, _path(where) + "." + key, SHAPE)


cdef object _cache_control(dict d):
    cdef object cc = d.get("cache_control")
    return cc if isinstance(cc, dict) else None


cdef void _read_source(ir.Block b, object src, str where, bint document) except *:
    cdef object st, content
    cdef list texts
    where = where + ".source"
    as_dict(src, where, SHAPE)
    st = src.get("type")
    if st == "base64":
        b.src_kind = ir.SRC_BASE64
        b.media_type = _field_str(src, "media_type", where, True)
        b.data = _field_str(src, "data", where, True)
    elif st == "url":
        b.src_kind = ir.SRC_URL
        b.data = _field_str(src, "url", where, True)
    elif st == "file":
        b.src_kind = ir.SRC_VENDOR
        b.data = _field_str(src, "file_id", where, True)
    elif document and st == "text":
        b.media_type = "text/plain"
        b.text = _field_str(src, "data", where, True)
    elif document and st == "content":
        # A document made of content blocks: the IR keeps its text (images inside are dropped).
        content = src.get("content")
        if type(content) is str:
            b.text = content
        elif isinstance(content, list):
            # Each block is a chunk Anthropic cites on its own: a passage, not a piece of one
            # text. Joined into one document text, the line keeps that boundary.
            texts = [c["text"] for c in content
                     if isinstance(c, dict) and c.get("type") == "text" and type(c.get("text")) is str]
            b.text = "\n".join(texts)
        else:
            raise SHAPE.bad_type(where + ".content", J_CONTENT, content)
        b.media_type = "text/plain"
    elif document:
        raise CodecError(f"{where}.type: Input should be 'base64', 'text', 'content', 'url' or 'file'")
    else:
        raise CodecError(f"{where}.type: Input should be 'base64', 'url' or 'file'")


cdef ir.Block _read_block(object raw, object where):
    """One content block, or None for a block type the IR does not carry (server tool blocks,
    search results, container uploads...): those only matter same-protocol, where bytes relay.
    `where`: its path (_path)."""
    cdef ir.Block b
    cdef object t, v, content
    cdef list inner
    cdef Py_ssize_t i
    cdef dict d
    if type(raw) is not dict:
        as_dict(raw, _path(where), SHAPE)
    d = <dict>raw
    t = _field_str(d, "type", where, True)
    b = ir.Block.__new__(ir.Block)
    if t == "text":
        b.kind = ir.B_TEXT
        v = d.get("text")
        if type(v) is bytes:
            b.text_json = v             # the client's literal, kept for a JSON writer (jsonspan)
        else:
            b._text = _field_str(d, "text", where, True)
        v = d.get("citations")
        if isinstance(v, list) and v:
            b.citations = v
    elif t == "image":
        b.kind = ir.B_IMAGE
        _read_source(b, d.get("source"), _path(where), False)
    elif t == "document":
        b.kind = ir.B_DOCUMENT
        _read_source(b, d.get("source"), _path(where), True)
        v = d.get("title")
        if type(v) is str:
            b.name = v
        # Block.citations carries a document's citation switch ({"enabled": true}); Bedrock's
        # document block has the same shape.
        v = d.get("citations")
        if isinstance(v, dict):
            b.citations = v
    elif t == "tool_use":
        b.kind = ir.B_TOOL_USE
        b.id = _field_str(d, "id", where, True)
        b.name = _field_str(d, "name", where, True)
        v = d.get("input")
        b.input = v if v is not None else {}
    elif t == "tool_result":
        b.kind = ir.B_TOOL_RESULT
        b.id = _field_str(d, "tool_use_id", where, True)
        content = d.get("content")
        inner = []
        if type(content) is str:
            if content:
                inner.append(ir.text_block(content))
        elif type(content) is bytes:
            if len(<bytes>content) > 2:     # not `""`
                inner.append(ir.json_text_block(content))
        elif isinstance(content, list):
            for i in range(len(content)):
                v = _read_block(content[i], ((where, "content"), i))
                if v is not None and (<ir.Block>v).kind in (ir.B_TEXT, ir.B_IMAGE, ir.B_DOCUMENT):
                    inner.append(v)
        elif content is not None:
            raise SHAPE.bad_type(_path(where) + ".content", J_CONTENT, content)
        b.content = inner
        v = d.get("is_error")
        if v is not None and v is not True and v is not False:
            opt_bool(d, "is_error", _path(where) + ".is_error", SHAPE)    # raises
        b.is_error = v is True
    elif t == "thinking":
        b.kind = ir.B_THINKING
        b._text = _field_str(d, "thinking", where, True)
        b.signature = _field_str(d, "signature", where, False)
    elif t == "redacted_thinking":
        b.kind = ir.B_THINKING
        b.redacted = True
        b.data = _field_str(d, "data", where, True)
    else:
        return None
    b.cache_control = _cache_control(d)
    return b


cdef list _read_content(object content, Py_ssize_t msg):
    """messages[msg].content; its error path is built only for a list or an error."""
    cdef list out = []
    cdef Py_ssize_t i
    cdef ir.Block b
    cdef object where
    if type(content) is bytes:
        out.append(ir.json_text_block(content))
        return out
    if type(content) is str:
        out.append(ir.text_block(content))
        return out
    where = (("messages", msg), "content")
    if type(content) is not list:
        raise SHAPE.bad_type(_path(where), J_CONTENT, content)
    for i in range(len(content)):
        b = _read_block(content[i], (where, i))
        if b is not None:
            out.append(b)
    return out


cdef list _read_system(object system, str where):
    cdef list out = []
    cdef Py_ssize_t i
    cdef object raw, v
    cdef ir.Block b
    if type(system) is bytes:
        out.append(ir.json_text_block(system))
        return out
    if type(system) is str:
        out.append(ir.text_block(system))
        return out
    if type(system) is not list:
        raise SHAPE.bad_type(where, J_CONTENT, system)
    for i in range(len(system)):
        raw = system[i]
        if not isinstance(raw, dict) or (<dict>raw).get("type") != "text":
            raise CodecError(f"{where}.{i}.type: Input should be 'text'")
        v = (<dict>raw).get("text")
        if type(v) is bytes:
            b = ir.json_text_block(v)
        else:
            b = ir.text_block(_field_str(raw, "text", (where, i), True))
        b.cache_control = _cache_control(raw)
        out.append(b)
    return out


cdef void _read_tools(ir.Request req, object tools) except *:
    cdef list server = []
    cdef Py_ssize_t i
    cdef str where
    cdef object raw, t
    cdef ir.Tool tool
    as_list(tools, "tools", SHAPE)
    for i in range(len(tools)):
        raw = tools[i]
        if type(raw) is not dict:
            as_dict(raw, f"tools.{i}", SHAPE)
        t = raw.get("type")
        if t is not None and t != "custom":
            # Server tools (web_search_20250305, bash_..., mcp toolsets) run at Anthropic: they
            # have no meaning on another vendor, so they stay same-protocol only.
            server.append(raw)
            continue
        tool = ir.Tool.__new__(ir.Tool)
        where = f"tools.{i}"
        tool.name = _field_str(raw, "name", where, True)
        tool.description = _field_str(raw, "description", where, False)
        tool.schema = raw.get("input_schema")
        if type(tool.schema) is not dict:
            as_dict(tool.schema, f"tools.{i}.input_schema", SHAPE)
        tool.cache_control = _cache_control(raw)
        req.tools.append(tool)
    if server:
        req.extra["tools"] = server


cdef void _read_tool_choice(ir.Request req, object tc) except *:
    cdef object t, v
    as_dict(tc, "tool_choice", SHAPE)
    t = tc.get("type")
    if t == "auto":
        req.tool_choice = ir.TC_AUTO
    elif t == "any":
        req.tool_choice = ir.TC_REQUIRED
    elif t == "none":
        req.tool_choice = ir.TC_NONE
    elif t == "tool":
        req.tool_choice = ir.TC_TOOL
        req.tool_choice_name = req_str(tc, "name", "tool_choice.name", SHAPE)
    else:
        raise CodecError("tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'")
    v = opt_bool(tc, "disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use", SHAPE)
    if v is not None:
        req.parallel_tool_calls = not v


cdef object _lax_int(dict d, str key, str path):
    """Anthropic validates with pydantic in lax mode: 1024.0 passes as an integer too."""
    cdef object v = d.get(key)
    if type(v) is float and v.is_integer():
        return int(v)
    return opt_int(d, key, path, SHAPE)


# The string values read_request takes as the client's JSON literals (jsonspan): the text of the
# system prompt, of message contents given as a string, of text blocks and of tool results, at any
# depth of tool_result content. States: 1 the body, 2 a content (string or blocks), 3 messages,
# 4 a content block, 5 a message, 6 a block's text.
cdef Marks REQUEST_MARKS = Marks([
    None,
    (False, 0, {"system": 2, "messages": 3}),
    (True, 4, {}),
    (False, 5, {}),
    (False, 0, {"type": 0, "text": 6, "content": 2}),
    (False, 0, {"role": 0, "content": 2}),
    (True, 0, {}),
], ("user", "assistant", "text"))


cpdef ir.Request read_request(bytes body):
    """A client's Messages body -> IR. Unknown top-level fields (service_tier, container,
    mcp_servers, output_config, ...) go to req.extra; so do server tools, non-`enabled` thinking
    modes and metadata other than user_id. Text arrives as the client's JSON literals where the
    body allows (jsonspan.parse; Block.text_json), else orjson reads the body as before."""
    cdef object d, v, msgs, raw, role, fmt
    cdef ir.Request req
    cdef ir.Message m
    cdef Py_ssize_t i
    cdef dict meta
    cdef PyObject* cp
    d = jsonspan.parse(body, REQUEST_MARKS)
    if d is None:
        d = jsonget.request_object(body, NOT_AN_OBJECT)
    req = ir.Request()

    req.model = opt_str(d, "model", "model", SHAPE)
    req.stream = opt_bool(d, "stream", "stream", SHAPE) is True

    v = d.get("system")
    if v is not None:
        req.system = _read_system(v, "system")

    msgs = req_list(d, "messages", "messages", SHAPE)
    for i in range(len(msgs)):
        raw = msgs[i]
        if type(raw) is not dict:
            as_dict(raw, f"messages.{i}", SHAPE)
        role = (<dict>raw).get("role")
        cp = PyDict_GetItem(raw, "content")
        if cp == NULL:
            raise SHAPE.missing(f"messages.{i}.content")
        m = ir.Message.__new__(ir.Message)
        if type(role) is str and role == "user":
            m.role = ir.ROLE_USER
        elif type(role) is str and role == "assistant":
            m.role = ir.ROLE_ASSISTANT
        elif role == "system":
            # Newer SDKs allow system turns inside `messages`; the IR has one system prompt, so
            # their text joins it in order.
            req.system.extend(_read_system(<object>cp, f"messages.{i}.content"))
            continue
        else:
            raise CodecError(f"messages.{i}.role: Input should be 'user' or 'assistant'")
        m.content = _read_content(<object>cp, i)
        req.messages.append(m)

    v = d.get("tools")
    if v is not None:
        _read_tools(req, v)
    v = d.get("tool_choice")
    if v is not None:
        _read_tool_choice(req, v)

    req.max_tokens = _lax_int(d, "max_tokens", "max_tokens")
    req.temperature = opt_number(d, "temperature", "temperature", SHAPE)
    req.top_p = opt_number(d, "top_p", "top_p", SHAPE)
    req.top_k = _lax_int(d, "top_k", "top_k")

    v = opt_list(d, "stop_sequences", "stop_sequences", SHAPE)
    if v is not None:
        for i in range(len(v)):
            as_str(v[i], f"stop_sequences.{i}", SHAPE)
        req.stop = v

    v = opt_dict(d, "metadata", "metadata", SHAPE)
    if v is not None:
        meta = dict(v)
        raw = meta.pop("user_id", None)
        if raw is not None:
            req.user = as_str(raw, "metadata.user_id", SHAPE)
        if meta:
            req.extra["metadata"] = meta

    v = opt_dict(d, "thinking", "thinking", SHAPE)
    if v is not None:
        if v.get("type") == "enabled":
            raw = v.get("budget_tokens")
            req.reasoning_budget = _lax_int(v, "budget_tokens", "thinking.budget_tokens")
            if req.reasoning_budget is None:
                raise SHAPE.missing("thinking.budget_tokens")
        else:
            # disabled / adaptive / between_tools: no budget to carry, kept same-protocol.
            req.extra["thinking"] = v

    for k, v in d.items():
        if k not in OWNED_KEYS:
            req.extra[k] = v

    # Native structured output (output_config.format) is also the IR's response format, so it can
    # cross to another vendor; output_config itself stays in extra for the same-protocol writer.
    v = d.get("output_config")
    if isinstance(v, dict):
        fmt = v.get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
            req.response_format = ir.RF_JSON_SCHEMA
            req.rf_schema = fmt["schema"]
    return req


# ---------------------------------------------------------------------------------------------
# Request: write_request


cdef str _tool_id(str s):
    """Anthropic tool ids must match ^[a-zA-Z0-9_-]+$. Other vendors' ids (Bedrock's, a Gemini-minted
    one with dots) get every other character replaced by `_`; tool_use and tool_result go through
    this same function, so the pair keeps matching."""
    cdef Py_ssize_t o
    cdef bint clean = True
    if not s:
        return "toolu_missing"
    for ch in s:
        o = ord(ch)
        if not (48 <= o <= 57 or 65 <= o <= 90 or 97 <= o <= 122 or o == 95 or o == 45):
            clean = False
            break
    if clean:
        return s
    return "".join([ch if (48 <= ord(ch) <= 57 or 65 <= ord(ch) <= 90 or 97 <= ord(ch) <= 122
                           or ch == "_" or ch == "-") else "_" for ch in s])


cdef dict _tool_input(object v):
    """Anthropic wants the arguments as an object: arguments.object_of (text that was not one
    object arrives as {"_raw_arguments": text})."""
    return object_of(v)


cdef object _cc(object cache_control, int* left):
    """The cache_control to write, while breakpoints remain (the first four in prompt order)."""
    if cache_control is None or left[0] <= 0:
        return None
    left[0] -= 1
    return cache_control


cdef dict _image_source(ir.Block b):
    cdef str data = b.data
    cdef Py_ssize_t comma
    if data is None:
        return None
    if b.src_kind == ir.SRC_BASE64:
        return {"type": "base64", "media_type": b.media_type or "image/png", "data": data}
    if b.src_kind == ir.SRC_URL:
        if data.startswith("data:"):
            # data:<media type>;base64,<payload>: Anthropic's url source does not take data URIs.
            comma = data.find(",")
            if comma > 0 and data[:comma].endswith(";base64"):
                return {"type": "base64", "media_type": data[5:comma - 7] or "image/png",
                        "data": data[comma + 1:]}
            return None
        return {"type": "url", "url": data}
    if b.src_kind == ir.SRC_VENDOR and data.startswith("file_"):
        # Anthropic Files API ids look like file_…; other vendors' references (OpenAI file-…,
        # gs://, s3://) mean nothing to Anthropic and are dropped.
        return {"type": "file", "file_id": data}
    return None


cdef dict _document_source(ir.Block b):
    cdef str mt = b.media_type or ""
    cdef str data = b.data
    if b.src_kind == ir.SRC_NONE:
        if b.text is None:
            return None
        return {"type": "text", "media_type": "text/plain", "data": b.text}
    if data is None:
        return None
    if b.src_kind == ir.SRC_BASE64:
        if mt == "application/pdf":
            return {"type": "base64", "media_type": mt, "data": data}
        if mt.startswith("text/"):
            # Anthropic's base64 documents are PDFs only; a base64 text file becomes a text source.
            try:
                return {"type": "text", "media_type": "text/plain",
                        "data": base64.b64decode(data, validate=True).decode("utf-8")}
            except (binascii.Error, ValueError):
                return None
        return None
    if b.src_kind == ir.SRC_URL and not data.startswith("data:"):
        return {"type": "url", "url": data}
    if b.src_kind == ir.SRC_VENDOR and data.startswith("file_"):
        return {"type": "file", "file_id": data}
    return None


cdef dict _w_media(ir.Block b):
    """An image or document block, or None when its source cannot reach Anthropic."""
    cdef dict src, d
    if b.kind == ir.B_IMAGE:
        src = _image_source(b)
        if src is None:
            return None
        d = {"type": "image", "source": src}
    else:
        src = _document_source(b)
        if src is None:
            return None
        d = {"type": "document", "source": src}
        if b.name:
            d["title"] = b.name
        if isinstance(b.citations, dict):
            d["citations"] = b.citations
    return d


cdef dict _w_text(ir.Block b):
    cdef dict d
    cdef list cs
    if ir.text_is_empty(b):
        return None  # Anthropic rejects empty text blocks
    d = {"type": "text", "text": jsonspan.text_value(b)}   # a client's literal stays one
    if b.citations is not None:
        cs = _citations(b.citations)
        if cs:
            d["citations"] = cs
    return d


cdef dict _w_block(ir.Block b, int role, int* left):
    """One message content block in Anthropic's shape, or None when it must not be sent: empty
    text, unsigned thinking (Anthropic rejects thinking without a signature), sources Anthropic
    cannot read, and blocks in a role that cannot hold them."""
    cdef dict d = None
    cdef list inner
    cdef ir.Block c
    cdef dict cd
    cdef int k = b.kind
    cdef object cc
    if k == ir.B_TEXT:
        d = _w_text(b)
    elif k == ir.B_IMAGE or k == ir.B_DOCUMENT:
        if role == ir.ROLE_USER:
            d = _w_media(b)
    elif k == ir.B_TOOL_USE:
        if role == ir.ROLE_ASSISTANT:
            d = {"type": "tool_use", "id": _tool_id(b.id), "name": b.name or "",
                 "input": _tool_input(b.input)}
    elif k == ir.B_TOOL_RESULT:
        if role == ir.ROLE_USER:
            d = {"type": "tool_result", "tool_use_id": _tool_id(b.id)}
            inner = []
            if b.content:
                for c in b.content:
                    if c.kind == ir.B_TEXT:
                        cd = _w_text(c)
                    elif c.kind == ir.B_IMAGE or c.kind == ir.B_DOCUMENT:
                        cd = _w_media(c)
                    else:
                        cd = None
                    if cd is not None:
                        cc = _cc(c.cache_control, left)
                        if cc is not None:
                            cd["cache_control"] = cc
                        inner.append(cd)
            if inner:
                d["content"] = inner
            if b.is_error:
                d["is_error"] = True
    elif k == ir.B_THINKING:
        if role == ir.ROLE_ASSISTANT:
            if b.redacted:
                if b.data:
                    return {"type": "redacted_thinking", "data": b.data}
            elif b.signature:
                return {"type": "thinking", "thinking": b.text or "", "signature": b.signature}
        return None  # thinking blocks cannot carry cache_control
    if d is not None:
        cc = _cc(b.cache_control, left)
        if cc is not None:
            d["cache_control"] = cc
    return d


cdef list _w_messages(list messages, int* left):
    """Anthropic's messages: blocks it would reject removed, emptied turns dropped, consecutive
    same-role turns merged (OpenAI's run of `tool` messages is one user turn here), and tool
    results moved to the front of a user turn (Anthropic requires them first)."""
    cdef list out = []
    cdef list blocks, results, rest
    cdef ir.Message m
    cdef ir.Block b
    cdef dict d, last = None
    cdef str role
    for m in messages:
        blocks = []
        for b in m.content:
            d = _w_block(b, m.role, left)
            if d is not None:
                blocks.append(d)
        if not blocks:
            continue
        role = "assistant" if m.role == ir.ROLE_ASSISTANT else "user"
        if last is not None and last["role"] == role:
            last["content"].extend(blocks)
        else:
            last = {"role": role, "content": blocks}
            out.append(last)
    for d in out:
        if d["role"] == "user":
            blocks = d["content"]
            results = [x for x in blocks if x["type"] == "tool_result"]
            if results and len(results) < len(blocks):
                rest = [x for x in blocks if x["type"] != "tool_result"]
                d["content"] = results + rest
    return out


cdef bint _tool_loop_without_thinking(list messages):
    """True when the conversation is mid tool loop (it ends with tool results) and the assistant
    turn that called the tools does not start with a thinking block: Anthropic rejects enabling
    thinking then (history from a non-thinking vendor looks like this)."""
    cdef dict last, prev
    cdef str first
    if len(messages) < 2:
        return False
    last = messages[len(messages) - 1]
    prev = messages[len(messages) - 2]
    if last["role"] != "user" or prev["role"] != "assistant":
        return False
    for x in last["content"]:
        if x["type"] == "tool_result":
            break
    else:
        return False
    first = prev["content"][0]["type"]
    return first != "thinking" and first != "redacted_thinking"


cpdef object forced_tool_name(ir.Request req):
    """The name of the tool write_request forces to carry a JSON response format, or None. The
    engine unwraps a call of this tool back into text on the way back (SPEC: busbar goes beyond
    the reference). A same-protocol request with native output_config.format forces nothing."""
    cdef object oc
    if req.response_format != ir.RF_JSON_SCHEMA and req.response_format != ir.RF_JSON_OBJECT:
        return None
    if req.extra:
        oc = req.extra.get("output_config")
        if isinstance(oc, dict) and oc.get("format") is not None:
            return None
    return req.rf_name or STRUCTURED_TOOL


cpdef bytes write_request(ir.Request req):
    """IR -> an upstream Messages body (SPEC 1.5, 1.6). Foreign-only knobs (seed, n, penalties,
    logprobs) are dropped; structured output becomes a forced tool."""
    cdef int left = MAX_BREAKPOINTS
    cdef dict d = {}
    cdef dict extra = req.extra if req.extra is not None else {}
    cdef list tools = []
    cdef list system = []
    cdef list messages
    cdef dict td, tc = None, meta
    cdef ir.Tool t
    cdef ir.Block b
    cdef object forced, cc, schema, v, budget, mt
    cdef bint user_tools

    d["model"] = req.model
    mt = req.max_tokens if req.max_tokens is not None else DEFAULT_MAX_TOKENS
    d["max_tokens"] = mt

    # Breakpoints are counted in Anthropic's prompt order: tools, system, messages.
    for t in req.tools:
        schema = t.schema
        if not isinstance(schema, dict) or not schema:
            schema = {"type": "object", "properties": {}}
        elif "type" not in schema:
            schema = dict(schema, type="object")
        td = {"name": t.name}
        if t.description:
            td["description"] = t.description
        td["input_schema"] = schema
        cc = _cc(t.cache_control, &left)
        if cc is not None:
            td["cache_control"] = cc
        tools.append(td)
    v = extra.get("tools")
    if isinstance(v, list):
        tools.extend(v)
    user_tools = len(tools) > 0
    forced = forced_tool_name(req)
    if forced is not None:
        schema = req.rf_schema if req.response_format == ir.RF_JSON_SCHEMA else None
        if not isinstance(schema, dict):
            schema = {"type": "object"}
        tools.append({"name": forced, "description": STRUCTURED_DESCRIPTION, "input_schema": schema})

    for b in req.system:
        if b.kind == ir.B_TEXT and not ir.text_is_empty(b):
            td = {"type": "text", "text": jsonspan.text_value(b)}
            cc = _cc(b.cache_control, &left)
            if cc is not None:
                td["cache_control"] = cc
            system.append(td)
    if system:
        d["system"] = system

    messages = _w_messages(req.messages, &left)
    d["messages"] = messages

    if tools:
        d["tools"] = tools
        if forced is not None:
            if user_tools and req.tool_choice == ir.TC_TOOL and req.tool_choice_name:
                tc = {"type": "tool", "name": req.tool_choice_name}
            elif user_tools and req.tool_choice != ir.TC_NONE:
                # The caller's tools stay callable; `any` makes the model either call one of them
                # or answer through the schema tool, never in free text.
                tc = {"type": "any"}
            else:
                tc = {"type": "tool", "name": forced}
        elif req.tool_choice == ir.TC_AUTO:
            tc = {"type": "auto"}
        elif req.tool_choice == ir.TC_NONE:
            tc = {"type": "none"}
        elif req.tool_choice == ir.TC_REQUIRED:
            tc = {"type": "any"}
        elif req.tool_choice == ir.TC_TOOL:
            tc = {"type": "tool", "name": req.tool_choice_name} if req.tool_choice_name else {"type": "any"}
        if req.parallel_tool_calls is False:
            if tc is None:
                tc = {"type": "auto"}
            if tc["type"] != "none":
                tc["disable_parallel_tool_use"] = True
        if tc is not None:
            d["tool_choice"] = tc

    if req.temperature is not None:
        # Anthropic's range is [0, 1]; OpenAI's and Gemini's go to 2.
        d["temperature"] = 1.0 if req.temperature > 1 else (0.0 if req.temperature < 0 else req.temperature)
    if req.top_p is not None:
        d["top_p"] = req.top_p
    if req.top_k is not None:
        d["top_k"] = req.top_k
    if req.stop:
        d["stop_sequences"] = req.stop
    if req.stream:
        d["stream"] = True

    meta = None
    v = extra.get("metadata")
    if isinstance(v, dict):
        meta = dict(v)
    if req.user is not None:
        if meta is None:
            meta = {}
        meta["user_id"] = req.user
    if meta:
        d["metadata"] = meta

    v = extra.get("thinking")
    if isinstance(v, dict):
        d["thinking"] = v
    else:
        budget = claude_budget(req.reasoning_budget, req.reasoning_effort, mt) if is_int(mt) else None
        # Anthropic rejects thinking with a forced tool choice, and mid tool loop when the calling
        # turn has no thinking block; answering without thinking beats a 400.
        if (budget is not None and not (tc is not None and tc["type"] in ("any", "tool"))
                and not _tool_loop_without_thinking(messages)):
            d["thinking"] = {"type": "enabled", "budget_tokens": budget}
            d.pop("temperature", None)
            d.pop("top_k", None)
            if not claude_top_p_ok(d.get("top_p")):
                del d["top_p"]

    for k, v in extra.items():
        if k not in d and k != "tools" and k != "metadata" and k != "thinking":
            d[k] = v
    return orjson.dumps(d)


cpdef str upstream_path(str model, bint stream):
    return "/v1/messages"


# ---------------------------------------------------------------------------------------------
# Response and usage


cdef ir.Usage _read_usage_obj(object u):
    """An Anthropic usage object -> IR usage (input becomes the total: + cache read + cache write)."""
    cdef object det
    if not isinstance(u, dict):
        return _usage_from(None, None, None, None, None, False)
    det = u.get("output_tokens_details")
    return _usage_from(u.get("input_tokens"), u.get("output_tokens"), u.get("cache_read_input_tokens"),
                       u.get("cache_creation_input_tokens"),
                       det.get("thinking_tokens") if isinstance(det, dict) else None, True)


cdef ir.Usage _usage_from(object inp, object out, object cache_read, object cache_write,
                          object thinking, bint is_object):
    """The one mapping of Anthropic's usage counts, from its dict (_read_usage_obj) or read in
    place (read_usage): input_tokens excludes both cache buckets, the IR's input includes them."""
    cdef ir.Usage usage = ir.Usage.__new__(ir.Usage)
    if not is_object:
        usage.input_known = False
        return usage
    usage.cache_read_tokens = count(cache_read)
    usage.cache_write_tokens = count(cache_write)
    usage.input_tokens = count(inp) + usage.cache_read_tokens + usage.cache_write_tokens
    usage.output_tokens = count(out)
    usage.reasoning_tokens = count(thinking)
    usage.input_known = inp is not None
    return usage


cdef dict _w_usage(ir.Usage u):
    """IR usage -> Anthropic's, whose input_tokens excludes both cache buckets."""
    cdef long long inp = u.input_tokens - u.cache_read_tokens - u.cache_write_tokens
    cdef dict d = {"input_tokens": inp if inp > 0 else 0, "output_tokens": u.output_tokens,
                   "cache_creation_input_tokens": u.cache_write_tokens,
                   "cache_read_input_tokens": u.cache_read_tokens}
    if u.reasoning_tokens > 0:
        d["output_tokens_details"] = {"thinking_tokens": u.reasoning_tokens}
    return d


cdef ir.Block _read_response_block(object raw):
    cdef ir.Block b
    cdef object t, v
    if not isinstance(raw, dict):
        return None
    t = raw.get("type")
    b = ir.Block.__new__(ir.Block)
    if t == "text":
        v = raw.get("text")
        if type(v) is not str:
            return None
        b.kind = ir.B_TEXT
        b.text = v
        v = raw.get("citations")
        if isinstance(v, list) and v:
            b.citations = v
    elif t == "tool_use":
        b.kind = ir.B_TOOL_USE
        v = raw.get("id")
        b.id = v if type(v) is str else None
        v = raw.get("name")
        b.name = v if type(v) is str else ""
        v = raw.get("input")
        b.input = v if v is not None else {}
    elif t == "thinking":
        b.kind = ir.B_THINKING
        v = raw.get("thinking")
        b.text = v if type(v) is str else ""
        v = raw.get("signature")
        b.signature = v if type(v) is str else None
    elif t == "redacted_thinking":
        v = raw.get("data")
        if type(v) is not str:
            return None
        b.kind = ir.B_THINKING
        b.redacted = True
        b.data = v
    else:
        return None  # server tool blocks (web search results...) have no IR home
    return b


cpdef ir.Response read_response(bytes body):
    cdef object d, v, raw
    cdef ir.Response resp
    cdef ir.Block b
    d = jsonget.upstream_object(body)
    resp = ir.Response()
    v = d.get("id")
    resp.id = v if type(v) is str else None
    v = d.get("model")
    resp.model = v if type(v) is str else None
    v = d.get("content")
    if isinstance(v, list):
        for raw in v:
            b = _read_response_block(raw)
            if b is not None:
                resp.content.append(b)
    v = d.get("stop_reason")
    resp.stop_reason = (ir.SR_UNSET if v is None else STOP_IN.get(v, ir.SR_OTHER) if type(v) is str
                        else ir.SR_OTHER)
    v = d.get("stop_sequence")
    resp.stop_sequence = v if type(v) is str else None
    resp.usage = _read_usage_obj(d.get("usage"))
    return resp


cdef dict _w_response_block(ir.Block b):
    cdef dict d
    cdef list cs
    if b.kind == ir.B_TEXT:
        if ir.text_is_empty(b):
            return None
        d = {"type": "text", "text": jsonspan.text_value(b)}
        if b.citations is not None:
            cs = _citations(b.citations)
            if cs:
                d["citations"] = cs
        return d
    if b.kind == ir.B_TOOL_USE:
        return {"type": "tool_use", "id": b.id or ("toolu_" + ids.b62(24)), "name": b.name or "",
                "input": _tool_input(b.input)}
    if b.kind == ir.B_THINKING:
        if b.redacted:
            return {"type": "redacted_thinking", "data": b.data or ""}
        return {"type": "thinking", "thinking": b.text or "", "signature": b.signature or ""}
    return None


cpdef bytes write_response(ir.Response resp):
    cdef list content = []
    cdef ir.Block b
    cdef dict d
    for b in resp.content:
        d = _w_response_block(b)
        if d is not None:
            content.append(d)
    return orjson.dumps({
        "id": resp.id, "type": "message", "role": "assistant", "model": resp.model or "",
        "content": content, "stop_reason": STOP_OUT.get(resp.stop_reason, "end_turn"),
        "stop_sequence": resp.stop_sequence,
        "usage": _w_usage(resp.usage if resp.usage is not None else ir.Usage()),
    })


cdef tuple _USAGE_KEY = (b"usage",)
cdef tuple _USAGE_NAMES = (b"input_tokens", b"output_tokens", b"cache_read_input_tokens",
                           b"cache_creation_input_tokens", b"output_tokens_details")
cdef tuple _USAGE_DETAIL_NAMES = (b"thinking_tokens",)


cpdef ir.Usage read_usage(bytes body):
    """Usage of a buffered same-protocol body without parsing the content: the body is validated
    and the `usage` counts read in place (framing.members), no dict built."""
    cdef list v
    cdef object span, det
    try:
        span = scan_top(body, _USAGE_KEY).get(b"usage")
    except FramingError:
        raise CodecError(UPSTREAM_NOT_JSON) from None
    v = members(body, span, _USAGE_NAMES) if span is not None else None
    if v is None:
        return _usage_from(None, None, None, None, None, False)
    det = v[4]
    det = members(body, det, _USAGE_DETAIL_NAMES)[0] if type(det) is tuple else None
    return _usage_from(v[0], v[1], v[2], v[3], det, True)


# ---------------------------------------------------------------------------------------------
# Errors and discovery


cpdef bytes write_error(int status, str kind, str message, str request_id=None):
    cdef str t = ERROR_TYPE_OUT.get(kind)
    cdef dict d
    if t is None:
        t = ERROR_TYPE_OUT[kind_of_status(status)]
    d = {"type": "error", "error": {"type": t, "message": message}}
    if request_id is not None:
        d["request_id"] = request_id
    return orjson.dumps(d)


# busbar's own refusals in Anthropic's words (_common.own_error_in says what each kind is).
cdef dict OWN_ERRORS = {
    "authentication": (401, "invalid x-api-key"),
    "permission": (403, None),
    "quota": (429, None),
}


cpdef tuple own_error(str kind):
    return own_error_in(OWN_ERRORS, kind)


cpdef tuple read_error_detail(bytes body):
    """(message, code) of an upstream error body; the code is Anthropic's `error.type`."""
    cdef dict d = error_object(body, False)
    cdef object e, msg = None, code = None
    if d is None:
        return (None, None)
    e = d.get("error")
    if isinstance(e, dict):
        if type(e.get("message")) is str:
            msg = e["message"]
        if type(e.get("type")) is str and e["type"]:
            code = e["type"]
    if msg is None and type(d.get("message")) is str:
        msg = d["message"]
    return (msg, code)


cpdef bytes response_headers(object upstream_headers, str request_id):
    """`request-id`: the upstream's own on a relayed answer, else busbar's request id (the SDK
    exposes it as `_request_id`)."""
    cdef object rid = None
    if upstream_headers is not None:
        for name, value in upstream_headers:
            if name == b"request-id":
                rid = value
                break
    if rid is None:
        rid = (request_id if request_id is not None else _request_id()).encode()
    return b"request-id: " + rid + b"\r\n"


cpdef bytes error_headers(str kind, str request_id):
    return b"request-id: " + (request_id if request_id is not None else _request_id()).encode() + b"\r\n"


cdef str _request_id():
    return "req_" + ids.hex_id(12)


not_found_message = model_not_found

# Anthropic streams always carry usage: nothing for the client to ask, nothing to hide.
wants_stream_usage = usage_always_sent
stream_usage_request = body_as_is


cpdef StreamEncoder stream_encoder(str id, str model, bint include_usage, bint json_array):
    return StreamEncoder(id, model)


# Claude on Vertex AI names the API version in the body (anthropic/lib/vertex/_client.py).
VERTEX_ANTHROPIC_VERSION = "vertex-2023-10-16"


cpdef tuple vertex_body(bytes body):
    """(model, body) of a request for Claude on Vertex AI, as anthropic.AnthropicVertex sends it:
    the model leaves the body (the egress names it in the Vertex path) and the API version comes
    in (no anthropic-version header there). None when the body is not a JSON object: it goes as
    it is, to the codec's own path."""
    cdef object obj
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if type(obj) is not dict:
        return None
    model = (<dict>obj).pop("model", None)
    (<dict>obj)["anthropic_version"] = VERTEX_ANTHROPIC_VERSION
    return model, orjson.dumps(obj)


cpdef bytes write_model_list(list names):
    # `lifecycle` is required by the current SDK's ModelInfo; busbar only lists what it serves.
    cdef list data = [{"type": "model", "id": n, "display_name": n,
                       "created_at": "1970-01-01T00:00:00Z", "lifecycle": "active"} for n in names]
    return orjson.dumps({"data": data, "has_more": False,
                         "first_id": names[0] if names else None,
                         "last_id": names[len(names) - 1] if names else None})


# ---------------------------------------------------------------------------------------------
# Decoder: upstream SSE -> IR events


cdef inline bytes _sse(str event, object payload):
    return sse_event(event.encode(), orjson.dumps(payload))


cdef class StreamDecoder(SSEDecoder):
    """Anthropic SSE -> IR events. Anthropic's stream already has the IR's shape; the decoder adds
    the cache buckets into input, keeps usage as running totals, and renumbers blocks densely
    (blocks the IR cannot carry, such as server tool results, are skipped)."""

    def __cinit__(self, Py_ssize_t max_frame=0):
        self.raw_input = 0
        self.blocks = {}
        self.next_index = 0

    cdef void _frame(self, object event, bytes data, list out) except *:
        cdef object obj, t, msg, err
        cdef ir.Usage u
        if not data or ((data[0] == 32 or data[0] == 9) and not data.strip()):
            return  # an event without data, or blank data (a keep-alive; docs/codecs.md)
        obj = jsonget.frame_object(data)
        t = obj.get("type")
        if type(t) is not str and event is not None:
            t = event.decode("utf-8", "replace")
        if t == "content_block_delta":
            self._block_delta(obj, out)
        elif t == "content_block_start":
            self._block_start(obj, out)
        elif t == "content_block_stop":
            t = self._block(obj)
            if t is not None:
                out.append(ir.ev_block_stop(t))
        elif t == "message_delta":
            self._message_delta(obj, out)
        elif t == "message_start":
            msg = obj.get("message")
            if not isinstance(msg, dict):
                msg = {}
            u = _read_usage_obj(msg.get("usage"))
            self.usage = u
            self.raw_input = u.input_tokens - u.cache_read_tokens - u.cache_write_tokens
            out.append(ir.ev_message_start(
                msg.get("id") if type(msg.get("id")) is str else None,
                msg.get("model") if type(msg.get("model")) is str else None, u.copy()))
        elif t == "message_stop":
            self.done = True
            self.finished = True
            out.append(ir.ev_message_stop())
        elif t == "error":
            err = obj.get("error")
            if not isinstance(err, dict):
                err = {}
            self.done = True
            out.append(ir.ev_error(
                ERROR_KIND_IN.get(err["type"], "api_error") if type(err.get("type")) is str
                else "api_error",
                err.get("message") if type(err.get("message")) is str else "The upstream stream failed."))
        # ping and unknown event types carry nothing for the IR

    cdef void _block_start(self, dict obj, list out) except *:
        cdef object up = obj.get("index"), cb = obj.get("content_block"), t, v
        cdef ir.Block b
        cdef int index
        if not is_int(up) or not isinstance(cb, dict):
            return
        t = cb.get("type")
        b = ir.Block.__new__(ir.Block)
        if t == "text":
            b.kind = ir.B_TEXT
        elif t == "tool_use":
            b.kind = ir.B_TOOL_USE
            v = cb.get("id")
            b.id = v if type(v) is str else None
            v = cb.get("name")
            b.name = v if type(v) is str else ""
        elif t == "thinking":
            b.kind = ir.B_THINKING
        elif t == "redacted_thinking":
            b.kind = ir.B_THINKING
            b.redacted = True
            v = cb.get("data")
            b.data = v if type(v) is str else ""
        else:
            return
        index = self.next_index
        self.next_index += 1
        self.blocks[up] = index
        out.append(ir.ev_block_start(index, b))
        # Start blocks are normally empty; anything they do carry becomes deltas, so encoders
        # only ever read payload from deltas.
        if t == "text":
            v = cb.get("text")
            if type(v) is str and v:
                out.append(ir.ev_block_delta(index, ir.D_TEXT, v))
            v = cb.get("citations")
            if isinstance(v, list):
                for c in v:
                    if isinstance(c, dict):
                        out.append(_citation_event(index, c))
        elif t == "tool_use":
            v = cb.get("input")
            if isinstance(v, dict) and v:
                out.append(ir.ev_block_delta(index, ir.D_INPUT_JSON, orjson.dumps(v).decode()))
        elif t == "thinking":
            v = cb.get("thinking")
            if type(v) is str and v:
                out.append(ir.ev_block_delta(index, ir.D_THINKING, v))
            v = cb.get("signature")
            if type(v) is str and v:
                out.append(ir.ev_block_delta(index, ir.D_SIGNATURE, v))

    cdef object _block(self, dict obj):
        """The IR index of the block a frame's `index` names, or None. Only a JSON integer names
        one (a list there is not a key; a float or a bool is not Anthropic's index)."""
        cdef object up = obj.get("index")
        return self.blocks.get(up) if is_int(up) else None

    cdef void _block_delta(self, dict obj, list out) except *:
        cdef object index = self._block(obj), delta = obj.get("delta"), t, v
        if index is None or not isinstance(delta, dict):
            return
        t = delta.get("type")
        if t == "text_delta":
            v = delta.get("text")
            if type(v) is str:
                out.append(ir.ev_block_delta(index, ir.D_TEXT, v))
        elif t == "input_json_delta":
            v = delta.get("partial_json")
            if type(v) is str:
                out.append(ir.ev_block_delta(index, ir.D_INPUT_JSON, v))
        elif t == "thinking_delta":
            v = delta.get("thinking")
            if type(v) is str:
                out.append(ir.ev_block_delta(index, ir.D_THINKING, v))
        elif t == "signature_delta":
            v = delta.get("signature")
            if type(v) is str:
                out.append(ir.ev_block_delta(index, ir.D_SIGNATURE, v))
        elif t == "citations_delta":
            v = delta.get("citation")
            if isinstance(v, dict):
                out.append(_citation_event(index, v))

    cdef void _message_delta(self, dict obj, list out) except *:
        cdef object delta = obj.get("delta"), u = obj.get("usage"), v, det
        cdef int sr = ir.SR_UNSET
        cdef str seq = None
        cdef ir.Usage usage = self.usage
        if usage is None:  # message_delta before any message_start
            usage = self.usage = ir.Usage.__new__(ir.Usage)
        if isinstance(delta, dict):
            v = delta.get("stop_reason")
            if v is not None:
                sr = STOP_IN.get(v, ir.SR_OTHER) if type(v) is str else ir.SR_OTHER
            v = delta.get("stop_sequence")
            if type(v) is str:
                seq = v
        if isinstance(u, dict):
            # Every count here is cumulative (the SDK overwrites, never adds): output always, and
            # newer APIs repeat input and the cache buckets, or report them only here.
            v = u.get("output_tokens")
            if v is not None:
                usage.output_tokens = count(v)
            v = u.get("input_tokens")
            if v is not None:
                self.raw_input = count(v)
                usage.input_known = True
            v = u.get("cache_read_input_tokens")
            if v is not None:
                usage.cache_read_tokens = count(v)
            v = u.get("cache_creation_input_tokens")
            if v is not None:
                usage.cache_write_tokens = count(v)
            usage.input_tokens = self.raw_input + usage.cache_read_tokens + usage.cache_write_tokens
            det = u.get("output_tokens_details")
            if isinstance(det, dict):
                usage.reasoning_tokens = count(det.get("thinking_tokens"))
        out.append(ir.ev_message_delta(sr, seq, usage.copy()))


cdef ir.Event _citation_event(int index, object citation):
    cdef ir.Event e = ir.ev_block_delta(index, ir.D_CITATION, None)
    e.data = citation
    return e


# ---------------------------------------------------------------------------------------------
# Encoder: IR events -> client SSE

# Wire block shapes the encoder tracks per index.
cdef enum:
    K_TEXT = 1
    K_TOOL = 2
    K_THINKING = 3
    K_REDACTED = 4


cdef bytes PING = b'event: ping\ndata: {"type":"ping"}\n\n'

# The frequent frames as byte templates around their index and payload: the bytes
# sse_event(name, orjson.dumps({...})) gives for the same dict (orjson's compact form, key order).
cdef bytes DELTA_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":'
cdef bytes TEXT_DELTA = b',"delta":{"type":"text_delta","text":'
cdef bytes THINKING_DELTA = b',"delta":{"type":"thinking_delta","thinking":'
cdef bytes JSON_DELTA = b',"delta":{"type":"input_json_delta","partial_json":'
cdef bytes DELTA_TAIL = b'}}\n\n'
cdef bytes START_HEAD = b'event: content_block_start\ndata: {"type":"content_block_start","index":'
cdef bytes TEXT_START = b',"content_block":{"type":"text","text":""}}\n\n'
cdef bytes STOP_HEAD = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":'
cdef bytes STOP_TAIL = b'}\n\n'
cdef bytes MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
cdef tuple SMALL_INTS = tuple(str(i).encode() for i in range(64))


cdef inline bytes _int_bytes(int v):
    return <bytes>SMALL_INTS[v] if 0 <= v < 64 else str(v).encode()


cdef class StreamEncoder:
    """IR events -> Anthropic SSE, shaped so the anthropic SDK's accumulator works: message_start
    then one ping (SPEC 1.2), dense block indices, a message_delta with running totals before
    message_stop (synthesised when the upstream never said why it stopped)."""

    def __init__(self, str id, str model):
        self.id = id
        self.model = model
        self.started = False
        self.delta_sent = False
        self.done = False
        self.start_usage = None
        self.last_usage = None
        self.wire_index = {}
        self.wire_kind = {}
        self.pending_signature = {}
        self.whole_input = set()
        self.arguments = {}
        self.open_blocks = []
        self.next_index = 0

    cpdef bytes encode(self, list events):
        cdef list out = []
        cdef ir.Event ev
        cdef object wire
        cdef int k
        if self.done:
            return b""
        for ev in events:
            if self.done:
                break
            k = ev.kind
            if k == ir.EV_BLOCK_DELTA:
                self._delta(ev, out)
            elif k == ir.EV_BLOCK_START:
                if not self.started:
                    self._start(None, out)
                wire = self.wire_index.get(ev.index)
                if wire is not None:
                    self._close(wire, out)  # a reused index starts a new block
                self._open(ev.index, ev.block, out)
            elif k == ir.EV_BLOCK_STOP:
                wire = self.wire_index.get(ev.index)
                if wire is not None:
                    self._close(wire, out)
            elif k == ir.EV_MESSAGE_START:
                if not self.started:
                    if self.model is None and ev.model is not None:
                        self.model = ev.model
                    self._start(ev.usage, out)
            elif k == ir.EV_MESSAGE_DELTA:
                if not self.started:
                    self._start(None, out)
                self._message_delta(ev.stop_reason, ev.stop_sequence, ev.usage, out)
            elif k == ir.EV_MESSAGE_STOP:
                if not self.started:
                    self._start(None, out)
                if not self.delta_sent:
                    self._message_delta(ir.SR_END_TURN, None, None, out)
                out.append(MESSAGE_STOP)
                self.done = True
            elif k == ir.EV_ERROR:
                out.append(self.error(ev.error_kind, ev.message))
            elif k == ir.EV_PING:
                if self.started:
                    out.append(PING)
        return b"".join(out)

    cpdef bytes error(self, str kind, str message):
        """Anthropic's mid-stream error event (SPEC 1.7); it ends the stream."""
        self.done = True
        return _sse("error", {"type": "error", "error": {
            "type": ERROR_TYPE_OUT.get(kind, "api_error"),
            "message": message if message is not None else "The upstream stream failed."}})

    cdef void _start(self, ir.Usage usage, list out) except *:
        cdef dict u
        self.started = True
        if usage is not None and usage.input_known:
            self.start_usage = usage.copy()
            u = _w_usage(usage)
        else:
            u = {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0}
        u["output_tokens"] = 0  # counted from the message_delta totals
        u.pop("output_tokens_details", None)
        out.append(_sse("message_start", {"type": "message_start", "message": {
            "id": self.id, "type": "message", "role": "assistant", "model": self.model or "",
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": u}}))
        out.append(PING)

    cdef int _open(self, int ir_index, ir.Block block, list out) except -2:
        """Writes content_block_start for an IR block; returns its wire index, or -1 for a block
        Anthropic's stream cannot carry (its deltas are then dropped)."""
        cdef int wire, kind
        cdef dict cb
        if block is None:
            self.wire_index[ir_index] = -1
            return -1
        if block.kind == ir.B_TEXT:
            kind = K_TEXT
            cb = None           # TEXT_START
        elif block.kind == ir.B_TOOL_USE:
            kind = K_TOOL
            cb = {"type": "tool_use", "id": block.id or ("toolu_" + ids.b62(24)),
                  "name": block.name or "", "input": {}}
        elif block.kind == ir.B_THINKING and block.redacted:
            kind = K_REDACTED
            cb = {"type": "redacted_thinking", "data": block.data or ""}
        elif block.kind == ir.B_THINKING:
            kind = K_THINKING
            cb = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            self.wire_index[ir_index] = -1  # its deltas are dropped too
            return -1
        wire = self.next_index
        self.next_index += 1
        self.wire_index[ir_index] = wire
        self.wire_kind[wire] = kind
        self.open_blocks.append(wire)
        if cb is None:
            out.append(START_HEAD)
            out.append(_int_bytes(wire))
            out.append(TEXT_START)
        else:
            out.append(_sse("content_block_start", {"type": "content_block_start", "index": wire,
                                                    "content_block": cb}))
        # Payload a decoder put on the start block itself is sent as deltas.
        if kind == K_TEXT and not ir.text_is_empty(block):
            out.append(DELTA_HEAD)
            out.append(_int_bytes(wire))
            out.append(TEXT_DELTA)
            out.append(jsonspan.text_literal(block))
            out.append(DELTA_TAIL)
        elif kind == K_TOOL and block.input:
            out.append(_sse("content_block_delta", {
                "type": "content_block_delta", "index": wire,
                "delta": {"type": "input_json_delta",
                          "partial_json": orjson.dumps(object_of(block.input)).decode()}}))
            self.whole_input.add(wire)
        elif kind == K_THINKING:
            if block.text:
                out.append(_sse("content_block_delta", {
                    "type": "content_block_delta", "index": wire,
                    "delta": {"type": "thinking_delta", "thinking": block.text}}))
            if block.signature:
                self.pending_signature[wire] = block.signature
        return wire

    cdef void _close(self, int wire, list out) except *:
        cdef object sig, args
        if wire not in self.open_blocks:
            return
        sig = self.pending_signature.pop(wire, None)
        args = self.arguments.pop(wire, None)
        if args is not None:
            self._json_delta(wire, (<ObjectStream>args).close(), out)
        if sig is not None:
            out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": wire,
                                                    "delta": {"type": "signature_delta", "signature": sig}}))
        self.open_blocks.remove(wire)
        out.append(STOP_HEAD)
        out.append(_int_bytes(wire))
        out.append(STOP_TAIL)

    cdef void _close_all(self, list out) except *:
        while self.open_blocks:
            self._close(self.open_blocks[0], out)

    cdef void _delta(self, ir.Event ev, list out) except *:
        cdef object wire = self.wire_index.get(ev.index)
        cdef int kind, dk = ev.delta_kind
        cdef ir.Block b
        cdef dict delta
        cdef object c, args
        if wire == -1:
            return  # a block Anthropic's stream cannot carry
        if wire is None or wire not in self.open_blocks:
            # A delta with no open block: text and thinking can start their own block; a tool call
            # cannot (no id or name), so its fragments are dropped.
            if (dk != ir.D_TEXT and dk != ir.D_THINKING) or not ev.text:
                return
            if not self.started:
                self._start(None, out)
            b = ir.Block.__new__(ir.Block)
            b.kind = ir.B_TEXT if dk == ir.D_TEXT else ir.B_THINKING
            wire = self._open(ev.index, b, out)
        kind = self.wire_kind[wire]
        if dk == ir.D_TEXT and kind == K_TEXT:
            if not ev.text:
                return
            out.append(DELTA_HEAD)
            out.append(_int_bytes(wire))
            out.append(TEXT_DELTA)
            out.append(orjson.dumps(ev.text))
            out.append(DELTA_TAIL)
            return
        elif dk == ir.D_INPUT_JSON and kind == K_TOOL:
            if not ev.text or wire in self.whole_input:
                return
            # The client accumulates the fragments into one object: ObjectStream keeps them one
            # (arguments.pxd), holding back the close and completing a broken text.
            args = self.arguments.get(wire)
            if args is None:
                args = ObjectStream()
                self.arguments[wire] = args
            self._json_delta(wire, (<ObjectStream>args).feed(ev.text), out)
            return
        elif dk == ir.D_THINKING and kind == K_THINKING:
            if not ev.text:
                return
            out.append(DELTA_HEAD)
            out.append(_int_bytes(wire))
            out.append(THINKING_DELTA)
            out.append(orjson.dumps(ev.text))
            out.append(DELTA_TAIL)
            return
        elif dk == ir.D_SIGNATURE and kind == K_THINKING:
            if not ev.text:
                return
            self.pending_signature.pop(wire, None)
            delta = {"type": "signature_delta", "signature": ev.text}
        elif dk == ir.D_CITATION and kind == K_TEXT:
            c = _citation(ev.data)
            if c is None:
                return
            delta = {"type": "citations_delta", "citation": c}
        else:
            return
        out.append(_sse("content_block_delta", {"type": "content_block_delta", "index": wire,
                                                "delta": delta}))

    cdef void _json_delta(self, int wire, str partial, list out) except *:
        if not partial:
            return
        out.append(DELTA_HEAD)
        out.append(_int_bytes(wire))
        out.append(JSON_DELTA)
        out.append(orjson.dumps(partial))
        out.append(DELTA_TAIL)

    cdef void _message_delta(self, int stop_reason, str stop_sequence, ir.Usage usage, list out) except *:
        self._close_all(out)
        self.last_usage = merge_usage(
            self.last_usage if self.last_usage is not None else self.start_usage, usage)
        if self.last_usage is None:
            self.last_usage = ir.Usage()
        self.delta_sent = True
        out.append(_sse("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": STOP_OUT.get(stop_reason, "end_turn"),
                      "stop_sequence": stop_sequence if stop_reason == ir.SR_STOP_SEQUENCE else None},
            "usage": _w_usage(self.last_usage)}))


# What an error_map is matched against: error.code, then error.type (_common.error_code_type).
error_signals = error_code_type
