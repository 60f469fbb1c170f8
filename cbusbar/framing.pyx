# cython: language_level=3
"""Byte-level framing shared by every codec: the SSE reader and writer, and the JSON scanner that
finds and splices top-level fields (the same-protocol model rewrite) without a full JSON round trip.
Sans-IO: bytes in, bytes out."""

from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.stdlib cimport strtod
from libc.string cimport memchr, memcmp, memcpy

import orjson

# Deepest JSON nesting accepted. Real chat bodies nest < 20 deep (a tool schema inside a tool inside
# the request); 128 leaves room for deep schemas while bounding the scanner's recursion.
cdef int MAX_DEPTH = 128


class FramingError(ValueError):
    """Bytes that do not have the framing's shape, or a frame over its size cap."""


# ---------------------------------------------------------------------------------------------
# SSE


cdef class SSEParser:
    """Incremental text/event-stream reader. feed() returns a list of (event, data) pairs, event as
    bytes or None, data as bytes (multi-line data joined with \\n). Accepts LF, CRLF and CR line
    endings (Gemini's SSE may use CRLF), ignores comments and `id:`/`retry:` fields. An event (or
    an unterminated line) over `max_event` bytes raises FramingError (0: DEFAULT_MAX_FRAME)."""

    def __cinit__(self, Py_ssize_t max_event=0):
        self.buf = bytearray()
        self.event = None
        self.data = []
        self.pending = 0
        self.max_event = max_event if max_event > 0 else DEFAULT_MAX_FRAME

    cpdef list feed(self, bytes chunk):
        cdef list out = []
        cdef bytes data
        cdef const unsigned char* p
        cdef const unsigned char* q
        cdef Py_ssize_t n, start = 0, end, nxt
        if len(self.buf):
            self.buf += chunk       # a line split across reads: reassemble it (rare, small)
            data = bytes(self.buf)
            del self.buf[:]
        else:
            data = chunk            # the common case: lines are read in place, no copy
        p = <const unsigned char*>(<char*>data)
        n = len(data)
        while start < n:
            # The line ends at the first LF or CR (CRLF counts once).
            q = <const unsigned char*>memchr(p + start, 10, n - start)
            end = (q - p) if q != NULL else n
            q = <const unsigned char*>memchr(p + start, 13, end - start)
            if q != NULL:
                end = q - p
                if end + 1 >= n:
                    break  # a CR at the very end may be half of a CRLF: wait for more bytes
                nxt = end + 2 if p[end + 1] == 10 else end + 1
            elif end < n:
                nxt = end + 1
            else:
                break      # no line end yet
            self._line(p, start, end, out)
            start = nxt
        if start < n:
            self.buf += data[start:] if start else data
            if len(self.buf) > self.max_event:
                raise FramingError("SSE line exceeds the maximum size")
        return out

    cdef void _line(self, const unsigned char* p, Py_ssize_t s, Py_ssize_t e, list out) except *:
        """One line p[s:e] (its end excluded): a field, a comment, or the blank line that ends an
        event. Only a `data:` or `event:` value becomes a bytes object."""
        cdef const unsigned char* colon
        cdef Py_ssize_t fe, vs
        cdef bytes value
        if e == s:
            if self.data or self.event is not None:
                out.append((self.event, self.data[0] if len(self.data) == 1 else b"\n".join(self.data)))
            self.event = None
            self.data = []
            self.pending = 0
            return
        if p[s] == 58:  # ':' comment
            return
        colon = <const unsigned char*>memchr(p + s, 58, e - s)
        if colon == NULL:
            fe = e
            vs = e
        else:
            fe = colon - p
            vs = fe + 1
            if vs < e and p[vs] == 32:
                vs += 1
        if fe - s == 4 and memcmp(p + s, b"data", 4) == 0:
            value = PyBytes_FromStringAndSize(<const char*>p + vs, e - vs)
            self.data.append(value)
            self.pending += e - vs
            if self.pending > self.max_event:
                raise FramingError("SSE event exceeds the maximum size")
        elif fe - s == 5 and memcmp(p + s, b"event", 5) == 0:
            self.event = PyBytes_FromStringAndSize(<const char*>p + vs, e - vs)

    cpdef list close(self):
        """End of stream: a final event without its blank line still counts."""
        cdef list out = []
        if self.buf:
            out = self.feed(b"\n")
        if self.data or self.event is not None:
            out.append((self.event, b"\n".join(self.data)))
            self.event = None
            self.data = []
        return out


