# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""What a listener answers itself: one route table type, (method, path) → handler, for every
listener busbar has.

- The data listener's table (`Gateway.routes`): busbar's own answers about itself (`/healthz`,
  `/stats`, the model list and one model's entry: busbar/server/local.py registers them), what
  other parts add (`/metrics` with a prometheus export), and the answers to what the
  protocol dispatch refuses (an unknown path, a wrong method, an operation busbar does not serve),
  in the caller's protocol.
- The admin listener's table (`Gateway.admin_routes`, served by busbar/admin/site.py): the admin
  API (busbar/admin/api.py), governance's endpoints (busbar/governance/admin.py), the status page,
  `/metrics`, `/status.json` and `/stats` (busbar/observability/routes.py).

Every part registers the same way, when it is wired into the worker:

    gw.routes.add("GET", "/metrics", handler)                          # the data listener
    gw.admin_routes.add("GET", "/api/v1/admin/pools/{name}", handler)  # the admin listener

A pattern is literal segments and `{name}` placeholders (one non-empty segment each), or literal
segments then `{name...}`: the rest of the path as it came, slashes included, possibly empty. No
regex on the request path. Method "*" matches
every method. A handler takes the listener's request and returns a `Response`: on the admin
listener an AdminRequest, and it may return a coroutine giving the Response (a reload waits for
every worker); on the data listener the Exchange itself, so that an answer can be in the caller's
protocol (`ex.error`) or wait for the governance gate, and then the handler answers through the
exchange and returns None. `scope` is the admin listener's (PUBLIC, or the token scope needed);
the data listener has none.
"""
from __future__ import annotations

PUBLIC = "public"


class Response:
    """A local answer: status, body (bytes), content type, extra header lines (bytes)."""

    __slots__ = ("status", "body", "ctype", "headers")

    def __init__(self, status=200, body=b"", ctype=b"application/json", headers=b""):
        self.status = status
        self.body = body
        self.ctype = ctype
        self.headers = headers


class LocalRoute:
    """One entry of a table: `parts` are the pattern's segments; `tail` names the `{name...}`
    parameter that takes the rest of the path after `prefix` (None: the pattern has none)."""

    __slots__ = ("method", "bmethod", "pattern", "parts", "handler", "scope", "summary", "prefix",
                 "tail")

    def __init__(self, method, pattern, handler, scope, summary):
        self.method = method
        self.bmethod = method.encode("latin-1")
        self.pattern = pattern
        self.parts = tuple(pattern.strip("/").split("/")) if pattern != "/" else ()
        self.handler = handler
        self.scope = scope
        self.summary = summary
        # The literal start of the pattern, up to its first placeholder (all of it when none).
        i = pattern.find("{")
        self.prefix = pattern if i < 0 else pattern[:i]
        self.tail = None
        if pattern.endswith("...}"):
            if "{" in self.prefix or "}" in self.prefix or not pattern[i + 1:-4].isidentifier():
                raise ValueError("{name...} follows literal segments only: %r" % pattern)
            self.tail = pattern[i + 1:-4]

    def match(self, path, parts):
        """The parameters when the path (and its segments, `parts`) match, else None."""
        if self.tail is not None:
            if path.startswith(self.prefix):
                return {self.tail: path[len(self.prefix):]}
            return None
        want = self.parts
        if len(parts) != len(want):
            return None
        params = {}
        for i in range(len(want)):
            w = want[i]
            got = parts[i]
            if w.startswith("{") and w.endswith("}"):
                if not got:
                    return None
                params[w[1:-1]] = got
            elif w != got:
                return None
        return params


def _split(path):
    return tuple(path.strip("/").split("/")) if path != "/" else ()


class Routes:
    """A listener's route table."""

    def __init__(self):
        self.table = []         # every LocalRoute, in the order added (the OpenAPI document's)
        self.exact = {}         # path → [LocalRoute]: the entries without a placeholder
        self.patterned = []     # the entries with one
        # The data listener's answers to what the protocol dispatch refuses, by Route kind
        # (busbar/engine/route.py NOT_FOUND, METHOD, UNSUPPORTED): handler(ex), in the caller's
        # protocol. The admin listener answers its misses itself (404, 405 with Allow).
        self.refusals = {}

    def add(self, method, pattern, handler, scope=None, summary=""):
        r = LocalRoute(method.upper(), pattern, handler, scope, summary)
        self.table.append(r)
        if r.prefix == pattern:
            self.exact.setdefault(pattern, []).append(r)
        else:
            self.patterned.append(r)
        return r

    def refuse(self, kind, handler):
        """`handler(ex)` answers a request the data listener's protocol dispatch refused as
        `kind`."""
        self.refusals[kind] = handler

    def match(self, method, path):
        """The data listener's lookup: (entry, {param: value}) for a `method` (bytes) that the
        entry names exactly or by "*", or None. No HEAD-for-GET: the data listener answers a
        method only where an entry names it."""
        entries = self.exact.get(path)
        if entries is not None:
            for r in entries:
                if r.bmethod == method or r.method == "*":
                    return r, None
        if self.patterned:
            parts = None
            for r in self.patterned:
                if (r.bmethod == method or r.method == "*") and path.startswith(r.prefix):
                    if parts is None:
                        parts = _split(path)
                    params = r.match(path, parts)
                    if params is not None:
                        return r, params
        return None

    def find(self, method, path):
        """The admin listener's lookup: (entry, params), or (None, the methods the path has)
        when only the path matched (a 405) or nothing did (a 404: empty). HEAD is answered where
        GET is."""
        parts = _split(path)
        allowed = []
        for r in self.table:
            params = r.match(path, parts)
            if params is not None:
                if r.method == method or r.method == "*" or (method == "HEAD" and r.method == "GET"):
                    return r, params
                allowed.append(r.method)
        return None, allowed
