# cython: language_level=3
"""Random ids for the codecs (message, response, tool-call and request ids), without a system call
each: random bytes come from a per-process pool of 4 KiB filled by os.urandom, and are encoded in
C. Measured with callgrind on a small Anthropic -> OpenAI request, Anthropic's mint_id (os.urandom
per id, a Python list of characters) was ~7k instructions of the request's ~204k.

A forked child empties its pool (os.register_at_fork), so two workers never hand out the same
bytes. The ids name things; none of them is a secret, but the bytes are the kernel's CSPRNG's all
the same.
"""
import os

from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.string cimport memcpy

cdef enum:
    POOL = 4096

cdef unsigned char _pool[POOL]
cdef int _pos = POOL
cdef const char* B62 = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
cdef const char* HEX = b"0123456789abcdef"
cdef const char* URLSAFE = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


# request_id(): "req_" + 16 hex of a per-process prefix + 8 hex of a counter (28 characters).
cdef char _rid[28]
cdef bint _rid_ready = False
cdef unsigned int _rid_n = 0


def _forget():
    """After a fork: the child must not hand out the bytes its parent will, nor its request ids."""
    global _pos, _rid_ready, _rid_n
    _pos = POOL
    _rid_ready = False
    _rid_n = 0


os.register_at_fork(after_in_child=_forget)


cdef unsigned char _byte() except? 0:
    global _pos
    cdef bytes b
    if _pos >= POOL:
        b = os.urandom(POOL)
        memcpy(_pool, <const char*>b, POOL)
        _pos = 0
    _pos += 1
    return _pool[_pos - 1]


cpdef str b62(int n):
    """n base62 characters, each equally likely (bytes from 248 up are skipped: 248 = 4 * 62)."""
    cdef char buf[128]
    cdef int i = 0
    cdef unsigned char c
    if n < 0 or n > 128:
        raise ValueError(n)
    while i < n:
        c = _byte()
        if c < 248:
            buf[i] = B62[c % 62]
            i += 1
    return PyUnicode_DecodeASCII(buf, n, NULL)


cpdef str hex_id(int nbytes):
    """nbytes random bytes in lowercase hex (as bytes.hex())."""
    cdef char buf[128]
    cdef int i
    cdef unsigned char c
    if nbytes < 0 or nbytes > 64:
        raise ValueError(nbytes)
    for i in range(nbytes):
        c = _byte()
        buf[2 * i] = HEX[c >> 4]
        buf[2 * i + 1] = HEX[c & 15]
    return PyUnicode_DecodeASCII(buf, 2 * nbytes, NULL)


cpdef str uuid4():
    """A random (version 4, RFC 4122 variant) UUID in its canonical 36-character form."""
    cdef unsigned char u[16]
    cdef char buf[36]
    cdef int i, j = 0
    for i in range(16):
        u[i] = _byte()
    u[6] = (u[6] & 0x0F) | 0x40
    u[8] = (u[8] & 0x3F) | 0x80
    for i in range(16):
        if i == 4 or i == 6 or i == 8 or i == 10:
            buf[j] = 45     # '-'
            j += 1
        buf[j] = HEX[u[i] >> 4]
        buf[j + 1] = HEX[u[i] & 15]
        j += 2
    return PyUnicode_DecodeASCII(buf, 36, NULL)


cpdef str urlsafe(int nbytes):
    """nbytes random bytes in URL-safe base64 without padding (as secrets.token_urlsafe)."""
    cdef unsigned char raw[64]
    cdef char buf[88]
    cdef int i, j = 0, k
    cdef unsigned int v
    if nbytes < 0 or nbytes > 64:
        raise ValueError(nbytes)
    for i in range(nbytes):
        raw[i] = _byte()
    i = 0
    while i + 3 <= nbytes:
        v = (raw[i] << 16) | (raw[i + 1] << 8) | raw[i + 2]
        buf[j] = URLSAFE[(v >> 18) & 63]
        buf[j + 1] = URLSAFE[(v >> 12) & 63]
        buf[j + 2] = URLSAFE[(v >> 6) & 63]
        buf[j + 3] = URLSAFE[v & 63]
        j += 4
        i += 3
    k = nbytes - i
    if k == 1:
        v = raw[i] << 16
        buf[j] = URLSAFE[(v >> 18) & 63]
        buf[j + 1] = URLSAFE[(v >> 12) & 63]
        j += 2
    elif k == 2:
        v = (raw[i] << 16) | (raw[i + 1] << 8)
        buf[j] = URLSAFE[(v >> 18) & 63]
        buf[j + 1] = URLSAFE[(v >> 12) & 63]
        buf[j + 2] = URLSAFE[(v >> 6) & 63]
        j += 3
    return PyUnicode_DecodeASCII(buf, j, NULL)


cpdef str request_id():
    """A request id: 8 random bytes per process (drawn again in a forked child, so ids never repeat
    across workers) then a counter, in hex: "req_" + 24 hex digits. No system call and no string
    formatting per id (the Python "%s%08x" it replaces was ~3k instructions a request)."""
    global _rid_ready, _rid_n
    cdef int i
    cdef unsigned char c
    cdef unsigned int n
    if not _rid_ready:
        memcpy(_rid, b"req_", 4)
        for i in range(8):
            c = _byte()
            _rid[4 + 2 * i] = HEX[c >> 4]
            _rid[5 + 2 * i] = HEX[c & 15]
        _rid_ready = True
    _rid_n += 1
    n = _rid_n
    for i in range(8):
        _rid[27 - i] = HEX[n & 15]
        n >>= 4
    return PyUnicode_DecodeASCII(_rid, 28, NULL)
