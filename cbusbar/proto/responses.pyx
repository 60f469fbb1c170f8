# cython: language_level=3
"""The OpenAI Responses API codec (`POST /v1/responses`), per docs/codecs.md.

The wire authority is the openai SDK (openai/types/responses/*, and the stream accumulator in
openai/lib/streaming/responses/). A conversation is a flat list of items — messages, function_call,
function_call_output, reasoning — which the reader folds into IR turns (consecutive assistant-side
items form one assistant message) and the writer unfolds again."""

import time

import orjson

from cbusbar cimport ids

from cbusbar.framing import FramingError
from cbusbar.framing cimport members, scan_top, sse_event
from cbusbar.ir import CodecError
from cbusbar cimport jsonget
from cbusbar.ir cimport text_is_empty
from cbusbar.jsonspan cimport join_text, text_value
from cbusbar.jsonget cimport (
    OpenAIShape, as_dict, as_list, as_str, opt_bool, opt_int, opt_number, opt_str, J_CONTENT, count,
)
from cbusbar.jsonget import NOT_AN_OBJECT, UPSTREAM_NOT_JSON
from cbusbar.usage cimport merge_usage
from cbusbar.arguments cimport input_of, text_of
from cbusbar.reasoning cimport effort_of_budget
from cbusbar.proto._common cimport SSEDecoder, error_object
from cbusbar.proto._common import (body_as_is, error_code_type, model_not_found, no_error_headers, no_forced_tool,
                                   no_response_headers, usage_always_sent)
from cbusbar.proto import openai as _openai

from cbusbar.ir cimport (
    B_DOCUMENT, B_IMAGE, B_TEXT, B_THINKING, B_TOOL_RESULT, B_TOOL_USE,
    D_CITATION, D_INPUT_JSON, D_SIGNATURE, D_TEXT, D_THINKING,
    EV_BLOCK_DELTA, EV_BLOCK_START, EV_BLOCK_STOP, EV_ERROR, EV_MESSAGE_DELTA, EV_MESSAGE_START,
    EV_MESSAGE_STOP,
    RF_JSON_OBJECT, RF_JSON_SCHEMA, RF_TEXT,
    ROLE_ASSISTANT, ROLE_USER,
    SR_END_TURN, SR_ERROR, SR_MAX_TOKENS, SR_OTHER, SR_REFUSAL, SR_SAFETY, SR_TOOL_USE, SR_UNSET,
    SRC_BASE64, SRC_URL, SRC_VENDOR,
    TC_AUTO, TC_NONE, TC_REQUIRED, TC_TOOL,
    Block, Event, Message, Request, Response, Tool, Usage,
    ev_error, ev_message_delta, ev_message_start,
    ev_message_stop, text_block, refusal_block,
)

NAME = "responses"
CONTENT_TYPE = b"application/json"
STREAM_CONTENT_TYPE = b"text/event-stream"
BODY_MODEL = True           # the model name travels in the body
NEEDS_MAX_TOKENS = False    # max_output_tokens is optional
# The top-level members the engine reads without parsing (one scan of the body): the model,
# stream, and where the caller's output cap lives; MAX_TOKENS_PATH is that cap's path, one level
# deep at most (governance reserves a budget for it before the call).
SCAN_KEYS = (b"model", b"stream", b"max_output_tokens")
MAX_TOKENS_PATH = ((b"max_output_tokens",),)
PROBE_MAX_TOKENS = 16       # health probes: the Responses API refuses max_output_tokens below 16
# Egress: what busbar/engine/egress.py sends this API besides the body, and the API's cloud
# forms (docs/codecs.md "Egress").
USER_AGENT = b"OpenAI/Python 1.54.0"
API_HEADERS = ()
BETA_HEADERS = (b"openai-beta",)
# Azure OpenAI serves the Responses API on its v1 URL scheme only.
AZURE_FORMS = ("v1",)
VERTEX_PUBLISHER = None
vertex_body = None


cpdef str upstream_path(str model, bint stream):
    return "/v1/responses"


cpdef str mint_id():
    # The API's ids are resp_ + 48 hex digits.
    return "resp_" + ids.hex_id(24)


# ---------------------------------------------------------------------------------------------
# Helpers: shape checks (every bad shape in a client body becomes a caller-safe CodecError)


# Responses is OpenAI's platform and words its shape errors as Chat Completions does.
cdef OpenAIShape SHAPE = OpenAIShape()


cdef object _args(str arguments):
    """A function call's argument string -> the IR input (arguments.input_of: text that is not
    one JSON object is kept as it came, never dropped)."""
    return input_of(arguments)


# ---------------------------------------------------------------------------------------------
# Helpers: content parts


cdef Block _media(int kind, str uri):
    """An image or file from a data: URI (base64) or a plain URL (busbar never fetches it)."""
    cdef Block b = Block.__new__(Block)
    cdef Py_ssize_t comma, semi
    b.kind = kind
    if uri.startswith("data:"):
        comma = uri.find(",")
        semi = uri.rfind(";base64", 0, comma if comma >= 0 else 0)
        if comma > 0 and semi > 0 and semi + 7 == comma:
            b.src_kind = SRC_BASE64
            b.media_type = uri[5:semi]
            b.data = uri[comma + 1:]
            return b
    b.src_kind = SRC_URL
    b.data = uri
    return b


cdef Block _input_image(dict part):
    cdef str url = opt_str(part, "image_url", "image_url", SHAPE)
    cdef str file_id
    cdef Block b
    if url:
        return _media(B_IMAGE, url)
    file_id = opt_str(part, "file_id", "file_id", SHAPE)
    if not file_id:
        raise CodecError("An input_image part needs an image_url or a file_id.")
    b = Block.__new__(Block)
    b.kind = B_IMAGE
    b.src_kind = SRC_VENDOR
    b.data = file_id
    return b


cdef Block _input_file(dict part):
    cdef str data = opt_str(part, "file_data", "file_data", SHAPE)
    cdef str url = opt_str(part, "file_url", "file_url", SHAPE)
    cdef str file_id = opt_str(part, "file_id", "file_id", SHAPE)
    cdef Block b
    if data:
        if data.startswith("data:"):
            b = _media(B_DOCUMENT, data)
        else:
            # Bare base64 (accepted by the API); PDF is the only type it reads that way.
            b = Block.__new__(Block)
            b.kind = B_DOCUMENT
            b.src_kind = SRC_BASE64
            b.media_type = "application/pdf"
            b.data = data
    elif url:
        b = _media(B_DOCUMENT, url)
    elif file_id:
        b = Block.__new__(Block)
        b.kind = B_DOCUMENT
        b.src_kind = SRC_VENDOR
        b.data = file_id
    else:
        raise CodecError("An input_file part needs file_data, a file_url or a file_id.")
    b.name = opt_str(part, "filename", "filename", SHAPE)
    return b


cdef list _parts(object content, str what):
    """Message content (a string or a list of parts) -> IR blocks."""
    cdef list out = []
    cdef dict part
    cdef object t
    if type(content) is str:
        out.append(text_block(<str>content))
        return out
    if content is None:
        raise SHAPE.missing(what)
    if type(content) is not list:
        raise SHAPE.bad_type(what, J_CONTENT, content)
    for p in <list>content:
        part = as_dict(p, what, SHAPE)
        t = part.get("type")
        if t == "input_text" or t == "output_text" or t == "text":
            out.append(text_block(as_str(part.get("text"), what + ".text", SHAPE)))
        elif t == "refusal":
            out.append(refusal_block(as_str(part.get("refusal"), what + ".refusal", SHAPE)))
        elif t == "input_image":
            out.append(_input_image(part))
        elif t == "input_file":
            out.append(_input_file(part))
        # input_audio and other part types have no IR home: dropped.
    return out


