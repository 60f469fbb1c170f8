"""When the gateway closes a client connection (issue 7, defect 8), through the real server with raw
sockets: a request that asks for `Connection: close` (or speaks HTTP/1.0) is answered and the socket
closed right after; a client that half-closes is not kept as an idle keep-alive connection; garbage
pipelined after a valid request is answered with a 400 after the valid answer, then the close."""
import json
import socket
import time

from tests.integration.test_server_http import _read_responses

BODY = json.dumps({"model": "oai-model", "messages": [{"role": "user", "content": "hi"}]}).encode()


def _request(version=b"HTTP/1.1", extra=b""):
    return (b"POST /v1/chat/completions " + version + b"\r\nHost: x\r\nContent-Type: application/json\r\n"
            + extra + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY)


def _closed_within(sock, secs):
    """Reads until EOF; returns the seconds it took, or None when the socket stayed open."""
    sock.settimeout(secs)
    t0 = time.monotonic()
    try:
        while sock.recv(65536):
            pass
    except socket.timeout:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - t0


def test_connection_close_is_honoured_at_once(gateway):
    # The gateway's idle timeout is 5 s: a close within 1 s is the gateway closing on purpose.
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(_request(extra=b"Connection: close\r\n"))
        (status, headers, body), = _read_responses(s, 1)[0]
        assert status == 200 and headers["connection"] == "close"
        assert json.loads(body)["object"] == "chat.completion"
        took = _closed_within(s, 2.0)
        assert took is not None and took < 1.0


def test_http_10_is_answered_then_closed(gateway):
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(_request(version=b"HTTP/1.0"))
        (status, headers, _), = _read_responses(s, 1)[0]
        assert status == 200 and headers["connection"] == "close"
        took = _closed_within(s, 2.0)
        assert took is not None and took < 1.0


def test_a_half_closed_client_is_not_kept_idle(gateway):
    # Idle and half-closed: closed at once.
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(_request())
        (status, headers, _), = _read_responses(s, 1)[0]
        assert status == 200 and "connection" not in headers      # keep-alive
        s.shutdown(socket.SHUT_WR)
        took = _closed_within(s, 2.0)
        assert took is not None and took < 1.0
    # Half-closed with a request in flight (an SDK cancelling): the request is cancelled and the
    # connection closed, not kept as an idle keep-alive connection until the idle timeout.
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(_request())
        s.shutdown(socket.SHUT_WR)
        took = _closed_within(s, 2.0)
        assert took is not None and took < 1.0


def test_pipelined_garbage_after_a_valid_request_gets_a_400_then_the_close(gateway):
    with socket.create_connection(("127.0.0.1", gateway.port)) as s:
        s.sendall(_request() + b"\x16\x03\x01 this is not HTTP\r\n\r\n")
        responses, _ = _read_responses(s, 2)
        assert [r[0] for r in responses] == [200, 400]
        assert json.loads(responses[0][2])["object"] == "chat.completion"
        assert json.loads(responses[1][2])["error"]["message"] == "Malformed HTTP request."
        assert responses[1][1]["connection"] == "close"
        assert _closed_within(s, 2.0) is not None
