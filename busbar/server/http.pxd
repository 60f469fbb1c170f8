# Typed layout of busbar/server/http.py's per-connection and per-request classes when compiled
# (Cython's augmenting .pxd: the .py stays the source). Every member stays readable and writable
# from Python (`public`); the methods a request passes through are C calls between these classes.

from busbar.engine.deadlines cimport Deadlines, Timed
from busbar.engine.request cimport Request, new_request
from cbusbar.clock cimport now_ns
from cbusbar.h1 cimport parse_request as _fast_parse

cdef class BodyBudget:
    cdef public object site
    cdef public long long held, partial, peak
    cdef public bint closed
    cdef public dict waiting
    cdef public object runner
    cpdef take(self, HttpConnection conn, long long n, bint partial)
    cpdef complete(self, HttpConnection conn)
    cpdef give(self, HttpConnection conn, long long n)
    cpdef drop(self, HttpConnection conn)
    cpdef wait(self, HttpConnection conn)
    cpdef _close(self)
    cpdef _settle(self)

cdef class HttpConnection(Timed):
    cdef public object site, limits, transport, peer, parser
    cdef public list queue
    cdef public object exchange
    cdef public bint closed
    cdef public int _pause
    cdef public long long t_recv
    cdef public object _url, _headers
    cdef public Py_ssize_t _hbytes, _hcount
    cdef public object _body
    cdef public Py_ssize_t _blen
    cdef public long long _t0
    cdef public bint _in_message
    cdef public Deadlines _deadlines
    cdef public double _timer, _rearm
    cdef public BodyBudget _budget
    cdef public long long _held, _partial, _ex_bytes
    cpdef data_received(self, data)
    cpdef on_deadline(self)
    cpdef _deliver(self, req)
    cpdef _start(self, req)
    cpdef exchange_done(self, bint keep_alive)
    cpdef write(self, data)
    cpdef _hold(self, int why)
    cpdef _unhold(self, int why)
    cpdef _arm(self, double secs)
    cpdef _disarm(self)
