"""Serving a table of routes `{(method, path): handler}` over busbar's own HTTP connection code.

A handler takes (site, request) and returns (status, content_type, body: bytes). The admin listener
(the control issue) mounts `busbar.observability.ADMIN_ROUTES` into its own route table; until it
lands, and for `metrics_public: true`, these pieces serve a table directly:

- `mount_public(gw, routes)`: the data listener answers these GET paths too (checked before the
  protocol dispatch, one dict lookup).
- `RoutesSite`: a whole site (for HttpConnection) serving only a table; the tests use it as a
  stand-in admin listener, in the gateway process, on the gateway's own loop.
"""
from __future__ import annotations

import logging

from busbar.engine.route import Route
from busbar.engine.status import status_line

log = logging.getLogger("busbar")

TABLE = 100     # a Route kind outside the engine's: "answered from a route table"


class RouteExchange:
    """One request answered by a table handler: no upstream, no lane."""

    __slots__ = ("site", "conn", "req", "handler", "_slot")

    def __init__(self, site, conn, req, handler):
        self.site = site
        self.conn = conn
        self.req = req
        self.handler = handler
        self._slot = None

    def start(self):
        status, ctype, body = self.handler(self.site, self.req)
        self._answer(status, ctype, body)

    def _answer(self, status, ctype, body):
        ka = self.req.keep_alive
        self.conn.write(b"%bContent-Type: %b\r\nContent-Length: %d\r\nCache-Control: no-store\r\n%b\r\n%b" % (
            status_line(status), ctype.encode() if isinstance(ctype, str) else ctype, len(body),
            b"" if ka else b"Connection: close\r\n", body))
        self.conn.exchange_done(ka)

    def crash(self, exc):
        log.error("route handler failed on %s: %r", self.req.path, exc, exc_info=exc)
        self._answer(500, b"application/json", b'{"error":{"code":"internal","message":"internal error"}}')

    def client_gone(self):
        pass

    def pause_upstream(self):
        pass

    def resume_upstream(self):
        pass


def mount_public(gw, routes):
    """Serves `routes` on gw's own (data) listener, before the protocol dispatch."""
    base_dispatch = gw.dispatch
    base_new = gw.new_exchange

    def dispatch(method, path, query, headers):
        h = routes.get((method.decode("latin-1") if isinstance(method, bytes) else method, path))
        if h is not None:
            r = Route(TABLE, None)
            r.name = h
            return r
        return base_dispatch(method, path, query, headers)

    def new_exchange(conn, req, route):
        if route.kind == TABLE:
            return RouteExchange(gw, conn, req, route.name)
        return base_new(conn, req, route)

    gw.dispatch = dispatch
    gw.new_exchange = new_exchange


class RoutesSite:
    """A site serving only a route table (a stand-in for the admin listener); `gw` is the
    gateway whose state the handlers read."""

    def __init__(self, gw, routes):
        self.gw = gw
        self.routes = routes
        self.snapshot = gw.snapshot
        self.deadlines = gw.deadlines
        self.connections = set()
        self.draining = False

    def dispatch(self, method, path, query, headers):
        h = self.routes.get((method.decode("latin-1"), path))
        r = Route(TABLE, None)
        r.name = h
        return r

    def new_exchange(self, conn, req, route):
        h = route.name
        if h is None:
            h = _not_found
        return RouteExchange(self.gw, conn, req, h)

    def write_error_response(self, conn, proto, status, kind, message, keep_alive, t0):
        body = b'{"error":{"code":"invalid_request","message":"bad request"}}'
        conn.write(b"%bContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%b" % (
            status_line(status), len(body), body))
        conn.closed = True
        conn.transport.close()


def _not_found(site, req):
    return 404, b"application/json", b'{"error":{"code":"not_found","message":"not found"}}'


async def serve_routes(gw, host, port, routes):
    """Listens on (host, port) with a RoutesSite; returns the asyncio server."""
    from busbar.server.http import HttpConnection
    site = RoutesSite(gw, routes)
    return await gw.loop.create_server(lambda: HttpConnection(site), host, port)
