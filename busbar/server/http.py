"""Ingress HTTP/1.1: an asyncio.Protocol driving httptools.HttpRequestParser directly, no framework.

Keep-alive; pipelined requests are queued and answered strictly in order (one exchange at a time per
connection); chunked request bodies; `Expect: 100-continue`. Every limit comes from config `limits:`
and each misbehaving client only ever costs its own connection.

A connection serves a *site*: the object that says what a request is and answers it (the gateway's
data plane, or the admin API on its own listener). A site has `snapshot.limits`, `deadlines`,
`connections` (a set), `draining`, `dispatch(method, path, query, headers) -> Route`,
`new_exchange(conn, req, route)` and `write_error_response(conn, proto, status, kind, message,
keep_alive, t0)`.

A client that closes its side (FIN) or resets is gone: the exchange in progress is cancelled at once
(its upstream attempt abandoned, its lane freed) and the connection closed; SDKs close that way on a
timeout or a cancel, and an answer nobody reads only holds a permit.
"""
from __future__ import annotations

import asyncio
import time

import httptools

from busbar.engine.status import REASONS, status_line  # noqa: F401 (re-exported)
from cbusbar.http import parse_request as _fast_parse

_perf_ns = time.perf_counter_ns

# Pipelined requests beyond this many waiting on one connection pause reading from it, so a client
# that floods one socket cannot make busbar buffer without bound.
MAX_PIPELINED = 16


class _Abort(Exception):
    """Raised from a parser callback to stop parsing: (status, message)."""


class _Rejected:
    """A pipelined request that could not be parsed, queued behind the requests before it: it is
    answered (400, 413, ...) in its turn, and the connection closes after it."""

    __slots__ = ("status", "message")

    def __init__(self, status, message):
        self.status = status
        self.message = message


class Request:
    __slots__ = ("method", "path", "query", "headers", "body", "t0", "keep_alive")

    def __init__(self, method, path, query, headers, body, t0, keep_alive):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.t0 = t0
        self.keep_alive = keep_alive


class HttpConnection(asyncio.Protocol):
    """One client connection (used as an asyncio.Protocol)."""

    def __init__(self, site):
        self.site = site
        self.limits = site.snapshot.limits
        self.transport = None
        self.peer = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue = []
        self.exchange = None
        self.closed = False
        self.paused = False
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

    # ---------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = peer[0]
        self.site.connections.add(self)
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
        self.t_recv = t = _perf_ns()
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
                self._deliver(Request(r[0], r[1], r[2], r[3], r[4], t, r[5]))
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
            self._deadlines.arm(self, self.limits.header_read_timeout_secs)

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
        cl = self._headers.get(b"content-length")
        if cl is not None:
            try:
                n = int(cl)
            except ValueError:
                raise _Abort(400, "Malformed Content-Length.")
            if n > self.limits.request_body_max_bytes:
                raise _Abort(413, "request body exceeds the maximum allowed size")
        if self._headers.get(b"expect", b"").lower() == b"100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body):
        self._blen += len(body)
        if self._blen > self.limits.request_body_max_bytes:
            raise _Abort(413, "request body exceeds the maximum allowed size")
        self._body.append(body)

    def on_message_complete(self):
        self._in_message = False
        url = b"".join(self._url) if len(self._url) != 1 else self._url[0]
        raw, _, query = url.partition(b"?")
        try:
            path = raw.decode("ascii")
            q = query.decode("ascii")
        except UnicodeDecodeError:
            raise _Abort(400, "Malformed request target.")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body = []
        self._deliver(Request(self.parser.get_method(), path, q, self._headers, body, self._t0,
                              self.parser.should_keep_alive()))

    def _deliver(self, req):
        if self.exchange is None and not self.queue:
            self._start(req)
        else:
            self.queue.append(req)
            if len(self.queue) >= MAX_PIPELINED and not self.paused:
                self.paused = True
                self.transport.pause_reading()

    # ---------------------------------------------------------------- exchanges
    def _start(self, req):
        if self._slot is not None:
            self._deadlines.disarm(self)
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
            if self.paused and len(self.queue) < MAX_PIPELINED // 2:
                self.paused = False
                self.transport.resume_reading()
            self._start(req)
        elif self.site.draining:
            self.closed = True
            self.transport.close()
        else:
            self._deadlines.arm(self, self.limits.idle_timeout_secs)

    # ---------------------------------------------------------------- writing
    def write(self, data):
        if not self.closed:
            self.transport.write(data)

    def _reject(self, status, message):
        """A request that cannot be parsed or exceeds a limit: answer in the dialect the path and
        headers imply, then close (the byte stream cannot be trusted past this point)."""
        if self.closed:
            return
        if self.exchange is not None or self.queue:
            # The requests before it keep their answers; this one is answered in its turn.
            self.queue.append(_Rejected(status, message))
            if not self.paused:
                self.paused = True
                self.transport.pause_reading()
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

    # ---------------------------------------------------------------- timeouts
    def _arm(self, secs):
        self._deadlines.arm(self, secs)

    def _disarm(self):
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
