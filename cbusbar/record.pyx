# cython: language_level=3
"""One request, as it ended: `RequestRecord`, and `record_of(exchange, outcome)`, which builds it
from busbar/engine/exchange.py's Exchange at `finish`.

Built in C: the Python `Exchange.record` it replaces made a slotted object with twenty attribute
stores, a loop over the attempts and a handful of int objects, ~5k instructions a request
(callgrind, bench/inproc.py); the hooks then read it back one attribute lookup at a time. Here the
exchange is read once and the record's fields are C slots the C hooks read directly."""
from cpython.list cimport PyList_AsTuple


cdef class RequestRecord:

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


def record_of(ex, outcome):
    """The RequestRecord of an Exchange that just finished (its `t_end` set)."""
    cdef RequestRecord r = RequestRecord.__new__(RequestRecord)
    cdef long long up = 0, t, t_end
    cdef list atts = ex.attempts
    r.request_id = ex.request_id
    r.ingress = ex.proto
    target = ex.target
    r.target = target.name if target is not None else None
    r.attempts = PyList_AsTuple(atts)
    if atts:
        lane = (<object>atts[len(atts) - 1]).lane
        r.lane = lane.name
        model = lane.model
        r.model = model.upstream_model
        r.egress = model.provider.protocol
        for a in atts:
            t = a.t_connected
            if t:
                up += <long long>a.t_end - t
    r.stream = ex.stream
    r.status = ex.client_status
    r.outcome = outcome
    r.usage = ex.usage
    r.t0 = ex.req.t0
    t_end = r.t_end = ex.t_end
    r.upstream_ns = up
    t = t_end - r.t0 - up
    r.busbar_ns = t if t > 0 else 0
    r.bytes_out = ex.bytes_out
    r.client = getattr(ex.conn, "peer", None)
    key = ex.principal
    if key is not None:
        r.key_id = key.id
        r.group = key.group
    r.denied = ex.denied
    return r
