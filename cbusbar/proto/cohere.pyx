# cython: language_level=3
"""Cohere v2 chat (`POST /v2/chat`) <-> the IR. Sans-IO, the shape of docs/codecs.md.

Wire authority: the cohere Python SDK (cohere/v2/raw_client.py, cohere/types/*). Choices where
Cohere and the IR do not line up one to one:

- `tool_plan` (the model's note before its tool calls) is a TEXT block placed before the TOOL_USE
  blocks, in requests, buffered responses and streams alike, so it reaches every other protocol as
  ordinary assistant text. Writing, the text of an assistant turn that carries tool calls becomes
  `tool_plan` again (requests and buffered responses: that is where Cohere itself puts it). A
  streamed text block is always written as content-start/-delta/-end: whether tool calls follow is
  unknown while the text streams, and holding the text back would defeat streaming.
- Tool result `document` parts become text holding the document's `data` as JSON; tool results
  are written back as `tool` messages with text parts (Cohere has no error flag or image there).
- `thinking` content is read into THINKING blocks and written in responses and streams; requests
  drop it (the `thinking` request knob is Cohere-only and lives in `extra`).
- Citations are read raw (Block.citations / D_CITATION data); writers keep Cohere's own, turn
  Anthropic and OpenAI ones into Cohere's shape and drop the rest. Cohere streams citations after
  content-end, so the decoder defers that block's BLOCK_STOP until the next block or message-end.
- Cohere logprobs (text chunks + token ids) have no IR home; they are same-protocol only.
"""


import orjson

from cbusbar cimport ids

from cbusbar.framing import FramingError
from cbusbar.framing cimport members, scan_top, sse_event
from cbusbar.ir import CodecError
from cbusbar cimport jsonget
from cbusbar.ir cimport text_is_empty
from cbusbar.jsonspan cimport join_text, text_value
from cbusbar.jsonget cimport (
    Shape, as_dict, as_str, opt_bool, opt_int, opt_number, opt_str, req_list,
    J_OBJECT, J_ARRAY, J_CONTENT, J_STRINGS, count,
)
from cbusbar.jsonget import NOT_AN_OBJECT, UPSTREAM_BAD_FRAME, UPSTREAM_NOT_JSON
from cbusbar.usage cimport merge_usage
from cbusbar.arguments cimport input_of, text_of
from cbusbar.proto._common cimport SSEDecoder, error_object, own_error_in
from cbusbar.proto._common import (body_as_is, model_not_found, no_error_headers, no_forced_tool,
                                   no_response_headers, usage_always_sent)

from cbusbar.ir cimport (
    B_DOCUMENT, B_IMAGE, B_TEXT, B_THINKING, B_TOOL_RESULT, B_TOOL_USE,
    D_CITATION, D_INPUT_JSON, D_TEXT, D_THINKING,
    EV_BLOCK_DELTA, EV_BLOCK_START, EV_BLOCK_STOP, EV_ERROR, EV_MESSAGE_DELTA, EV_MESSAGE_START,
    EV_MESSAGE_STOP,
    RF_JSON_OBJECT, RF_JSON_SCHEMA, RF_TEXT,
    ROLE_ASSISTANT, ROLE_USER,
    SR_END_TURN, SR_ERROR, SR_MAX_TOKENS, SR_OTHER, SR_SAFETY, SR_STOP_SEQUENCE, SR_TOOL_USE,
    SRC_BASE64, SRC_URL,
    TC_NONE, TC_REQUIRED, TC_TOOL,
    Block, Event, Message, Request, Response, Tool, Usage,
    ev_error, ev_message_delta, ev_message_start,
    ev_message_stop, text_block,
)

NAME = "cohere"
CONTENT_TYPE = b"application/json"
STREAM_CONTENT_TYPE = b"text/event-stream"
BODY_MODEL = True           # the model name travels in the body
NEEDS_MAX_TOKENS = False    # max_tokens is optional
# The top-level members the engine reads without parsing (one scan of the body): the model,
# stream, and where the caller's output cap lives; MAX_TOKENS_PATH is that cap's path, one level
# deep at most (governance reserves a budget for it before the call).
SCAN_KEYS = (b"model", b"stream", b"max_tokens")
MAX_TOKENS_PATH = ((b"max_tokens",),)
PROBE_MAX_TOKENS = 1        # health probes: v2 chat accepts max_tokens >= 1
# Egress: what busbar/engine/egress.py sends this API besides the body, and the API's cloud
# forms (docs/codecs.md "Egress").
USER_AGENT = b"cohere-python/5.11.0"
API_HEADERS = ()
BETA_HEADERS = ()
AZURE_FORMS = ()
VERTEX_PUBLISHER = None
vertex_body = None

# Cohere documents "a list of up to 5 strings" for stop_sequences (cohere/v2/raw_client.py).
cdef int MAX_STOP_SEQUENCES = 5

cdef str BAD_UPSTREAM = UPSTREAM_NOT_JSON

# Which Cohere event family opened the decoder's current block.
cdef enum:
    SRC_CONTENT = 1
    SRC_TOOL = 2
    SRC_PLAN = 3

# Request fields with an IR home; every other top-level field goes to Request.extra.
_KNOWN_FIELDS = frozenset((
    "model", "messages", "tools", "tool_choice", "response_format", "max_tokens", "temperature",
    "p", "k", "stop_sequences", "frequency_penalty", "presence_penalty", "seed", "logprobs",
    "stream",
))

# ChatFinishReason (cohere/types/chat_finish_reason.py), plus the v1 names a v2 endpoint has been
# seen to echo (ERROR_TOXIC, ERROR_LIMIT) and USER_CANCEL.
_STOP_OF_FINISH = {
    "COMPLETE": SR_END_TURN,
    "STOP_SEQUENCE": SR_STOP_SEQUENCE,
    "MAX_TOKENS": SR_MAX_TOKENS,
    "TOOL_CALL": SR_TOOL_USE,
    "ERROR": SR_ERROR,
    "TIMEOUT": SR_ERROR,
    "ERROR_TOXIC": SR_SAFETY,
    "ERROR_LIMIT": SR_MAX_TOKENS,
    "USER_CANCEL": SR_OTHER,
}

