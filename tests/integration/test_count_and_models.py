"""Token counting (Anthropic /v1/messages/count_tokens, Gemini :countTokens) passed through to a
same-protocol lane with the model spliced, a native 404 across protocols; and GET /v1/models/{id},
/v1beta/models/{name} answered from the config — with the official SDKs."""
import json

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from tests.conftest import free_port, stop, start_gateway
from tests.integration.fakes import Fake


def count(req):
    h, body = req["headers"], json.loads(req["body"])
    if req["path"] == "/v1/messages/count_tokens":
        if h.get("x-api-key") != "sk-test-key" or body.get("model") != "claude-haiku-4-5":
            return 400, "application/json", b'{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}'
        return 200, "application/json", json.dumps({"input_tokens": 11 + len(body["messages"])}).encode()
    if h.get("x-goog-api-key") != "sk-test-key":
        return 403, "application/json", b'{"error":{"code":403,"message":"no key","status":"PERMISSION_DENIED"}}'
    return 200, "application/json", b'{"totalTokens": 42}'


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("count")
    fake = Fake()
    fake.routes.append((lambda m, p: "count_tokens" in p or ":countTokens" in p, count))
    port = free_port()
    gw = start_gateway(tmp, f"""
listen: "127.0.0.1:{port}"
providers:
  a: {{protocol: anthropic, base_url: "{fake.url}", api_key: {{env: MOCK_KEY}}}}
  g: {{protocol: gemini, base_url: "{fake.url}", api_key: {{env: MOCK_KEY}}}}
  o: {{protocol: openai, base_url: "{fake.url}", api_key: {{env: MOCK_KEY}}}}
models:
  claude: {{provider: a, upstream_model: claude-haiku-4-5}}
  gem: {{provider: g, upstream_model: gemini-2.5-flash}}
  gpt: {{provider: o, upstream_model: gpt-4o-mini}}
pools:
  both: {{members: [{{model: gpt, weight: 10}}, {{model: claude}}]}}
""", port=port)
    yield "http://127.0.0.1:%d" % port, fake
    stop(gw.proc)
    fake.close()


def test_anthropic_count_tokens(gw):
    url, fake = gw
    a = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=20)
    r = a.messages.count_tokens(model="claude", messages=[{"role": "user", "content": "hi"}])
    assert r.input_tokens == 12
    assert json.loads(fake.find("/v1/messages/count_tokens")[-1]["body"])["model"] == "claude-haiku-4-5"
    # A pool: only its Anthropic lane can count.
    assert a.messages.count_tokens(model="both", messages=[{"role": "user", "content": "hi"}]).input_tokens == 12
    with pytest.raises(anthropic.NotFoundError) as e:
        a.messages.count_tokens(model="gpt", messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["error"]["message"] == "This endpoint does not support that operation."


def test_gemini_count_tokens(gw):
    url, fake = gw
    g = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=url))
    assert g.models.count_tokens(model="gem", contents="hello").total_tokens == 42
    assert fake.find("/v1beta/models/gemini-2.5-flash:countTokens")
    with pytest.raises(genai.errors.ClientError) as e:
        g.models.count_tokens(model="claude", contents="hello")
    assert e.value.code == 404


def test_model_retrieve(gw):
    url, _ = gw
    o = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
    m = o.models.retrieve("both")
    assert (m.id, m.object) == ("both", "model")
    with pytest.raises(openai.NotFoundError):
        o.models.retrieve("nope")
    a = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=20)
    am = a.models.retrieve("claude")
    assert (am.id, am.type) == ("claude", "model")
    g = genai.Client(api_key="x", http_options=types.HttpOptions(base_url=url, api_version="v1beta"))
    gm = g.models.get(model="gem")
    assert gm.name == "models/gem"
