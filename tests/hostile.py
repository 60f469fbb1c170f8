"""A hostile upstream for fault tests: a plain-socket HTTP/1.1 server on loopback whose answer to
each request is a function written in the test (`behaviour(conn, req)`), so a test can send
interim 1xx responses, reset, hang, stall a body, send garbage or a malformed 200 — what real
providers and the proxies in front of them do on a bad day, and what the built-in mock's friendly
directives cannot.

The behaviour is chosen per request by the upstream model name the gateway sent (the lane's
`upstream_model`, found in the body or the path), so one server can play several lanes. Each
connection runs in its own thread; every socket has a timeout, and `close()` ends them all.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time


class Req:
    __slots__ = ("method", "path", "headers", "body", "model", "conn_id")

    def __init__(self, method, path, headers, body, conn_id):
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
        self.conn_id = conn_id
        m = None
        try:
            m = json.loads(body).get("model") if body else None
        except (ValueError, AttributeError):
            pass
        if m is None:
            hit = re.search(r"/models?/([^/:]+)", path)
            m = hit.group(1) if hit else None
        self.model = m

    def json(self):
        return json.loads(self.body)


class HostileUpstream:
    def __init__(self, behaviours: dict, default=None):
        self.behaviours = behaviours
        self.default = default
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self.requests = []          # every Req received, in order
        self.closed_conns = []      # (conn_id, monotonic time) when a peer closed on us
        self.conns = []
        self.lock = threading.Lock()
        self._stop = False
        self._n = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            c.settimeout(30)
            with self.lock:
                self._n += 1
                cid = self._n
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c, cid), daemon=True).start()

    def _serve(self, c, cid):
        buf = b""
        try:
            while not self._stop:
                while b"\r\n\r\n" not in buf:
                    data = c.recv(65536)
                    if not data:
                        self._peer_closed(cid)
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", "0"))
                while len(buf) < n:
                    data = c.recv(65536)
                    if not data:
                        self._peer_closed(cid)
                        return
                    buf += data
                body, buf = buf[:n], buf[n:]
                req = Req(method, path, headers, body, cid)
                with self.lock:
                    self.requests.append(req)
                fn = self.behaviours.get(req.model, self.default)
                if fn is None:
                    c.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                if fn(c, req) is False:     # the behaviour closed or gave up the connection
                    return
        except OSError:
            self._peer_closed(cid)
        finally:
            try:
                c.close()
            except OSError:
                pass

    def _peer_closed(self, cid):
        with self.lock:
            self.closed_conns.append((cid, time.monotonic()))

    def count(self, model) -> int:
        with self.lock:
            return sum(1 for r in self.requests if r.model == model)

    def close(self):
        self._stop = True
        try:
            self.sock.close()
        except OSError:
            pass
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                try:
                    c.close()
                except OSError:
                    pass


# ---------------------------------------------------------------- answers in each protocol

def openai_body(text: str, model: str = "gpt-hostile", usage=(5, 3)) -> bytes:
    return json.dumps({
        "id": "chatcmpl-h", "object": "chat.completion", "created": 1700000000, "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                  "total_tokens": usage[0] + usage[1]}}).encode()


def openai_sse(text: str, model: str = "gpt-hostile", done: bool = True, usage=(5, 3)) -> bytes:
    def ev(obj):
        return b"data: " + json.dumps(obj).encode() + b"\n\n"
    base = {"id": "chatcmpl-h", "object": "chat.completion.chunk", "created": 1700000000,
            "model": model}
    out = ev(dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                  "finish_reason": None}]))
    out += ev(dict(base, choices=[{"index": 0, "delta": {"content": text}, "finish_reason": None}]))
    if done:
        out += ev(dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
        out += ev(dict(base, choices=[], usage={"prompt_tokens": usage[0],
                                                "completion_tokens": usage[1],
                                                "total_tokens": sum(usage)}))
        out += b"data: [DONE]\n\n"
    return out


def http_response(status: int, body: bytes, ctype: str = "application/json", extra: str = "",
                  reason: str = "X") -> bytes:
    return ("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n" % (
        status, reason, ctype, len(body), extra)).encode() + body


def chunked_head(status: int = 200, ctype: str = "text/event-stream") -> bytes:
    return ("HTTP/1.1 %d OK\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n" % (
        status, ctype)).encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def reset(c):
    """Close with RST instead of FIN."""
    import struct
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    return False


def hang(seconds: float = 20):
    def fn(c, req):
        time.sleep(seconds)
        return False
    return fn
