"""The hook recipes of docs/hooks.md (tests/recipes.py: an e-mail redacting `prompt: rw` gate, a
banned-phrase guard, a custom router) through every official SDK: openai (Chat Completions and
Responses), anthropic, google-genai, cohere v2 and boto3 bedrock-runtime, each against a pool of
its own protocol's lane on the mock (whose answer echoes the prompt it received), so the rewritten
request travels re-written in the caller's own protocol. A refusal is each SDK's own error."""
from __future__ import annotations

import subprocess

import anthropic
import boto3
import cohere
import openai
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError
from google import genai
from google.genai import types as gt

from tests import recipes
from tests.conftest import start_gateway, stop
from tests.sidecar import Sidecar

ADDRESS = "bob.smith@example.com"
BANNED = "Tell me about Project Nightingale"

LANES = {"openai": "oai", "responses": "resp", "anthropic": "ant", "gemini": "gem",
         "cohere": "coh", "bedrock": "bed"}

CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  m-openai:    {{protocol: openai,    base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
  m-responses: {{protocol: responses, base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
  m-anthropic: {{protocol: anthropic, base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
  m-gemini:    {{protocol: gemini,    base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
  m-cohere:    {{protocol: cohere,    base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
  m-bedrock:   {{protocol: bedrock,   base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_AWS}},
                region: us-east-1}}
models:
  oai:   {{provider: m-openai, upstream_model: gpt-4o-mini}}
  large: {{provider: m-openai, upstream_model: gpt-4o}}
  resp:  {{provider: m-responses, upstream_model: gpt-4.1-mini}}
  ant:   {{provider: m-anthropic, upstream_model: claude-haiku-4-5}}
  gem:   {{provider: m-gemini, upstream_model: gemini-2.5-flash}}
  coh:   {{provider: m-cohere, upstream_model: command-r}}
  bed:   {{provider: m-bedrock, upstream_model: "amazon.nova-lite-v1:0"}}
hooks:
  redact: {{module: busbar-webrequest-hook, settings: {{url: "{side}/redact"}}, prompt: rw,
           timeout_ms: 2000}}
  guard:  {{module: busbar-webrequest-hook, settings: {{url: "{side}/guard"}}, prompt: ro,
           timeout_ms: 2000, on_error: reject}}
  router: {{module: busbar-webrequest-hook, settings: {{url: "{side}/route"}}, timeout_ms: 2000,
           on_error: weighted}}
pools:
{pools}
  smart:
    hooks: [router]
    members:
      - {{model: large, tier: large}}
      - {{model: oai, tier: small}}
rate_card:
  oai:   {{input_utok: 0.15, output_utok: 0.6}}
  large: {{input_utok: 2.5, output_utok: 10}}
  resp:  {{input_utok: 0.4, output_utok: 1.6}}
  ant:   {{input_utok: 1, output_utok: 5}}
  gem:   {{input_utok: 0.3, output_utok: 2.5}}
  coh:   {{input_utok: 0.15, output_utok: 0.6}}
  bed:   {{input_utok: 0.06, output_utok: 0.24}}
"""


@pytest.fixture(scope="module")
def gw(mock_port, tmp_path_factory):
    side = Sidecar(recipes.ROUTES)
    pools = "\n".join("  guarded-%s: {hooks: [redact, guard], members: [{model: %s}]}" % (p, m)
                      for p, m in LANES.items())
    g = start_gateway(tmp_path_factory.mktemp("recipes"), CONFIG.format(
        port="{port}", mock=mock_port, side=side.url, pools=pools), 2, stderr=subprocess.DEVNULL)
    g.side = side
    yield g
    stop(g.proc)
    side.close()


def said(text):
    """The mock echoes the prompt it received: the address never reached it."""
    assert text.startswith("mock: "), text
    assert ADDRESS not in text and "[email]" in text, text


# ------------------------------------------------------------------ OpenAI (chat + responses)
def test_openai_chat(gw):
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=20)
    r = c.chat.completions.create(model="guarded-openai", messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "write to %s today" % ADDRESS}])
    said(r.choices[0].message.content)
    assert "[system: be brief]" in r.choices[0].message.content
    stream = c.chat.completions.create(model="guarded-openai", stream=True, messages=[
        {"role": "user", "content": "stream to %s" % ADDRESS}])
    said("".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices))
    with pytest.raises(openai.PermissionDeniedError) as e:
        c.chat.completions.create(model="guarded-openai", messages=[{"role": "user", "content": BANNED}])
    assert e.value.status_code == 403 and recipes.REFUSAL in str(e.value)


def test_openai_responses(gw):
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=20)
    r = c.responses.create(model="guarded-responses", input="write to %s today" % ADDRESS)
    said(r.output_text)
    with pytest.raises(openai.PermissionDeniedError) as e:
        c.responses.create(model="guarded-responses", input=BANNED)
    assert recipes.REFUSAL in str(e.value)


# ------------------------------------------------------------------ Anthropic
def test_anthropic(gw):
    c = anthropic.Anthropic(base_url=gw.url, api_key="k", max_retries=0, timeout=20)
    r = c.messages.create(model="guarded-anthropic", max_tokens=100, system="be brief",
                          messages=[{"role": "user", "content": "write to %s today" % ADDRESS}])
    said(r.content[0].text)
    with c.messages.stream(model="guarded-anthropic", max_tokens=100, messages=[
            {"role": "user", "content": [{"type": "text", "text": "mail %s" % ADDRESS}]}]) as s:
        said("".join(s.text_stream))
    with pytest.raises(anthropic.PermissionDeniedError) as e:
        c.messages.create(model="guarded-anthropic", max_tokens=100,
                          messages=[{"role": "user", "content": BANNED}])
    assert recipes.REFUSAL in str(e.value)


# ------------------------------------------------------------------ Gemini
def test_google_genai(gw):
    c = genai.Client(api_key="k", http_options=gt.HttpOptions(base_url=gw.url, api_version="v1beta",
                                                             timeout=20000))
    r = c.models.generate_content(model="guarded-gemini", contents="write to %s today" % ADDRESS)
    said(r.text)
    with pytest.raises(genai.errors.ClientError) as e:
        c.models.generate_content(model="guarded-gemini", contents=BANNED)
    assert e.value.code == 403 and recipes.REFUSAL in e.value.message


# ------------------------------------------------------------------ Cohere
def test_cohere(gw):
    c = cohere.ClientV2(api_key="k", base_url=gw.url, timeout=20)
    r = c.chat(model="guarded-cohere", messages=[{"role": "user", "content": "write to %s" % ADDRESS}])
    said(r.message.content[0].text)
    with pytest.raises(cohere.errors.ForbiddenError) as e:
        c.chat(model="guarded-cohere", messages=[{"role": "user", "content": BANNED}])
    assert recipes.REFUSAL in str(e.value.body)


# ------------------------------------------------------------------ Bedrock Converse
def test_boto3_bedrock(gw):
    c = boto3.client("bedrock-runtime", endpoint_url=gw.url, region_name="us-east-1",
                     aws_access_key_id="AKIDCLIENT", aws_secret_access_key="secret",
                     config=BotoConfig(retries={"max_attempts": 1}, read_timeout=20))
    r = c.converse(modelId="guarded-bedrock", messages=[
        {"role": "user", "content": [{"text": "write to %s today" % ADDRESS}]}])
    said(r["output"]["message"]["content"][0]["text"])
    with pytest.raises(ClientError) as e:
        c.converse(modelId="guarded-bedrock", messages=[{"role": "user", "content": [{"text": BANNED}]}])
    assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert e.value.response["Error"]["Code"] == "AccessDeniedException"
    assert recipes.REFUSAL in e.value.response["Error"]["Message"]


# ------------------------------------------------------------------ custom routing
def test_the_router_recipe_sends_small_prompts_cheap_and_large_ones_to_the_large_tier(gw):
    c = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=20)
    small = c.chat.completions.create(model="smart", messages=[{"role": "user", "content": "hi"}])
    assert small.model == "gpt-4o-mini"
    big = c.chat.completions.create(model="smart", messages=[{"role": "user", "content": "x" * 3000}])
    assert big.model == "gpt-4o"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    used = c.chat.completions.create(model="smart", tools=tools,
                                     messages=[{"role": "user", "content": "hi"}])
    assert used.model == "gpt-4o"
    # What the router saw: shapes and signals, no prompt (prompt: no).
    m = gw.side.messages("/route")[-1]
    assert "messages" not in m["request"] and m["request"]["has_tools"] is True
    assert {c["tier"] for c in m["candidates"]} == {"large", "small"}
