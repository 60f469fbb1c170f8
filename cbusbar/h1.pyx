# cython: language_level=3
"""Ingress request-head fast path: one complete, plain HTTP/1.1 request parsed straight from the
receive buffer, with no parser callbacks.

httptools drives a Python callback per URL piece, header and body chunk; for a small request that
is ~3-4 µs of glue around ~0.4 µs of parsing. This parser handles only the common, unambiguous
shape and answers None for everything else, which the caller then feeds to httptools (the
authority). So it never rejects anything itself, and whenever it does answer, httptools would have
parsed the same bytes to the same request (tests/cbusbar/test_h1.py fuzzes it against httptools).

Accepted: `GET` or `POST`, an origin-form target of visible ASCII without a fragment, `HTTP/1.1`,
header names of token characters, header values of visible ASCII, space and tab with no trailing
whitespace, at most one Content-Length (1-15 digits) and at most one Connection header (exactly
`keep-alive` or `close`), the whole body present. Anything else (chunked, Upgrade, Expect, obs-fold,
bare LF, obs-text, limits exceeded, a partial request, bytes after `Connection: close`) → None.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.string cimport memcmp, memcpy

cdef bytes _GET = b"GET"
cdef bytes _POST = b"POST"

# RFC 9110 tchar: ! # $ % & ' * + - . ^ _ ` | ~ DIGIT ALPHA
cdef unsigned char _TCHAR[256]
cdef int _c
for _c in range(256):
    _TCHAR[_c] = 0
for _c in b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
    _TCHAR[_c] = 1


cdef inline bint _eq_lower(const unsigned char* p, Py_ssize_t n, const char* lit, Py_ssize_t m):
    """Whether p[:n], ASCII-lowercased, equals the lowercase literal lit[:m]."""
    cdef Py_ssize_t k
    cdef unsigned char c
    if n != m:
        return False
    for k in range(n):
        c = p[k]
        if 65 <= c <= 90:
            c += 32
        if c != <unsigned char>lit[k]:
            return False
    return True


cdef bint _framing_header(const unsigned char* p, Py_ssize_t k0, Py_ssize_t k1, Py_ssize_t v0,
                          Py_ssize_t v1, long long* cl, int* ka, bint is_request) noexcept:
    """The headers that decide message framing, shared by both fast paths: one Content-Length of
    1-15 digits, one Connection of exactly keep-alive/close; Transfer-Encoding, Upgrade (and in a
    request Expect) send the message to httptools. False means: leave this message to httptools."""
    cdef Py_ssize_t j = k1 - k0
    cdef unsigned char c
    if j == 14 and _eq_lower(p + k0, j, b"content-length", 14):
        if cl[0] >= 0 or v1 == v0 or v1 - v0 > 15:
            return False
        cl[0] = 0
        for j in range(v0, v1):
            c = p[j]
            if c < 48 or c > 57:
                return False
            cl[0] = cl[0] * 10 + (c - 48)
    elif j == 10 and _eq_lower(p + k0, j, b"connection", 10):
        if ka[0] >= 0:
            return False
        if _eq_lower(p + v0, v1 - v0, b"keep-alive", 10):
            ka[0] = 1
        elif _eq_lower(p + v0, v1 - v0, b"close", 5):
            ka[0] = 0
        else:
            return False
    elif ((j == 17 and _eq_lower(p + k0, j, b"transfer-encoding", 17))
          or (j == 7 and _eq_lower(p + k0, j, b"upgrade", 7))
          or (is_request and j == 6 and _eq_lower(p + k0, j, b"expect", 6))):
        return False
    return True


cpdef tuple parse_request(bytes data, Py_ssize_t start, Py_ssize_t header_max_bytes,
                          Py_ssize_t header_count_max, Py_ssize_t body_max):
    """The request starting at data[start:] as (method, path, query, headers, body, keep_alive,
    end), headers a dict of lowercased name → value (the last of repeated names wins), end the
    offset just past the body; or None when httptools must decide (see the module docstring).

    The limits are the same ones the httptools path enforces (URL + header name and value bytes,
    header count, body bytes): a request over any of them is left to that path, which rejects it."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t i = start
    cdef Py_ssize_t u0, u1, q, k0, k1, v0, v1, j, hbytes, count = 0
    cdef long long cl = -1
    cdef int ka = -1
    cdef unsigned char c
    cdef bytes method, name, value
    cdef char* w
    cdef dict headers

    if start < 0 or start >= n:
        return None
    if n - i >= 5 and memcmp(p + i, b"POST ", 5) == 0:
        method = _POST
        i += 5
    elif n - i >= 4 and memcmp(p + i, b"GET ", 4) == 0:
        method = _GET
        i += 4
    else:
        return None

    u0 = i
    if i >= n or p[i] != 47:     # '/'
        return None
    q = -1
    while i < n:
        c = p[i]
        if c < 0x21 or c > 0x7E or c == 35:     # CTL, SP, DEL, obs-text, '#'
            break
        if c == 63 and q < 0:                     # '?'
            q = i
        i += 1
    if i >= n or p[i] != 32:
        return None
    u1 = i
    i += 1
    if n - i < 10 or memcmp(p + i, b"HTTP/1.1\r\n", 10) != 0:
        return None
    i += 10
    hbytes = u1 - u0
    if hbytes > header_max_bytes:
        return None

    headers = {}
    while True:
        if i + 1 >= n:
            return None
        if p[i] == 13:
            if p[i + 1] != 10:
                return None
            i += 2
            break
        k0 = i
        while i < n and _TCHAR[p[i]]:
            i += 1
        if i >= n or p[i] != 58 or i == k0:      # ':' right after a non-empty name
            return None
        k1 = i
        i += 1
        while i < n and (p[i] == 32 or p[i] == 9):
            i += 1
        v0 = i
        while i < n:
            c = p[i]
            if (c < 0x20 and c != 9) or c > 0x7E:
                break
            i += 1
        if i + 1 >= n or p[i] != 13 or p[i + 1] != 10:
            return None
        v1 = i
        if v1 > v0 and (p[v1 - 1] == 32 or p[v1 - 1] == 9):
            return None
        i += 2
        count += 1
        hbytes += (k1 - k0) + (v1 - v0)
        if count > header_count_max or hbytes > header_max_bytes:
            return None

        if not _framing_header(p, k0, k1, v0, v1, &cl, &ka, True):
            return None

        name = PyBytes_FromStringAndSize(NULL, k1 - k0)
        w = PyBytes_AS_STRING(name)
        for j in range(k1 - k0):
            c = p[k0 + j]
            if 65 <= c <= 90:
                c += 32
            w[j] = <char>c
        value = PyBytes_FromStringAndSize(<const char*>p + v0, v1 - v0)
        headers[name] = value

    if cl < 0:
        cl = 0
    if cl > body_max or n - i < cl:
        return None
    if ka == 0 and i + cl != n:
        # httptools refuses bytes after `Connection: close`; let it say so.
        return None
    if q < 0:
        path = PyUnicode_DecodeASCII(<const char*>p + u0, u1 - u0, NULL)
        query = ""
    else:
        path = PyUnicode_DecodeASCII(<const char*>p + u0, q - u0, NULL)
        query = PyUnicode_DecodeASCII(<const char*>p + q + 1, u1 - q - 1, NULL)
    if cl == 0:
        body = b""
    elif i == 0 and cl == n:
        body = data
    else:
        body = PyBytes_FromStringAndSize(<const char*>p + i, cl)
    return (method, path, query, headers, body, ka != 0, i + cl)


