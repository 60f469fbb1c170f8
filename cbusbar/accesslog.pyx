# cython: language_level=3
"""The access log's line buffer and JSON line, for busbar/observability/lines.py and
access_log.py.

`LineBuffer`: two byte buffers that keep their memory. The event loop appends to the active one;
the writer thread `take()`s it (the buffers swap roles, in one call under the GIL), writes it with
the GIL released while the loop appends to the other, then says `done()`. Steady state, nothing
is allocated per line or per flush: a bytearray that the thread trimmed (CPython shrinks it) and
a copy of what it wrote made 0.18 fresh pages per request in the server (a page fault each),
measured with /proc's minflt under load. A buffer grows by doubling while a writer is slow, up to
`limit` bytes pending (then lines are refused and counted by the caller), and shrinks back once
it is mostly empty again.

`append_line(buf, rec, now)`: the access-log line of a RequestRecord (busbar/engine/records.py),
written straight into the active buffer: the same fields, in the same order and with the same
values as access_log.py `fields()` (a test compares the two on awkward records). The Python
version built a 17-entry dict, a float and a dozen small objects per request for orjson: ~1.7 µs
in a tight loop, and several µs more in the server under load. Strings are escaped as JSON
requires (quote, backslash, control characters; other UTF-8 as is). The second's text of the time
field ("2026-12-03T12:21:07.") is made once per second. Nothing here releases the GIL, so the
writer thread never sees half a line.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

cdef extern from "Python.h":
    object PyMemoryView_FromMemory(char *mem, Py_ssize_t size, int flags)
    int PyBUF_READ

from cbusbar.ir cimport Usage
from cbusbar.record cimport RecordHook, RequestRecord

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct tm:
        pass
    struct timespec:
        time_t tv_sec
        long tv_nsec
    size_t strftime(char *s, size_t maxsize, const char *fmt, const tm *t)

# clock_gettime and gmtime_r, or their Windows forms (port.h)
cdef extern from "port.h" nogil:
    int BB_CLOCK_REALTIME
    int bb_clock_gettime(int clk, timespec *tp)
    tm *bb_gmtime_r(const time_t *timep, tm *result)

cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>
    /* Eight bytes at once: does any of them need escaping in a JSON string (a control character,
       a quote or a backslash)? Bytes from 0x80 up (UTF-8) never do. */
    static inline int bb_json_plain8(const char *s) {
        uint64_t v;
        memcpy(&v, s, 8);
        const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
        uint64_t ctl = (v - ones * 0x20) & ~v;
        uint64_t q = v ^ (ones * 0x22);
        uint64_t b = v ^ (ones * 0x5C);
        q = (q - ones) & ~q;
        b = (b - ones) & ~b;
        return ((ctl | q | b) & highs) == 0;
    }
    """
    bint bb_json_plain8(const char *s) nogil

cdef extern from *:
    """
    /* A literal piece of the line: `s` is a string literal's array (Cython emits b"..." passed as
       const char* as a static char array), so its length is known and memcpy becomes a few moves. */
    #define BB_LIT(p, s) (memcpy((p), (s), sizeof(s) - 1), (p) + sizeof(s) - 1)
    """
    char* BB_LIT(char* p, const char* s) nogil

# Room for everything but the strings: 17 keys, numbers, punctuation (~330 bytes written).
DEF FIXED = 512

cdef char _second_text[40]
cdef Py_ssize_t _second_len = 0
cdef long long _second = -1

cdef const char* _HEX = b"0123456789abcdef"


cdef inline char* _lit(char* p, const char* s, Py_ssize_t n):
    memcpy(p, s, n)
    return p + n


cdef inline char* _int(char* p, long long v):
    """Decimal digits of v (snprintf was ~60 ns a number)."""
    cdef char tmp[24]
    cdef int i = 24
    cdef unsigned long long u
    if v < 0:
        p[0] = b'-'
        p += 1
        u = <unsigned long long>(-(v + 1)) + 1
    else:
        u = <unsigned long long>v
    while True:
        i -= 1
        tmp[i] = <char>(48 + u % 10)
        u //= 10
        if u == 0:
            break
    memcpy(p, tmp + i, 24 - i)
    return p + 24 - i


