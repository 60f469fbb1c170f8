"""The admin listener's site: the second *site* HttpConnection serves (busbar/server/http.py), with
the same parsing, limits and timeouts as the data plane but its own route table, the gateway's
`admin_routes` (busbar/server/routes.py, the one route table type both listeners use). Admin
routes exist only there, so the data listener cannot answer them whatever the path.

Every part adds its routes the same way, when it is wired into the worker (observability's pages
and /metrics, the admin API, governance's endpoints):

    gw.admin_routes.add("GET", "/", handler, scope=PUBLIC)              # no admin token asked
    gw.admin_routes.add("GET", "/api/v1/admin/pools/{name}", handler)   # scope from method + path

A handler takes an `AdminRequest` and returns a `Response` (or a coroutine giving one). `scope`:
PUBLIC (no auth), or None (the default: `read-only` for GET/HEAD, `POST config/validate` and
`POST plugins/inspect`, `full` for everything else, unknown methods included), or an explicit
"read-only"/"full".

The surface-wide contract every /api/v1/admin answer keeps (the Rust gateway's docs/admin-api.md),
enforced here once, before any handler runs:
- every error is `{"error": {"code", "message"}}` with a frozen code (CODES), 401/404/405 included;
- authorization is the token's scope against the method + path (never the body); a 403 names the
  scope that would have sufficed;
- mutations (POST/PUT/PATCH/DELETE) spend the principal's budget of their class (MUTATION_BUDGETS)
  in fixed one-minute windows before the handler runs, failed ones too; over budget is 429
  `rate_limited` with `Retry-After: 60`, audited (the first refusal of a window).

Helpers the handlers call (all raise AdminError, answered as the envelope):
    req.query_param("limit")                one ?name= value, percent-decoded, or None
    page(req, rows, default=200, cap=1000)  {"items", "next_cursor"}: ?limit= and ?cursor= applied
    config_if_match(req)                    If-Match as a config version (int), None = unguarded
    config_plane_version(gw)                the config-plane ETag value (config + group changes)
    check_version(expected, current)        409 version_conflict when a guard is stale
    etag(resp, tag)                         the ETag header on a response ("42" for a version)
    req.audit(action, resource, outcome)    a row of the hash-chained audit log (busbar/admin/audit.py)
"""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import time
from urllib.parse import unquote_plus

import orjson

from cbusbar.clock import now_ns

from busbar.engine.status import status_line
from busbar.server.routes import PUBLIC, Response  # noqa: F401 (the admin API's vocabulary too)

log = logging.getLogger("busbar.admin")

PREFIX = "/api/v1/admin"
# Paths under PREFIX that need only the read-only scope although they are not GETs: a validate is
# a stateless dry-run, an inspect a stateless preview of a plugin tarball (nothing is installed).
READ_ONLY_POSTS = frozenset({PREFIX + "/config/validate", PREFIX + "/plugins/inspect"})
READ_METHODS = frozenset({"GET", "HEAD"})
MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

# The error envelope's frozen codes by status. 409 is `conflict` (terminal) unless the handler says
# `version_conflict` (a stale If-Match: re-read and retry); the status alone cannot tell them apart.
CODES = {400: "invalid_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
         405: "method_not_allowed", 409: "conflict", 413: "invalid_request", 408: "invalid_request",
         429: "rate_limited", 431: "invalid_request", 500: "internal", 503: "unavailable"}

# The principal of an operator token (module admin-tokens) and of the open admin posture, as the
# Rust gateway names them in budgets and the audit log: every static admin token is one principal.
OPERATOR = "admin"
ANONYMOUS = "anonymous"

# Mutation budgets per principal and class, per fixed one-minute window (the Rust gateway's): the
# config class is the blast-radius set (each rebuilds and swaps the whole config), plugin-inspect
# unpacks an untrusted archive, everything else is CRUD. Reads are unmetered.
MUTATION_WINDOW_SECS = 60
MUTATION_BUDGETS = {"config": 10, "crud": 60, "plugin-inspect": 30}
# Paths (relative to PREFIX) of the config class: exact, or a prefix when they end in "/".
CONFIG_CLASS_EXACT = frozenset({"/admin-auth", "/plugins/reload", "/plugins/rollback", "/restart"})
CONFIG_CLASS_PREFIXES = ("/config/", "/overlay/", "/identity-providers", "/export")