cpdef tuple parse_response(bytes data):
    """A whole upstream response that is exactly data, as (status, headers, body, keep_alive),
    headers a list of (lowercased name, value) in order; or None when httptools must decide.

    Accepted: `HTTP/1.1`, a status 200-599 other than 204 and 304 with a reason of visible ASCII,
    space and tab, the same header rules as parse_request, exactly one Content-Length and the whole
    body, nothing after it. Anything else (chunked, close-delimited, partial, 1xx, Upgrade, bytes
    past the body) → None. Body size limits stay with the exchange, which sees the body either way."""
    cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t i = 0, k0, k1, v0, v1, j
    cdef long long cl = -1
    cdef int ka = -1, status
    cdef unsigned char c
    cdef bytes name, value
    cdef char* w
    cdef list headers

    if n < 17 or memcmp(p, b"HTTP/1.1 ", 9) != 0:
        return None
    for j in range(9, 12):
        if p[j] < 48 or p[j] > 57:
            return None
    status = (p[9] - 48) * 100 + (p[10] - 48) * 10 + (p[11] - 48)
    if status < 200 or status > 599 or status == 204 or status == 304 or p[12] != 32:
        return None
    i = 13
    while i < n:
        c = p[i]
        if (c < 0x20 and c != 9) or c > 0x7E:
            break
        i += 1
    if i + 1 >= n or p[i] != 13 or p[i + 1] != 10:
        return None
    i += 2

    headers = []
    while True:
        if i + 1 >= n:
            return None
        if p[i] == 13:
            if p[i + 1] != 10:
                return None
            i += 2
            break
        k0 = i
        while i < n and _TCHAR[p[i]]:
            i += 1
        if i >= n or p[i] != 58 or i == k0:
            return None
        k1 = i
        i += 1
        while i < n and (p[i] == 32 or p[i] == 9):
            i += 1
        v0 = i
        while i < n:
            c = p[i]
            if (c < 0x20 and c != 9) or c > 0x7E:
                break
            i += 1
        if i + 1 >= n or p[i] != 13 or p[i + 1] != 10:
            return None
        v1 = i
        if v1 > v0 and (p[v1 - 1] == 32 or p[v1 - 1] == 9):
            return None
        i += 2

        if not _framing_header(p, k0, k1, v0, v1, &cl, &ka, False):
            return None

        name = PyBytes_FromStringAndSize(NULL, k1 - k0)
        w = PyBytes_AS_STRING(name)
        for j in range(k1 - k0):
            c = p[k0 + j]
            if 65 <= c <= 90:
                c += 32
            w[j] = <char>c
        value = PyBytes_FromStringAndSize(<const char*>p + v0, v1 - v0)
        headers.append((name, value))

    if cl < 0 or n - i != cl:
        return None
    return (status, headers, PyBytes_FromStringAndSize(<const char*>p + i, cl), ka != 0)