cdef object _text_of(list blocks, str sep):
    """The non-empty texts joined, "" when none: a str, or an orjson.Fragment when a block holds
    the client's literal (jsonspan.join_text; a writer puts it in a body as it is)."""
    cdef list texts = []
    cdef Block b
    for b in blocks:
        if (b.kind == B_TEXT or b.kind == B_DOCUMENT) and not text_is_empty(b):
            texts.append(b)
    return join_text(texts, sep) if texts else ""


# ---------------------------------------------------------------------------------------------
# Request: read_request


cdef Message _turn(list messages, int role):
    """The message the next item belongs to: consecutive items of one side fold into one turn
    (a reasoning item, a message and function calls are one assistant turn)."""
    cdef Message m
    if messages:
        m = messages[len(messages) - 1]
        if m.role == role:
            return m
    m = Message.__new__(Message)
    m.role = role
    m.content = []
    messages.append(m)
    return m


cdef Block _reasoning(dict item):
    cdef Block b = Block.__new__(Block)
    cdef list texts = []
    cdef object parts
    cdef dict part
    b.kind = B_THINKING
    b.id = opt_str(item, "id", "id", SHAPE)
    parts = item.get("summary")
    if parts is not None:
        for p in as_list(parts, "reasoning.summary", SHAPE):
            part = as_dict(p, "reasoning.summary", SHAPE)
            texts.append(as_str(part.get("text"), "reasoning.summary.text", SHAPE))
    if not texts:
        parts = item.get("content")
        if parts is not None:
            for p in as_list(parts, "reasoning.content", SHAPE):
                part = as_dict(p, "reasoning.content", SHAPE)
                texts.append(as_str(part.get("text"), "reasoning.content.text", SHAPE))
    b.text = "\n\n".join(texts)     # summary parts are paragraphs (the stream decoder joins them so)
    b.signature = opt_str(item, "encrypted_content", "encrypted_content", SHAPE)
    return b


cdef void _read_input(list items, Request req) except *:
    cdef dict item
    cdef object t, role, output
    cdef Message m
    cdef Block b
    cdef str arguments
    for it in items:
        item = as_dict(it, "input", SHAPE)
        t = item.get("type")
        if t is None or t == "message":
            role = item.get("role")
            if role == "system" or role == "developer":
                for b in _parts(item.get("content"), "input.content"):
                    if b.kind == B_TEXT:
                        req.system.append(b)
            elif role == "user":
                m = Message.__new__(Message)
                m.role = ROLE_USER
                m.content = _parts(item.get("content"), "input.content")
                req.messages.append(m)
            elif role == "assistant":
                _turn(req.messages, ROLE_ASSISTANT).content.extend(
                    _parts(item.get("content"), "input.content"))
            else:
                raise CodecError("Invalid value for 'input.role': expected one of user, assistant, "
                                 "system or developer.")
        elif t == "function_call":
            b = Block.__new__(Block)
            b.kind = B_TOOL_USE
            b.id = as_str(item.get("call_id"), "input.call_id", SHAPE)
            b.name = as_str(item.get("name"), "input.name", SHAPE)
            arguments = opt_str(item, "arguments", "arguments", SHAPE)
            b.input = _args(arguments)
            _turn(req.messages, ROLE_ASSISTANT).content.append(b)
        elif t == "function_call_output":
            b = Block.__new__(Block)
            b.kind = B_TOOL_RESULT
            b.id = as_str(item.get("call_id"), "input.call_id", SHAPE)
            output = item.get("output")
            b.content = _parts(output if output is not None else "", "input.output")
            m = _turn(req.messages, ROLE_USER)
            if m.content and (<Block>m.content[len(m.content) - 1]).kind != B_TOOL_RESULT:
                m = Message.__new__(Message)
                m.role = ROLE_USER
                m.content = []
                req.messages.append(m)
            m.content.append(b)
        elif t == "reasoning":
            _turn(req.messages, ROLE_ASSISTANT).content.append(_reasoning(item))
        # Hosted-tool items (web_search_call, computer_call, item_reference, ...) only mean
        # something to OpenAI itself, and a same-protocol body is relayed rather than rewritten.


cdef void _read_tools(list tools, Request req) except *:
    cdef dict tool
    cdef Tool t
    cdef object schema
    for it in tools:
        tool = as_dict(it, "tools", SHAPE)
        if tool.get("type") != "function":
            continue
        t = Tool.__new__(Tool)
        t.name = as_str(tool.get("name"), "tools.name", SHAPE)
        t.description = opt_str(tool, "description", "description", SHAPE)
        schema = tool.get("parameters")
        if schema is not None:
            t.schema = as_dict(schema, "tools.parameters", SHAPE)
        req.tools.append(t)
    # The full list (hosted tools, `strict` and other per-tool flags) stays for a same-protocol
    # write, which overlays it.
    req.extra["tools"] = tools


cdef void _read_tool_choice(object tc, Request req) except *:
    cdef dict d
    if tc == "auto":
        req.tool_choice = TC_AUTO
    elif tc == "none":
        req.tool_choice = TC_NONE
    elif tc == "required":
        req.tool_choice = TC_REQUIRED
    elif type(tc) is dict:
        d = <dict>tc
        if d.get("type") == "function":
            req.tool_choice = TC_TOOL
            req.tool_choice_name = as_str(d.get("name"), "tool_choice.name", SHAPE)
        else:
            req.extra["tool_choice"] = tc
    else:
        raise CodecError("Invalid value for 'tool_choice'.")


cdef void _read_text(dict text, Request req) except *:
    cdef object f = text.get("format")
    cdef dict fmt
    cdef object t
    req.extra["text"] = text
    if f is None:
        return
    fmt = as_dict(f, "text.format", SHAPE)
    t = fmt.get("type")
    if t == "text":
        req.response_format = RF_TEXT
    elif t == "json_object":
        req.response_format = RF_JSON_OBJECT
    elif t == "json_schema":
        req.response_format = RF_JSON_SCHEMA
        req.rf_name = opt_str(fmt, "name", "name", SHAPE)
        req.rf_schema = as_dict(fmt.get("schema"), "text.format.schema", SHAPE)
        req.rf_strict = opt_bool(fmt, "strict", "strict", SHAPE)
    else:
        raise CodecError("Invalid value for 'text.format.type'.")


# Top-level request fields with an IR home (tools, tool_choice, text and reasoning also keep their
# native form in extra, see their readers); everything else goes to req.extra as is.
_READ_KEYS = frozenset((
    "model", "stream", "instructions", "input", "tools", "tool_choice", "parallel_tool_calls",
    "text", "max_output_tokens", "temperature", "top_p", "top_logprobs", "user", "reasoning"))


