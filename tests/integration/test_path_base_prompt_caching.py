"""A provider's `path_base` (the base of a URL-model protocol's paths: Gemini and Claude on Vertex
AI, the Rust grammar's way there) and a model's `prompt_caching` (cache markers for Bedrock
Converse lanes that take them). Through the real server: an upstream written in the test records
each request's path, headers and body."""
from __future__ import annotations

import json

import pytest

from tests.conftest import start_gateway, stop
from tests.hostile import HostileUpstream, http_response
from tests.integration.gov_helpers import post

ANTHROPIC_OK = json.dumps({
    "id": "msg_1", "type": "message", "role": "assistant", "model": "m-a",
    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 1}}).encode()
GEMINI_CHUNK = {"candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]},
                                "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1,
                                  "totalTokenCount": 4}}
BEDROCK_OK = json.dumps({
    "output": {"message": {"role": "assistant", "content": [{"text": "ok"}]}},
    "stopReason": "end_turn", "usage": {"inputTokens": 3, "outputTokens": 1, "totalTokens": 4}}).encode()
GOOGLE = "/v1/projects/proj-1/locations/us-central1/publishers/google/models"
CLAUDE = "/v1/projects/proj-1/locations/us-central1/publishers/anthropic/models"

CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  gv: {protocol: gemini, base_url: "URL", api_key: {env: MOCK_KEY}, auth: bearer, path_base: GOOGLE}
  cv: {protocol: anthropic, base_url: "URL", api_key: {env: MOCK_KEY}, auth: bearer, path_base: CLAUDE}
  br: {protocol: bedrock, base_url: "URL", api_key: {env: MOCK_AWS}, region: us-east-1}
models:
  g: {provider: gv, upstream_model: m-g}
  a: {provider: cv, upstream_model: m-a}
  claude-on-bedrock: {provider: br, upstream_model: m-claude, prompt_caching: true}
  nova: {provider: br, upstream_model: m-nova}
"""


def _gemini(c, req):
    if ":streamGenerateContent" in req.path:
        body = b"data: " + json.dumps(GEMINI_CHUNK).encode() + b"\r\n\r\n"
        c.sendall(http_response(200, body, "text/event-stream"))
    else:
        c.sendall(http_response(200, json.dumps(GEMINI_CHUNK).encode()))


@pytest.fixture
def gw(tmp_path):
    up = HostileUpstream({"m-g": _gemini,
                          "m-a": lambda c, req: c.sendall(http_response(200, ANTHROPIC_OK)),
                          "m-claude": lambda c, req: c.sendall(http_response(200, BEDROCK_OK)),
                          "m-nova": lambda c, req: c.sendall(http_response(200, BEDROCK_OK))})
    text = CONFIG.replace("URL", up.url).replace("GOOGLE", GOOGLE).replace("CLAUDE", CLAUDE)
    g = start_gateway(tmp_path, text)
    g.up = up
    yield g
    stop(g.proc)
    up.close()


def _openai(g, model, stream=False):
    s, data, _ = post(g, "/v1/chat/completions", {
        "model": model, "max_tokens": 20, "stream": stream,
        "messages": [{"role": "user", "content": "hi"}]}, {"authorization": "Bearer x"})
    assert s == 200, data
    return data


def test_gemini_paths_go_under_the_path_base(gw):
    _openai(gw, "g")
    assert gw.up.requests[-1].path == GOOGLE + "/m-g:generateContent"
    assert gw.up.requests[-1].headers["authorization"] == "Bearer sk-test-key"
    _openai(gw, "g", stream=True)
    assert gw.up.requests[-1].path == GOOGLE + "/m-g:streamGenerateContent?alt=sse"
    # the same protocol: the caller's Gemini path is the base's too
    s, data, _ = post(gw, "/v1beta/models/g:generateContent",
                      {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
                      {"x-goog-api-key": "x"})
    assert s == 200, data
    assert gw.up.requests[-1].path == GOOGLE + "/m-g:generateContent"


def test_claude_goes_to_raw_predict_under_the_path_base(gw):
    _openai(gw, "a")
    r = gw.up.requests[-1]
    assert r.path == CLAUDE + "/m-a:rawPredict"
    body = r.json()
    assert "model" not in body and body["anthropic_version"] == "vertex-2023-10-16"
    assert "anthropic-version" not in r.headers         # Vertex names it in the body
    s, data, _ = post(gw, "/v1/messages", {"model": "a", "max_tokens": 20, "messages": [
        {"role": "user", "content": "hi"}]}, {"x-api-key": "x", "anthropic-version": "2023-06-01"})
    assert s == 200, data
    assert gw.up.requests[-1].path == CLAUDE + "/m-a:rawPredict"


def test_cache_control_reaches_bedrock_only_where_the_model_takes_it(gw):
    body = {"max_tokens": 20,
            "system": [{"type": "text", "text": "long instructions",
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]}
    h = {"x-api-key": "x", "anthropic-version": "2023-06-01"}
    s, data, _ = post(gw, "/v1/messages", dict(body, model="claude-on-bedrock"), h)
    assert s == 200, data
    sent = gw.up.requests[-1].json()
    assert sent["system"] == [{"text": "long instructions"}, {"cachePoint": {"type": "default"}}]
    assert sent["messages"][0]["content"] == [{"text": "hi"},
                                              {"cachePoint": {"type": "default", "ttl": "1h"}}]
    # a model without the flag (Nova refuses cachePoint with a 400): the markers are dropped
    s, data, _ = post(gw, "/v1/messages", dict(body, model="nova"), h)
    assert s == 200, data
    sent = gw.up.requests[-1].json()
    assert sent["system"] == [{"text": "long instructions"}]
    assert sent["messages"][0]["content"] == [{"text": "hi"}]


def test_path_base_is_checked():
    from busbar.config import ConfigError, load
    base = "models:\n  m: {provider: p}\nproviders:\n  p: "
    env = {"K": "k"}
    with pytest.raises(ConfigError) as info:
        load(text=base + "{protocol: gemini, base_url: \"http://127.0.0.1:9\", api_key: {env: K}, "
             "path_base: v1/models}\n", env=env)
    assert info.value.problems == ["providers.p.path_base: must start with '/' (it is the whole "
                                   "request path after base_url)"]
    with pytest.raises(ConfigError) as info:
        load(text=base + "{protocol: gemini, base_url: \"http://127.0.0.1:9\", api_key: {env: K}, "
             "path_base: /b, path: /c}\n", env=env)
    assert info.value.problems == ["providers.p.path_base: give either path_base or path (a whole "
                                   "path, model included)"]
    c = load(text=base + "{protocol: openai, base_url: \"http://127.0.0.1:9\", api_key: {env: K}, "
             "path_base: /b}\n", env=env)
    assert "providers.p.path_base: has no effect on protocol openai (it is the base of a gemini "\
           "or anthropic path with the model in it); use path" in c.warnings
    assert c.providers["p"].path_base is None
