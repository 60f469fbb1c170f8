"""The Cohere v2 chat codec, fed bytes; its output checked against the cohere SDK's own types and
stream parser (a loopback http.server standing in for api.cohere.com)."""
import http.server
import json
import random
import threading
import uuid

import orjson
import pytest

from cbusbar import ir
from cbusbar.proto import cohere as co


def _req(**fields):
    body = {"model": "command-a-03-2025", "messages": [{"role": "user", "content": "hi"}],
            "stream": False}
    body.update(fields)
    return orjson.dumps(body)


# The default final usage of _text_events; never mutated (the encoders copy what they merge).
_TEXT_USAGE = ir.Usage(12, 7)


def _text_events(text_chunks, stop=ir.END_TURN, usage=_TEXT_USAGE):
    evs = [ir.ev_message_start("up-1", "m", ir.Usage(12, 0)), ir.ev_block_start(0, ir.text_block(None))]
    evs += [ir.ev_block_delta(0, ir.DELTA_TEXT, t) for t in text_chunks]
    evs += [ir.ev_block_stop(0), ir.ev_message_delta(stop, None, usage), ir.ev_message_stop()]
    return evs


def _tool_events():
    call = ir.Block(ir.TOOL_USE, id="call_1", name="get_weather")
    return [
        ir.ev_message_start("up-1", "m", ir.Usage(30, 0)),
        ir.ev_block_start(0, ir.text_block(None)),
        ir.ev_block_delta(0, ir.DELTA_TEXT, "I will check."),
        ir.ev_block_stop(0),
        ir.ev_block_start(1, call),
        ir.ev_block_delta(1, ir.DELTA_INPUT_JSON, '{"city":'),
        ir.ev_block_delta(1, ir.DELTA_INPUT_JSON, ' "Paris"}'),
        ir.ev_block_stop(1),
        ir.ev_message_delta(ir.TOOL_USE_STOP, None, ir.Usage(30, 9)),
        ir.ev_message_stop(),
    ]


def _frames(*payloads, done=True):
    out = b""
    for p in payloads:
        out += b"event: " + p["type"].encode() + b"\ndata: " + orjson.dumps(p) + b"\n\n"
    if done:
        out += b"data: [DONE]\n\n"
    return out


UPSTREAM_TEXT = _frames(
    {"id": "5b0b7a0c-0000-4000-8000-000000000001", "type": "message-start",
     "delta": {"message": {"role": "assistant", "content": [], "tool_plan": "", "tool_calls": [],
                           "citations": []}}},
    {"type": "content-start", "index": 0, "delta": {"message": {"content": {"type": "text", "text": ""}}}},
    {"type": "content-delta", "index": 0, "delta": {"message": {"content": {"text": "Bonjour"}}}},
    {"type": "content-delta", "index": 0, "delta": {"message": {"content": {"text": " à tous"}}}},
    {"type": "content-end", "index": 0},
    {"type": "message-end", "delta": {"finish_reason": "COMPLETE", "usage": {
        "billed_units": {"input_tokens": 5, "output_tokens": 3},
        "tokens": {"input_tokens": 205, "output_tokens": 4}, "cached_tokens": 128}}},
)

UPSTREAM_TOOL = _frames(
    {"id": "5b0b7a0c-0000-4000-8000-000000000002", "type": "message-start",
     "delta": {"message": {"role": "assistant"}}},
    {"type": "tool-plan-delta", "delta": {"message": {"tool_plan": "I will look"}}},
    {"type": "tool-plan-delta", "delta": {"message": {"tool_plan": " it up."}}},
    {"type": "tool-call-start", "index": 0, "delta": {"message": {"tool_calls": {
        "id": "get_weather_abc", "type": "function", "function": {"name": "get_weather", "arguments": ""}}}}},
    {"type": "tool-call-delta", "index": 0,
     "delta": {"message": {"tool_calls": {"function": {"arguments": "{\"city\""}}}}},
    {"type": "tool-call-delta", "index": 0,
     "delta": {"message": {"tool_calls": {"function": {"arguments": ": \"Oslo\"}"}}}}},
    {"type": "tool-call-end", "index": 0},
    {"type": "tool-call-start", "index": 1, "delta": {"message": {"tool_calls": {
        "id": "now_def", "type": "function", "function": {"name": "now", "arguments": ""}}}}},
    {"type": "tool-call-end", "index": 1},
    {"type": "message-end", "delta": {"finish_reason": "TOOL_CALL", "usage": {
        "billed_units": {"input_tokens": 50, "output_tokens": 20},
        "tokens": {"input_tokens": 900, "output_tokens": 40}}}},
)


def _decode(data, step):
    dec = co.StreamDecoder()
    events = []
    for i in range(0, len(data), step):
        events += dec.feed(data[i:i + step])
    events += dec.close()
    return events


def _summary(events):
    return [(e.kind, e.index if e.kind in (ir.BLOCK_START, ir.BLOCK_DELTA, ir.BLOCK_STOP) else None,
             e.text, e.block.kind if e.block is not None else None) for e in events]


# ---------------------------------------------------------------------------------------------
# module surface


def test_module_names():
    assert co.NAME == "cohere"
    assert co.CONTENT_TYPE == b"application/json"
    assert co.STREAM_CONTENT_TYPE == b"text/event-stream"
    assert co.upstream_path("command-a", False) == "/v2/chat"
    assert co.upstream_path("command-a", True) == "/v2/chat"


def test_mint_id_is_uuid4():
    a, b = co.mint_id(), co.mint_id()
    assert a != b
    assert uuid.UUID(a).version == 4


def test_errors():
    body = co.write_error(401, "authentication", "invalid api token", "req_1")
    assert orjson.loads(body) == {"message": "invalid api token"}
    assert co.read_error_detail(body)[0] == "invalid api token"
    assert co.read_error_detail(b'{"detail": "x"}')[0] is None
    assert co.read_error_detail(b"<html>")[0] is None
    assert co.read_error_detail(b'["message"]')[0] is None


