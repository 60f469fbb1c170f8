"""`limits.reasoning_effort_budgets`: the table a translation uses between an effort word (OpenAI
`reasoning_effort`) and a thinking budget (Anthropic `thinking.budget_tokens`, Gemini
`thinkingBudget`), in both directions. Through the real server: an upstream written in the test
records what each lane was sent."""
from __future__ import annotations

import json

import pytest

from tests.conftest import start_gateway, stop
from tests.hostile import HostileUpstream, http_response, openai_body
from tests.integration.gov_helpers import post

ANTHROPIC_OK = json.dumps({
    "id": "msg_1", "type": "message", "role": "assistant", "model": "m-a",
    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 1}}).encode()
GEMINI_OK = json.dumps({
    "candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]},
                    "finishReason": "STOP", "index": 0}],
    "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 1,
                      "totalTokenCount": 4}}).encode()

CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  up-openai:    {protocol: openai, base_url: "URL", api_key: {env: MOCK_KEY}}
  up-anthropic: {protocol: anthropic, base_url: "URL", api_key: {env: MOCK_KEY}}
  up-gemini:    {protocol: gemini, base_url: "URL", api_key: {env: MOCK_KEY}}
models:
  o: {provider: up-openai, upstream_model: m-o, reasoning: true}
  a: {provider: up-anthropic, upstream_model: m-a, reasoning: true}
  g: {provider: up-gemini, upstream_model: m-g, reasoning: true}
LIMITS"""


@pytest.fixture
def upstream():
    def answer(body):
        return lambda c, req: c.sendall(http_response(200, body))
    up = HostileUpstream({"m-o": answer(openai_body("ok")), "m-a": answer(ANTHROPIC_OK),
                          "m-g": answer(GEMINI_OK)})
    yield up
    up.close()


def _effort(g, model, effort):
    s, data, _ = post(g, "/v1/chat/completions", {
        "model": model, "max_tokens": 30000, "reasoning_effort": effort,
        "messages": [{"role": "user", "content": "hi"}]}, {"authorization": "Bearer x"})
    assert s == 200, data


def _thinking(g, model, budget):
    s, data, _ = post(g, "/v1/messages", {
        "model": model, "max_tokens": 30000, "thinking": {"type": "enabled", "budget_tokens": budget},
        "messages": [{"role": "user", "content": "hi"}]},
        {"x-api-key": "x", "anthropic-version": "2023-06-01"})
    assert s == 200, data


def _sent(up):
    return up.requests[-1].json()


def _run(tmp_path, up, limits):
    return start_gateway(tmp_path, CONFIG.replace("URL", up.url).replace("LIMITS", limits))


def test_configured_budgets_translate_both_ways(tmp_path, upstream):
    g = _run(tmp_path, upstream, "limits:\n  reasoning_effort_budgets: "
                                 "{minimal: 2000, low: 3000, medium: 5000, high: 9000}\n")
    try:
        _effort(g, "a", "low")                          # word -> Anthropic budget
        assert _sent(upstream)["thinking"] == {"type": "enabled", "budget_tokens": 3000}
        _effort(g, "g", "high")                         # word -> Gemini budget
        tc = _sent(upstream)["generationConfig"]["thinkingConfig"]
        assert tc["thinkingBudget"] == 9000
        # budget -> the smallest word whose budget covers it: 6000 is over medium's 5000 here
        # (under the default table's 8192 it would be medium)
        _thinking(g, "o", 6000)
        assert _sent(upstream)["reasoning_effort"] == "high"
        _thinking(g, "o", 2500)
        assert _sent(upstream)["reasoning_effort"] == "low"
    finally:
        stop(g.proc)


def test_the_defaults_without_the_key(tmp_path, upstream):
    g = _run(tmp_path, upstream, "")
    try:
        _effort(g, "a", "low")
        assert _sent(upstream)["thinking"]["budget_tokens"] == 4096
        _thinking(g, "o", 6000)
        assert _sent(upstream)["reasoning_effort"] == "medium"
    finally:
        stop(g.proc)


def test_budgets_must_ascend():
    from busbar.config import ConfigError, load
    base = ("providers:\n  p: {protocol: openai, base_url: \"http://127.0.0.1:9\", api_key: "
            "{env: K}}\nmodels:\n  m: {provider: p}\n")
    with pytest.raises(ConfigError) as info:
        load(text=base + "limits: {reasoning_effort_budgets: {low: 9000}}\n", env={"K": "k"})
    assert info.value.problems == [
        "limits.reasoning_effort_budgets: budgets must ascend from minimal to high (minimal <= "
        "low <= medium <= high), got 1024/9000/8192/16384"]
    c = load(text=base + "limits: {reasoning_effort_budgets: {high: 32000}}\n", env={"K": "k"})
    assert c.limits.reasoning_effort_budgets == (1024, 4096, 8192, 32000)
