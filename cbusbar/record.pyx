# cython: language_level=3
"""One request, as it ended: `RequestRecord`, and `record_at(outcome, fields...)`, which builds it
from busbar/engine/exchange.py's Exchange at `finish` (a C call; `record_of(exchange, outcome)`
reads the same fields from any exchange-shaped object). `RecordHook` and `AttemptHook`: the base
classes of hooks written in C, which the compiled exchange calls through their vtables instead of
as Python callables.

Built in C: the Python `Exchange.record` it replaces made a slotted object with twenty attribute
stores, a loop over the attempts and a handful of int objects, ~5k instructions a request
(callgrind, bench/inproc.py); the hooks then read it back one attribute lookup at a time. Here the
exchange is read once and the record's fields are C slots the C hooks read directly."""
cimport cython
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_AsTuple
from cpython.object cimport PyObject, PyTypeObject, Py_TYPE

cdef extern from *:
    """
    #include <structmember.h>
    /* The byte offset of a __slots__ member within its instances, from the class's member
       descriptor; -1 when `d` is not an object slot. What CPython's own LOAD_ATTR_SLOT reads. */
    static Py_ssize_t bb_slot_offset(PyObject *d) {
        if (Py_TYPE(d) != &PyMemberDescr_Type) return -1;
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) return -1;
        return m->offset;
    }
    static inline PyObject *bb_slot(PyObject *o, Py_ssize_t off) {
        return *(PyObject **)((char *)o + off);
    }
    """
    Py_ssize_t bb_slot_offset(object d)
    PyObject* bb_slot(object o, Py_ssize_t off)

DEF MAX_SLOTS = 16


cdef class SlotReader:
    """Reads the named __slots__ members of instances of exactly `tp` at their offsets (as
    CPython's LOAD_ATTR_SLOT does), instead of a getattr each (~150 instructions: the type's
    method cache, the descriptor, its getter); anything else, an unset slot included, through
    getattr."""
    cdef PyTypeObject* tp
    cdef object tp_ref
    cdef tuple names
    cdef Py_ssize_t off[MAX_SLOTS]

    def __init__(self, type tp, tuple names):
        cdef int i
        if len(names) > MAX_SLOTS:
            raise ValueError("too many slots")
        self.tp_ref = tp
        self.tp = <PyTypeObject*>tp
        self.names = names
        for i, name in enumerate(names):
            self.off[i] = bb_slot_offset(getattr(tp, name, None))

    cdef inline object get(self, obj, int i):
        cdef PyObject* v
        if Py_TYPE(obj) == self.tp and self.off[i] >= 0:
            v = bb_slot(obj, self.off[i])
            if v != NULL:
                return <object>v
        return getattr(obj, self.names[i])


# Exchange fields record_of reads (by index below), and an Attempt's.
_EX_FIELDS = ("request_id", "proto", "target", "attempts", "stream", "client_status", "usage",
              "req", "t_end", "bytes_out", "conn", "principal", "denied")
_ATT_FIELDS = ("lane", "t_connected", "t_end", "fault")
_ONE = ("name",)
_T0 = ("t0",)
cdef SlotReader _ex = None
cdef SlotReader _att = None
cdef SlotReader _target = None      # Target.name
cdef SlotReader _req = None         # Request.t0
# lane -> (its name, upstream model, provider protocol): a Lane's model never changes (a reload
# that changes a model makes a new Lane), so the three lookups through Model and Provider objects
# (plain attributes, ~150 instructions each) are made once per lane. Bounded: cleared when full.
cdef dict _lanes = {}
DEF LANES_MAX = 4096


cdef SlotReader _slots_of(SlotReader cur, obj, tuple names):
    if cur is not None and Py_TYPE(obj) == cur.tp:
        return cur
    return SlotReader(type(obj), names)


@cython.freelist(16)
cdef class RequestRecord:
    """(A free list of 16: one record lives per request, from `finish` to its last hook; reusing
    the memory saves the allocator's work on each, ~200 instructions.)"""

    def __init__(self):
        self.attempts = ()

    def as_dict(self) -> dict:
        u = self.usage
        return {
            "request_id": self.request_id, "ingress": self.ingress, "egress": self.egress,
            "target": self.target, "lane": self.lane, "model": self.model, "stream": self.stream,
            "status": self.status, "outcome": self.outcome,
            "attempts": [{"lane": a.lane.name if a.lane else None, "status": a.status,
                          "fault": a.fault, "reason": a.reason} for a in self.attempts],
            "usage": None if u is None else {
                "input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                "cache_read_tokens": u.cache_read_tokens, "cache_write_tokens": u.cache_write_tokens,
                "reasoning_tokens": u.reasoning_tokens},
            "busbar_us": self.busbar_ns // 1000, "upstream_us": self.upstream_ns // 1000,
        }

    def __repr__(self):
        return "<RequestRecord %s %s %s/%s %d %s>" % (self.request_id, self.ingress, self.target,
                                                      self.lane, self.status, self.outcome)


