# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""Keep-alive HTTP/1.1 client for upstreams, on httptools.HttpResponseParser, callback driven.

No coroutine per request: an exchange asks the pool for a connection with two callbacks, writes its
request bytes, and receives the response through the handler methods below. The feasibility
prototypes measured aiohttp's client at 6-8x the cost of this shape, and a task per request at ~7 µs
more than callbacks, so this file trades a little ceremony for the hot path.

Handler protocol (what an exchange implements):
    on_upstream_headers(status: int, headers: list[(bytes, bytes)])
    on_upstream_body(chunk: bytes)
    on_upstream_complete()
    on_upstream_error(reason: str)      # connect failure, reset, EOF before the response ended

Interim responses (100 Continue, 103 Early Hints) are skipped: the handler sees only the final
response, and the connection goes back to the pool only once that final response was read whole.
A 101 (protocol switch) is an error: busbar never asks for one. Back-pressure (pause/resume) is
state of the connection, not of the exchange using it, and a connection is reusable only when it
is idle, readable and not paused.
"""
from __future__ import annotations

import asyncio
import socket
import ssl

import httptools

from cbusbar.clock import monotonic
from cbusbar.h1 import parse_response as _fast_parse
from busbar.upstream.tlsread import TlsReader

__all__ = ["UpstreamPool", "UpstreamConnection"]


class UpstreamConnection:
    """One upstream connection: an asyncio.Protocol (by its methods; a compiled class cannot derive
    from the Python one)."""

    def __init__(self, pool, key):
        self.pool = pool
        self.key = key
        self.transport = None
        self.parser = httptools.HttpResponseParser(self)
        self.handler = None
        self.headers = []
        self.idle_since = 0.0
        self.closed = False
        self.paused = False     # reading paused for a slow client (back-pressure)
        self._interim = False   # the message being parsed is a 1xx interim response
        self._reusable = True
        self._partial = False   # httptools holds part of a response
        self._body = None       # body pieces of the current read, not yet handed on

    # -- asyncio.Protocol
    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data):
        if self.closed:
            return
        h = self.handler
        if h is None and not self._partial:
            # Bytes on an idle connection answer nothing we asked: the connection cannot be
            # trusted to frame the next response.
            self.close()
            return
        if not self._partial:
            # A whole plain response in one read (the common small answer) skips the parser
            # callbacks; anything else is httptools' (cbusbar/h1.pyx says what is accepted).
            r = _fast_parse(data)
            if r is not None:
                status, headers, body, keep = r
                try:
                    h.on_upstream_headers(status, headers)
                    if body and self.handler is h:
                        h.on_upstream_body(body)
                    if self.handler is h:
                        self._complete(keep)
                except Exception as e:  # a bug in the exchange costs its request only
                    if self.handler is h:
                        self.handler = None
                    self.close()
                    h.crash(e)
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as e:
            # An exception inside an exchange's handler (a bug, or bytes a codec choked on).
            h = self.handler
            self.handler = None
            self.close()
            if h is not None:
                h.crash(e.__context__ or e)
        except httptools.HttpParserError:
            self._fail("upstream sent a malformed HTTP response")
        except httptools.HttpParserUpgrade:
            self._fail("upstream tried to upgrade the connection")
        else:
            if self._body is not None:
                h = self.handler
                try:
                    self._deliver()
                except Exception as e:  # a bug in the exchange costs its request only
                    if self.handler is h:
                        self.handler = None
                    self.close()
                    if h is not None:
                        h.crash(e)

    def eof_received(self):
        return False

    def connection_lost(self, exc):
        self.closed = True
        self.pool.forget(self)
        h = self.handler
        if h is not None:
            self.handler = None
            h.on_upstream_error("upstream connection closed before the response ended")

    def pause_writing(self):
        pass

    def resume_writing(self):
        pass

    # -- httptools callbacks
    def on_message_begin(self):
        if self.handler is None:
            # A response nobody asked for, right behind the last one in the same read: the
            # connection cannot frame the next answer (the error closes it).
            raise ValueError("unsolicited response")
        self._partial = True

    def on_header(self, name, value):
        self.headers.append((name.lower(), value))

    def on_headers_complete(self):
        status = self.parser.get_status_code()
        if status == 101:
            self._fail("upstream switched protocols (101)")
            return
        if status < 200:
            # 100/103 precede the real answer on the same connection; llhttp parses them as
            # bodiless messages, so the final response follows as the next message.
            self._interim = True
            self.headers = []
            return
        h = self.handler
        if h is not None:
            h.on_upstream_headers(status, self.headers)

    def on_body(self, body):
        # Body pieces parsed from one read (a streaming upstream sends one chunk per SSE frame,
        # often many per read) reach the exchange as one piece: one client write, not one per
        # frame.
        b = self._body
        if b is None:
            self._body = [body]
        else:
            b.append(body)

    def _deliver(self):
        b = self._body
        self._body = None
        h = self.handler
        if h is not None:
            h.on_upstream_body(b[0] if len(b) == 1 else b"".join(b))

    def on_message_complete(self):
        if self._interim:
            self._interim = False
            self._body = None
            return
        self._partial = False
        if self._body is not None:
            self._deliver()
        self._complete(self.parser.should_keep_alive())

    def _complete(self, keep_alive):
        h = self.handler
        self.handler = None
        self.headers = []
        keep = keep_alive and self._reusable and not self.closed
        if self.paused:
            # The exchange paused reading for its client; the connection has no part in that any
            # more and must read for its next user.
            self.paused = False
            if keep:
                self.transport.resume_reading()
        if keep:
            self.pool.release(self)
        else:
            self.close()
        if h is not None:
            h.on_upstream_complete()

    # -- used by exchanges
    def send(self, handler, data):
        self.handler = handler
        self.headers = []
        self.transport.write(data)

    def pause(self):
        if not self.paused and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self):
        if self.paused and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    def abandon(self):
        """The exchange no longer wants this response (it failed over or the client went away):
        the connection cannot be reused, since its response would arrive for the next user."""
        self.handler = None
        self.close()

    def _fail(self, reason):
        if self._body is not None:
            try:
                self._deliver()     # what arrived intact before the broken bytes still counts
            except Exception:
                self._body = None
        h = self.handler
        self.handler = None
        self.close()
        if h is not None:
            h.on_upstream_error(reason)

    def close(self):
        if not self.closed:
            self.closed = True
            self.pool.forget(self)
            if self.transport is not None:
                self.transport.close()


class UpstreamPool:
    """Idle keep-alive connections per (scheme, host, port)."""

    def __init__(self, loop, *, connect_timeout, max_idle_per_host, idle_timeout,
                 ssl_context=None):
        self.loop = loop
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle_per_host
        self.idle_timeout = idle_timeout
        self.ssl_context = ssl_context
        self.idle = {}          # key -> [UpstreamConnection], the idle ones
        self.all = set()
        # What _connect makes (bench/tail.py puts a traced subclass here).
        self.connection_class = UpstreamConnection
        self._reaper = loop.call_later(max(1.0, idle_timeout / 4), self._reap)

    def _ssl(self):
        if self.ssl_context is None:
            # Certificate verification stays on: the default context verifies and checks host names.
            # SSL_CERT_FILE / SSL_CERT_DIR (or the bundle the executable carries) are honoured.
            self.ssl_context = ssl.create_default_context()
        return self.ssl_context

    def acquire(self, key, on_ready, on_error):
        """Calls on_ready(conn) with an idle or fresh connection, or on_error(reason)."""
        idle = self.idle.get(key)
        while idle:
            conn = idle.pop()
            if not conn.closed and not conn.paused and not conn.transport.is_closing():
                on_ready(conn)
                return
        self.loop.create_task(self._connect(key, on_ready, on_error))

    async def _connect(self, key, on_ready, on_error):
        scheme, host, port = key
        tls = scheme == "https"
        cls = self.connection_class
        try:
            # Over TLS, behind a TlsReader: no 256 KiB allocation per read (tlsread.py).
            _, proto = await asyncio.wait_for(
                self.loop.create_connection(
                    (lambda: TlsReader(cls(self, key))) if tls else
                    (lambda: cls(self, key)), host, port,
                    ssl=self._ssl() if tls else None,
                    server_hostname=host if tls else None),
                self.connect_timeout)
            conn = proto.inner if tls else proto
        except asyncio.TimeoutError:
            on_error("connect timeout")
            return
        except (OSError, ssl.SSLError) as e:
            on_error("connect failed: %s" % (e.__class__.__name__,))
            return
        self.all.add(conn)
        on_ready(conn)

    def release(self, conn):
        if conn.closed or conn.paused or conn.handler is not None:
            conn.close()
            return
        idle = self.idle.setdefault(conn.key, [])
        if len(idle) >= self.max_idle:
            conn.close()
            return
        conn.idle_since = monotonic()
        idle.append(conn)

    def forget(self, conn):
        self.all.discard(conn)
        idle = self.idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def _reap(self):
        cutoff = monotonic() - self.idle_timeout
        for idle in list(self.idle.values()):
            for conn in [c for c in idle if c.idle_since < cutoff]:
                conn.close()
        self._reaper = self.loop.call_later(max(1.0, self.idle_timeout / 4), self._reap)

    def close(self):
        self._reaper.cancel()
        for conn in list(self.all):
            conn.close()
        self.idle.clear()
