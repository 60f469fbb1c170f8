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