cdef class RecordHook:

    cpdef on_finish(self, RequestRecord rec):
        raise NotImplementedError

    def __call__(self, RequestRecord rec):
        """A hook list also holds plain callables: this one is called like them where the caller is
        not the compiled exchange."""
        return self.on_finish(rec)


cdef class AttemptHook:

    cpdef on_attempt(self, ex, a):
        raise NotImplementedError

    def __call__(self, ex, a):
        return self.on_attempt(ex, a)


cdef class FaultsOnly(AttemptHook):
    """`fn(exchange, attempt)` for the attempts that ended with a fault only: an observer of
    failures (busbar/observability/events.py LaneEvents) costs a successful attempt one attribute
    read in C instead of a Python call (~500 instructions, callgrind)."""

    def __init__(self, fn):
        self.fn = fn

    cpdef on_attempt(self, ex, a):
        if a.fault is not None:
            self.fn(ex, a)


def record_of(ex, outcome):
    """The RequestRecord of an Exchange-shaped object that just finished (its `t_end` set), its
    fields, its target's name and its attempts read by slot or attribute (the compiled Exchange
    reads them itself, typed, and calls `record_at`)."""
    global _ex, _req, _att, _target
    cdef SlotReader X = _slots_of(_ex, ex, _EX_FIELDS)
    cdef SlotReader A
    cdef long long up = 0, t
    cdef int failed = 0
    _ex = X
    req = X.get(ex, 7)
    _req = _slots_of(_req, req, _T0)
    target = X.get(ex, 2)
    name = lane = None
    if target is not None:
        _target = _slots_of(_target, target, _ONE)
        name = _target.get(target, 0)
    atts = X.get(ex, 3)
    if atts:
        A = _slots_of(_att, atts[0], _ATT_FIELDS)
        _att = A
        lane = A.get(atts[len(atts) - 1], 0)
        for a in atts:
            t = A.get(a, 1)
            if t:
                up += <long long>A.get(a, 2) - t
            if A.get(a, 3) is not None:
                failed += 1
    return record_at(outcome, X.get(ex, 0), X.get(ex, 1), name, atts, lane, up, failed,
                     X.get(ex, 4), X.get(ex, 5), X.get(ex, 6), _req.get(req, 0), X.get(ex, 8),
                     X.get(ex, 9), getattr(X.get(ex, 10), "peer", None), X.get(ex, 11),
                     X.get(ex, 12))


cpdef RequestRecord record_at(outcome, request_id, ingress, target, list atts, lane,
                              long long upstream_ns, int failed, bint stream, long long status,
                              usage, long long t0, long long t_end, long long bytes_out, client,
                              key, denied):
    """The RequestRecord from fields the caller has already read: `target` the pool's name (or
    None), `lane` the last attempt's Lane (or None), `upstream_ns` the attempts' upstream time,
    `failed` how many ended with a fault. The compiled exchange calls this directly (C call), its
    typed Attempts read as struct members."""
    cdef PyObject* hit
    cdef RequestRecord r = RequestRecord.__new__(RequestRecord)
    cdef long long t
    r.request_id = request_id
    r.ingress = ingress
    r.target = target
    r.attempts = PyList_AsTuple(atts)
    if lane is not None:
        hit = PyDict_GetItem(_lanes, lane)
        if hit == NULL:
            model = lane.model
            names = (lane.name, model.upstream_model, model.provider.protocol)
            if len(_lanes) >= LANES_MAX:
                _lanes.clear()
            _lanes[lane] = names
        else:
            names = <tuple>hit
        r.lane, r.model, r.egress = names
    r.failed = failed
    r.stream = stream
    r.status = status
    r.outcome = outcome
    r.usage = usage
    r.t0 = t0
    r.t_end = t_end
    r.upstream_ns = upstream_ns
    t = t_end - t0 - upstream_ns
    r.busbar_ns = t if t > 0 else 0
    r.bytes_out = bytes_out
    r.client = client
    if key is not None:
        r.key_id = key.id
        r.group = key.group
    r.denied = denied
    return r
