# cython: language_level=3
"""IR-to-IR steps the engine applies between a reader and a writer.

Structured output reaches Anthropic and Bedrock lanes as one forced tool whose input schema is the
requested schema (those APIs have no response_format). On the way back the call to that tool is
unwrapped into plain JSON text, buffered or streamed, so the caller sees what a native
response_format would have produced.
"""
import orjson

from cbusbar.ir cimport (Block, Event, Response, B_TEXT, B_TOOL_USE, D_INPUT_JSON, D_TEXT,
                         EV_BLOCK_DELTA, EV_BLOCK_START, EV_MESSAGE_DELTA, SR_END_TURN, SR_TOOL_USE)


cpdef void unwrap_forced_tool(Response resp, str name):
    cdef Block b
    cdef list out = []
    cdef bint hit = False
    for b in resp.content:
        if b.kind == B_TOOL_USE and b.name == name:
            hit = True
            t = Block.__new__(Block)
            t.kind = B_TEXT
            t.text = b.input if isinstance(b.input, str) else orjson.dumps(b.input).decode()
            out.append(t)
        else:
            out.append(b)
    if hit:
        resp.content = out
        if resp.stop_reason == SR_TOOL_USE:
            resp.stop_reason = SR_END_TURN


cdef class ForcedToolUnwrapper:
    """The streaming form: rewrites events in place as they pass."""
    cdef str name
    cdef set indexes

    def __init__(self, str name):
        self.name = name
        self.indexes = set()

    cpdef list apply(self, list events):
        cdef Event e
        cdef Block t
        for e in events:
            if e.kind == EV_BLOCK_START:
                if e.block is not None and e.block.kind == B_TOOL_USE and e.block.name == self.name:
                    self.indexes.add(e.index)
                    t = Block.__new__(Block)
                    t.kind = B_TEXT
                    t.text = ""
                    e.block = t
            elif e.kind == EV_BLOCK_DELTA:
                if e.delta_kind == D_INPUT_JSON and e.index in self.indexes:
                    e.delta_kind = D_TEXT
            elif e.kind == EV_MESSAGE_DELTA:
                if self.indexes and e.stop_reason == SR_TOOL_USE:
                    e.stop_reason = SR_END_TURN
        return events
