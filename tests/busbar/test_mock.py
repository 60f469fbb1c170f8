"""The mock provider, driven by each official SDK and by raw sockets.

The mock runs on its own event loop in a background thread (the SDK calls are blocking); a
watchdog stops that loop by itself if the test process forgets to.
"""

import asyncio
import base64
import json
import socket
import threading
import time

import httptools
import pytest
import uvloop

from busbar.mock import start

WATCHDOG_S = 300
TIMEOUT_S = 10
FILLER = " ".join("w%d" % i for i in range(1, 9))


class MockThread:
    def __init__(self, require_auth=False):
        self.require_auth = require_auth
        self.loop = uvloop.new_event_loop()
        self.port = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(TIMEOUT_S), "mock did not start"

    def _run(self):
        asyncio.set_event_loop(self.loop)
        server, self.port = self.loop.run_until_complete(start(require_auth=self.require_auth))
        self._ready.set()
        self.loop.call_later(WATCHDOG_S, self.loop.stop)
        try:
            self.loop.run_forever()
        finally:
            server.close()
            self.loop.run_until_complete(asyncio.sleep(0))
            self.loop.close()

    def stop(self):
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(TIMEOUT_S)

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port


@pytest.fixture(scope="module")
def mock():
    m = MockThread()
    yield m
    m.stop()


@pytest.fixture(scope="module")
def mock_auth():
    m = MockThread(require_auth=True)
    yield m
    m.stop()


# -- raw HTTP helpers --------------------------------------------------------------------------

class _Responses:
    """Collects complete HTTP responses from a byte stream (httptools' response parser)."""

    def __init__(self):
        self.parser = httptools.HttpResponseParser(self)
        self.done = []
        self._headers = {}
        self._body = []

    def on_header(self, name, value):
        self._headers[name.decode().lower()] = value.decode()

    def on_body(self, body):
        self._body.append(body)

    def on_message_complete(self):
        self.done.append((self.parser.get_status_code(), self._headers, b"".join(self._body)))
        self._headers = {}
        self._body = []


def _request(path, body=b"", headers=(), method="POST"):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    lines = ["%s %s HTTP/1.1" % (method, path), "host: mock", "content-length: %d" % len(body)]
    lines += ["%s: %s" % h for h in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _exchange(port, raw, count=1, sock=None):
    """Send raw bytes, read `count` responses; returns (responses, socket, closed by peer)."""
    s = sock or socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S)
    s.sendall(raw)
    col = _Responses()
    closed = False
    while len(col.done) < count:
        data = s.recv(65536)
        if not data:
            closed = True
            break
        col.parser.feed_data(data)
    return col.done, s, closed


def _post(port, path, body, headers=()):
    (resp,), s, _ = _exchange(port, _request(path, body, headers))
    s.close()
    status, hdrs, data = resp
    return status, hdrs, data


def _split_chunks(data):
    """The chunks of a chunked body, as far as it goes (a zero-length chunk ends it)."""
    chunks = []
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line, 16)
        chunks.append(rest[:size])
        assert rest[size:size + 2] == b"\r\n"
        data = rest[size + 2:]
        if size == 0:
            break
    return chunks


def _words(n):
    return " ".join("w%d" % i for i in range(1, n + 1))


WEATHER_TOOL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                                        "unit": {"type": "string"}},
                       "required": ["city"]}

TINY_PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000" "1f15c4890000000d49444154789c6360000002"
    "000154a24f5d0000000049454e44ae426082")).decode()


# -- OpenAI Chat -------------------------------------------------------------------------------

def _openai(mock, **kw):
    import openai
    return openai.OpenAI(api_key="k", base_url=mock.url + "/v1", max_retries=0, timeout=TIMEOUT_S, **kw)


def test_openai_chat_create(mock):
    r = _openai(mock).chat.completions.create(
        model="gpt-x", messages=[{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": "hello   world"}])
    assert r.model == "gpt-x"
    assert r.id.startswith("chatcmpl-")
    assert r.choices[0].message.content == "mock: hello world [system: be brief] " + FILLER
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == 6 + 8
    assert r.usage.prompt_tokens >= 1
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens == 0


def test_openai_chat_stream_with_usage(mock):
    stream = _openai(mock).chat.completions.create(
        model="gpt-x", stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": [{"type": "text", "text": "look"},
                                               {"type": "image_url", "image_url": {
                                                   "url": "data:image/png;base64," + TINY_PNG}}]}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "mock: look [images: 1] " + FILLER
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4 + 8


def test_openai_chat_stream_tool_call(mock):
    stream = _openai(mock).chat.completions.create(
        model="gpt-x", stream=True, tool_choice="required",
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_TOOL_SCHEMA}},
               {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}],
        messages=[{"role": "user", "content": "weather?"}])
    fragments, ids, names, finish = [], [], [], None
    for c in stream:
        ch = c.choices[0]
        for tc in ch.delta.tool_calls or ():
            if tc.id:
                ids.append(tc.id)
            if tc.function.name:
                names.append(tc.function.name)
            if tc.function.arguments:
                fragments.append(tc.function.arguments)
        finish = ch.finish_reason or finish
    assert len(fragments) >= 2
    assert json.loads("".join(fragments)) == {"city": "mock"}
    assert names == ["get_weather"] and ids[0].startswith("call_")
    assert finish == "tool_calls"


