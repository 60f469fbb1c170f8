"""The OpenAI Chat Completions codec, fed bytes (docs/codecs.md). The openai SDK itself is the judge
of what busbar writes for OpenAI clients: buffered bodies, stream frames and error envelopes are
handed to a real `openai.OpenAI` client through a mock transport."""
import random

import httpx2
import openai
import orjson
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from cbusbar import ir
from cbusbar.proto import openai as codec


def body(**fields):
    fields.setdefault("model", "gpt-4o")
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return orjson.dumps(fields)


def sse(*objs):
    return b"".join(b"data: " + (o if isinstance(o, bytes) else orjson.dumps(o)) + b"\n\n" for o in objs)


def chunk(delta=None, finish=None, **top):
    c = {"id": "chatcmpl-up", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
         "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}]}
    c.update(top)
    return c


USAGE = {"prompt_tokens": 30, "completion_tokens": 7, "total_tokens": 37,
         "prompt_tokens_details": {"cached_tokens": 10},
         "completion_tokens_details": {"reasoning_tokens": 2}}


def decode(data, step=None):
    dec = codec.StreamDecoder()
    events = []
    if step is None:
        events += dec.feed(data)
    else:
        for i in range(0, len(data), step):
            events += dec.feed(data[i:i + step])
    events += dec.close()
    return events


def check_order(events):
    """The IR stream order (ir.pxd): MESSAGE_START, blocks opened/closed one at a time with their
    deltas between, MESSAGE_DELTA, MESSAGE_STOP."""
    assert events[0].kind == ir.MESSAGE_START
    open_index = None
    seen = set()
    for e in events[1:-2]:
        if e.kind == ir.BLOCK_START:
            assert open_index is None and e.index not in seen
            open_index = e.index
            seen.add(e.index)
        elif e.kind == ir.BLOCK_DELTA:
            assert e.index == open_index
        elif e.kind == ir.BLOCK_STOP:
            assert e.index == open_index
            open_index = None
        else:
            pytest.fail(f"unexpected event {e!r}")
    assert open_index is None
    assert [e.kind for e in events[-2:]] == [ir.MESSAGE_DELTA, ir.MESSAGE_STOP]


def sdk_client(handler):
    return openai.OpenAI(api_key="sk-test", base_url="http://busbar.test/v1", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
                         _strict_response_validation=True)


def serve(content, status=200, content_type="application/json"):
    def handler(request):
        return httpx2.Response(status, content=content, headers={"content-type": content_type})
    return sdk_client(handler)


# ---------------------------------------------------------------------------------------------
# module names


def test_module_names():
    assert codec.NAME == "openai"
    assert codec.CONTENT_TYPE == b"application/json"
    assert codec.STREAM_CONTENT_TYPE == b"text/event-stream"
    assert codec.upstream_path("gpt-4o", False) == "/v1/chat/completions"
    assert codec.upstream_path("gpt-4o", True) == "/v1/chat/completions"


def test_mint_id():
    a, b = codec.mint_id(), codec.mint_id()
    assert a.startswith("chatcmpl-") and len(a) == 38 and a[9:].isalnum()
    assert a != b


# ---------------------------------------------------------------------------------------------
# read_request


def test_read_request_system_developer_and_text():
    req = codec.read_request(body(messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Use metric units."}]},
        {"role": "user", "content": "hi", "name": "ann"},
    ], stream=True))
    assert req.model == "gpt-4o" and req.stream is True
    assert [b.text for b in req.system] == ["Be brief.", "Use metric units."]
    assert len(req.messages) == 1
    m = req.messages[0]
    assert m.role == ir.USER and [(b.kind, b.text) for b in m.content] == [(ir.TEXT, "hi")]


def test_read_request_user_parts():
    req = codec.read_request(body(messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "input_audio", "input_audio": {"data": "SUQz", "format": "mp3"}},
        {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}},
        {"type": "file", "file": {"file_id": "file-abc"}},
        {"type": "text", "text": "cached", "prompt_cache_breakpoint": {"mode": "explicit"}},
    ]}]))
    blocks = req.messages[0].content
    assert blocks[0].kind == ir.TEXT and blocks[0].text == "what is this?"
    assert (blocks[1].kind, blocks[1].src_kind, blocks[1].media_type, blocks[1].data) == (
        ir.IMAGE, ir.SOURCE_BASE64, "image/png", "iVBORw0KGgo=")
    assert (blocks[2].kind, blocks[2].src_kind, blocks[2].data) == (
        ir.IMAGE, ir.SOURCE_URL, "https://example.com/cat.jpg")
    assert (blocks[3].kind, blocks[3].media_type, blocks[3].data) == (ir.DOCUMENT, "audio/wav", "UklGRg==")
    assert blocks[4].media_type == "audio/mpeg"
    assert (blocks[5].kind, blocks[5].src_kind, blocks[5].media_type, blocks[5].data, blocks[5].name) == (
        ir.DOCUMENT, ir.SOURCE_BASE64, "application/pdf", "JVBERi0=", "a.pdf")
    assert (blocks[6].src_kind, blocks[6].data) == (ir.SOURCE_VENDOR, "file-abc")
    assert blocks[7].cache_control == {"type": "ephemeral"}


def test_read_request_assistant_and_tool_turns():
    req = codec.read_request(body(messages=[
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": "", "reasoning_content": "Two cities, two calls.",
         "tool_calls": [
             {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}},
             {"id": "call_2", "type": "function", "function": {"name": "weather", "arguments": "{city: Rome"}},
             {"id": "call_3", "type": "function", "function": {"name": "clock", "arguments": ""}},
         ]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "21C"}]},
        {"role": "tool", "tool_call_id": "call_3", "content": "noon"},
        {"role": "user", "content": "thanks"},
        {"role": "assistant",
         "content": [{"type": "text", "text": "You're"}, {"type": "refusal", "refusal": " welcome"}],
         "refusal": "No more."},
    ]))
    user, asst, tools, user2, asst2 = req.messages
    assert [b.kind for b in asst.content] == [ir.THINKING, ir.TOOL_USE, ir.TOOL_USE, ir.TOOL_USE]
    assert asst.content[0].text == "Two cities, two calls."
    assert (asst.content[1].id, asst.content[1].name, asst.content[1].input) == ("call_1", "weather", {"city": "Paris"})
    assert asst.content[2].input == "{city: Rome"   # not JSON: kept as the raw string
    assert asst.content[3].input == {}
    assert tools.role == ir.USER
    assert [(b.kind, b.id, b.content[0].text) for b in tools.content] == [
        (ir.TOOL_RESULT, "call_1", "18C"), (ir.TOOL_RESULT, "call_2", "21C"), (ir.TOOL_RESULT, "call_3", "noon")]
    assert user2.role == ir.USER and user2.content[0].text == "thanks"
    assert [b.text for b in asst2.content] == ["You're", " welcome", "No more."]