# Cursor pagination: the page size when ?limit= is absent, and the most one page holds.
LIST_LIMIT_DEFAULT = 200
LIST_LIMIT_MAX = 1000


def json_response(obj, status=200) -> Response:
    return Response(status, orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS))


def compact_response(obj, status=200, headers=b"") -> Response:
    """JSON without indentation, as the Rust gateway writes it (byte-for-byte comparable)."""
    return Response(status, orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS), headers=headers)


def error_response(status, message, code=None, **extra) -> Response:
    """The envelope: `{"error":{"code","message"}}`, compact as the Rust gateway writes it, plus any
    `extra` members (e.g. a config's `problems`)."""
    err = {"code": code or CODES.get(status, "internal"), "message": message}
    err.update(extra)
    return compact_response({"error": err}, status)


class AdminError(Exception):
    """Raised by a handler: answered as the error envelope."""

    def __init__(self, status, message, code=None, **extra):
        super().__init__(message)
        self.response = error_response(status, message, code, **extra)


class AdminRequest:
    __slots__ = ("method", "path", "query", "headers", "body", "params", "principal", "site",
                 "_query")

    def __init__(self, req, params, site, principal=ANONYMOUS):
        self.method = req.method.decode("latin-1")
        self.path = req.path
        self.query = req.query
        self.headers = req.headers
        self.body = req.body
        self.params = params
        self.principal = principal      # "admin", "anonymous" (open posture): never a credential
        self.site = site
        self._query = None

    def json(self):
        try:
            return orjson.loads(self.body or b"{}")
        except orjson.JSONDecodeError as exc:
            raise AdminError(400, "the body is not JSON: %s" % exc) from None

    def query_params(self) -> dict:
        """?a=1&b=2 as {name: value}, percent-decoded; a repeated name keeps its first value."""
        if self._query is None:
            out = {}
            for part in (self.query or "").split("&"):
                if not part:
                    continue
                k, _, v = part.partition("=")
                out.setdefault(unquote_plus(k), unquote_plus(v))
            self._query = out
        return self._query

    def query_param(self, name: str, default=None):
        return self.query_params().get(name, default)

    def header(self, name: bytes) -> str | None:
        v = self.headers.get(name)
        return None if v is None else v.decode("latin-1")

    def audit(self, action: str, resource: str, outcome: str):
        """A row of the audit log, attributed to this request's principal (busbar/admin/audit.py).
        `resource` names what was acted on (`key:<id>`, `group:<name>`), never a secret."""
        self.site.audit_log.record(action, resource, outcome, self.principal)


def required_scope(method: str, path: str) -> str:
    """Scopes come from method + path, never the body: every GET/HEAD and the two stateless POSTs
    are read-only; everything else, an unknown method too, needs full."""
    if method in READ_METHODS or (method == "POST" and path.rstrip("/") in READ_ONLY_POSTS):
        return "read-only"
    return "full"


def mutation_class(path: str) -> str:
    """The budget a mutation of `path` spends: "config", "plugin-inspect" or "crud"."""
    rel = path[len(PREFIX):] if path.startswith(PREFIX) else path
    if rel == "/config/validate":
        return "crud"           # a dry-run never contends with the config budget
    if rel == "/plugins/inspect":
        return "plugin-inspect"
    if rel in CONFIG_CLASS_EXACT or rel.startswith(CONFIG_CLASS_PREFIXES):
        return "config"
    return "crud"


class MutationLimiter:
    """Per-(principal, class) counts in fixed one-minute windows (the window is now - now % 60).
    `check` spends one and says whether it was admitted, and whether this is the first refusal of
    the window (only that one is audited: a client ignoring its 429s must not drive a write per
    attempt). "forbidden" is a budget of 0 used only to audit a 403 once per window."""

    def __init__(self, budgets=None, clock=time.time):
        self.budgets = dict(MUTATION_BUDGETS if budgets is None else budgets)
        self.budgets.setdefault("forbidden", 0)
        self.clock = clock
        self.window = None
        self.counts = {}        # (principal, class) -> [admitted, refused]

    def check(self, principal: str, cls: str) -> tuple[bool, bool]:
        """(admitted, first refusal in this window)."""
        now = int(self.clock())
        window = now - now % MUTATION_WINDOW_SECS
        if window != self.window:
            self.window = window
            self.counts = {}
        c = self.counts.get((principal, cls))
        if c is None:
            c = self.counts[(principal, cls)] = [0, 0]
        if c[0] >= self.budgets.get(cls, 0):
            c[1] += 1
            return False, c[1] == 1
        c[0] += 1
        return True, False