# ---------------------------------------------------------------------------------------------
# read_request


def test_read_request_text_and_system():
    req = co.read_request(orjson.dumps({
        "model": "command-a-03-2025", "stream": True,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "Hi!"},
            {"role": "system", "content": [{"type": "text", "text": "Use French."}]},
            {"role": "user", "content": "Again"},
        ]}))
    assert req.model == "command-a-03-2025"
    assert req.stream is True
    assert [b.text for b in req.system] == ["Be brief.", "Use French."]
    assert [m.role for m in req.messages] == [ir.USER, ir.ASSISTANT, ir.USER]
    assert [b.text for b in req.messages[0].content] == ["Hello", "there"]
    assert req.messages[1].content[0].text == "Hi!"
    assert req.extra == {}


def test_read_request_parameters_and_extra():
    req = co.read_request(_req(
        max_tokens=300, temperature=0.7, p=0.9, k=40, stop_sequences=["END", "STOP"],
        frequency_penalty=0.1, presence_penalty=0.2, seed=7, logprobs=True,
        documents=[{"data": {"text": "doc"}}], citation_options={"mode": "FAST"},
        safety_mode="STRICT", strict_tools=True, thinking={"type": "enabled"}))
    assert req.max_tokens == 300
    assert req.temperature == 0.7
    assert req.top_p == 0.9
    assert req.top_k == 40
    assert req.stop == ["END", "STOP"]
    assert (req.frequency_penalty, req.presence_penalty, req.seed, req.logprobs) == (0.1, 0.2, 7, True)
    assert req.stream is False
    assert set(req.extra) == {"documents", "citation_options", "safety_mode", "strict_tools", "thinking"}


def test_read_request_images():
    req = co.read_request(_req(messages=[{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]}]))
    text, inline, remote = req.messages[0].content
    assert text.text == "What is this?"
    assert (inline.kind, inline.src_kind, inline.media_type, inline.data) == (
        ir.IMAGE, ir.SOURCE_BASE64, "image/jpeg", "/9j/4AAQ")
    assert (remote.kind, remote.src_kind, remote.data) == (ir.IMAGE, ir.SOURCE_URL, "https://example.com/cat.png")


def test_read_request_tools_calls_and_results():
    req = co.read_request(_req(
        tools=[{"type": "function", "function": {
            "name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        tool_choice="REQUIRED",
        messages=[
            {"role": "user", "content": "Weather in Oslo and Rome?"},
            {"role": "assistant", "tool_plan": "I will look both up.", "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}},
                {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "{\"temp\": 3}"},
            {"role": "tool", "tool_call_id": "c2", "content": [
                {"type": "text", "text": "sunny"},
                {"type": "document", "document": {"data": {"temp": 21}, "id": "d1"}}]},
            {"role": "user", "content": "Thanks"},
        ]))
    assert req.tool_choice == ir.TOOL_CHOICE_REQUIRED
    assert [(t.name, t.description) for t in req.tools] == [("get_weather", "Weather")]
    assert req.tools[0].schema["properties"]["city"] == {"type": "string"}
    user, assistant, results, thanks = req.messages
    plan, call1, call2 = assistant.content
    assert (plan.kind, plan.text) == (ir.TEXT, "I will look both up.")
    assert (call1.kind, call1.id, call1.name, call1.input) == (ir.TOOL_USE, "c1", "get_weather", {"city": "Oslo"})
    assert call2.input == {}
    assert results.role == ir.USER
    assert [(b.kind, b.id) for b in results.content] == [(ir.TOOL_RESULT, "c1"), (ir.TOOL_RESULT, "c2")]
    assert [c.text for c in results.content[1].content] == ["sunny", '{"temp":21}']
    assert thanks.content[0].text == "Thanks"


def test_read_request_tool_choice_and_response_format():
    assert co.read_request(_req(tool_choice="NONE")).tool_choice == ir.TOOL_CHOICE_NONE
    assert co.read_request(_req()).tool_choice == ir.TOOL_CHOICE_UNSET
    req = co.read_request(_req(response_format={"type": "json_object"}))
    assert req.response_format == ir.FORMAT_JSON_OBJECT
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    req = co.read_request(_req(response_format={"type": "json_object", "json_schema": schema}))
    assert (req.response_format, req.rf_schema) == (ir.FORMAT_JSON_SCHEMA, schema)
    assert co.read_request(_req(response_format={"type": "text"})).response_format == ir.FORMAT_TEXT


def test_read_request_assistant_thinking_and_unparseable_arguments():
    req = co.read_request(_req(messages=[
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "ok"}],
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]},
    ]))
    kinds = [(b.kind, b.text) for b in req.messages[1].content]
    assert kinds[:2] == [(ir.THINKING, "hmm"), (ir.TEXT, "ok")]
    assert req.messages[1].content[2].input == "not json"


@pytest.mark.parametrize("body,message", [
    (b"{not json", "We could not parse the JSON body of your request."),
    (b"", "We could not parse the JSON body of your request."),
    (b"[1, 2]", "The request body must be a JSON object."),
    (b'{"messages": []}', "Missing required parameter: 'model'."),
    (b'{"model": "", "messages": []}', "Missing required parameter: 'model'."),
    (b'{"model": "m"}', "Missing required parameter: 'messages'."),
    (b'{"model": "m", "messages": {}}', "Invalid type for 'messages': expected an array."),
    (b'{"model": "m", "messages": [{"role": "bot", "content": "x"}]}',
     "Invalid value for 'messages[0].role': expected one of 'system', 'user', 'assistant', 'tool'."),
    (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}',
     "Invalid type for 'messages[0].content': expected a string or an array of content parts."),
    (b'{"model": "m", "messages": [{"role": "tool", "content": "x"}]}',
     "Missing required parameter: 'messages[0].tool_call_id'."),
    (b'{"model": "m", "messages": [], "temperature": "hot"}', "Invalid type for 'temperature': expected a number."),
    (b'{"model": "m", "messages": [], "max_tokens": true}', "Invalid type for 'max_tokens': expected an integer."),
    (b'{"model": "m", "messages": [], "stop_sequences": "x"}',
     "Invalid type for 'stop_sequences': expected an array of strings."),
    (b'{"model": "m", "messages": [], "tool_choice": "AUTO"}',
     "Invalid value for 'tool_choice': expected 'REQUIRED' or 'NONE'."),
    (b'{"model": "m", "messages": [], "tools": [{"type": "function"}]}',
     "Invalid type for 'tools[0].function': expected an object."),
])
def test_read_request_rejects(body, message):
    with pytest.raises(ir.CodecError) as exc:
        co.read_request(body)
    assert str(exc.value) == message