def test_read_request_legacy_functions():
    req = codec.read_request(body(
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "function_call": {"name": "lookup", "arguments": '{"q":1}'}},
            {"role": "function", "name": "lookup", "content": "found"},
        ],
        functions=[{"name": "lookup", "parameters": {"type": "object"}}],
        function_call={"name": "lookup"}))
    call = req.messages[1].content[0]
    result = req.messages[2].content[0]
    assert call.kind == ir.TOOL_USE and call.input == {"q": 1}
    assert result.kind == ir.TOOL_RESULT and result.id == call.id
    assert [t.name for t in req.tools] == ["lookup"]
    assert (req.tool_choice, req.tool_choice_name) == (ir.TOOL_CHOICE_TOOL, "lookup")


@pytest.mark.parametrize("choice,expected", [
    ("auto", (ir.TOOL_CHOICE_AUTO, None)),
    ("none", (ir.TOOL_CHOICE_NONE, None)),
    ("required", (ir.TOOL_CHOICE_REQUIRED, None)),
    ({"type": "function", "function": {"name": "f"}}, (ir.TOOL_CHOICE_TOOL, "f")),
    ({"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": []}}, (ir.TOOL_CHOICE_REQUIRED, None)),
])
def test_read_request_tool_choice(choice, expected):
    req = codec.read_request(body(
        tools=[{"type": "function", "function": {"name": "f", "description": "d",
                                                  "parameters": {"type": "object"}, "strict": True}}],
        tool_choice=choice, parallel_tool_calls=False))
    assert (req.tool_choice, req.tool_choice_name) == expected
    assert req.parallel_tool_calls is False
    t = req.tools[0]
    assert (t.name, t.description, t.schema) == ("f", "d", {"type": "object"})


def test_read_request_response_format_and_sampling():
    req = codec.read_request(body(
        response_format={"type": "json_schema", "json_schema": {
            "name": "person", "schema": {"type": "object", "properties": {"name": {"type": "string"}}},
            "strict": True}},
        max_completion_tokens=300, temperature=0.7, top_p=0.9, frequency_penalty=0.1,
        presence_penalty=-0.2, seed=7, n=2, stop="END", user="u-1", reasoning_effort="low",
        logprobs=True, top_logprobs=3,
        stream_options={"include_usage": True}, logit_bias={"50256": -100}, store=True,
        metadata={"k": "v"}, service_tier="flex"))
    assert req.response_format == ir.FORMAT_JSON_SCHEMA
    assert (req.rf_name, req.rf_strict) == ("person", True)
    assert req.rf_schema["properties"]["name"] == {"type": "string"}
    assert req.max_tokens == 300
    assert req.temperature == 0.7 and type(req.temperature) is float
    assert (req.top_p, req.frequency_penalty, req.presence_penalty) == (0.9, 0.1, -0.2)
    assert (req.seed, req.n, req.stop, req.user) == (7, 2, ["END"], "u-1")
    assert (req.reasoning_effort, req.logprobs, req.top_logprobs) == ("low", True, 3)
    assert req.extra["stream_options"] == {"include_usage": True}
    assert req.extra["logit_bias"] == {"50256": -100}
    assert (req.extra["store"], req.extra["metadata"], req.extra["service_tier"]) == (True, {"k": "v"}, "flex")


def test_read_request_max_tokens_and_stop_list():
    req = codec.read_request(body(max_tokens=50, stop=["a", "b"], response_format={"type": "json_object"}))
    assert req.max_tokens == 50 and req.stop == ["a", "b"]
    assert req.response_format == ir.FORMAT_JSON_OBJECT
    assert "_max_completion_tokens" not in req.extra


@pytest.mark.parametrize("raw,message", [
    (b"{not json", "We could not parse the JSON body of your request."),
    (b"[1, 2]", "We could not parse the JSON body of your request."),
    (b"", "We could not parse the JSON body of your request."),
    (b'{"messages": [{"role": "user", "content": "x"}]}', "Missing required parameter: 'model'."),
    (b'{"model": "", "messages": []}', "Missing required parameter: 'model'."),
    (b'{"model": "m"}', "Missing required parameter: 'messages'."),
    (b'{"model": "m", "messages": "hi"}', "Invalid type for 'messages': expected an array, but got a string instead."),
    (b'{"model": "m", "messages": []}',
     "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead."),
    (b'{"model": "m", "messages": [{"role": "robot", "content": "x"}]}',
     "Invalid value: 'robot'. Supported values are: "
     "'system', 'assistant', 'user', 'function', 'tool', and 'developer'."),
    (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}',
     "Invalid type for 'messages[0].content': "
     "expected one of a string or array of objects, but got an integer instead."),
    (b'{"model": "m", "messages": [{"role": "tool", "content": "x"}]}',
     "Missing required parameter: 'messages[0].tool_call_id'."),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
     "Invalid type for 'temperature': expected a decimal, but got a string instead."),
    (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"}',
     "Invalid value: 'sometimes'. Supported values are: 'none', 'auto', and 'required'."),
    (b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "video"}]}]}',
     "Invalid value: 'video'. Supported values are: 'text', 'image_url', 'input_audio', and 'file'."),
    (b'{"model": "m", "messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}',
     "Invalid value: 'image_url'. Supported values are: 'text'."),
])
def test_read_request_errors(raw, message):
    with pytest.raises(ir.CodecError) as e:
        codec.read_request(raw)
    assert str(e.value) == message


def _mutations(value, rng):
    """Random reshapes of a JSON value: every leaf and container swapped for another type."""
    junk = [None, True, 0, -1, 1.5, "", "x", [], {}, [None], {"type": None}, "data:", "data:x;base64,"]
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            r = rng.random()
            if r < 0.1:
                continue
            out[k] = rng.choice(junk) if r < 0.3 else _mutations(v, rng)
        return out
    if isinstance(value, list):
        return [rng.choice(junk) if rng.random() < 0.2 else _mutations(v, rng) for v in value]
    return rng.choice(junk) if rng.random() < 0.3 else value


FULL_REQUEST = {
    "model": "gpt-4o", "stream": True, "temperature": 0.2, "stop": ["x"], "max_tokens": 5,
    "messages": [
        {"role": "system", "content": [{"type": "text", "text": "s"}]},
        {"role": "user", "content": [{"type": "text", "text": "t"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                                     {"type": "file", "file": {"file_data": "AA", "filename": "f"}},
                                     {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}}]},
        {"role": "assistant", "content": None, "reasoning_content": "r",
         "function_call": {"name": "g", "arguments": "{}"},
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                        {"id": "d", "type": "custom", "custom": {"name": "h", "input": "x"}}]},
        {"role": "tool", "tool_call_id": "c", "content": [{"type": "text", "text": "ok"}]},
        {"role": "function", "name": "g", "content": "ok"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}},
              {"type": "custom", "custom": {"name": "h"}}],
    "functions": [{"name": "g"}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {}, "strict": False}},
}


