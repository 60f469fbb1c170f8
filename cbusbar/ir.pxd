# The superset intermediate representation every protocol codec reads into and writes from.
#
# One home for every field of all six wire protocols (OpenAI Chat, OpenAI Responses, Anthropic
# Messages, Gemini, Cohere v2, Bedrock Converse). Optional scalars are `object` with None = unset,
# so "the caller did not say" never collapses into a default. Enumerations are small ints (below);
# ir.pyx exports the same names to Python.
#
# Conventions every codec keeps:
# - Roles are only USER and ASSISTANT. A tool result is a TOOL_RESULT block inside a USER message
#   (OpenAI `role: tool` messages become such blocks; the OpenAI writer splits them out again).
# - Usage.input_tokens is the TOTAL prompt size, cache reads and cache writes included (OpenAI,
#   Responses and Gemini count that way; Anthropic and Bedrock readers add their cache buckets in,
#   their writers subtract them out again).
# - Stream events follow the Anthropic event model (the richest): MESSAGE_START, then per block
#   BLOCK_START / BLOCK_DELTA* / BLOCK_STOP, then MESSAGE_DELTA (stop reason + running usage
#   totals), then MESSAGE_STOP. Decoders of flatter streams (OpenAI, Gemini, Cohere) synthesise the
#   block boundaries so that every encoder can rely on this order.

cdef enum:
    # Block.kind
    B_TEXT = 1
    B_IMAGE = 2
    B_DOCUMENT = 3
    B_TOOL_USE = 4
    B_TOOL_RESULT = 5
    B_THINKING = 6

    # Block.src_kind (images and documents)
    SRC_NONE = 0
    SRC_BASE64 = 1      # media_type + data (base64 text, no data: prefix)
    SRC_URL = 2         # data holds the URL; busbar never fetches it
    SRC_VENDOR = 3      # data holds a vendor reference (file id, s3 uri, gs uri): same-vendor only

    # Message.role
    ROLE_USER = 1
    ROLE_ASSISTANT = 2

    # Request.tool_choice
    TC_UNSET = 0
    TC_AUTO = 1
    TC_NONE = 2
    TC_REQUIRED = 3
    TC_TOOL = 4         # tool_choice_name names the tool

    # Request.response_format
    RF_UNSET = 0
    RF_TEXT = 1
    RF_JSON_OBJECT = 2
    RF_JSON_SCHEMA = 3  # rf_name, rf_schema, rf_strict

    # Response.stop_reason / Event.stop_reason
    SR_UNSET = 0
    SR_END_TURN = 1
    SR_STOP_SEQUENCE = 2
    SR_MAX_TOKENS = 3
    SR_TOOL_USE = 4
    SR_SAFETY = 5
    SR_REFUSAL = 6
    SR_PAUSE_TURN = 7
    SR_ERROR = 8
    SR_OTHER = 9

    # Event.kind
    EV_MESSAGE_START = 1
    EV_BLOCK_START = 2
    EV_BLOCK_DELTA = 3
    EV_BLOCK_STOP = 4
    EV_MESSAGE_DELTA = 5
    EV_MESSAGE_STOP = 6
    EV_ERROR = 7
    EV_PING = 8

    # Event.delta_kind
    D_TEXT = 1          # text of a B_TEXT block
    D_INPUT_JSON = 2    # a fragment of a tool call's JSON arguments
    D_THINKING = 3      # reasoning text
    D_SIGNATURE = 4     # the thinking block's signature (whole)
    D_CITATION = 5      # Event.data holds one citation object


cdef class Usage:
    cdef public long long input_tokens         # total prompt tokens (cache read + write included)
    cdef public long long output_tokens        # completion tokens, reasoning included
    cdef public long long cache_read_tokens
    cdef public long long cache_write_tokens
    cdef public long long reasoning_tokens
    cdef public bint input_known               # False while a stream has not reported input yet

    cpdef Usage copy(self)