cpdef Request read_request(bytes body):
    cdef dict d = jsonget.request_object(body, NOT_AN_OBJECT)
    cdef Request req = Request()
    cdef object v
    cdef str s
    cdef dict reasoning
    v = d.get("model")
    if v == "":
        raise SHAPE.missing("model")
    req.model = as_str(v, "model", SHAPE)
    req.stream = opt_bool(d, "stream", "stream", SHAPE) is True
    s = opt_str(d, "instructions", "instructions", SHAPE)
    if s:
        req.system.append(text_block(s))
    v = d.get("input")
    if type(v) is str:
        req.messages.append(Message(ROLE_USER, [text_block(<str>v)]))
    elif type(v) is list:
        _read_input(<list>v, req)
    elif v is not None:
        raise SHAPE.bad_type("input", J_CONTENT, v)
    v = d.get("tools")
    if v is not None:
        _read_tools(as_list(v, "tools", SHAPE), req)
    v = d.get("tool_choice")
    if v is not None:
        _read_tool_choice(v, req)
    req.parallel_tool_calls = opt_bool(d, "parallel_tool_calls", "parallel_tool_calls", SHAPE)
    v = d.get("text")
    if v is not None:
        _read_text(as_dict(v, "text", SHAPE), req)
    req.max_tokens = opt_int(d, "max_output_tokens", "max_output_tokens", SHAPE)
    req.temperature = opt_number(d, "temperature", "temperature", SHAPE)
    req.top_p = opt_number(d, "top_p", "top_p", SHAPE)
    req.top_logprobs = opt_int(d, "top_logprobs", "top_logprobs", SHAPE)
    req.user = opt_str(d, "user", "user", SHAPE)
    v = d.get("reasoning")
    if v is not None:
        reasoning = as_dict(v, "reasoning", SHAPE)
        req.reasoning_effort = opt_str(reasoning, "effort", "effort", SHAPE)
        req.extra["reasoning"] = reasoning
    for k, v in d.items():
        if k not in _READ_KEYS:
            req.extra[k] = v
    return req


# ---------------------------------------------------------------------------------------------
# Request: write_request


cdef dict _part_out(Block b):
    """A user-side IR block as a Responses input content part, or None when it has no form."""
    cdef str uri
    if b.kind == B_TEXT:
        return {"type": "input_text", "text": text_value(b)}
    if b.kind == B_IMAGE:
        if b.src_kind == SRC_BASE64:
            uri = "data:%s;base64,%s" % (b.media_type or "image/png", b.data or "")
            return {"type": "input_image", "image_url": uri, "detail": "auto"}
        if b.src_kind == SRC_URL:
            return {"type": "input_image", "image_url": b.data, "detail": "auto"}
        if b.src_kind == SRC_VENDOR:
            return {"type": "input_image", "file_id": b.data, "detail": "auto"}
        return None
    if b.kind == B_DOCUMENT:
        if b.src_kind == SRC_BASE64:
            uri = "data:%s;base64,%s" % (b.media_type or "application/pdf", b.data or "")
            return {"type": "input_file", "filename": b.name or "document", "file_data": uri}
        if b.src_kind == SRC_URL:
            return {"type": "input_file", "file_url": b.data}
        if b.src_kind == SRC_VENDOR:
            return {"type": "input_file", "file_id": b.data}
        if b.text is not None:
            return {"type": "input_text", "text": b.text}
    return None


cdef object _tool_output(Block b):
    """A tool result's content: plain text, or a part list when it carries images or files."""
    cdef list parts = []
    cdef Block c
    cdef dict p
    cdef bint plain = True
    if b.content is None:
        return ""
    for c in b.content:
        if c.kind != B_TEXT:
            plain = False
        p = _part_out(c)
        if p is not None:
            parts.append(p)
    if plain:
        return _text_of(b.content, "")    # the parts of one result, as written: no separator
    return parts


cdef str _effort(Request req):
    if req.reasoning_effort:
        return req.reasoning_effort
    return effort_of_budget(req.reasoning_budget)


cdef void _write_input(Request req, list items) except *:
    cdef Message m
    cdef Block b
    cdef list parts
    cdef dict p, item
    cdef int mi = 0
    cdef int bi
    for m in req.messages:
        parts = None
        bi = 0
        for b in m.content:
            if m.role == ROLE_ASSISTANT:
                if b.kind == B_TEXT:
                    # String content: an id-less assistant message may not carry output_text
                    # parts (those belong to output messages, which need an id and a status).
                    items.append({"type": "message", "role": "assistant", "content": text_value(b)})
                elif b.kind == B_TOOL_USE:
                    items.append({
                        "type": "function_call", "call_id": b.id, "name": b.name,
                        "arguments": text_of(b.input)})
                elif b.kind == B_THINKING and b.signature and not b.redacted:
                    # Only reasoning OpenAI can verify goes back: without encrypted_content the
                    # item is useless to it.
                    item = {"type": "reasoning",
                            "id": b.id if b.id else "rs_%d_%d" % (mi, bi),
                            "summary": [{"type": "summary_text", "text": b.text}] if b.text else [],
                            "encrypted_content": b.signature}
                    items.append(item)
            elif b.kind == B_TOOL_RESULT:
                parts = None
                items.append({"type": "function_call_output", "call_id": b.id,
                              "output": _tool_output(b)})
            else:
                p = _part_out(b)
                if p is not None:
                    if parts is None:
                        parts = []
                        items.append({"type": "message", "role": "user", "content": parts})
                    parts.append(p)
            bi += 1
        mi += 1


cdef list _write_tools(Request req, list native):
    """IR tools as flat function tools. A same-protocol native list (req.extra) keeps each
    function's own flags and the hosted tools."""
    cdef list out = []
    cdef dict by_name = {}
    cdef dict tool
    cdef Tool t
    for it in native or ():
        if type(it) is dict and (<dict>it).get("type") == "function":
            by_name[(<dict>it).get("name")] = it
    for t in req.tools:
        if t.name in by_name:
            tool = dict(<dict>by_name[t.name])
        else:
            # The API treats an absent `strict` as true and then rejects most schemas written for
            # other vendors (it needs additionalProperties: false and every property required).
            tool = {"type": "function", "strict": False}
        tool["name"] = t.name
        if t.description:
            tool["description"] = t.description
        tool["parameters"] = t.schema if t.schema is not None else {"type": "object",
                                                                    "properties": {}}
        out.append(tool)
    for it in native or ():
        if type(it) is dict and (<dict>it).get("type") != "function":
            out.append(it)
    return out


cdef dict _write_format(Request req, object native):
    cdef dict fmt
    if req.response_format == RF_TEXT:
        return {"type": "text"}
    if req.response_format == RF_JSON_OBJECT:
        return {"type": "json_object"}
    if req.response_format == RF_JSON_SCHEMA:
        if type(native) is dict and (<dict>native).get("type") == "json_schema":
            fmt = dict(<dict>native)
        else:
            fmt = {"type": "json_schema"}
        fmt["name"] = req.rf_name or "response"
        fmt["schema"] = req.rf_schema if req.rf_schema is not None else {}
        if req.rf_strict is not None:
            fmt["strict"] = req.rf_strict
        else:
            fmt.pop("strict", None)
        return fmt
    return None


# Keys of req.extra that write_request overlays rather than copies.
_OVERLAID = frozenset(("tools", "tool_choice", "text", "reasoning"))


