"""The admin listener's site: the second *site* HttpConnection serves (busbar/server/http.py), with
the same parsing, limits and timeouts as the data plane but its own route table, the gateway's
`admin_routes` (busbar/server/routes.py, the one route table type both listeners use). Admin
routes exist only there, so the data listener cannot answer them whatever the path.

Every part adds its routes the same way, when it is wired into the worker (observability's pages
and /metrics, the admin API, governance's endpoints):

    gw.admin_routes.add("GET", "/", handler, scope=PUBLIC)              # no admin token asked
    gw.admin_routes.add("GET", "/api/v1/admin/pools/{name}", handler)   # scope from method + path

A handler takes an `AdminRequest` and returns a `Response` (or a coroutine giving one). `scope`:
PUBLIC (no auth), or None (the default: SPEC §6, `read-only` for GET and `POST config/validate`,
`full` for everything else), or an explicit "read-only"/"full".
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging

import orjson

from cbusbar.clock import now_ns

from busbar.engine.status import status_line
from busbar.server.routes import PUBLIC, Response  # noqa: F401 (the admin API's vocabulary too)

log = logging.getLogger("busbar.admin")

PREFIX = "/api/v1/admin"
# Paths under PREFIX that need only the read-only scope although they are not GETs (SPEC §6).
READ_ONLY_POSTS = frozenset({PREFIX + "/config/validate"})

# The error envelope's codes (SPEC §6) by status.
CODES = {400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
         405: "method_not_allowed", 409: "conflict", 413: "invalid_request", 408: "invalid_request",
         431: "invalid_request", 500: "internal", 503: "unavailable"}


def json_response(obj, status=200) -> Response:
    return Response(status, orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


def error_response(status, message, code=None, **extra) -> Response:
    err = {"code": code or CODES.get(status, "internal"), "message": message}
    err.update(extra)
    return json_response({"error": err}, status)


class AdminError(Exception):
    """Raised by a handler: answered as the error envelope."""

    def __init__(self, status, message, code=None, **extra):
        super().__init__(message)
        self.response = error_response(status, message, code, **extra)


class AdminRequest:
    __slots__ = ("method", "path", "query", "headers", "body", "params", "principal", "site")

    def __init__(self, req, params, site):
        self.method = req.method.decode("latin-1")
        self.path = req.path
        self.query = req.query
        self.headers = req.headers
        self.body = req.body
        self.params = params
        self.principal = None
        self.site = site

    def json(self):
        try:
            return orjson.loads(self.body or b"{}")
        except orjson.JSONDecodeError as exc:
            raise AdminError(400, "the body is not JSON: %s" % exc) from None


def required_scope(method: str, path: str) -> str:
    """SPEC §6: scopes come from method + path, never the body."""
    if method in ("GET", "HEAD") or (method == "POST" and path.rstrip("/") in READ_ONLY_POSTS):
        return "read-only"
    return "full"


class TokenCheck:
    """Admin tokens compared in constant time over SHA-256 digests: every configured token is
    compared (no early exit), so timing says nothing about which one or how much matched."""

    def __init__(self, tokens):
        self.entries = [(hashlib.sha256(t.token.encode()).digest(), t) for t in tokens]

    def principal(self, presented: bytes | None):
        if not presented or not self.entries:
            return None
        digest = hashlib.sha256(presented).digest()
        found = None
        for d, tok in self.entries:
            if hmac.compare_digest(d, digest) and found is None:
                found = tok
        return found


def presented_token(headers) -> bytes | None:
    auth = headers.get(b"authorization")
    if auth is not None and auth[:7].lower() == b"bearer ":
        return auth[7:].strip()
    return headers.get(b"x-admin-token")


class AdminSite:
    """The site object of the admin listener (see busbar/server/http.py for the contract)."""

    def __init__(self, gw, control):
        self.gw = gw
        self.deadlines = gw.deadlines
        self.connections = set()
        self.bodies = None      # admin bodies are small and few: no body budget
        self.routes = gw.admin_routes
        self.set_auth(control)

    def set_auth(self, control):
        self.open = control.admin_open and not control.admin_tokens
        self.tokens = TokenCheck(control.admin_tokens)

    @property
    def snapshot(self):
        return self.gw.snapshot

    @property
    def draining(self):
        return self.gw.draining

    def dispatch(self, method, path, query, headers):
        return _AdminRoute

    def new_exchange(self, conn, req, route):
        return AdminExchange(self, conn, req)

    def write_error_response(self, conn, proto, status, kind, message, keep_alive, t0):
        _write(conn, error_response(status, message), keep_alive=False)
        conn.closed = True
        conn.transport.close()

    def close(self):
        for c in list(self.connections):
            c.transport.close()


class _AdminRoute:
    protocol = None


def _write(conn, resp: Response, keep_alive: bool, head_only=False):
    body = resp.body
    conn.write(b"%bContent-Type: %b\r\nContent-Length: %d\r\nCache-Control: no-store\r\n%b%b\r\n%b" % (
        status_line(resp.status), resp.ctype, len(body), resp.headers,
        b"" if keep_alive else b"Connection: close\r\n", b"" if head_only else body))


class AdminExchange:
    """One admin request: authenticated, routed, answered; a handler may be a coroutine (a reload
    waits for every worker)."""

    __slots__ = ("site", "conn", "req", "task", "done", "_slot")

    def __init__(self, site, conn, req):
        self.site = site
        self.conn = conn
        self.req = req
        self.task = None
        self.done = False
        self._slot = None

    def start(self):
        req = self.req
        site = self.site
        method = req.method.decode("latin-1").upper()
        route, found = site.routes.find(method, req.path)
        if route is not None and route.scope == PUBLIC:
            return self._run(route, found)
        resp = self._authorize(method, route)
        if resp is not None:
            return self.finish(resp)
        if route is None:
            if found:
                return self.finish(_method_not_allowed(method, found))
            return self.finish(error_response(404, "no admin endpoint %s" % req.path))
        return self._run(route, found)

    def _authorize(self, method, route):
        site = self.site
        if site.open:
            return None
        presented = presented_token(self.req.headers)
        tok = site.tokens.principal(presented)
        if tok is None:
            if not site.tokens.entries:
                return error_response(401, "no admin tokens are configured (an identity provider "
                                      "of module admin-tokens with a token, in auth.admin_auth)")
            if not presented:
                return error_response(401, "an admin token is required (Authorization: Bearer or "
                                      "x-admin-token)")
            # Never echoes the token: a near miss pasted into a ticket is still a secret.
            return error_response(401, "the admin token presented is not valid: it matches none "
                                  "of auth.admin_auth's tokens")
        need = route.scope if route is not None and route.scope else required_scope(method, self.req.path)
        if need == "full" and tok.scope != "full":
            return error_response(403, "this call needs the 'full' scope; token '%s' is %s" % (
                tok.name, tok.scope))
        return None

    def _run(self, route, params):
        areq = AdminRequest(self.req, params, self.site)
        try:
            out = route.handler(areq)
        except AdminError as e:
            return self.finish(e.response)
        if asyncio.iscoroutine(out):
            self.task = asyncio.ensure_future(out)
            self.task.add_done_callback(self._task_done)
            return None
        return self.finish(out)

    def _task_done(self, task):
        self.task = None
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, AdminError):
            return self.finish(exc.response)
        if exc is not None:
            return self.crash(exc)
        self.finish(task.result())

    def finish(self, resp: Response):
        if self.done:
            return
        self.done = True
        conn = self.conn
        if conn.closed:
            return
        ka = self.req.keep_alive
        if self.site.snapshot.server_timing:
            # advanced.response_headers.server_timing: on every answer, the admin listener's too
            # (nothing went upstream: the whole time is busbar's).
            resp.headers += b"Server-Timing: busbar;dur=%.3f\r\n" % (
                (now_ns() - self.req.t0) / 1e6)
        _write(conn, resp, ka, head_only=self.req.method == b"HEAD")
        conn.exchange_done(ka)

    def crash(self, exc):
        log.error("admin: internal error on %s %s: %r", self.req.method.decode("latin-1"),
                  self.req.path, exc, exc_info=exc)
        self.finish(error_response(500, "internal error: %s" % type(exc).__name__))

    def client_gone(self):
        # A reload in progress still completes (it was asked for); only its answer is dropped.
        self.done = True

    def pause_upstream(self):
        pass

    def resume_upstream(self):
        pass

    def on_deadline(self):
        pass


def _method_not_allowed(method, allowed):
    allowed = ", ".join(sorted(set(allowed)))
    resp = error_response(405, "%s is not allowed here (allowed: %s)" % (method, allowed))
    resp.headers = b"Allow: %b\r\n" % allowed.encode()
    return resp
