"""What the two exits of the lifecycle hand on: one `Attempt` per upstream attempt (from
`Exchange.end_attempt`) and one `RequestRecord` per request (from `Exchange.finish`).

Everything that happens at the end of an attempt (circuit breaker, per-lane metrics, attempt spans)
or of a request (budget settlement, access log, request-log sinks, counters, the request span)
hangs off these two objects, through the hooks of the site that served the request, so it is
written once. Plain slotted objects: building one costs a few hundred nanoseconds."""
from __future__ import annotations

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

    __slots__ = ("lane", "t_start", "t_connected", "t_headers", "t_end", "status", "fault",
                 "reason", "bytes_in", "retry_after", "disposition")

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
        # reliability: what the fault means (busbar/reliability/classify.py D_*); None on success
        # and for faults that are not the lane's (cancelled, refused, credentials pending).
        self.disposition = None

    @property
    def ok(self) -> bool:
        return self.fault is None

    def __repr__(self):
        return "<Attempt %s status=%d fault=%s %s>" % (
            self.lane.name if self.lane else "-", self.status, self.fault, self.reason or "")


class RequestRecord:
    """One request, as it ended. `usage` is an ir.Usage or None when the answer carried none."""

    __slots__ = ("request_id", "ingress", "egress", "target", "lane", "model", "stream", "status",
                 "outcome", "attempts", "usage", "t0", "t_end", "busbar_ns", "upstream_ns",
                 "bytes_out", "client", "key_id", "group", "denied")

    def __init__(self):
        self.request_id = None
        self.ingress = None
        self.egress = None
        self.target = None
        self.lane = None
        self.model = None
        self.stream = False
        self.status = 0
        self.outcome = None
        self.attempts = ()
        self.usage = None
        self.t0 = 0
        self.t_end = 0
        self.busbar_ns = 0
        self.upstream_ns = 0
        self.bytes_out = 0
        self.client = None
        self.key_id = None      # governance: the virtual key's id (never its token) and group
        self.group = None
        self.denied = None      # governance: the gate that refused it (observability GATES)

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