def test_openai_chat_named_tool_and_tool_result(mock):
    client = _openai(mock)
    r = client.chat.completions.create(
        model="gpt-x", tool_choice={"type": "function", "function": {"name": "other"}},
        tools=[{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_TOOL_SCHEMA}},
               {"type": "function", "function": {"name": "other", "parameters": {"type": "object"}}}],
        messages=[{"role": "user", "content": "go"}])
    call = r.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("other", {"input": "mock"})
    r2 = client.chat.completions.create(model="gpt-x", messages=[
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "other", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "it is sunny"}])
    assert r2.choices[0].message.content == "mock: go [tool_result: it is sunny] " + FILLER


def test_openai_chat_max_tokens(mock):
    r = _openai(mock).chat.completions.create(model="gpt-x", max_completion_tokens=3,
                                              messages=[{"role": "user", "content": "hello world"}])
    assert r.choices[0].message.content == "mock: hello world"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 3


# -- OpenAI Responses --------------------------------------------------------------------------

def test_responses_create(mock):
    r = _openai(mock).responses.create(model="gpt-r", instructions="sys prompt", input="hi there")
    assert r.id.startswith("resp_") and r.status == "completed"
    assert r.output_text == "mock: hi there [system: sys prompt] " + FILLER
    assert r.usage.output_tokens == 6 + 8
    assert r.usage.input_tokens_details.cached_tokens == 0


def test_responses_stream_helper(mock):
    with _openai(mock).responses.stream(model="gpt-r", input=[
            {"role": "user", "content": [{"type": "input_text", "text": "stream me"}]}]) as s:
        events = [e.type for e in s]
        final = s.get_final_response()
    assert final.output_text == "mock: stream me " + FILLER
    assert events[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                          "response.content_part.added"]
    assert events.count("response.output_text.delta") == 3 + 8
    assert events[-1] == "response.completed"


def test_responses_stream_tool_call(mock):
    tools = [{"type": "function", "name": "get_weather", "parameters": WEATHER_TOOL_SCHEMA}]
    events = list(_openai(mock).responses.create(model="gpt-r", input="weather?", tools=tools,
                                                 tool_choice="required", stream=True))
    seq = [e.sequence_number for e in events]
    assert seq == list(range(len(events)))
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) >= 2 and json.loads("".join(deltas)) == {"city": "mock"}
    final = events[-1]
    assert final.type == "response.completed"
    item = final.response.output[0]
    assert item.type == "function_call" and item.name == "get_weather" and item.call_id.startswith("call_")
    with _openai(mock).responses.stream(model="gpt-r", input="weather?", tools=tools,
                                        tool_choice="required") as s:
        for _ in s:
            pass
        assert s.get_final_response().output[0].arguments == '{"city":"mock"}'


def test_responses_max_output_tokens(mock):
    r = _openai(mock).responses.create(model="gpt-r", input="one two three", max_output_tokens=2)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == "mock: one"


# -- Anthropic ---------------------------------------------------------------------------------

def _anthropic(mock, **kw):
    import anthropic
    return anthropic.Anthropic(api_key="k", base_url=mock.url, max_retries=0, timeout=TIMEOUT_S, **kw)


def test_anthropic_create(mock):
    r = _anthropic(mock).messages.create(
        model="claude-x", max_tokens=100, system=[{"type": "text", "text": "be terse"}],
        messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": TINY_PNG}},
            {"type": "text", "text": "what is this"}]}])
    assert r.id.startswith("msg_01") and r.model == "claude-x"
    assert r.content[0].text == "mock: what is this [system: be terse] [images: 1] " + FILLER
    assert r.stop_reason == "end_turn"
    assert r.usage.output_tokens == 9 + 8 and r.usage.cache_read_input_tokens == 0


def test_anthropic_stream_text(mock):
    with _anthropic(mock).messages.stream(model="claude-x", max_tokens=100,
                                          messages=[{"role": "user", "content": "hey"}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == "mock: hey " + FILLER
    # message_delta carries running totals: the SDK must end with exactly the words sent.
    assert final.usage.output_tokens == 2 + 8
    assert final.stop_reason == "end_turn"


def test_anthropic_stream_tool_use_and_result(mock):
    client = _anthropic(mock)
    tools = [{"name": "get_weather", "description": "w", "input_schema": WEATHER_TOOL_SCHEMA}]
    with client.messages.stream(model="claude-x", max_tokens=100, tools=tools,
                                tool_choice={"type": "tool", "name": "get_weather"},
                                messages=[{"role": "user", "content": "weather?"}]) as s:
        partial = [e for e in s if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        final = s.get_final_message()
    assert len(partial) >= 2
    block = final.content[0]
    assert block.type == "tool_use" and block.id.startswith("toolu_")
    assert block.input == {"city": "mock"} and final.stop_reason == "tool_use"
    r = client.messages.create(model="claude-x", max_tokens=100, messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": block.id, "name": "get_weather",
                                           "input": block.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id,
                                      "content": [{"type": "text", "text": "rain"}]}]}])
    assert r.content[0].text == "mock: weather? [tool_result: rain] " + FILLER


