# cython: language_level=3
"""RESP (the Redis/Valkey protocol, version 2) for busbar's own client on the request path
(busbar/governance/resp.py). Sans-IO: a command encoder (bytes, str and int arguments -> one
bytes frame) and an incremental reply parser fed bytes as they arrive, that yields whole replies:
integers, bulk and simple strings (bytes), nil (None), arrays (lists, nested), and error replies
as RespError values (returned, not raised: the caller decides, per reply). Input that is not
RESP2, or over a limit, raises RespProtocolError and leaves the parser broken (the connection is
to be dropped): never a crash, never an unbounded allocation."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.list cimport PyList_GET_SIZE
from cpython.long cimport PyLong_AsLongLongAndOverflow
from libc.string cimport memchr, memcpy

# A bulk string longer than this is refused. The request path reads a few integers per reply and
# redis-py still serves the admin side and pub/sub; 16 MiB is far above any ledger reply while
# bounding what a hostile or confused server can make a worker buffer (Redis's own default
# proto-max-bulk-len is 512 MiB, far past anything busbar sends or reads here).
DEFAULT_MAX_BULK = 16 * 1024 * 1024
# Elements of one array. The admission reply has one per check plus one; 1 Mi leaves room for any
# future multi-key read. Elements are appended as they arrive, so a header alone allocates nothing.
DEFAULT_MAX_ARRAY = 1024 * 1024
# Nesting of arrays. Busbar's scripts answer one or two levels (EXEC of scripts: two); 16 is deep
# enough for any Redis reply while bounding the parser's frame stack (MAX_NEST, compiled in).
DEFAULT_MAX_DEPTH = 16
# A status, error or integer line (or a length header). Redis's error messages are well under 1 KiB;
# a line that has not ended within 64 KiB is not RESP.
DEFAULT_MAX_LINE = 64 * 1024
DEF MAX_NEST = 64


class RespError(Exception):
    """An error reply (`-ERR ...`, `-NOSCRIPT ...`); `.message` the text, `.code` its first word."""

    def __init__(self, message):
        Exception.__init__(self, message)
        self.message = message
        self.code = message.split(" ", 1)[0] if message else ""


class RespProtocolError(ValueError):
    """Bytes that are not a RESP2 reply, or a reply over a limit: the connection is unusable."""


# ---------------------------------------------------------------------------------------------
# encoding

cdef inline Py_ssize_t _digits(long long v) noexcept:
    """Characters of v in decimal."""
    cdef Py_ssize_t n = 1
    cdef unsigned long long u
    if v < 0:
        n += 1
        u = <unsigned long long>(-(v + 1)) + 1
    else:
        u = <unsigned long long>v
    while u >= 10:
        u //= 10
        n += 1
    return n


cdef inline char* _put(char* w, long long v) noexcept:
    """v in decimal at w; returns the end."""
    cdef Py_ssize_t n = _digits(v)
    cdef unsigned long long u
    cdef char* e = w + n
    if v < 0:
        w[0] = b'-'
        u = <unsigned long long>(-(v + 1)) + 1
    else:
        u = <unsigned long long>v
    while True:
        e -= 1
        e[0] = <char>(c'0' + u % 10)
        u //= 10
        if u == 0:
            break
    return w + n


cdef inline bint _small(object a) except -1:
    """An int (exactly) that fits a C long long."""
    cdef int overflow = 0
    PyLong_AsLongLongAndOverflow(a, &overflow)
    return overflow == 0


cdef Py_ssize_t _size(object seq, list parts) except -1:
    """Wire size of the arguments of `seq` (their bulk headers included), each appended to `parts`
    as bytes or as a C-sized int (written as digits by _write)."""
    cdef Py_ssize_t total = 0, n
    cdef object a
    cdef type t
    for a in seq:
        t = type(a)
        if t is bytes:
            pass
        elif t is int and _small(a):
            n = _digits(<long long>a)
            parts.append(a)
            total += 1 + _digits(n) + 2 + n + 2
            continue
        elif t is str:
            a = (<str>a).encode("utf-8")
        elif t is int:
            a = int.__repr__(a).encode("ascii")
        elif t is bytearray or t is memoryview:
            a = bytes(a)
        elif isinstance(a, str):
            a = str.__str__(a).encode("utf-8")
        elif isinstance(a, int) and not isinstance(a, bool):
            a = int.__repr__(a).encode("ascii")
        else:
            raise TypeError("a RESP argument is bytes, str or int, not %s" % t.__name__)
        parts.append(a)
        n = PyBytes_GET_SIZE(a)
        total += 1 + _digits(n) + 2 + n + 2
    return total


cdef bytes _frame(list parts, Py_ssize_t size):
    cdef Py_ssize_t count = PyList_GET_SIZE(parts), n
    cdef bytes out = PyBytes_FromStringAndSize(NULL, 1 + _digits(count) + 2 + size)
    cdef char* w = PyBytes_AS_STRING(out)
    cdef object a
    cdef long long v
    w[0] = b'*'
    w = _put(w + 1, count)
    w[0] = b'\r'
    w[1] = b'\n'
    w += 2
    for a in parts:
        w[0] = b'$'
        if type(a) is int:
            v = <long long>a
            w = _put(w + 1, _digits(v))
            w[0] = b'\r'
            w[1] = b'\n'
            w = _put(w + 2, v)
        else:
            n = PyBytes_GET_SIZE(a)
            w = _put(w + 1, n)
            w[0] = b'\r'
            w[1] = b'\n'
            memcpy(w + 2, PyBytes_AS_STRING(a), n)
            w += 2 + n
        w[0] = b'\r'
        w[1] = b'\n'
        w += 2
    return out


def encode_command(args):
    """One command (a sequence of bytes, str or int arguments) as a RESP array of bulk strings."""
    cdef list parts = []
    cdef Py_ssize_t size = _size(args, parts)
    if not parts:
        raise ValueError("a command has at least one argument")
    return _frame(parts, size)


def encode_script(bytes sha, keys, args):
    """EVALSHA sha <len(keys)> keys... args..., without building the argument list first."""
    cdef list parts = []
    cdef Py_ssize_t size = _size((b"EVALSHA", sha, len(keys)), parts)
    size += _size(keys, parts)
    size += _size(args, parts)
    return _frame(parts, size)


# ---------------------------------------------------------------------------------------------
# parsing

cdef class RespParser:
    """feed(bytes) -> the list of replies completed by those bytes (often none or one). A reply
    split across any number of feeds is assembled; an array's elements already read are kept."""

    cdef bytearray _buf
    cdef list _stack            # the arrays being filled, outermost first
    cdef Py_ssize_t _left[MAX_NEST]
    cdef int _depth
    cdef bint _broken
    cdef readonly Py_ssize_t max_bulk, max_array, max_line
    cdef readonly int max_depth

    def __cinit__(self, Py_ssize_t max_bulk=DEFAULT_MAX_BULK, Py_ssize_t max_array=DEFAULT_MAX_ARRAY,
                  int max_depth=DEFAULT_MAX_DEPTH, Py_ssize_t max_line=DEFAULT_MAX_LINE):
        if max_bulk < 0 or max_array < 0 or max_line < 16 or not 0 < max_depth <= MAX_NEST:
            raise ValueError("RespParser: limits out of range (max_depth 1..%d, max_line >= 16)"
                             % MAX_NEST)
        self._buf = bytearray()
        self._stack = []
        self._depth = 0
        self._broken = False
        self.max_bulk = max_bulk
        self.max_array = max_array
        self.max_depth = max_depth
        self.max_line = max_line

    @property
    def pending(self):
        """Bytes held of a reply not yet complete."""
        return PyByteArray_GET_SIZE(self._buf)

    cpdef list feed(self, data):
        cdef list out = []
        cdef Py_ssize_t used, n
        cdef bytes b
        if self._broken:
            raise RespProtocolError("the parser met bad input before; the connection is unusable")
        if type(data) is not bytes:
            data = bytes(data)
        b = <bytes>data
        n = PyBytes_GET_SIZE(b)
        if PyByteArray_GET_SIZE(self._buf) == 0:
            used = self._parse(PyBytes_AS_STRING(b), n, out)
            if used < n:
                self._buf += b[used:]
            return out
        self._buf += b
        used = self._parse(PyByteArray_AS_STRING(self._buf), PyByteArray_GET_SIZE(self._buf), out)
        if used:
            del self._buf[:used]
        return out

    cdef _fail(self, str why):
        self._broken = True
        self._stack = []
        self._depth = 0
        raise RespProtocolError(why)

    cdef Py_ssize_t _parse(self, const char* p, Py_ssize_t n, list out) except -1:
        """Replies from p[0:n] into `out`; returns the bytes consumed (whole elements only)."""
        cdef Py_ssize_t pos = 0, cr, ln, start, limit
        cdef long long v
        cdef char t
        cdef const char* hit
        cdef object val
        cdef list arr
        while pos < n:
            t = p[pos]
            limit = n - pos - 1
            if limit > self.max_line + 1:
                limit = self.max_line + 1
            hit = <const char*>memchr(p + pos + 1, b'\r', limit)
            if hit == NULL:
                if n - pos - 1 > self.max_line:
                    self._fail("a RESP line longer than %d bytes" % self.max_line)
                break
            cr = hit - p
            if cr + 1 >= n:
                break
            if p[cr + 1] != b'\n':
                self._fail("a RESP line not ended by CRLF")
            start = pos + 1
            ln = cr - start
            if t == b'+':
                val = PyBytes_FromStringAndSize(p + start, ln)
                pos = cr + 2
            elif t == b'-':
                val = RespError(PyBytes_FromStringAndSize(p + start, ln).decode("utf-8", "replace"))
                pos = cr + 2
            elif t == b':':
                v = self._integer(p + start, ln)
                val = v
                pos = cr + 2
            elif t == b'$':
                v = self._integer(p + start, ln)
                if v == -1:
                    val = None
                    pos = cr + 2
                else:
                    if v < 0 or v > self.max_bulk:
                        self._fail("a RESP bulk string of %d bytes (the limit is %d)"
                                   % (v, self.max_bulk))
                    if cr + 2 + v + 2 > n:
                        break
                    if p[cr + 2 + v] != b'\r' or p[cr + 3 + v] != b'\n':
                        self._fail("a RESP bulk string not ended by CRLF")
                    val = PyBytes_FromStringAndSize(p + cr + 2, <Py_ssize_t>v)
                    pos = cr + 2 + v + 2
            elif t == b'*':
                v = self._integer(p + start, ln)
                pos = cr + 2
                if v == -1:
                    val = None
                elif v < 0 or v > self.max_array:
                    self._fail("a RESP array of %d elements (the limit is %d)" % (v, self.max_array))
                elif v == 0:
                    val = []
                else:
                    if self._depth >= self.max_depth:
                        self._fail("RESP arrays nested deeper than %d" % self.max_depth)
                    self._stack.append([])
                    self._left[self._depth] = v
                    self._depth += 1
                    continue
            else:
                self._fail("not a RESP2 reply (type byte 0x%02x)" % <unsigned char>t)
            # a whole value: into the array being filled (closing every array it completes)
            while self._depth:
                arr = <list>self._stack[self._depth - 1]
                arr.append(val)
                self._left[self._depth - 1] -= 1
                if self._left[self._depth - 1]:
                    break
                self._depth -= 1
                self._stack.pop()
                val = arr
            else:
                out.append(val)
        return pos

    cdef long long _integer(self, const char* s, Py_ssize_t n) except? -2:
        """A RESP integer or length: [-]digits, within a signed 64-bit integer."""
        cdef Py_ssize_t i = 0
        cdef bint neg = False
        cdef unsigned long long v = 0
        if n > 0 and s[0] == b'-':
            neg = True
            i = 1
        if i >= n or n - i > 19:
            self._fail("a RESP integer that is empty or too long")
        while i < n:
            if not b'0' <= s[i] <= b'9':
                self._fail("a RESP integer with a non-digit")
            v = v * 10 + <unsigned long long>(s[i] - c'0')
            i += 1
        if v > <unsigned long long>9223372036854775807ULL + (1 if neg else 0):
            self._fail("a RESP integer outside 64 bits")
        if neg:
            return -<long long>(v - 1) - 1
        return <long long>v
