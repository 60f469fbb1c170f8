# The block sequencer shared by the stream decoders of flat or loosely-framed protocols (openai,
# responses, gemini, cohere, bedrock; sequencer.pyx). ir.pxd promises every encoder the Anthropic
# event order: per block BLOCK_START / BLOCK_DELTA* / BLOCK_STOP, one block open at a time, indexes
# dense from 0 in arrival order. Those upstreams either have no block boundaries at all (OpenAI,
# Gemini) or number blocks in their own spaces (Cohere's content, tool-call and citation indexes,
# Responses' output_index, Bedrock's contentBlockIndex); the decoder keeps its own mapping from
# those names to IR indexes and leaves the order itself to one BlockSequencer.

from cbusbar.ir cimport Block, Event


cdef class BlockSequencer:
    cdef readonly int next_index    # IR index the next block gets (= blocks started so far)
    cdef readonly int open_index    # IR index of the open block, -1 when none
    cdef readonly int open_kind     # B_* kind of the open block, 0 when none
    # the open block got content (text, thinking or argument bytes; not a signature or a citation)
    cdef readonly bint filled
    # the open block is a refusal (a B_TEXT block, ir.pxd): text and refusal deltas never share a
    # block
    cdef readonly bint open_refusal

    cdef int start(self, list out, Block block) except -1       # close the open block, start this one
    cdef int open(self, list out, int kind) except -1           # ... start a new empty one of `kind`
    # the open block if it is of `kind` (and not a refusal), else a new empty one of `kind`
    cdef int ensure(self, list out, int kind) except -1
    cdef Event text(self, list out, str text)                   # text delta, opening a text block
    cdef Event thinking(self, list out, str text)               # reasoning delta, opening a thinking block
    cdef Event refusal(self, list out, str text)                # refusal text, opening a refusal block
    cdef int tool_start(self, list out, str id, str name) except -1
    cdef Event tool_args(self, list out, str fragment)          # argument bytes for the open tool block
    cdef Event delta(self, list out, int delta_kind, str text)  # any delta on the open block as it is
    cdef void close(self, list out) except *                    # BLOCK_STOP for the open block, if any
