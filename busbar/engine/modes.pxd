# Typed layout of busbar/engine/modes.py when compiled (Cython's augmenting .pxd): the exchange
# calls its mode's steps through the C vtable, and a mode reads and writes the Exchange's members as
# struct fields (exchange.pxd cimports Mode, this cimports Exchange: Cython resolves the cycle).

from cbusbar.clock cimport now_ns

from busbar.engine.exchange cimport Exchange
from busbar.engine.status cimport header

cdef class Mode:
    cdef public bint streams
    cpdef begin(self, Exchange ex, content_type)
    cpdef body(self, Exchange ex, chunk)
    cpdef complete(self, Exchange ex)
    cpdef end_event(self, Exchange ex, kind, message)

cdef class ErrorBody(Mode):
    pass

cdef class Buffer(Mode):
    pass

cdef class Translate(Buffer):
    pass

cdef class Relay(Mode):
    pass

cdef class TranslateStream(Mode):
    pass

cdef _billing_lost(Exchange ex)
cdef _tap_events(Exchange ex, events)