cpdef bytes write_request(Request req):
    cdef dict body = {"model": req.model}
    cdef dict extra = req.extra if req.extra is not None else {}
    cdef list items = []
    cdef object system = _text_of(req.system, "\n\n")     # "" when there is none
    cdef list tools
    cdef object native, tc
    cdef dict text, reasoning
    cdef str effort
    if system:
        body["instructions"] = system
    _write_input(req, items)
    body["input"] = items
    native = extra.get("tools")
    tools = _write_tools(req, <list>native if type(native) is list else None)
    if tools:
        body["tools"] = tools
        tc = None
        if req.tool_choice == TC_AUTO:
            tc = "auto"
        elif req.tool_choice == TC_NONE:
            tc = "none"
        elif req.tool_choice == TC_REQUIRED:
            tc = "required"
        elif req.tool_choice == TC_TOOL:
            tc = {"type": "function", "name": req.tool_choice_name}
        elif "tool_choice" in extra:
            tc = extra["tool_choice"]
        if tc is not None:
            body["tool_choice"] = tc
        if req.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = req.parallel_tool_calls
    native = extra.get("text")
    text = dict(<dict>native) if type(native) is dict else {}
    native = _write_format(req, text.get("format"))
    if native is not None:
        text["format"] = native
    else:
        text.pop("format", None)
    if text:
        body["text"] = text
    if req.max_tokens is not None:
        body["max_output_tokens"] = req.max_tokens
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.top_logprobs is not None:
        body["top_logprobs"] = req.top_logprobs
    if req.user is not None:
        body["user"] = req.user
    native = extra.get("reasoning")
    reasoning = dict(<dict>native) if type(native) is dict else {}
    effort = _effort(req)
    if effort is not None:
        reasoning["effort"] = effort
    else:
        reasoning.pop("effort", None)
    if reasoning:
        body["reasoning"] = reasoning
        if effort is not None and "include" not in extra:
            # Reasoning comes back as encrypted_content only on request; it is what lets a
            # client of another protocol hand the thinking back (as its signature) next turn.
            body["include"] = ["reasoning.encrypted_content"]
    if req.stream:
        body["stream"] = True
    for k, v in extra.items():
        if k not in body and k not in _OVERLAID:
            body[k] = v
    return orjson.dumps(body)


# ---------------------------------------------------------------------------------------------
# Response and usage (buffered)


cdef object _member(object d, str key):
    return (<dict>d).get(key) if type(d) is dict else None


cdef Usage _usage(object u):
    """A Responses `usage` object -> IR usage: absent or null, input not known; a value that is
    not an object counts as zeros."""
    cdef object itd, otd
    if u is None:
        return Usage(input_known=False)
    if type(u) is not dict:
        return _usage_from(None, None, None, None, None)
    itd = (<dict>u).get("input_tokens_details")
    otd = (<dict>u).get("output_tokens_details")
    return _usage_from((<dict>u).get("input_tokens"), (<dict>u).get("output_tokens"),
                       _member(itd, "cached_tokens"), _member(itd, "cache_write_tokens"),
                       _member(otd, "reasoning_tokens"))


cdef Usage _usage_from(object inp, object out, object cached, object cache_write,
                       object reasoning):
    """The one mapping of Responses usage counts, from its dict (_usage) or read in place
    (read_usage); each count as jsonget.count() reads it (negative, huge or not a number: 0)."""
    cdef Usage usage = Usage.__new__(Usage)
    usage.input_known = True
    usage.input_tokens = count(inp)
    usage.output_tokens = count(out)
    usage.cache_read_tokens = count(cached)
    usage.cache_write_tokens = count(cache_write)
    usage.reasoning_tokens = count(reasoning)
    return usage


cdef dict _usage_out(Usage u):
    if u is None:
        u = Usage.__new__(Usage)
    return {
        "input_tokens": u.input_tokens,
        "input_tokens_details": {"cached_tokens": u.cache_read_tokens,
                                 "cache_write_tokens": u.cache_write_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": u.input_tokens + u.output_tokens,
    }


cdef list _logprobs_in(object lps):
    """Responses logprobs -> the IR's OpenAI-shaped list ({token, logprob, top_logprobs})."""
    cdef list out = []
    cdef list tops
    for lp in lps:
        if type(lp) is not dict:
            continue
        tops = []
        for t in (<dict>lp).get("top_logprobs") or ():
            if type(t) is dict:
                tops.append({"token": (<dict>t).get("token"), "logprob": (<dict>t).get("logprob")})
        out.append({"token": (<dict>lp).get("token"), "logprob": (<dict>lp).get("logprob"),
                    "top_logprobs": tops})
    return out


cdef object _bytes_of(object token):
    return list((<str>token).encode()) if type(token) is str else []


cdef list _logprobs_out(object lps, bint with_bytes):
    cdef list out = []
    cdef list tops
    cdef dict entry
    for lp in lps:
        if type(lp) is not dict or type((<dict>lp).get("token")) is not str:
            continue
        tops = []
        for t in (<dict>lp).get("top_logprobs") or ():
            if type(t) is dict and type((<dict>t).get("token")) is str:
                entry = {"token": (<dict>t).get("token"), "logprob": (<dict>t).get("logprob")}
                if with_bytes:
                    entry["bytes"] = _bytes_of((<dict>t).get("token"))
                tops.append(entry)
        entry = {"token": (<dict>lp).get("token"), "logprob": (<dict>lp).get("logprob")}
        if with_bytes:
            entry["bytes"] = _bytes_of((<dict>lp).get("token"))
        entry["top_logprobs"] = tops
        out.append(entry)
    return out


cdef dict _annotation(object c):
    """A citation as a Responses annotation, or None when it has no Responses form. Chat
    Completions nests url_citation one level deeper; other vendors' citations do not fit."""
    cdef dict d, inner
    cdef object t
    if type(c) is not dict:
        return None
    d = <dict>c
    t = d.get("type")
    if t == "url_citation":
        if type(d.get("url_citation")) is dict:
            inner = <dict>d["url_citation"]
            return {"type": "url_citation", "start_index": inner.get("start_index", 0),
                    "end_index": inner.get("end_index", 0), "title": inner.get("title") or "",
                    "url": inner.get("url") or ""}
        if type(d.get("url")) is str:
            return d
        return None
    if t == "file_citation" or t == "container_file_citation" or t == "file_path":
        return d
    return None


cdef void _read_output(list output, Response resp, bint* tool, bint* refusal) except *:
    cdef dict item, part
    cdef object t, pt, content
    cdef Block b
    for it in output:
        if type(it) is not dict:
            continue
        item = <dict>it
        t = item.get("type")
        if t == "message":
            content = item.get("content")
            if type(content) is not list:
                continue
            for p in <list>content:
                if type(p) is not dict:
                    continue
                part = <dict>p
                pt = part.get("type")
                if pt == "output_text" and type(part.get("text")) is str:
                    b = text_block(<str>part["text"])
                    if type(part.get("annotations")) is list and part["annotations"]:
                        b.citations = part["annotations"]
                    if type(part.get("logprobs")) is list:
                        if resp.logprobs is None:
                            resp.logprobs = []
                        resp.logprobs.extend(_logprobs_in(part["logprobs"]))
                    resp.content.append(b)
                elif pt == "refusal" and type(part.get("refusal")) is str:
                    resp.content.append(refusal_block(<str>part["refusal"]))
                    refusal[0] = True
        elif t == "function_call":
            b = Block.__new__(Block)
            b.kind = B_TOOL_USE
            b.id = item.get("call_id") if type(item.get("call_id")) is str else None
            b.name = item.get("name") if type(item.get("name")) is str else ""
            b.input = _args(item.get("arguments") if type(item.get("arguments")) is str else "")
            resp.content.append(b)
            tool[0] = True
        elif t == "reasoning":
            try:
                resp.content.append(_reasoning(item))
            except CodecError:
                pass  # a malformed reasoning item from upstream is skipped, not fatal


cdef int _stop_reason(dict body, bint tool, bint refusal):
    cdef object status = body.get("status")
    cdef object details, reason
    if status == "incomplete":
        details = body.get("incomplete_details")
        reason = (<dict>details).get("reason") if type(details) is dict else None
        if reason == "max_output_tokens":
            return SR_MAX_TOKENS
        if reason == "content_filter":
            return SR_SAFETY
        return SR_OTHER
    if status == "failed" or status == "cancelled":
        return SR_ERROR
    if tool:
        return SR_TOOL_USE
    if refusal:
        return SR_REFUSAL
    return SR_END_TURN


cpdef Response read_response(bytes body):
    cdef dict d = jsonget.upstream_object(body)
    cdef Response resp = Response()
    cdef bint tool = False, refusal = False
    cdef object v
    resp.id = d.get("id") if type(d.get("id")) is str else None
    resp.model = d.get("model") if type(d.get("model")) is str else None
    v = d.get("created_at")
    if type(v) is int or type(v) is float:
        resp.created = int(v)
    v = d.get("output")
    if type(v) is list:
        _read_output(<list>v, resp, &tool, &refusal)
    resp.stop_reason = _stop_reason(d, tool, refusal)
    resp.usage = _usage(d.get("usage"))
    return resp


cdef tuple _USAGE_KEY = (b"usage",)
cdef tuple _USAGE_NAMES = (b"input_tokens", b"output_tokens", b"input_tokens_details",
                           b"output_tokens_details")
cdef tuple _INPUT_DETAIL_NAMES = (b"cached_tokens", b"cache_write_tokens")
cdef tuple _OUTPUT_DETAIL_NAMES = (b"reasoning_tokens",)


cpdef Usage read_usage(bytes body):
    """Usage of a same-protocol buffered body: the body is validated and the `usage` counts read
    in place (framing.members), no dict built."""
    cdef object span, cached = None, write = None, reasoning = None
    cdef list v, d
    try:
        span = scan_top(body, _USAGE_KEY).get(b"usage")
    except FramingError:
        raise CodecError(UPSTREAM_NOT_JSON) from None
    if span is None or body[<Py_ssize_t>span[0]] == 110:       # absent or null
        return _usage(None)
    v = members(body, span, _USAGE_NAMES)
    if v is None:
        return _usage_from(None, None, None, None, None)
    if type(v[2]) is tuple:
        d = members(body, v[2], _INPUT_DETAIL_NAMES)
        cached = d[0]
        write = d[1]
    if type(v[3]) is tuple:
        reasoning = members(body, v[3], _OUTPUT_DETAIL_NAMES)[0]
    return _usage_from(v[0], v[1], cached, write, reasoning)


cdef str _item_id(str prefix, str base, int index):
    """Output item ids are derived from the response id and the item's position, so a replayed
    translation (and a golden file) is byte-stable."""
    return "%s_%s_%d" % (prefix, base, index)


cdef str _base(str id):
    if id is None:
        return ""
    return id[5:] if id.startswith("resp_") else id


cdef dict _response_object(str id, str model, object created, int stop_reason, list output,
                           object usage, object error, bint in_progress):
    cdef str status
    cdef object incomplete = None
    if error is not None:
        status = "failed"
    elif in_progress:
        status = "in_progress"
    elif stop_reason == SR_MAX_TOKENS:
        status = "incomplete"
        incomplete = {"reason": "max_output_tokens"}
    elif stop_reason == SR_SAFETY:
        status = "incomplete"
        incomplete = {"reason": "content_filter"}
    else:
        status = "completed"
    return {
        "id": id, "object": "response", "created_at": created, "status": status,
        "error": error, "incomplete_details": incomplete, "instructions": None,
        "max_output_tokens": None, "model": model or "", "output": output,
        "parallel_tool_calls": True, "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None}, "store": False, "temperature": None,
        "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [], "top_p": None,
        "truncation": "disabled", "usage": usage, "user": None, "metadata": {},
    }


cdef dict _message_item(str item_id, str status, str text, list annotations, object logprobs):
    cdef dict part = {"type": "output_text", "text": text, "annotations": annotations}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [part]}