def test_anthropic_max_tokens(mock):
    r = _anthropic(mock).messages.create(model="claude-x", max_tokens=2,
                                         messages=[{"role": "user", "content": "cut me"}])
    assert r.content[0].text == "mock: cut" and r.stop_reason == "max_tokens"


def test_anthropic_requires_max_tokens(mock):
    status, headers, body = _post(mock.port, "/v1/messages",
                                  {"model": "c", "messages": [{"role": "user", "content": "x"}]})
    assert status == 400 and headers["request-id"].startswith("req_")
    doc = json.loads(body)
    assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
    assert doc["request_id"] == headers["request-id"]


# -- Gemini ------------------------------------------------------------------------------------

def _genai(mock):
    from google import genai
    from google.genai import types
    return genai.Client(api_key="k", http_options=types.HttpOptions(
        base_url=mock.url, api_version="v1beta", timeout=TIMEOUT_S * 1000)), types


def test_gemini_generate_content(mock):
    client, types = _genai(mock)
    r = client.models.generate_content(model="gemini-x", contents="hello gemini",
                                       config=types.GenerateContentConfig(system_instruction="sys"))
    assert r.text == "mock: hello gemini [system: sys] " + FILLER
    assert r.candidates[0].finish_reason == types.FinishReason.STOP
    assert r.usage_metadata.candidates_token_count == 5 + 8
    assert r.usage_metadata.total_token_count == r.usage_metadata.prompt_token_count + 13
    assert r.model_version == "gemini-x"


def test_gemini_stream(mock):
    client, types = _genai(mock)
    chunks = list(client.models.generate_content_stream(model="gemini-x", contents="stream it"))
    assert "".join(c.text for c in chunks) == "mock: stream it " + FILLER
    assert len(chunks) == 3 + 8
    assert chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert chunks[-1].usage_metadata.candidates_token_count == 11


def test_gemini_forced_tool_and_function_response(mock):
    client, types = _genai(mock)
    decl = types.FunctionDeclaration(name="get_weather", description="w", parameters_json_schema=WEATHER_TOOL_SCHEMA)
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[decl])],
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(mode="ANY")),
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    chunks = list(client.models.generate_content_stream(model="gemini-x", contents="weather?", config=config))
    calls = [fc for c in chunks for fc in (c.function_calls or ())]
    assert [(fc.name, fc.args) for fc in calls] == [("get_weather", {"city": "mock"})]
    r = client.models.generate_content(model="gemini-x", contents=[
        types.Content(role="user", parts=[types.Part(text="weather?")]),
        types.Content(role="model", parts=[types.Part(function_call=types.FunctionCall(
            name="get_weather", args={"city": "mock"}))]),
        types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
            name="get_weather", response={"output": "cloudy"}))])])
    assert r.text == "mock: weather? [tool_result: cloudy] " + FILLER


def test_gemini_max_tokens(mock):
    client, types = _genai(mock)
    r = client.models.generate_content(model="gemini-x", contents="a b c",
                                       config=types.GenerateContentConfig(max_output_tokens=2))
    assert r.text == "mock: a" and r.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS


def test_gemini_json_array_stream_and_v1_path(mock):
    body = {"contents": [{"role": "user", "parts": [{"text": "arr"}]}]}
    status, headers, data = _post(mock.port, "/v1/models/g%2Dx:streamGenerateContent", body,
                                  [("x-mock-tokens", "2")])
    assert status == 200 and headers["content-type"] == "application/json"
    items = json.loads(data)
    assert "".join(i["candidates"][0]["content"]["parts"][0]["text"] for i in items) == "mock: arr w1 w2"
    assert items[0]["modelVersion"] == "g-x"
    status, _, _ = _post(mock.port, "/v1beta/models/g:countTokens", body)
    assert status == 404


# -- Cohere ------------------------------------------------------------------------------------

def _cohere(mock):
    import cohere
    return cohere.ClientV2(api_key="k", base_url=mock.url, timeout=TIMEOUT_S)


def test_cohere_chat(mock):
    r = _cohere(mock).chat(model="command-x", messages=[{"role": "system", "content": "sys"},
                                                        {"role": "user", "content": "hola"}])
    assert r.message.content[0].text == "mock: hola [system: sys] " + FILLER
    assert r.finish_reason == "COMPLETE"
    assert r.usage.billed_units.output_tokens == 4 + 8 and r.usage.tokens.input_tokens >= 1