JUNK = [None, True, 0, -1, 1.5, "", "x", [], {}, [None], {"type": None}, "data:", "data:x;base64,"]


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, prefix + (i,))


def _mutate_one(value, rng):
    """A deep copy of `value` with one node (picked at random) replaced by junk or removed."""
    value = orjson.loads(orjson.dumps(value))
    path = rng.choice(list(_paths(value))[1:])
    parent = value
    for step in path[:-1]:
        parent = parent[step]
    if rng.random() < 0.2 and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(JUNK)
    return value


def test_read_request_fuzz_raises_only_codec_error():
    rng = random.Random(1234)
    assert codec.read_request(orjson.dumps(FULL_REQUEST)).model == "gpt-4o"
    accepted = rejected = 0
    for _ in range(3000):
        mutated = _mutate_one(FULL_REQUEST, rng)
        if rng.random() < 0.3:
            mutated = _mutate_one(mutated, rng)
        try:
            req = codec.read_request(orjson.dumps(mutated))
        except ir.CodecError:
            rejected += 1
            continue
        accepted += 1
        codec.write_request(req)  # whatever was accepted must also be writable
    assert accepted > 500 and rejected > 500  # the fuzz reaches both sides of the validation


# ---------------------------------------------------------------------------------------------
# write_request


def _req(messages=(), system=(), **fields):
    req = ir.Request()
    req.model = "target-model"
    req.system = [ir.Block(ir.TEXT, t) for t in system]
    req.messages = list(messages)
    for k, v in fields.items():
        setattr(req, k, v)
    return req


def test_write_request_messages():
    img64 = ir.Block(ir.IMAGE, src_kind=ir.SOURCE_BASE64, media_type="image/jpeg", data="/9j/")
    img_url = ir.Block(ir.IMAGE, src_kind=ir.SOURCE_URL, data="https://example.com/a.png")
    img_vendor = ir.Block(ir.IMAGE, src_kind=ir.SOURCE_VENDOR, data="file-1")
    thinking = ir.Block(ir.THINKING, "hmm", signature="sig")
    call = ir.Block(ir.TOOL_USE, id="toolu_1", name="weather", input={"city": "Paris"})
    result = ir.Block(ir.TOOL_RESULT, id="toolu_1",
                      content=[ir.Block(ir.TEXT, "18C "), ir.Block(ir.TEXT, "sunny"), img_url])
    pdf = ir.Block(ir.DOCUMENT, src_kind=ir.SOURCE_BASE64, media_type="application/pdf", data="JVBER")
    text_doc = ir.Block(ir.DOCUMENT, "plain doc", name="notes")
    req = _req(system=["one", "two"], messages=[
        ir.Message(ir.USER, [ir.Block(ir.TEXT, "look"), img64, img_url, img_vendor, pdf, text_doc]),
        ir.Message(ir.ASSISTANT, [thinking, ir.Block(ir.TEXT, "Let me"), ir.Block(ir.TEXT, " check."), call]),
        ir.Message(ir.USER, [result, ir.Block(ir.TEXT, "and?")]),
        ir.Message(ir.ASSISTANT, [thinking]),
        ir.Message(ir.USER, [ir.Block(ir.TEXT, "bye")]),
    ])
    out = orjson.loads(codec.write_request(req))
    assert out["model"] == "target-model"
    assert out["messages"] == [
        {"role": "system", "content": "one\n\ntwo"},
        {"role": "user", "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "file", "file": {"filename": "document.pdf", "file_data": "data:application/pdf;base64,JVBER"}},
            {"type": "text", "text": "plain doc"},
        ]},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C sunny"},   # as written, no separator
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
                                     {"type": "text", "text": "and?"}]},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "bye"},
    ]
    assert "tools" not in out and "tool_choice" not in out and "stream" not in out


def test_write_request_tools_and_knobs():
    req = _req(messages=[ir.Message(ir.USER, [ir.Block(ir.TEXT, "x")])],
               tools=[ir.Tool("f", "does f", {"type": "object"}), ir.Tool("g")],
               tool_choice=ir.TOOL_CHOICE_TOOL, tool_choice_name="g", parallel_tool_calls=False,
               response_format=ir.FORMAT_JSON_SCHEMA, rf_schema={"type": "object"}, rf_strict=True,
               max_tokens=100, temperature=0.7, top_p=0.5, top_k=40, frequency_penalty=0.0,
               presence_penalty=0.5, seed=3, n=1, stop=["a", "b", "c", "d", "e"], user="u",
               reasoning_budget=2000, logprobs=True, top_logprobs=2, stream=True)
    out = orjson.loads(codec.write_request(req))
    assert out["tools"] == [
        {"type": "function", "function": {"name": "f", "description": "does f", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g"}}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "g"}}
    assert out["parallel_tool_calls"] is False
    assert out["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "response", "schema": {"type": "object"}, "strict": True}}
    assert out["max_tokens"] == 100 and "max_completion_tokens" not in out
    assert out["temperature"] == 0.7 and b'"temperature":0.7' in codec.write_request(req)
    assert "top_k" not in out
    assert out["stop"] == ["a", "b", "c", "d"]
    assert (out["reasoning_effort"], out["logprobs"], out["top_logprobs"]) == ("low", True, 2)
    assert out["stream"] is True and out["stream_options"] == {"include_usage": True}
    assert (out["user"], out["seed"], out["n"], out["frequency_penalty"]) == ("u", 3, 1, 0.0)


@pytest.mark.parametrize("budget,effort", [
    (-1, "medium"), (0, None), (512, "minimal"), (1024, "minimal"), (1025, "low"), (4096, "low"),
    (8192, "medium"), (8193, "high"), (32000, "high")])
def test_write_request_budget_to_effort(budget, effort):
    out = orjson.loads(codec.write_request(_req(messages=[ir.Message(ir.USER, [ir.Block(ir.TEXT, "x")])],
                                                reasoning_budget=budget)))
    assert out.get("reasoning_effort") == effort


def test_write_request_effort_wins_over_budget():
    out = orjson.loads(codec.write_request(_req(reasoning_effort="high", reasoning_budget=100)))
    assert out["reasoning_effort"] == "high"


def test_write_request_drops_tool_knobs_without_tools():
    out = orjson.loads(codec.write_request(_req(
        messages=[ir.Message(ir.USER, [ir.Block(ir.TEXT, "x")])],
        tool_choice=ir.TOOL_CHOICE_REQUIRED, parallel_tool_calls=True)))
    assert "tool_choice" not in out and "parallel_tool_calls" not in out


def test_same_protocol_round_trip_keeps_openai_only_fields():
    raw = body(messages=[{"role": "user", "content": "x"}],
               tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": True}},
                      {"type": "custom", "custom": {"name": "sql", "format": {"type": "text"}}}],
               tool_choice={"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
                   {"type": "function", "function": {"name": "f"}}]}},
               max_completion_tokens=64, logit_bias={"1": 5}, store=False,
               stream_options={"include_usage": False, "include_obfuscation": False})
    out = orjson.loads(codec.write_request(codec.read_request(raw)))
    assert out["tools"][0]["function"]["strict"] is True
    assert out["tools"][1] == {"type": "custom", "custom": {"name": "sql", "format": {"type": "text"}}}
    assert out["tool_choice"]["type"] == "allowed_tools"
    assert out["max_completion_tokens"] == 64 and "max_tokens" not in out
    assert out["logit_bias"] == {"1": 5} and out["store"] is False
    assert "stream_options" not in out and "stream" not in out  # stream_options needs stream: true
    assert not any(k.startswith("_") for k in out)


def test_round_trip_is_stable():
    first = codec.read_request(orjson.dumps(FULL_REQUEST))
    again = codec.read_request(codec.write_request(first))
    assert codec.write_request(again) == codec.write_request(first)
    out = orjson.loads(codec.write_request(first))
    assert out["stream_options"] == {"include_usage": True}
    assert out["messages"][2]["tool_calls"][1] == {"id": "d", "type": "custom", "custom": {"name": "h", "input": "x"}}


def test_cross_protocol_request_ignores_cleared_extra():
    req = codec.read_request(body(max_completion_tokens=9, logit_bias={"1": 1}))
    req.extra = {}
    out = orjson.loads(codec.write_request(req))
    assert out["max_tokens"] == 9 and "logit_bias" not in out


# ---------------------------------------------------------------------------------------------
# read_response / write_response / read_usage


def completion(message, finish="stop", usage=USAGE, **top):
    c = {"id": "chatcmpl-up", "object": "chat.completion", "created": 1712345678, "model": "gpt-4o-2024",
         "choices": [{"index": 0, "message": dict({"role": "assistant"}, **message), "logprobs": None,
                      "finish_reason": finish}], "usage": usage}
    c.update(top)
    return orjson.dumps(c)


def test_read_response_text_and_usage():
    resp = codec.read_response(completion({"content": "Hello!", "refusal": None}))
    assert (resp.id, resp.model, resp.created) == ("chatcmpl-up", "gpt-4o-2024", 1712345678)
    assert [(b.kind, b.text) for b in resp.content] == [(ir.TEXT, "Hello!")]
    assert resp.stop_reason == ir.END_TURN
    u = resp.usage
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.reasoning_tokens) == (30, 7, 10, 2)
    assert u.input_known


