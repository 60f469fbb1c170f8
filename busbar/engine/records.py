# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""What the two exits of the lifecycle hand on: one `Attempt` per upstream attempt (from
`Exchange.end_attempt`) and one `RequestRecord` per request (from `Exchange.finish`).

Everything that happens at the end of an attempt (circuit breaker, per-lane metrics, attempt spans)
or of a request (budget settlement, access log, request-log sinks, counters, the request span)
hangs off these two objects, through the hooks of the site that served the request, so it is
written once. `Attempt` is a compiled class with typed members (records.pxd; the exchange fills
it as the attempt goes); `RequestRecord` is a cdef class with typed slots, built in C from the exchange by `record_at`
(cbusbar/record.pyx), which the C hooks (access log, metrics) read without attribute lookups."""
from __future__ import annotations

from cbusbar.record import RequestRecord, record_at, record_of  # noqa: F401  (re-exported)

# Attempt.fault: what ended an attempt. None = the upstream answered and the answer was read whole.
F_CONNECT = "connect"           # refused, unreachable, TLS failure, connect timeout
F_CREDENTIALS = "credentials"   # the provider's refreshed credentials have not arrived (yet)
F_TIMEOUT = "timeout"           # the attempt's deadline passed (headers, error body, stalled body)
F_RESET = "reset"               # the connection closed or reset before the response ended
F_PROTOCOL = "protocol"         # not HTTP/1.1 we accept: garbage status line, 101 upgrade
F_STATUS = "status"             # a non-2xx status (Attempt.status says which)
F_MALFORMED = "malformed"       # a 2xx whose body or frames are not the protocol's (or too large)
F_TRUNCATED = "truncated"       # a 2xx stream that ended without its final event
F_CANCELLED = "cancelled"       # the client went away; the attempt was abandoned
F_REFUSED = "refused"           # the caller's request cannot be written for this lane: not sent
F_INTERNAL = "internal"         # a bug in busbar while handling the answer

# RequestRecord.outcome
O_OK = "ok"                     # a 2xx answer, whole
O_CLIENT_ERROR = "client_error" # busbar refused the request (4xx of its own: parse, unknown model)
O_UPSTREAM_ERROR = "upstream_error"   # the upstream's own non-retryable error, relayed
O_EXHAUSTED = "exhausted"       # every lane failed or none was available
O_BROKEN = "broken"             # the upstream failed after the client had bytes: ended natively
O_CLIENT_GONE = "client_gone"   # the client closed (FIN or RST) before the answer was complete
O_INTERNAL = "internal"         # a bug in busbar: 500 in the caller's shape
O_SHED = "shed"                 # refused by the inbound concurrency cap before routing


class Attempt:
    """One try of one lane. Times are perf_counter_ns; 0 = never reached."""

    def __init__(self, lane, t_start):
        self.lane = lane
        self.t_start = t_start
        self.t_connected = 0
        self.t_headers = 0
        self.t_end = 0
        self.status = 0
        self.fault = None
        self.reason = None
        self.bytes_in = 0
        self.retry_after = None
        # reliability: what the fault means (busbar/engine/classify.py D_*); None on success
        # and for faults that are not the lane's (cancelled, refused, credentials pending).
        self.disposition = None
        # reliability: the error class of a non-2xx answer (classify.py: rate_limit, overloaded,
        # server_error, ...); None for every other ending.
        self.error_class = None

    @property
    def ok(self) -> bool:
        return self.fault is None

    def __repr__(self):
        return "<Attempt %s status=%d fault=%s %s>" % (
            self.lane.name if self.lane else "-", self.status, self.fault, self.reason or "")


def new_attempt(lane, t_start):
    """Attempt(lane, t_start) as the exchange starts one per attempt (compiled: records.pxd types
    it, the exchange cimports it): the two members stored directly, the rest left at the compiled
    class's zero and None, without the constructor's call through Python."""
    a = Attempt.__new__(Attempt)
    a.lane = lane
    a.t_start = t_start
    return a
