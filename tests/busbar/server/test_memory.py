"""Large request bodies do not stay in memory (issue 7, defect 4): after requests of 31-33 MiB
(answered 400 or 413), the worker's RSS comes back to within 10 % of its baseline with no forced
collection, through the real server with real sockets."""
import json
import socket
import time


from tests.conftest import start_gateway, stop


def _rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS")


BODY = json.dumps({"model": "oai", "messages": [{"role": "user", "content": "hi"}]}).encode()
REQ = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
       b"Content-Length: %d\r\n\r\n%b" % (len(BODY), BODY))


def _ordinary(port, n):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        for _ in range(n):
            s.sendall(REQ)
            buf = b""
            while not (b"\r\n\r\n" in buf and buf.endswith(b"}")):
                d = s.recv(65536)
                assert d
                buf += d
            assert buf.startswith(b"HTTP/1.1 200")


def _big(port, size, chunked):
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        try:
            if chunked:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Transfer-Encoding: chunked\r\n\r\n")
                piece = b"x" * (1 << 20)
                for _ in range(size >> 20):
                    s.sendall(b"%x\r\n%b\r\n" % (len(piece), piece))
                s.sendall(b"0\r\n\r\n")
            else:
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                          % size)
                s.sendall(b"{" + b"x" * (size - 1))
        except OSError:
            pass        # a 413 may close before the whole body is sent
        return s.recv(64)[:12]


def test_rss_returns_to_baseline_after_large_bodies(mock_port, tmp_path):
    gw = start_gateway(tmp_path, """listen: "127.0.0.1:{port}"
providers:
  m: {protocol: openai, base_url: "http://127.0.0.1:%d", api_key: {env: MOCK_KEY}}
models:
  oai: {provider: m, upstream_model: gpt-4o-mini}
""" % mock_port)
    try:
        _ordinary(gw.port, 300)
        base = _rss_mib(gw.proc.pid)
        got = [_big(gw.port, size, chunked) for size, chunked in [
            (31 << 20, False), (int(31.5 * (1 << 20)), False), (32 << 20, False),
            (33 << 20, True), (33 << 20, False), (31 << 20, True)]]
        assert got == [b"HTTP/1.1 400"] * 3 + [b"HTTP/1.1 413"] * 2 + [b"HTTP/1.1 400"]
        _ordinary(gw.port, 2000)
        time.sleep(0.5)
        after = _rss_mib(gw.proc.pid)
        assert after <= base * 1.10, (base, after)
    finally:
        stop(gw.proc)