cdef char* _str(char* p, const char* s, Py_ssize_t n):
    """A JSON string of n UTF-8 bytes (at most 6n + 2 written). Eight bytes are copied at once
    while none of them needs escaping (most fields: names, ids, addresses)."""
    cdef Py_ssize_t i = 0
    cdef unsigned char c
    p[0] = b'"'
    p += 1
    while i < n:
        if i + 8 <= n and bb_json_plain8(s + i):
            memcpy(p, s + i, 8)
            p += 8
            i += 8
            continue
        c = <unsigned char>s[i]
        i += 1
        if c == b'"' or c == b'\\':
            p[0] = b'\\'
            p[1] = c
            p += 2
        elif c < 0x20:
            if c == b'\n':
                p[0] = b'\\'
                p[1] = b'n'
                p += 2
            elif c == b'\r':
                p[0] = b'\\'
                p[1] = b'r'
                p += 2
            elif c == b'\t':
                p[0] = b'\\'
                p[1] = b't'
                p += 2
            elif c == 8:
                p[0] = b'\\'
                p[1] = b'b'
                p += 2
            elif c == 12:
                p[0] = b'\\'
                p[1] = b'f'
                p += 2
            else:
                p[0] = b'\\'
                p[1] = b'u'
                p[2] = b'0'
                p[3] = b'0'
                p[4] = _HEX[c >> 4]
                p[5] = _HEX[c & 15]
                p += 6
        else:
            p[0] = c
            p += 1
    p[0] = b'"'
    return p + 1


cdef inline object _s(object v):
    """A field as str (or None): the caller holds it while its UTF-8 is in use."""
    return v if v is None or type(v) is str else str(v)


cdef inline const char* _utf8(object v, Py_ssize_t* n) except? NULL:
    """The UTF-8 of a str (valid while `v` lives), or NULL for None."""
    if v is None:
        n[0] = 0
        return NULL
    return PyUnicode_AsUTF8AndSize(v, n)


cdef inline char* _field(char* p, const char* s, Py_ssize_t n):
    if s == NULL:
        return BB_LIT(p, b"null")
    return _str(p, s, n)


cdef inline char* _opt_int(char* p, object v):
    if v is None:
        return BB_LIT(p, b"null")
    return _int(p, <long long>v)


cdef void _second_of(long long sec):
    global _second, _second_len
    cdef time_t t = <time_t>sec
    cdef tm parts
    bb_gmtime_r(&t, &parts)
    _second_len = strftime(_second_text, 40, b"%Y-%m-%dT%H:%M:%S.", &parts)
    _second = sec

# A buffer starts at 64 KiB (~180 lines) and, after growing while a writer stalled, shrinks back
# to that once a flush finds it less than an eighth full: memory follows the load, and the steady
# state never reallocates.
DEF INITIAL = 65536


cdef class LineBuffer:
    cdef char* data[2]
    cdef Py_ssize_t cap[2]
    cdef Py_ssize_t size[2]
    cdef int active
    cdef bint taken
    cdef readonly Py_ssize_t limit
    # Called (on the loop) when a line lands in an empty buffer: the writer thread sleeps until
    # there is something to write (lines.py), instead of waking every flush period for nothing.
    cdef public object on_first

    def __cinit__(self, Py_ssize_t limit):
        cdef int i
        self.limit = limit
        for i in range(2):
            self.data[i] = <char*>malloc(INITIAL)
            if self.data[i] == NULL:
                raise MemoryError()
            self.cap[i] = INITIAL
            self.size[i] = 0
        self.active = 0
        self.taken = False

    def __dealloc__(self):
        cdef int i
        for i in range(2):
            if self.data[i] != NULL:
                free(self.data[i])
                self.data[i] = NULL

    def __len__(self):
        """Bytes the loop appended that no writer has taken yet."""
        return self.size[self.active]

    cdef char* reserve(self, Py_ssize_t n) except NULL:
        """Room for n more bytes in the active buffer (grown by doubling); NULL + error when the
        pending bytes are past `limit`."""
        cdef int a = self.active
        cdef Py_ssize_t need = self.size[a] + n
        cdef Py_ssize_t cap = self.cap[a]
        cdef char* p
        if need > cap:
            while cap < need:
                cap *= 2
            p = <char*>realloc(self.data[a], cap)
            if p == NULL:
                raise MemoryError()
            self.data[a] = p
            self.cap[a] = cap
        return self.data[a] + self.size[a]

    def append(self, bytes line):
        """Appends `line`; False (nothing appended) when `limit` bytes are already pending."""
        cdef Py_ssize_t n = PyBytes_GET_SIZE(line)
        if self.size[self.active] > self.limit:
            return False
        memcpy(self.reserve(n), PyBytes_AS_STRING(line), n)
        self.commit(n)
        return True

    cdef int commit(self, Py_ssize_t n) except -1:
        """The n bytes written at the reserved place are the active buffer's now; on_first() when
        they are its first."""
        cdef Py_ssize_t was = self.size[self.active]
        self.size[self.active] = was + n
        if was == 0 and self.on_first is not None:
            self.on_first()
        return 0

    def take(self):
        """For the writer thread: what the loop appended, as a read-only memoryview valid until
        `done()`; the loop goes on in the other buffer. None when there is nothing."""
        cdef int a = self.active
        if self.taken:
            raise RuntimeError("LineBuffer.take() before done()")
        if not self.size[a]:
            return None
        self.active = 1 - a
        self.taken = True
        return PyMemoryView_FromMemory(self.data[a], self.size[a], PyBUF_READ)

    def done(self):
        """The taken buffer is written: empty it (and shrink it if it grew and is mostly idle)."""
        cdef int t = 1 - self.active
        cdef char* p
        if not self.taken:
            return
        if self.cap[t] > INITIAL and self.size[t] < self.cap[t] // 8:
            p = <char*>realloc(self.data[t], INITIAL)
            if p != NULL:
                self.data[t] = p
                self.cap[t] = INITIAL
        self.size[t] = 0
        self.taken = False