def _garbage(rng, depth=0):
    pick = rng.randrange(9 if depth < 3 else 6)
    return [None, True, 3, -1.5, "", "text", {"type": "text"}, [], {}][pick] if pick < 6 else (
        [_garbage(rng, depth + 1) for _ in range(rng.randrange(3))] if pick == 6 else
        {rng.choice(["type", "text", "role", "content", "image_url", "url", "function", "tool_calls",
                     "arguments", "document", "data", "tool_call_id", "name"]): _garbage(rng, depth + 1)
         for _ in range(rng.randrange(4))})


def test_read_request_garbage_only_raises_codec_error():
    rng = random.Random(1234)
    keys = ["model", "messages", "tools", "tool_choice", "response_format", "max_tokens",
            "temperature", "p", "k", "stop_sequences", "seed", "logprobs", "stream"]
    for _ in range(3000):
        body = {"model": "m", "messages": [{"role": rng.choice(["user", "assistant", "tool", "system"]),
                                            "content": _garbage(rng)} for _ in range(rng.randrange(3))]}
        for m in body["messages"]:
            if rng.random() < 0.5:
                m[rng.choice(["tool_calls", "tool_plan", "tool_call_id"])] = _garbage(rng)
        for _ in range(rng.randrange(3)):
            body[rng.choice(keys)] = _garbage(rng)
        try:
            co.read_request(orjson.dumps(body))
        except ir.CodecError:
            pass
    for n in range(200):
        try:
            co.read_request(bytes(rng.randrange(256) for _ in range(n)))
        except ir.CodecError:
            pass


# ---------------------------------------------------------------------------------------------
# write_request


def test_write_request_inverse():
    body = {
        "model": "command-a-03-2025",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [
                {"type": "text", "text": "Look"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]},
            {"role": "assistant", "tool_plan": "Checking.", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]},
            {"role": "assistant", "content": "It is 42."},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                      "parameters": {"type": "object"}}}],
        "tool_choice": "NONE",
        "response_format": {"type": "json_object", "json_schema": {"type": "object"}},
        "max_tokens": 100, "temperature": 0.3, "p": 0.8, "k": 5, "stop_sequences": ["x"],
        "frequency_penalty": 0.5, "presence_penalty": 0.25, "seed": 1, "logprobs": False,
        "stream": True, "safety_mode": "OFF",
    }
    assert orjson.loads(co.write_request(co.read_request(orjson.dumps(body)))) == body


