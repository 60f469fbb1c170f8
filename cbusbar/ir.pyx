# cython: language_level=3
"""The superset IR (declared in ir.pxd). Python sees the same constant names as Cython."""

import orjson

# Python-visible copies of the enums declared in ir.pxd.
TEXT, IMAGE, DOCUMENT, TOOL_USE, TOOL_RESULT, THINKING = (
    B_TEXT, B_IMAGE, B_DOCUMENT, B_TOOL_USE, B_TOOL_RESULT, B_THINKING)
SRC_NONE_ = SRC_NONE
SOURCE_BASE64, SOURCE_URL, SOURCE_VENDOR = SRC_BASE64, SRC_URL, SRC_VENDOR
USER, ASSISTANT = ROLE_USER, ROLE_ASSISTANT
TOOL_CHOICE_UNSET, TOOL_CHOICE_AUTO, TOOL_CHOICE_NONE, TOOL_CHOICE_REQUIRED, TOOL_CHOICE_TOOL = (
    TC_UNSET, TC_AUTO, TC_NONE, TC_REQUIRED, TC_TOOL)
FORMAT_UNSET, FORMAT_TEXT, FORMAT_JSON_OBJECT, FORMAT_JSON_SCHEMA = (
    RF_UNSET, RF_TEXT, RF_JSON_OBJECT, RF_JSON_SCHEMA)
STOP_UNSET, END_TURN, STOP_SEQUENCE, MAX_TOKENS, TOOL_USE_STOP, SAFETY, REFUSAL, PAUSE_TURN, ERROR, OTHER = (
    SR_UNSET, SR_END_TURN, SR_STOP_SEQUENCE, SR_MAX_TOKENS, SR_TOOL_USE, SR_SAFETY, SR_REFUSAL,
    SR_PAUSE_TURN, SR_ERROR, SR_OTHER)
MESSAGE_START, BLOCK_START, BLOCK_DELTA, BLOCK_STOP, MESSAGE_DELTA, MESSAGE_STOP, EVENT_ERROR, PING = (
    EV_MESSAGE_START, EV_BLOCK_START, EV_BLOCK_DELTA, EV_BLOCK_STOP, EV_MESSAGE_DELTA,
    EV_MESSAGE_STOP, EV_ERROR, EV_PING)
DELTA_TEXT, DELTA_INPUT_JSON, DELTA_THINKING, DELTA_SIGNATURE, DELTA_CITATION = (
    D_TEXT, D_INPUT_JSON, D_THINKING, D_SIGNATURE, D_CITATION)

# Canonical error kinds. Every codec's write_error maps these to its native type/status names.
ERROR_KINDS = (
    "invalid_request",    # 400
    "authentication",     # 401
    "permission",         # 403
    "not_found",          # 404
    "request_too_large",  # 413
    "rate_limit",         # 429
    "quota",              # 429 (400 for Bedrock): budget exhausted
    "api_error",          # 500 and other 5xx
    "overloaded",         # 503 / 529
    "timeout",            # 504
)

STATUS_OF_KIND = {
    "invalid_request": 400, "authentication": 401, "permission": 403, "not_found": 404,
    "request_too_large": 413, "rate_limit": 429, "quota": 429, "api_error": 500,
    "overloaded": 503, "timeout": 504,
}


def kind_of_status(int status):
    """The canonical error kind of an upstream HTTP status (SPEC 1.7 re-enveloping)."""
    if status == 401:
        return "authentication"
    if status == 403:
        return "permission"
    if status == 404:
        return "not_found"
    if status == 413:
        return "request_too_large"
    if status == 429:
        return "rate_limit"
    if status == 503 or status == 529:
        return "overloaded"
    if status == 504:
        return "timeout"
    if status >= 500:
        return "api_error"
    return "invalid_request"


cdef class Usage:
    def __init__(self, long long input_tokens=0, long long output_tokens=0,
                 long long cache_read_tokens=0, long long cache_write_tokens=0,
                 long long reasoning_tokens=0, bint input_known=True):
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.cache_read_tokens = cache_read_tokens
        self.cache_write_tokens = cache_write_tokens
        self.reasoning_tokens = reasoning_tokens
        self.input_known = input_known

    cpdef Usage copy(self):
        cdef Usage u = Usage.__new__(Usage)
        u.input_tokens = self.input_tokens
        u.output_tokens = self.output_tokens
        u.cache_read_tokens = self.cache_read_tokens
        u.cache_write_tokens = self.cache_write_tokens
        u.reasoning_tokens = self.reasoning_tokens
        u.input_known = self.input_known
        return u

    def to_dict(self):
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cache_read_tokens": self.cache_read_tokens,
                "cache_write_tokens": self.cache_write_tokens,
                "reasoning_tokens": self.reasoning_tokens}

    def __repr__(self):
        return "Usage(%r)" % (self.to_dict(),)


cdef class Block:
    def __init__(self, int kind, str text=None, **fields):
        self.kind = kind
        self._text = text
        for k, v in fields.items():
            setattr(self, k, v)

    @property
    def text(self):
        """The text (see ir.pxd); a text_json literal is decoded here, once."""
        if self._text is None and self.text_json is not None:
            self._text = orjson.loads(self.text_json)
        return self._text

    @text.setter
    def text(self, str value):
        self._text = value
        self.text_json = None

    def to_dict(self):
        d = {"kind": self.kind}
        for name in ("text", "media_type", "data", "id", "name", "input", "signature",
                     "cache_control", "citations"):
            v = getattr(self, name)
            if v is not None:
                d[name] = v
        if self.src_kind:
            d["src_kind"] = self.src_kind
        if self.content is not None:
            d["content"] = [b.to_dict() for b in self.content]
        if self.is_error:
            d["is_error"] = True
        if self.redacted:
            d["redacted"] = True
        if self.refusal:
            d["refusal"] = True
        return d

    def __repr__(self):
        return "Block(%r)" % (self.to_dict(),)