cdef dict _refusal_item(str item_id, str status, str text):
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "refusal", "refusal": text}]}


cdef dict _call_item(str item_id, str status, str call_id, str name, str arguments):
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id,
            "name": name, "arguments": arguments}


cdef dict _reasoning_item(str item_id, str text, str signature):
    cdef dict item = {"id": item_id, "type": "reasoning",
                      "summary": [{"type": "summary_text", "text": text}] if text else []}
    if signature:
        item["encrypted_content"] = signature
    return item


cdef list _annotations(object citations):
    cdef list out = []
    cdef dict a
    if type(citations) is not list:
        return out
    for c in <list>citations:
        a = _annotation(c)
        if a is not None:
            out.append(a)
    return out


cpdef bytes write_response(Response resp):
    cdef list output = []
    cdef str base = _base(resp.id)
    cdef Block b
    cdef int i = 0
    cdef bint incomplete = resp.stop_reason == SR_MAX_TOKENS or resp.stop_reason == SR_SAFETY
    cdef object logprobs = None
    cdef bint logprobs_used = False
    cdef object created = resp.created if resp.created is not None else int(time.time())
    cdef dict last
    if type(resp.logprobs) is list:
        logprobs = _logprobs_out(resp.logprobs, True)
    for b in resp.content:
        if b.kind == B_TEXT and b.refusal:
            output.append(_refusal_item(_item_id("msg", base, i), "completed", b.text or ""))
        elif b.kind == B_TEXT:
            output.append(_message_item(_item_id("msg", base, i), "completed", b.text or "",
                                        _annotations(b.citations),
                                        None if logprobs_used else logprobs))
            logprobs_used = logprobs is not None
        elif b.kind == B_TOOL_USE:
            output.append(_call_item(_item_id("fc", base, i), "completed",
                                     b.id or _item_id("call", base, i), b.name or "",
                                     text_of(b.input)))
        elif b.kind == B_THINKING and not b.redacted:
            output.append(_reasoning_item(_item_id("rs", base, i), b.text or "", b.signature))
        else:
            continue
        i += 1
    if incomplete and output:
        last = output[len(output) - 1]
        if last["type"] == "message":
            last["status"] = "incomplete"
    return orjson.dumps(_response_object(resp.id, resp.model, created, resp.stop_reason, output,
                                         _usage_out(resp.usage), None, False))


# ---------------------------------------------------------------------------------------------
# Errors and discovery


# SPEC 1.7: the same error envelope, names and refusals as OpenAI Chat.
write_error = _openai.write_error
own_error = _openai.own_error

# Upstream error codes (the `error` stream event, a failed response's error.code) -> canonical kind.
_KIND_OF_CODE = {
    "rate_limit_exceeded": "rate_limit",
    "insufficient_quota": "quota",
    "invalid_api_key": "authentication",
    "model_not_found": "not_found",
    "invalid_prompt": "invalid_request",
    "context_length_exceeded": "invalid_request",
    "invalid_request_error": "invalid_request",
    "server_error": "api_error",
    "server_is_overloaded": "overloaded",
}

# Canonical kind -> a failed response's error.code (the SDK accepts only its own list).
_FAILED_CODES = {
    "rate_limit": "rate_limit_exceeded",
    "quota": "rate_limit_exceeded",
    "invalid_request": "invalid_prompt",
    "request_too_large": "invalid_prompt",
}