# SPEC 1.5: COMPLETE, STOP_SEQUENCE, MAX_TOKENS, TOOL_CALL; ERROR <- Safety and Error; others
# COMPLETE. ERROR_TOXIC is never written.
_FINISH_OF_STOP = {
    SR_END_TURN: "COMPLETE",
    SR_STOP_SEQUENCE: "STOP_SEQUENCE",
    SR_MAX_TOKENS: "MAX_TOKENS",
    SR_TOOL_USE: "TOOL_CALL",
    SR_SAFETY: "ERROR",
    SR_ERROR: "ERROR",
}


# ---------------------------------------------------------------------------------------------
# Helpers: small readers


# Cohere words its shape errors as jsonget's base Shape does (`Invalid type for 'messages':
# expected an array.`, `Missing required parameter: 'model'.`).
cdef Shape SHAPE = Shape()


cdef object _lax_int(dict d, str key, str path):
    """Cohere's SDK validates with pydantic in lax mode: 1024.0 passes as an integer too."""
    cdef object v = d.get(key)
    if type(v) is float and v.is_integer():
        return int(v)
    return opt_int(d, key, path, SHAPE)


cdef object _get(object obj, str key):
    """obj[key] when obj is a dict, else None: upstream frames are read leniently."""
    if isinstance(obj, dict):
        return (<dict>obj).get(key)
    return None


cdef object _parse_arguments(str arguments):
    """Tool-call arguments are a JSON string on Cohere's wire (arguments.input_of: an object, {}
    for a call without arguments, else the text as it came)."""
    return input_of(arguments)


cdef Block _image_block(str url):
    """An image_url part: a base64 data URI becomes SRC_BASE64, anything else a URL busbar never
    fetches."""
    cdef Block b = Block.__new__(Block)
    cdef Py_ssize_t comma
    cdef list meta
    b.kind = B_IMAGE
    if url.startswith("data:"):
        comma = url.find(",")
        if comma > 0:
            meta = url[5:comma].split(";")
            if "base64" in meta[1:]:
                b.src_kind = SRC_BASE64
                b.media_type = meta[0] or None
                b.data = url[comma + 1:]
                return b
    b.src_kind = SRC_URL
    b.data = url
    return b


cdef Block _thinking(str text):
    cdef Block b = Block.__new__(Block)
    b.kind = B_THINKING
    b.text = text
    return b


cdef Block _tool_use(str id, str name, object input):
    cdef Block b = Block.__new__(Block)
    b.kind = B_TOOL_USE
    b.id = id
    b.name = name
    b.input = input
    return b


cdef list _text_parts(object content, str path):
    """System content: a string or [{type: text, text}]."""
    cdef list out = []
    cdef Py_ssize_t i
    if isinstance(content, str):
        out.append(text_block(content))
        return out
    if type(content) is not list:
        raise SHAPE.bad_type(path, J_CONTENT, content)
    for i, part in enumerate(content):
        if type(part) is not dict:
            raise SHAPE.bad_type("%s[%d]" % (path, i), J_OBJECT, part)
        if part.get("type", "text") == "text":
            out.append(text_block(opt_str(part, "text", "%s[%d].text" % (path, i), SHAPE) or ""))
    return out


cdef list _user_parts(object content, str path):
    """User content: a string or [{type: text, text} | {type: image_url, image_url: {url}}].
    Part types Cohere may add later are skipped rather than refused."""
    cdef list out = []
    cdef Py_ssize_t i
    cdef str kind, url
    if isinstance(content, str):
        out.append(text_block(content))
        return out
    if type(content) is not list:
        raise SHAPE.bad_type(path, J_CONTENT, content)
    for i, part in enumerate(content):
        if type(part) is not dict:
            raise SHAPE.bad_type("%s[%d]" % (path, i), J_OBJECT, part)
        kind = opt_str(part, "type", "%s[%d].type" % (path, i), SHAPE)
        if kind == "text":
            out.append(text_block(opt_str(part, "text", "%s[%d].text" % (path, i), SHAPE) or ""))
        elif kind == "image_url":
            image = part.get("image_url")
            # Accept the bare-string spelling some OpenAI-style clients send, as Cohere does.
            url = image if isinstance(image, str) else opt_str(as_dict(image, "%s[%d].image_url" % (path, i), SHAPE),
                                                               "url", "%s[%d].image_url.url" % (path, i), SHAPE)
            if not url:
                raise SHAPE.missing("%s[%d].image_url.url" % (path, i))
            out.append(_image_block(url))
    return out


cdef list _tool_result_parts(object content, str path):
    """Tool message content: a string, or [{type: text, text} | {type: document, document:
    {data, id?}}]. A document becomes text holding its data (JSON for an object)."""
    cdef list out = []
    cdef Py_ssize_t i
    cdef str kind
    if isinstance(content, str):
        out.append(text_block(content))
        return out
    if type(content) is not list:
        raise SHAPE.bad_type(path, J_CONTENT, content)
    for i, part in enumerate(content):
        if type(part) is not dict:
            raise SHAPE.bad_type("%s[%d]" % (path, i), J_OBJECT, part)
        kind = opt_str(part, "type", "%s[%d].type" % (path, i), SHAPE)
        if kind == "text":
            out.append(text_block(opt_str(part, "text", "%s[%d].text" % (path, i), SHAPE) or ""))
        elif kind == "document":
            data = _get(part.get("document"), "data")
            if isinstance(data, str):
                out.append(text_block(data))
            elif data is not None:
                out.append(text_block(orjson.dumps(data).decode()))
    return out


