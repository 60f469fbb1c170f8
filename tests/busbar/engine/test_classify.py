"""Fault classification (SPEC §4.1) with each provider's real error bodies, read by the lane
protocol's own codec (stage 1), then error_map → built-ins → status (stage 1b) → disposition."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from busbar.engine.translate import CODECS
from busbar.engine.classify import (D_CLIENT_FAULT, D_CONTEXT, D_HARD_DOWN, D_TRANSIENT,
                                    classify_status, retry_after)

OWN = SimpleNamespace(error_map=(), upstream_credentials="own")
BYOK = SimpleNamespace(error_map=(), upstream_credentials="passthrough")

OPENAI_QUOTA = {"error": {"message": "You exceeded your current quota, please check your plan and "
                          "billing details.", "type": "insufficient_quota", "param": None,
                          "code": "insufficient_quota"}}
OPENAI_CONTEXT = {"error": {"message": "This model's maximum context length is 128000 tokens. "
                            "However, your messages resulted in 130412 tokens. Please reduce the "
                            "length of the messages.", "type": "invalid_request_error",
                            "param": "messages", "code": "context_length_exceeded"}}
OPENAI_KEY = {"error": {"message": "Incorrect API key provided: sk-abc. You can find your API key at "
                        "https://platform.openai.com/account/api-keys.", "type": "invalid_request_error",
                        "param": None, "code": "invalid_api_key"}}
OPENAI_RATE = {"error": {"message": "Rate limit reached for gpt-4o in organization org-x on tokens "
                         "per min (TPM): Limit 30000, Used 29000, Requested 2000.",
                         "type": "tokens", "param": None, "code": "rate_limit_exceeded"}}
OPENAI_BAD = {"error": {"message": "Invalid value for 'temperature'.", "type": "invalid_request_error",
                        "param": "temperature", "code": "invalid_value"}}
ANTHROPIC_OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
ANTHROPIC_CONTEXT = {"type": "error", "error": {"type": "invalid_request_error",
                                                "message": "prompt is too long: 208310 tokens > 200000 maximum"}}
ANTHROPIC_KEY = {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
ANTHROPIC_CREDIT = {"type": "error", "error": {
    "type": "invalid_request_error", "message": "Your credit balance is too low to access the "
    "Anthropic API. Please go to Plans & Billing to upgrade or purchase credits."}}
GEMINI_EXHAUSTED = {"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).",
                              "status": "RESOURCE_EXHAUSTED"}}
GEMINI_BAD_KEY = {"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.",
                            "status": "INVALID_ARGUMENT", "details": [{
                                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                                "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]}}
GEMINI_CONTEXT = {"error": {"code": 400, "message": "The input token count (1200000) exceeds the "
                            "maximum number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}}
GEMINI_UNAVAILABLE = {"error": {"code": 503, "message": "The model is overloaded. Please try again later.",
                                "status": "UNAVAILABLE"}}
COHERE_CONTEXT = {"message": "too many tokens: total number of tokens in the prompt cannot exceed "
                  "4081 - received 4500. Try using a shorter prompt, or enabling prompt truncating."}
COHERE_TRIAL = {"message": "You are using a Trial key, which is limited to 10 API calls / minute."}
COHERE_BAD = {"message": "invalid request: message must be at least 1 token long."}
BEDROCK_CONTEXT = {"__type": "com.amazon.coral.validate#ValidationException",
                   "message": "Input is too long for requested model."}
BEDROCK_THROTTLE = {"__type": "ThrottlingException",
                    "message": "Too many requests, please wait before trying again."}
BEDROCK_DENIED = {"__type": "AccessDeniedException",
                  "message": "You don't have access to the model with the specified model ID."}
BEDROCK_BAD = {"__type": "ValidationException", "message": "Malformed input request: extraneous key "
               "[foo] is not permitted, please reformat your input and try again."}


@pytest.mark.parametrize("proto,status,body,disposition,cls", [
    ("openai", 429, OPENAI_QUOTA, D_HARD_DOWN, "billing"),
    ("openai", 400, OPENAI_CONTEXT, D_CONTEXT, "context_length"),
    ("openai", 401, OPENAI_KEY, D_HARD_DOWN, "auth"),
    ("openai", 429, OPENAI_RATE, D_TRANSIENT, "rate_limit"),
    ("openai", 400, OPENAI_BAD, D_CLIENT_FAULT, "client_error"),
    ("openai", 500, OPENAI_CONTEXT, D_TRANSIENT, "server_error"),     # never context on a 5xx
    ("responses", 400, OPENAI_CONTEXT, D_CONTEXT, "context_length"),
    ("responses", 503, OPENAI_RATE, D_TRANSIENT, "server_error"),
    ("anthropic", 529, ANTHROPIC_OVERLOADED, D_TRANSIENT, "overloaded"),
    ("anthropic", 400, ANTHROPIC_CONTEXT, D_CONTEXT, "context_length"),
    ("anthropic", 401, ANTHROPIC_KEY, D_HARD_DOWN, "auth"),
    ("anthropic", 400, ANTHROPIC_CREDIT, D_HARD_DOWN, "billing"),
    ("gemini", 429, GEMINI_EXHAUSTED, D_TRANSIENT, "rate_limit"),
    ("gemini", 400, GEMINI_BAD_KEY, D_HARD_DOWN, "auth"),
    ("gemini", 400, GEMINI_CONTEXT, D_CONTEXT, "context_length"),
    ("gemini", 503, GEMINI_UNAVAILABLE, D_TRANSIENT, "server_error"),
    ("cohere", 400, COHERE_CONTEXT, D_CONTEXT, "context_length"),
    ("cohere", 429, COHERE_TRIAL, D_TRANSIENT, "rate_limit"),
    ("cohere", 400, COHERE_BAD, D_CLIENT_FAULT, "client_error"),
    ("bedrock", 400, BEDROCK_CONTEXT, D_CONTEXT, "context_length"),
    ("bedrock", 429, BEDROCK_THROTTLE, D_TRANSIENT, "rate_limit"),
    ("bedrock", 403, BEDROCK_DENIED, D_HARD_DOWN, "auth"),
    ("bedrock", 400, BEDROCK_BAD, D_CLIENT_FAULT, "client_error"),
    ("openai", 408, {}, D_TRANSIENT, "timeout"),
    ("openai", 502, b"<html>bad gateway</html>", D_TRANSIENT, "server_error"),
])
def test_real_error_bodies_classify(proto, status, body, disposition, cls):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    f = classify_status(CODECS[proto], status, [], raw, OWN)
    assert (f.disposition, f.cls) == (disposition, cls)


def test_stage_one_reads_each_providers_code():
    def stage_one(proto, status, body):
        return classify_status(CODECS[proto], status, [], json.dumps(body).encode(), OWN)

    assert stage_one("openai", 400, OPENAI_CONTEXT).code == "context_length_exceeded"
    assert stage_one("anthropic", 529, ANTHROPIC_OVERLOADED).code == "overloaded_error"
    assert stage_one("gemini", 429, GEMINI_EXHAUSTED).code == "RESOURCE_EXHAUSTED"
    assert stage_one("bedrock", 429, BEDROCK_THROTTLE).code == "ThrottlingException"
    assert "Trial key" in stage_one("cohere", 429, COHERE_TRIAL).message


def test_error_map_comes_first_but_never_makes_a_5xx_a_context_length():
    p = SimpleNamespace(error_map=(("overloaded_error", "client_error"), ("weird", "context_length")),
                        upstream_credentials="own", protocol="anthropic")
    body = json.dumps(ANTHROPIC_OVERLOADED).encode()
    assert classify_status(CODECS["anthropic"], 529, [], body, p).disposition == D_CLIENT_FAULT
    weird = json.dumps({"type": "error", "error": {"type": "weird", "message": "x"}}).encode()
    assert classify_status(CODECS["anthropic"], 422, [], weird, p).disposition == D_CONTEXT
    assert classify_status(CODECS["anthropic"], 502, [], weird, p).disposition == D_TRANSIENT


def mapped(proto, status, body, error_map):
    p = SimpleNamespace(error_map=tuple(error_map.items()), upstream_credentials="own", protocol=proto)
    f = classify_status(CODECS[proto], status, [], json.dumps(body).encode(), p)
    return f.disposition, f.cls


def test_error_map_is_matched_against_the_code_then_the_type_each_protocol_carries():
    """The Rust busbar's catalog values mean here what they mean there: its error_map is matched
    against each protocol's error code, then its error type."""
    # Z.ai's Anthropic-compatible endpoint: a numeric-looking code beside Anthropic's error.type
    zai = {"type": "error", "error": {"type": "invalid_request_error", "code": "1113",
                                      "message": "Insufficient balance or no resource package."}}
    assert mapped("anthropic", 400, zai, {}) == (D_CLIENT_FAULT, "client_error")
    assert mapped("anthropic", 400, zai, {"1113": "billing"}) == (D_HARD_DOWN, "billing")
    # Moonshot names its errors in error.type only
    moonshot = {"error": {"type": "exceeded_current_quota_error", "message": "quota exceeded"}}
    assert mapped("openai", 429, moonshot, {"exceeded_current_quota_error": "billing"}) == (
        D_HARD_DOWN, "billing")
    # the code is matched before the type
    both = {"error": {"code": "1302", "type": "tier_exhausted", "message": "slow down"}}
    assert mapped("openai", 400, both, {"tier_exhausted": "billing", "1302": "rate_limit"}) == (
        D_TRANSIENT, "rate_limit")
    assert mapped("responses", 400, both, {"tier_exhausted": "billing"}) == (D_HARD_DOWN, "billing")
    # Gemini: error.code (a number), else error.status
    gem = {"error": {"code": 400, "message": "quota", "status": "RESOURCE_EXHAUSTED"}}
    assert mapped("gemini", 400, gem, {"RESOURCE_EXHAUSTED": "rate_limit"}) == (D_TRANSIENT, "rate_limit")
    assert mapped("gemini", 400, gem, {"400": "billing"}) == (D_HARD_DOWN, "billing")
    # Bedrock: the exception name of a namespaced __type
    quota = {"__type": "com.amazon.coral.service#ServiceQuotaExceededException", "message": "quota"}
    assert mapped("bedrock", 400, quota, {"ServiceQuotaExceededException": "billing"}) == (
        D_HARD_DOWN, "billing")
    # Cohere: error_type
    assert mapped("cohere", 400, {"message": "no credit", "error_type": "payment"},
                  {"payment": "billing"}) == (D_HARD_DOWN, "billing")
    # a code mapped to context_length on a 5xx gives way to the type's mapping, then the status
    ctx = {"error": {"code": "weird", "type": "busy", "message": "x"}}
    assert mapped("openai", 502, ctx, {"weird": "context_length", "busy": "overloaded"}) == (
        D_TRANSIENT, "overloaded")
    # `network` (a Rust class busbar's built-ins never produce) is transient
    assert mapped("openai", 400, {"error": {"code": "conn_lost", "message": "x"}},
                  {"conn_lost": "network"}) == (D_TRANSIENT, "network")


def test_passthrough_credentials_make_an_auth_error_the_callers():
    body = json.dumps(OPENAI_KEY).encode()
    assert classify_status(CODECS["openai"], 401, [], body, BYOK).disposition == D_CLIENT_FAULT
    assert classify_status(CODECS["openai"], 401, [], body, OWN).disposition == D_HARD_DOWN


def test_retry_after_forms():
    assert retry_after([(b"retry-after", b"7")]) == 7.0
    assert retry_after([(b"retry-after-ms", b"1500"), (b"retry-after", b"9")]) == 1.5
    assert retry_after([(b"retry-after", b"Wed, 21 Oct 2015 07:28:00 GMT")], now=1445412470.0) == 10.0
    assert retry_after([(b"retry-after", b"soon")]) is None
    assert retry_after([]) is None
    f = classify_status(CODECS["anthropic"], 429, [(b"retry-after", b"12")], b"{}", OWN)
    assert f.retry_after == 12.0 and f.disposition == D_TRANSIENT
