# cython: language_level=3
"""Raw JSON spans (declared in jsonspan.pxd): a client body read with its long text left as the
JSON string literals it arrived as, and the writer side that copies them into another body.

Every byte of a body parse() accepts is checked once: the structure (objects, arrays, members) by
this module, the marked string literals by string_end() (orjson's rules), and every other value by
orjson itself on that value's bytes (or, for the common plain ASCII strings, small integers and
literals, by an equivalent fast path). So parse() accepts exactly the documents orjson accepts, and
gives the same objects; where it cannot tell (an odd byte, deep nesting) it returns None and the
caller falls back to orjson.loads of the whole body."""

from libc.string cimport memcmp
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.long cimport PyLong_FromLongLong
from cpython.unicode cimport PyUnicode_DecodeASCII

import orjson

from cbusbar.ir cimport Block

cdef object Fragment = orjson.Fragment
cdef object JSONDecodeError = orjson.JSONDecodeError

cdef extern from "simd.h":
    Py_ssize_t busbar_str_run_hi(const unsigned char* p, Py_ssize_t i, Py_ssize_t n, int* hi) nogil
    int busbar_utf8_valid(const unsigned char* p, Py_ssize_t n) nogil
    int busbar_utf8_valid_scalar(const unsigned char* p, Py_ssize_t n) nogil

# How deep parse() itself recurses into marked containers, and how deep a whole document may nest
# before it leaves the document to orjson (whose own limit is 1024 levels): past either, the caller
# parses with orjson, which then accepts or refuses it by its own rule.
cdef int MAX_MARKED_DEPTH = 64
cdef int MAX_DEPTH = 512

cdef object FAIL = object()     # parse(): not sure, let orjson decide


# ---------------------------------------------------------------------------------------------
# Marks


cdef class Marks:
    def __init__(self, list states, tuple values=()):
        """states[k] = (raw, element state, {member name: state}) for k >= 1; states[0] is unused
        (state 0 is an ordinary value, nothing marked below it). values: short strings the body
        often holds (roles, block types): parse returns these very objects for them."""
        cdef int k
        cdef object raw, elem, members
        if len(states) > MAX_MARK_STATES:
            raise ValueError("too many mark states")
        self.nstates = len(states)
        self.keys = [None] * len(states)
        for k in range(1, len(states)):
            raw, elem, members = states[k]
            self.raw[k] = bool(raw)
            self.elem[k] = int(elem)
            self.keys[k] = [(name.encode(), name, int(st)) for name, st in members.items()]
        self.values = [(v.encode(), v) for v in values]


# ---------------------------------------------------------------------------------------------
# Scanning


cdef inline int _hex4(const unsigned char* p) noexcept nogil:
    """The value of 4 hex digits, or -1."""
    cdef int v = 0, k
    cdef unsigned char c
    for k in range(4):
        c = p[k]
        if 48 <= c <= 57:
            v = v * 16 + (c - 48)
        elif 65 <= c <= 70:
            v = v * 16 + (c - 55)
        elif 97 <= c <= 102:
            v = v * 16 + (c - 87)
        else:
            return -1
    return v


cdef Py_ssize_t string_end(const unsigned char* p, Py_ssize_t i, Py_ssize_t n, int* flags) noexcept nogil:
    cdef unsigned char c
    cdef int u, lo, hi = 0
    cdef Py_ssize_t s = i + 1
    i += 1
    while True:
        # 16 bytes a step up to a quote, a backslash or a control character; bytes >= 0x80 pass
        # and the whole literal's UTF-8 is checked at its end, branch-free (simd.h).
        i += busbar_str_run_hi(p, i, n, &hi)
        if i >= n:
            return -1
        c = p[i]
        if c == 34:     # "
            if hi:
                flags[0] |= F_NON_ASCII
                if not busbar_utf8_valid(p + s, i - s):
                    return -1
            return i + 1
        if c == 92:     # \
            flags[0] |= F_ESCAPE
            if i + 1 >= n:
                return -1
            c = p[i + 1]
            if c == 34 or c == 92 or c == 47 or c == 98 or c == 102 or c == 110 or c == 114 or c == 116:
                i += 2
            elif c == 117:  # \uXXXX
                if i + 6 > n:
                    return -1
                u = _hex4(p + i + 2)
                if u < 0:
                    return -1
                if 0xD800 <= u <= 0xDBFF:
                    # a high surrogate must be followed by an escaped low one
                    if i + 12 > n or p[i + 6] != 92 or p[i + 7] != 117:
                        return -1
                    lo = _hex4(p + i + 8)
                    if lo < 0xDC00 or lo > 0xDFFF:
                        return -1
                    i += 12
                elif 0xDC00 <= u <= 0xDFFF:
                    return -1
                else:
                    i += 6
            else:
                return -1
        else:
            return -1   # a control character