cdef Message _assistant(dict m, str path):
    """tool_plan first (it precedes the calls it plans), then content, then the tool calls;
    thinking parts lead, as every thinking-aware protocol expects them first."""
    cdef list thinking = [], text = [], calls = []
    cdef Message msg
    cdef Py_ssize_t i
    cdef str kind, plan, id, name, arguments, s
    content = m.get("content")
    plan = opt_str(m, "tool_plan", path + ".tool_plan", SHAPE)
    if plan:
        text.append(text_block(plan))
    if isinstance(content, str):
        if content:
            text.append(text_block(content))
    elif isinstance(content, list):
        for i, part in enumerate(content):
            if type(part) is not dict:
                raise SHAPE.bad_type("%s.content[%d]" % (path, i), J_OBJECT, part)
            kind = opt_str(part, "type", "%s.content[%d].type" % (path, i), SHAPE)
            if kind == "text":
                s = opt_str(part, "text", "%s.content[%d].text" % (path, i), SHAPE)
                if s:
                    text.append(text_block(s))
            elif kind == "thinking":
                s = opt_str(part, "thinking", "%s.content[%d].thinking" % (path, i), SHAPE)
                if s:
                    thinking.append(_thinking(s))
    elif content is not None:
        raise SHAPE.bad_type(path + ".content", J_CONTENT, content)
    tool_calls = m.get("tool_calls")
    if tool_calls is not None:
        if type(tool_calls) is not list:
            raise SHAPE.bad_type(path + ".tool_calls", J_ARRAY, tool_calls)
        for i, call in enumerate(tool_calls):
            if type(call) is not dict:
                raise SHAPE.bad_type("%s.tool_calls[%d]" % (path, i), J_OBJECT, call)
            fn = call.get("function")
            if type(fn) is not dict:
                raise SHAPE.bad_type("%s.tool_calls[%d].function" % (path, i), J_OBJECT, fn)
            id = opt_str(call, "id", "%s.tool_calls[%d].id" % (path, i), SHAPE)
            name = opt_str(fn, "name", "%s.tool_calls[%d].function.name" % (path, i), SHAPE)
            arguments = opt_str(fn, "arguments", "%s.tool_calls[%d].function.arguments" % (path, i), SHAPE)
            calls.append(_tool_use(id, name, _parse_arguments(arguments)))
    msg = Message.__new__(Message)
    msg.role = ROLE_ASSISTANT
    msg.content = thinking + text + calls
    return msg


cdef list _read_tools(object tools):
    cdef list out = []
    cdef Py_ssize_t i
    cdef Tool t
    if tools is None:
        return out
    if type(tools) is not list:
        raise SHAPE.bad_type("tools", J_ARRAY, tools)
    for i, tool in enumerate(tools):
        fn = _get(tool, "function")
        if type(fn) is not dict:
            raise SHAPE.bad_type("tools[%d].function" % i, J_OBJECT, fn)
        t = Tool.__new__(Tool)
        t.name = opt_str(fn, "name", "tools[%d].function.name" % i, SHAPE)
        if not t.name:
            raise SHAPE.missing("tools[%d].function.name" % i)
        t.description = opt_str(fn, "description", "tools[%d].function.description" % i, SHAPE)
        t.schema = fn.get("parameters")
        out.append(t)
    return out


# ---------------------------------------------------------------------------------------------
# Request


cpdef Request read_request(bytes body):
    cdef dict doc = jsonget.request_object(body, NOT_AN_OBJECT)
    cdef Request req = Request()
    cdef Message msg, results = None
    cdef Block b
    cdef Py_ssize_t i
    cdef str role, path, choice
    cdef list stop
    req.model = opt_str(doc, "model", "model", SHAPE)
    if not req.model:
        raise SHAPE.missing("model")
    messages = req_list(doc, "messages", "messages", SHAPE)
    for i, m in enumerate(messages):
        path = "messages[%d]" % i
        if type(m) is not dict:
            raise SHAPE.bad_type(path, J_OBJECT, m)
        role = m.get("role") if isinstance(m.get("role"), str) else None
        if role == "system":
            # Cohere allows system turns anywhere; the IR has one system prompt, so they collect.
            req.system.extend(_text_parts(m.get("content"), path + ".content"))
        elif role == "user":
            results = None
            msg = Message.__new__(Message)
            msg.role = ROLE_USER
            msg.content = _user_parts(m.get("content"), path + ".content")
            req.messages.append(msg)
        elif role == "assistant":
            results = None
            msg = _assistant(m, path)
            if msg.content:
                req.messages.append(msg)
        elif role == "tool":
            b = Block.__new__(Block)
            b.kind = B_TOOL_RESULT
            b.id = opt_str(m, "tool_call_id", path + ".tool_call_id", SHAPE)
            if not b.id:
                raise SHAPE.missing("%s.tool_call_id" % path)
            b.content = _tool_result_parts(m.get("content"), path + ".content")
            # Consecutive tool messages answer one assistant turn: one USER message holds them all.
            if results is None:
                results = Message.__new__(Message)
                results.role = ROLE_USER
                results.content = []
                req.messages.append(results)
            results.content.append(b)
        else:
            raise CodecError("Invalid value for '%s.role': expected one of 'system', 'user', "
                             "'assistant', 'tool'." % path)

    req.tools = _read_tools(doc.get("tools"))
    tc = doc.get("tool_choice")
    if tc is not None:
        choice = as_str(tc, "tool_choice", SHAPE).upper()
        if choice == "REQUIRED":
            req.tool_choice = TC_REQUIRED
        elif choice == "NONE":
            req.tool_choice = TC_NONE
        else:
            raise CodecError("Invalid value for 'tool_choice': expected 'REQUIRED' or 'NONE'.")

    rf = doc.get("response_format")
    if rf is not None:
        if type(rf) is not dict:
            raise SHAPE.bad_type("response_format", J_OBJECT, rf)
        kind = rf.get("type")
        if kind == "text":
            req.response_format = RF_TEXT
        elif kind == "json_object":
            schema = rf.get("json_schema")
            if schema is not None:
                req.response_format = RF_JSON_SCHEMA
                req.rf_schema = schema
            else:
                req.response_format = RF_JSON_OBJECT
        else:
            raise CodecError("Invalid value for 'response_format.type': expected 'text' or "
                             "'json_object'.")

    req.max_tokens = _lax_int(doc, "max_tokens", "max_tokens")
    req.temperature = opt_number(doc, "temperature", "temperature", SHAPE)
    req.top_p = opt_number(doc, "p", "p", SHAPE)
    req.top_k = _lax_int(doc, "k", "k")
    req.frequency_penalty = opt_number(doc, "frequency_penalty", "frequency_penalty", SHAPE)
    req.presence_penalty = opt_number(doc, "presence_penalty", "presence_penalty", SHAPE)
    req.seed = _lax_int(doc, "seed", "seed")
    req.logprobs = opt_bool(doc, "logprobs", "logprobs", SHAPE)
    req.stream = opt_bool(doc, "stream", "stream", SHAPE) is True
    seqs = doc.get("stop_sequences")
    if seqs is not None:
        if type(seqs) is not list:
            raise SHAPE.bad_type("stop_sequences", J_STRINGS, seqs)
        stop = []
        for s in seqs:
            if type(s) is not str:
                raise SHAPE.bad_type("stop_sequences", J_STRINGS, seqs)
            stop.append(s)
        req.stop = stop

    for key, value in doc.items():
        if key not in _KNOWN_FIELDS:
            req.extra[key] = value
    return req