def test_write_request_caps_and_drops():
    req = co.read_request(_req())
    req.stop = ["a", "b", "c", "d", "e", "f", "g"]
    req.tools = [ir.Tool("f", None, None)]
    req.tool_choice = ir.TOOL_CHOICE_TOOL
    req.tool_choice_name = "f"
    req.parallel_tool_calls = False
    req.reasoning_effort = "high"
    req.reasoning_budget = 2048
    req.n = 2
    req.user = "u"
    out = orjson.loads(co.write_request(req))
    assert out["stop_sequences"] == ["a", "b", "c", "d", "e"]
    assert out["tool_choice"] == "REQUIRED"
    assert out["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    for dropped in ("parallel_tool_calls", "reasoning_effort", "thinking", "n", "user"):
        assert dropped not in out

    req.tools = []
    assert "tool_choice" not in orjson.loads(co.write_request(req))
    req.tools = [ir.Tool("f", None, None)]
    req.tool_choice = ir.TOOL_CHOICE_AUTO
    assert "tool_choice" not in orjson.loads(co.write_request(req))


def test_write_request_tool_results_images_and_thinking():
    req = ir.Request()
    req.model = "m"
    image = ir.Block(ir.IMAGE, src_kind=ir.SOURCE_BASE64, media_type="image/webp", data="UklGR")
    url_image = ir.Block(ir.IMAGE, src_kind=ir.SOURCE_URL, data="https://x/y.png")
    vendor = ir.Block(ir.IMAGE, src_kind=ir.SOURCE_VENDOR, data="file-123")
    req.messages = [
        ir.Message(ir.USER, [ir.text_block("see"), image, url_image, vendor]),
        ir.Message(ir.ASSISTANT, [ir.Block(ir.THINKING, "private", signature="sig"),
                                  ir.text_block("Let me call."),
                                  ir.Block(ir.TOOL_USE, id="t1", name="f", input={"q": "x"})]),
        ir.Message(ir.USER, [ir.Block(ir.TOOL_RESULT, id="t1", content=[ir.text_block("r1"), image],
                                      is_error=True),
                             ir.text_block("and now?")]),
        ir.Message(ir.ASSISTANT, [ir.Block(ir.THINKING, "only thinking")]),
    ]
    out = orjson.loads(co.write_request(req))
    assert out["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": "data:image/webp;base64,UklGR"}},
            {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
        {"role": "assistant", "tool_plan": "Let me call.", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{\"q\":\"x\"}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "r1"}]},
        {"role": "user", "content": "and now?"},
    ]
    assert out["stream"] is False
    assert "tools" not in out and "tool_choice" not in out


# ---------------------------------------------------------------------------------------------
# buffered responses


def _validate(body):
    from cohere.v2.types.v2chat_response import V2ChatResponse
    return V2ChatResponse.model_validate(orjson.loads(body))


def test_read_response_text_usage_and_citations():
    resp = co.read_response(orjson.dumps({
        "id": "8c0c0000-0000-4000-8000-000000000000",
        "finish_reason": "COMPLETE",
        "message": {"role": "assistant",
                    "content": [{"type": "thinking", "thinking": "why"}, {"type": "text", "text": "Answer"}],
                    "citations": [{"start": 0, "end": 6, "text": "Answer", "content_index": 1,
                                   "sources": [], "type": "TEXT_CONTENT"}]},
        "usage": {"billed_units": {"input_tokens": 5, "output_tokens": 2},
                  "tokens": {"input_tokens": 500, "output_tokens": 6}, "cached_tokens": 448},
        "logprobs": [{"text": "A", "token_ids": [1], "logprobs": [-0.1]}],
    }))
    assert resp.id == "8c0c0000-0000-4000-8000-000000000000"
    assert [(b.kind, b.text) for b in resp.content] == [(ir.THINKING, "why"), (ir.TEXT, "Answer")]
    assert resp.content[1].citations[0]["text"] == "Answer"
    assert resp.stop_reason == ir.END_TURN
    assert (resp.usage.input_tokens, resp.usage.output_tokens, resp.usage.cache_read_tokens) == (500, 6, 448)
    assert resp.logprobs is None


def test_read_response_tool_call_and_billed_fallback():
    resp = co.read_response(orjson.dumps({
        "id": "x", "finish_reason": "TOOL_CALL",
        "message": {"role": "assistant", "tool_plan": "I will search.", "tool_calls": [
            {"id": "s_1", "type": "function", "function": {"name": "search", "arguments": "{\"q\":\"a\"}"}}]},
        "usage": {"billed_units": {"input_tokens": 11, "output_tokens": 3}},
    }))
    assert [(b.kind, b.text) for b in resp.content] == [(ir.TEXT, "I will search."), (ir.TOOL_USE, None)]
    assert (resp.content[1].id, resp.content[1].name, resp.content[1].input) == ("s_1", "search", {"q": "a"})
    assert resp.stop_reason == ir.TOOL_USE_STOP
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (11, 3)


@pytest.mark.parametrize("finish,stop", [
    ("COMPLETE", ir.END_TURN), ("STOP_SEQUENCE", ir.STOP_SEQUENCE), ("MAX_TOKENS", ir.MAX_TOKENS),
    ("TOOL_CALL", ir.TOOL_USE_STOP), ("ERROR", ir.ERROR), ("ERROR_TOXIC", ir.SAFETY),
    ("TIMEOUT", ir.ERROR), ("SOMETHING_NEW", ir.OTHER),
])
def test_read_finish_reasons(finish, stop):
    assert co.read_response(orjson.dumps({"id": "x", "finish_reason": finish,
                                          "message": {"role": "assistant", "content": []}})).stop_reason == stop


@pytest.mark.parametrize("stop,finish", [
    (ir.END_TURN, "COMPLETE"), (ir.STOP_SEQUENCE, "STOP_SEQUENCE"), (ir.MAX_TOKENS, "MAX_TOKENS"),
    (ir.TOOL_USE_STOP, "TOOL_CALL"), (ir.SAFETY, "ERROR"), (ir.ERROR, "ERROR"),
    (ir.REFUSAL, "COMPLETE"), (ir.PAUSE_TURN, "COMPLETE"), (ir.OTHER, "COMPLETE"), (ir.STOP_UNSET, "COMPLETE"),
])
def test_write_finish_reasons(stop, finish):
    resp = ir.Response()
    resp.id = "r"
    resp.stop_reason = stop
    assert orjson.loads(co.write_response(resp))["finish_reason"] == finish


def test_write_response_validates_with_sdk():
    resp = ir.Response()
    resp.id = co.mint_id()
    resp.content = [ir.Block(ir.THINKING, "think", signature="s"), ir.text_block("Hello.")]
    resp.content[1].citations = [{"start": 0, "end": 5, "text": "Hello", "sources": []}]
    resp.stop_reason = ir.END_TURN
    resp.usage = ir.Usage(100, 20, cache_read_tokens=64)
    body = co.write_response(resp)
    parsed = _validate(body)
    assert parsed.id == resp.id
    assert parsed.finish_reason == "COMPLETE"
    assert [c.type for c in parsed.message.content] == ["thinking", "text"]
    assert parsed.message.content[1].text == "Hello."
    assert parsed.message.citations[0].content_index == 1
    assert parsed.usage.tokens.input_tokens == 100 and parsed.usage.cached_tokens == 64

    resp.content = [ir.text_block("Calling."), ir.Block(ir.TOOL_USE, id="c9", name="f", input={"x": [1]})]
    resp.stop_reason = ir.TOOL_USE_STOP
    parsed = _validate(co.write_response(resp))
    assert parsed.finish_reason == "TOOL_CALL"
    assert parsed.message.tool_plan == "Calling."
    assert parsed.message.tool_calls[0].id == "c9"
    assert orjson.loads(parsed.message.tool_calls[0].function.arguments) == {"x": [1]}


def test_response_round_trip():
    body = {
        "id": "r1", "finish_reason": "MAX_TOKENS",
        "message": {"role": "assistant", "content": [{"type": "text", "text": "Cut sh"}]},
        "usage": {"billed_units": {"input_tokens": 9, "output_tokens": 4},
                  "tokens": {"input_tokens": 9, "output_tokens": 4}},
    }
    assert orjson.loads(co.write_response(co.read_response(orjson.dumps(body)))) == body


def test_read_response_garbage_only_raises_codec_error():
    rng = random.Random(99)
    for _ in range(2000):
        doc = {k: _garbage(rng) for k in rng.sample(["id", "message", "finish_reason", "usage"], rng.randrange(5))}
        if rng.random() < 0.7:
            doc["message"] = {k: _garbage(rng) for k in rng.sample(
                ["content", "tool_plan", "tool_calls", "citations"], rng.randrange(5))}
        if rng.random() < 0.3:
            doc["usage"] = {"tokens": {"input_tokens": rng.choice([1e30, -5, 2 ** 70, "x", 3.5])}}
        try:
            co.read_response(json.dumps(doc).encode())   # stdlib: orjson refuses 2**70
        except ir.CodecError:
            pass
    with pytest.raises(ir.CodecError):
        co.read_response(b"<html>502</html>")


def test_read_usage():
    body = orjson.dumps({"id": "x", "message": {"content": []}, "finish_reason": "COMPLETE",
                         "usage": {"billed_units": {"input_tokens": 1, "output_tokens": 2},
                                   "tokens": {"input_tokens": 30, "output_tokens": 4}, "cached_tokens": 16}})
    u = co.read_usage(body)
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.input_known) == (30, 4, 16, True)
    assert co.read_usage(b'{"id": "x"}').input_known is False
    with pytest.raises(ir.CodecError):
        co.read_usage(b'{"usage": ')


# ---------------------------------------------------------------------------------------------
# StreamDecoder


@pytest.mark.parametrize("step", [1, 3, 7, 64, 100000])
def test_decode_text_stream_any_split(step):
    events = _decode(UPSTREAM_TEXT, step)
    assert [e.kind for e in events] == [ir.MESSAGE_START, ir.BLOCK_START, ir.BLOCK_DELTA, ir.BLOCK_DELTA,
                                        ir.BLOCK_STOP, ir.MESSAGE_DELTA, ir.MESSAGE_STOP]
    assert events[0].id == "5b0b7a0c-0000-4000-8000-000000000001"
    assert events[0].usage.input_known is False
    assert "".join(e.text for e in events if e.kind == ir.BLOCK_DELTA) == "Bonjour à tous"
    end = events[5]
    assert end.stop_reason == ir.END_TURN
    assert (end.usage.input_tokens, end.usage.output_tokens, end.usage.cache_read_tokens) == (205, 4, 128)


def test_decode_tool_stream():
    events = _decode(UPSTREAM_TOOL, 5)
    starts = [e for e in events if e.kind == ir.BLOCK_START]
    assert [(e.index, e.block.kind, e.block.id, e.block.name) for e in starts] == [
        (0, ir.TEXT, None, None), (1, ir.TOOL_USE, "get_weather_abc", "get_weather"),
        (2, ir.TOOL_USE, "now_def", "now")]
    by_block = {}
    for e in events:
        if e.kind == ir.BLOCK_DELTA:
            by_block.setdefault(e.index, []).append((e.delta_kind, e.text))
    assert "".join(t for _, t in by_block[0]) == "I will look it up."
    assert {k for k, _ in by_block[1]} == {ir.DELTA_INPUT_JSON}
    assert orjson.loads("".join(t for _, t in by_block[1])) == {"city": "Oslo"}
    # A call that streamed no arguments still gets valid JSON arguments.
    assert by_block[2] == [(ir.DELTA_INPUT_JSON, "{}")]
    stops = [e.index for e in events if e.kind == ir.BLOCK_STOP]
    assert stops == [0, 1, 2]
    delta = [e for e in events if e.kind == ir.MESSAGE_DELTA][0]
    assert delta.stop_reason == ir.TOOL_USE_STOP
    assert (delta.usage.input_tokens, delta.usage.output_tokens) == (900, 40)
    assert events[-1].kind == ir.MESSAGE_STOP


def test_decode_thinking_and_citation_after_content_end():
    data = _frames(
        {"id": "i", "type": "message-start", "delta": {"message": {"role": "assistant"}}},
        {"type": "content-start", "index": 0, "delta": {"message": {"content": {"type": "thinking", "thinking": ""}}}},
        {"type": "content-delta", "index": 0, "delta": {"message": {"content": {"thinking": "Let me see"}}}},
        {"type": "content-end", "index": 0},
        {"type": "content-start", "index": 1, "delta": {"message": {"content": {"type": "text", "text": ""}}}},
        {"type": "content-delta", "index": 1, "delta": {"message": {"content": {"text": "Cited fact."}}}},
        {"type": "content-end", "index": 1},
        {"type": "citation-start", "index": 0, "delta": {"message": {"citations": {
            "start": 0, "end": 5, "text": "Cited", "sources": [], "content_index": 1, "type": "TEXT_CONTENT"}}}},
        {"type": "citation-end", "index": 0},
        {"type": "message-end",
         "delta": {"finish_reason": "COMPLETE", "usage": {"tokens": {"input_tokens": 3, "output_tokens": 4}}}},
    )
    events = _decode(data, 11)
    kinds = [(e.kind, e.index, e.delta_kind) for e in events if e.kind != ir.MESSAGE_START]
    assert kinds == [
        (ir.BLOCK_START, 0, 0), (ir.BLOCK_DELTA, 0, ir.DELTA_THINKING), (ir.BLOCK_STOP, 0, 0),
        (ir.BLOCK_START, 1, 0), (ir.BLOCK_DELTA, 1, ir.DELTA_TEXT), (ir.BLOCK_DELTA, 1, ir.DELTA_CITATION),
        (ir.BLOCK_STOP, 1, 0), (ir.MESSAGE_DELTA, 0, 0), (ir.MESSAGE_STOP, 0, 0)]
    assert events[1].block.kind == ir.THINKING
    cite = [e for e in events if e.delta_kind == ir.DELTA_CITATION][0]
    assert cite.data["text"] == "Cited"


def test_decode_bare_data_without_event_lines_and_missing_start():
    data = (b'data: {"type":"content-delta","index":0,"delta":{"message":{"content":{"text":"x"}}}}\r\n\r\n'
            b'data: {"type":"message-end","delta":{"finish_reason":"MAX_TOKENS"}}\r\n\r\n')
    events = _decode(data, 4)
    assert [e.kind for e in events] == [ir.MESSAGE_START, ir.BLOCK_START, ir.BLOCK_DELTA, ir.BLOCK_STOP,
                                        ir.MESSAGE_DELTA, ir.MESSAGE_STOP]
    assert events[4].stop_reason == ir.MAX_TOKENS


def test_decode_mid_stream_error_and_truncation():
    head = UPSTREAM_TEXT[:UPSTREAM_TEXT.index(b"event: content-end")]
    events = _decode(head + b'data: {"message": "internal server error"}\n\n', 9)
    assert events[-1].kind == ir.EVENT_ERROR
    assert events[-1].message == "internal server error"
    assert events[-1].error_kind == "api_error"
    # A failed generation: message-end with finish_reason ERROR and delta.error.
    failed = _decode(head + _frames({"type": "message-end", "delta": {
        "error": "generation failed", "finish_reason": "ERROR", "usage": {}}}), 9)
    assert [e.kind for e in failed][-2:] == [ir.BLOCK_DELTA, ir.EVENT_ERROR]
    assert failed[-1].message == "generation failed"
    # ERROR without a reason is a stop reason like any other.
    plain = _decode(head + _frames({"type": "message-end", "delta": {"finish_reason": "ERROR"}}), 9)
    assert [e.kind for e in plain][-3:] == [ir.BLOCK_STOP, ir.MESSAGE_DELTA, ir.MESSAGE_STOP]
    assert plain[-2].stop_reason == ir.ERROR
    # Cut before message-end: no invented ending (the engine reports the failure).
    cut = _decode(UPSTREAM_TEXT[:UPSTREAM_TEXT.index(b"event: message-end")], 13)
    assert ir.MESSAGE_STOP not in [e.kind for e in cut]
    # Nothing after [DONE] counts.
    again = _decode(UPSTREAM_TEXT + UPSTREAM_TEXT, 50)
    assert [e.kind for e in again].count(ir.MESSAGE_STOP) == 1


@pytest.mark.parametrize("data", [
    b"data: {not json}\n\n",
    b"data: [1,2]\n\n",
    b'data: {"no": "type"}\n\n',
    b"data: \xff\xfe\n\n",
])
def test_decode_garbage_raises_codec_error(data):
    with pytest.raises(ir.CodecError):
        dec = co.StreamDecoder()
        dec.feed(data)
        dec.close()


def test_decode_garbage_fuzz_only_codec_error():
    rng = random.Random(7)
    types = ["message-start", "content-start", "content-delta", "content-end", "tool-plan-delta",
             "tool-call-start", "tool-call-delta", "tool-call-end", "citation-start", "citation-end",
             "message-end", "debug"]
    for _ in range(1500):
        frames = b""
        for _ in range(rng.randrange(8)):
            p = {"type": rng.choice(types), "index": _garbage(rng), "delta": _garbage(rng)}
            if rng.random() < 0.5:
                p["delta"] = {"message": {"content": _garbage(rng), "tool_calls": _garbage(rng),
                                          "tool_plan": _garbage(rng), "citations": _garbage(rng)},
                              "finish_reason": _garbage(rng), "usage": _garbage(rng)}
            frames += b"data: " + orjson.dumps(p) + b"\n\n"
        if rng.random() < 0.3:
            frames += bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        dec = co.StreamDecoder()
        try:
            for i in range(0, len(frames), 13):
                dec.feed(frames[i:i + 13])
            dec.close()
        except ir.CodecError:
            pass


# ---------------------------------------------------------------------------------------------
# StreamEncoder


def _payloads(data):
    """(event, json) pairs of an encoder's output; the terminator as (None, '[DONE]')."""
    out = []
    for frame in data.decode().split("\n\n"):
        if not frame:
            continue
        event, payload = None, None
        for line in frame.split("\n"):
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                payload = line[6:]
        out.append((event, payload if payload == "[DONE]" else orjson.loads(payload)))
    return out


def test_encode_text_stream_shape():
    enc = co.StreamEncoder("3f1c0000-0000-4000-8000-000000000000", "command-a")
    frames = _payloads(enc.encode(_text_events(["Hel", "lo"], usage=ir.Usage(12, 7, cache_read_tokens=4))))
    assert [e for e, _ in frames] == ["message-start", "content-start", "content-delta", "content-delta",
                                      "content-end", "message-end", None]
    for event, payload in frames[:-1]:
        assert payload["type"] == event
    assert frames[0][1] == {"id": "3f1c0000-0000-4000-8000-000000000000", "type": "message-start", "delta": {
        "message": {"role": "assistant", "content": [], "tool_plan": "", "tool_calls": [], "citations": []}}}
    assert frames[1][1] == {"type": "content-start", "index": 0,
                            "delta": {"message": {"content": {"type": "text", "text": ""}}}}
    assert frames[2][1] == {"type": "content-delta", "index": 0, "delta": {"message": {"content": {"text": "Hel"}}}}
    assert frames[4][1] == {"type": "content-end", "index": 0}
    assert frames[5][1] == {"type": "message-end", "delta": {"finish_reason": "COMPLETE", "usage": {
        "billed_units": {"input_tokens": 12, "output_tokens": 7},
        "tokens": {"input_tokens": 12, "output_tokens": 7}, "cached_tokens": 4}}}
    assert frames[6] == (None, "[DONE]")
    assert enc.encode([ir.ev_message_stop()]) == b""


def test_encode_tool_stream_shape_and_input_backfill():
    enc = co.StreamEncoder("id", "m")
    events = _tool_events()
    events[8] = ir.ev_message_delta(ir.TOOL_USE_STOP, None, ir.Usage(0, 9, input_known=False))
    frames = _payloads(b"".join(enc.encode([e]) for e in events))
    assert [e for e, _ in frames] == ["message-start", "content-start", "content-delta", "content-end",
                                      "tool-call-start", "tool-call-delta", "tool-call-delta",
                                      "tool-call-end", "message-end", None]
    assert frames[4][1] == {"type": "tool-call-start", "index": 0, "delta": {"message": {"tool_calls": {
        "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}}}}
    assert frames[5][1] == {"type": "tool-call-delta", "index": 0, "delta": {"message": {"tool_calls": {
        "function": {"arguments": '{"city":'}}}}}
    assert frames[7][1] == {"type": "tool-call-end", "index": 0}
    end = frames[8][1]["delta"]
    assert end["finish_reason"] == "TOOL_CALL"
    # MESSAGE_DELTA did not know the input; MESSAGE_START's count fills it.
    assert end["usage"]["tokens"] == {"input_tokens": 30, "output_tokens": 9}


def test_encode_decode_round_trip():
    enc = co.StreamEncoder("id", "m")
    data = enc.encode(_tool_events())
    events = _decode(data, 6)
    assert [(e.kind, e.index, e.text) for e in events if e.kind == ir.BLOCK_DELTA] == [
        (ir.BLOCK_DELTA, 0, "I will check."), (ir.BLOCK_DELTA, 1, '{"city":'), (ir.BLOCK_DELTA, 1, ' "Paris"}')]
    assert events[0].id == "id"


def test_encode_error_frame():
    enc = co.StreamEncoder("id", "m")
    head = enc.encode(_text_events(["partial"])[:3])
    tail = enc.error("overloaded", "The upstream is overloaded.")
    assert tail.startswith(b"data: ") and b"event:" not in tail
    payload = orjson.loads(tail[6:])
    assert payload["message"] == "The upstream is overloaded."
    assert payload["type"] == "message-end"
    assert payload["delta"]["finish_reason"] == "ERROR"
    assert payload["delta"]["error"] == "The upstream is overloaded."
    assert enc.encode(_text_events(["more"])) == b""
    # Our own error frame, read back by our decoder, is an error again.
    assert _decode(head + tail, 5)[-1].kind == ir.EVENT_ERROR
    assert enc.error("api_error", "again") == b""
    assert b"content-delta" in head
    # An EV_ERROR event takes the same path.
    enc = co.StreamEncoder("id", "m")
    assert orjson.loads(enc.encode([ir.ev_error("api_error", "boom")])[6:])["message"] == "boom"


def test_encode_thinking_citation_and_unknown_blocks():
    enc = co.StreamEncoder("id", "m")
    delta = ir.ev_block_delta(1, ir.DELTA_CITATION, None)
    delta.data = {"start": 0, "end": 2, "text": "Hi", "sources": []}
    frames = _payloads(enc.encode([
        ir.ev_message_start("u", "m", ir.Usage(1, 0)),
        ir.ev_block_start(0, ir.Block(ir.THINKING)),
        ir.ev_block_delta(0, ir.DELTA_THINKING, "hmm"),
        ir.ev_block_delta(0, ir.DELTA_SIGNATURE, "sig"),
        ir.ev_block_stop(0),
        ir.ev_block_start(1, ir.text_block(None)),
        ir.ev_block_delta(1, ir.DELTA_TEXT, "Hi"),
        delta,
        ir.ev_block_stop(1),
        ir.ev_block_start(2, ir.Block(ir.THINKING, redacted=True, data="opaque")),
        ir.ev_block_stop(2),
        ir.ev_message_delta(ir.END_TURN, None, ir.Usage(1, 2)),
        ir.ev_message_stop(),
    ]))
    assert [e for e, _ in frames] == ["message-start", "content-start", "content-delta", "content-end",
                                      "content-start", "content-delta", "citation-start", "citation-end",
                                      "content-end", "message-end", None]
    assert frames[1][1]["delta"]["message"]["content"] == {"type": "thinking", "thinking": ""}
    assert frames[2][1]["delta"]["message"]["content"] == {"thinking": "hmm"}
    assert frames[4][1]["index"] == 1
    assert frames[6][1]["delta"]["message"]["citations"]["content_index"] == 1


# ---------------------------------------------------------------------------------------------
# the cohere SDK against our bytes, over loopback


class _Upstream:
    """A one-route loopback server answering every POST with the body it is given."""

    def __init__(self):
        self.body = b""
        self.content_type = "application/json"
        self.requests = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                outer.requests.append((self.path, self.rfile.read(int(self.headers.get("content-length", 0)))))
                self.send_response(200)
                self.send_header("content-type", outer.content_type)
                self.send_header("content-length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sdk():
    cohere = pytest.importorskip("cohere")
    upstream = _Upstream()
    client = cohere.ClientV2(api_key="test-key", base_url=upstream.url, timeout=10, max_retries=0)
    yield client, upstream
    upstream.close()


def test_sdk_chat_stream_text_and_tools(sdk):
    client, upstream = sdk
    enc = co.StreamEncoder("0e6e0000-0000-4000-8000-000000000000", "m")
    upstream.body = enc.encode(_tool_events()[:4]) + enc.encode(_tool_events()[4:])
    upstream.content_type = "text/event-stream"
    events = list(client.chat_stream(model="command-a", messages=[{"role": "user", "content": "hi"}]))
    path, sent = upstream.requests[0]
    assert path == "/v2/chat"
    assert orjson.loads(sent)["stream"] is True
    assert co.read_request(sent).stream is True
    types = [e.type for e in events]
    assert types == ["message-start", "content-start", "content-delta", "content-end", "tool-call-start",
                     "tool-call-delta", "tool-call-delta", "tool-call-end", "message-end"]
    assert events[0].id == "0e6e0000-0000-4000-8000-000000000000"
    assert "".join(e.delta.message.content.text for e in events if e.type == "content-delta") == "I will check."
    start = events[4].delta.message.tool_calls
    assert (start.id, start.function.name) == ("call_1", "get_weather")
    args = "".join(e.delta.message.tool_calls.function.arguments for e in events if e.type == "tool-call-delta")
    assert orjson.loads(args) == {"city": "Paris"}
    end = events[-1].delta
    assert end.finish_reason == "TOOL_CALL"
    assert end.usage.tokens.input_tokens == 30 and end.usage.tokens.output_tokens == 9


def test_sdk_chat_stream_error_reaches_caller(sdk):
    client, upstream = sdk
    enc = co.StreamEncoder("id", "m")
    upstream.body = enc.encode(_text_events(["partial"])[:3]) + enc.error("api_error", "upstream failed")
    upstream.content_type = "text/event-stream"
    events = list(client.chat_stream(model="command-a", messages=[{"role": "user", "content": "hi"}]))
    assert [e.type for e in events] == ["message-start", "content-start", "content-delta", "message-end"]
    assert events[-1].delta.finish_reason == "ERROR"
    assert events[-1].delta.error == "upstream failed"


def test_sdk_chat_buffered(sdk):
    client, upstream = sdk
    resp = ir.Response()
    resp.id = co.mint_id()
    resp.content = [ir.text_block("Checking."), ir.Block(ir.TOOL_USE, id="c1", name="f", input={"a": 1})]
    resp.stop_reason = ir.TOOL_USE_STOP
    resp.usage = ir.Usage(40, 8)
    upstream.body = co.write_response(resp)
    out = client.chat(model="command-a", messages=[{"role": "user", "content": "hi"}],
                      tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    assert orjson.loads(upstream.requests[0][1])["stream"] is False
    assert out.id == resp.id
    assert out.finish_reason == "TOOL_CALL"
    assert out.message.tool_plan == "Checking."
    assert out.message.tool_calls[0].function.name == "f"
    assert out.usage.tokens.input_tokens == 40


def test_sdk_request_bodies_read(sdk):
    """What the SDK really sends, read back: images, tool turns and documents."""
    client, upstream = sdk
    done = ir.Response()
    done.id = co.mint_id()
    upstream.body = co.write_response(done)
    client.chat(
        model="command-a",
        messages=[
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
            {"role": "assistant", "tool_plan": "plan", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "document", "document": {"data": {"k": "v"}}}]},
        ],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
        tool_choice="REQUIRED", stop_sequences=["x"], temperature=0.2, documents=["extra doc"])
    req = co.read_request(upstream.requests[0][1])
    assert [b.text for b in req.system] == ["sys"]
    assert req.messages[0].content[1].media_type == "image/png"
    assert [b.kind for b in req.messages[1].content] == [ir.TEXT, ir.TOOL_USE]
    assert req.messages[2].content[0].content[0].text == '{"k":"v"}'
    assert req.tool_choice == ir.TOOL_CHOICE_REQUIRED
    assert req.extra == {"documents": ["extra doc"]}


def test_foreign_citations_become_cohere_or_drop():
    enc = co.StreamEncoder("id", "m")
    anthropic = ir.ev_block_delta(0, ir.DELTA_CITATION, None)
    anthropic.data = {"type": "char_location", "cited_text": "grass is green", "document_index": 0,
                      "document_title": "Facts", "start_char_index": 0, "end_char_index": 14}
    bedrock = ir.ev_block_delta(0, ir.DELTA_CITATION, None)
    bedrock.data = {"title": "x", "sourceContent": [{"text": "y"}], "location": {}}
    frames = _payloads(enc.encode([ir.ev_message_start("u", "m", ir.Usage(1, 0)),
                                   ir.ev_block_start(0, ir.text_block(None)),
                                   ir.ev_block_delta(0, ir.DELTA_TEXT, "Grass is green."),
                                   anthropic, bedrock, ir.ev_block_stop(0)]))
    cites = [p["delta"]["message"]["citations"] for e, p in frames if e == "citation-start"]
    assert cites == [{"sources": [{"type": "document", "document": {"text": "grass is green", "title": "Facts"},
                                   "id": "doc:0"}],
                      "content_index": 0, "type": "TEXT_CONTENT", "text": "grass is green"}]

    resp = ir.Response()
    resp.id = "r"
    resp.content = [ir.text_block("See example.")]
    resp.content[0].citations = [
        {"type": "url_citation", "url_citation": {"start_index": 4, "end_index": 11,
                                                  "url": "https://example.com", "title": "Example"}},
        {"type": "something_else"}]
    parsed = _validate(co.write_response(resp))
    assert len(parsed.message.citations) == 1
    cite = parsed.message.citations[0]
    assert (cite.start, cite.end, cite.content_index) == (4, 11, 0)
    assert cite.sources[0].document == {"url": "https://example.com", "title": "Example"}


# The conversation field given as a string, a number, an object or null: a wrong type is reported
# as a wrong type (never as missing), in cohere's own words (jsonget's getters, the base Shape).
@pytest.mark.parametrize("value, message", [
    ('hi', "Invalid type for 'messages': expected an array."),
    (3, "Invalid type for 'messages': expected an array."),
    ({'role': 'user'}, "Invalid type for 'messages': expected an array."),
    (None, "Missing required parameter: 'messages'."),
])
def test_read_request_conversation_field_type(value, message):
    import orjson as _orjson
    from cbusbar import ir as _ir
    from cbusbar.proto import cohere as _codec
    body = {'model': 'x'}
    body['messages'] = value
    if message is None:
        _codec.read_request(_orjson.dumps(body))
        return
    with pytest.raises(_ir.CodecError) as e:
        _codec.read_request(_orjson.dumps(body))
    assert str(e.value) == message


def test_write_request_arguments_text_goes_back_as_it_came():
    """Issue #34 (7): arguments are text on Cohere's wire; text that was not JSON goes back as it
    came (not as a JSON string literal of itself), and the {"_raw_arguments": text} an object
    protocol's client sends back is that text again."""
    req = co.read_request(_req(messages=[
        {"role": "user", "content": "x"},
        {"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "not json"}}]},
    ]))
    req.messages[1].content.append(ir.Block(ir.TOOL_USE, id="d", name="f", input={"_raw_arguments": "[1,"}))
    calls = orjson.loads(co.write_request(req))["messages"][1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == ["not json", "[1,"]
