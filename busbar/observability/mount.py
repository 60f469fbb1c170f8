"""`metrics_public: true`: the data listener answers a table of routes `{(method, path): handler}`
too (checked before the protocol dispatch, one dict lookup). A handler takes (site, request) and
returns (status, content_type, body: bytes). The admin listener mounts
`busbar.observability.ADMIN_ROUTES` into its own route table (busbar/admin/plane.py).
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