cdef object _content_value(list parts):
    """One text part is written as a plain string (the common spelling); anything else as a list."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        return parts[0]["text"]
    return parts


cdef object _image_part(Block b):
    cdef str url
    if b.src_kind == SRC_BASE64 and b.data is not None:
        url = "data:%s;base64,%s" % (b.media_type or "image/png", b.data)
    elif b.src_kind == SRC_URL and b.data:
        url = b.data
    else:
        return None   # vendor references (file ids, s3/gs URIs) mean nothing to Cohere
    return {"type": "image_url", "image_url": {"url": url}}


cdef list _tool_content(Block result):
    """Cohere tool content carries text and documents only: images in a tool result are dropped."""
    cdef list parts = []
    cdef Block c
    if result.content is not None:
        for c in result.content:
            if (c.kind == B_TEXT or c.kind == B_DOCUMENT) and (c.text_json is not None or c.text is not None):
                parts.append({"type": "text", "text": text_value(c)})
    if not parts:
        parts.append({"type": "text", "text": ""})
    return parts


cdef str _arguments(object input):
    return text_of(input)


cdef void _write_user(list out, Message m):
    cdef list parts = []
    cdef Block b
    for b in m.content:
        if b.kind == B_TOOL_RESULT:
            # Cohere answers tool calls with `tool` messages; text said alongside follows them.
            if parts:
                out.append({"role": "user", "content": _content_value(parts)})
                parts = []
            out.append({"role": "tool", "tool_call_id": b.id or "", "content": _tool_content(b)})
        elif b.kind == B_TEXT:
            parts.append({"type": "text", "text": text_value(b)})
        elif b.kind == B_IMAGE:
            part = _image_part(b)
            if part is not None:
                parts.append(part)
        elif b.kind == B_DOCUMENT and b.text is not None:
            parts.append({"type": "text", "text": b.text})
    if parts:
        out.append({"role": "user", "content": _content_value(parts)})


cdef void _write_assistant(list out, Message m):
    cdef list texts = [], calls = []
    cdef Block b
    cdef dict msg
    for b in m.content:
        if b.kind == B_TEXT and not text_is_empty(b):
            texts.append(b)     # text blocks: jsonspan.join_text / text_value keep literals
        elif b.kind == B_TOOL_USE:
            calls.append({"id": b.id or "", "type": "function",
                          "function": {"name": b.name or "", "arguments": _arguments(b.input)}})
    if calls:
        msg = {"role": "assistant", "tool_calls": calls}
        if texts:
            msg["tool_plan"] = join_text(texts, "")
    elif texts:
        msg = {"role": "assistant",
               "content": _content_value([{"type": "text", "text": text_value(<Block>t)} for t in texts])}
    else:
        return   # thinking only: Cohere has no way to say it, and an empty turn is refused
    out.append(msg)


cpdef bytes write_request(Request req):
    cdef dict body = {}
    cdef list messages = [], system = [], tools = [], stop
    cdef Message m
    cdef Block b
    cdef Tool t
    cdef dict fn, rf
    body["model"] = req.model
    for b in req.system:
        if b.kind == B_TEXT and (b.text_json is not None or b.text is not None):
            system.append({"type": "text", "text": text_value(b)})
    if system:
        messages.append({"role": "system", "content": _content_value(system)})
    for m in req.messages:
        if m.role == ROLE_ASSISTANT:
            _write_assistant(messages, m)
        else:
            _write_user(messages, m)
    body["messages"] = messages

    for t in req.tools:
        fn = {"name": t.name}
        if t.description is not None:
            fn["description"] = t.description
        # `parameters` is required by Cohere; a tool without a schema takes no arguments.
        fn["parameters"] = t.schema if t.schema is not None else {"type": "object", "properties": {}}
        tools.append({"type": "function", "function": fn})
    if tools:
        body["tools"] = tools
        # Cohere cannot name one tool: forcing a specific tool is the nearest, "use some tool".
        if req.tool_choice == TC_REQUIRED or req.tool_choice == TC_TOOL:
            body["tool_choice"] = "REQUIRED"
        elif req.tool_choice == TC_NONE:
            body["tool_choice"] = "NONE"

    if req.response_format == RF_TEXT:
        body["response_format"] = {"type": "text"}
    elif req.response_format == RF_JSON_OBJECT:
        body["response_format"] = {"type": "json_object"}
    elif req.response_format == RF_JSON_SCHEMA:
        rf = {"type": "json_object"}
        if req.rf_schema is not None:
            rf["json_schema"] = req.rf_schema
        body["response_format"] = rf

    if req.max_tokens is not None:
        body["max_tokens"] = req.max_tokens
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["p"] = req.top_p
    if req.top_k is not None:
        body["k"] = req.top_k
    if req.stop:
        stop = req.stop[:MAX_STOP_SEQUENCES]
        body["stop_sequences"] = stop
    if req.frequency_penalty is not None:
        body["frequency_penalty"] = req.frequency_penalty
    if req.presence_penalty is not None:
        body["presence_penalty"] = req.presence_penalty
    if req.seed is not None:
        body["seed"] = req.seed
    if req.logprobs is not None:
        body["logprobs"] = req.logprobs
    # The SDK always says which it wants, and Cohere answers JSON unless told to stream.
    body["stream"] = bool(req.stream)
    if req.extra:
        # Only ever Cohere's own fields (the engine clears extra on a cross-protocol hop).
        for key, value in req.extra.items():
            if key not in body:
                body[key] = value
    return orjson.dumps(body)


cpdef str upstream_path(str model, bint stream):
    return "/v2/chat"


# ---------------------------------------------------------------------------------------------
# Response and usage (buffered)


cdef Usage _read_usage_obj(object usage):
    """Cohere reports `tokens` (what the model processed) and `billed_units` (what is charged,
    without Cohere's own prompt scaffolding). The IR counts tokens; billed units are the fallback."""
    cdef object tokens = _get(usage, "tokens")
    cdef object billed = _get(usage, "billed_units")
    return _usage_from(_get(tokens, "input_tokens"), _get(tokens, "output_tokens"),
                       _get(billed, "input_tokens"), _get(billed, "output_tokens"),
                       _get(usage, "cached_tokens"))


cdef Usage _usage_from(object t_in, object t_out, object b_in, object b_out, object cached):
    """The one mapping of Cohere's usage counts, from its dict (_read_usage_obj) or read in place
    (read_usage); each count as jsonget.count() reads it (negative, huge or not a number: 0)."""
    cdef Usage u = Usage.__new__(Usage)
    cdef object inp = t_in if t_in is not None else b_in
    cdef object out = t_out if t_out is not None else b_out
    u.input_tokens = count(inp)
    u.output_tokens = count(out)
    u.cache_read_tokens = count(cached)
    u.input_known = inp is not None
    return u


cdef int _stop_of(object finish):
    if finish is None:
        return SR_END_TURN
    return _STOP_OF_FINISH.get(finish, SR_OTHER) if isinstance(finish, str) else SR_OTHER


cpdef Response read_response(bytes body):
    cdef dict doc = jsonget.upstream_object(body)
    cdef Response resp = Response()
    cdef list thinking = [], text = [], calls = [], by_content = []
    cdef Block plan = None, b, target
    cdef Py_ssize_t n
    cdef str s
    msg = doc.get("message")
    if msg is not None and not isinstance(msg, dict):
        raise CodecError(BAD_UPSTREAM)
    resp.id = doc.get("id") if isinstance(doc.get("id"), str) else None
    s = _get(msg, "tool_plan") if isinstance(_get(msg, "tool_plan"), str) else None
    if s:
        plan = text_block(s)
        text.append(plan)
    content = _get(msg, "content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(content, list):
        for part in content:
            b = None
            kind = _get(part, "type")
            if kind == "text" and isinstance(_get(part, "text"), str):
                b = text_block(part["text"])
                text.append(b)
            elif kind == "thinking" and isinstance(_get(part, "thinking"), str):
                b = _thinking(part["thinking"])
                thinking.append(b)
            by_content.append(b)   # content_index in citations counts every part
    tool_calls = _get(msg, "tool_calls")
    if isinstance(tool_calls, list):
        for call in tool_calls:
            fn = _get(call, "function")
            args = _get(fn, "arguments")
            calls.append(_tool_use(
                _get(call, "id") if isinstance(_get(call, "id"), str) else None,
                _get(fn, "name") if isinstance(_get(fn, "name"), str) else None,
                _parse_arguments(args if isinstance(args, str) else None)))
    citations = _get(msg, "citations")
    if isinstance(citations, list):
        n = len(by_content)
        for cite in citations:
            if not isinstance(cite, dict):
                continue
            target = None
            ci = cite.get("content_index")
            if cite.get("type") == "PLAN":
                target = plan
            elif isinstance(ci, int) and not isinstance(ci, bool) and 0 <= ci < n:
                target = by_content[ci]
            else:
                for b in text:
                    if b is not plan:
                        target = b
                        break
            if target is not None:
                if target.citations is None:
                    target.citations = []
                target.citations.append(cite)
    resp.content = thinking + text + calls
    resp.stop_reason = _stop_of(doc.get("finish_reason"))
    resp.usage = _read_usage_obj(doc.get("usage"))
    return resp


# Anthropic's citation location types (their documents are numbered, not Cohere-id'd).
_ANTHROPIC_CITATIONS = frozenset((
    "char_location", "page_location", "content_block_location", "web_search_result_location",
    "search_result_location"))


cdef object _cohere_citation(object c, int content_index):
    """One citation in Cohere's shape, or None. Cohere's own pass through (content_index filled in
    when missing); Anthropic locations and OpenAI url_citations keep what Cohere can say (the cited
    text, the source's title/url); shapes Cohere cannot express are dropped."""
    cdef dict out, doc
    if not isinstance(c, dict):
        return None
    t = c.get("type")
    if t in ("TEXT_CONTENT", "THINKING_CONTENT", "PLAN") or (t is None and ("sources" in c or "start" in c)):
        if "content_index" in c:
            return c
        out = dict(c)
        out["content_index"] = content_index
        return out
    doc = {}
    out = {"sources": [{"type": "document", "document": doc}], "content_index": content_index,
           "type": "TEXT_CONTENT"}
    if t == "url_citation":
        u = c.get("url_citation")
        if not isinstance(u, dict):
            u = c   # the Responses API spells it flat
        if not isinstance(u.get("url"), str):
            return None
        if isinstance(u.get("start_index"), int) and isinstance(u.get("end_index"), int):
            out["start"] = u["start_index"]
            out["end"] = u["end_index"]
        out["sources"][0]["id"] = u["url"]
        doc["url"] = u["url"]
        if isinstance(u.get("title"), str):
            doc["title"] = u["title"]
        return out
    if t in _ANTHROPIC_CITATIONS:
        if isinstance(c.get("cited_text"), str):
            out["text"] = c["cited_text"]
            doc["text"] = c["cited_text"]
        if isinstance(c.get("document_index"), int):
            out["sources"][0]["id"] = "doc:%d" % c["document_index"]
        elif isinstance(c.get("url"), str):
            out["sources"][0]["id"] = c["url"]
            doc["url"] = c["url"]
        title = c.get("document_title") if c.get("document_title") is not None else c.get("title")
        if isinstance(title, str):
            doc["title"] = title
        return out
    return None


cdef dict _usage_obj(Usage u):
    cdef dict out
    if u is None:
        u = Usage()
    out = {"billed_units": {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens},
           "tokens": {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens}}
    if u.cache_read_tokens:
        out["cached_tokens"] = u.cache_read_tokens
    return out


cpdef bytes write_response(Response resp):
    cdef list content = [], texts = [], calls = [], citations = []
    cdef dict message
    cdef Block b
    for b in resp.content:
        if b.kind == B_TOOL_USE:
            calls.append({"id": b.id or "", "type": "function",
                          "function": {"name": b.name or "", "arguments": _arguments(b.input)}})
    for b in resp.content:
        if b.kind == B_TEXT and b.text is not None:
            if b.citations:
                for cite in b.citations:
                    cite = _cohere_citation(cite, len(content))
                    if cite is not None:
                        if calls and cite.get("type") == "TEXT_CONTENT":
                            cite = dict(cite)
                            cite["type"] = "PLAN"   # the text became tool_plan
                            cite.pop("content_index", None)
                        citations.append(cite)
            if calls:
                texts.append(b.text)
            else:
                content.append({"type": "text", "text": b.text})
        elif b.kind == B_THINKING and not b.redacted and b.text is not None:
            content.append({"type": "thinking", "thinking": b.text})
    message = {"role": "assistant"}
    if calls:
        # Text beside tool calls is the model's plan: where Cohere puts it (cohere-tool-call.json
        # style responses carry tool_plan and tool_calls, and no content).
        if content:
            message["content"] = content
        if texts:
            message["tool_plan"] = "".join(texts)
        message["tool_calls"] = calls
    else:
        message["content"] = content
    if citations:
        message["citations"] = citations
    return orjson.dumps({
        "id": resp.id,
        "finish_reason": _FINISH_OF_STOP.get(resp.stop_reason, "COMPLETE"),
        "message": message,
        "usage": _usage_obj(resp.usage),
    })


cdef tuple _USAGE_KEY = (b"usage",)
cdef tuple _USAGE_NAMES = (b"tokens", b"billed_units", b"cached_tokens")
cdef tuple _COUNT_NAMES = (b"input_tokens", b"output_tokens")
cdef list _NO_COUNTS = [None, None]


cpdef Usage read_usage(bytes body):
    """Usage of a buffered Cohere body: the body is validated and the `usage` counts read in place
    (framing.members), no dict built."""
    cdef object span
    cdef list v, t, b
    try:
        span = scan_top(body, _USAGE_KEY).get(b"usage")
    except FramingError:
        raise CodecError(BAD_UPSTREAM)
    v = members(body, span, _USAGE_NAMES) if span is not None else None
    if v is None:
        return _read_usage_obj(None)
    t = members(body, v[0], _COUNT_NAMES) if type(v[0]) is tuple else _NO_COUNTS
    b = members(body, v[1], _COUNT_NAMES) if type(v[1]) is tuple else _NO_COUNTS
    return _usage_from(t[0], t[1], b[0], b[1], v[2])


# ---------------------------------------------------------------------------------------------
# Errors and discovery: errors, ids


cpdef bytes write_error(int status, str kind, str message, str request_id=None):
    return orjson.dumps({"message": message})


# busbar's own refusals in Cohere's words (_common.own_error_in says what each kind is).
cdef dict OWN_ERRORS = {
    "authentication": (401, "invalid api token"),
    "permission": (403, None),
    "quota": (429, None),
}


cpdef tuple own_error(str kind):
    return own_error_in(OWN_ERRORS, kind)


cpdef tuple read_error_detail(bytes body):
    """(message, code) of an upstream error body. Cohere's envelope is `{"message": ...}` with no
    machine code; a `code` field, when a proxy adds one, is passed on."""
    cdef dict doc = error_object(body, False)
    if doc is None:
        return (None, None)
    message = doc.get("message")
    code = doc.get("code")
    return (message if isinstance(message, str) else None,
            code if isinstance(code, str) and code else None)


# ---------------------------------------------------------------------------------------------
# Discovery: what the engine asks the codec instead of branching on its name


# Cohere has response_format: structured output never becomes a forced tool. Its message-end
# always carries usage: nothing for the client to ask, nothing to hide. No headers of its own.
forced_tool_name = no_forced_tool
wants_stream_usage = usage_always_sent
stream_usage_request = body_as_is
response_headers = no_response_headers
error_headers = no_error_headers
not_found_message = model_not_found


cpdef StreamEncoder stream_encoder(str id, str model, bint include_usage, bint json_array):
    return StreamEncoder(id, model)


cpdef str mint_id():
    """Cohere response ids are UUID4 strings."""
    return ids.uuid4()


# ---------------------------------------------------------------------------------------------
# Decoder and encoder: streams


cdef class StreamDecoder(SSEDecoder):
    """Cohere SSE (`event: <type>` + `data: {"type": <type>, ...}`, then `data: [DONE]`) -> IR.
    Cohere keeps separate index spaces for content, tool calls and citations; IR blocks are numbered
    in arrival order. The tool plan has no start/end events: its first delta opens a TEXT block and
    the next block (or message-end) closes it. A stream cut before message-end is left unfinished
    at upstream EOF: the engine ends it."""

    def __cinit__(self, Py_ssize_t max_frame=0):
        self.seq = BlockSequencer()
        self.open_cohere = None

    cdef void _frame(self, object event, bytes data, list out) except *:
        cdef str kind
        stripped = data.strip()
        if not stripped:
            return
        if stripped == b"[DONE]":
            self.done = True
            return
        doc = jsonget.frame_object(stripped)
        t = doc.get("type")
        if not isinstance(t, str):
            t = event.decode("utf-8", "replace") if event else None
        if t is None:
            # SPEC 1.7: Cohere reports a mid-stream failure as bare data carrying a message.
            message = doc.get("message")
            if isinstance(message, str):
                out.append(ev_error("api_error", message))
                self.done = True
                return
            raise CodecError(UPSTREAM_BAD_FRAME)
        kind = t
        if kind == "message-start":
            self._start(out, doc.get("id"))
        elif kind == "content-start":
            self._content_start(out, doc)
        elif kind == "content-delta":
            self._content_delta(out, doc)
        elif kind == "content-end":
            if self.open_src == SRC_CONTENT and self._same(doc.get("index")):
                self.open_ended = True
        elif kind == "tool-plan-delta":
            self._plan_delta(out, doc)
        elif kind == "tool-call-start":
            self._tool_start(out, doc)
        elif kind == "tool-call-delta":
            self._tool_delta(out, doc)
        elif kind == "tool-call-end":
            if self.open_src == SRC_TOOL and self._same(doc.get("index")):
                self._close_open(out)
        elif kind == "citation-start":
            self._citation(out, doc)
        elif kind == "message-end":
            self._end(out, doc.get("delta"))
        # citation-end, debug and types Cohere may add later carry nothing for the IR.

    cdef bint _same(self, object index):
        return index is None or self.open_cohere is None or index == self.open_cohere

    cdef void _start(self, list out, object id):
        cdef Usage u
        if self.started:
            return
        self.started = True
        u = Usage.__new__(Usage)
        u.input_known = False
        out.append(ev_message_start(id if isinstance(id, str) else None, None, u))

    cdef void _close_open(self, list out):
        if self.seq.open_index < 0:
            return
        if self.seq.open_kind == B_TOOL_USE and not self.seq.filled:
            # A call without arguments streams none (cohere-empty-tool-call): say "{}" so every
            # encoder downstream sees valid JSON arguments.
            self.seq.tool_args(out, "{}")
        self.seq.close(out)
        self.open_src = 0
        self.open_cohere = None
        self.open_ended = False

    cdef void _open(self, list out, int src, object cohere_index, Block block):
        self._start(out, None)
        self._close_open(out)
        self.seq.start(out, block)
        self.open_src = src
        self.open_cohere = cohere_index

    cdef void _content_start(self, list out, dict doc):
        content = _get(_get(_get(doc, "delta"), "message"), "content")
        cdef Block b = Block.__new__(Block)
        if _get(content, "type") == "thinking":
            b.kind = B_THINKING
            first = _get(content, "thinking")
        else:
            b.kind = B_TEXT
            first = _get(content, "text")
        self._open(out, SRC_CONTENT, doc.get("index"), b)
        if isinstance(first, str) and first:
            if b.kind == B_THINKING:
                self.seq.thinking(out, first)
            else:
                self.seq.text(out, first)

    cdef void _content_delta(self, list out, dict doc):
        content = _get(_get(_get(doc, "delta"), "message"), "content")
        text = _get(content, "text")
        thinking = _get(content, "thinking")
        cdef Block b
        if not (self.open_src == SRC_CONTENT and not self.open_ended and self._same(doc.get("index"))):
            # A delta without its content-start: open the block it implies.
            b = Block.__new__(Block)
            b.kind = B_THINKING if isinstance(thinking, str) and not isinstance(text, str) else B_TEXT
            self._open(out, SRC_CONTENT, doc.get("index"), b)
        if self.seq.open_kind == B_THINKING:
            if isinstance(thinking, str) and thinking:
                self.seq.thinking(out, thinking)
        elif isinstance(text, str) and text:
            self.seq.text(out, text)

    cdef void _plan_delta(self, list out, dict doc):
        plan = _get(_get(_get(doc, "delta"), "message"), "tool_plan")
        if not isinstance(plan, str) or not plan:
            return
        if self.open_src != SRC_PLAN:
            self._open(out, SRC_PLAN, None, text_block(None))
        self.seq.text(out, plan)

    cdef void _tool_start(self, list out, dict doc):
        call = _get(_get(_get(doc, "delta"), "message"), "tool_calls")
        fn = _get(call, "function")
        id = _get(call, "id")
        name = _get(fn, "name")
        args = _get(fn, "arguments")
        self._open(out, SRC_TOOL, doc.get("index"), _tool_use(
            id if isinstance(id, str) else None, name if isinstance(name, str) else None, None))
        if isinstance(args, str) and args:
            self.seq.tool_args(out, args)

    cdef void _tool_delta(self, list out, dict doc):
        args = _get(_get(_get(_get(_get(doc, "delta"), "message"), "tool_calls"), "function"),
                    "arguments")
        # Arguments for a call whose start never came have no id or name to hang on: dropped.
        if self.open_src != SRC_TOOL or not self._same(doc.get("index")):
            return
        if isinstance(args, str) and args:
            self.seq.tool_args(out, args)

    cdef void _citation(self, list out, dict doc):
        """A citation lands on the block it cites when that block is still the open one (Cohere
        sends citations right after content-end, hence the deferred BLOCK_STOP); otherwise there is
        no valid place in the IR event order for it and it is dropped."""
        cite = _get(_get(_get(doc, "delta"), "message"), "citations")
        if not isinstance(cite, dict) or self.seq.open_index < 0:
            return
        if cite.get("type") == "PLAN":
            if self.open_src != SRC_PLAN:
                return
        elif self.open_src != SRC_CONTENT or self.seq.open_kind != B_TEXT:
            return
        else:
            ci = cite.get("content_index")
            if ci is not None and self.open_cohere is not None and ci != self.open_cohere:
                return
        self.seq.delta(out, D_CITATION, None).data = cite

    cdef void _end(self, list out, object delta):
        self._start(out, None)
        error = _get(delta, "error")
        if isinstance(error, str) and error:
            # A generation that failed mid-way ends with finish_reason ERROR and the reason in
            # delta.error: the caller gets a native error, not a normal-looking stop.
            out.append(ev_error("api_error", error))
            self.done = True
            return
        self._close_open(out)
        self.usage = _read_usage_obj(_get(delta, "usage"))
        out.append(ev_message_delta(_stop_of(_get(delta, "finish_reason")), None, self.usage))
        out.append(ev_message_stop())
        self.done = True
        self.finished = True


cdef bytes _sse(str kind, dict payload):
    return sse_event(kind.encode(), orjson.dumps(payload))


cdef class StreamEncoder:
    """IR events -> Cohere SSE, as cohere.ClientV2.chat_stream parses it: `event: <type>` +
    `data: <json with the same type>` per event, `data: [DONE]` at the end. The SDK drops any
    frame it cannot validate without a word, so every payload mirrors V2ChatStreamResponse."""

    def __init__(self, str id, str model):
        self.id = id
        self.model = model
        self.blocks = {}
        self.usage = Usage()
        self.usage.input_known = False

    cpdef bytes encode(self, list events):
        cdef bytearray out = bytearray()
        cdef Event e
        for e in events:
            if self.finished:
                break
            if e.kind == EV_MESSAGE_START:
                self.usage = merge_usage(self.usage, e.usage)
                self._start(out)
            elif e.kind == EV_BLOCK_START:
                self._block_start(out, e)
            elif e.kind == EV_BLOCK_DELTA:
                self._block_delta(out, e)
            elif e.kind == EV_BLOCK_STOP:
                self._block_stop(out, e.index)
            elif e.kind == EV_MESSAGE_DELTA:
                self.have_delta = True
                if e.stop_reason:
                    self.stop_reason = e.stop_reason
                self.usage = merge_usage(self.usage, e.usage)
            elif e.kind == EV_MESSAGE_STOP:
                self._end(out)
            elif e.kind == EV_ERROR:
                out += self.error(e.error_kind, e.message)
        return bytes(out)

    cpdef bytes error(self, str kind, str message):
        """SPEC 1.7: one bare `data:` frame carrying the message, then the stream closes. It is
        also a well-formed message-end (finish_reason ERROR, delta.error), so the SDK, which skips
        what it cannot parse, hands the failure to the caller instead of ending silently."""
        if self.finished:
            return b""
        self.finished = True
        return sse_event(None, orjson.dumps({
            "type": "message-end",
            "message": message,
            "delta": {"error": message, "finish_reason": "ERROR", "usage": _usage_obj(self.usage)},
        }))

    cdef void _start(self, bytearray out):
        if self.started:
            return
        self.started = True
        out += _sse("message-start", {
            "id": self.id, "type": "message-start",
            "delta": {"message": {"role": "assistant", "content": [], "tool_plan": "",
                                  "tool_calls": [], "citations": []}}})

    cdef void _block_start(self, bytearray out, Event e):
        cdef Block b = e.block
        cdef int n
        self._start(out)
        if b is None:
            return
        if b.kind == B_TEXT:
            n = self.content_n
            self.content_n += 1
            self.blocks[e.index] = (B_TEXT, n)
            out += _sse("content-start", {"type": "content-start", "index": n, "delta": {
                "message": {"content": {"type": "text", "text": ""}}}})
        elif b.kind == B_THINKING and not b.redacted:
            n = self.content_n
            self.content_n += 1
            self.blocks[e.index] = (B_THINKING, n)
            out += _sse("content-start", {"type": "content-start", "index": n, "delta": {
                "message": {"content": {"type": "thinking", "thinking": ""}}}})
        elif b.kind == B_TOOL_USE:
            n = self.tool_n
            self.tool_n += 1
            self.blocks[e.index] = (B_TOOL_USE, n)
            out += _sse("tool-call-start", {"type": "tool-call-start", "index": n, "delta": {
                "message": {"tool_calls": {"id": b.id or "", "type": "function",
                                           "function": {"name": b.name or "", "arguments": ""}}}}})
        # Other block kinds (redacted thinking, server-side results) have no Cohere stream form.

    cdef void _block_delta(self, bytearray out, Event e):
        cdef int family, n
        entry = self.blocks.get(e.index)
        if entry is None:
            return
        family, n = entry
        if e.delta_kind == D_TEXT and family == B_TEXT and e.text:
            out += _sse("content-delta", {"type": "content-delta", "index": n, "delta": {
                "message": {"content": {"text": e.text}}}})
        elif e.delta_kind == D_THINKING and family == B_THINKING and e.text:
            out += _sse("content-delta", {"type": "content-delta", "index": n, "delta": {
                "message": {"content": {"thinking": e.text}}}})
        elif e.delta_kind == D_INPUT_JSON and family == B_TOOL_USE and e.text:
            out += _sse("tool-call-delta", {"type": "tool-call-delta", "index": n, "delta": {
                "message": {"tool_calls": {"function": {"arguments": e.text}}}}})
        elif e.delta_kind == D_CITATION and family == B_TEXT:
            cite = _cohere_citation(e.data, n)
            if cite is None:
                return
            n = self.cite_n
            self.cite_n += 1
            out += _sse("citation-start", {"type": "citation-start", "index": n, "delta": {
                "message": {"citations": cite}}})
            out += _sse("citation-end", {"type": "citation-end", "index": n})

    cdef void _block_stop(self, bytearray out, int index):
        cdef int family, n
        entry = self.blocks.pop(index, None)
        if entry is None:
            return
        family, n = entry
        if family == B_TOOL_USE:
            out += _sse("tool-call-end", {"type": "tool-call-end", "index": n})
        else:
            out += _sse("content-end", {"type": "content-end", "index": n})

    cdef void _end(self, bytearray out):
        self._start(out)
        for index in sorted(self.blocks):
            self._block_stop(out, index)
        out += _sse("message-end", {"type": "message-end", "delta": {
            "finish_reason": _FINISH_OF_STOP.get(self.stop_reason, "COMPLETE"),
            "usage": _usage_obj(self.usage)}})
        out += b"data: [DONE]\n\n"
        self.finished = True


def error_signals(doc):
    """What an error_map is matched against in a Cohere error body (`doc`, parsed): the top-level
    `message`, then `error_type`."""
    if not isinstance(doc, dict):
        return []
    return [s for s in (doc.get("message"), doc.get("error_type")) if isinstance(s, str) and s]
