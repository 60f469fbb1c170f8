# AWS event stream framing (application/vnd.amazon.eventstream), the binary stream of Bedrock's
# ConverseStream. One frame: a 12-byte prelude (total length, headers length, CRC32 of those 8
# bytes), typed headers, the payload, and a CRC32 of everything before it.

from libc.stdint cimport uint32_t


cdef uint32_t crc32_update(uint32_t crc, const unsigned char* p, Py_ssize_t n) noexcept nogil


cdef class EventStreamParser:
    cdef bytearray buf
    cdef Py_ssize_t need          # length of the frame at the head of buf once its prelude is checked
    cdef bint failed              # a bad frame was seen: the stream cannot be resynchronised
    cdef readonly Py_ssize_t max_frame   # largest frame accepted

    cpdef list feed(self, bytes chunk)
    cpdef Py_ssize_t buffered(self)


cpdef bytes encode_headers(dict headers)
cpdef bytes encode_frame(bytes header_block, bytes payload)
