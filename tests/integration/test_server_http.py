"""The ingress HTTP/1.1 server, spoken to with raw sockets: keep-alive, pipelining, chunked bodies,
Expect: 100-continue, limits, malformed input, native error shapes, Server-Timing."""
import json
import re
import socket
import time

import pytest


def _read_responses(sock, count, timeout=10.0):
    """Reads `count` HTTP/1.1 responses (Content-Length or chunked) from sock."""
    sock.settimeout(timeout)
    buf = b""
    out = []
    while len(out) < count:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                return out, buf
            buf += chunk
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            k, _, v = line.partition(b":")
            headers[k.strip().lower().decode()] = v.strip().decode()
        if status == 100:
            continue
        if "content-length" in headers:
            n = int(headers["content-length"])
            while len(buf) < n:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                buf += chunk
            body, buf = buf[:n], buf[n:]
        else:
            body = b""
            while True:
                while b"\r\n" not in buf:
                    buf += sock.recv(65536)
                size_line, _, buf = buf.partition(b"\r\n")
                size = int(size_line, 16)
                while len(buf) < size + 2:
                    buf += sock.recv(65536)
                body += buf[:size]
                buf = buf[size + 2:]
                if size == 0:
                    break
        out.append((status, headers, body))
    return out, buf


def _chat(model="oai-model", text="hello", **extra):
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    body.update(extra)
    return json.dumps(body).encode()


def _post(path, body, headers=b""):
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n"
            % (path.encode(), headers, len(body)) + body)


def connect(gateway):
    return socket.create_connection(("127.0.0.1", gateway.port), timeout=10)


def test_healthz(gateway):
    with connect(gateway) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        (status, headers, body), = _read_responses(s, 1)[0]
    assert status == 200 and body == b"ok"


def test_keep_alive_and_pipelining_in_order(gateway):
    with connect(gateway) as s:
        reqs = b"".join(_post("/v1/chat/completions", _chat(text="req-%d" % i)) for i in range(5))
        s.sendall(reqs)
        got, _ = _read_responses(s, 5)
        assert [r[0] for r in got] == [200] * 5
        for i, (_, _, body) in enumerate(got):
            assert "req-%d" % i in json.loads(body)["choices"][0]["message"]["content"]
        # the connection is still usable afterwards
        s.sendall(_post("/v1/chat/completions", _chat(text="after")))
        (status, _, body), = _read_responses(s, 1)[0]
        assert status == 200 and b"after" in body


def test_chunked_request_body(gateway):
    body = _chat(text="chunked-body")
    half = len(body) // 2
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
           b"Content-Type: application/json\r\n\r\n"
           + b"%x\r\n%s\r\n" % (half, body[:half]) + b"%x\r\n%s\r\n" % (len(body) - half, body[half:])
           + b"0\r\n\r\n")
    with connect(gateway) as s:
        s.sendall(req)
        (status, _, resp), = _read_responses(s, 1)[0]
    assert status == 200 and b"chunked-body" in resp


def test_expect_100_continue(gateway):
    body = _chat(text="continued")
    with connect(gateway) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                  b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
        s.settimeout(5)
        assert s.recv(64).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        s.sendall(body)
        (status, _, resp), = _read_responses(s, 1)[0]
    assert status == 200 and b"continued" in resp


def test_server_timing_header(gateway):
    with connect(gateway) as s:
        s.sendall(_post("/v1/chat/completions", _chat()))
        (status, headers, _), = _read_responses(s, 1)[0]
    assert status == 200
    m = re.fullmatch(r"busbar;dur=(\d+\.\d{3})", headers["server-timing"])
    assert m and float(m.group(1)) < 1000


@pytest.mark.parametrize("path,headers,shape", [
    ("/v1/chat/completions", b"", "openai"),
    ("/v1/messages", b"anthropic-version: 2023-06-01\r\n", "anthropic"),
])
def test_body_too_large_is_413_native_and_closes(gateway, path, headers, shape):
    with connect(gateway) as s:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\n\r\n"
                  % (path.encode(), headers, 2 * 1024 * 1024))
        (status, _, body), = _read_responses(s, 1)[0]
        assert status == 413
        doc = json.loads(body)
        if shape == "openai":
            assert "maximum allowed size" in doc["error"]["message"]
        else:
            assert doc["type"] == "error" and doc["error"]["type"] == "request_too_large"
        s.settimeout(5)
        try:
            assert s.recv(10) == b""
        except ConnectionResetError:
            pass  # closed with unread bytes: a reset instead of EOF, still closed