cdef class Block:
    cdef public int kind
    # `text` (a property, ir.pyx): B_TEXT text; B_THINKING reasoning text; B_DOCUMENT plain text.
    # A reader may set `text_json` instead: the text as the client sent it, one JSON string
    # literal (quotes and escapes included, validated), so a JSON writer copies it as is and never
    # decodes it (`has_text` / `text_is_empty` below ask without decoding). Reading `text` decodes
    # it once; setting `text` drops the literal. Other than the two, `text` is an ordinary field.
    cdef str _text
    cdef readonly bytes text_json
    cdef public int src_kind        # B_IMAGE / B_DOCUMENT source
    cdef public str media_type
    cdef public str data            # base64 payload, URL, or vendor ref; redacted thinking payload
    cdef public str id              # B_TOOL_USE: call id; B_TOOL_RESULT: the call id answered
    cdef public str name            # B_TOOL_USE: tool name; B_DOCUMENT: title
    cdef public object input        # B_TOOL_USE: arguments, parsed JSON (usually a dict)
    cdef public list content        # B_TOOL_RESULT: list[Block] (text / image)
    cdef public bint is_error       # B_TOOL_RESULT
    cdef public str signature       # B_THINKING
    cdef public bint redacted       # B_THINKING: opaque (data holds it)
    # B_TEXT: the text is the model declining (OpenAI's `refusal` field and content part). Still a
    # text block, so a protocol with no refusal form writes it as text: it never vanishes; openai
    # and responses write it back as a refusal.
    cdef public bint refusal
    cdef public object cache_control
    cdef public object citations    # list of raw citation objects, or None


cdef class Message:
    cdef public int role
    cdef public list content        # list[Block]


cdef class Tool:
    cdef public str name
    cdef public str description
    cdef public object schema       # JSON schema (dict)
    cdef public object cache_control


cdef class Request:
    cdef public str model
    cdef public bint stream
    cdef public list system         # list[Block] (text)
    cdef public list messages       # list[Message]
    cdef public list tools          # list[Tool]
    cdef public int tool_choice
    cdef public str tool_choice_name
    cdef public object parallel_tool_calls   # bool or None
    cdef public int response_format
    cdef public str rf_name
    cdef public object rf_schema
    cdef public object rf_strict             # bool or None
    cdef public object max_tokens            # int or None
    cdef public object temperature           # float or None (kept as given: 0.7 stays 0.7)
    cdef public object top_p
    cdef public object top_k
    cdef public object frequency_penalty
    cdef public object presence_penalty
    cdef public object seed
    cdef public object n
    cdef public list stop                    # list[str] or None
    cdef public str user
    cdef public str reasoning_effort         # minimal|low|medium|high, or None
    cdef public object reasoning_budget      # thinking budget in tokens, or None
    cdef public object logprobs              # bool or None
    cdef public object top_logprobs          # int or None
    cdef public dict extra                   # protocol-only fields; cleared on a cross-protocol hop
    # The lane's model takes prompt-cache markers where a dialect gates them on the model
    # (models.X.prompt_caching: Bedrock Converse's cachePoint, which Nova refuses).
    cdef public bint prompt_caching


cdef class Response:
    cdef public str id
    cdef public str model
    cdef public list content        # list[Block]
    cdef public int stop_reason
    cdef public str stop_sequence
    cdef public Usage usage
    cdef public object created      # unix seconds, or None
    cdef public object logprobs     # OpenAI-shaped list of {token, logprob, top_logprobs}, or None


cdef class Event:
    cdef public int kind
    cdef public int index           # block index for BLOCK_*
    cdef public Block block         # BLOCK_START: kind (+ id/name for tool use)
    cdef public int delta_kind
    cdef public str text            # BLOCK_DELTA payload
    cdef public object data         # D_CITATION payload; logprobs for a text delta
    cdef public str id              # MESSAGE_START
    cdef public str model           # MESSAGE_START
    cdef public int stop_reason     # MESSAGE_DELTA
    cdef public str stop_sequence   # MESSAGE_DELTA
    cdef public Usage usage         # MESSAGE_START (input if known) / MESSAGE_DELTA (running totals)
    cdef public str error_kind      # EV_ERROR: canonical kind (see errors below)
    cdef public str message         # EV_ERROR


cpdef Event ev_message_start(str id, str model, Usage usage)
cpdef Event ev_block_start(int index, Block block)
cpdef Event ev_block_delta(int index, int delta_kind, str text)
cpdef Event ev_block_stop(int index)
cpdef Event ev_message_delta(int stop_reason, str stop_sequence, Usage usage)
cpdef Event ev_message_stop()
cpdef Event ev_error(str error_kind, str message)
cpdef Block text_block(str text)
cpdef Block refusal_block(str text)             # a B_TEXT block with refusal set
cpdef Block json_text_block(bytes literal)      # a B_TEXT block holding `literal` as its text_json


cdef inline bint text_is_empty(Block b):
    """The block's text is None or "" (no decode)."""
    if b.text_json is not None:
        return len(b.text_json) == 2   # `""`: every other literal has at least one character
    return b._text is None or len(b._text) == 0


cdef inline void set_text_json(Block b, bytes literal):
    """The block's text as a validated JSON string literal (a reader's fast path)."""
    b._text = None
    b.text_json = literal