def test_cohere_chat_stream(mock):
    events = list(_cohere(mock).chat_stream(model="command-x", messages=[{"role": "user", "content": "yo"}]))
    text = "".join(e.delta.message.content.text for e in events if e.type == "content-delta")
    assert text == "mock: yo " + FILLER
    assert events[0].type == "message-start" and events[-1].type == "message-end"
    assert events[0].id == events[-1].id
    assert events[-1].delta.finish_reason == "COMPLETE"
    assert events[-1].delta.usage.billed_units.output_tokens == 10


def test_cohere_stream_tool_call(mock):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_TOOL_SCHEMA}}]
    events = list(_cohere(mock).chat_stream(model="command-x", tools=tools, tool_choice="REQUIRED",
                                            messages=[{"role": "user", "content": "weather?"}]))
    types_ = [e.type for e in events]
    assert "tool-plan-delta" in types_ and "tool-call-start" in types_ and "tool-call-end" in types_
    start_ev = next(e for e in events if e.type == "tool-call-start")
    assert start_ev.delta.message.tool_calls.function.name == "get_weather"
    args = "".join(e.delta.message.tool_calls.function.arguments for e in events if e.type == "tool-call-delta")
    assert types_.count("tool-call-delta") >= 2 and json.loads(args) == {"city": "mock"}
    assert events[-1].delta.finish_reason == "TOOL_CALL"


# -- Bedrock -----------------------------------------------------------------------------------

def _bedrock(mock):
    import boto3
    from botocore.config import Config
    return boto3.client("bedrock-runtime", endpoint_url=mock.url, region_name="us-east-1",
                        aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret",
                        config=Config(retries={"max_attempts": 1}, read_timeout=TIMEOUT_S,
                                      connect_timeout=TIMEOUT_S))


MODEL_ID = "us.anthropic.claude-x-v1:0"


def test_bedrock_converse(mock):
    r = _bedrock(mock).converse(modelId=MODEL_ID, system=[{"text": "sys"}],
                                messages=[{"role": "user", "content": [{"text": "hallo"}]}])
    assert r["output"]["message"]["content"][0]["text"] == "mock: hallo [system: sys] " + FILLER
    assert r["stopReason"] == "end_turn"
    assert r["usage"]["outputTokens"] == 4 + 8 and r["usage"]["cacheReadInputTokens"] == 0
    assert r["ResponseMetadata"]["RequestId"]


def test_bedrock_converse_stream(mock):
    r = _bedrock(mock).converse_stream(modelId=MODEL_ID, inferenceConfig={"maxTokens": 4},
                                       messages=[{"role": "user", "content": [{"text": "a b c d e"}]}])
    events = list(r["stream"])
    text = "".join(e["contentBlockDelta"]["delta"]["text"] for e in events if "contentBlockDelta" in e)
    assert text == "mock: a b c"
    assert next(e for e in events if "messageStop" in e)["messageStop"]["stopReason"] == "max_tokens"
    assert events[-1]["metadata"]["usage"]["outputTokens"] == 4


def test_bedrock_tool_use(mock):
    tool_config = {"tools": [{"toolSpec": {"name": "get_weather", "inputSchema": {"json": WEATHER_TOOL_SCHEMA}}}],
                   "toolChoice": {"any": {}}}
    client = _bedrock(mock)
    events = list(client.converse_stream(modelId=MODEL_ID, toolConfig=tool_config, messages=[
        {"role": "user", "content": [{"text": "weather?"}]}])["stream"])
    start_ev = next(e for e in events if "contentBlockStart" in e)["contentBlockStart"]["start"]["toolUse"]
    assert start_ev["name"] == "get_weather" and start_ev["toolUseId"].startswith("tooluse_")
    frags = [e["contentBlockDelta"]["delta"]["toolUse"]["input"] for e in events if "contentBlockDelta" in e]
    assert len(frags) >= 2 and json.loads("".join(frags)) == {"city": "mock"}
    assert next(e for e in events if "messageStop" in e)["messageStop"]["stopReason"] == "tool_use"
    r = client.converse(modelId=MODEL_ID, toolConfig=tool_config, messages=[
        {"role": "user", "content": [{"text": "weather?"}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": start_ev["toolUseId"],
                                                       "name": "get_weather", "input": {"city": "x"}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": start_ev["toolUseId"],
                                                     "content": [{"text": "hot"}]}}]}])
    # toolChoice still forces a call; the directive-free tool_result echo is checked without it.
    assert r["output"]["message"]["content"][0]["toolUse"]["input"] == {"city": "mock"}
    del tool_config["toolChoice"]
    r = client.converse(modelId=MODEL_ID, toolConfig=tool_config, messages=[
        {"role": "user", "content": [{"text": "weather?"}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": start_ev["toolUseId"],
                                                       "name": "get_weather", "input": {"city": "x"}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": start_ev["toolUseId"],
                                                     "content": [{"text": "hot"}]}}]}])
    assert r["output"]["message"]["content"][0]["text"] == "mock: weather? [tool_result: hot] " + FILLER


