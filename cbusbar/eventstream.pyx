# cython: language_level=3
"""AWS event stream framing (declared in eventstream.pxd): the frame reader behind Bedrock's
ConverseStream decoder and the frame writer behind its encoder. Sans-IO: bytes in, frames out.

Wire format (botocore/eventstream.py is the reference reader):
    prelude   total_length u32 BE | headers_length u32 BE | CRC32(the 8 bytes before) u32 BE
    headers   repeated: name_len u8 | name utf-8 | type u8 | value
    payload   total_length - headers_length - 16 bytes
    trailer   CRC32(every byte of the frame before it) u32 BE
Header value types: 0 true, 1 false (no bytes), 2 int8, 3 int16, 4 int32, 5 int64 (BE),
6 bytes and 7 utf-8 string (u16 BE length + bytes), 8 timestamp (int64 ms), 9 uuid (16 bytes).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

# The prelude, and the smallest frame: a prelude and a trailing CRC with no headers and no payload.
cdef Py_ssize_t PRELUDE = 12
cdef Py_ssize_t MIN_FRAME = 16
# Largest frame accepted. Bedrock frames are a few hundred bytes (one token delta each); botocore
# bounds a payload at 24 MiB. 16 MiB is the cap busbar uses for one SSE event too (framing.pyx),
# so a hostile upstream can make busbar buffer at most that much per stream.
cdef Py_ssize_t MAX_FRAME = 16 * 1024 * 1024
# Same header-block cap as botocore (_MAX_HEADERS_LENGTH, 128 KiB); real frames carry ~80 bytes.
cdef Py_ssize_t MAX_HEADERS = 128 * 1024
# Below this many bytes the table CRC beats a call into zlib.crc32 (the ~60 ns of a Python call
# outweighs the arithmetic); above it zlib's CRC wins. Measured (both through a Python call):
# 64 B 87 vs 178 ns, 200 B 153 vs 162 ns, 512 B 319 vs 297 ns, 4 KiB 1.9 vs 1.1 us. Bedrock delta
# frames are 100-300 bytes, so the hot path never leaves C.
cdef Py_ssize_t ZLIB_CRC_FROM = 512


class EventStreamError(ValueError):
    """A frame that is not a valid AWS event stream frame (bad CRC, length or header)."""


# ---------------------------------------------------------------------------------------------
# CRC32 (IEEE 802.3, the polynomial zlib and botocore use), slicing-by-8 over a 8 KiB table.

cdef uint32_t CRC_TABLE[8][256]


cdef void _crc_tables() noexcept:
    cdef uint32_t c
    cdef int i, j, _bit
    for i in range(256):
        c = <uint32_t>i
        for _bit in range(8):
            c = (c >> 1) ^ (0xEDB88320 if c & 1 else 0)
        CRC_TABLE[0][i] = c
    for i in range(256):
        c = CRC_TABLE[0][i]
        for j in range(1, 8):
            c = CRC_TABLE[0][c & 0xFF] ^ (c >> 8)
            CRC_TABLE[j][i] = c


_crc_tables()

import zlib
cdef object _zlib_crc32 = zlib.crc32


cdef uint32_t crc32_update(uint32_t crc, const unsigned char* p, Py_ssize_t n) noexcept nogil:
    cdef uint32_t one, two
    crc = ~crc
    while n >= 8:
        one = (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
               | (<uint32_t>p[3] << 24)) ^ crc
        two = <uint32_t>p[4] | (<uint32_t>p[5] << 8) | (<uint32_t>p[6] << 16) | (<uint32_t>p[7] << 24)
        crc = (CRC_TABLE[7][one & 0xFF] ^ CRC_TABLE[6][(one >> 8) & 0xFF]
               ^ CRC_TABLE[5][(one >> 16) & 0xFF] ^ CRC_TABLE[4][one >> 24]
               ^ CRC_TABLE[3][two & 0xFF] ^ CRC_TABLE[2][(two >> 8) & 0xFF]
               ^ CRC_TABLE[1][(two >> 16) & 0xFF] ^ CRC_TABLE[0][two >> 24])
        p += 8
        n -= 8
    while n > 0:
        crc = CRC_TABLE[0][(crc ^ p[0]) & 0xFF] ^ (crc >> 8)
        p += 1
        n -= 1
    return ~crc


cdef uint32_t _crc(uint32_t crc, const unsigned char* p, Py_ssize_t n):
    if n < ZLIB_CRC_FROM:
        return crc32_update(crc, p, n)
    return <uint32_t>_zlib_crc32(PyBytes_FromStringAndSize(<const char*>p, n), crc)


def crc32(bytes data, unsigned int crc=0):
    """CRC32 of data, continuing from crc (the same value as zlib.crc32)."""
    return _crc(crc, <const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data))


# ---------------------------------------------------------------------------------------------
# Reading


cdef inline uint32_t _be32(const unsigned char* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline uint64_t _be64(const unsigned char* p) noexcept nogil:
    return (<uint64_t>_be32(p) << 32) | <uint64_t>_be32(p + 4)


cdef dict _read_headers(const unsigned char* p, Py_ssize_t n):
    cdef dict out = {}
    cdef Py_ssize_t i = 0, ln
    cdef unsigned char kind
    cdef object name, value
    while i < n:
        ln = p[i]
        i += 1
        if i + ln >= n:  # the name and at least the type byte must fit
            raise EventStreamError("event stream header overruns its block")
        try:
            name = (<const char*>p)[i:i + ln].decode("utf-8")
        except UnicodeDecodeError:
            raise EventStreamError("event stream header name is not UTF-8") from None
        i += ln
        kind = p[i]
        i += 1
        if kind == 0 or kind == 1:
            value = kind == 0
        elif kind == 2:
            if i + 1 > n:
                raise EventStreamError("event stream header overruns its block")
            value = <int8_t>p[i]
            i += 1
        elif kind == 3:
            if i + 2 > n:
                raise EventStreamError("event stream header overruns its block")
            value = <int16_t>((<uint16_t>p[i] << 8) | p[i + 1])
            i += 2
        elif kind == 4:
            if i + 4 > n:
                raise EventStreamError("event stream header overruns its block")
            value = <int32_t>_be32(p + i)
            i += 4
        elif kind == 5 or kind == 8:
            if i + 8 > n:
                raise EventStreamError("event stream header overruns its block")
            value = <int64_t>_be64(p + i)
            i += 8
        elif kind == 6 or kind == 7:
            if i + 2 > n:
                raise EventStreamError("event stream header overruns its block")
            ln = (<Py_ssize_t>p[i] << 8) | p[i + 1]
            i += 2
            if i + ln > n:
                raise EventStreamError("event stream header overruns its block")
            value = (<const char*>p)[i:i + ln]
            if kind == 7:
                try:
                    value = value.decode("utf-8")
                except UnicodeDecodeError:
                    raise EventStreamError("event stream header value is not UTF-8") from None
            i += ln
        elif kind == 9:
            if i + 16 > n:
                raise EventStreamError("event stream header overruns its block")
            value = (<const char*>p)[i:i + 16]
            i += 16
        else:
            raise EventStreamError("unknown event stream header type %d" % kind)
        if name in out:
            raise EventStreamError("duplicate event stream header")
        out[name] = value
    return out


cdef class EventStreamParser:
    """Incremental frame reader. feed() returns a list of (headers, payload) pairs: headers a dict
    of name → value (str, bytes, bool or int, as botocore decodes them), payload bytes. Frames may
    be split anywhere across chunks. A bad frame raises EventStreamError, and so does every later
    feed: a framing error leaves no way to find the next frame boundary."""

    def __cinit__(self, Py_ssize_t max_frame=0):
        self.buf = bytearray()
        self.need = 0
        self.failed = False
        # 0 keeps busbar's own cap; the bedrock decoder passes its frame limit (framing.pxd).
        self.max_frame = max_frame if max_frame > 0 else MAX_FRAME

    cpdef Py_ssize_t buffered(self):
        """Bytes of an incomplete frame held back (non-zero at EOF means a truncated stream)."""
        return PyByteArray_GET_SIZE(self.buf)

    cpdef list feed(self, bytes chunk):
        cdef list out = []
        cdef Py_ssize_t n, start = 0, total, hlen
        cdef const unsigned char* p
        cdef uint32_t prelude_crc
        if self.failed:
            raise EventStreamError("event stream is already broken")
        self.buf += chunk
        n = PyByteArray_GET_SIZE(self.buf)
        if n < PRELUDE or n < self.need:
            return out
        try:
            while n - start >= PRELUDE:
                p = <const unsigned char*>PyByteArray_AS_STRING(self.buf) + start
                total = _be32(p)
                hlen = _be32(p + 4)
                prelude_crc = _be32(p + 8)
                if self.need == 0:
                    # Check the prelude once per frame, before its lengths are trusted.
                    if crc32_update(0, p, 8) != prelude_crc:
                        raise EventStreamError("event stream prelude CRC mismatch")
                    if total < MIN_FRAME or total > self.max_frame:
                        raise EventStreamError("event stream frame length %d out of bounds" % total)
                    if hlen > total - MIN_FRAME or hlen > MAX_HEADERS:
                        raise EventStreamError("event stream headers length %d out of bounds" % hlen)
                    self.need = total
                if n - start < total:
                    break
                if _crc(prelude_crc, p + 8, total - 12) != _be32(p + total - 4):
                    raise EventStreamError("event stream message CRC mismatch")
                out.append((_read_headers(p + PRELUDE, hlen),
                            PyBytes_FromStringAndSize(<const char*>p + PRELUDE + hlen,
                                                      total - MIN_FRAME - hlen)))
                start += total
                self.need = 0
        except BaseException:
            self.failed = True
            self.buf = bytearray()
            self.need = 0
            raise
        if start:
            del self.buf[:start]
        return out


# ---------------------------------------------------------------------------------------------
# Writing


cdef inline void _put32(unsigned char* p, uint32_t v) noexcept nogil:
    p[0] = (v >> 24) & 0xFF
    p[1] = (v >> 16) & 0xFF
    p[2] = (v >> 8) & 0xFF
    p[3] = v & 0xFF


cpdef bytes encode_headers(dict headers):
    """The header block of a frame. Values: str (type 7), bytes (6), bool (0/1), int (int32 when
    it fits, else int64). Encoders that send the same headers on every frame build this once."""
    cdef bytearray out = bytearray()
    cdef bytes raw
    cdef Py_ssize_t ln
    for name, value in headers.items():
        if not isinstance(name, str):
            raise EventStreamError("event stream header names are strings")
        raw = (<str>name).encode("utf-8")
        if not 0 < len(raw) <= 255:
            raise EventStreamError("event stream header name must be 1-255 bytes")
        out.append(len(raw))
        out += raw
        if isinstance(value, str) or isinstance(value, bytes):
            raw = (<str>value).encode("utf-8") if isinstance(value, str) else <bytes>value
            ln = len(raw)
            if ln > 0xFFFF:
                raise EventStreamError("event stream header value exceeds 65535 bytes")
            out.append(7 if isinstance(value, str) else 6)
            out.append((ln >> 8) & 0xFF)
            out.append(ln & 0xFF)
            out += raw
        elif isinstance(value, bool):
            out.append(0 if value else 1)
        elif isinstance(value, int):
            if -2**31 <= value < 2**31:
                out.append(4)
                out += value.to_bytes(4, "big", signed=True)
            elif -2**63 <= value < 2**63:
                out.append(5)
                out += value.to_bytes(8, "big", signed=True)
            else:
                raise EventStreamError("event stream integer header out of range")
        else:
            raise EventStreamError("unsupported event stream header value type")
    if len(out) > MAX_HEADERS:
        raise EventStreamError("event stream header block too large")
    return bytes(out)


cpdef bytes encode_frame(bytes header_block, bytes payload):
    """One frame from a header block (encode_headers) and a payload."""
    cdef Py_ssize_t hlen = PyBytes_GET_SIZE(header_block)
    cdef Py_ssize_t plen = PyBytes_GET_SIZE(payload)
    cdef Py_ssize_t total = MIN_FRAME + hlen + plen
    cdef bytes out
    cdef unsigned char* p
    if total > MAX_FRAME:
        raise EventStreamError("event stream frame exceeds the maximum size")
    out = PyBytes_FromStringAndSize(NULL, total)
    p = <unsigned char*>PyBytes_AS_STRING(out)
    _put32(p, <uint32_t>total)
    _put32(p + 4, <uint32_t>hlen)
    _put32(p + 8, crc32_update(0, p, 8))
    memcpy(p + PRELUDE, PyBytes_AS_STRING(header_block), hlen)
    memcpy(p + PRELUDE + hlen, PyBytes_AS_STRING(payload), plen)
    _put32(p + total - 4, _crc(0, p, total - 4))
    return out