def test_read_response_tool_calls_reasoning_logprobs():
    lp = [{"token": "Hi", "logprob": -0.1, "bytes": [72, 105], "top_logprobs": []}]
    raw = orjson.dumps({
        "id": "x", "model": "deepseek-reasoner", "created": 5,
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": {"content": lp},
                     "message": {"role": "assistant", "content": None, "reasoning_content": "think",
                                 "tool_calls": [
                                     {"id": "call_a", "type": "function",
                                      "function": {"name": "f", "arguments": '{"x": 1}'}},
                                     {"id": "call_b", "type": "function",
                                      "function": {"name": "g", "arguments": "oops"}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "prompt_cache_hit_tokens": 4}})
    resp = codec.read_response(raw)
    assert [b.kind for b in resp.content] == [ir.THINKING, ir.TOOL_USE, ir.TOOL_USE]
    assert resp.content[0].text == "think"
    assert (resp.content[1].id, resp.content[1].name, resp.content[1].input) == ("call_a", "f", {"x": 1})
    assert resp.content[2].input == "oops"
    assert resp.stop_reason == ir.TOOL_USE_STOP
    assert resp.logprobs == lp
    assert resp.usage.cache_read_tokens == 4


@pytest.mark.parametrize("finish,message,stop", [
    ("stop", {"content": "x"}, ir.END_TURN),
    ("length", {"content": "x"}, ir.MAX_TOKENS),
    ("tool_calls",
     {"content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
     ir.TOOL_USE_STOP),
    ("function_call", {"content": None, "function_call": {"name": "f", "arguments": "{}"}}, ir.TOOL_USE_STOP),
    ("content_filter", {"content": ""}, ir.SAFETY),
    ("stop",
     {"content": None, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
     ir.TOOL_USE_STOP),
    ("stop", {"content": None, "refusal": "I can't help with that."}, ir.REFUSAL),
    ("something_new", {"content": "x"}, ir.OTHER),
])
def test_read_response_finish_reasons(finish, message, stop):
    assert codec.read_response(completion(message, finish)).stop_reason == stop


@pytest.mark.parametrize("raw", [b"not json", b"[]", b'"x"'])
def test_read_response_rejects_non_objects(raw):
    with pytest.raises(ir.CodecError):
        codec.read_response(raw)


def test_read_response_tolerates_odd_shapes():
    for raw in [b"{}", b'{"choices": null}', b'{"choices": [1, {"message": 5}]}',
                b'{"choices": [{"message": {"content": [{"type": "text", "text": "a"}, 3], '
                b'"tool_calls": [1, {"function": 2}]}}], "usage": "x"}']:
        resp = codec.read_response(raw)
        assert isinstance(resp.content, list)
    assert not codec.read_response(b"{}").usage.input_known


def _resp(content, stop=ir.END_TURN, usage=None, logprobs=None, created=1700000000):
    r = ir.Response()
    r.id, r.model, r.created = "chatcmpl-golden", "claude-x", created
    r.content, r.stop_reason, r.logprobs = content, stop, logprobs
    r.usage = usage or ir.Usage(120, 40, cache_read_tokens=100, cache_write_tokens=5, reasoning_tokens=9)
    return r


def test_write_response_text_parsed_by_sdk():
    raw = codec.write_response(_resp([ir.Block(ir.TEXT, "Hello"), ir.Block(ir.TEXT, " there")]))
    obj = orjson.loads(raw)
    assert obj == {
        "id": "chatcmpl-golden", "object": "chat.completion", "created": 1700000000, "model": "claude-x",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there", "refusal": None},
                     "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 40, "total_tokens": 160,
                  "prompt_tokens_details": {"cached_tokens": 100, "cache_write_tokens": 5},
                  "completion_tokens_details": {"reasoning_tokens": 9}}}
    cc = ChatCompletion.model_validate_json(raw)
    assert cc.choices[0].message.content == "Hello there"
    got = serve(raw).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert got.usage.prompt_tokens_details.cached_tokens == 100


def test_write_response_tools_thinking_logprobs_parsed_by_sdk():
    lp = [{"token": "a", "logprob": -0.5, "bytes": None, "top_logprobs": []}]
    raw = codec.write_response(_resp(
        [ir.Block(ir.THINKING, "first I think", signature="s"), ir.Block(ir.THINKING, data="xx", redacted=True),
         ir.Block(ir.TOOL_USE, id="toolu_9", name="f", input={"a": [1, 2]}),
         ir.Block(ir.TOOL_USE, id="toolu_10", name="g", input=None)],
        stop=ir.TOOL_USE_STOP, logprobs=lp, created=None))
    obj = orjson.loads(raw)
    msg = obj["choices"][0]["message"]
    assert msg["content"] is None and msg["refusal"] is None
    assert msg["reasoning_content"] == "first I think"
    assert msg["tool_calls"] == [
        {"id": "toolu_9", "type": "function", "function": {"name": "f", "arguments": '{"a":[1,2]}'}},
        {"id": "toolu_10", "type": "function", "function": {"name": "g", "arguments": "{}"}}]
    assert obj["choices"][0]["finish_reason"] == "tool_calls"
    assert obj["choices"][0]["logprobs"] == {"content": lp, "refusal": None}
    assert isinstance(obj["created"], int) and obj["created"] > 1600000000
    got = serve(raw).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert got.choices[0].message.tool_calls[0].function.name == "f"
    assert got.choices[0].logprobs.content[0].token == "a"


@pytest.mark.parametrize("stop,finish", [
    (ir.END_TURN, "stop"), (ir.STOP_SEQUENCE, "stop"), (ir.MAX_TOKENS, "length"),
    (ir.TOOL_USE_STOP, "tool_calls"), (ir.SAFETY, "content_filter"), (ir.REFUSAL, "stop"),
    (ir.ERROR, "stop"), (ir.PAUSE_TURN, "stop"), (ir.OTHER, "stop"), (ir.STOP_UNSET, "stop")])
def test_write_response_finish_reason(stop, finish):
    obj = orjson.loads(codec.write_response(_resp([ir.Block(ir.TEXT, "x")], stop=stop)))
    assert obj["choices"][0]["finish_reason"] == finish


def test_write_response_citations_become_annotations():
    cited = ir.Block(ir.TEXT, "Paris is the capital.", citations=[
        {"type": "web_search_result_location", "url": "https://fr.example", "title": "France", "cited_text": "..."}])
    raw = codec.write_response(_resp([ir.Block(ir.TEXT, "Yes. "), cited]))
    msg = orjson.loads(raw)["choices"][0]["message"]
    assert msg["annotations"] == [{"type": "url_citation", "url_citation": {
        "url": "https://fr.example", "title": "France", "start_index": 5, "end_index": 26}}]
    ChatCompletion.model_validate_json(raw)


def test_response_round_trip():
    raw = completion({"content": "Hi", "annotations": [{"type": "url_citation", "url_citation": {
        "url": "u", "title": "t", "start_index": 0, "end_index": 2}}]})
    resp = codec.read_response(raw)
    resp.id = "chatcmpl-new"
    out = orjson.loads(codec.write_response(resp))
    src = orjson.loads(raw)
    assert out["choices"][0]["message"]["content"] == "Hi"
    assert out["choices"][0]["message"]["annotations"] == src["choices"][0]["message"]["annotations"]
    assert out["usage"]["prompt_tokens"] == 30 and out["usage"]["prompt_tokens_details"]["cached_tokens"] == 10


def test_read_usage_parses_only_the_usage_slice():
    # orjson would reject the invalid UTF-8 elsewhere in the body; the usage tap never parses it.
    raw = b'{"id":"x","choices":[{"message":{"content":"\xff\xfe"}}],"usage":' + orjson.dumps(USAGE) + b"}"
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)
    u = codec.read_usage(raw)
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.reasoning_tokens) == (30, 7, 10, 2)
    assert not codec.read_usage(b'{"id": "x"}').input_known
    assert not codec.read_usage(b'{"usage": null}').input_known
    with pytest.raises(ir.CodecError):
        codec.read_usage(b'{"usage": ')


# ---------------------------------------------------------------------------------------------
# StreamDecoder

TEXT_STREAM = sse(
    chunk({"role": "assistant", "content": "", "refusal": None}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk({}, "stop"),
    dict(chunk(), choices=[], usage=USAGE),
    b"[DONE]")

TOOL_STREAM = sse(
    chunk({"role": "assistant", "content": None}),
    chunk({"content": "Checking."}),
    chunk({"tool_calls": [
        {"index": 0, "id": "call_A", "type": "function", "function": {"name": "weather", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
    chunk({"tool_calls": [
        {"index": 1, "id": "call_B", "type": "function", "function": {"name": "clock", "arguments": ""}}]}),
    chunk({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}),
    chunk({}, "tool_calls"),
    dict(chunk(), choices=[], usage=USAGE),
    b"[DONE]")


def summary(events):
    out = []
    for e in events:
        if e.kind == ir.MESSAGE_START:
            out.append(("start", e.id, e.model))
        elif e.kind == ir.BLOCK_START:
            out.append(("open", e.index, e.block.kind, e.block.id, e.block.name))
        elif e.kind == ir.BLOCK_DELTA:
            out.append(("delta", e.index, e.delta_kind, e.text))
        elif e.kind == ir.BLOCK_STOP:
            out.append(("close", e.index))
        elif e.kind == ir.MESSAGE_DELTA:
            out.append(("end", e.stop_reason, e.usage.input_tokens, e.usage.output_tokens, e.usage.input_known))
        elif e.kind == ir.MESSAGE_STOP:
            out.append(("stop",))
        elif e.kind == ir.EVENT_ERROR:
            out.append(("error", e.error_kind, e.message))
    return out


def test_decoder_text_stream_every_split():
    expected = [("start", "chatcmpl-up", "gpt-4o"), ("open", 0, ir.TEXT, None, None),
                ("delta", 0, ir.DELTA_TEXT, "Hel"), ("delta", 0, ir.DELTA_TEXT, "lo"), ("close", 0),
                ("end", ir.END_TURN, 30, 7, True), ("stop",)]
    for step in [None, 1, 2, 3, 7, 64]:
        events = decode(TEXT_STREAM, step)
        check_order(events)
        got = summary(events)
        # one-byte feeds deliver the same frames; texts may not be merged or split differently
        assert got == expected, step
    end = decode(TEXT_STREAM)[-2]
    assert (end.usage.cache_read_tokens, end.usage.reasoning_tokens) == (10, 2)


def test_decoder_two_tool_calls():
    events = decode(TOOL_STREAM, 5)
    check_order(events)
    assert summary(events) == [
        ("start", "chatcmpl-up", "gpt-4o"),
        ("open", 0, ir.TEXT, None, None), ("delta", 0, ir.DELTA_TEXT, "Checking."), ("close", 0),
        ("open", 1, ir.TOOL_USE, "call_A", "weather"),
        ("delta", 1, ir.DELTA_INPUT_JSON, '{"city":'), ("delta", 1, ir.DELTA_INPUT_JSON, '"Paris"}'), ("close", 1),
        ("open", 2, ir.TOOL_USE, "call_B", "clock"), ("delta", 2, ir.DELTA_INPUT_JSON, "{}"), ("close", 2),
        ("end", ir.TOOL_USE_STOP, 30, 7, True), ("stop",)]


def test_decoder_reasoning_then_text_and_logprobs():
    lp = [{"token": "Hi", "logprob": -0.2, "bytes": None, "top_logprobs": []}]
    data = sse(chunk({"role": "assistant"}),
               chunk({"reasoning_content": "let me "}), chunk({"reasoning": "think"}),
               dict(chunk({"content": "Hi"}),
                    choices=[{"index": 0, "delta": {"content": "Hi"}, "logprobs": {"content": lp}}]),
               chunk({}, "length"), b"[DONE]")
    events = decode(data, 3)
    check_order(events)
    assert summary(events)[1:] == [
        ("open", 0, ir.THINKING, None, None), ("delta", 0, ir.DELTA_THINKING, "let me "),
        ("delta", 0, ir.DELTA_THINKING, "think"), ("close", 0),
        ("open", 1, ir.TEXT, None, None), ("delta", 1, ir.DELTA_TEXT, "Hi"), ("close", 1),
        ("end", ir.MAX_TOKENS, 0, 0, False), ("stop",)]
    assert events[6].data == lp


def test_decoder_stop_with_tool_calls_and_no_done():
    # Some compatible servers finish a tool call with "stop", send usage with it and never [DONE].
    data = sse(chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]}),
               dict(chunk({}, "stop"), usage=USAGE))
    events = decode(data, 4)
    check_order(events)
    assert summary(events)[-2] == ("end", ir.TOOL_USE_STOP, 30, 7, True)


def test_decoder_cut_stream_does_not_end():
    events = decode(sse(chunk({"content": "partial"})))
    assert [e.kind for e in events] == [ir.MESSAGE_START, ir.BLOCK_START, ir.BLOCK_DELTA]


def test_decoder_ignores_keepalives_comments_and_frames_after_done():
    data = b": keepalive\n\n" + sse(chunk({"content": "a"})) + b"data: \n\n" + sse(chunk({}, "stop"), b"[DONE]") + \
        sse(chunk({"content": "late"}), b"not json at all")
    events = decode(data, 6)
    check_order(events)
    assert [e.text for e in events if e.kind == ir.BLOCK_DELTA] == ["a"]


def test_decoder_error_frame():
    data = sse(chunk({"content": "a"}),
               {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}})
    events = decode(data, 5)
    assert summary(events)[-2:] == [("close", 0), ("error", "rate_limit", "Rate limit reached")]
    assert summary(decode(sse({"error": {"message": "boom", "type": "server_error"}}))) == [
        ("error", "api_error", "boom")]
    assert summary(decode(sse({"error": {"message": "slow", "code": 429}}))) == [("error", "rate_limit", "slow")]
    assert summary(decode(sse({"error": "plain"}))) == [("error", "api_error", "plain")]


@pytest.mark.parametrize("frame", [b"{not json", b"[1,2]", b'"str"', b"42", b"\xff\xfe"])
def test_decoder_garbage_raises_codec_error(frame):
    with pytest.raises(ir.CodecError):
        decode(sse(chunk({"content": "a"})) + b"data: " + frame + b"\n\n")


def test_decoder_fuzz_raises_only_codec_error():
    rng = random.Random(99)
    frames = [orjson.loads(line[6:]) for line in TOOL_STREAM.split(b"\n\n") if line and line != b"data: [DONE]"]
    for _ in range(1500):
        data = sse(*[_mutations(f, rng) for f in frames], b"[DONE]")
        if rng.random() < 0.2:
            cut = rng.randrange(len(data))
            data = data[:cut] + bytes([rng.randrange(256)]) + data[cut + 1:]
        try:
            events = decode(data, rng.randrange(1, 40))
        except ir.CodecError:
            continue
        if events and events[-1].kind == ir.MESSAGE_STOP:
            check_order(events)


def test_decoder_interleaved_and_unindexed_tool_calls():
    data = sse(chunk({"tool_calls": [{"id": "x1", "function": {"name": "a", "arguments": "{"}}]}),
               chunk({"tool_calls": [{"function": {"arguments": "}"}}]}),
               chunk({"tool_calls": [{"id": "x2", "function": {"name": "b", "arguments": "{}"}}]}),
               chunk({}, "tool_calls"), b"[DONE]")
    events = decode(data)
    check_order(events)
    assert summary(events)[1:-2] == [
        ("open", 0, ir.TOOL_USE, "x1", "a"), ("delta", 0, ir.DELTA_INPUT_JSON, "{"),
        ("delta", 0, ir.DELTA_INPUT_JSON, "}"), ("close", 0),
        ("open", 1, ir.TOOL_USE, "x2", "b"), ("delta", 1, ir.DELTA_INPUT_JSON, "{}"), ("close", 1)]


# ---------------------------------------------------------------------------------------------
# StreamEncoder


def ir_stream(with_tools=True):
    usage = ir.Usage(50, 12, cache_read_tokens=20, reasoning_tokens=3)
    evs = [ir.ev_message_start("msg_up", "claude-x", ir.Usage(50, 0)),
           ir.ev_block_start(0, ir.Block(ir.THINKING, "")),
           ir.ev_block_delta(0, ir.DELTA_THINKING, "Hmm."),
           ir.ev_block_delta(0, ir.DELTA_SIGNATURE, "sig"),
           ir.ev_block_stop(0),
           ir.ev_block_start(1, ir.Block(ir.TEXT, "")),
           ir.ev_block_delta(1, ir.DELTA_TEXT, "Sure"),
           ir.ev_block_delta(1, ir.DELTA_TEXT, "."),
           ir.ev_block_stop(1)]
    if with_tools:
        evs += [ir.ev_block_start(2, ir.Block(ir.TOOL_USE, id="toolu_1", name="weather")),
                ir.ev_block_delta(2, ir.DELTA_INPUT_JSON, '{"city"'),
                ir.ev_block_delta(2, ir.DELTA_INPUT_JSON, ':"Oslo"}'),
                ir.ev_block_stop(2),
                ir.ev_block_start(3, ir.Block(ir.TOOL_USE, id="toolu_2", name="clock")),
                ir.ev_block_delta(3, ir.DELTA_INPUT_JSON, "{}"),
                ir.ev_block_stop(3)]
    evs += [ir.ev_message_delta(ir.TOOL_USE_STOP if with_tools else ir.END_TURN, None, usage),
            ir.ev_message_stop()]
    return evs


def frames(raw):
    assert raw.endswith(b"\n\n")
    return [f[len(b"data: "):] for f in raw[:-2].split(b"\n\n")]


def test_encoder_frames_parse_as_sdk_chunks():
    enc = codec.StreamEncoder("chatcmpl-xyz", "target-model")
    enc.created = 1700000000
    raw = b"".join(enc.encode([e]) for e in ir_stream())
    fs = frames(raw)
    assert fs[-1] == b"[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(f) for f in fs[:-1]]
    assert all(c.id == "chatcmpl-xyz" and c.model == "target-model" and c.created == 1700000000 for c in chunks)
    objs = [orjson.loads(f) for f in fs[:-1]]
    assert all("usage" not in o for o in objs)
    deltas = [o["choices"][0]["delta"] for o in objs]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"reasoning_content": "Hmm."},
        {"content": "Sure"}, {"content": "."},
        {"tool_calls": [
            {"index": 0, "id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"city"'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ':"Oslo"}'}}]},
        {"tool_calls": [
            {"index": 1, "id": "toolu_2", "type": "function", "function": {"name": "clock", "arguments": ""}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]},
        {}]
    assert [o["choices"][0]["finish_reason"] for o in objs][-2:] == [None, "tool_calls"]


def test_encoder_include_usage():
    enc = codec.StreamEncoder("chatcmpl-xyz", "target-model")
    enc.include_usage = True
    fs = frames(enc.encode(ir_stream(with_tools=False)))
    objs = [orjson.loads(f) for f in fs[:-1]]
    assert fs[-1] == b"[DONE]"
    assert all(o["usage"] is None for o in objs[:-1])
    assert objs[-1]["choices"] == [] and objs[-1]["usage"] == {
        "prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62,
        "prompt_tokens_details": {"cached_tokens": 20}, "completion_tokens_details": {"reasoning_tokens": 3}}
    for f in fs[:-1]:
        ChatCompletionChunk.model_validate_json(f)


def test_encoder_created_defaults_to_now():
    import time
    enc = codec.StreamEncoder("i", "m")
    assert abs(enc.created - time.time()) < 5 and enc.include_usage is False


def test_encoder_stream_read_by_sdk_client():
    enc = codec.StreamEncoder("chatcmpl-xyz", "target-model")
    enc.include_usage = True
    raw = enc.encode(ir_stream())
    client = serve(raw, content_type="text/event-stream")
    got = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True))
    assert got[-1].usage.total_tokens == 62
    text = "".join(c.choices[0].delta.content or "" for c in got if c.choices)
    assert text == "Sure."
    # The SDK's own accumulator rebuilds both tool calls from the fragments.
    with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "x"}]) as s:
        final = s.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        ("toolu_1", "weather", '{"city":"Oslo"}'), ("toolu_2", "clock", "{}")]
    assert final.choices[0].finish_reason == "tool_calls"


