# Raw JSON spans (jsonspan.pyx): long text moves from one JSON body to another as the escaped
# string literal the client sent, validated once and copied, never decoded to a Python str and
# encoded back (JSON to JSON the escaping rules are the same; docs/codecs.md "Shared helpers").
#
# parse(body, marks) reads a client body into the same Python objects orjson.loads gives, except
# that the string values at the paths `marks` names come back as `bytes`: the value's JSON literal,
# quotes included, as strict as orjson (valid UTF-8, no raw control characters, escapes and
# surrogate pairs well formed). A reader turns those into ir blocks with ir.set_text_json; a writer
# puts text_value(block) / join_text(...) where it put block.text, and orjson copies the literal.
# parse() returns None whenever it is not sure (not JSON, not an object, too deep, ...): the caller
# then parses with orjson as before, so errors and every edge case keep orjson's behaviour.

from cbusbar.ir cimport Block

cdef enum:
    MAX_MARK_STATES = 16


cdef class Marks:
    """A small automaton over the document: state 1 is the top-level object; each state says
    whether a string value there is kept raw, which state an array element gets, and which state
    the members it names get (others: 0, an ordinary value)."""
    cdef int nstates
    cdef bint raw[MAX_MARK_STATES]
    cdef int elem[MAX_MARK_STATES]
    cdef list keys                  # per state: [(bytes name, str name, int state)]
    cdef list values                # [(bytes, str)]: string values returned as these objects


cpdef object parse(bytes body, Marks marks)

# A valid JSON string literal starting at p[i] (the quote): the index after its closing quote, or -1
# when orjson would reject it. flags |= F_ESCAPE / F_NON_ASCII as seen.
cdef enum:
    F_ESCAPE = 1
    F_NON_ASCII = 2
cdef Py_ssize_t string_end(const unsigned char* p, Py_ssize_t i, Py_ssize_t n, int* flags) noexcept nogil

# The end of the JSON value at p[i] when it is one orjson surely accepts (strings as string_end,
# containers recursively to 64 levels, literals, numbers without an exponent of at most 18 digits
# a side), else -1: a caller then hands the bytes to orjson, whose verdict stands.
cdef Py_ssize_t skip_value(const unsigned char* p, Py_ssize_t i, Py_ssize_t n, int depth) noexcept nogil

# The str of the valid string literal p[s:e] (quotes included; flags as string_end set them).
cdef object decode_str(const unsigned char* p, Py_ssize_t s, Py_ssize_t e, int flags)


cdef inline Py_ssize_t ws(const unsigned char* p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """The index of the first non-whitespace byte (JSON's four) from i."""
    cdef unsigned char c
    while i < n:
        c = p[i]
        if c == 32 or c == 10 or c == 13 or c == 9:
            i += 1
        else:
            break
    return i

# Writers: the value to put where block.text went (an orjson.Fragment of the literal, or the str),
# and sep.join(b.text or "" for b in blocks) in the same form, without decoding a literal.
cdef object text_value(Block b)
cdef object join_text(list blocks, str sep)
cdef bytes text_literal(Block b)    # the block's text as a JSON string literal (b'""' for None)
cdef bytes join_literal(list blocks, str sep)   # join_text's value as a JSON string literal