def _utf8_valid(bytes data, bint scalar=False):
    """Tests: the UTF-8 check string_end applies (simd.h), or its scalar form."""
    if scalar:
        return bool(busbar_utf8_valid_scalar(data, len(data)))
    return bool(busbar_utf8_valid(data, len(data)))


cdef Py_ssize_t skip_value(const unsigned char* p, Py_ssize_t i, Py_ssize_t n, int depth) noexcept nogil:
    cdef unsigned char c
    cdef int flags = 0, digits
    if i >= n:
        return -1
    c = p[i]
    if c == 34:
        return string_end(p, i, n, &flags)
    if c == 123 or c == 91:
        if depth >= 64:
            return -1
        i = ws(p, i + 1, n)
        if i < n and p[i] == c + 2:     # } or ]: empty
            return i + 1
        while True:
            if c == 123:
                if i >= n or p[i] != 34:
                    return -1
                i = string_end(p, i, n, &flags)
                if i < 0:
                    return -1
                i = ws(p, i, n)
                if i >= n or p[i] != 58:
                    return -1
                i = ws(p, i + 1, n)
            i = skip_value(p, i, n, depth + 1)
            if i < 0:
                return -1
            i = ws(p, i, n)
            if i < n and p[i] == 44:
                i = ws(p, i + 1, n)
                continue
            if i < n and p[i] == c + 2:
                return i + 1
            return -1
    if c == 116:
        return i + 4 if i + 4 <= n and memcmp(p + i, b"true", 4) == 0 else -1
    if c == 102:
        return i + 5 if i + 5 <= n and memcmp(p + i, b"false", 5) == 0 else -1
    if c == 110:
        return i + 4 if i + 4 <= n and memcmp(p + i, b"null", 4) == 0 else -1
    # -? (0 | [1-9][0-9]*) (. [0-9]+)?, at most 18 digits each side: surely finite for orjson.
    # An exponent (1e400 is refused by orjson) or a longer number: -1, orjson decides.
    if c == 45:
        i += 1
        if i >= n:
            return -1
    if i < n and p[i] == 48:
        i += 1
    elif i < n and 49 <= p[i] <= 57:
        digits = 0
        while i < n and 48 <= p[i] <= 57:
            i += 1
            digits += 1
        if digits > 18:
            return -1
    else:
        return -1
    if i < n and p[i] == 46:
        i += 1
        digits = 0
        while i < n and 48 <= p[i] <= 57:
            i += 1
            digits += 1
        if digits == 0 or digits > 18:
            return -1
    if i < n and (p[i] == 101 or p[i] == 69 or 48 <= p[i] <= 57):
        return -1
    return i


cdef object decode_str(const unsigned char* p, Py_ssize_t s, Py_ssize_t e, int flags):
    """The str of the valid string literal p[s:e] (quotes included; flags from string_end)."""
    if flags == 0:
        return PyUnicode_DecodeASCII(<char*>p + s + 1, e - s - 2, NULL)
    return orjson.loads(PyBytes_FromStringAndSize(<const char*>p + s, e - s))


cdef Py_ssize_t _container_end(const unsigned char* p, Py_ssize_t i, Py_ssize_t n, int* maxdepth) noexcept nogil:
    """The end of the object or array at p[i] by bracket matching outside strings (orjson then
    checks those bytes), or -1; maxdepth: how deep it nests."""
    cdef int depth = 0
    cdef unsigned char c
    while i < n:
        c = p[i]
        if c == 34:
            i += 1
            while i < n:
                c = p[i]
                if c == 92:
                    i += 2
                elif c == 34:
                    break
                else:
                    i += 1
            if i >= n:
                return -1
        elif c == 123 or c == 91:
            depth += 1
            if depth > maxdepth[0]:
                maxdepth[0] = depth
        elif c == 125 or c == 93:
            depth -= 1
            if depth <= 0:
                return i + 1 if depth == 0 else -1
        i += 1
    return -1


# ---------------------------------------------------------------------------------------------
# parse


cdef object _loads(bytes body, Py_ssize_t s, Py_ssize_t e):
    try:
        return orjson.loads(body[s:e])
    except JSONDecodeError:
        return FAIL


