"""HTTP/1.1 bits shared by the server (errors it writes itself) and the engine (answers): status
lines, and a header's value in a parsed response's header list."""
from __future__ import annotations

REASONS = {
    100: b"Continue", 200: b"OK", 201: b"Created", 202: b"Accepted", 204: b"No Content",
    400: b"Bad Request", 401: b"Unauthorized", 403: b"Forbidden",
    404: b"Not Found", 405: b"Method Not Allowed", 408: b"Request Timeout", 409: b"Conflict",
    413: b"Payload Too Large", 429: b"Too Many Requests", 431: b"Request Header Fields Too Large",
    500: b"Internal Server Error", 502: b"Bad Gateway", 503: b"Service Unavailable",
    504: b"Gateway Timeout", 529: b"Site Overloaded",
}

_STATUS_LINES = {code: b"HTTP/1.1 %d %s\r\n" % (code, reason) for code, reason in REASONS.items()}


def status_line(status):
    """b"HTTP/1.1 <status> <reason>\r\n" (compiled: status.pxd types it `cpdef bytes (int)`)."""
    line = _STATUS_LINES.get(status)
    if line is None:
        line = b"HTTP/1.1 %d %s\r\n" % (status, REASONS.get(status, b"Status"))
    return line


def header(headers, name):
    """The first value of the header `name` (lowercase bytes) in a [(name, value)] list (an
    upstream response's, as busbar/upstream/pool.py parsed it), or None."""
    for k, v in headers:
        if k == name:
            return v
    return None
