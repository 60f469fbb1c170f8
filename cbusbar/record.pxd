# cython: language_level=3
"""The request record (busbar/engine/records.py re-exports it): typed slots, so the C consumers at
the request's end (cbusbar/accesslog.pyx, cbusbar/metrics.pyx) read them without an attribute
lookup each."""

cdef class RequestRecord:
    cdef public object request_id
    cdef public object ingress          # the ingress protocol's name, or None
    cdef public object egress           # the last attempt's lane protocol, or None
    cdef public object target           # the pool or model name asked for, or None
    cdef public object lane             # the last attempt's lane (model) name, or None
    cdef public object model            # the last attempt's upstream model, or None
    cdef public bint stream
    cdef public long long status        # what the client was answered (0: nothing)
    cdef public object outcome          # records.O_*
    cdef public object attempts         # tuple of records.Attempt
    cdef public object usage            # an ir.Usage, or None when the answer carried none
    cdef public long long t0            # perf_counter_ns at the request's start and end
    cdef public long long t_end
    cdef public long long busbar_ns
    cdef public long long upstream_ns
    cdef public long long bytes_out
    cdef public object client           # the peer address
    cdef public object key_id           # governance: the virtual key's id (never its token)
    cdef public object group
    cdef public object denied           # governance: the gate that refused it (observability GATES)
    cdef public int failed              # how many of the attempts ended with a fault
    cdef public object hooks            # the pool's gates' decisions ("name:outcome,..."), or None
    cdef public long long hook_ns       # the time the request waited for its gates


cdef class RecordHook:
    """A finish hook written in C: the exchange calls `on_finish` through the vtable (no Python
    call, no argument parsing); any other callable in the hook list is called as a function."""
    cpdef on_finish(self, RequestRecord rec)


cdef class AttemptHook:
    """An attempt hook written in C: the exchange calls `on_attempt(exchange, attempt)` through the
    vtable; any other callable in the attempt hook list is called as a function."""
    cpdef on_attempt(self, ex, a)


cdef class FaultsOnly(AttemptHook):
    cdef object fn


cpdef RequestRecord record_at(outcome, request_id, ingress, target, list atts, lane,
                              long long upstream_ns, int failed, bint stream, long long status,
                              usage, long long t0, long long t_end, long long bytes_out, client,
                              key, denied)