cdef class Message:
    def __init__(self, int role, list content=None):
        self.role = role
        self.content = content if content is not None else []

    def to_dict(self):
        return {"role": self.role, "content": [b.to_dict() for b in self.content]}

    def __repr__(self):
        return "Message(%r)" % (self.to_dict(),)


cdef class Tool:
    def __init__(self, str name, str description=None, object schema=None, object cache_control=None):
        self.name = name
        self.description = description
        self.schema = schema
        self.cache_control = cache_control

    def to_dict(self):
        return {"name": self.name, "description": self.description, "schema": self.schema}


cdef class Request:
    def __init__(self):
        self.system = []
        self.messages = []
        self.tools = []
        self.extra = {}

    def to_dict(self):
        d = {}
        for name in ("model", "tool_choice_name", "parallel_tool_calls", "rf_name", "rf_schema",
                     "rf_strict", "max_tokens", "temperature", "top_p", "top_k",
                     "frequency_penalty", "presence_penalty", "seed", "n", "stop", "user",
                     "reasoning_effort", "reasoning_budget", "logprobs", "top_logprobs"):
            v = getattr(self, name)
            if v is not None:
                d[name] = v
        d["stream"] = self.stream
        d["system"] = [b.to_dict() for b in self.system]
        d["messages"] = [m.to_dict() for m in self.messages]
        d["tools"] = [t.to_dict() for t in self.tools]
        d["tool_choice"] = self.tool_choice
        d["response_format"] = self.response_format
        if self.extra:
            d["extra"] = self.extra
        return d

    def __repr__(self):
        return "Request(%r)" % (self.to_dict(),)


cdef class Response:
    def __init__(self):
        self.content = []
        self.usage = Usage()

    def to_dict(self):
        return {"id": self.id, "model": self.model,
                "content": [b.to_dict() for b in self.content],
                "stop_reason": self.stop_reason, "stop_sequence": self.stop_sequence,
                "usage": self.usage.to_dict() if self.usage is not None else None,
                "logprobs": self.logprobs}

    def __repr__(self):
        return "Response(%r)" % (self.to_dict(),)


cdef class Event:
    def to_dict(self):
        d = {"kind": self.kind}
        if self.kind in (EV_BLOCK_START, EV_BLOCK_DELTA, EV_BLOCK_STOP):
            d["index"] = self.index
        if self.block is not None:
            d["block"] = self.block.to_dict()
        if self.delta_kind:
            d["delta_kind"] = self.delta_kind
        for name in ("text", "data", "id", "model", "stop_sequence", "error_kind", "message"):
            v = getattr(self, name)
            if v is not None:
                d[name] = v
        if self.stop_reason:
            d["stop_reason"] = self.stop_reason
        if self.usage is not None:
            d["usage"] = self.usage.to_dict()
        return d

    def __repr__(self):
        return "Event(%r)" % (self.to_dict(),)


cpdef Event ev_message_start(str id, str model, Usage usage):
    cdef Event e = Event.__new__(Event)
    e.kind = EV_MESSAGE_START
    e.id = id
    e.model = model
    e.usage = usage
    return e


cpdef Event ev_block_start(int index, Block block):
    cdef Event e = Event.__new__(Event)
    e.kind = EV_BLOCK_START
    e.index = index
    e.block = block
    return e


cpdef Event ev_block_delta(int index, int delta_kind, str text):
    cdef Event e = Event.__new__(Event)
    e.kind = EV_BLOCK_DELTA
    e.index = index
    e.delta_kind = delta_kind
    e.text = text
    return e


cpdef Event ev_block_stop(int index):
    cdef Event e = Event.__new__(Event)
    e.kind = EV_BLOCK_STOP
    e.index = index
    return e


cpdef Event ev_message_delta(int stop_reason, str stop_sequence, Usage usage):
    cdef Event e = Event.__new__(Event)
    e.kind = EV_MESSAGE_DELTA
    e.stop_reason = stop_reason
    e.stop_sequence = stop_sequence
    e.usage = usage
    return e


cpdef Event ev_message_stop():
    cdef Event e = Event.__new__(Event)
    e.kind = EV_MESSAGE_STOP
    return e


cpdef Event ev_error(str error_kind, str message):
    cdef Event e = Event.__new__(Event)
    e.kind = EV_ERROR
    e.error_kind = error_kind
    e.message = message
    return e


cpdef Block text_block(str text):
    cdef Block b = Block.__new__(Block)
    b.kind = B_TEXT
    b._text = text
    return b


cpdef Block refusal_block(str text):
    cdef Block b = text_block(text)
    b.refusal = True
    return b


cpdef Block json_text_block(bytes literal):
    cdef Block b = Block.__new__(Block)
    b.kind = B_TEXT
    b.text_json = literal
    return b


class CodecError(ValueError):
    """A request or response body that does not have the protocol's shape. The message is safe to
    show the caller (it never contains secrets or upstream URLs)."""
