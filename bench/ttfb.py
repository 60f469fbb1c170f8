"""Streaming time to first byte: N sequential streamed requests per target, interleaved target by
target (direct, busbar, floor, ... then again; rotate=True: direct, floor, ..., busbar the next
round, and so on), each target on its own keep-alive connection.

TTFB here is the time from writing the request to the arrival of the first byte of the response
*body* (the first stream frame), not of the headers: a gateway that answered headers at once and the
model's first token later would otherwise look free.

"Arrival" is the kernel's receive timestamp of the segment holding that byte (SO_TIMESTAMPNS), not
the moment this client got around to reading it. On two cores the client has to share one with the
mock or the gateway, and both write a stream's frames in a burst: a client timing its own reads
measured the scheduler (the same direct request read at 90 µs or 340 µs depending on where it ran).
The head is consumed exactly (peek, then take the head's bytes), then the first body byte alone, so
the timestamp belongs to that byte's segment; the rest of the stream is read in large reads.
"""
from __future__ import annotations

import socket
import struct
import time

import httptools

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)   # Linux; SCM_TIMESTAMPNS is the same value
_CMSG_SPACE = socket.CMSG_SPACE(16)


class _Response:
    """httptools callbacks for one response."""

    def __init__(self):
        self.status = 0
        self.timing = None
        self.body_seen = False
        self.complete = False
        self.head = []
        self.parser = None

    def on_header(self, name, value):
        if name.lower() == b"server-timing":
            self.timing = value

    def on_headers_complete(self):
        self.status = self.parser.get_status_code()

    def on_body(self, body):
        self.body_seen = True
        if len(self.head) < 4:
            self.head.append(body)

    def on_message_complete(self):
        self.complete = True


class _Conn:
    def __init__(self, port):
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)

    def _recv_one(self):
        """One byte, the kernel's arrival time of its segment (ns, CLOCK_REALTIME), and whether
        that time is the kernel's (else it is the time of this read)."""
        data, anc, _, _ = self.sock.recvmsg(1, _CMSG_SPACE)
        if not data:
            raise ConnectionError("connection closed before the response ended")
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
                sec, nsec = struct.unpack("qq", payload[:16])
                return data, sec * 1_000_000_000 + nsec, True
        return data, time.time_ns(), False

    def _read_head(self) -> bytes:
        """Consumes exactly the response head (through its blank line), in a few large reads:
        peek at what has arrived, take the head bytes only. Reading it a byte at a time instead
        cost the client ~0.5 ms of syscalls, which on a shared core delayed the mock's next write."""
        sock = self.sock
        buf = b""
        while True:
            seen = sock.recv(65536, socket.MSG_PEEK)
            if not seen:
                raise ConnectionError("connection closed before the response head ended")
            end = (buf[-3:] + seen).find(b"\r\n\r\n")
            if end < 0:
                buf += _recv_exactly(sock, len(seen))
                continue
            take = end + 4 - len(buf[-3:])
            return buf + _recv_exactly(sock, take)

    def request(self, data: bytes):
        """(ttfb_ns, total_ns, status, server_timing header or None, body head, kernel-stamped)."""
        r = _Response()
        r.parser = p = httptools.HttpResponseParser(r)
        t0 = time.time_ns()
        self.sock.sendall(data)
        t_first, stamped = 0, False
        try:
            p.feed_data(self._read_head())
            if r.complete:
                t_first = time.time_ns()
            else:
                # The first body byte alone, so the timestamp is its own segment's.
                byte, t_first, stamped = self._recv_one()
                p.feed_data(byte)
            while not r.complete:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("connection closed before the response ended")
                p.feed_data(chunk)
        except httptools.HttpParserError as e:
            raise ConnectionError("malformed response: %s" % (e,)) from None
        t_end = time.time_ns()
        return t_first - t0, t_end - t0, r.status, r.timing, b"".join(r.head)[:300], stamped

    def close(self):
        self.sock.close()


def _recv_exactly(sock, n: int) -> bytes:
    out = []
    while n > 0:
        chunk = sock.recv(n)
        if not chunk:
            raise ConnectionError("connection closed before the response head ended")
        out.append(chunk)
        n -= len(chunk)
    return b"".join(out)


def _request_bytes(port: int, path: str, headers: dict, body: bytes) -> bytes:
    lines = ["POST %s HTTP/1.1" % path, "Host: 127.0.0.1:%d" % port]
    lines += ["%s: %s" % kv for kv in headers.items()]
    lines.append("Content-Length: %d" % len(body))
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def balanced_orders(m: int) -> list:
    """Orders of range(m) (a Williams design) in which every element takes every place equally
    often and comes right after every other element equally often: m orders for an even m, 2m for
    an odd m. Cycling through them, no element's request always follows the same neighbour's."""
    first, lo, hi = [0], 1, m - 1
    while len(first) < m:
        if len(first) % 2:
            first.append(lo)
            lo += 1
        else:
            first.append(hi)
            hi -= 1
    rows = [[(x + i) % m for x in first] for i in range(m)]
    if m % 2:
        rows += [row[::-1] for row in rows]
    return rows


def measure(targets: dict, n: int, warmup: int = 5, after_each=None, rotate=False):
    """targets: name -> (port, path, headers, body template with @SEQ@). after_each(name), if
    given, is called after each request (to wait until that target has gone idle). rotate: the
    first target (direct, the one the others are paired with) opens every round and the others
    follow in the orders of balanced_orders, one a round, so that each takes every place in the
    round equally often and comes right after each other target equally often. In a fixed order
    the gateway in a given place paid more (bench/c1_isolation.py, small calls on one core:
    busbar's gap to 85eaf0e +13 to +15 µs in every round where busbar came right after direct,
    +5 to +8 in every round where 85eaf0e did). Rotating the list by one each round (d, a, b, c;
    d, b, c, a; d, c, a, b) evened out the places but kept the cyclic order, so one target came
    right after another in most rounds: with LiteLLM last in the list, busbar came right after
    LiteLLM in three rounds of four and 85eaf0e never, and paid for what LiteLLM leaves behind on
    the shared core (streamed OpenAI -> OpenAI, busbar - 85eaf0e: +71 and +42 µs with LiteLLM in
    the rounds, +1 and -1 µs without it, the same build; bench/stream_ab.py with an idle LiteLLM
    on the core: +0.7).

    Returns (name -> list of samples (ttfb_ns, total_ns, status, server_timing, body head,
    kernel-stamped),
    name -> error text for a target that failed and was dropped)."""
    conns, errors = {}, {}
    out = {name: [] for name in targets}
    try:
        for name, (port, _, _, _) in targets.items():
            try:
                conns[name] = _Conn(port)
            except OSError as e:
                errors[name] = "connect failed: %s" % (e,)
        seq = 0
        names = list(targets)
        first, rest = names[:1], names[1:]
        orders = balanced_orders(len(rest)) if rotate and rest else [list(range(len(rest)))]
        for i in range(warmup + n):
            for name in first + [rest[j] for j in orders[(i - warmup) % len(orders)]]:
                port, path, headers, template = targets[name]
                if name in errors:
                    continue
                seq += 1
                data = _request_bytes(port, path, headers, template.replace(b"@SEQ@", b"t%d" % seq))
                try:
                    sample = conns[name].request(data)
                except OSError as e:
                    errors[name] = "request %d failed: %s" % (i + 1, e or e.__class__.__name__)
                    continue
                if i >= warmup:
                    out[name].append(sample)
                if after_each is not None:
                    after_each(name)
        return out, errors
    finally:
        for c in conns.values():
            c.close()
