"""A bug inside request handling costs that request only: the caller gets a 500 in its own shape,
the connection and the process keep serving. The gateway runs in-process here so that a codec
function can be replaced by one that raises."""
import http.client
import json

import pytest

from cbusbar.proto import anthropic as anthropic_codec


@pytest.fixture
def gw_port(mock_port, inproc_gateway):
    return inproc_gateway((
        'listen: "127.0.0.1:{port}"\n'
        'providers: {m: {protocol: openai, base_url: "http://127.0.0.1:%d", api_key: {env: K}}}\n'
        'models: {oai-model: {provider: m}}\n') % mock_port, env={"K": "sk-test"}).port


def test_exception_in_a_codec_is_a_native_500_and_the_connection_survives(gw_port, monkeypatch):
    def boom(body):
        raise KeyError("bug")

    monkeypatch.setattr(anthropic_codec, "read_request", boom)
    c = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=10)
    body = json.dumps({"model": "oai-model", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]})
    c.request("POST", "/v1/messages", body, {"anthropic-version": "2023-06-01", "content-type": "application/json"})
    r = c.getresponse()
    doc = json.loads(r.read())
    assert r.status == 500 and doc["type"] == "error" and doc["error"]["type"] == "api_error"
    c.request("POST", "/v1/chat/completions", json.dumps(
        {"model": "oai-model", "messages": [{"role": "user", "content": "still here"}]}),
        {"content-type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and b"still here" in r.read()
    c.close()
