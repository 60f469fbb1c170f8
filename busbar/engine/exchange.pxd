# Typed layout of busbar/engine/exchange.py's Exchange when compiled (Cython's augmenting .pxd: the
# .py stays the source and runs as plain Python when not compiled). The exchange's own attribute
# reads and writes become struct accesses instead of slot descriptors; every member stays readable
# and writable from Python (`public`).

cimport cython

from busbar.engine.deadlines cimport Deadlines, Timed
from busbar.engine.egress cimport Egress
from busbar.engine.modes cimport Mode
from busbar.engine.route cimport Route
from busbar.engine.snapshot cimport Snapshot
from busbar.engine.records cimport Attempt, new_attempt
from busbar.routing.swrr cimport Lane, Target
from busbar.engine.request cimport Request
from busbar.upstream.pool cimport UpstreamConnection, UpstreamPool
from cbusbar.framing cimport scan_top
from busbar.engine.translate cimport forwarded, with_model
from busbar.engine.status cimport header, status_line
from cbusbar.clock cimport now_ns
from cbusbar.h1 cimport response_head, server_timing
from cbusbar.record cimport AttemptHook, RecordHook, RequestRecord, record_at

# The Route kinds the exchange compares (busbar/engine/route.py), as C ints: imported once, then a
# compare per request is an int compare instead of a Python one.
cdef int CHAT, COUNT_TOKENS, EMBED, LOCAL
# The deadline's phases, and the response modes (busbar/engine/modes.py: one instance each), as
# typed module globals: a C read, no module dict lookup.
cdef int D_ATTEMPT, D_ERROR_BODY, D_STREAMING
cdef Mode ERROR_BODY, BUFFER, TRANSLATE, RELAY, TRANSLATE_STREAM

cdef class Exchange(Timed):
    cdef public object site, conn
    cdef public Request req
    cdef public Route route
    cdef public Snapshot snap
    cdef public object proto, ingress, name
    cdef public Target target
    cdef public bint stream
    cdef public object cr
    cdef public set tried
    cdef public list attempts
    cdef public Attempt att
    cdef public Lane lane
    cdef public Egress egress
    cdef public object codec
    cdef public bint same
    cdef public UpstreamPool pool   # the site's upstream pool
    cdef public UpstreamConnection upconn
    cdef public object data
    cdef public long long t_send, rtt
    cdef public Mode mode
    cdef public object chunks
    cdef public Py_ssize_t size
    cdef public object tx, tap
    cdef public bint tap_error
    cdef public object forced
    cdef public bint sent
    cdef public object pending
    cdef public Deadlines wheel     # the site's deadline wheel
    cdef public int status
    cdef public object up_headers, last_error
    cdef public bint closed
    cdef public object model_span, request_id, last_model, usage
    cdef public int client_status
    cdef public long long bytes_out, t_end
    cdef public object op
    cdef public int fallbacks
    cdef public object principal, ticket, denied, spans, relay, queued
    cdef public object routing      # busbar/routing/plan.py Run: a pool with a plan, or hooks
    cdef public object downgraded   # pools a budget's on_exhaust: downgrade moved it to (gate.py)

    # The request's steps: called from each other as C calls, and from Python (the connection,
    # the pool, the deadline sweep, the gate) through their Python wrappers.
    cdef _setup(self, site, conn, Request req, Route route, Snapshot snap)

    @cython.locals(route=Route)
    cpdef start(self)
    cpdef on_deadline(self)

    @cython.locals(route=Route, req=Request)
    cpdef chat(self)

    @cython.locals(target=Target)
    cpdef routed(self)

    @cython.locals(snap=Snapshot, eg=Egress, target=Target)
    cpdef attempt(self, lane=*)

    # C only (final: no override, called directly)
    @cython.final
    @cython.locals(t=cython.double, elapsed=cython.double, left=cython.double)
    cdef int deadline(self, int phase) except -1

    @cython.locals(att=Attempt)
    cpdef _on_conn(self, UpstreamConnection conn)

    @cython.locals(a=Attempt, ah=AttemptHook)
    cpdef end_attempt(self, fault, reason=*)
    cpdef fault(self, fault, reason)

    @cython.locals(att=Attempt, m=Mode)
    cpdef on_upstream_headers(self, int status, headers)

    @cython.locals(m=Mode)
    cpdef on_upstream_body(self, chunk)
    cpdef bint _collect(self, chunk, Py_ssize_t cap) except -1

    @cython.locals(m=Mode)
    cpdef on_upstream_complete(self)
    cpdef status_error(self, body)
    cpdef truncated(self)

    @cython.locals(m=Mode)
    cpdef broken(self, fault, kind, message)
    cpdef rid(self)
    cpdef bytes _timing(self)
    cpdef head(self, int status, ctype, Py_ssize_t length, extra=*)
    cpdef head_chunked(self, int status, ctype, extra=*)

    @cython.locals(m=Mode)
    cpdef _w(self, data)
    cpdef chunk(self, data)
    cpdef end_chunks(self, outcome)
    cpdef answer(self, ctype, body, extra)
    cpdef respond(self, int status, ctype, body, extra=*, outcome=*)
    cpdef error(self, int status, kind, message, retry_after=*, outcome=*, extra=*)

    @cython.locals(a=Attempt, up=cython.longlong, failed=cython.int, rec=RequestRecord,
                   ch=RecordHook, target=Target)
    cpdef finish(self, outcome, bint keep_alive=*)


@cython.locals(ex=Exchange)
cpdef Exchange new_exchange(site, conn, req, route)