def test_encoder_error_frames_raise_in_sdk():
    enc = codec.StreamEncoder("chatcmpl-xyz", "target-model")
    raw = enc.encode(ir_stream(with_tools=False)[:3]) + enc.error("overloaded", "Upstream overloaded.")
    assert enc.encode([ir.ev_message_stop()]) == b""  # nothing after an error frame
    assert raw.endswith(
        b'data: {"error":{"message":"Upstream overloaded.","type":"server_error","param":null,"code":null}}\n\n')
    client = serve(raw, content_type="text/event-stream")
    with pytest.raises(openai.APIError) as e:
        list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True))
    assert e.value.message == "Upstream overloaded."
    enc2 = codec.StreamEncoder("i", "m")
    out = enc2.encode([ir.ev_message_start("a", "b", None), ir.ev_error("rate_limit", "slow down"),
                       ir.ev_message_stop()])
    assert frames(out)[-1] == b'{"error":{"message":"slow down","type":"rate_limit_error","param":null,"code":null}}'


def test_decoder_encoder_round_trip():
    enc = codec.StreamEncoder("chatcmpl-new", "target-model")
    enc.created = 1700000000
    enc.include_usage = True
    out = bytearray()
    dec = codec.StreamDecoder()
    for i in range(0, len(TOOL_STREAM), 7):
        out += enc.encode(dec.feed(TOOL_STREAM[i:i + 7]))
    out += enc.encode(dec.close())
    again = decode(bytes(out), 3)
    assert summary(again)[1:] == summary(decode(TOOL_STREAM))[1:]


