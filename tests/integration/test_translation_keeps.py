"""What a translation keeps, through the real server (issue #34 (7), docs/codecs.md "What a
translation keeps"): an OpenAI upstream (a hostile one written here, answering with the bodies of
the Rust gateway's translate goldens) refuses in a content part and calls a tool with arguments
that are not JSON; Anthropic SDK clients, buffered and streamed, get every word of it. And a
tool result in text parts reaches OpenAI as the client wrote it, with nothing put between them."""
import json

import anthropic
import httpx
import pytest

from tests.hostile import HostileUpstream, http_response

CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  h: {protocol: openai, base_url: "%s", api_key: {env: MOCK_KEY}}
models:
  refuses: {provider: h, upstream_model: refuses}
  breaks:  {provider: h, upstream_model: breaks}
"""

BASE = {"id": "chatcmpl-h", "created": 1752000000, "model": "gpt-4o-mini"}
USAGE = {"prompt_tokens": 7, "completion_tokens": 7, "total_tokens": 14}


def _buffered(message, finish):
    return json.dumps(dict(BASE, object="chat.completion", usage=USAGE, choices=[
        {"index": 0, "message": dict({"role": "assistant"}, **message), "finish_reason": finish}])).encode()


def _sse(*deltas, finish):
    def frame(delta, finish_reason=None):
        return b"data: " + json.dumps(dict(BASE, object="chat.completion.chunk", choices=[
            {"index": 0, "delta": delta, "finish_reason": finish_reason}])).encode() + b"\n\n"
    out = frame({"role": "assistant", "content": ""})
    out += b"".join(frame(d) for d in deltas) + frame({}, finish)
    out += b"data: " + json.dumps(dict(BASE, object="chat.completion.chunk", choices=[],
                                       usage=USAGE)).encode() + b"\n\n"
    return out + b"data: [DONE]\n\n"


def _refuses(c, req):
    if req.json().get("stream"):
        body = _sse({"content": "part one "}, {"content": "part two"},
                    {"refusal": "no "}, {"refusal": "thanks"}, finish="stop")
        c.sendall(http_response(200, body, "text/event-stream"))
    else:   # resp_o2a_multipart
        c.sendall(http_response(200, _buffered({"content": [
            {"type": "text", "text": "part one "}, {"type": "text", "text": "part two"},
            {"type": "refusal", "refusal": "no thanks"}]}, "length")))


def _call(index, id=None, name=None, args=""):
    call = {"index": index, "function": {"arguments": args}}
    if id:
        call.update(id=id, type="function")
        call["function"]["name"] = name
    return {"tool_calls": [call]}


def _breaks(c, req):
    if req.json().get("stream"):
        body = _sse(_call(0, "call_XYZ", "get_weather"), _call(0, args='{"city":'), _call(0, args='"Paris"}'),
                    _call(1, "call_ZZZ", "get_time"), _call(1, args="not "), _call(1, args="json"),
                    _call(2, "call_AAA", "get_tide"), _call(2, args='{"port": "Brest", '),
                    _call(2, args="'tz': True}"), finish="tool_calls")
        c.sendall(http_response(200, body, "text/event-stream"))
    else:   # resp_o2a_tool_calls
        c.sendall(http_response(200, _buffered({"content": None, "tool_calls": [
            {"id": "call_XYZ", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "call_ZZZ", "type": "function",
             "function": {"name": "get_time", "arguments": "not json"}}]}, "tool_calls")))


@pytest.fixture(scope="module")
def upstream():
    up = HostileUpstream({"refuses": _refuses, "breaks": _breaks})
    yield up
    up.close()


@pytest.fixture
def client(upstream, gateway_factory):
    gw = gateway_factory(CONFIG % upstream.url)
    with anthropic.Anthropic(api_key="k", base_url=gw.url, max_retries=0) as c:
        yield c


ASK = [{"role": "user", "content": "hi"}]


def test_a_refusal_part_reaches_the_anthropic_client(client):
    msg = client.messages.create(model="refuses", max_tokens=64, messages=ASK)
    assert [(b.type, b.text) for b in msg.content] == [
        ("text", "part one "), ("text", "part two"), ("text", "no thanks")]   # the Rust golden
    assert msg.stop_reason == "max_tokens"
    with client.messages.stream(model="refuses", max_tokens=64, messages=ASK) as s:
        final = s.get_final_message()
    assert [b.text for b in final.content] == ["part one part two", "no thanks"]
    assert final.stop_reason == "refusal"


def test_arguments_that_are_not_json_reach_the_anthropic_client(client):
    msg = client.messages.create(model="breaks", max_tokens=64, messages=ASK)
    assert [(b.name, b.input) for b in msg.content] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"_raw_arguments": "not json"})]
    # Streamed, through the SDK's own accumulator (it parses the joined fragments as JSON).
    with client.messages.stream(model="breaks", max_tokens=64, messages=ASK) as s:
        final = s.get_final_message()
    assert [(b.name, b.input) for b in final.content] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"_raw_arguments": "not json"}),
        ("get_tide", {"port": "Brest", "_raw_arguments": "{\"port\": \"Brest\", 'tz': True}"})]
    assert final.stop_reason == "tool_use"


def test_tool_result_parts_and_raw_arguments_reach_openai_as_written(client, upstream):
    client.messages.create(model="refuses", max_tokens=64, messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_01AAA", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_01BBB", "name": "get_time",
             "input": {"_raw_arguments": "not json"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01AAA",
             "content": [{"type": "text", "text": "18C "}, {"type": "text", "text": "sunny"}]},
            {"type": "tool_result", "tool_use_id": "toolu_01BBB", "content": "noon"}]}])
    sent = upstream.requests[-1].json()["messages"]
    assert sent[2] == {"role": "tool", "tool_call_id": "toolu_01AAA", "content": "18C sunny"}
    # the object an earlier answer gave this client for "not json" goes back as that text
    assert [c["function"]["arguments"] for c in sent[1]["tool_calls"]] == ['{"city":"Paris"}', "not json"]


def test_a_gemini_client_gets_the_arguments_text_too(upstream, gateway_factory):
    gw = gateway_factory(CONFIG % upstream.url)
    ask = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    r = httpx.post(gw.url + "/v1beta/models/breaks:generateContent", json=ask, timeout=10)
    parts = r.json()["candidates"][0]["content"]["parts"]
    assert [p["functionCall"]["args"] for p in parts] == [{"city": "Paris"}, {"_raw_arguments": "not json"}]
    r = httpx.post(gw.url + "/v1beta/models/breaks:streamGenerateContent?alt=sse", json=ask, timeout=10)
    calls = [p["functionCall"] for line in r.text.splitlines() if line.startswith("data: ")
             for c in json.loads(line[6:]).get("candidates", [])
             for p in c["content"]["parts"] if "functionCall" in p]
    assert [c["args"] for c in calls] == [
        {"city": "Paris"}, {"_raw_arguments": "not json"},
        {"_raw_arguments": "{\"port\": \"Brest\", 'tz': True}"}]