def test_bedrock_rejects_shim_keys(mock):
    status, headers, body = _post(mock.port, "/model/m/converse",
                                  {"model": "m", "messages": [{"role": "user", "content": [{"text": "x"}]}]})
    assert status == 400 and headers["x-amzn-errortype"] == "ValidationException"
    assert json.loads(body)["__type"] == "ValidationException"


# -- failure switches --------------------------------------------------------------------------

def test_status_directive_in_each_envelope(mock):
    import openai
    import anthropic
    import botocore.exceptions
    from google.genai import errors as genai_errors
    import cohere

    with pytest.raises(openai.InternalServerError) as e:
        _openai(mock).chat.completions.create(model="m", messages=[{"role": "user", "content": "#mock:status=503"}])
    assert e.value.status_code == 503 and e.value.body["message"] == "mock failure 503"
    with pytest.raises(openai.RateLimitError):
        _openai(mock).responses.create(model="m", input="x", extra_headers={"x-mock-status": "429"})
    with pytest.raises(anthropic.OverloadedError) as e:
        _anthropic(mock).messages.create(model="m", max_tokens=5,
                                         messages=[{"role": "user", "content": "#mock:status=529"}])
    assert e.value.body["error"] == {"type": "overloaded_error", "message": "mock failure 529"}
    client, _ = _genai(mock)
    with pytest.raises(genai_errors.ClientError) as e:
        client.models.generate_content(model="g", contents="#mock:status=404")
    assert e.value.code == 404 and e.value.status == "NOT_FOUND" and e.value.message == "mock failure 404"
    with pytest.raises(cohere.core.api_error.ApiError) as e:
        _cohere(mock).chat(model="c", messages=[{"role": "user", "content": "#mock:status=500"}])
    assert e.value.status_code == 500 and e.value.body == {"id": e.value.body["id"], "message": "mock failure 500"}
    br = _bedrock(mock)
    with pytest.raises(br.exceptions.ThrottlingException) as e:
        br.converse(modelId=MODEL_ID, messages=[{"role": "user", "content": [{"text": "#mock:status=429"}]}])
    assert e.value.response["Error"]["Message"] == "mock failure 429"
    with pytest.raises(botocore.exceptions.ClientError):
        br.converse_stream(modelId=MODEL_ID, messages=[{"role": "user", "content": [{"text": "#mock:status=500"}]}])


def test_delay_directive(mock):
    t0 = time.monotonic()
    status, _, _ = _post(mock.port, "/v2/chat", {"model": "c", "messages": [{"role": "user", "content": "x"}]},
                         [("x-mock-delay-ms", "300")])
    assert status == 200 and time.monotonic() - t0 >= 0.3


def test_abort_after_openai_stream(mock):
    import httpx
    import openai
    got = []
    with pytest.raises((httpx.HTTPError, openai.APIError)):
        for c in _openai(mock).chat.completions.create(
                model="m", stream=True, messages=[{"role": "user", "content": "#mock:abort_after=2"}]):
            got.append(c)
    assert len(got) == 2


def test_abort_after_raw(mock):
    for path, body in [("/v1/messages", {"model": "c", "max_tokens": 50, "stream": True,
                                         "messages": [{"role": "user", "content": "x"}]}),
                       ("/model/m/converse-stream", {"messages": [{"role": "user", "content": [{"text": "x"}]}]})]:
        s = socket.create_connection(("127.0.0.1", mock.port), timeout=TIMEOUT_S)
        s.sendall(_request(path, body, [("x-mock-abort-after", "3")]))
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        head, _, chunked = data.partition(b"\r\n\r\n")
        assert b"200 OK" in head and b"transfer-encoding: chunked" in head
        chunks = _split_chunks(chunked)
        assert len(chunks) == 3 and b"" not in chunks     # three frames, never the last-chunk
    # A buffered request loses its connection before any byte.
    s = socket.create_connection(("127.0.0.1", mock.port), timeout=TIMEOUT_S)
    s.sendall(_request("/v2/chat", {"model": "c", "messages": [{"role": "user", "content": "x"}]},
                       [("x-mock-abort-after", "0")]))
    assert s.recv(100) == b""
    s.close()


