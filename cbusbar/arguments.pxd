# A tool call's arguments between the protocols that carry them as JSON text (openai, responses,
# cohere: an `arguments` string) and those that carry a JSON object (anthropic and bedrock
# `input`, gemini `args`). The IR's Block.input is what the reader got: the object, or the text
# itself when it was not one JSON object (a model's broken JSON, a call cut off by max_tokens).
# Nothing a model said is dropped on the way (docs/codecs.md, "Tool arguments"):
# - a text protocol gets the text back as it came (text_of);
# - an object protocol gets the object, or, for text that is not one object,
#   {"_raw_arguments": "<the text>"} (object_of), which text_of turns back into the text when the
#   client sends the call again;
# - a stream to an object protocol (ObjectStream) relays the fragments while they can still make
#   one object, and when they cannot, closes what was sent and adds the same member.

# a text protocol's arguments -> Block.input: the object, {} for blank text (servers send "" for a
# call without arguments), else the text as is
cdef object input_of(str text)
cdef dict object_of(object input)           # Block.input -> an object protocol's object
cdef str text_of(object input)              # Block.input -> a text protocol's arguments


cdef class ObjectStream:
    """One streamed call's argument fragments -> fragments whose concatenation is one JSON object
    (anthropic input_json_delta, bedrock toolUse.input). What could still become an object goes
    out at once; the fragment that closes the object is held to the end of the block (text after
    the close would make it invalid). Bytes a client already has are never taken back: when the
    text goes wrong, what was sent is closed with the fewest characters that make it valid and
    the whole text follows as the _raw_arguments member."""
    cdef list raw                   # every fragment as it came
    cdef int state                  # A_* (arguments.pyx): where in the JSON the text is
    cdef int num                    # A_NUMBER: N_* how far the number is
    cdef int esc                    # in a string: 0, 1 after a backslash, 2 + hex digits of \u
    cdef int uval                   # the \u escape's value so far
    # after a high surrogate: 1 its low half's backslash must follow, 2 its u, 3 its digits are
    # being read
    cdef int low
    cdef str lit                    # A_LITERAL: the literal being spelled, and ...
    cdef int lit_pos                # ... how much of it came
    cdef bytearray stack            # open containers, b"{" / b"["
    cdef bint broken                # the text cannot become one object: only the end is sent
    cdef str lead                   # blanks before the first "{", sent with it
    cdef str held                   # from the fragment holding the object's close on, unsent
    cdef Py_ssize_t close_at        # index of that close in held
    cdef Py_ssize_t close_at_scan   # _scan: index of the close in the text it read
    cdef bint top_empty             # the object closed (or broke) with no member
    cdef str tail                   # what close() sends when broken: computed at the break

    cdef str feed(self, str fragment)   # what to send now ("" for nothing)
    cdef str close(self)                # what to send at the block's end ("" for nothing)
    cdef void _break_after_close(self) except *
    cdef str _completion(self)
    cdef Py_ssize_t _scan(self, str s) except -2
    cdef void _pop(self, Py_ssize_t i) except *
    cdef bint _value(self, Py_UCS4 c) except -1
    cdef bint _string(self, Py_UCS4 c) except -1
    cdef bint _number(self, Py_UCS4 c) except -1
