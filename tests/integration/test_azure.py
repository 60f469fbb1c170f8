"""Azure OpenAI lanes through the real server: the deployments API
(/openai/deployments/{d}/chat/completions?api-version=…) and the v1 API (/openai/v1/…), the
`api-key` header, Azure's error and content-filter bodies read by the OpenAI error reader, and a
streamed answer relayed."""
import json

import anthropic
import openai
import pytest

from tests.conftest import free_port, stop, start_gateway
from tests.integration.fakes import OPENAI_REPLY, Fake
from tests.integration.test_credentials import gateway_env

FILTERED = {"error": {
    "message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.",
    "type": None, "param": "prompt", "code": "content_filter", "status": 400,
    "innererror": {"code": "ResponsibleAIPolicyViolation",
                   "content_filter_result": {"hate": {"filtered": True, "severity": "high"}}}}}
FILTER_FINISH = dict(OPENAI_REPLY, choices=[{"index": 0, "message": {"role": "assistant", "content": None},
                                              "finish_reason": "content_filter",
                                              "content_filter_results": {"hate": {"filtered": True}}}])
STREAM = (b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[],'
          b'"prompt_filter_results":[{"prompt_index":0,"content_filter_results":{}}]}\n\n'
          b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":'
          b'[{"index":0,"delta":{"role":"assistant","content":"azure "},"finish_reason":null}]}\n\n'
          b'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":'
          b'[{"index":0,"delta":{"content":"stream"},"finish_reason":"stop"}]}\n\n'
          b'data: [DONE]\n\n')


def azure_routes(req):
    path = req["path"]
    body = json.loads(req["body"])
    if "/deployments/filtered/" in path:
        return 400, "application/json", json.dumps(FILTERED).encode()
    if "/deployments/filter-finish/" in path:
        return 200, "application/json", json.dumps(FILTER_FINISH).encode()
    if body.get("stream"):
        return 200, "text/event-stream", STREAM
    return 200, "application/json", json.dumps(OPENAI_REPLY).encode()


@pytest.fixture(scope="module")
def azure(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("azure")
    fake = Fake()
    fake.routes.append((lambda m, p: p.startswith("/openai/"), azure_routes))
    port = free_port()
    gw = start_gateway(tmp, f"""
listen: "127.0.0.1:{port}"
providers:
  az-dep:  {{catalog: azure-openai, base_url: "{fake.url}", api_key: {{env: AZURE_KEY}},
             azure: {{deployment: gpt4o-prod, api_version: 2024-10-21}}}}
  az-v1:   {{catalog: azure-openai, base_url: "{fake.url}", api_key: {{env: AZURE_KEY}}}}
  az-filt: {{protocol: openai, base_url: "{fake.url}", api_key: {{env: AZURE_KEY}}, azure: {{deployment: filtered}}}}
  az-ff:   {{protocol: openai, base_url: "{fake.url}", api_key: {{env: AZURE_KEY}},
             azure: {{deployment: filter-finish}}}}
models:
  dep: {{provider: az-dep, upstream_model: gpt-4o}}
  v1:  {{provider: az-v1, upstream_model: gpt-4o-mini}}
  filt: {{provider: az-filt, upstream_model: gpt-4o}}
  ff:  {{provider: az-ff, upstream_model: gpt-4o}}
""", port=port, base_env=gateway_env({}))
    yield port, fake
    stop(gw.proc)
    fake.close()


def client(port):
    return openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="client", max_retries=0, timeout=20)


def test_deployment_path_and_api_key(azure):
    port, fake = azure
    r = client(port).chat.completions.create(model="dep", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "hello from upstream"
    req = fake.find("/openai/deployments/")[-1]
    assert req["path"] == "/openai/deployments/gpt4o-prod/chat/completions?api-version=2024-10-21"
    assert req["headers"]["api-key"] == "azure-test-key" and "authorization" not in req["headers"]
    assert json.loads(req["body"])["model"] == "gpt-4o"


def test_v1_path_streamed(azure):
    port, fake = azure
    stream = client(port).chat.completions.create(
        model="v1", stream=True, messages=[{"role": "user", "content": "hi"}])
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "azure stream"
    req = fake.find("/openai/v1/")[-1]
    assert req["path"] == "/openai/v1/chat/completions"
    assert req["headers"]["api-key"] == "azure-test-key"
    assert req["headers"]["accept"] == "text/event-stream"


def test_content_filter_error_same_protocol_and_translated(azure):
    port, _ = azure
    with pytest.raises(openai.BadRequestError) as e:
        client(port).chat.completions.create(model="filt", messages=[{"role": "user", "content": "x"}])
    assert e.value.body["code"] == "content_filter"       # relayed as Azure sent it
    a = anthropic.Anthropic(base_url="http://127.0.0.1:%d" % port, api_key="x", max_retries=0, timeout=20)
    with pytest.raises(anthropic.BadRequestError) as e2:
        a.messages.create(model="filt", max_tokens=5, messages=[{"role": "user", "content": "x"}])
    assert "content management policy" in e2.value.body["error"]["message"]
    assert e2.value.body["error"]["type"] == "invalid_request_error"


def test_content_filter_finish_reason_translated(azure):
    # Azure's content_filter finish reason is the IR's Safety: SAFETY for a Gemini caller.
    from google import genai
    from google.genai import types
    port, _ = azure
    g = genai.Client(api_key="x", http_options=types.HttpOptions(base_url="http://127.0.0.1:%d" % port))
    r = g.models.generate_content(model="ff", contents="x")
    assert r.candidates[0].finish_reason == types.FinishReason.SAFETY