cdef double _now() noexcept nogil:
    """time.time(), without the float object."""
    cdef timespec ts
    bb_clock_gettime(BB_CLOCK_REALTIME, &ts)
    return <double>ts.tv_sec + <double>ts.tv_nsec * 1e-9


cdef class AccessHook(RecordHook):
    """The access log's finish hook: the line of each RequestRecord into `buf`, and `on_drop()`
    when the buffer refused it (a writer that does not keep up)."""
    cdef LineBuffer buf
    cdef object on_drop

    def __init__(self, LineBuffer buf, on_drop):
        self.buf = buf
        self.on_drop = on_drop

    cpdef on_finish(self, RequestRecord rec):
        if _line(self.buf, rec, _now()) == 0:
            self.on_drop()


def append_line(LineBuffer buf, RequestRecord rec, double now):
    """Appends the access-log line of `rec` (with its newline) to `buf`; returns its length, or 0
    when the buffer refused it (past its limit: the caller counts a drop)."""
    return _line(buf, rec, now)


# The route's four fields ("ingress_protocol" through "upstream_model") of the last line, as
# written, and the objects they were written from: the names are the config's own str objects,
# the same ones request after request, so a line on the same route copies the fragment instead of
# escaping four strings again (~500 instructions, callgrind). Only str (or None) names are kept.
cdef object _f_ing = None, _f_target = None, _f_lane = None, _f_model = None
cdef bytes _frag = None


cdef inline bint _plain(object v):
    return v is None or type(v) is str


