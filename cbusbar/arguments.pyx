# cython: language_level=3
"""A tool call's arguments across text and object protocols (declared in arguments.pxd, the
representation documented in docs/codecs.md, "Tool arguments")."""

import orjson

cdef extern from "Python.h":
    int PyUnicode_KIND(object s)
    void* PyUnicode_DATA(object s)
    Py_UCS4 PyUnicode_READ(int kind, void* data, Py_ssize_t i) nogil

# The member an object protocol gets when a model's arguments were not one JSON object. The Rust
# gateway answers `input: "<text>"` there (resp_o2a_tool_calls golden); Anthropic, Gemini and
# Bedrock type the field as an object, so a string breaks the SDKs' typed access and is refused
# when the client sends the call back. A leading underscore keeps it apart from a tool's own
# parameter names.
RAW_KEY = "_raw_arguments"
cdef str _RAW_MEMBER = '"_raw_arguments":'


cdef object input_of(str text):
    cdef object parsed
    if text is None or not text.strip(" \t\n\r"):   # JSON's blanks (str.strip takes more)
        return {}
    try:
        parsed = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text
    return parsed if isinstance(parsed, dict) else text


cdef dict object_of(object input):
    cdef object parsed
    if isinstance(input, dict):
        return input
    if input is None:
        return {}
    if type(input) is str:
        parsed = input_of(<str>input)
        if isinstance(parsed, dict):
            return parsed
        return {RAW_KEY: input}
    return {RAW_KEY: orjson.dumps(input).decode()}  # a reader's non-object value (Cohere: any JSON)


cdef str text_of(object input):
    cdef object raw
    if input is None:
        return "{}"
    if type(input) is str:
        return input
    if type(input) is dict and len(<dict>input) == 1:
        raw = (<dict>input).get(RAW_KEY)
        if type(raw) is str:
            return raw      # the text object_of wrapped, back as the model wrote it
    return orjson.dumps(input).decode()


# ---------------------------------------------------------------------------------------------
# ObjectStream: an incremental check that the text so far can still become one JSON object
# (RFC 8259 grammar; a top-level value other than an object counts as broken, as object_of).

cdef enum:
    A_START = 0     # blanks only so far
    A_OBJ_FIRST     # after "{": a key or "}"
    A_KEY           # after "," in an object: a key
    A_KEY_STR       # in a key
    A_COLON         # after a key: ":"
    A_VALUE         # after ":" or after "," in an array: a value
    A_ARR_FIRST     # after "[": a value or "]"
    A_STR           # in a string value
    A_NUMBER        # in a number (num)
    A_LITERAL       # in true / false / null (lit, lit_pos)
    A_AFTER         # after a value: "," or the container's close
    A_DONE          # the object closed: blanks only

    N_MINUS = 1     # number: after "-"
    N_ZERO          # a leading 0
    N_INT           # integer digits
    N_DOT           # after "."
    N_FRAC          # fraction digits
    N_E             # after "e"
    N_ESIGN         # after "e+" / "e-"
    N_EXP           # exponent digits


cdef inline bint _blank(Py_UCS4 c) noexcept:
    return c == 32 or c == 10 or c == 13 or c == 9


cdef inline bint _digit(Py_UCS4 c) noexcept:
    return 48 <= c <= 57


cdef inline bint _hex(Py_UCS4 c) noexcept:
    return 48 <= c <= 57 or 65 <= c <= 70 or 97 <= c <= 102


