# cython: boundscheck=True, wraparound=True, cdivision=False, initializedcheck=True, annotation_typing=False
"""A client's request as the ingress read it: what busbar/server/http.py hands to an exchange.

In the engine, not the server, so the exchange can type it (busbar/engine/exchange.pxd) while layers
still point one way (server -> engine)."""
from __future__ import annotations


class Request:
    """method (bytes), path and query (str), headers ({lowercase bytes: bytes}), body (bytes),
    t0 (perf_counter_ns when its first byte was read), keep_alive."""

    def __init__(self, method, path, query, headers, body, t0, keep_alive):
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.t0 = t0
        self.keep_alive = keep_alive


def new_request(method, path, query, headers, body, t0, keep_alive):
    """Request(...) as the server builds one per request (compiled: request.pxd types it, and the
    server cimports it): the members stored directly, without the constructor's call through
    Python and its argument parsing."""
    r = Request.__new__(Request)
    r.method = method
    r.path = path
    r.query = query
    r.headers = headers
    r.body = body
    r.t0 = t0
    r.keep_alive = keep_alive
    return r
