"""Claude through Bedrock InvokeModel, tested with anthropic.AnthropicBedrock pointed at busbar:
ingress (POST /model/{id}/invoke and /invoke-with-response-stream with an Anthropic Messages body)
to lanes of every protocol on the mock, buffered and streamed (eventstream `chunk` frames on the
way back); and egress to a bedrock-invoke lane, where the upstream checks the path, the body
(no model, anthropic_version bedrock-2023-05-31) and the SigV4 signature."""
import base64
import json

import anthropic
import pytest

from cbusbar.eventstream import encode_frame, encode_headers
from tests.conftest import free_port, stop, start_gateway
from tests.integration.fakes import ANTHROPIC_REPLY, ANTHROPIC_STREAM, Fake
from tests.integration.test_credentials import check_sigv4

AWS = dict(aws_access_key="AKIDCLIENT", aws_secret_key="client-secret", aws_region="us-east-1")


def invoke_stream_body():
    """The fake upstream's InvokeModelWithResponseStream answer: ANTHROPIC_STREAM's events as
    chunk frames, as Bedrock sends them."""
    frames = []
    for block in ANTHROPIC_STREAM.split(b"\n\n"):
        if not block:
            continue
        data = block.split(b"data: ", 1)[1]
        frames.append(encode_frame(encode_headers({":event-type": "chunk",
                                                   ":content-type": "application/json",
                                                   ":message-type": "event"}),
                                   json.dumps({"bytes": base64.b64encode(data).decode(), "p": "abcd"}).encode()))
    return b"".join(frames)


def invoke_routes(req):
    if req["path"].endswith("/invoke-with-response-stream"):
        return 200, "application/vnd.amazon.eventstream", invoke_stream_body()
    return 200, "application/json", json.dumps(ANTHROPIC_REPLY).encode()


@pytest.fixture(scope="module")
def gw(mock_port, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("invoke")
    fake = Fake()
    fake.routes.append((lambda m, p: p.startswith("/model/") and "/invoke" in p, invoke_routes))
    port = free_port()
    m = "http://127.0.0.1:%d" % mock_port
    gw = start_gateway(tmp, f"""
listen: "127.0.0.1:{port}"
providers:
  m-openai:    {{protocol: openai,    base_url: "{m}", api_key: {{env: MOCK_KEY}}}}
  m-responses: {{protocol: responses, base_url: "{m}", api_key: {{env: MOCK_KEY}}}}
  m-anthropic: {{protocol: anthropic, base_url: "{m}", api_key: {{env: MOCK_KEY}}}}
  m-gemini:    {{protocol: gemini,    base_url: "{m}", api_key: {{env: MOCK_KEY}}}}
  m-cohere:    {{protocol: cohere,    base_url: "{m}", api_key: {{env: MOCK_KEY}}}}
  m-bedrock:   {{protocol: bedrock,   base_url: "{m}", api_key: {{env: MOCK_AWS}}, region: us-east-1}}
  invoke:      {{protocol: bedrock-invoke, base_url: "{fake.url}", api_key: {{env: MOCK_AWS}}, region: us-east-1}}
models:
  oai-model:  {{provider: m-openai, upstream_model: gpt-4o-mini}}
  resp-model: {{provider: m-responses, upstream_model: gpt-4.1-mini}}
  ant-model:  {{provider: m-anthropic, upstream_model: claude-haiku-4-5}}
  gem-model:  {{provider: m-gemini, upstream_model: gemini-2.5-flash}}
  coh-model:  {{provider: m-cohere, upstream_model: command-r}}
  bed-model:  {{provider: m-bedrock, upstream_model: "amazon.nova-lite-v1:0"}}
  "anthropic.claude-sonnet-4-5": {{provider: invoke, upstream_model: "us.anthropic.claude-sonnet-4-5-20250929-v1:0"}}
""", port=port)
    yield port, fake
    stop(gw.proc)
    fake.close()


def client(port):
    return anthropic.AnthropicBedrock(base_url="http://127.0.0.1:%d" % port, max_retries=0, timeout=20, **AWS)


LANES = ["oai-model", "resp-model", "ant-model", "gem-model", "coh-model", "bed-model",
         "anthropic.claude-sonnet-4-5"]


@pytest.mark.parametrize("lane", LANES)
def test_anthropic_bedrock_buffered(gw, lane):
    port, _ = gw
    r = client(port).messages.create(model=lane, max_tokens=64,
                                     messages=[{"role": "user", "content": "Say hello"}])
    assert r.type == "message" and r.role == "assistant"
    assert r.content[0].type == "text" and r.content[0].text
    assert r.stop_reason == "end_turn" and r.usage.output_tokens > 0


@pytest.mark.parametrize("lane", LANES)
def test_anthropic_bedrock_streamed(gw, lane):
    port, _ = gw
    with client(port).messages.stream(model=lane, max_tokens=64,
                                      messages=[{"role": "user", "content": "Say hello"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text and final.content[0].text == text and final.stop_reason == "end_turn"


def test_invoke_egress_what_the_upstream_receives(gw):
    port, fake = gw
    # An OpenAI caller reaching the bedrock-invoke lane: translated to a Bedrock Anthropic body.
    import openai
    c = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % port, api_key="x", max_retries=0, timeout=20)
    r = c.chat.completions.create(model="anthropic.claude-sonnet-4-5", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "hello from upstream"
    req = fake.find("/model/")[-1]
    assert req["path"] == "/model/us.anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke"
    body = json.loads(req["body"])
    assert "model" not in body and "stream" not in body
    assert body["anthropic_version"] == "bedrock-2023-05-31" and body["max_tokens"] == 4096
    check_sigv4(req, "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", None, "127.0.0.1:%d" % fake.port)
    # Same protocol: AnthropicBedrock's body goes through as sent, streamed back frame by frame.
    with client(port).messages.stream(model="anthropic.claude-sonnet-4-5", max_tokens=7,
                                      messages=[{"role": "user", "content": "hi"}]) as s:
        assert "".join(s.text_stream) == "hello stream"
    req = fake.find("/model/")[-1]
    assert req["path"].endswith("/invoke-with-response-stream")
    assert req["headers"]["accept"] == "application/vnd.amazon.eventstream"
    from anthropic._constants import ANTHROPIC_API_VERSION
    body = json.loads(req["body"])
    # The client's own body, untouched (the SDK names its anthropic_version itself).
    assert body["max_tokens"] == 7 and body["anthropic_version"] == ANTHROPIC_API_VERSION


def test_unknown_model_is_a_native_404(gw):
    port, _ = gw
    with pytest.raises(anthropic.NotFoundError):
        client(port).messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