def test_stream_error_in_band(mock):
    import openai
    import anthropic
    import botocore.exceptions
    from google.genai import errors as genai_errors
    with pytest.raises(openai.APIError, match="mock failure stream_error"):
        list(_openai(mock).chat.completions.create(
            model="m", stream=True, messages=[{"role": "user", "content": "#mock:stream_error=1"}]))
    events = list(_openai(mock).responses.create(model="m", input="#mock:stream_error=1", stream=True))
    assert [e.type for e in events] == ["response.created", "response.failed"]
    assert events[-1].response.error.message == "mock failure stream_error"
    with pytest.raises(anthropic.APIStatusError, match="mock failure stream_error"):
        with _anthropic(mock).messages.stream(model="m", max_tokens=50,
                                              messages=[{"role": "user", "content": "#mock:stream_error=1"}]) as s:
            list(s)
    client, _ = _genai(mock)
    with pytest.raises(genai_errors.APIError):
        list(client.models.generate_content_stream(model="g", contents="#mock:stream_error=1"))
    events = list(_cohere(mock).chat_stream(model="c", messages=[{"role": "user", "content": "#mock:stream_error=1"}]))
    assert [e.type for e in events] == ["message-start", "message-end"]
    assert events[-1].delta.finish_reason == "ERROR" and events[-1].delta.error == "mock failure stream_error"
    with pytest.raises(botocore.exceptions.EventStreamError, match="modelStreamErrorException"):
        list(_bedrock(mock).converse_stream(modelId=MODEL_ID, messages=[
            {"role": "user", "content": [{"text": "#mock:stream_error=1"}]}])["stream"])


def test_tokens_directive_and_cap(mock):
    status, _, body = _post(mock.port, "/v1/chat/completions",
                            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
                            [("x-mock-tokens", "300")])
    assert json.loads(body)["choices"][0]["message"]["content"] == "mock: x " + _words(300)
    status, _, body = _post(mock.port, "/v1/chat/completions",
                            {"model": "m", "messages": [{"role": "user", "content": "x #mock:tokens=999999"}]})
    assert json.loads(body)["usage"]["completion_tokens"] == 3 + 100000


def test_tool_directive(mock):
    r = _openai(mock).chat.completions.create(
        model="m", tools=[{"type": "function", "function": {"name": "a", "parameters": {}}},
                          {"type": "function", "function": {"name": "b", "parameters": WEATHER_TOOL_SCHEMA}}],
        messages=[{"role": "user", "content": "#mock:tool=b"}])
    assert r.choices[0].message.tool_calls[0].function.name == "b"
    r = _openai(mock).chat.completions.create(model="m", messages=[{"role": "user", "content": "#mock:tool=1"}])
    assert r.choices[0].message.content.startswith("mock: #mock:tool=1")   # no tools: plain text


def test_malformed_json_native_envelopes(mock):
    cases = {"/v1/chat/completions": lambda d: d["error"]["type"] == "invalid_request_error",
             "/v1/responses": lambda d: d["error"]["message"].startswith("We could not parse"),
             "/v1/messages": lambda d: d["type"] == "error" and d["error"]["type"] == "invalid_request_error",
             "/v1beta/models/g:generateContent": lambda d: d["error"]["status"] == "INVALID_ARGUMENT",
             "/v2/chat": lambda d: "message" in d,
             "/model/m/converse": lambda d: d["__type"] == "ValidationException"}
    for path, check in cases.items():
        status, _, body = _post(mock.port, path, b"{not json")
        assert status == 400, path
        assert check(json.loads(body)), (path, body)


def _closed_by_peer(s):
    """The peer closed: EOF, or a reset when it closed with our bytes still unread (both end the
    connection; which one the client sees is a race between the two sockets)."""
    try:
        return s.recv(10) == b""
    except ConnectionResetError:
        return True


def test_body_too_large(mock):
    s = socket.create_connection(("127.0.0.1", mock.port), timeout=TIMEOUT_S)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: m\r\ncontent-length: %d\r\n\r\n" % (64 * 1024 * 1024 + 1))
    (resp,), s, _ = _exchange(mock.port, b"{", sock=s)
    assert resp[0] == 413 and json.loads(resp[2])["error"]["type"] == "request_too_large"
    assert resp[1]["connection"] == "close"
    assert _closed_by_peer(s)
    s.close()


def test_healthz_and_unknown(mock):
    (resp,), s, _ = _exchange(mock.port, _request("/healthz", method="GET"))
    s.close()
    assert resp[0] == 200 and resp[2] == b"ok"
    status, _, body = _post(mock.port, "/v9/nothing", {})
    assert status == 404 and "error" in json.loads(body)


# -- HTTP/1.1 connection behaviour -------------------------------------------------------------

def test_keep_alive(mock):
    body = {"model": "m", "messages": [{"role": "user", "content": "one"}]}
    (r1,), s, _ = _exchange(mock.port, _request("/v1/chat/completions", body))
    body["messages"][0]["content"] = "two"
    body["stream"] = True
    (r2,), s, closed = _exchange(mock.port, _request("/v1/chat/completions", body), sock=s)
    body["stream"] = False
    body["messages"][0]["content"] = "three"
    (r3,), s, closed = _exchange(mock.port, _request("/v1/chat/completions", body), sock=s)
    s.close()
    assert not closed
    assert json.loads(r1[2])["choices"][0]["message"]["content"].startswith("mock: one ")
    assert b'"content":" two"' in r2[2] and r2[2].endswith(b"data: [DONE]\n\n")
    assert json.loads(r3[2])["choices"][0]["message"]["content"].startswith("mock: three ")


