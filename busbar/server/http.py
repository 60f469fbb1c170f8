# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""Ingress HTTP/1.1: an asyncio.Protocol driving httptools.HttpRequestParser directly, no framework.

Keep-alive; pipelined requests are queued and answered strictly in order (one exchange at a time per
connection); chunked request bodies; `Expect: 100-continue`. Every limit comes from config `limits:`
and each misbehaving client only ever costs its own connection.

A connection serves a *site*: the object that says what a request is and answers it (the gateway's
data plane, or the admin API on its own listener). A site has `snapshot.limits`, `deadlines`,
`connections` (a set), `draining`, `dispatch(method, path, query, headers) -> Route`,
`new_exchange(conn, req, route)`, `write_error_response(conn, proto, status, kind, message,
keep_alive, t0)` and `bodies`: the worker's BodyBudget (the data plane's), or None.

Request bodies a worker holds are bounded by `limits.inflight_body_bytes` as back-pressure, not as
errors: over it, the worker stops reading from its clients (BodyBudget below), so the kernel's
socket buffers hold what would otherwise grow the heap.

A client that closes its side (FIN) or resets is gone: the exchange in progress is cancelled at once
(its upstream attempt abandoned, its lane freed) and the connection closed; SDKs close that way on a
timeout or a cancel, and an answer nobody reads only holds a permit.
"""
from __future__ import annotations

import operator

import httptools

from busbar.engine.deadlines import Timed
from busbar.engine.request import new_request
from cbusbar.clock import now_ns
from cbusbar.h1 import parse_request as _fast_parse

# Pipelined requests beyond this many waiting on one connection pause reading from it, so a client
# that floods one socket cannot make busbar buffer without bound.
MAX_PIPELINED = 16

# Why a connection's reading is paused; it resumes when no reason is left, so the budget's resume
# never undoes the pipeline's pause, nor the other way round.
_PAUSE_QUEUE = 1        # its own pipelined requests (or a rejected one) wait: MAX_PIPELINED
_PAUSE_BUDGET = 2       # the worker holds more request-body bytes than limits.inflight_body_bytes


_last_read = operator.attrgetter("t_recv")


class BodyBudget:
    """The request-body bytes one worker holds, bounded by `limits.inflight_body_bytes`.

    Counted: the body bytes of every request received and not yet answered (queued pipelined
    requests included), and of bodies being received; a request's bytes are released when its
    exchange is done (`HttpConnection.exchange_done`) or its connection is lost.

    When the count goes over the budget the budget *closes*: every connection of the worker stops
    reading (pause_reading; libuv stops at once, so no other socket is read in the same loop
    turn), new connections start paused, and what clients send waits in the kernel. It *reopens*,
    resuming them all, when the count is back to half the budget: a resume costs a system call per
    connection, and reopening at half spreads that over half a budget of bodies (150 KB bodies in
    a 32 MiB budget: ~110 requests per round) instead of paying it per request.

    Progress: the exchanges in flight release their bytes whatever the clients do. When nothing
    that was received is complete (the count is all partial bodies, or one body larger than the
    budget), one paused connection with a partial body, the *runner*, reads on until its body is
    complete; its exchange then releases the bytes. So a body larger than the budget is served,
    alone, and the count stays within the budget plus one socket read (256 KB with uvloop) plus
    one body.

    A connection accepted while the budget is closed is paused after its first read (uvloop starts
    reading once connection_made has returned, whatever it asked).

    Timeouts: a connection the budget paused has no header-read or idle timer running (busbar
    stopped reading it, not the client); the timer it had restarts when reading resumes. A client
    that closes while paused is seen when reading resumes."""

    def __init__(self, site):
        self.site = site
        self.held = 0           # body bytes received and not yet released
        self.partial = 0        # of which: bodies still being received
        self.peak = 0           # the highest `held` seen (a high-water mark, for sizing the budget)
        self.closed = False
        self.waiting = {}       # connections paused by the budget, in the order they were paused
        self.runner = None      # the connection reading on while closed (see Progress)

    def take(self, conn, n, partial):
        """`conn` received `n` body bytes (`partial`: of a body not yet complete)."""
        conn._held += n
        held = self.held = self.held + n
        if partial:
            conn._partial += n
            self.partial += n
        if held > self.peak:
            self.peak = held
        if not self.closed:
            lim = self.site.snapshot.limits.inflight_body_bytes
            if lim and held > lim:
                self._close()
        elif conn is self.runner:
            # A runner that stops sending is answered 408 after header_read_timeout_secs without
            # a byte, so a stalled body cannot hold the progress slot for good.
            conn._arm(conn.limits.header_read_timeout_secs)

    def complete(self, conn):
        """The body `conn` was receiving is complete: its bytes are now a request's."""
        self.partial -= conn._partial
        conn._partial = 0
        if self.runner is conn:
            self.runner = None
            conn._disarm()
            if self.closed:
                self.wait(conn)

    def give(self, conn, n):
        """A request's `n` bytes are released (its exchange is done)."""
        conn._held -= n
        self.held -= n
        if self.closed:
            self._settle()

    def drop(self, conn):
        """`conn` is lost: everything it held is released."""
        self.held -= conn._held
        self.partial -= conn._partial
        conn._held = conn._partial = 0
        self.waiting.pop(conn, None)
        if self.runner is conn:
            self.runner = None
        if self.closed:
            self._settle()

    def wait(self, conn):
        """Pauses `conn` until the budget reopens."""
        if conn not in self.waiting and not conn.closed:
            self.waiting[conn] = None
            conn._hold(_PAUSE_BUDGET)

    def _close(self):
        self.closed = True
        # Paused, and so resumed, in the order they were last read: libuv reads the sockets that
        # became readable in the order reading resumed, so the connections that waited longest
        # read first at the next reopen, instead of the same ones every round (measured: in the
        # set's fixed order the last few hundred of 1000 connections starved for more than a
        # minute).
        for c in sorted(self.site.connections, key=_last_read):
            self.wait(c)
        self._settle()

    def _settle(self):
        """While closed: reopen at half the budget, else make sure something can progress."""
        lim = self.site.snapshot.limits.inflight_body_bytes
        if not lim or self.held <= lim // 2:
            self.closed = False
            self.runner = None
            waiting, self.waiting = self.waiting, {}
            for c in waiting:
                c._unhold(_PAUSE_BUDGET)
        elif self.runner is None and self.held == self.partial:
            # Nothing complete, so no exchange will release anything: one partial body reads on.
            for c in self.waiting:
                if c._partial and not c._pause & _PAUSE_QUEUE:
                    del self.waiting[c]
                    self.runner = c
                    c._unhold(_PAUSE_BUDGET)
                    c._arm(c.limits.header_read_timeout_secs)
                    break