# ---------------------------------------------------------------------------- pagination
def encode_cursor(offset: int) -> str:
    """An opaque cursor for a row offset: the hex of "o:<offset>", as the Rust gateway spells it,
    so a cursor from either gateway resumes on the other."""
    return ("o:%d" % offset).encode("ascii").hex()


def decode_cursor(cursor: str) -> int | None:
    """The offset of a cursor, or None for a malformed or foreign one."""
    if not cursor or len(cursor) % 2:
        return None
    try:
        text = bytes.fromhex(cursor).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return None
    if not text.startswith("o:") or not text[2:].isdigit():
        return None
    return int(text[2:])


def page_params(req, default=LIST_LIMIT_DEFAULT, cap=LIST_LIMIT_MAX) -> tuple[int, int]:
    """(offset, limit) from ?cursor= and ?limit=. A limit outside [1, cap] is clamped to it; one
    that is not an integer, or a cursor that is not ours, is a 400 (never a silent first page)."""
    raw = req.query_param("limit")
    if raw is None:
        limit = default
    else:
        try:
            if not raw.strip().isdigit():
                raise ValueError(raw)
            limit = min(max(int(raw), 1), cap)
        except ValueError:
            raise AdminError(400, "invalid `limit`: expected an integer (max %d)" % cap) from None
    c = req.query_param("cursor")
    offset = 0
    if c is not None:
        offset = decode_cursor(c)
        if offset is None:
            raise AdminError(400, "invalid or foreign pagination cursor")
    return offset, limit


def page(req, rows, default=LIST_LIMIT_DEFAULT, cap=LIST_LIMIT_MAX, start_limit=None) -> dict:
    """`{"items", "next_cursor"}` of an ordered list: the page ?cursor= and ?limit= select;
    next_cursor is null at the end. `start_limit` (offset, limit) when already parsed (a handler
    that must reject a bad cursor before other work calls page_params itself)."""
    offset, limit = start_limit or page_params(req, default, cap)
    items = list(rows[offset:offset + limit])
    end = offset + len(items)
    return {"items": items, "next_cursor": encode_cursor(end) if end < len(rows) else None}


# ---------------------------------------------------------------------------- ETag / If-Match
def if_match(req) -> str | None:
    """The If-Match header's tag with quotes and a weak prefix taken off; None when it is absent or
    `*` (unguarded)."""
    raw = req.header(b"if-match")
    if raw is None:
        return None
    s = raw.strip()
    if s == "*":
        return None
    if s.startswith("W/"):
        s = s[2:]
    return s.strip('"')


def config_if_match(req) -> int | None:
    """If-Match as a config version ("42", 42 or W/"42"); None when absent or `*`. Anything else
    is a 400: a malformed guard never passes as no guard."""
    tag = if_match(req)
    if tag is None:
        return None
    if not tag.isdigit():
        raise AdminError(400, "malformed If-Match: expected the config-plane ETag (a quoted config "
                         "version, e.g. \"42\") or *")
    return int(tag)


def check_version(expected: int | None, current: int):
    """409 version_conflict when the caller's If-Match version is not the current one."""
    if expected is not None and expected != current:
        raise AdminError(409, "If-Match version %d is stale (current is %d)" % (expected, current),
                         code="version_conflict")


def config_plane_version(gw) -> int:
    """The config-plane ETag's value. Where the live config keeps the Rust gateway's config version
    (`live.current`: +1 per config-plane change, a group write included), that; otherwise the
    running config's version plus the group writes since (`gw.plane_bumps`): both only grow, so the
    sum moves whenever either does."""
    live = getattr(gw, "live", None)
    if live is not None and hasattr(live, "current"):
        return live.current
    return gw.snapshot.version + getattr(gw, "plane_bumps", 0)