def test_pipelining_answers_in_order(mock):
    def req(word, headers=()):
        return _request("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": word}]},
                        headers)
    # The first is delayed and the second streamed: both must still come back in request order.
    stream_req = _request("/v1/messages", {"model": "c", "max_tokens": 50, "stream": True,
                                           "messages": [{"role": "user", "content": "second"}]})
    raw = req("first", [("x-mock-delay-ms", "150")]) + stream_req + req("third")
    responses, s, _ = _exchange(mock.port, raw, count=3)
    s.close()
    assert [r[0] for r in responses] == [200, 200, 200]
    assert json.loads(responses[0][2])["choices"][0]["message"]["content"].startswith("mock: first ")
    assert b'"text":" second"' in responses[1][2] and responses[1][1]["content-type"] == "text/event-stream"
    assert json.loads(responses[2][2])["choices"][0]["message"]["content"].startswith("mock: third ")


def test_connection_close_honoured(mock):
    (resp,), s, _ = _exchange(mock.port, _request("/healthz", method="GET", headers=[("connection", "close")]))
    assert resp[1]["connection"] == "close" and _closed_by_peer(s)
    s.close()


# -- require_auth --------------------------------------------------------------------------------

def test_require_auth_rejections(mock_auth):
    port = mock_auth.port
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    status, _, body = _post(port, "/v1/chat/completions", chat)
    assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key"
    status, _, _ = _post(port, "/v1/chat/completions", chat, [("authorization", "Bearer ")])
    assert status == 401
    status, _, _ = _post(port, "/v1/responses", {"model": "m", "input": "x"})
    assert status == 401
    status, _, _ = _post(port, "/v2/chat", chat, [("x-api-key", "k")])
    assert status == 401
    anth = dict(chat, max_tokens=5)
    status, _, body = _post(port, "/v1/messages", anth, [("anthropic-version", "2023-06-01")])
    assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
    status, _, body = _post(port, "/v1/messages", anth, [("x-api-key", "k")])
    assert status == 400 and "anthropic-version" in json.loads(body)["error"]["message"]
    gem = {"contents": [{"parts": [{"text": "x"}]}]}
    status, _, body = _post(port, "/v1beta/models/g:generateContent", gem, [("authorization", "Bearer k")])
    assert status == 403 and json.loads(body)["error"]["status"] == "PERMISSION_DENIED"
    status, _, _ = _post(port, "/v1beta/models/g:generateContent?key=k", gem)
    assert status == 200
    bed = {"messages": [{"role": "user", "content": [{"text": "x"}]}]}
    status, headers, _ = _post(port, "/model/m/converse", bed, [("authorization", "Bearer k")])
    assert status == 403 and headers["x-amzn-errortype"] == "MissingAuthenticationTokenException"
    status, headers, _ = _post(port, "/model/m/converse", bed,
                               [("authorization", "AWS4-HMAC-SHA256 Credential=a/b, Signature=c")])
    assert status == 403 and headers["x-amzn-errortype"] == "IncompleteSignatureException"