# ------------------------------------------------------------------------------- response heads
# The engine's answer heads, written in C: the Python "%b...%d...%b" formatting and the float
# formatting of the Server-Timing value were ~5k instructions of a small request (callgrind).

cdef inline char* _put(char* w, const char* src, Py_ssize_t n) noexcept:
    memcpy(w, src, n)
    return w + n


cdef inline char* _put_uint(char* w, unsigned long long v, int min_digits) noexcept:
    """v in decimal, left-padded with zeros to min_digits."""
    cdef char tmp[24]
    cdef int n = 0
    while v or n < min_digits:
        tmp[n] = <char>(48 + v % 10)
        v //= 10
        n += 1
    while n:
        n -= 1
        w[0] = tmp[n]
        w += 1
    return w


cpdef bytes server_timing(long long ns):
    """The Server-Timing header of busbar's own time: `busbar;dur=` in milliseconds with three
    decimals (to the nearest microsecond; a negative time counts as 0)."""
    cdef char buf[64]
    cdef char* w = buf
    cdef unsigned long long us = (ns + 500) // 1000 if ns > 0 else 0
    w = _put(w, b"Server-Timing: busbar;dur=", 26)
    w = _put_uint(w, us // 1000, 1)
    w[0] = 46   # '.'
    w = _put_uint(w + 1, us % 1000, 3)
    w = _put(w, b"\r\n", 2)
    return PyBytes_FromStringAndSize(buf, w - buf)


cpdef bytes response_head(bytes status_line, bytes ctype, Py_ssize_t length, bytes extra,
                          bytes timing, bint close):
    """An answer's head: the status line, Content-Type, then Content-Length (length >= 0) or
    chunked transfer with Cache-Control: no-cache (length < 0), `extra` header lines, `timing`
    (a Server-Timing line or b""), Connection: close when `close`, and the blank line. None for
    any of the bytes is a TypeError (cpdef cannot say `not None`; the check is here instead)."""
    if status_line is None or ctype is None or extra is None or timing is None:
        raise TypeError("response_head: status_line, ctype, extra and timing must be bytes")
    cdef Py_ssize_t n = (PyBytes_GET_SIZE(status_line) + 14 + PyBytes_GET_SIZE(ctype) + 2
                         + PyBytes_GET_SIZE(extra) + PyBytes_GET_SIZE(timing) + 2)
    cdef Py_ssize_t digits = 1
    cdef unsigned long long v = <unsigned long long>length if length > 0 else 0
    while v >= 10:
        v //= 10
        digits += 1
    if length >= 0:
        n += 16 + digits + 2
    else:
        n += 28 + 25
    if close:
        n += 19
    cdef bytes out = PyBytes_FromStringAndSize(NULL, n)
    cdef char* start = PyBytes_AS_STRING(out)
    cdef char* w = start
    w = _put(w, PyBytes_AS_STRING(status_line), PyBytes_GET_SIZE(status_line))
    w = _put(w, b"Content-Type: ", 14)
    w = _put(w, PyBytes_AS_STRING(ctype), PyBytes_GET_SIZE(ctype))
    w = _put(w, b"\r\n", 2)
    if length >= 0:
        w = _put(w, b"Content-Length: ", 16)
        w = _put_uint(w, <unsigned long long>length, 1)
        w = _put(w, b"\r\n", 2)
    else:
        w = _put(w, b"Transfer-Encoding: chunked\r\n", 28)
        w = _put(w, b"Cache-Control: no-cache\r\n", 25)
    w = _put(w, PyBytes_AS_STRING(extra), PyBytes_GET_SIZE(extra))
    w = _put(w, PyBytes_AS_STRING(timing), PyBytes_GET_SIZE(timing))
    if close:
        w = _put(w, b"Connection: close\r\n", 19)
    w = _put(w, b"\r\n", 2)
    return out
