"""What busbar sends upstream, seen by a capturing upstream: same-protocol bodies byte for byte but
the spliced model, gateway-built headers only (auth per protocol, the SDK's User-Agent, Accept), beta
headers forwarded on same-protocol routes only, and the response relayed byte for byte."""
import http.client
import json
import socket
import threading

import pytest

from tests.conftest import free_port, stop, start_gateway

OPENAI_REPLY = (b'{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"up-model",'
                b'"choices":[{"index":0,"message":{"role":"assistant","content":"  spaced  "},'
                b'"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}')
ANTHROPIC_REPLY = (b'{"id":"msg_x","type":"message","role":"assistant","model":"up-model","content":'
                   b'[{"type":"text","text":"hi"}],"stop_reason":"end_turn","stop_sequence":null,'
                   b'"usage":{"input_tokens":3,"output_tokens":2}}')


class Capture:
    """A one-thread HTTP/1.1 upstream that records each raw request and answers a canned body."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.requests = []
        self.stopped = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.sock.settimeout(0.5)
        while not self.stopped:
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._conn, args=(c,), daemon=True).start()

    def _conn(self, c):
        c.settimeout(30)
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    d = c.recv(65536)
                    if not d:
                        return
                    buf += d
                head, _, buf = buf.partition(b"\r\n\r\n")
                n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0]
                        .split(b":")[1])
                while len(buf) < n:
                    buf += c.recv(65536)
                body, buf = buf[:n], buf[n:]
                self.requests.append((head, body))
                reply = ANTHROPIC_REPLY if b"/v1/messages" in head.split(b"\r\n")[0] else OPENAI_REPLY
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nrequest-id: req_up\r\n"
                          b"x-ratelimit-remaining: 5\r\nContent-Length: %d\r\n\r\n%s" % (len(reply), reply))
        except OSError:
            pass
        finally:
            c.close()


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    cap = Capture()
    port = free_port()
    gw = start_gateway(tmp_path_factory.mktemp("egress"), f"""
listen: "127.0.0.1:{port}"
providers:
  o: {{protocol: openai, base_url: "http://127.0.0.1:{cap.port}", api_key: {{env: MOCK_KEY}}}}
  a: {{protocol: anthropic, base_url: "http://127.0.0.1:{cap.port}", api_key: {{env: MOCK_KEY}}}}
models:
  up-model: {{provider: o}}
  alias: {{provider: o, upstream_model: up-model}}
  claude: {{provider: a, upstream_model: up-model}}
""", port=port)
    yield port, cap
    stop(gw.proc)
    cap.stopped = True


def _send(port, path, body: bytes, headers):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    c.request("POST", path, body, headers)
    r = c.getresponse()
    out = r.status, dict((k.lower(), v) for k, v in r.getheaders()), r.read()
    c.close()
    return out


def _headers(head):
    lines = head.split(b"\r\n")
    return lines[0], {k.strip().lower(): v.strip() for k, _, v in (l.partition(b":") for l in lines[1:])}


def test_same_protocol_bytes_through_when_model_matches(setup):
    port, cap = setup
    # odd spacing, key order and unicode escapes must survive untouched
    body = b'{ "messages":[{"role":"user","content":"caf\\u00e9  x"}],   "model" : "up-model","temperature":0.70}'
    status, hdrs, resp = _send(port, "/v1/chat/completions", body, {
        "content-type": "application/json", "authorization": "Bearer client-key",
        "openai-beta": "assistants=v2", "x-secret-client-header": "no"})
    assert status == 200 and resp == OPENAI_REPLY  # response bytes relayed exactly
    assert "x-ratelimit-remaining" not in hdrs     # upstream rate-limit headers are not relayed
    line, h = _headers(cap.requests[-1][0])
    assert cap.requests[-1][1] == body
    assert line == b"POST /v1/chat/completions HTTP/1.1"
    assert h[b"authorization"] == b"Bearer sk-test-key"   # the lane's key, never the client's
    assert h[b"user-agent"] == b"OpenAI/Python 1.54.0" and h[b"accept"] == b"application/json"
    assert h[b"openai-beta"] == b"assistants=v2"           # beta header forwarded same-protocol
    assert b"x-secret-client-header" not in h


def test_same_protocol_alias_splices_only_the_model(setup):
    port, cap = setup
    body = b'{"model":"alias","messages":[{"role":"user","content":"model inside text: alias"}],"n":1}'
    _send(port, "/v1/chat/completions", body, {"content-type": "application/json"})
    assert cap.requests[-1][1] == body.replace(b'"model":"alias"', b'"model":"up-model"')


def test_anthropic_egress_headers_and_beta(setup):
    port, cap = setup
    body = b'{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}'
    status, hdrs, resp = _send(port, "/v1/messages", body, {
        "content-type": "application/json", "anthropic-version": "2099-01-01",
        "anthropic-beta": "prompt-caching-2024-07-31", "x-api-key": "client"})
    assert status == 200 and resp == ANTHROPIC_REPLY and hdrs["request-id"] == "req_up"
    _, h = _headers(cap.requests[-1][0])
    assert h[b"x-api-key"] == b"sk-test-key" and h[b"anthropic-version"] == b"2023-06-01"
    assert h[b"anthropic-beta"] == b"prompt-caching-2024-07-31"
    assert json.loads(cap.requests[-1][1])["model"] == "up-model"


def test_cross_protocol_drops_beta_and_injects_max_tokens(setup):
    port, cap = setup
    body = json.dumps({"model": "claude", "messages": [{"role": "user", "content": "hi"}],
                       "logit_bias": {"1": 2}}).encode()
    status, _, resp = _send(port, "/v1/chat/completions", body, {
        "content-type": "application/json", "openai-beta": "x"})
    assert status == 200
    out = json.loads(resp)
    assert out["object"] == "chat.completion" and out["choices"][0]["message"]["content"] == "hi"
    _, h = _headers(cap.requests[-1][0])
    assert b"anthropic-beta" not in h and b"openai-beta" not in h
    sent = json.loads(cap.requests[-1][1])
    assert sent["max_tokens"] == 4096 and "logit_bias" not in sent and sent["model"] == "up-model"