def bump_plane(gw, principal=OPERATOR, summary="") -> int:
    """A config-plane change that swapped no config (a group write): a new config version, in the
    version history where the live config keeps one."""
    live = getattr(gw, "live", None)
    if live is not None and hasattr(live, "record"):
        return live.record(principal, summary)
    gw.plane_bumps = getattr(gw, "plane_bumps", 0) + 1
    return config_plane_version(gw)


def etag(resp: Response, tag) -> Response:
    """The ETag header on `resp`: a config version (int) or a key's digest, quoted."""
    resp.headers += b'ETag: "%s"\r\n' % str(tag).encode("ascii")
    return resp


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
        self.limiter = MutationLimiter()
        self.audit_log = None   # busbar/admin/audit.py's AuditLog, set by whoever mounts the site
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
    if resp.status == 204:
        # No content, and so no Content-Length or Content-Type (RFC 9110 §8.6: a server must not
        # send Content-Length in a 204); the ETag and other headers still go.
        conn.write(b"%bCache-Control: no-store\r\n%b%b\r\n" % (
            status_line(204), resp.headers, b"" if keep_alive else b"Connection: close\r\n"))
        return
    conn.write(b"%bContent-Type: %b\r\nContent-Length: %d\r\nCache-Control: no-store\r\n%b%b\r\n%b" % (
        status_line(resp.status), resp.ctype, len(body), resp.headers,
        b"" if keep_alive else b"Connection: close\r\n", b"" if head_only else body))


class AdminExchange:
    """One admin request: authenticated, routed, answered; a handler may be a coroutine (a reload
    waits for every worker)."""

    __slots__ = ("site", "conn", "req", "task", "done", "_slot", "principal")

    def __init__(self, site, conn, req):
        self.site = site
        self.conn = conn
        self.req = req
        self.task = None
        self.done = False
        self._slot = None
        self.principal = ANONYMOUS

    def start(self):
        req = self.req
        site = self.site
        method = req.method.decode("latin-1").upper()
        route, found = site.routes.find(method, req.path)
        if route is not None and route.scope == PUBLIC:
            return self._run(route, found)
        resp = self._authorize(method, route)
        if resp is None:
            resp = self._spend(method)
        if resp is not None:
            return self.finish(resp)
        if route is None:
            if found:
                return self.finish(_method_not_allowed(method, found))
            return self.finish(error_response(404, "no admin endpoint %s" % req.path))
        return self._run(route, found)

    def _spend(self, method):
        """A mutation spends its class's budget before anything else runs (a refused or failed
        attempt too: enumeration costs budget)."""
        path = self.req.path
        if method not in MUTATING_METHODS or not path.startswith(PREFIX):
            return None
        cls = mutation_class(path)
        admitted, first = self.site.limiter.check(self.principal, cls)
        if admitted:
            return None
        if first:
            self.site.audit_log.record("admin.rate_limited", "%s:%s" % (cls, path), "rejected",
                                       self.principal)
        resp = error_response(429, "admin mutation rate limit exceeded; retry next minute")
        resp.headers += b"Retry-After: %d\r\n" % MUTATION_WINDOW_SECS
        return resp

    def _authorize(self, method, route):
        site = self.site
        if site.open:
            self.principal = ANONYMOUS
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
        self.principal = OPERATOR
        need = route.scope if route is not None and route.scope else required_scope(method, self.req.path)
        if need == "full" and tok.scope != "full":
            # Audited once per principal and window: a probing credential leaves a trail without
            # each refused call costing a store write.
            _, first = site.limiter.check(self.principal, "forbidden")
            if first:
                site.audit_log.record("admin.forbidden", self.req.path, "rejected", self.principal)
            return error_response(403, "insufficient scope: this endpoint requires `full` (the "
                                  "token of identity provider '%s' is %s)" % (tok.name, tok.scope))
        return None

    def _run(self, route, params):
        areq = AdminRequest(self.req, params, self.site, self.principal)
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
        # the detail is in the log, never in the answer
        self.finish(error_response(500, "internal error"))

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