def test_malformed_http_is_400_and_server_keeps_serving(gateway):
    with connect(gateway) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        (status, _, _), = _read_responses(s, 1)[0]
        assert status == 400
    with connect(gateway) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_responses(s, 1)[0][0][0] == 200


def test_oversized_headers_431(gateway):
    with connect(gateway) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70000 + b"\r\n\r\n")
        (status, _, _), = _read_responses(s, 1)[0]
    assert status == 431


def test_slow_header_client_times_out_without_hurting_others(gateway):
    slow = connect(gateway)
    slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")  # never finishes headers
    with connect(gateway) as s:
        s.sendall(_post("/v1/chat/completions", _chat(text="neighbour")))
        assert _read_responses(s, 1)[0][0][0] == 200
    slow.settimeout(10)
    t = time.monotonic()
    data = slow.recv(4096)
    assert data.startswith(b"HTTP/1.1 408") and time.monotonic() - t < 8
    slow.close()


@pytest.mark.parametrize("body,message", [
    (b"{not json", "We could not parse the JSON body of your request."),
    (b'{"messages": []}', "Missing required parameter: 'model'."),
    (b'{"model": "", "messages": []}', "Missing required parameter: 'model'."),
])
def test_bad_bodies_openai(gateway, body, message):
    with connect(gateway) as s:
        s.sendall(_post("/v1/chat/completions", body))
        (status, _, resp), = _read_responses(s, 1)[0]
        assert status == 400
        assert json.loads(resp)["error"]["message"] == message
        s.sendall(_post("/v1/chat/completions", _chat()))  # same connection keeps serving
        assert _read_responses(s, 1)[0][0][0] == 200


def test_unknown_model_404_native(gateway):
    with connect(gateway) as s:
        s.sendall(_post("/v1/chat/completions", _chat(model="nope")))
        (status, _, resp), = _read_responses(s, 1)[0]
        assert status == 404
        assert json.loads(resp)["error"]["message"] == (
            "The model 'nope' does not exist or you do not have access to it.")
        s.sendall(_post("/nope/v1/messages", b'{"max_tokens":5,"messages":[]}',
                        b"anthropic-version: 2023-06-01\r\n"))
        (status, headers, resp), = _read_responses(s, 1)[0]
        doc = json.loads(resp)
        assert status == 404 and doc["error"]["type"] == "not_found_error"
        assert headers["request-id"] == doc["request_id"]


def test_models_list_dialects(gateway):
    with connect(gateway) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        (status, _, body), = _read_responses(s, 1)[0]
        ids = [m["id"] for m in json.loads(body)["data"]]
        assert status == 200 and ids[:2] == ["failover", "mixed"] and "oai-model" in ids
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nanthropic-version: 2023-06-01\r\n\r\n")
        (status, _, body), = _read_responses(s, 1)[0]
        doc = json.loads(body)
        assert doc["has_more"] is False and doc["data"][0]["type"] == "model"


def test_wrong_method_405(gateway):
    with connect(gateway) as s:
        s.sendall(b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n")
        (status, _, _), = _read_responses(s, 1)[0]
    assert status == 405


def test_failover_before_first_byte(gateway):
    # 'failover' prefers dead-model (weight 100, nothing listens there): the request must land
    # on ant-model, translated, without the client noticing.
    with connect(gateway) as s:
        s.sendall(_post("/v1/chat/completions", _chat(model="failover", text="survive")))
        (status, _, body), = _read_responses(s, 1)[0]
    assert status == 200
    assert "survive" in json.loads(body)["choices"][0]["message"]["content"]


def test_upstream_4xx_relayed_same_protocol_and_reenveloped_cross(gateway):
    with connect(gateway) as s:
        s.sendall(_post("/v1/chat/completions", _chat(text="#mock:status=400")))
        (status, _, body), = _read_responses(s, 1)[0]
        assert status == 400 and "mock failure 400" in json.loads(body)["error"]["message"]
        s.sendall(_post("/v1/chat/completions", _chat(model="ant-model", text="#mock:status=400")))
        (status, _, body), = _read_responses(s, 1)[0]
        err = json.loads(body)["error"]
        assert status == 400 and err["type"] == "invalid_request_error"
        assert "mock failure 400" in err["message"]


def test_mid_stream_abort_ends_with_native_error(gateway):
    with connect(gateway) as s:
        s.sendall(_post("/v1/chat/completions", _chat(model="ant-model", stream=True,
                                                      text="#mock:abort_after=3 #mock:tokens=50")))
        (status, _, body), = _read_responses(s, 1)[0]
    assert status == 200
    frames = [f for f in body.split(b"\n\n") if f.strip()]
    assert b'"error"' in frames[-1]
