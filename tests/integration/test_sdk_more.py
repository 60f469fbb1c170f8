"""The other official SDKs pointed at busbar by base URL alone: openai (Responses), google-genai,
cohere v2 and boto3 bedrock-runtime — each against its own protocol's lane and lanes of two or more
other protocols, streaming and not, with a tool call each way."""
import json

import boto3
import cohere
import openai
import pytest
from botocore.config import Config as BotoConfig
from google import genai
from google.genai import types as gt

EGRESS = ["same", "openai", "anthropic", "bedrock"]
SAME = {"responses": "resp-model", "gemini": "gem-model", "cohere": "coh-model", "bedrock": "bed-model"}
LANE = {"openai": "oai-model", "anthropic": "ant-model", "bedrock": "bed-model", "gemini": "gem-model"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def lane(ingress, egress):
    return SAME[ingress] if egress == "same" else LANE[egress]


# ------------------------------------------------------------------ OpenAI Responses
@pytest.fixture(scope="module")
def oai(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="sk-client", max_retries=0, timeout=20)


@pytest.mark.parametrize("egress", EGRESS)
def test_responses_sdk(oai, egress):
    m = lane("responses", egress)
    r = oai.responses.create(model=m, input="hello responses", instructions="be brief")
    assert r.output_text.startswith("mock: hello responses") and "[system: be brief]" in r.output_text
    assert r.status == "completed" and r.usage.output_tokens > 0
    with oai.responses.stream(model=m, input="stream responses") as s:
        deltas = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert deltas.startswith("mock: stream responses") and final.output_text == deltas
    tools = [{"type": "function", "name": "get_weather", "description": "w", "parameters": SCHEMA}]
    r = oai.responses.create(model=m, input="weather? #mock:tool=1", tools=tools)
    call = [o for o in r.output if o.type == "function_call"][0]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "mock"}
    r2 = oai.responses.create(model=m, tools=tools, input=[
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert "sunny" in r2.output_text


# ------------------------------------------------------------------ Gemini
@pytest.fixture(scope="module")
def gem(gateway):
    return genai.Client(api_key="k", http_options=gt.HttpOptions(base_url=gateway.url, api_version="v1beta",
                                                                 timeout=20000))


@pytest.mark.parametrize("egress", EGRESS)
def test_genai_sdk(gem, egress):
    m = lane("gemini", egress)
    r = gem.models.generate_content(model=m, contents="hello gemini",
                                    config=gt.GenerateContentConfig(system_instruction="be brief",
                                                                    max_output_tokens=100))
    assert r.text.startswith("mock: hello gemini") and "[system: be brief]" in r.text
    assert r.usage_metadata.candidates_token_count > 0
    text = "".join(c.text or "" for c in gem.models.generate_content_stream(model=m, contents="stream gemini"))
    assert text.startswith("mock: stream gemini")
    tool = gt.Tool(function_declarations=[gt.FunctionDeclaration(name="get_weather", description="w",
                                                                parameters_json_schema=SCHEMA)])
    r = gem.models.generate_content(
        model=m, contents="weather? #mock:tool=1",
        config=gt.GenerateContentConfig(
            tools=[tool], automatic_function_calling=gt.AutomaticFunctionCallingConfig(disable=True)))
    fc = r.function_calls[0]
    assert fc.name == "get_weather" and fc.args == {"city": "mock"}


def test_genai_sdk_v1_default_path(gateway):
    # The SDK's default api_version is v1: /v1/models/{m}:generateContent must work too.
    c = genai.Client(api_key="k", http_options=gt.HttpOptions(base_url=gateway.url, timeout=20000))
    assert c.models.generate_content(model="oai-model", contents="v1 path").text.startswith("mock: v1 path")


def test_genai_unknown_model_native_404(gem):
    with pytest.raises(genai.errors.ClientError) as e:
        gem.models.generate_content(model="nope", contents="x")
    assert e.value.code == 404 and "models/nope is not found for API version v1beta" in e.value.message


# ------------------------------------------------------------------ Cohere v2
@pytest.fixture(scope="module")
def co(gateway):
    return cohere.ClientV2(api_key="k", base_url=gateway.url, timeout=20)


@pytest.mark.parametrize("egress", EGRESS)
def test_cohere_sdk(co, egress):
    m = lane("cohere", egress)
    r = co.chat(model=m, messages=[{"role": "system", "content": "be brief"},
                                   {"role": "user", "content": "hello cohere"}])
    text = r.message.content[0].text
    assert text.startswith("mock: hello cohere") and "[system: be brief]" in text
    assert r.finish_reason == "COMPLETE"
    text = ""
    finish = None
    for ev in co.chat_stream(model=m, messages=[{"role": "user", "content": "stream cohere"}]):
        if ev.type == "content-delta":
            text += ev.delta.message.content.text
        elif ev.type == "message-end":
            finish = ev.delta.finish_reason
    assert text.startswith("mock: stream cohere") and finish == "COMPLETE"
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "w", "parameters": SCHEMA}}]
    r = co.chat(model=m, messages=[{"role": "user", "content": "weather? #mock:tool=1"}], tools=tools)
    call = r.message.tool_calls[0]
    assert r.finish_reason == "TOOL_CALL" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "mock"}