class _Abort(Exception):
    """Raised from a parser callback to stop parsing: (status, message)."""


class _Rejected:
    """A pipelined request that could not be parsed, queued behind the requests before it: it is
    answered (400, 413, ...) in its turn, and the connection closes after it."""

    __slots__ = ("status", "message")

    def __init__(self, status, message):
        self.status = status
        self.message = message


class HttpConnection(Timed):
    """One client connection: an asyncio.Protocol (by its methods; a compiled class cannot derive
    from the Python one)."""

    def __init__(self, site):
        self.site = site
        self.limits = site.snapshot.limits
        self.transport = None
        self.peer = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue = []
        self.exchange = None
        self.closed = False
        self._pause = 0         # why reading is paused: _PAUSE_QUEUE | _PAUSE_BUDGET
        self.t_recv = 0
        self._url = []
        self._headers = {}
        self._hbytes = 0
        self._hcount = 0
        self._body = []
        self._blen = 0
        self._t0 = 0
        self._in_message = False
        self._slot = None       # the gateway's deadline slot while a read/idle timeout runs
        self._deadlines = site.deadlines
        self._timer = 0.0       # the seconds of the timeout armed last
        self._rearm = 0.0       # the timeout to arm when the budget resumes reading (0: none)
        self._budget = site.bodies
        self._held = 0          # body bytes this connection holds in the budget
        self._partial = 0       # of which: the body being received
        self._ex_bytes = 0      # of which: the body of the request its exchange serves

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = peer[0]
        self.site.connections.add(self)
        b = self._budget
        if b is not None and b.closed:
            b.wait(self)
        self._arm(self.limits.header_read_timeout_secs)

    def connection_lost(self, exc):
        self.closed = True
        self.site.connections.discard(self)
        self._disarm()
        ex = self.exchange
        if ex is not None:
            self.exchange = None
            ex.client_gone()
        self.queue.clear()
        # The parser holds this protocol (its callbacks) and this protocol the parser: break the
        # cycle, so the buffered body of the last request is freed now, not at the next full
        # collection (which gc.freeze() makes rare).
        self.parser = None
        self._body = []
        self._ex_bytes = 0
        if self._budget is not None and self._held:
            self._budget.drop(self)
        elif self._budget is not None and self._pause & _PAUSE_BUDGET:
            self._budget.waiting.pop(self, None)

    def pause_writing(self):
        ex = self.exchange
        if ex is not None:
            ex.pause_upstream()

    def resume_writing(self):
        ex = self.exchange
        if ex is not None:
            ex.resume_upstream()

    def eof_received(self):
        # The client closed its side: it is gone (see the module docstring). Returning False lets
        # the transport close, and connection_lost cancels what is in progress.
        return False

    def data_received(self, data):
        self.t_recv = t = now_ns()
        if self._pause & _PAUSE_BUDGET:
            # Accepted while the budget was closed: uvloop starts reading after connection_made
            # whatever it asked, so this connection stops now, after its first read.
            self.transport.pause_reading()
        if not self._in_message and not self.closed:
            # The common case, a whole plain request in the buffer, skips the parser callbacks;
            # anything else (partial, chunked, unusual, over a limit) goes to httptools from the
            # first byte that was not consumed here.
            lim = self.limits
            pos = 0
            n = len(data)
            while True:
                r = _fast_parse(data, pos, lim.header_max_bytes, lim.header_count_max,
                                lim.request_body_max_bytes)
                if r is None:
                    break
                pos = r[6]
                if self._slot is not None:
                    self._deadlines.disarm(self)
                if self._rearm:    # a budget pause's pending timer (_hold)
                    self._rearm = 0.0
                body = r[4]
                if body and self._budget is not None:
                    self._budget.take(self, len(body), False)
                self._deliver(new_request(r[0], r[1], r[2], r[3], body, t, r[5]))
                if pos == n or self.closed:
                    return
            if pos:
                data = data[pos:]
        try:
            self.parser.feed_data(data)
        except _Abort as a:
            status, message = a.args
            self._reject(status, message)
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            if isinstance(cause, _Abort):
                self._reject(*cause.args)
            else:
                self._reject(400, "Malformed HTTP request.")
        except httptools.HttpParserUpgrade:
            self._reject(400, "Protocol upgrades are not supported.")
        except httptools.HttpParserError:
            self._reject(400, "Malformed HTTP request.")

    # ---------------------------------------------------------------- parser callbacks
    def on_message_begin(self):
        self._in_message = True
        self._url = []
        self._headers = {}
        self._hbytes = 0
        self._hcount = 0
        self._body = []
        self._blen = 0
        self._t0 = self.t_recv
        if self._slot is None:
            self._arm(self.limits.header_read_timeout_secs)

    def on_url(self, url):
        self._url.append(url)
        self._hbytes += len(url)
        if self._hbytes > self.limits.header_max_bytes:
            raise _Abort(431, "Request header fields too large.")

    def on_header(self, name, value):
        self._hbytes += len(name) + len(value)
        self._hcount += 1
        if self._hbytes > self.limits.header_max_bytes or self._hcount > self.limits.header_count_max:
            raise _Abort(431, "Request header fields too large.")
        self._headers[name.lower()] = value

    def on_headers_complete(self):
        if self._slot is not None:
            self._deadlines.disarm(self)
        if self._rearm:    # a budget pause's pending timer (_hold)
            self._rearm = 0.0
        cl = self._headers.get(b"content-length")
        if cl is not None:
            try:
                n = int(cl)
            except ValueError:
                raise _Abort(400, "Malformed Content-Length.") from None
            if n > self.limits.request_body_max_bytes:
                raise _Abort(413, "request body exceeds the maximum allowed size")
        if self._headers.get(b"expect", b"").lower() == b"100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body):
        n = len(body)
        self._blen += n
        if self._blen > self.limits.request_body_max_bytes:
            raise _Abort(413, "request body exceeds the maximum allowed size")
        self._body.append(body)
        if self._budget is not None:
            self._budget.take(self, n, True)

    def on_message_complete(self):
        self._in_message = False
        if self._partial:
            self._budget.complete(self)
        url = b"".join(self._url) if len(self._url) != 1 else self._url[0]
        raw, _, query = url.partition(b"?")
        try:
            path = raw.decode("ascii")
            q = query.decode("ascii")
        except UnicodeDecodeError:
            raise _Abort(400, "Malformed request target.") from None
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        self._deliver(new_request(self.parser.get_method(), path, q, self._headers, body, self._t0,
                                  self.parser.should_keep_alive()))

    def _deliver(self, req):
        if self.exchange is None and not self.queue:
            self._start(req)
        else:
            self.queue.append(req)
            if len(self.queue) >= MAX_PIPELINED:
                self._hold(_PAUSE_QUEUE)

    # ---------------------------------------------------------------- exchanges
    def _start(self, req):
        if self._slot is not None:
            self._deadlines.disarm(self)
        if self._rearm:    # a budget pause's pending timer (_hold)
            self._rearm = 0.0
        if self._budget is not None:
            self._ex_bytes = len(req.body)
        site = self.site
        try:
            route = site.dispatch(req.method, req.path, req.query, req.headers)
        except Exception:       # a bug must cost this request only, never the process
            import logging
            logging.getLogger("busbar").exception("dispatch failed on %r", req.path)
            self.gw_error(500, "api_error", "The server had an error while processing your request.")
            return
        ex = self.exchange = site.new_exchange(self, req, route)
        try:
            ex.start()
        except Exception as e:  # a bug must cost this request only, never the process
            ex.crash(e)

    def exchange_done(self, keep_alive: bool):
        """The current exchange wrote its last byte."""
        self.exchange = None
        n = self._ex_bytes
        if n:
            self._ex_bytes = 0
            self._budget.give(self, n)
        if self.closed:
            return
        if not keep_alive:
            self.closed = True
            self.transport.close()
            return
        if self.queue:
            req = self.queue.pop(0)
            if isinstance(req, _Rejected):
                # A pipelined request that was rejected: answered in its turn; nothing after it is
                # trusted, so the connection closes.
                self.gw_error(req.status, _KIND.get(req.status, "invalid_request"), req.message)
                return
            if len(self.queue) < MAX_PIPELINED // 2:
                self._unhold(_PAUSE_QUEUE)
            self._start(req)
        elif self.site.draining:
            self.closed = True
            self.transport.close()
        else:
            self._arm(self.limits.idle_timeout_secs)

    # ---------------------------------------------------------------- writing
    def write(self, data):
        if not self.closed:
            self.transport.write(data)

    def _reject(self, status, message):
        """A request that cannot be parsed or exceeds a limit: answer in the dialect the path and
        headers imply, then close (the byte stream cannot be trusted past this point)."""
        if self._partial:
            # What was received of this body is released when the connection closes.
            self._budget.complete(self)
        if self.closed:
            return
        if self.exchange is not None or self.queue:
            # The requests before it keep their answers; this one is answered in its turn.
            self.queue.append(_Rejected(status, message))
            self._hold(_PAUSE_QUEUE)
            return
        self.gw_error(status, _KIND.get(status, "invalid_request"), message)

    def gw_error(self, status, kind, message):
        """An error the HTTP layer answers itself, in the dialect the path and headers imply;
        the connection closes after it."""
        path = b"".join(self._url).partition(b"?")[0].decode("latin-1") if self._url else "/"
        try:
            route = self.site.dispatch(b"POST", path, "", self._headers)
            proto = route.protocol or "openai"
        except Exception:
            proto = "openai"
        self.site.write_error_response(self, proto, status, kind, message, keep_alive=False,
                                       t0=self._t0 or self.t_recv)

    # ---------------------------------------------------------------- pausing
    def _hold(self, why):
        """Stops reading from the client for `why` (a _PAUSE_* bit)."""
        if self._pause & why:
            return
        if not self._pause and not self.closed:
            self.transport.pause_reading()
        self._pause |= why
        if why == _PAUSE_BUDGET and self._slot is not None:
            # busbar stopped reading, not the client: its clock stops too.
            self._rearm = self._timer
            self._deadlines.disarm(self)

    def _unhold(self, why):
        """Drops `why`; reading resumes when no reason is left."""
        if not self._pause & why:
            return
        self._pause &= ~why
        if self.closed:
            return
        if not self._pause:
            self.transport.resume_reading()
        if why == _PAUSE_BUDGET and self._rearm:
            secs = self._rearm
            self._rearm = 0.0
            self._arm(secs)

    # ---------------------------------------------------------------- timeouts
    def _arm(self, secs):
        if self._pause & _PAUSE_BUDGET:
            self._rearm = secs          # armed when the budget resumes reading
        else:
            self._timer = secs
            self._deadlines.arm(self, secs)

    def _disarm(self):
        self._rearm = 0.0
        if self._slot is not None:
            self._deadlines.disarm(self)

    def on_deadline(self):
        """The header-read or idle timeout passed (called by the gateway's Deadlines sweep)."""
        if self.closed or self.exchange is not None:
            return
        if self._in_message:
            self._reject(408, "Timed out reading the request.")
        else:
            self.closed = True
            self.transport.close()


_KIND = {413: "request_too_large", 408: "timeout", 431: "invalid_request", 500: "api_error"}
