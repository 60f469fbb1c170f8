# cython: language_level=3
"""One open block at a time, dense indexes (declared in sequencer.pxd). Every method appends the
IR events it makes to `out` and returns the index or the delta event (so a caller can hang data,
such as logprobs or a citation, on it). The delta methods (text, thinking, tool_args, delta) need
an open block: `text` and `thinking` open one themselves; tool_args and delta expect the caller to
have checked that the open block is the one the fragment belongs to."""

from cbusbar.ir cimport (
    Block, Event, ev_block_start, ev_block_delta, ev_block_stop,
    B_TEXT, B_THINKING, B_TOOL_USE, D_TEXT, D_THINKING, D_INPUT_JSON,
)


cdef class BlockSequencer:

    def __cinit__(self):
        self.open_index = -1

    cdef int start(self, list out, Block block) except -1:
        self.close(out)
        self.open_index = self.next_index
        self.next_index += 1
        self.open_kind = block.kind
        self.open_refusal = block.kind == B_TEXT and block.refusal
        self.filled = False
        out.append(ev_block_start(self.open_index, block))
        return self.open_index

    cdef int open(self, list out, int kind) except -1:
        cdef Block b = Block.__new__(Block)
        b.kind = kind
        if kind == B_TEXT or kind == B_THINKING:
            b.text = ""     # text arrives in deltas; every encoder reads "" as no leading text
        return self.start(out, b)

    cdef int ensure(self, list out, int kind) except -1:
        if self.open_kind == kind and not self.open_refusal:
            return self.open_index
        return self.open(out, kind)

    cdef Event text(self, list out, str text):
        self.ensure(out, B_TEXT)
        self.filled = True
        return self.delta(out, D_TEXT, text)

    cdef Event thinking(self, list out, str text):
        self.ensure(out, B_THINKING)
        self.filled = True
        return self.delta(out, D_THINKING, text)

    cdef Event refusal(self, list out, str text):
        cdef Block b
        if not self.open_refusal:
            b = Block.__new__(Block)
            b.kind = B_TEXT
            b.text = ""
            b.refusal = True
            self.start(out, b)
        self.filled = True
        return self.delta(out, D_TEXT, text)

    cdef int tool_start(self, list out, str id, str name) except -1:
        cdef Block b = Block.__new__(Block)
        b.kind = B_TOOL_USE
        b.id = id
        b.name = name
        return self.start(out, b)

    cdef Event tool_args(self, list out, str fragment):
        self.filled = True
        return self.delta(out, D_INPUT_JSON, fragment)

    cdef Event delta(self, list out, int delta_kind, str text):
        cdef Event e = ev_block_delta(self.open_index, delta_kind, text)
        out.append(e)
        return e

    cdef void close(self, list out) except *:
        if self.open_index >= 0:
            out.append(ev_block_stop(self.open_index))
            self.open_index = -1
            self.open_kind = 0
            self.open_refusal = False
            self.filled = False