# ---------------------------------------------------------------------------------------------
# errors and model lists


@pytest.mark.parametrize("status,kind,etype,code,exc", [
    (400, "invalid_request", "invalid_request_error", None, openai.BadRequestError),
    (401, "authentication", "authentication_error", "invalid_api_key", openai.AuthenticationError),
    (403, "permission", "permission_error", None, openai.PermissionDeniedError),
    (404, "not_found", "not_found_error", None, openai.NotFoundError),
    (413, "request_too_large", "invalid_request_error", None, openai.APIStatusError),
    (429, "rate_limit", "rate_limit_error", None, openai.RateLimitError),
    (429, "quota", "insufficient_quota", "insufficient_quota", openai.RateLimitError),
    (500, "api_error", "server_error", None, openai.InternalServerError),
    (503, "overloaded", "server_error", None, openai.InternalServerError),
    (504, "timeout", "server_error", None, openai.InternalServerError),
])
def test_write_error(status, kind, etype, code, exc):
    raw = codec.write_error(status, kind, "Nope.", "req_123")
    assert orjson.loads(raw) == {"error": {"message": "Nope.", "type": etype, "param": None, "code": code}}
    assert codec.read_error_detail(raw)[0] == "Nope."
    with pytest.raises(exc) as e:
        serve(raw, status=status).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert (e.value.type, e.value.code) == (etype, code)