cpdef bytes sse_event(bytes event, bytes data):
    """One SSE frame: `event: X\\ndata: Y\\n\\n` (event omitted when None)."""
    if event is None:
        return b"data: " + data + b"\n\n"
    return b"event: " + event + b"\ndata: " + data + b"\n\n"


cpdef bytes sse_data_crlf(bytes data):
    """One `data:` frame with CRLF line ends, as Gemini's own SSE is written."""
    return b"data: " + data + b"\r\n\r\n"


# ---------------------------------------------------------------------------------------------
# Streamed JSON array (Gemini's streamGenerateContent without ?alt=sse)


cdef class JsonArrayParser:
    """feed() returns the complete top-level elements (bytes) cut out of `[{...},\\r\\n{...}]` so
    far. Bytes that are not the array framing are returned as one element for the caller's JSON
    check to reject; an element over `max_element` bytes raises FramingError (0: the default)."""

    def __cinit__(self, Py_ssize_t max_element=0):
        self.buf = bytearray()
        self.start = -1
        self.max_element = max_element if max_element > 0 else DEFAULT_MAX_FRAME

    cpdef Py_ssize_t buffered(self):
        """Bytes of an unfinished element held back (non-zero at EOF: a truncated stream)."""
        return len(self.buf) if self.start >= 0 else 0

    cpdef list feed(self, bytes chunk):
        cdef list frames = []
        cdef bytearray buf = self.buf
        cdef Py_ssize_t n, i, cut = 0
        cdef unsigned char c
        buf += chunk
        n = len(buf)
        i = self.scan
        while i < n:
            c = buf[i]
            if self.start < 0:
                if c == 32 or c == 9 or c == 10 or c == 13:
                    pass
                elif c == 91 and not self.opened:  # `[`
                    self.opened = True
                elif c == 44 and self.opened:  # `,`
                    pass
                elif c == 93 and self.opened:  # `]`: the array is over
                    self.opened = False
                elif c == 123 and self.opened:  # `{`
                    self.start = i
                    self.depth = 1
                    self.in_str = False
                    self.esc = False
                elif c == 0xEF or c == 0xBB or c == 0xBF:  # a UTF-8 byte order mark
                    pass
                else:
                    frames.append(bytes(buf[i:n]))  # not the array framing: let the caller reject it
                    cut = n
                    i = n
                    break
                i += 1
                cut = i
                continue
            if self.in_str:
                if self.esc:
                    self.esc = False
                elif c == 92:
                    self.esc = True
                elif c == 34:
                    self.in_str = False
            elif c == 34:
                self.in_str = True
            elif c == 123 or c == 91:
                self.depth += 1
            elif c == 125 or c == 93:
                self.depth -= 1
                if self.depth == 0:
                    frames.append(bytes(buf[self.start:i + 1]))
                    self.start = -1
                    cut = i + 1
            i += 1
        if self.start >= 0:
            cut = self.start
            if n - cut > self.max_element:
                raise FramingError("JSON array element exceeds the maximum size")
        if cut:
            del buf[:cut]
            if self.start >= 0:
                self.start -= cut
            i -= cut
        self.scan = i
        return frames


cpdef bytes json_array_item(bytes data, bint first):
    """One element of a streamed JSON array as Gemini writes it: `[` before the first, `,\\r\\n`
    before every later one (the closing `]` is the writer's last byte)."""
    if first:
        return b"[" + data
    return b",\r\n" + data


# ---------------------------------------------------------------------------------------------
# JSON scanner