cpdef tuple read_error_detail(bytes body):
    """(message, code) of an upstream error body: OpenAI's `error.code`, else its `error.type`."""
    cdef dict d = error_object(body, False)
    cdef object e, msg = None, code = None
    if d is None:
        return (None, None)
    e = d.get("error")
    if type(e) is dict:
        if type((<dict>e).get("message")) is str:
            msg = (<dict>e)["message"]
        code = (<dict>e).get("code")
        if type(code) is not str or not code:
            code = (<dict>e).get("type")
            if type(code) is not str or not code:
                code = None
    elif type(e) is str:
        msg = e
    if msg is None and type((<dict>d).get("message")) is str:
        msg = (<dict>d)["message"]
    return (msg, code)


# ---------------------------------------------------------------------------------------------
# Discovery: what the engine asks the codec instead of branching on its name


# Responses has text.format: structured output never becomes a forced tool. Its streams always
# end with the usage: nothing for the client to ask, nothing to hide. No headers of its own.
forced_tool_name = no_forced_tool
wants_stream_usage = usage_always_sent
stream_usage_request = body_as_is
response_headers = no_response_headers
error_headers = no_error_headers
not_found_message = model_not_found


cpdef StreamEncoder stream_encoder(str id, str model, bint include_usage, bint json_array):
    return StreamEncoder(id, model)


cdef str _kind_of_code(object code):
    return _KIND_OF_CODE.get(code, "api_error") if type(code) is str else "api_error"


# ---------------------------------------------------------------------------------------------
# Decoder: upstream SSE -> IR events


# Stream event type -> handler number (a table, not a chain of string compares).
cdef enum:
    E_START = 1
    E_ITEM_ADDED
    E_ITEM_DONE
    E_TEXT
    E_REFUSAL
    E_ANNOTATION
    E_ARGS
    E_ARGS_DONE
    E_REASONING
    E_SUMMARY_PART
    E_COMPLETED
    E_INCOMPLETE
    E_FAILED
    E_ERROR

_EVENTS = {
    "response.created": E_START,
    "response.queued": E_START,
    "response.in_progress": E_START,
    "response.output_item.added": E_ITEM_ADDED,
    "response.output_item.done": E_ITEM_DONE,
    "response.output_text.delta": E_TEXT,
    "response.refusal.delta": E_REFUSAL,
    "response.output_text.annotation.added": E_ANNOTATION,
    "response.function_call_arguments.delta": E_ARGS,
    "response.function_call_arguments.done": E_ARGS_DONE,
    "response.reasoning_summary_text.delta": E_REASONING,
    "response.reasoning_text.delta": E_REASONING,
    "response.reasoning_summary_part.added": E_SUMMARY_PART,
    "response.completed": E_COMPLETED,
    "response.incomplete": E_INCOMPLETE,
    "response.failed": E_FAILED,
    "error": E_ERROR,
}

# Output item type -> IR block kind; other items (hosted tool calls) have no IR block.
_ITEM_KINDS = {"message": B_TEXT, "function_call": B_TOOL_USE, "reasoning": B_THINKING}


cdef str _str_or_none(object v):
    return <str>v if type(v) is str else None