def test_require_auth_accepts_sdks_and_echoes_scheme(mock_auth):
    echo = "#mock:echo_auth=1 #mock:tokens=0"
    r = _openai(mock_auth).chat.completions.create(model="m", messages=[{"role": "user", "content": echo}])
    assert r.choices[0].message.content.endswith("[auth:bearer]")
    r = _openai(mock_auth).responses.create(model="m", input=echo)
    assert r.output_text.endswith("[auth:bearer]")
    r = _anthropic(mock_auth).messages.create(model="m", max_tokens=50, messages=[{"role": "user", "content": echo}])
    # This anthropic SDK sends its api_key as a Bearer token (SPEC, "What the official SDKs send").
    assert r.content[0].text.endswith("[auth:bearer]")
    status, _, body = _post(mock_auth.port, "/v1/messages",
                            {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": echo}]},
                            [("x-api-key", "k"), ("anthropic-version", "2023-06-01")])
    assert status == 200 and json.loads(body)["content"][0]["text"].endswith("[auth:x-api-key]")
    client, _ = _genai(mock_auth)
    assert client.models.generate_content(model="g", contents=echo).text.endswith("[auth:x-goog-api-key]")
    r = _cohere(mock_auth).chat(model="c", messages=[{"role": "user", "content": echo}])
    assert r.message.content[0].text.endswith("[auth:bearer]")
    r = _bedrock(mock_auth).converse(modelId=MODEL_ID, messages=[{"role": "user", "content": [{"text": echo}]}])
    assert r["output"]["message"]["content"][0]["text"].endswith("[auth:sigv4]")


def test_echo_auth_only_on_request(mock):
    status, _, body = _post(mock.port, "/v1/chat/completions",
                            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
                            [("x-mock-echo-auth", "1"), ("x-mock-tokens", "0")])
    assert json.loads(body)["choices"][0]["message"]["content"] == "mock: x [auth:none]"
    status, _, body = _post(mock.port, "/v1/chat/completions",
                            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
                            [("authorization", "Bearer k")])
    assert "[auth:" not in json.loads(body)["choices"][0]["message"]["content"]


# -- untrusted bodies ----------------------------------------------------------------------------

# One valid request per protocol exercising every field the mock reads (system, images, tools,
# forced tool choice, tool results, max tokens, streaming).
_TEMPLATES = {
    "/v1/chat/completions": {
        "model": "m", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 5,
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"required": ["a"]}}}],
        "messages": [{"role": "system", "content": "s"},
                     {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                  {"type": "image_url", "image_url": {"url": "x"}}]},
                     {"role": "assistant", "content": None, "tool_calls": []},
                     {"role": "tool", "tool_call_id": "c", "content": "r"}]},
    "/v1/responses": {
        "model": "m", "stream": True, "instructions": "i", "max_output_tokens": 4, "tool_choice": "required",
        "tools": [{"type": "function", "name": "f", "parameters": {"required": ["a"]}}],
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"},
                                               {"type": "input_image", "image_url": "x"}]},
                  {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c", "output": "r"}]},
    "/v1/messages": {
        "model": "m", "max_tokens": 5, "stream": True, "system": [{"type": "text", "text": "s"}],
        "tool_choice": {"type": "any"}, "tools": [{"name": "f", "input_schema": {"required": ["a"]}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image", "source": {}}]},
                     {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                   "content": [{"type": "text", "text": "r"}]}]}]},
    "/v1beta/models/g:streamGenerateContent": {
        "systemInstruction": {"parts": [{"text": "s"}]}, "generationConfig": {"maxOutputTokens": 3},
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
        "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"required": ["a"]}}]}],
        "contents": [{"role": "user", "parts": [{"text": "hi"}, {"inlineData": {"mimeType": "image/png", "data": ""}}]},
                     {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]},
                     {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"output": "r"}}}]}]},
    "/v2/chat": {
        "model": "m", "stream": True, "max_tokens": 3, "tool_choice": "REQUIRED",
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"required": ["a"]}}}],
        "messages": [{"role": "system", "content": "s"},
                     {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                  {"type": "image_url", "image_url": {"url": "x"}}]},
                     {"role": "assistant", "tool_calls": []},
                     {"role": "tool", "tool_call_id": "c",
                      "content": [{"type": "document", "document": {"data": {"k": 1}}}]}]},
    "/model/m/converse-stream": {
        "system": [{"text": "s"}], "inferenceConfig": {"maxTokens": 3},
        "toolConfig": {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {"required": ["a"]}}}}],
                       "toolChoice": {"tool": {"name": "f"}}},
        "messages": [{"role": "user", "content": [{"text": "hi"}, {"image": {}}]},
                     {"role": "assistant", "content": [{"toolUse": {}}]},
                     {"role": "user",
                      "content": [{"toolResult": {"toolUseId": "t", "content": [{"json": {"a": 1}}]}}]}]},
}

_JUNK = [None, True, 0, -1, 1.5, "", "x", [], {}, [None], {"x": None}, ["a"], 2 ** 62, "REQUIRED",
         "required", "ANY", {"type": "any"}, [{"type": "text"}]]


def _mutated(doc, rng):
    import copy
    doc = copy.deepcopy(doc)

    def paths(o, pre=()):
        if pre:
            yield pre
        items = o.items() if isinstance(o, dict) else enumerate(o) if isinstance(o, list) else ()
        for k, v in items:
            yield from paths(v, pre + (k,))

    for _ in range(rng.randint(1, 3)):
        path = rng.choice(list(paths(doc)))
        node = doc
        try:
            for k in path[:-1]:
                node = node[k]
            if isinstance(node, dict) and rng.random() < 0.2:
                del node[path[-1]]
            else:
                node[path[-1]] = copy.deepcopy(rng.choice(_JUNK))
        except (KeyError, IndexError, TypeError):
            pass
    return doc


def test_mutated_bodies_get_200_or_native_400():
    """Every body is answered 200 or 400 (never an exception), streamed to the end when 200."""
    import random
    from busbar.mock import server
    rng = random.Random(1234)
    for path, template in _TEMPLATES.items():
        seen = set()
        for i in range(1500):
            body = json.dumps(template if i == 0 else _mutated(template, rng)).encode()
            headers = {b"x-mock-tool": b"1"} if i % 2 else {b"x-mock-stream-error": b"1"}
            reply = server.respond(server._Request(b"POST", path.encode(), headers, body, True, False), False)
            status = int(reply.head.split(b" ")[1])
            assert status in (200, 400), (path, body)
            assert i or status == 200, reply.body
            if reply.frames is not None:
                assert all(isinstance(f, bytes) for f in reply.frames)
            else:
                json.loads(reply.body)
            seen.add(status)
        assert seen == {200, 400}, path