cdef class ObjectStream:

    def __cinit__(self):
        self.raw = []
        self.stack = bytearray()
        self.lead = ""

    def feed_py(self, str fragment):
        """feed, for tests."""
        return self.feed(fragment)

    def close_py(self):
        """close, for tests."""
        return self.close()

    cdef str feed(self, str fragment):
        cdef Py_ssize_t k
        cdef str text
        self.raw.append(fragment)
        if self.broken:
            return ""
        if self.state == A_DONE:    # the close is held
            if self._scan(fragment) < 0:
                self.held += fragment
                return ""
            self._break_after_close()
            return self.held[:self.close_at]
        text = self.lead + fragment if self.lead else fragment    # lead: blanks, scanned again
        self.lead = ""
        k = self._scan(text)
        if self.state == A_DONE:
            # this fragment closed the object: hold it, text after the close would break it
            self.held = text
            self.close_at = self.close_at_scan
            if k < 0:
                return ""
            self._break_after_close()
            return text[:self.close_at]
        if k < 0:
            if self.state == A_START:
                self.lead = text
                return ""
            return text
        # the text broke at text[k]: send what came before (valid) and close it at the end
        self.broken = True
        if self.state == A_START:
            self.tail = None    # nothing was sent: the whole object goes at the end
            return ""
        self.tail = self._completion()
        return text[:k]

    cdef str close(self):
        cdef str raw
        if not self.broken:
            if self.state == A_START:
                return ""       # no arguments: the client's input stays {}
            if self.state == A_DONE:
                return self.held
            # cut off (max_tokens): the text is valid so far; close it as a broken one
            self.broken = True
            self.tail = self._completion()
        raw = orjson.dumps("".join(self.raw)).decode()
        if self.tail is None:
            return "{" + _RAW_MEMBER + raw + "}"
        return self.tail + _RAW_MEMBER + raw + "}"

    cdef void _break_after_close(self) except *:
        """Text after the object's close: the held close is not sent; the member goes in its place."""
        self.broken = True
        self.tail = "" if self.top_empty else ","

    cdef str _completion(self):
        """The fewest characters that make the valid text so far an object with one more member
        to come: closes the open string, number or literal, gives a key without a value null,
        closes every nested container, and ends with "," unless the object has no member yet."""
        cdef list out = []
        cdef int st = self.state
        cdef Py_ssize_t depth = len(self.stack)
        cdef Py_ssize_t i
        cdef int k
        cdef bint need_comma = True
        if st == A_KEY_STR or st == A_STR:
            # an escape under way ends as one that decodes; a high surrogate gets its low half
            # (orjson, like most clients' parsers, refuses a lone one)
            if self.low == 1:
                out.append("\\udc00")
            elif self.low == 2:
                out.append("udc00")
            elif self.esc == 1:
                out.append("\\")
            elif self.esc >= 2:
                k = 4 - (self.esc - 2)      # digits missing
                if self.low == 3:           # the smallest low half with these digits
                    out.append("dc00"[4 - k:] if k >= 3 else "0" * k)
                else:
                    out.append("0" * k)
                    if 0xD800 <= (self.uval << (4 * k)) <= 0xDBFF:
                        out.append("\\udc00")
            out.append('"')
            if st == A_KEY_STR:
                out.append(":null")
        elif st == A_NUMBER:
            if self.num == N_MINUS or self.num == N_DOT or self.num == N_E or self.num == N_ESIGN:
                out.append("0")
        elif st == A_LITERAL:
            out.append(self.lit[self.lit_pos:])
        elif st == A_COLON:
            out.append(":null")
        elif st == A_VALUE:
            out.append("null")
        elif st == A_KEY:
            if depth == 1:
                need_comma = False      # the member takes the place of the key after ","
            else:
                out.append('"":null')
        elif st == A_OBJ_FIRST and depth == 1:
            need_comma = False
        i = depth - 1
        while i >= 1:
            out.append("}" if self.stack[i] == 123 else "]")
            i -= 1
        if need_comma:
            out.append(",")
        return "".join(out)

    cdef Py_ssize_t _scan(self, str s) except -2:
        """Advances the state over s; the index of the first character that cannot continue the
        text, or -1. On a break the state is the one before that character."""
        cdef Py_ssize_t i = 0, n = len(s)
        cdef int kind = PyUnicode_KIND(s)
        cdef void* data = PyUnicode_DATA(s)
        cdef Py_UCS4 c
        cdef int st
        while i < n:
            c = PyUnicode_READ(kind, data, i)
            st = self.state
            if st == A_STR or st == A_KEY_STR:
                if self.esc == 0 and self.low == 0:
                    # the bulk of long arguments: plain string characters, skipped in a tight loop
                    while c != 34 and c != 92 and c >= 32:
                        i += 1
                        if i == n:
                            return -1
                        c = PyUnicode_READ(kind, data, i)
                if not self._string(c):
                    return i
                i += 1
                continue
            if st == A_NUMBER:
                if self._number(c):
                    i += 1
                    continue
                if self.num != N_ZERO and self.num != N_INT and self.num != N_FRAC \
                        and self.num != N_EXP:
                    return i
                self.state = A_AFTER    # the number ended: c is read as what follows it
                continue
            if st == A_LITERAL:
                if c != self.lit[self.lit_pos]:
                    return i
                self.lit_pos += 1
                if self.lit_pos == len(self.lit):
                    self.state = A_AFTER
                i += 1
                continue
            if _blank(c):
                i += 1
                continue
            if st == A_START:
                if c != 123:
                    return i
                self.stack.append(123)
                self.state = A_OBJ_FIRST
            elif st == A_OBJ_FIRST or st == A_KEY:
                if c == 34:
                    self.state = A_KEY_STR
                elif c == 125 and st == A_OBJ_FIRST:
                    if len(self.stack) == 1:
                        self.top_empty = True
                    self._pop(i)
                else:
                    return i
            elif st == A_COLON:
                if c != 58:
                    return i
                self.state = A_VALUE
            elif st == A_VALUE or st == A_ARR_FIRST:
                if c == 93 and st == A_ARR_FIRST:
                    self._pop(i)
                elif not self._value(c):
                    return i
            elif st == A_AFTER:
                if c == 44:     # ,
                    self.state = A_KEY if self.stack[len(self.stack) - 1] == 123 else A_VALUE
                elif (c == 125 and self.stack[len(self.stack) - 1] == 123) or (
                        c == 93 and self.stack[len(self.stack) - 1] == 91):
                    self._pop(i)
                else:
                    return i
            else:               # A_DONE
                return i
            i += 1
        return -1

    cdef bint _string(self, Py_UCS4 c) except -1:
        """c continues the string (escapes checked as orjson does, surrogate pairs included), or
        False."""
        cdef int d, k
        if self.esc == 0:
            if self.low == 1:               # a high surrogate's low half must follow
                if c != 92:
                    return False
                self.esc = 1
                self.low = 2
            elif c == 34:                   # "
                self.state = A_COLON if self.state == A_KEY_STR else A_AFTER
            elif c == 92:                   # backslash
                self.esc = 1
            elif c < 32:
                return False
            return True
        if self.esc == 1:
            if c == 117:                    # u
                self.esc = 2
                self.uval = 0
                if self.low == 2:
                    self.low = 3
                return True
            if self.low == 2:
                return False
            if c == 34 or c == 92 or c == 47 or c == 98 or c == 102 or c == 110 or c == 114 \
                    or c == 116:
                self.esc = 0
                return True
            return False
        if 48 <= c <= 57:
            d = <int>c - 48
        elif 65 <= c <= 70:
            d = <int>c - 55
        elif 97 <= c <= 102:
            d = <int>c - 87
        else:
            return False
        k = self.esc - 2                    # digits of this \u escape read before c
        if self.low == 3:                   # a pair's low half: \uDC00-\uDFFF
            if (k == 0 and d != 13) or (k == 1 and d < 12):
                return False
        elif k == 1 and self.uval == 13 and d >= 12:
            return False                    # a low half with no high one before it
        self.uval = self.uval * 16 + d
        if k < 3:
            self.esc += 1
            return True
        self.esc = 0
        if self.low == 3:
            self.low = 0
        elif 0xD800 <= self.uval <= 0xDBFF:
            self.low = 1                    # its low half must follow
        return True

    cdef void _pop(self, Py_ssize_t i) except *:
        self.stack.pop()
        if len(self.stack) == 0:
            self.state = A_DONE
            self.close_at_scan = i
        else:
            self.state = A_AFTER

    cdef bint _value(self, Py_UCS4 c) except -1:
        if c == 34:
            self.state = A_STR
        elif c == 123:
            self.stack.append(123)
            self.state = A_OBJ_FIRST
        elif c == 91:
            self.stack.append(91)
            self.state = A_ARR_FIRST
        elif c == 45:
            self.state = A_NUMBER
            self.num = N_MINUS
        elif _digit(c):
            self.state = A_NUMBER
            self.num = N_ZERO if c == 48 else N_INT
        elif c == 116 or c == 102 or c == 110:
            self.state = A_LITERAL
            self.lit = "true" if c == 116 else "false" if c == 102 else "null"
            self.lit_pos = 1
        else:
            return False
        return True

    cdef bint _number(self, Py_UCS4 c) except -1:
        """c continues the number (num advanced), or False."""
        cdef int n = self.num
        if _digit(c):
            if n == N_MINUS:
                self.num = N_ZERO if c == 48 else N_INT
            elif n == N_INT or n == N_FRAC or n == N_EXP:
                pass
            elif n == N_DOT:
                self.num = N_FRAC
            elif n == N_E or n == N_ESIGN:
                self.num = N_EXP
            else:               # N_ZERO: no leading zeros
                return False
            return True
        if c == 46:             # .
            if n == N_ZERO or n == N_INT:
                self.num = N_DOT
                return True
            return False
        if c == 101 or c == 69:     # e E
            if n == N_ZERO or n == N_INT or n == N_FRAC:
                self.num = N_E
                return True
            return False
        if c == 43 or c == 45:  # + -
            if n == N_E:
                self.num = N_ESIGN
                return True
        return False