cdef class StreamDecoder(SSEDecoder):

    def __cinit__(self, Py_ssize_t max_frame=0):
        self.seq = BlockSequencer()
        self.by_output = {}
        self.by_item = {}

    cdef void _frame(self, object event, bytes data, list out) except *:
        cdef dict d
        cdef object t, r, v
        cdef int code, i, k
        if not data or data == b"[DONE]":
            return  # a keep-alive, or the Chat-style end marker some compatible servers add
        d = jsonget.frame_object(data)
        t = d.get("type")
        if type(t) is not str and type(event) is bytes:
            t = (<bytes>event).decode("utf-8", "replace")
        code = _EVENTS.get(t, 0)
        if code == 0:
            return
        r = d.get("response")
        if code == E_START:
            if type(r) is dict:
                self._start(_str_or_none((<dict>r).get("id")), _str_or_none((<dict>r).get("model")),
                            out)
            return
        if code == E_ERROR:
            self._start(None, None, out)
            self.done = True
            out.append(ev_error(_kind_of_code(d.get("code")),
                                _str_or_none(d.get("message")) or "The upstream reported an error."))
            return
        if code == E_FAILED:
            self._start(None, None, out)
            self.done = True
            self.finished = True
            v = (<dict>r).get("error") if type(r) is dict else None
            if type(v) is dict:
                out.append(ev_error(_kind_of_code((<dict>v).get("code")),
                                    _str_or_none((<dict>v).get("message"))
                                    or "The upstream response failed."))
            else:
                out.append(ev_error("api_error", "The upstream response failed."))
            return
        if code == E_COMPLETED or code == E_INCOMPLETE:
            self._finish(<dict>r if type(r) is dict else {}, code == E_INCOMPLETE, out)
            return
        self._start(None, None, out)
        if code == E_ITEM_ADDED:
            v = d.get("item")
            if type(v) is not dict:
                return
            k = _ITEM_KINDS.get((<dict>v).get("type"), 0)
            if k == 0 or k == B_TEXT:
                # A message opens its block with its first content: that says whether the part
                # is text or a refusal (_text_block).
                return
            self._open(k, d, _str_or_none((<dict>v).get("call_id")),
                       _str_or_none((<dict>v).get("name")), out)
            v = (<dict>v).get("arguments")
            if k == B_TOOL_USE and type(v) is str and v:
                self.seq.tool_args(out, <str>v)
        elif code == E_ITEM_DONE:
            self._item_done(d, out)
        elif code == E_TEXT or code == E_REFUSAL:
            v = d.get("delta")
            if type(v) is str and v:
                if self._text_block(d, code == E_REFUSAL, out) >= 0:
                    if code == E_REFUSAL:
                        self.saw_refusal = True
                        self.seq.refusal(out, <str>v)
                    else:
                        self.seq.text(out, <str>v)
        elif code == E_ANNOTATION:
            v = d.get("annotation")
            if type(v) is dict:
                if self._ensure(B_TEXT, d, out) >= 0:
                    self.seq.delta(out, D_CITATION, None).data = v
        elif code == E_ARGS:
            v = d.get("delta")
            if type(v) is str and v:
                if self._ensure(B_TOOL_USE, d, out) >= 0:
                    self.seq.tool_args(out, <str>v)
        elif code == E_ARGS_DONE:
            v = d.get("arguments")
            i = self._find(d)
            if type(v) is str and v and i >= 0 and i == self.seq.open_index and not self.seq.filled:
                self.seq.tool_args(out, <str>v)
        elif code == E_REASONING:
            v = d.get("delta")
            if type(v) is str and v:
                if self._ensure(B_THINKING, d, out) >= 0:
                    self.seq.thinking(out, <str>v)
        elif code == E_SUMMARY_PART:
            # Summary parts of one reasoning item are paragraphs: read_response joins them with a
            # blank line, and so does the stream.
            v = d.get("summary_index")
            i = self._ensure(B_THINKING, d, out)
            if i >= 0 and type(v) is int and <int>v > self.open_summary:
                if self.seq.filled:
                    self.seq.delta(out, D_THINKING, "\n\n")
                self.open_summary = v

    cdef void _start(self, str id, str model, list out) except *:
        cdef Usage usage
        if self.started:
            return
        self.started = True
        usage = Usage.__new__(Usage)
        usage.input_known = False
        out.append(ev_message_start(id, model, usage))

    cdef int _find(self, dict data) except -2:
        """The IR block an event addresses (by output_index, else item_id), or -1."""
        cdef object v = data.get("output_index")
        if type(v) is int and v in self.by_output:
            return self.by_output[v]
        v = data.get("item_id")
        if type(v) is str and v in self.by_item:
            return self.by_item[v]
        return -1

    cdef int _open(self, int kind, dict data, str id, str name, list out) except -1:
        """A new block for an output item, named by its output_index and item id."""
        cdef int index
        if kind == B_TOOL_USE:
            index = self.seq.tool_start(out, id, name or "")
            self.saw_tool = True
        else:
            index = self.seq.open(out, kind)
        self.open_summary = 0
        self._name(data, index)
        return index

    cdef int _text_block(self, dict data, bint refusal, list out) except -2:
        """The block for a message's text or refusal delta: the item's open block when it is of
        that kind; a new one for the item's first content, or for its next part when the kind
        changes (a message may hold both); -1 (dropped) for an item already closed."""
        cdef int i = self._find(data)
        cdef Block b
        if i >= 0:
            if i != self.seq.open_index or self.seq.open_kind != B_TEXT:
                return -1
            if self.seq.open_refusal == refusal:
                return i
        b = Block.__new__(Block)
        b.kind = B_TEXT
        b.text = ""
        b.refusal = refusal
        i = self.seq.start(out, b)
        self._name(data, i)
        return i

    cdef void _name(self, dict data, int index) except *:
        """An event's output_index and item id name the IR block `index` from now on."""
        cdef object v = data.get("output_index")
        if type(v) is int:
            self.by_output[v] = index
        v = data.get("item")
        v = (<dict>v).get("id") if type(v) is dict else data.get("item_id")
        if type(v) is str:
            self.by_item[v] = index

    cdef int _ensure(self, int kind, dict data, list out) except -1:
        """The open block for a content event; an event for an item never announced opens one,
        an event for an item already closed is dropped (-1)."""
        cdef int i = self._find(data)
        if i >= 0:
            return i if i == self.seq.open_index and self.seq.open_kind == kind else -1
        return self._open(kind, data, None, None, out)

    cdef void _item_done(self, dict data, list out) except *:
        cdef object item = data.get("item")
        cdef dict it
        cdef int i, kind
        cdef object v
        cdef Block b
        if type(item) is not dict:
            return
        it = <dict>item
        kind = _ITEM_KINDS.get(it.get("type"), 0)
        if kind == 0:
            return
        i = self._find(data)
        if i < 0 and kind == B_TEXT:
            # A message whose content was not streamed: its parts from the finished item, each
            # text or refusal part its own block.
            for b in _item_blocks(it):
                if b.kind == B_TEXT:
                    self.seq.start(out, _bare(b))
                    self._name(data, self.seq.open_index)
                    if b.text:
                        self.seq.delta(out, D_TEXT, b.text)
            self.seq.close(out)
            return
        if i < 0:
            i = self._open(kind, data, _str_or_none(it.get("call_id")), _str_or_none(it.get("name")),
                           out)
        if i != self.seq.open_index:
            return
        # Content the upstream did not stream (a server that only sends whole items) comes from
        # the finished item itself.
        if not self.seq.filled:
            if kind == B_TOOL_USE:
                v = it.get("arguments")
                if type(v) is str and v:
                    self.seq.tool_args(out, <str>v)
            else:
                for b in _item_blocks(it):
                    if b.kind == kind and b.text:
                        self.seq.delta(out, D_TEXT if kind == B_TEXT else D_THINKING, b.text)
        if kind == B_THINKING:
            v = it.get("encrypted_content")
            if type(v) is str and v:
                self.seq.delta(out, D_SIGNATURE, <str>v)
        self.seq.close(out)

    cdef void _finish(self, dict response, bint incomplete, list out) except *:
        cdef int stop
        cdef object v = response.get("output")
        cdef Response whole
        cdef Block b
        cdef bint tool = False, refusal = False
        self._start(_str_or_none(response.get("id")), _str_or_none(response.get("model")), out)
        self.seq.close(out)
        if self.seq.next_index == 0 and type(v) is list and v:
            # An upstream that streamed no items at all: replay the final output as blocks.
            whole = Response()
            _read_output(<list>v, whole, &tool, &refusal)
            for b in whole.content:
                _emit_block(self.seq, b, out)
            self.saw_tool = self.saw_tool or tool
            self.saw_refusal = self.saw_refusal or refusal
        if incomplete:
            response = dict(response)
            response["status"] = "incomplete"
        stop = _stop_reason(response, self.saw_tool, self.saw_refusal)
        self.done = True
        self.finished = True
        self.usage = _usage(response.get("usage"))
        out.append(ev_message_delta(stop, None, self.usage))
        out.append(ev_message_stop())


cdef list _item_blocks(dict item):
    cdef Response r = Response()
    cdef bint tool = False, refusal = False
    _read_output([item], r, &tool, &refusal)
    return r.content


cdef Block _bare(Block b):
    """The block a stream starts for `b`: its kind and names, its content to come in deltas."""
    cdef Block start = Block.__new__(Block)
    start.kind = b.kind
    start.id = b.id
    start.name = b.name
    start.refusal = b.refusal
    if b.kind == B_TEXT:
        start.text = ""
    return start


cdef void _emit_block(BlockSequencer seq, Block b, list out) except *:
    """A whole block read from a finished response, as its start, deltas and stop."""
    seq.start(out, _bare(b))
    if b.kind == B_TEXT and b.text:
        seq.delta(out, D_TEXT, b.text)
    elif b.kind == B_TOOL_USE:
        seq.tool_args(out, text_of(b.input))
    elif b.kind == B_THINKING:
        if b.text:
            seq.thinking(out, b.text)
        if b.signature:
            seq.delta(out, D_SIGNATURE, b.signature)
    seq.close(out)


# ---------------------------------------------------------------------------------------------
# Encoder: IR events -> the client's `event: response.*` stream


cdef class _Item:
    pass


