"""The same-protocol usage readers that read counts in place (framing.members: anthropic, openai,
responses, bedrock, cohere) agree with the codec's dict reader (read_response's usage) on every
shape a usage object can take: missing, null, float, negative, huge, string and boolean counts,
details that are not objects, escaped member names, whitespace, unknown members around the known
ones."""
import json
import random

import pytest

from cbusbar.framing import members, scan_top
from cbusbar.ir import CodecError
from cbusbar.proto import anthropic, bedrock, cohere, openai, responses

ODD = [None, 0, 1, 7, 255, 256, 70000, 2 ** 62, 2 ** 63 - 1, 2 ** 63, 2 ** 70, -3, 12.9, 1e30,
       -0.5, 1.5e3, "9", True, False, [1], {"x": 1}]
MISSING = object()


def _fields(u):
    return (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens,
            u.reasoning_tokens, u.input_known)


def _usage_objects(rng, names, details, n=400):
    for _ in range(n):
        u = {}
        for name in names:
            v = rng.choice(ODD + [MISSING] * 4)
            if v is not MISSING:
                u[name] = v
        for dname, inner in details.items():
            roll = rng.random()
            if roll < 0.5:
                d = {}
                for name in inner:
                    v = rng.choice(ODD + [MISSING] * 2)
                    if v is not MISSING:
                        d[name] = v
                d["other"] = {"deep": [1, {"a": "b"}]}
                u[dname] = d
            elif roll < 0.7:
                u[dname] = rng.choice(ODD)
        u["zzz_unknown"] = {"input_tokens": 99}
        yield u


def _check(codec, base, usage, field="usage"):
    doc = dict(base)
    doc[field] = usage
    for body in (json.dumps(doc).encode(), json.dumps(doc, indent=2).encode()):
        assert _fields(codec.read_usage(body)) == _fields(codec.read_response(body).usage), body


ANT = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
       "content": [{"type": "text", "text": "hi \"usage\": {\"input_tokens\": 5}"}],
       "stop_reason": "end_turn", "stop_sequence": None}
OAI = {"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
       "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                    "finish_reason": "stop"}]}


def test_anthropic_read_usage_matches_the_dict_reader():
    rng = random.Random(1)
    names = ["input_tokens", "output_tokens", "cache_read_input_tokens",
             "cache_creation_input_tokens"]
    for u in _usage_objects(rng, names, {"output_tokens_details": ["thinking_tokens"]}):
        _check(anthropic, ANT, u)
    for u in (None, 5, "usage", [1, 2], {}):
        _check(anthropic, ANT, u)


def test_openai_read_usage_matches_the_dict_reader():
    rng = random.Random(2)
    names = ["prompt_tokens", "completion_tokens", "total_tokens", "prompt_cache_hit_tokens"]
    details = {"prompt_tokens_details": ["cached_tokens", "cache_write_tokens"],
               "completion_tokens_details": ["reasoning_tokens"]}
    for u in _usage_objects(rng, names, details):
        _check(openai, OAI, u)
    for u in (None, 5, "usage", [1, 2], {}):
        _check(openai, OAI, u)


RESP = {"id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "m",
        "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "x", "annotations": []}]}]}
BED = {"output": {"message": {"role": "assistant", "content": [{"text": "x"}]}},
       "stopReason": "end_turn", "metrics": {"latencyMs": 1}}
COH = {"id": "c1", "finish_reason": "COMPLETE",
       "message": {"role": "assistant", "content": [{"type": "text", "text": "x"}]}}


def test_responses_read_usage_matches_the_dict_reader():
    rng = random.Random(3)
    details = {"input_tokens_details": ["cached_tokens", "cache_write_tokens"],
               "output_tokens_details": ["reasoning_tokens"]}
    for u in _usage_objects(rng, ["input_tokens", "output_tokens", "total_tokens"], details):
        _check(responses, RESP, u)
    for u in (None, 5, "usage", [1, 2], {}):
        _check(responses, RESP, u)


def test_bedrock_read_usage_matches_the_dict_reader():
    rng = random.Random(4)
    names = ["inputTokens", "outputTokens", "cacheReadInputTokens", "cacheWriteInputTokens",
             "totalTokens"]
    for u in _usage_objects(rng, names, {}):
        _check(bedrock, BED, u)
    for u in (None, 5, "usage", [1, 2], {}):
        _check(bedrock, BED, u)


def test_cohere_read_usage_matches_the_dict_reader():
    rng = random.Random(5)
    details = {"tokens": ["input_tokens", "output_tokens"],
               "billed_units": ["input_tokens", "output_tokens"]}
    for u in _usage_objects(rng, ["cached_tokens"], details):
        _check(cohere, COH, u)
    for u in (None, 5, "usage", [1, 2], {}):
        _check(cohere, COH, u)


def test_members_reads_in_place():
    body = b'{"a": 1, "usage" : {"x": 12, "y": null, "z": {"q": 3}, "w": "s", "x\\u0061": 5, "v": 2.9e1}}'
    span = scan_top(body, (b"usage",))[b"usage"]
    v = members(body, span, (b"x", b"y", b"z", b"w", b"xa", b"v", b"absent"))
    assert v[:2] == [12, None]
    assert body[v[2][0]:v[2][1]] == b'{"q": 3}'
    assert members(body, v[2], (b"q",)) == [3]
    assert v[3] == 0            # a string is not a count
    assert v[4] is None         # a name spelled with escapes is not matched
    assert v[5] == 29           # a float truncated, as jsonget.count does
    assert v[6] is None
    assert members(body, scan_top(body, (b"a",))[b"a"], (b"x",)) is None    # not an object
    assert members(body, (0, len(body) + 5), (b"x",)) is None               # span past the end


def test_not_json_is_an_upstream_fault():
    for codec in (anthropic, openai, responses, bedrock, cohere):
        for body in (b"", b"{", b'{"usage": {"input_tokens": 1}', b"[]", b'{"usage": 1} x'):
            with pytest.raises(CodecError):
                codec.read_usage(body)