cdef inline Py_ssize_t _ws(const unsigned char* p, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    while i < n and (p[i] == 32 or p[i] == 10 or p[i] == 13 or p[i] == 9):
        i += 1
    return i


# The run of bytes inside a JSON string up to the closing quote, a backslash or a control
# character JSON forbids unescaped, 16 bytes a step (simd.h).
cdef extern from "simd.h":
    Py_ssize_t busbar_str_run(const unsigned char* p, Py_ssize_t i, Py_ssize_t n) nogil


cdef Py_ssize_t _string(const unsigned char* p, Py_ssize_t i, Py_ssize_t n, bint* escaped) noexcept nogil:
    """p[i] is the opening quote; returns the index after the closing quote, or -1."""
    cdef unsigned char c
    i += 1
    while True:
        i += busbar_str_run(p, i, n)
        if i >= n:
            return -1
        c = p[i]
        if c == 34:
            return i + 1
        if c == 92:
            escaped[0] = True
            i += 2
            continue
        return -1


cdef Py_ssize_t _value(const unsigned char* p, Py_ssize_t i, Py_ssize_t n, int depth) noexcept nogil:
    """Skips one JSON value starting at p[i] (no leading whitespace); returns the index after it,
    or -1 when the bytes are not JSON."""
    cdef unsigned char c
    cdef bint esc = False
    cdef Py_ssize_t j
    if i >= n:
        return -1
    c = p[i]
    if c == 34:
        return _string(p, i, n, &esc)
    if c == 123 or c == 91:
        if depth >= MAX_DEPTH:
            return -1
        i = _ws(p, i + 1, n)
        if i < n and p[i] == (125 if c == 123 else 93):
            return i + 1
        while True:
            if c == 123:
                if i >= n or p[i] != 34:
                    return -1
                i = _string(p, i, n, &esc)
                if i < 0:
                    return -1
                i = _ws(p, i, n)
                if i >= n or p[i] != 58:
                    return -1
                i = _ws(p, i + 1, n)
            i = _value(p, i, n, depth + 1)
            if i < 0:
                return -1
            i = _ws(p, i, n)
            if i >= n:
                return -1
            if p[i] == 44:
                i = _ws(p, i + 1, n)
                continue
            if p[i] == (125 if c == 123 else 93):
                return i + 1
            return -1
    if c == 116:  # true
        return i + 4 if i + 4 <= n and p[i+1] == 114 and p[i+2] == 117 and p[i+3] == 101 else -1
    if c == 102:  # false
        return i + 5 if i + 5 <= n and p[i+1] == 97 and p[i+2] == 108 and p[i+3] == 115 and p[i+4] == 101 else -1
    if c == 110:  # null
        return i + 4 if i + 4 <= n and p[i+1] == 117 and p[i+2] == 108 and p[i+3] == 108 else -1
    if c == 45 or (48 <= c <= 57):
        j = i + 1
        while j < n and (48 <= p[j] <= 57 or p[j] == 46 or p[j] == 101 or p[j] == 69
                         or p[j] == 43 or p[j] == 45):
            j += 1
        return j
    return -1


cpdef dict scan_top(bytes body, tuple keys):
    """Validates that `body` is one JSON object and returns {key: (start, end)} — the byte span of
    the value — for each of `keys` (bytes) present at the top level. Raises FramingError when the
    body is not a JSON object. A key spelled with escapes is not matched (the caller falls back)."""
    cdef const unsigned char* p = body
    cdef Py_ssize_t n = len(body)
    cdef Py_ssize_t i, ks, ke, vs, kn
    cdef bint esc
    cdef dict found = {}
    cdef object key
    i = _ws(p, 0, n)
    if i >= n or p[i] != 123:
        raise FramingError("not a JSON object")
    i = _ws(p, i + 1, n)
    if i < n and p[i] == 125:
        if _ws(p, i + 1, n) != n:
            raise FramingError("trailing bytes")
        return found
    while True:
        if i >= n or p[i] != 34:
            raise FramingError("bad key")
        esc = False
        ks = i + 1
        i = _string(p, i, n, &esc)
        if i < 0:
            raise FramingError("bad key")
        ke = i - 1
        i = _ws(p, i, n)
        if i >= n or p[i] != 58:
            raise FramingError("missing colon")
        i = _ws(p, i + 1, n)
        vs = i
        i = _value(p, i, n, 1)
        if i < 0:
            raise FramingError("bad value")
        if not esc:
            # Compared in place: a bytes object per top-level key was most of a small body's
            # scan (callgrind: anthropic.read_usage on a ~550-byte answer, 19.7k instructions).
            for key in keys:
                if type(key) is not bytes:
                    continue        # only bytes keys can match (as `key in keys` did)
                kn = len(<bytes>key)
                if kn == ke - ks and memcmp(p + ks, <const char*><bytes>key, kn) == 0:
                    found[key] = (vs, i)
                    break
        i = _ws(p, i, n)
        if i >= n:
            raise FramingError("unterminated object")
        if p[i] == 44:
            i = _ws(p, i + 1, n)
            continue
        if p[i] == 125:
            if _ws(p, i + 1, n) != n:
                raise FramingError("trailing bytes")
            return found
        raise FramingError("bad separator")


cdef object _count_at(const unsigned char* p, Py_ssize_t i, Py_ssize_t e):
    """The token count of the JSON number at p[i:e] as jsonget.count() gives it for the parsed
    value: a positive integer below 2**63 - 1 as it is, a float truncated, anything else 0."""
    cdef unsigned long long v = 0
    cdef Py_ssize_t j
    cdef char buf[64]
    cdef double d
    if p[i] == 45:      # negative
        return 0
    for j in range(i, e):
        if not (48 <= p[j] <= 57):
            # a fraction or an exponent: the float orjson would give, truncated
            if e - i >= 64:
                return 0
            memcpy(buf, p + i, e - i)
            buf[e - i] = 0
            d = strtod(buf, NULL)
            return <long long>d if 0 < d < 9.2e18 else 0
        if v > 922337203685477580ULL:
            return 0
        v = v * 10 + (p[j] - 48)
    return <long long>v if v < 9223372036854775807ULL else 0


cpdef list members(bytes body, tuple span, tuple names):
    """The members `names` (bytes) of the JSON object at body[span[0]:span[1]], a value span
    scan_top returned (so valid JSON), read in place: the usage readers' way to take a few counts
    out of a same-protocol answer without building its usage dict (callgrind: orjson on the usage
    object plus the dict lookups were most of anthropic.read_usage). Per name: None when absent or
    null, the (start, end) span of an object value (read it with members again), the token count
    jsonget.count() would give of a number, 0 for any other value. None when the value at span is
    not an object. A name spelled with escapes is not matched."""
    cdef const unsigned char* p = body
    cdef Py_ssize_t i = <Py_ssize_t>span[0]
    cdef Py_ssize_t n = <Py_ssize_t>span[1]
    cdef Py_ssize_t k = len(names)
    cdef Py_ssize_t ks, ke, vs, kn, x
    cdef bint esc
    cdef list out
    cdef object key, v
    cdef unsigned char c
    if n > len(body) or i < 0 or i >= n or p[i] != 123:
        return None
    out = [None] * k
    i = _ws(p, i + 1, n)
    while i < n and p[i] == 34:
        esc = False
        ks = i + 1
        i = _string(p, i, n, &esc)
        if i < 0:
            break
        ke = i - 1
        i = _ws(p, i, n)
        if i >= n or p[i] != 58:
            break
        vs = _ws(p, i + 1, n)
        i = _value(p, vs, n, 1)
        if i < 0:
            break
        if not esc:
            for x in range(k):
                key = names[x]
                kn = len(<bytes>key)
                if kn == ke - ks and memcmp(p + ks, <const char*><bytes>key, kn) == 0:
                    c = p[vs]
                    if c == 123:
                        v = (vs, i)
                    elif c == 110:
                        v = None
                    elif c == 45 or 48 <= c <= 57:
                        v = _count_at(p, vs, i)
                    else:
                        v = 0
                    out[x] = v
                    break
        i = _ws(p, i, n)
        if i < n and p[i] == 44:
            i = _ws(p, i + 1, n)
    return out


cpdef bytes splice(bytes body, Py_ssize_t start, Py_ssize_t end, bytes replacement):
    """body with body[start:end] replaced."""
    return body[:start] + replacement + body[end:]


cpdef object top_field(bytes body, bytes key):
    """The parsed value of one top-level field of a JSON object body, without parsing the rest
    (the codecs' usage taps read only `usage`); None when the field is absent. FramingError when
    the body is not a JSON object."""
    cdef tuple span = scan_top(body, (key,)).get(key)
    if span is None:
        return None
    try:
        return orjson.loads(body[<Py_ssize_t>span[0]:<Py_ssize_t>span[1]])
    except orjson.JSONDecodeError:
        raise FramingError("bad value")