def test_write_error_unknown_kind_uses_status():
    assert orjson.loads(codec.write_error(429, "weird", "x"))["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize("raw,message", [
    (b'{"error": {"message": "Incorrect API key provided.", "type": "invalid_request_error"}}',
     "Incorrect API key provided."),
    (b'{"error": "flat"}', "flat"),
    (b'{"message": "top"}', "top"),
    (b'[{"error": {"message": "wrapped"}}]', "wrapped"),
    (b'{"error": {"type": "x"}}', None),
    (b"<html>502</html>", None),
    (b"[]", None),
])
def test_read_error_detail_message(raw, message):
    assert codec.read_error_detail(raw)[0] == message


def test_write_model_list():
    raw = codec.write_model_list(["pool-a", "gpt-4o"])
    assert orjson.loads(raw) == {"object": "list", "data": [
        {"id": "pool-a", "object": "model", "created": 0, "owned_by": "busbar"},
        {"id": "gpt-4o", "object": "model", "created": 0, "owned_by": "busbar"}]}
    models = sdk_client(lambda r: httpx2.Response(200, content=raw)).models.list()
    assert [m.id for m in models] == ["pool-a", "gpt-4o"]


def test_decoder_drops_fragments_of_closed_tool_calls():
    data = sse(chunk({"tool_calls": [{"index": 0, "id": "a", "function": {"name": "f", "arguments": "{"}}]}),
               chunk({"tool_calls": [{"index": 1, "id": "b", "function": {"name": "g", "arguments": "{}"}}]}),
               chunk({"tool_calls": [{"index": 0, "function": {"arguments": "}"}}]}),
               chunk({}, "tool_calls"), b"[DONE]")
    events = decode(data)
    check_order(events)
    assert [(e.index, e.text) for e in events if e.kind == ir.BLOCK_DELTA] == [(0, "{"), (1, "{}")]