cdef class StreamEncoder:

    def __init__(self, str id, str model):
        self.id = id
        self.model = model
        self.created = int(time.time())
        self.base = _base(id)
        self.blocks = {}
        self.items = []

    cdef bytes _frame(self, str type, dict payload):
        """One SSE frame; `type` and `sequence_number` lead the payload as in OpenAI's own."""
        cdef dict d = {"type": type, "sequence_number": self.seq}
        self.seq += 1
        d.update(payload)
        return sse_event(type.encode(), orjson.dumps(d))

    cdef dict _response(self, bint in_progress, object error):
        cdef list output = []
        cdef _Item item
        if not in_progress:
            for item in self.items:
                if item.closed:
                    output.append(_item_json(item, "completed"))
        return _response_object(self.id, self.model, self.created, self.stop_reason, output,
                                None if in_progress else _usage_out(self.usage), error,
                                in_progress)

    cdef bytes _start(self):
        if self.started:
            return b""
        self.started = True
        return (self._frame("response.created", {"response": self._response(True, None)})
                + self._frame("response.in_progress", {"response": self._response(True, None)}))

    cdef _Item _open(self, int index, int kind, str call_id, str name, bint refusal, list out):
        cdef _Item item = _Item.__new__(_Item)
        cdef str prefix = "msg" if kind == B_TEXT else "fc" if kind == B_TOOL_USE else "rs"
        item.kind = kind
        item.refusal = refusal and kind == B_TEXT
        item.output_index = len(self.items)
        item.item_id = _item_id(prefix, self.base, item.output_index)
        item.parts = []
        item.annotations = []
        if kind == B_TOOL_USE:
            item.call_id = call_id or _item_id("call", self.base, item.output_index)
            item.name = name or ""
        self.items.append(item)
        self.blocks[index] = item
        out.append(self._frame("response.output_item.added", {
            "output_index": item.output_index, "item": _item_json(item, "in_progress")}))
        if item.refusal:
            out.append(self._frame("response.content_part.added", {
                "item_id": item.item_id, "output_index": item.output_index, "content_index": 0,
                "part": {"type": "refusal", "refusal": ""}}))
        elif kind == B_TEXT:
            out.append(self._frame("response.content_part.added", {
                "item_id": item.item_id, "output_index": item.output_index, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}}))
        return item

    cdef void _close(self, _Item item, list out) except *:
        cdef str text = "".join(item.parts)
        cdef dict item_ref = {"item_id": item.item_id, "output_index": item.output_index}
        if item.closed:
            return
        item.closed = True
        if item.refusal:
            out.append(self._frame("response.refusal.done", dict(
                item_ref, content_index=0, refusal=text)))
            out.append(self._frame("response.content_part.done", dict(
                item_ref, content_index=0, part={"type": "refusal", "refusal": text})))
        elif item.kind == B_TEXT:
            out.append(self._frame("response.output_text.done", dict(
                item_ref, content_index=0, text=text, logprobs=[])))
            out.append(self._frame("response.content_part.done", dict(
                item_ref, content_index=0,
                part={"type": "output_text", "text": text, "annotations": item.annotations})))
        elif item.kind == B_TOOL_USE:
            out.append(self._frame("response.function_call_arguments.done", dict(
                item_ref, arguments=text)))
        elif item.summary_open:
            out.append(self._frame("response.reasoning_summary_text.done", dict(
                item_ref, summary_index=0, text=text)))
            out.append(self._frame("response.reasoning_summary_part.done", dict(
                item_ref, summary_index=0, part={"type": "summary_text", "text": text})))
        out.append(self._frame("response.output_item.done", {
            "output_index": item.output_index, "item": _item_json(item, "completed")}))

    cdef bytes _end(self):
        cdef list out = []
        cdef _Item item
        cdef bint incomplete = (self.stop_reason == SR_MAX_TOKENS
                                or self.stop_reason == SR_SAFETY)
        for item in self.items:
            self._close(item, out)
        self.finished = True
        out.append(self._frame("response.incomplete" if incomplete else "response.completed",
                               {"response": self._response(False, None)}))
        return b"".join(out)

    cpdef bytes encode(self, list events):
        cdef list out = []
        cdef Event e
        cdef _Item item
        cdef int kind
        cdef dict a
        if self.finished:
            return b""
        for ev in events:
            e = <Event>ev
            if e.kind == EV_ERROR:
                out.append(self.error(e.error_kind or "api_error",
                                      e.message or "The upstream stream failed."))
                break
            out.append(self._start())
            if e.kind == EV_MESSAGE_START:
                self.usage = merge_usage(self.usage, e.usage)
            elif e.kind == EV_BLOCK_START:
                kind = e.block.kind if e.block is not None else 0
                if kind == B_TEXT or kind == B_TOOL_USE or (
                        kind == B_THINKING and not e.block.redacted):
                    self._open(e.index, kind, e.block.id, e.block.name, e.block.refusal, out)
                else:
                    self.blocks[e.index] = None   # images, redacted thinking: no Responses form
            elif e.kind == EV_BLOCK_DELTA:
                if e.index in self.blocks:
                    item = self.blocks[e.index]
                    if item is None or item.closed:
                        continue
                else:
                    kind = (B_TEXT if e.delta_kind == D_TEXT or e.delta_kind == D_CITATION else
                            B_TOOL_USE if e.delta_kind == D_INPUT_JSON else B_THINKING)
                    item = self._open(e.index, kind, None, None, False, out)
                if e.delta_kind == D_TEXT and item.refusal and e.text:
                    item.parts.append(e.text)
                    out.append(self._frame("response.refusal.delta", {
                        "item_id": item.item_id, "output_index": item.output_index,
                        "content_index": 0, "delta": e.text}))
                elif e.delta_kind == D_TEXT and item.kind == B_TEXT and e.text:
                    item.parts.append(e.text)
                    out.append(self._frame("response.output_text.delta", {
                        "item_id": item.item_id, "output_index": item.output_index,
                        "content_index": 0, "delta": e.text,
                        "logprobs": _logprobs_out(e.data, False) if type(e.data) is list else []}))
                elif e.delta_kind == D_INPUT_JSON and item.kind == B_TOOL_USE and e.text:
                    item.parts.append(e.text)
                    out.append(self._frame("response.function_call_arguments.delta", {
                        "item_id": item.item_id, "output_index": item.output_index,
                        "delta": e.text}))
                elif e.delta_kind == D_THINKING and item.kind == B_THINKING and e.text:
                    if not item.summary_open:
                        item.summary_open = True
                        out.append(self._frame("response.reasoning_summary_part.added", {
                            "item_id": item.item_id, "output_index": item.output_index,
                            "summary_index": 0, "part": {"type": "summary_text", "text": ""}}))
                    item.parts.append(e.text)
                    out.append(self._frame("response.reasoning_summary_text.delta", {
                        "item_id": item.item_id, "output_index": item.output_index,
                        "summary_index": 0, "delta": e.text}))
                elif e.delta_kind == D_SIGNATURE and item.kind == B_THINKING and e.text:
                    item.signature = e.text
                elif e.delta_kind == D_CITATION and item.kind == B_TEXT and not item.refusal:
                    a = _annotation(e.data)
                    if a is not None:
                        out.append(self._frame("response.output_text.annotation.added", {
                            "item_id": item.item_id, "output_index": item.output_index,
                            "content_index": 0, "annotation_index": len(item.annotations),
                            "annotation": a}))
                        item.annotations.append(a)
            elif e.kind == EV_BLOCK_STOP:
                item = self.blocks.get(e.index)
                if item is not None:
                    self._close(item, out)
            elif e.kind == EV_MESSAGE_DELTA:
                if e.stop_reason != SR_UNSET:
                    self.stop_reason = e.stop_reason
                self.usage = merge_usage(self.usage, e.usage)
            elif e.kind == EV_MESSAGE_STOP:
                out.append(self._end())
                break
        return b"".join(out)

    cpdef bytes error(self, str kind, str message):
        cdef bytes start
        if self.finished:
            return b""
        start = self._start()
        self.finished = True
        return start + self._frame("response.failed", {"response": self._response(False, {
            "code": _FAILED_CODES.get(kind, "server_error"), "message": message})})


cdef dict _item_json(_Item item, str status):
    """An output item as the client sees it; `status` is in_progress when announced."""
    cdef str text = "".join(item.parts) if status == "completed" else ""
    if item.kind == B_TEXT:
        if status == "in_progress":
            return {"id": item.item_id, "type": "message", "status": status, "role": "assistant",
                    "content": []}
        if item.refusal:
            return _refusal_item(item.item_id, status, text)
        return _message_item(item.item_id, status, text, item.annotations, None)
    if item.kind == B_TOOL_USE:
        return _call_item(item.item_id, status, item.call_id, item.name, text)
    return _reasoning_item(item.item_id, text, item.signature)


# What an error_map is matched against: error.code, then error.type (_common.error_code_type).
error_signals = error_code_type