cdef Py_ssize_t _line(LineBuffer buf, RequestRecord rec, double now) except -1:
    global _f_ing, _f_target, _f_lane, _f_model, _frag
    cdef Py_ssize_t n_id, n_ing = 0, n_pool = 0, n_lane = 0, n_model = 0, n_out, n_key, n_group
    cdef Py_ssize_t n_client, n_route
    cdef const char* s_ing = NULL
    cdef const char* s_pool = NULL
    cdef const char* s_lane = NULL
    cdef const char* s_model = NULL
    cdef bytes frag = _frag
    if frag is None or rec.ingress is not _f_ing or rec.target is not _f_target \
            or rec.lane is not _f_lane or rec.model is not _f_model:
        frag = None
    # Each field held in a local while its UTF-8 pointer is used.
    f_id = _s(rec.request_id)
    f_ing = f_pool = f_lane = f_model = None
    if frag is None:
        f_ing = _s(rec.ingress)
        f_pool = _s(rec.target or "unresolved")
        f_lane = _s(rec.lane)
        f_model = _s(rec.model)
        s_ing = _utf8(f_ing, &n_ing)
        s_pool = _utf8(f_pool, &n_pool)
        s_lane = _utf8(f_lane, &n_lane)
        s_model = _utf8(f_model, &n_model)
        n_route = 6 * (n_ing + n_pool + n_lane + n_model)
    else:
        n_route = PyBytes_GET_SIZE(frag)
    f_out = _s(rec.outcome)
    f_key = _s(rec.key_id)
    f_group = _s(rec.group)
    f_client = _s(rec.client)
    # A pool with hooks: its gates' decisions and the time the request waited for them.
    f_hooks = rec.hooks
    cdef Py_ssize_t n_hooks = 0
    cdef const char* s_hooks = NULL
    cdef long long hook_us = rec.hook_ns // 1000
    if f_hooks is not None:
        f_hooks = _s(f_hooks)
        s_hooks = _utf8(f_hooks, &n_hooks)
    cdef const char* s_id = _utf8(f_id, &n_id)
    cdef const char* s_out = _utf8(f_out, &n_out)
    cdef const char* s_key = _utf8(f_key, &n_key)
    cdef const char* s_group = _utf8(f_group, &n_group)
    cdef const char* s_client = _utf8(f_client, &n_client)
    cdef long long status = rec.status
    cdef Py_ssize_t attempts = len(rec.attempts)
    cdef long long busbar_us = (<long long>rec.busbar_ns) // 1000
    cdef long long up_us = (<long long>rec.upstream_ns) // 1000
    u = rec.usage
    cdef Usage usage = <Usage>u if isinstance(u, Usage) else None
    cdef long long sec = <long long>now
    cdef int ms = <int>((now - sec) * 1000)
    if sec != _second:
        _second_of(sec)
    if buf.size[buf.active] > buf.limit:
        return 0
    cdef Py_ssize_t bound = FIXED + _second_len + n_route + 6 * (n_id + n_out + n_key + n_group +
                                                                 n_client + n_hooks)
    cdef char* base = buf.reserve(bound)
    cdef char* p = base
    cdef char* q
    p = BB_LIT(p, b'{"time":"')
    p = _lit(p, _second_text, _second_len)
    p[0] = <char>(48 + ms // 100)
    p[1] = <char>(48 + ms // 10 % 10)
    p[2] = <char>(48 + ms % 10)
    p = BB_LIT(p + 3, b'Z","request_id":')
    p = _field(p, s_id, n_id)
    if frag is not None:
        p = _lit(p, PyBytes_AS_STRING(frag), n_route)
    else:
        q = p
        p = BB_LIT(p, b',"ingress_protocol":')
        p = _field(p, s_ing, n_ing)
        p = BB_LIT(p, b',"pool":')
        p = _field(p, s_pool, n_pool)
        p = BB_LIT(p, b',"lane":')
        p = _field(p, s_lane, n_lane)
        p = BB_LIT(p, b',"upstream_model":')
        p = _field(p, s_model, n_model)
        if _plain(rec.ingress) and _plain(rec.target) and _plain(rec.lane) and _plain(rec.model):
            _frag = PyBytes_FromStringAndSize(q, p - q)
            _f_ing, _f_target, _f_lane, _f_model = rec.ingress, rec.target, rec.lane, rec.model
        else:
            _frag = None
    p = BB_LIT(p, b',"status":')
    p = _int(p, status)
    p = BB_LIT(p, b',"outcome":')
    p = _field(p, s_out, n_out)
    p = BB_LIT(p, b',"attempts":')
    p = _int(p, attempts)
    p = BB_LIT(p, b',"busbar_us":')
    p = _int(p, busbar_us)
    p = BB_LIT(p, b',"upstream_ms":')
    p = _int(p, up_us // 1000)
    p[0] = b'.'
    p[1] = <char>(48 + up_us // 100 % 10)
    p[2] = <char>(48 + up_us // 10 % 10)
    p[3] = <char>(48 + up_us % 10)
    p += 4
    if usage is not None:
        p = BB_LIT(p, b',"input_tokens":')
        p = _int(p, usage.input_tokens)
        p = BB_LIT(p, b',"output_tokens":')
        p = _int(p, usage.output_tokens)
        p = BB_LIT(p, b',"cached_tokens":')
        p = _int(p, usage.cache_read_tokens)
    elif u is None:
        p = BB_LIT(p, b',"input_tokens":null,"output_tokens":null,"cached_tokens":null')
    else:
        p = BB_LIT(p, b',"input_tokens":')
        p = _opt_int(p, u.input_tokens)
        p = BB_LIT(p, b',"output_tokens":')
        p = _opt_int(p, u.output_tokens)
        p = BB_LIT(p, b',"cached_tokens":')
        p = _opt_int(p, u.cache_read_tokens)
    p = BB_LIT(p, b',"key_id":')
    p = _field(p, s_key, n_key)
    p = BB_LIT(p, b',"group":')
    p = _field(p, s_group, n_group)
    p = BB_LIT(p, b',"client":')
    p = _field(p, s_client, n_client)
    if s_hooks != NULL:
        p = BB_LIT(p, b',"hooks":')
        p = _field(p, s_hooks, n_hooks)
        p = BB_LIT(p, b',"hook_ms":')
        p = _int(p, hook_us // 1000)
        p[0] = b'.'
        p[1] = <char>(48 + hook_us // 100 % 10)
        p[2] = <char>(48 + hook_us // 10 % 10)
        p[3] = <char>(48 + hook_us % 10)
        p += 4
    p = BB_LIT(p, b'}\n')
    cdef Py_ssize_t n = p - base
    buf.commit(n)
    return n