# The conversation field given as a string, a number, an object or null: a wrong type is reported
# as a wrong type (never as missing), in openai's own words (jsonget's getters, OpenAIShape).
@pytest.mark.parametrize("value, message", [
    ('hi', "Invalid type for 'messages': expected an array, but got a string instead."),
    (3, "Invalid type for 'messages': expected an array, but got an integer instead."),
    (2.5, "Invalid type for 'messages': expected an array, but got a decimal instead."),
    ({'role': 'user'}, "Invalid type for 'messages': expected an array, but got an object instead."),
    (None, "Missing required parameter: 'messages'."),
])
def test_read_request_conversation_field_type(value, message):
    import orjson as _orjson
    from cbusbar import ir as _ir
    from cbusbar.proto import openai as _codec
    body = {'model': 'x'}
    body['messages'] = value
    if message is None:
        _codec.read_request(_orjson.dumps(body))
        return
    with pytest.raises(_ir.CodecError) as e:
        _codec.read_request(_orjson.dumps(body))
    assert str(e.value) == message


# ---------------------------------------------------------------------------------------------
# Refusals and arguments that are not JSON (issue #34 (7)): nothing the model said vanishes


def test_read_response_content_parts_keep_a_refusal_part():
    # the Rust gateway's resp_o2a_multipart input: text, text, refusal
    resp = codec.read_response(completion({"content": [
        {"type": "text", "text": "part one "}, {"type": "text", "text": "part two"},
        {"type": "refusal", "refusal": "no thanks"}]}, finish="length"))
    assert [(b.kind, b.text, b.refusal) for b in resp.content] == [
        (ir.TEXT, "part one ", False), (ir.TEXT, "part two", False), (ir.TEXT, "no thanks", True)]
    assert resp.stop_reason == ir.MAX_TOKENS
    resp = codec.read_response(completion({"content": None, "refusal": "I can't."}))
    assert [(b.text, b.refusal) for b in resp.content] == [("I can't.", True)]
    assert resp.stop_reason == ir.REFUSAL


def test_write_response_refusal_is_the_refusal_field():
    raw = codec.write_response(_resp([ir.Block(ir.TEXT, "Some context. "),
                                      ir.refusal_block("I can't help with that.")], ir.REFUSAL))
    msg = ChatCompletion.model_validate_json(raw).choices[0].message
    assert (msg.content, msg.refusal) == ("Some context. ", "I can't help with that.")
    msg = ChatCompletion.model_validate_json(codec.write_response(
        _resp([ir.refusal_block("No.")], ir.REFUSAL))).choices[0].message
    assert (msg.content, msg.refusal) == (None, "No.")


def test_request_refusal_round_trip():
    req = codec.read_request(body(messages=[
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "no"}]},
        {"role": "assistant", "content": None, "refusal": "never"}]))
    assert [[(b.text, b.refusal) for b in m.content] for m in req.messages[1:]] == [
        [("a", False), ("no", True)], [("never", True)]]
    out = orjson.loads(codec.write_request(req))["messages"]
    assert out[1:] == [{"role": "assistant", "content": "a", "refusal": "no"},
                       {"role": "assistant", "content": "", "refusal": "never"}]


def test_decoder_refusal_gets_its_own_block():
    events = decode(sse(chunk({"role": "assistant", "content": ""}), chunk({"content": "Here. "}),
                        chunk({"refusal": "I can't "}), chunk({"refusal": "do that."}),
                        chunk({"content": "Bye."}), chunk(finish="stop"), b"[DONE]"), 9)
    check_order(events)
    starts = [(e.index, e.block.refusal) for e in events if e.kind == ir.BLOCK_START]
    assert starts == [(0, False), (1, True), (2, False)]
    assert [(e.index, e.text) for e in events if e.kind == ir.BLOCK_DELTA] == [
        (0, "Here. "), (1, "I can't "), (1, "do that."), (2, "Bye.")]
    assert events[-2].stop_reason == ir.REFUSAL


def test_encoder_refusal_block_streams_as_delta_refusal():
    events = [ir.ev_message_start("u", "m", ir.Usage(input_tokens=3)),
              ir.ev_block_start(0, ir.Block(ir.TEXT, "")), ir.ev_block_delta(0, ir.DELTA_TEXT, "Here. "),
              ir.ev_block_stop(0),
              ir.ev_block_start(1, ir.refusal_block("")), ir.ev_block_delta(1, ir.DELTA_TEXT, "I can't."),
              ir.ev_block_stop(1),
              ir.ev_message_delta(ir.REFUSAL, None, ir.Usage(3, 4)), ir.ev_message_stop()]
    enc = codec.StreamEncoder("chatcmpl-xyz", "target-model")
    client = serve(enc.encode(events), content_type="text/event-stream")
    with client.chat.completions.stream(model="m", messages=[{"role": "user", "content": "x"}]) as s:
        final = s.get_final_completion()
    assert (final.choices[0].message.content, final.choices[0].message.refusal) == ("Here. ", "I can't.")


def test_arguments_that_are_not_json_keep_their_text():
    resp = codec.read_response(completion({"content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "not json"}},
        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": ""}}]}, finish="tool_calls"))
    assert [b.input for b in resp.content] == ["not json", {}]
    # An object protocol's client got {"_raw_arguments": text} (arguments.object_of) and sends the
    # call back: OpenAI gets the model's text as it was.
    req = _req([ir.Message(ir.USER, [ir.text_block("q")]),
                ir.Message(ir.ASSISTANT, [ir.Block(ir.TOOL_USE, id="c1", name="f",
                                                   input={"_raw_arguments": "not json"}),
                                          ir.Block(ir.TOOL_USE, id="c2", name="f",
                                                   input={"_raw_arguments": "x", "other": 1})])])
    calls = orjson.loads(codec.write_request(req))["messages"][1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [
        "not json", '{"_raw_arguments":"x","other":1}']   # only the wrapper alone is unwrapped