# ------------------------------------------------------------------ Bedrock Converse
@pytest.fixture(scope="module")
def br(gateway):
    return boto3.client("bedrock-runtime", endpoint_url=gateway.url, region_name="us-east-1",
                        aws_access_key_id="AKIDCLIENT", aws_secret_access_key="secret",
                        config=BotoConfig(retries={"max_attempts": 1}, read_timeout=20))


@pytest.mark.parametrize("egress", ["same", "openai", "anthropic", "gemini"])
def test_boto3_converse(br, egress):
    m = SAME["bedrock"] if egress == "same" else LANE[egress]
    r = br.converse(modelId=m, system=[{"text": "be brief"}],
                    messages=[{"role": "user", "content": [{"text": "hello bedrock"}]}])
    text = r["output"]["message"]["content"][0]["text"]
    assert text.startswith("mock: hello bedrock") and "[system: be brief]" in text
    assert r["stopReason"] == "end_turn" and r["usage"]["outputTokens"] > 0
    assert r["ResponseMetadata"]["HTTPHeaders"]["x-amzn-requestid"]
    s = br.converse_stream(modelId=m, messages=[{"role": "user", "content": [{"text": "stream bedrock"}]}])
    text, stop, usage = "", None, None
    for ev in s["stream"]:
        if "contentBlockDelta" in ev:
            text += ev["contentBlockDelta"]["delta"].get("text", "")
        elif "messageStop" in ev:
            stop = ev["messageStop"]["stopReason"]
        elif "metadata" in ev:
            usage = ev["metadata"]["usage"]
    assert text.startswith("mock: stream bedrock") and stop == "end_turn" and usage["outputTokens"] > 0
    r = br.converse(modelId=m, messages=[{"role": "user", "content": [{"text": "weather? #mock:tool=1"}]}],
                    toolConfig={"tools": [{"toolSpec": {"name": "get_weather", "description": "w",
                                                        "inputSchema": {"json": SCHEMA}}}]})
    use = [b["toolUse"] for b in r["output"]["message"]["content"] if "toolUse" in b][0]
    assert r["stopReason"] == "tool_use" and use["name"] == "get_weather" and use["input"] == {"city": "mock"}


def test_boto3_model_id_with_colon_and_native_errors(br):
    # bed-model's wire id is "amazon.nova-lite-v1:0"; a ':' in the client's id is percent-encoded.
    with pytest.raises(br.exceptions.ResourceNotFoundException):
        br.converse(modelId="no:such-model", messages=[{"role": "user", "content": [{"text": "x"}]}])
    with pytest.raises(br.exceptions.ThrottlingException):
        br.converse(modelId="oai-model", messages=[{"role": "user", "content": [{"text": "#mock:status=429"}]}])