cdef inline object _str(bytes body, const unsigned char* p, Py_ssize_t s, Py_ssize_t e, int flags):
    if flags == 0:
        return PyUnicode_DecodeASCII(<char*>p + s + 1, e - s - 2, NULL)
    return _loads(body, s, e)


cdef object _value_str(bytes body, const unsigned char* p, Py_ssize_t s, Py_ssize_t e, int flags,
                       Marks m):
    """A string value: one of m.values itself when it is one, else _str."""
    cdef tuple cand
    cdef bytes vb
    cdef Py_ssize_t size = e - s - 2
    if flags == 0 and size <= 16:
        for cand in m.values:
            vb = <bytes>cand[0]
            if len(vb) == size and memcmp(<const char*>vb, p + s + 1, size) == 0:
                return cand[1]
    return _str(body, p, s, e, flags)


cdef object _scalar(bytes body, const unsigned char* p, Py_ssize_t* pi, Py_ssize_t n, int depth,
                    Marks m):
    """A value with nothing marked below it."""
    cdef Py_ssize_t i = pi[0], j, e
    cdef unsigned char c = p[i]
    cdef long long v
    cdef int digits, flags = 0, maxdepth = 0
    cdef bint neg
    if c == 34:
        e = string_end(p, i, n, &flags)
        if e < 0:
            return FAIL
        pi[0] = e
        return _value_str(body, p, i, e, flags, m)
    if c == 123 or c == 91:
        e = _container_end(p, i, n, &maxdepth)
        if e < 0 or depth + maxdepth > MAX_DEPTH:
            return FAIL
        pi[0] = e
        return _loads(body, i, e)
    if c == 116:
        if i + 4 <= n and memcmp(p + i, b"true", 4) == 0:
            pi[0] = i + 4
            return True
        return FAIL
    if c == 102:
        if i + 5 <= n and memcmp(p + i, b"false", 5) == 0:
            pi[0] = i + 5
            return False
        return FAIL
    if c == 110:
        if i + 4 <= n and memcmp(p + i, b"null", 4) == 0:
            pi[0] = i + 4
            return None
        return FAIL
    if c == 45 or 48 <= c <= 57:
        # An integer of up to 18 digits is read here (orjson gives the same int); any other number
        # goes to orjson whole.
        j = i
        neg = c == 45
        if neg:
            j += 1
        v = 0
        digits = 0
        while j < n and 48 <= p[j] <= 57:
            if digits == 18:
                digits = 19     # too long for the fast path
                break
            v = v * 10 + (p[j] - 48)
            digits += 1
            j += 1
        if 0 < digits <= 18 and not (digits > 1 and p[i + neg] == 48) and \
                (j >= n or not (p[j] == 46 or p[j] == 101 or p[j] == 69 or 48 <= p[j] <= 57)):
            pi[0] = j
            return PyLong_FromLongLong(-v if neg else v)
        e = i + 1
        while e < n and (p[e] == 43 or p[e] == 45 or p[e] == 46 or p[e] == 101 or p[e] == 69
                         or 48 <= p[e] <= 57):
            e += 1
        pi[0] = e
        return _loads(body, i, e)
    return FAIL


cdef object _value(bytes body, const unsigned char* p, Py_ssize_t* pi, Py_ssize_t n, Marks m,
                   int state, int depth):
    cdef Py_ssize_t i = pi[0], e
    cdef unsigned char c
    cdef int flags = 0
    if i >= n:
        return FAIL
    if state == 0:
        return _scalar(body, p, pi, n, depth, m)
    c = p[i]
    if c == 34 and m.raw[state]:
        e = string_end(p, i, n, &flags)
        if e < 0:
            return FAIL
        pi[0] = e
        return PyBytes_FromStringAndSize(<const char*>p + i, e - i)
    if depth >= MAX_MARKED_DEPTH:
        return FAIL
    if c == 123 and m.keys[state]:
        return _object(body, p, pi, n, m, state, depth + 1)
    if c == 91 and m.elem[state]:
        return _array(body, p, pi, n, m, m.elem[state], depth + 1)
    return _scalar(body, p, pi, n, depth, m)


