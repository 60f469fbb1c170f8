# The OpenAI Responses API codec's stateful halves. The module functions (read_request,
# write_request, read_response, write_response, read_usage, write_error, read_error_detail,
# upstream_path, mint_id) follow docs/codecs.md and live in responses.pyx.

from cbusbar.ir cimport Usage
from cbusbar.proto._common cimport SSEDecoder
from cbusbar.sequencer cimport BlockSequencer


cdef class StreamDecoder(SSEDecoder):
    """Upstream `event: response.*` frames -> IR events. Every output item (message, function
    call, reasoning) becomes one IR block; one block is open at a time. `done`: MESSAGE_STOP or
    EV_ERROR emitted; `finished`: response.completed / .incomplete / .failed seen; `usage`: the
    final response's."""
    cdef bint started               # MESSAGE_START emitted
    cdef bint saw_tool              # a function_call item was streamed (completed = tool use)
    cdef bint saw_refusal           # refusal text was streamed
    # the IR blocks: one open at a time, dense indexes; its `filled`: the open block got content
    # deltas (done adds none)
    cdef BlockSequencer seq
    cdef int open_summary           # the reasoning summary_index last seen in the open block
    cdef dict by_output             # upstream output_index -> IR block index
    cdef dict by_item               # upstream item id -> IR block index

    cdef void _start(self, str id, str model, list out) except *
    cdef int _find(self, dict data) except -2
    cdef int _open(self, int kind, dict data, str id, str name, list out) except -1
    cdef int _ensure(self, int kind, dict data, list out) except -1
    cdef int _text_block(self, dict data, bint refusal, list out) except -2
    cdef void _name(self, dict data, int index) except *
    cdef void _item_done(self, dict data, list out) except *
    cdef void _finish(self, dict response, bint incomplete, list out) except *


cdef class _Item:
    """One output item of the client's stream, as the encoder builds it."""
    cdef int kind                   # B_TEXT (message), B_TOOL_USE (function_call), B_THINKING (reasoning)
    cdef bint refusal               # message: its one content part is a refusal, not output_text
    cdef int output_index
    cdef str item_id                # msg_… / fc_… / rs_…
    cdef str call_id                # function_call: the IR tool-use id
    cdef str name                   # function_call: the tool name
    cdef list parts                 # text / arguments / summary fragments, joined at the end
    cdef list annotations           # message: url/file citations in Responses shape
    cdef str signature              # reasoning: encrypted_content
    cdef bint summary_open          # reasoning: a summary part was announced
    cdef bint closed                # output_item.done went out


cdef class StreamEncoder:
    """IR events -> the `event: response.*` sequence the openai SDK's stream accumulator
    accepts, each frame numbered by sequence_number; no [DONE]."""
    cdef public long long created   # unix seconds on the response object (default: construction time)
    cdef readonly str id
    cdef readonly str model
    cdef str base                   # the id without its resp_ prefix, used to mint item ids
    cdef long long seq              # the next sequence_number
    cdef bint started               # response.created / in_progress went out
    cdef bint finished              # response.completed / incomplete / failed went out
    cdef dict blocks                # IR block index -> _Item (None for blocks this protocol drops)
    cdef list items                 # _Item in output order
    cdef int stop_reason            # from MESSAGE_DELTA
    cdef Usage usage                # running totals: usage.merge_usage of MESSAGE_START and MESSAGE_DELTAs

    cpdef bytes encode(self, list events)
    cpdef bytes error(self, str kind, str message)
    cdef bytes _frame(self, str type, dict payload)
    cdef dict _response(self, bint in_progress, object error)
    cdef bytes _start(self)
    cdef _Item _open(self, int index, int kind, str call_id, str name, bint refusal, list out)
    cdef void _close(self, _Item item, list out) except *
    cdef bytes _end(self)