cdef object _object(bytes body, const unsigned char* p, Py_ssize_t* pi, Py_ssize_t n, Marks m,
                    int state, int depth):
    cdef dict d = {}
    cdef list keys = m.keys[state]
    cdef Py_ssize_t i = ws(p, pi[0] + 1, n), e, klen
    cdef int flags, child
    cdef object key, v
    cdef tuple cand
    cdef bytes kb
    if i < n and p[i] == 125:
        pi[0] = i + 1
        return d
    while True:
        if i >= n or p[i] != 34:
            return FAIL
        flags = 0
        e = string_end(p, i, n, &flags)
        if e < 0:
            return FAIL
        key = None
        child = 0
        if flags == 0:
            klen = e - i - 2
            for cand in keys:
                kb = <bytes>cand[0]
                if len(kb) == klen and memcmp(<const char*>kb, p + i + 1, klen) == 0:
                    key = cand[1]
                    child = cand[2]
                    break
        if key is None:
            key = _str(body, p, i, e, flags)
            if key is FAIL:
                return FAIL
        i = ws(p, e, n)
        if i >= n or p[i] != 58:   # :
            return FAIL
        pi[0] = ws(p, i + 1, n)
        v = _value(body, p, pi, n, m, child, depth)
        if v is FAIL:
            return FAIL
        d[key] = v
        i = ws(p, pi[0], n)
        if i < n and p[i] == 44:   # ,
            i = ws(p, i + 1, n)
            continue
        if i < n and p[i] == 125:  # }
            pi[0] = i + 1
            return d
        return FAIL


cdef object _array(bytes body, const unsigned char* p, Py_ssize_t* pi, Py_ssize_t n, Marks m,
                   int elem, int depth):
    cdef list out = []
    cdef Py_ssize_t i = ws(p, pi[0] + 1, n)
    cdef object v
    if i < n and p[i] == 93:
        pi[0] = i + 1
        return out
    while True:
        pi[0] = i
        v = _value(body, p, pi, n, m, elem, depth)
        if v is FAIL:
            return FAIL
        out.append(v)
        i = ws(p, pi[0], n)
        if i < n and p[i] == 44:
            i = ws(p, i + 1, n)
            continue
        if i < n and p[i] == 93:
            pi[0] = i + 1
            return out
        return FAIL


cpdef object parse(bytes body, Marks marks):
    """The body's top-level object with the marked string values as bytes literals, or None (then
    parse with orjson: not an object, not JSON, or nothing this reader is sure of)."""
    cdef const unsigned char* p = body
    cdef Py_ssize_t n = len(body)
    cdef Py_ssize_t i = ws(p, 0, n)
    cdef object d
    if i >= n or p[i] != 123 or marks.nstates < 2:
        return None
    d = _object(body, p, &i, n, marks, 1, 1)
    if d is FAIL or ws(p, i, n) != n:
        return None
    return d


# ---------------------------------------------------------------------------------------------
# Writers


cdef object text_value(Block b):
    """What to put where `b.text or ""` went: the literal as an orjson.Fragment, or the str."""
    if b.text_json is not None:
        return Fragment(b.text_json)
    return b._text if b._text is not None else ""


cdef bytes text_literal(Block b):
    if b.text_json is not None:
        return b.text_json
    return orjson.dumps(b._text if b._text is not None else "")


cdef bytes join_literal(list blocks, str sep):
    """The JSON string literal of sep.join(b.text or "" for b in blocks), from the blocks'
    literals where they have them (no decoding)."""
    cdef Block b
    cdef bint raw = False
    for b in blocks:
        if b.text_json is not None:
            raw = True
            break
    if not raw:
        return orjson.dumps(sep.join([b._text if b._text is not None else "" for b in blocks]))
    if len(blocks) == 1:
        return (<Block>blocks[0]).text_json
    return b'"' + _inner(orjson.dumps(sep)).join([_inner(text_literal(b)) for b in blocks]) + b'"'


cdef object join_text(list blocks, str sep):
    """sep.join(b.text or "" for b in blocks), as a str when no block holds a literal, else as one
    Fragment: the literals' escaped contents joined with the escaped separator (no decoding)."""
    cdef Block b
    cdef bint raw = False
    cdef list parts
    cdef bytes sep_json
    for b in blocks:
        if b.text_json is not None:
            raw = True
            break
    if not raw:
        return sep.join([b._text if b._text is not None else "" for b in blocks])
    if len(blocks) == 1:
        return Fragment((<Block>blocks[0]).text_json)
    sep_json = _inner(orjson.dumps(sep))
    parts = [_inner(text_literal(b)) for b in blocks]
    return Fragment(b'"' + sep_json.join(parts) + b'"')


cdef inline bytes _inner(bytes literal):
    """A string literal's escaped contents (its quotes off)."""
    return literal[1:len(literal) - 1]
