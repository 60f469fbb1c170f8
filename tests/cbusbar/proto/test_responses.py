"""The OpenAI Responses codec, fed bytes; its output is checked against the openai SDK's own types
and, for streams, the SDK's own accumulator (driven over an in-process transport, no network)."""
import random

import httpx2
import openai
import orjson
import pytest
from openai.types.responses import Response as SDKResponse
from openai.types.responses import ResponseStreamEvent
from openai.types.responses.response_create_params import ResponseCreateParamsNonStreaming
from pydantic import TypeAdapter

from cbusbar import ir
from cbusbar.proto import responses as R

EVENT = TypeAdapter(ResponseStreamEvent)
CREATE = TypeAdapter(ResponseCreateParamsNonStreaming)


def body(**fields):
    return orjson.dumps({"model": "gpt-x", **fields})


def frames(raw):
    """(event name, payload) pairs of an SSE byte stream."""
    out = []
    for chunk in raw.decode().split("\n\n"):
        if not chunk:
            continue
        lines = chunk.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        out.append((lines[0][7:], orjson.loads(lines[1][6:])))
    return out


def sdk_client(payload, content_type="text/event-stream"):
    def handler(request):
        return httpx2.Response(200, headers={"content-type": content_type}, content=payload)
    return openai.OpenAI(api_key="k", base_url="http://busbar.test/v1", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
                         _strict_response_validation=True)


def sdk_stream(payload):
    with sdk_client(payload).responses.stream(model="gpt-x", input="hi") as stream:
        seen = [ev.type for ev in stream]
        return seen, stream.get_final_response()


def decode(raw, step):
    dec = R.StreamDecoder()
    out = []
    for i in range(0, len(raw), step):
        out += dec.feed(raw[i:i + step])
    return out + dec.close()


def summary(events):
    """Events as comparable tuples: the content, not the object identities."""
    out = []
    for e in events:
        if e.kind == ir.BLOCK_START:
            out.append(("start", e.index, e.block.kind, e.block.id, e.block.name))
        elif e.kind == ir.BLOCK_DELTA:
            out.append(("delta", e.index, e.delta_kind, e.text if e.text is not None else e.data))
        elif e.kind == ir.BLOCK_STOP:
            out.append(("stop", e.index))
        elif e.kind == ir.MESSAGE_START:
            out.append(("message_start", e.id, e.model))
        elif e.kind == ir.MESSAGE_DELTA:
            out.append(("message_delta", e.stop_reason, e.usage.to_dict()))
        elif e.kind == ir.MESSAGE_STOP:
            out.append(("message_stop",))
        elif e.kind == ir.EVENT_ERROR:
            out.append(("error", e.error_kind, e.message))
    return out


def merged(events):
    """Adjacent deltas of one block and kind joined, so any chunking compares equal."""
    out = []
    for s in summary(events):
        if s[0] == "delta" and out and out[-1][0] == "delta" and out[-1][1:3] == s[1:3] \
                and s[2] != ir.DELTA_CITATION:
            out[-1] = ("delta", s[1], s[2], out[-1][3] + s[3])
        else:
            out.append(s)
    return out


# ---------------------------------------------------------------------------------------------
# Module surface


def test_module_surface():
    assert R.NAME == "responses"
    assert R.CONTENT_TYPE == b"application/json"
    assert R.STREAM_CONTENT_TYPE == b"text/event-stream"
    assert R.upstream_path("gpt-x", False) == "/v1/responses"
    assert R.upstream_path("gpt-x", True) == "/v1/responses"
    a, b = R.mint_id(), R.mint_id()
    assert a.startswith("resp_") and len(a) == 53 and a != b
    int(a[5:], 16)


# ---------------------------------------------------------------------------------------------
# read_request


def test_read_string_input_and_instructions():
    req = R.read_request(body(instructions="Be brief.", input="Hello", stream=True,
                              max_output_tokens=300, temperature=0.7, top_p=0.9, user="u1",
                              top_logprobs=2))
    assert req.model == "gpt-x" and req.stream is True
    assert [b.text for b in req.system] == ["Be brief."]
    assert len(req.messages) == 1 and req.messages[0].role == ir.USER
    assert req.messages[0].content[0].kind == ir.TEXT
    assert req.messages[0].content[0].text == "Hello"
    assert req.max_tokens == 300 and req.temperature == 0.7 and req.top_p == 0.9
    assert req.user == "u1" and req.top_logprobs == 2
    assert req.extra == {}


def test_read_item_list():
    req = R.read_request(body(input=[
        {"role": "system", "content": "sys one"},
        {"role": "developer", "content": [{"type": "input_text", "text": "dev two"}]},
        {"role": "user", "content": [
            {"type": "input_text", "text": "look"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"},
            {"type": "input_image", "image_url": "https://example.com/a.jpg", "detail": "low"},
            {"type": "input_image", "file_id": "file-123", "detail": "auto"},
            {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="},
        ]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "step 1"},
                                                        {"type": "summary_text", "text": "step 2"}],
         "encrypted_content": "gAAAA"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "call_a", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call", "call_id": "call_b", "name": "time", "arguments": ""},
        {"type": "function_call_output", "call_id": "call_a", "output": "18C"},
        {"type": "function_call_output", "call_id": "call_b",
         "output": [{"type": "input_text", "text": "noon"}]},
        {"role": "user", "content": "thanks"},
    ]))
    assert [b.text for b in req.system] == ["sys one", "dev two"]
    roles = [m.role for m in req.messages]
    assert roles == [ir.USER, ir.ASSISTANT, ir.USER, ir.USER]
    user = req.messages[0].content
    assert [b.kind for b in user] == [ir.TEXT, ir.IMAGE, ir.IMAGE, ir.IMAGE, ir.DOCUMENT]
    assert (user[1].src_kind, user[1].media_type, user[1].data) == (
        ir.SOURCE_BASE64, "image/png", "iVBORw0KGgo=")
    assert (user[2].src_kind, user[2].data) == (ir.SOURCE_URL, "https://example.com/a.jpg")
    assert (user[3].src_kind, user[3].data) == (ir.SOURCE_VENDOR, "file-123")
    assert (user[4].src_kind, user[4].media_type, user[4].data, user[4].name) == (
        ir.SOURCE_BASE64, "application/pdf", "JVBERi0=", "a.pdf")
    asst = req.messages[1].content
    assert [b.kind for b in asst] == [ir.THINKING, ir.TEXT, ir.TOOL_USE, ir.TOOL_USE]
    assert asst[0].text == "step 1\n\nstep 2" and asst[0].signature == "gAAAA" and asst[0].id == "rs_1"
    assert asst[1].text == "Checking."
    assert (asst[2].id, asst[2].name, asst[2].input) == ("call_a", "weather", {"city": "Paris"})
    assert asst[3].input == {}
    results = req.messages[2].content
    assert [(b.kind, b.id) for b in results] == [(ir.TOOL_RESULT, "call_a"), (ir.TOOL_RESULT, "call_b")]
    assert results[0].content[0].text == "18C" and results[1].content[0].text == "noon"
    assert req.messages[3].content[0].text == "thanks"


def test_read_tools_choice_format_reasoning_and_extra():
    tools = [
        {"type": "function", "name": "weather", "description": "Get weather",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": True},
        {"type": "web_search_preview"},
    ]
    req = R.read_request(body(
        input="hi", tools=tools, tool_choice={"type": "function", "name": "weather"},
        parallel_tool_calls=False,
        text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"},
                         "strict": True}, "verbosity": "low"},
        reasoning={"effort": "high", "summary": "auto"},
        previous_response_id="resp_prev", store=False, truncation="auto",
        include=["reasoning.encrypted_content"], metadata={"k": "v"}))
    assert [(t.name, t.description) for t in req.tools] == [("weather", "Get weather")]
    assert req.tools[0].schema == tools[0]["parameters"]
    assert req.tool_choice == ir.TOOL_CHOICE_TOOL and req.tool_choice_name == "weather"
    assert req.parallel_tool_calls is False
    assert req.response_format == ir.FORMAT_JSON_SCHEMA
    assert (req.rf_name, req.rf_schema, req.rf_strict) == ("out", {"type": "object"}, True)
    assert req.reasoning_effort == "high"
    for key in ("previous_response_id", "store", "truncation", "include", "metadata", "tools",
                "text", "reasoning"):
        assert key in req.extra


@pytest.mark.parametrize("choice,want", [
    ("auto", ir.TOOL_CHOICE_AUTO), ("none", ir.TOOL_CHOICE_NONE),
    ("required", ir.TOOL_CHOICE_REQUIRED)])
def test_read_tool_choice_words(choice, want):
    assert R.read_request(body(input="x", tool_choice=choice)).tool_choice == want


def test_read_hosted_tool_choice_goes_to_extra():
    req = R.read_request(body(input="x", tool_choice={"type": "file_search"}))
    assert req.tool_choice == ir.TOOL_CHOICE_UNSET
    assert req.extra["tool_choice"] == {"type": "file_search"}


@pytest.mark.parametrize("fmt,want", [
    ({"type": "text"}, ir.FORMAT_TEXT), ({"type": "json_object"}, ir.FORMAT_JSON_OBJECT)])
def test_read_text_formats(fmt, want):
    assert R.read_request(body(input="x", text={"format": fmt})).response_format == want


@pytest.mark.parametrize("raw,message", [
    (b"{not json", "We could not parse the JSON body of your request."),
    (b"", "We could not parse the JSON body of your request."),
    (b"[1, 2]", "The request body must be a JSON object."),
    (b'{"input": "x"}', "Missing required parameter: 'model'."),
    (b'{"model": "", "input": "x"}', "Missing required parameter: 'model'."),
    (b'{"model": 5}', "Invalid type for 'model': expected a string, but got an integer instead."),
    (b'{"model": "m", "input": 5}',
     "Invalid type for 'input': expected one of a string or array of objects, but got an integer instead."),
    (b'{"model": "m", "input": [5]}', "Invalid type for 'input': expected an object, but got an integer instead."),
    (b'{"model": "m", "input": [{"role": "robot", "content": "x"}]}', None),
    (b'{"model": "m", "input": [{"role": "user"}]}', None),
    (b'{"model": "m", "input": [{"type": "function_call", "name": "f"}]}', None),
    (b'{"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}', None),
    (b'{"model": "m", "max_output_tokens": true}', None),
    (b'{"model": "m", "temperature": "hot"}', None),
    (b'{"model": "m", "tools": {}}', None),
    (b'{"model": "m", "tools": [{"type": "function"}]}', None),
    (b'{"model": "m", "tool_choice": "sometimes"}', None),
    (b'{"model": "m", "text": {"format": {"type": "xml"}}}', None),
    (b'{"model": "m", "text": {"format": {"type": "json_schema", "name": "n"}}}', None),
    (b'{"model": "m", "reasoning": "high"}', None),
    (b'{"model": "m", "stream": "yes"}', None),
])
def test_read_rejects_bad_shapes(raw, message):
    with pytest.raises(ir.CodecError) as err:
        R.read_request(raw)
    if message is not None:
        assert str(err.value) == message


def test_read_never_raises_anything_but_codec_error():
    base = orjson.loads(body(
        instructions="s", input=[
            {"role": "user", "content": [{"type": "input_text", "text": "a"},
                                         {"type": "input_image", "image_url": "data:image/png;base64,AA"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c", "output": "r"},
            {"type": "reasoning", "id": "rs", "summary": [{"type": "summary_text", "text": "t"}]}],
        tools=[{"type": "function", "name": "f", "parameters": {}}],
        text={"format": {"type": "json_schema", "name": "n", "schema": {}}},
        reasoning={"effort": "low"}, tool_choice="auto"))
    junk = [None, 0, -1, 1.5, True, "", "x", [], {}, [None], {"type": None}]
    rng = random.Random(7)

    def paths(node, path=()):
        yield path
        if isinstance(node, dict):
            for k, v in node.items():
                yield from paths(v, path + (k,))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield from paths(v, path + (i,))

    all_paths = [p for p in paths(base) if p]
    for _ in range(1500):
        doc = orjson.loads(orjson.dumps(base))
        path = rng.choice(all_paths)
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = rng.choice(junk)
        try:
            R.read_request(orjson.dumps(doc))
        except ir.CodecError:
            pass


# ---------------------------------------------------------------------------------------------
# write_request


def _request(**kw):
    req = ir.Request()
    req.model = "target"
    for k, v in kw.items():
        setattr(req, k, v)
    return req


def test_write_request_items_and_fields():
    img = ir.Block(ir.IMAGE, src_kind=ir.SOURCE_BASE64, media_type="image/jpeg", data="/9j/")
    url = ir.Block(ir.IMAGE, src_kind=ir.SOURCE_URL, data="https://example.com/x.png")
    doc = ir.Block(ir.DOCUMENT, src_kind=ir.SOURCE_BASE64, media_type="application/pdf",
                   data="JVBERi0=", name="r.pdf")
    think = ir.Block(ir.THINKING, "I should call.", signature="enc")
    unsigned = ir.Block(ir.THINKING, "no signature")
    call = ir.Block(ir.TOOL_USE, id="toolu_1", name="weather", input={"city": "Paris"})
    result = ir.Block(ir.TOOL_RESULT, id="toolu_1", content=[ir.text_block("18C")])
    req = _request(
        system=[ir.text_block("Be brief."), ir.text_block("Be kind.")],
        messages=[
            ir.Message(ir.USER, [ir.text_block("Look"), img, url, doc]),
            ir.Message(ir.ASSISTANT, [unsigned, think, ir.text_block("Let me check."), call]),
            ir.Message(ir.USER, [result, ir.text_block("and?")]),
        ],
        tools=[ir.Tool("weather", "Get weather", {"type": "object", "properties": {}})],
        tool_choice=ir.TOOL_CHOICE_REQUIRED, parallel_tool_calls=True,
        max_tokens=500, temperature=0.7, top_p=0.5, user="u", stream=True,
        stop=["x"], seed=3, n=2, top_k=5, frequency_penalty=0.1)
    out = orjson.loads(R.write_request(req))
    assert out == {
        "model": "target",
        "instructions": "Be brief.\n\nBe kind.",
        "input": [
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Look"},
                {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/", "detail": "auto"},
                {"type": "input_image", "image_url": "https://example.com/x.png", "detail": "auto"},
                {"type": "input_file", "filename": "r.pdf", "file_data": "data:application/pdf;base64,JVBERi0="},
            ]},
            {"type": "reasoning", "id": "rs_1_1", "summary": [{"type": "summary_text", "text": "I should call."}],
             "encrypted_content": "enc"},
            {"type": "message", "role": "assistant", "content": "Let me check."},
            {"type": "function_call", "call_id": "toolu_1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "toolu_1", "output": "18C"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "and?"}]},
        ],
        "tools": [{"type": "function", "strict": False, "name": "weather", "description": "Get weather",
                   "parameters": {"type": "object", "properties": {}}}],
        "tool_choice": "required",
        "parallel_tool_calls": True,
        "max_output_tokens": 500, "temperature": 0.7, "top_p": 0.5, "user": "u", "stream": True,
    }
    out.pop("stream")
    CREATE.validate_python(out)


def test_write_request_tool_result_with_image_uses_part_list():
    img = ir.Block(ir.IMAGE, src_kind=ir.SOURCE_BASE64, media_type="image/png", data="AA==")
    result = ir.Block(ir.TOOL_RESULT, id="c1", content=[ir.text_block("chart:"), img])
    out = orjson.loads(R.write_request(_request(messages=[ir.Message(ir.USER, [result])])))
    assert out["input"] == [{"type": "function_call_output", "call_id": "c1", "output": [
        {"type": "input_text", "text": "chart:"},
        {"type": "input_image", "image_url": "data:image/png;base64,AA==", "detail": "auto"}]}]
    CREATE.validate_python(out)


def test_write_request_omits_tool_choice_without_tools():
    req = _request(messages=[ir.Message(ir.USER, [ir.text_block("x")])],
                   tool_choice=ir.TOOL_CHOICE_AUTO, parallel_tool_calls=False)
    out = orjson.loads(R.write_request(req))
    assert "tool_choice" not in out and "tools" not in out and "parallel_tool_calls" not in out


def test_write_request_named_tool_choice_and_formats():
    req = _request(tools=[ir.Tool("f")], tool_choice=ir.TOOL_CHOICE_TOOL, tool_choice_name="f",
                   response_format=ir.FORMAT_JSON_SCHEMA, rf_name="out",
                   rf_schema={"type": "object"}, rf_strict=True)
    out = orjson.loads(R.write_request(req))
    assert out["tool_choice"] == {"type": "function", "name": "f"}
    assert out["tools"][0]["parameters"] == {"type": "object", "properties": {}}
    assert out["text"] == {"format": {"type": "json_schema", "name": "out",
                                      "schema": {"type": "object"}, "strict": True}}
    CREATE.validate_python(out)
    out = orjson.loads(R.write_request(_request(response_format=ir.FORMAT_JSON_OBJECT)))
    assert out["text"] == {"format": {"type": "json_object"}}


@pytest.mark.parametrize("budget,effort", [
    (1, "minimal"), (1024, "minimal"), (1025, "low"), (4096, "low"), (8192, "medium"),
    (8193, "high"), (32000, "high"), (-1, "medium"), (0, None)])
def test_write_request_reasoning_budget(budget, effort):
    out = orjson.loads(R.write_request(_request(reasoning_budget=budget)))
    if effort is None:
        assert "reasoning" not in out and "include" not in out
    else:
        assert out["reasoning"] == {"effort": effort}
        assert out["include"] == ["reasoning.encrypted_content"]


def test_write_request_effort_word_wins():
    out = orjson.loads(R.write_request(_request(reasoning_effort="low", reasoning_budget=20000)))
    assert out["reasoning"] == {"effort": "low"}


def test_same_protocol_round_trip_keeps_native_fields():
    original = {
        "model": "gpt-x", "instructions": "sys",
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True,
                   "description": "d"},
                  {"type": "web_search_preview"}],
        "tool_choice": {"type": "web_search_preview"},
        "text": {"format": {"type": "json_schema", "name": "o", "schema": {"type": "object"},
                            "description": "the output"}, "verbosity": "low"},
        "reasoning": {"effort": "medium", "summary": "auto"},
        "previous_response_id": "resp_1", "store": False, "metadata": {"a": "b"},
        "include": ["file_search_call.results"],
    }
    out = orjson.loads(R.write_request(R.read_request(orjson.dumps(original))))
    assert out == original


def test_write_request_ignores_foreign_extra_keys_it_overlays():
    req = _request(tools=[ir.Tool("f")])
    req.extra = {"tools": "not a list", "text": 3, "reasoning": None}
    out = orjson.loads(R.write_request(req))
    assert out["tools"] == [{"type": "function", "strict": False, "name": "f",
                             "parameters": {"type": "object", "properties": {}}}]
    assert "text" not in out and "reasoning" not in out


# ---------------------------------------------------------------------------------------------
# Buffered responses

UPSTREAM = {
    "id": "resp_up", "object": "response", "created_at": 1741476542, "status": "completed",
    "error": None, "incomplete_details": None, "model": "gpt-4.1-2025-04-14",
    "output": [
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Thinking"}],
         "encrypted_content": "gAAA"},
        {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello", "annotations": []}]},
        {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
         "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
    ],
    "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
    "usage": {"input_tokens": 36, "input_tokens_details": {"cached_tokens": 10},
              "output_tokens": 87, "output_tokens_details": {"reasoning_tokens": 20},
              "total_tokens": 123},
}


def test_read_response():
    resp = R.read_response(orjson.dumps(UPSTREAM))
    assert (resp.id, resp.model, resp.created) == ("resp_up", "gpt-4.1-2025-04-14", 1741476542)
    assert [b.kind for b in resp.content] == [ir.THINKING, ir.TEXT, ir.TOOL_USE]
    assert resp.content[0].text == "Thinking" and resp.content[0].signature == "gAAA"
    assert resp.content[1].text == "Hello"
    assert (resp.content[2].id, resp.content[2].name, resp.content[2].input) == (
        "call_1", "weather", {"city": "Paris"})
    assert resp.stop_reason == ir.TOOL_USE_STOP
    assert resp.usage.to_dict() == {"input_tokens": 36, "output_tokens": 87, "cache_read_tokens": 10,
                                    "cache_write_tokens": 0, "reasoning_tokens": 20}


@pytest.mark.parametrize("status,details,want", [
    ("completed", None, ir.END_TURN),
    ("incomplete", {"reason": "max_output_tokens"}, ir.MAX_TOKENS),
    ("incomplete", {"reason": "content_filter"}, ir.SAFETY),
    ("failed", None, ir.ERROR)])
def test_read_response_stop_reasons(status, details, want):
    doc = dict(UPSTREAM, status=status, incomplete_details=details, output=UPSTREAM["output"][:2])
    assert R.read_response(orjson.dumps(doc)).stop_reason == want


def test_read_response_refusal():
    doc = dict(UPSTREAM, output=[{"id": "m", "type": "message", "role": "assistant", "status": "completed",
                                  "content": [{"type": "refusal", "refusal": "I can't."}]}])
    resp = R.read_response(orjson.dumps(doc))
    assert resp.content[0].text == "I can't." and resp.stop_reason == ir.REFUSAL


def test_read_response_tolerates_odd_upstreams():
    resp = R.read_response(b'{"output": [null, {"type": "message", "content": [7]}], "usage": 3}')
    assert resp.content == [] and resp.usage.input_tokens == 0
    with pytest.raises(ir.CodecError):
        R.read_response(b"[]")
    with pytest.raises(ir.CodecError):
        R.read_response(b"<html>")


def _response(content, stop, usage=None):
    resp = ir.Response()
    resp.id = "resp_x1"
    resp.model = "target-model"
    resp.created = 1700000000
    resp.content = content
    resp.stop_reason = stop
    resp.usage = usage or ir.Usage(input_tokens=20, output_tokens=7, cache_read_tokens=4,
                                   cache_write_tokens=6, reasoning_tokens=2)
    return resp


def test_write_response_validates_with_the_sdk():
    content = [ir.Block(ir.THINKING, "hmm", signature="sig"),
               ir.Block(ir.TEXT, "Hi", citations=[{"type": "url_citation", "url_citation": {
                   "start_index": 0, "end_index": 2, "title": "T", "url": "https://x"}},
                   {"type": "char_location", "cited_text": "x"}]),
               ir.Block(ir.TOOL_USE, id="toolu_9", name="f", input={"a": 1})]
    raw = R.write_response(_response(content, ir.TOOL_USE_STOP))
    sdk = SDKResponse.model_validate_json(raw)
    assert sdk.id == "resp_x1" and sdk.status == "completed" and sdk.output_text == "Hi"
    assert [o.type for o in sdk.output] == ["reasoning", "message", "function_call"]
    assert [o.id for o in sdk.output] == ["rs_x1_0", "msg_x1_1", "fc_x1_2"]
    assert sdk.output[0].encrypted_content == "sig"
    assert sdk.output[1].content[0].annotations[0].url == "https://x"
    assert len(sdk.output[1].content[0].annotations) == 1
    call = sdk.output[2]
    assert (call.call_id, call.name, call.arguments, call.status) == ("toolu_9", "f", '{"a":1}', "completed")
    assert sdk.usage.input_tokens == 20 and sdk.usage.input_tokens_details.cached_tokens == 4
    assert sdk.usage.input_tokens_details.cache_write_tokens == 6
    assert sdk.usage.output_tokens_details.reasoning_tokens == 2 and sdk.usage.total_tokens == 27
    # And through the client, with the SDK's strict validation on.
    got = sdk_client(raw, "application/json").responses.create(model="gpt-x", input="hi")
    assert got.output_text == "Hi"


@pytest.mark.parametrize("stop,status,reason", [
    (ir.MAX_TOKENS, "incomplete", "max_output_tokens"),
    (ir.SAFETY, "incomplete", "content_filter"),
    (ir.END_TURN, "completed", None), (ir.STOP_SEQUENCE, "completed", None),
    (ir.REFUSAL, "completed", None), (ir.ERROR, "completed", None)])
def test_write_response_status(stop, status, reason):
    sdk = SDKResponse.model_validate_json(R.write_response(_response([ir.text_block("x")], stop)))
    assert sdk.status == status
    assert (sdk.incomplete_details.reason if sdk.incomplete_details else None) == reason
    assert sdk.output[0].status == ("incomplete" if reason else "completed")


def test_write_response_logprobs_and_empty():
    resp = _response([ir.text_block("Hi")], ir.END_TURN)
    resp.logprobs = [{"token": "Hi", "logprob": -0.1, "top_logprobs": [{"token": "Hi", "logprob": -0.1}]}]
    sdk = SDKResponse.model_validate_json(R.write_response(resp))
    assert sdk.output[0].content[0].logprobs[0].bytes == [72, 105]
    resp = _response([], ir.END_TURN, ir.Usage())
    resp.created = None
    sdk = SDKResponse.model_validate_json(R.write_response(resp))
    assert sdk.output == [] and sdk.created_at > 1700000000


def test_read_usage():
    u = R.read_usage(orjson.dumps(UPSTREAM))
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.reasoning_tokens) == (36, 87, 10, 20)
    assert R.read_usage(b'{"id": "x", "usage": null}').input_tokens == 0
    assert R.read_usage(b'{"id": "x"}').output_tokens == 0
    with pytest.raises(ir.CodecError):
        R.read_usage(b"nope")


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("kind,type_,code", [
    ("invalid_request", "invalid_request_error", None),
    ("authentication", "authentication_error", "invalid_api_key"),
    ("quota", "insufficient_quota", "insufficient_quota"),
    ("rate_limit", "rate_limit_error", None),
    ("api_error", "server_error", None)])
def test_write_error(kind, type_, code):
    out = orjson.loads(R.write_error(ir.STATUS_OF_KIND[kind], kind, "msg", "req_1"))
    assert out == {"error": {"message": "msg", "type": type_, "param": None, "code": code}}


def test_write_error_unknown_kind_uses_status():
    assert orjson.loads(R.write_error(404, "???", "m"))["error"]["type"] == "not_found_error"


def test_read_error_detail_message():
    assert R.read_error_detail(b'{"error": {"message": "Bad key", "type": "x"}}')[0] == "Bad key"
    assert R.read_error_detail(b'{"error": "plain"}')[0] == "plain"
    assert R.read_error_detail(b'{"message": "top"}')[0] == "top"
    assert R.read_error_detail(b"<html>502</html>")[0] is None
    assert R.read_error_detail(b"[]")[0] is None


# ---------------------------------------------------------------------------------------------
# StreamDecoder

def sse(*events):
    return b"".join(b"event: " + t.encode() + b"\ndata: " + orjson.dumps(dict(d, type=t)) + b"\n\n"
                    for t, d in events)


RESP_OBJ = {"id": "resp_s", "object": "response", "created_at": 1, "status": "in_progress",
            "model": "gpt-4.1", "output": [], "usage": None}
USAGE = {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 2}, "output_tokens": 9,
         "output_tokens_details": {"reasoning_tokens": 3}, "total_tokens": 21}

TEXT_STREAM = sse(
    ("response.created", {"sequence_number": 0, "response": RESP_OBJ}),
    ("response.in_progress", {"sequence_number": 1, "response": RESP_OBJ}),
    ("response.output_item.added", {"output_index": 0, "item": {
        "id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
    ("response.content_part.added", {"item_id": "msg_1", "output_index": 0, "content_index": 0,
                                     "part": {"type": "output_text", "text": "", "annotations": []}}),
    ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0,
                                    "delta": "Hel", "logprobs": []}),
    ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0,
                                    "delta": "lo \u00e9\u4e16", "logprobs": []}),
    ("response.output_text.done", {"item_id": "msg_1", "output_index": 0, "content_index": 0,
                                   "text": "Hello \u00e9\u4e16"}),
    ("response.output_item.done", {"output_index": 0, "item": {
        "id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": "Hello \u00e9\u4e16", "annotations": []}]}}),
    ("response.completed", {"response": dict(RESP_OBJ, status="completed", usage=USAGE)}),
)

TEXT_EVENTS = [
    ("message_start", "resp_s", "gpt-4.1"),
    ("start", 0, ir.TEXT, None, None),
    ("delta", 0, ir.DELTA_TEXT, "Hello \u00e9\u4e16"),
    ("stop", 0),
    ("message_delta", ir.END_TURN, {"input_tokens": 12, "output_tokens": 9, "cache_read_tokens": 2,
                                    "cache_write_tokens": 0, "reasoning_tokens": 3}),
    ("message_stop",),
]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 64, 100000])
def test_decode_text_stream_any_split(step):
    assert merged(decode(TEXT_STREAM, step)) == TEXT_EVENTS


def test_decode_crlf_and_comments():
    raw = b": keep-alive\r\n\r\n" + TEXT_STREAM.replace(b"\n", b"\r\n")
    assert merged(decode(raw, 5)) == TEXT_EVENTS


CALL_STREAM = sse(
    ("response.created", {"response": RESP_OBJ}),
    ("response.output_item.added", {"output_index": 0, "item": {
        "id": "fc_1", "type": "function_call", "status": "in_progress", "arguments": "",
        "call_id": "call_A", "name": "weather"}}),
    ("response.function_call_arguments.delta", {"item_id": "fc_1", "output_index": 0, "delta": "{\"ci"}),
    ("response.function_call_arguments.delta", {"item_id": "fc_1", "output_index": 0, "delta": "ty\":\"P\"}"}),
    ("response.function_call_arguments.done", {"item_id": "fc_1", "output_index": 0,
                                               "arguments": "{\"city\":\"P\"}"}),
    ("response.output_item.done", {"output_index": 0, "item": {
        "id": "fc_1", "type": "function_call", "status": "completed", "arguments": "{\"city\":\"P\"}",
        "call_id": "call_A", "name": "weather"}}),
    ("response.output_item.added", {"output_index": 1, "item": {
        "id": "fc_2", "type": "function_call", "status": "in_progress", "arguments": "",
        "call_id": "call_B", "name": "time"}}),
    ("response.function_call_arguments.done", {"item_id": "fc_2", "output_index": 1, "arguments": "{}"}),
    ("response.output_item.done", {"output_index": 1, "item": {
        "id": "fc_2", "type": "function_call", "status": "completed", "arguments": "{}",
        "call_id": "call_B", "name": "time"}}),
    ("response.completed", {"response": dict(RESP_OBJ, status="completed", usage=USAGE)}),
)


@pytest.mark.parametrize("step", [1, 7, 100000])
def test_decode_function_call_stream(step):
    got = merged(decode(CALL_STREAM, step))
    assert got[:7] == [
        ("message_start", "resp_s", "gpt-4.1"),
        ("start", 0, ir.TOOL_USE, "call_A", "weather"),
        ("delta", 0, ir.DELTA_INPUT_JSON, "{\"city\":\"P\"}"),
        ("stop", 0),
        ("start", 1, ir.TOOL_USE, "call_B", "time"),
        ("delta", 1, ir.DELTA_INPUT_JSON, "{}"),
        ("stop", 1),
    ]
    assert got[7][:2] == ("message_delta", ir.TOOL_USE_STOP) and got[8] == ("message_stop",)


def test_decode_reasoning_stream():
    raw = sse(
        ("response.created", {"response": RESP_OBJ}),
        ("response.output_item.added", {"output_index": 0, "item": {"id": "rs_1", "type": "reasoning", "summary": []}}),
        ("response.reasoning_summary_part.added", {"item_id": "rs_1", "output_index": 0, "summary_index": 0,
                                                   "part": {"type": "summary_text", "text": ""}}),
        ("response.reasoning_summary_text.delta", {"item_id": "rs_1", "output_index": 0, "summary_index": 0,
                                                   "delta": "First"}),
        ("response.reasoning_summary_part.added", {"item_id": "rs_1", "output_index": 0, "summary_index": 1,
                                                   "part": {"type": "summary_text", "text": ""}}),
        ("response.reasoning_summary_text.delta", {"item_id": "rs_1", "output_index": 0, "summary_index": 1,
                                                   "delta": "Second"}),
        ("response.output_item.done", {"output_index": 0, "item": {
            "id": "rs_1", "type": "reasoning", "encrypted_content": "gAAAA",
            "summary": [{"type": "summary_text", "text": "First"}, {"type": "summary_text", "text": "Second"}]}}),
        ("response.output_item.added", {"output_index": 1, "item": {
            "id": "rs_2", "type": "reasoning", "summary": []}}),
        ("response.reasoning_text.delta", {"item_id": "rs_2", "output_index": 1, "content_index": 0,
                                           "delta": "raw thought"}),
        ("response.output_item.done", {"output_index": 1, "item": {"id": "rs_2", "type": "reasoning", "summary": []}}),
        ("response.output_text.delta", {"item_id": "msg_9", "output_index": 2, "content_index": 0,
                                        "delta": "Answer"}),
        ("response.completed", {"response": dict(RESP_OBJ, status="completed", usage=USAGE)}),
    )
    got = merged(decode(raw, 9))
    assert got[1:-2] == [
        ("start", 0, ir.THINKING, None, None),
        ("delta", 0, ir.DELTA_THINKING, "First\n\nSecond"),
        ("delta", 0, ir.DELTA_SIGNATURE, "gAAAA"),
        ("stop", 0),
        ("start", 1, ir.THINKING, None, None),
        ("delta", 1, ir.DELTA_THINKING, "raw thought"),
        ("stop", 1),
        ("start", 2, ir.TEXT, None, None),   # no output_item.added upstream: synthesised
        ("delta", 2, ir.DELTA_TEXT, "Answer"),
        ("stop", 2),
    ]
    assert got[-2][1] == ir.END_TURN


@pytest.mark.parametrize("reason,want", [("max_output_tokens", ir.MAX_TOKENS), ("content_filter", ir.SAFETY)])
def test_decode_incomplete(reason, want):
    raw = TEXT_STREAM.split(b"event: response.completed")[0] + sse(
        ("response.incomplete", {"response": dict(RESP_OBJ, status="incomplete",
                                                  incomplete_details={"reason": reason}, usage=USAGE)}))
    got = merged(decode(raw, 11))
    assert got[-2][:2] == ("message_delta", want) and got[-1] == ("message_stop",)


def test_decode_failed_and_error_events():
    failed = sse(("response.created", {"response": RESP_OBJ}),
                 ("response.failed", {"response": dict(RESP_OBJ, status="failed", error={
                     "code": "rate_limit_exceeded", "message": "Slow down"})}),
                 ("response.completed", {"response": RESP_OBJ}))
    assert summary(decode(failed, 4))[1:] == [("error", "rate_limit", "Slow down")]
    err = sse(("error", {"code": "server_error", "message": "boom", "param": None}))
    assert summary(decode(err, 4)) == [("message_start", None, None), ("error", "api_error", "boom")]


def test_decode_whole_items_and_output_only():
    # A compatible server that sends finished items without deltas.
    raw = sse(("response.created", {"response": RESP_OBJ}),
              ("response.output_item.done", {"output_index": 0, "item": {
                  "id": "m", "type": "message", "role": "assistant", "status": "completed",
                  "content": [{"type": "output_text", "text": "whole", "annotations": []}]}}),
              ("response.completed", {"response": dict(RESP_OBJ, status="completed", usage=USAGE)}))
    assert merged(decode(raw, 3))[1:4] == [("start", 0, ir.TEXT, None, None),
                                           ("delta", 0, ir.DELTA_TEXT, "whole"), ("stop", 0)]
    # One that streams nothing but the completed response.
    raw = sse(("response.completed", {"response": dict(UPSTREAM, usage=USAGE)}))
    got = merged(decode(raw, 3))
    assert got[0] == ("message_start", "resp_up", "gpt-4.1-2025-04-14")
    assert [g[0] for g in got[1:-2]] == ["start", "delta", "delta", "stop", "start", "delta", "stop",
                                         "start", "delta", "stop"]
    assert got[-2][1] == ir.TOOL_USE_STOP


@pytest.mark.parametrize("frame", [b"data: not json\n\n",
                                   b"event: response.output_text.delta\ndata: [1,2]\n\n"])
def test_decode_malformed_frame_is_a_codec_error(frame):
    # Issue 7: one policy in every codec. These frames used to be skipped silently here.
    with pytest.raises(ir.CodecError) as e:
        decode(frame, 3)
    assert str(e.value) == "The upstream sent a stream frame busbar could not read."
    with pytest.raises(ir.CodecError) as e:
        R.StreamDecoder(max_frame=8).feed(b"data: 0123456789")
    assert str(e.value) == "The upstream sent a stream frame larger than busbar accepts."


def test_decode_garbage_never_crashes():
    junk = (b"data: {\"type\": 5}\n\n" b"event: response.output_item.added\ndata: {\"item\": 3}\n\n"
            b"data: {\"type\": \"response.output_text.delta\", \"delta\": 7}\n\n"
            b"data: {\"type\": \"response.completed\", \"response\": []}\n\n"
            b"data: {\"type\": \"response.output_text.delta\", \"delta\": \"late\"}\n\n")
    got = summary(decode(junk, 3))
    assert got[-2][0] == "message_delta" and got[-1] == ("message_stop",)
    rng = random.Random(3)
    for _ in range(300):
        raw = bytearray(TEXT_STREAM + CALL_STREAM)
        for _ in range(rng.randint(1, 20)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        try:
            decode(bytes(raw), rng.randint(1, 50))
        except ir.CodecError:
            pass


def test_decode_open_stream_close_flushes_without_inventing_an_end():
    raw = TEXT_STREAM.split(b"event: response.output_text.done")[0]
    got = summary(decode(raw[:-2], 5))    # the last frame lacks its blank line
    assert got[-1] == ("delta", 0, ir.DELTA_TEXT, "lo \u00e9\u4e16")


# ---------------------------------------------------------------------------------------------
# StreamEncoder


def encode(events, **attrs):
    enc = R.StreamEncoder("resp_e1", "target-model")
    enc.created = 1700000000
    for k, v in attrs.items():
        setattr(enc, k, v)
    return enc.encode(events)


def ir_stream(stop=ir.TOOL_USE_STOP):
    usage = ir.Usage(input_tokens=30, output_tokens=12, cache_read_tokens=5, reasoning_tokens=4)
    return [
        ir.ev_message_start("up_1", "upstream-model", ir.Usage(input_tokens=30)),
        ir.ev_block_start(0, ir.Block(ir.THINKING)),
        ir.ev_block_delta(0, ir.DELTA_THINKING, "Let me "),
        ir.ev_block_delta(0, ir.DELTA_THINKING, "think."),
        ir.ev_block_delta(0, ir.DELTA_SIGNATURE, "sig=="),
        ir.ev_block_stop(0),
        ir.ev_block_start(1, ir.Block(ir.TEXT)),
        ir.ev_block_delta(1, ir.DELTA_TEXT, "Checking "),
        ir.ev_block_delta(1, ir.DELTA_TEXT, "weather."),
        ir.ev_block_stop(1),
        ir.ev_block_start(2, ir.Block(ir.IMAGE)),
        ir.ev_block_stop(2),
        ir.ev_block_start(3, ir.Block(ir.TOOL_USE, id="toolu_1", name="weather")),
        ir.ev_block_delta(3, ir.DELTA_INPUT_JSON, "{\"city\":"),
        ir.ev_block_delta(3, ir.DELTA_INPUT_JSON, "\"Paris\"}"),
        ir.ev_block_stop(3),
        ir.ev_message_delta(stop, None, usage),
        ir.ev_message_stop(),
    ]


def test_encode_event_sequence_validates():
    raw = encode(ir_stream())
    fr = frames(raw)
    types = [t for t, _ in fr]
    assert types == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done", "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    for i, (t, d) in enumerate(fr):
        assert d["type"] == t and d["sequence_number"] == i
        EVENT.validate_python(d)
    assert b"[DONE]" not in raw
    final = fr[-1][1]["response"]
    assert final["id"] == "resp_e1" and final["model"] == "target-model" and final["created_at"] == 1700000000
    assert [o["id"] for o in final["output"]] == ["rs_e1_0", "msg_e1_1", "fc_e1_2"]
    assert final["output"][0]["encrypted_content"] == "sig=="
    assert final["output"][2]["call_id"] == "toolu_1"
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 5, "cache_write_tokens": 0}


def test_encode_through_the_sdk_accumulator():
    seen, final = sdk_stream(encode(ir_stream()))
    assert seen[0] == "response.created" and seen[-1] == "response.completed"
    assert final.status == "completed" and final.output_text == "Checking weather."
    call = final.output[2]
    assert (call.type, call.call_id, call.name, call.arguments) == (
        "function_call", "toolu_1", "weather", "{\"city\":\"Paris\"}")
    assert final.output[0].summary[0].text == "Let me think."
    assert final.usage.total_tokens == 42


@pytest.mark.parametrize("stop,reason", [(ir.MAX_TOKENS, "max_output_tokens"), (ir.SAFETY, "content_filter")])
def test_encode_incomplete(stop, reason):
    fr = frames(encode(ir_stream(stop)))
    t, d = fr[-1]
    assert t == "response.incomplete"
    assert d["response"]["status"] == "incomplete"
    assert d["response"]["incomplete_details"] == {"reason": reason}
    EVENT.validate_python(d)


def test_encode_is_deterministic_and_chunking_independent():
    events = ir_stream()
    whole = encode(events)
    enc = R.StreamEncoder("resp_e1", "target-model")
    enc.created = 1700000000
    pieces = b"".join(enc.encode([e]) for e in events)
    assert pieces == whole
    assert enc.encode([ir.ev_message_stop()]) == b""   # finished: nothing more


def test_encode_synthesises_missing_starts_and_closes_open_blocks():
    raw = encode([ir.ev_message_start("u", "m", None),
                  ir.ev_block_delta(0, ir.DELTA_TEXT, "orphan"),
                  ir.ev_message_delta(ir.END_TURN, None, ir.Usage(input_tokens=1, output_tokens=1)),
                  ir.ev_message_stop()])
    for _, d in frames(raw):
        EVENT.validate_python(d)
    seen, final = sdk_stream(raw)
    assert final.output_text == "orphan"


def test_encode_citation_and_logprobs():
    text_delta = ir.ev_block_delta(0, ir.DELTA_TEXT, "Hi")
    text_delta.data = [{"token": "Hi", "logprob": -0.5, "top_logprobs": []}]
    cite = ir.ev_block_delta(0, ir.DELTA_CITATION, None)
    cite.data = {"type": "url_citation", "url_citation": {"start_index": 0, "end_index": 2,
                                                          "title": "t", "url": "https://u"}}
    foreign = ir.ev_block_delta(0, ir.DELTA_CITATION, None)
    foreign.data = {"type": "char_location", "cited_text": "x"}
    raw = encode([ir.ev_message_start("u", "m", None), ir.ev_block_start(0, ir.Block(ir.TEXT)),
                  text_delta, cite, foreign, ir.ev_block_stop(0),
                  ir.ev_message_delta(ir.END_TURN, None, ir.Usage()), ir.ev_message_stop()])
    fr = frames(raw)
    for _, d in fr:
        EVENT.validate_python(d)
    kinds = [t for t, _ in fr]
    assert kinds.count("response.output_text.annotation.added") == 1
    delta = [d for t, d in fr if t == "response.output_text.delta"][0]
    assert delta["logprobs"] == [{"token": "Hi", "logprob": -0.5, "top_logprobs": []}]
    seen, final = sdk_stream(raw)
    assert final.output[0].content[0].annotations[0].url == "https://u"


def test_encode_error_mid_stream():
    enc = R.StreamEncoder("resp_e1", "target-model")
    enc.created = 1700000000
    head = enc.encode(ir_stream()[:8])
    tail = enc.error("rate_limit", "Upstream rate limited.")
    fr = frames(head + tail)
    t, d = fr[-1]
    assert t == "response.failed"
    assert d["response"]["status"] == "failed"
    assert d["response"]["error"] == {"code": "rate_limit_exceeded", "message": "Upstream rate limited."}
    assert [o["type"] for o in d["response"]["output"]] == ["reasoning"]   # only finished items
    EVENT.validate_python(d)
    assert enc.error("api_error", "again") == b"" and enc.encode(ir_stream()) == b""
    seen, _ = sdk_stream_failed(head + tail)
    assert seen[-1] == "response.failed"


def sdk_stream_failed(payload):
    with sdk_client(payload).responses.stream(model="gpt-x", input="hi") as stream:
        seen = [ev.type for ev in stream]
        return seen, None


def test_encode_error_before_start_and_error_event():
    fr = frames(encode([ir.ev_error("overloaded", "Try later.")]))
    assert [t for t, _ in fr] == ["response.created", "response.in_progress", "response.failed"]
    assert fr[-1][1]["response"]["error"] == {"code": "server_error", "message": "Try later."}
    for _, d in fr:
        EVENT.validate_python(d)


def test_encode_then_decode_round_trip():
    raw = encode(ir_stream())
    got = merged(decode(raw, 13))
    assert got[0] == ("message_start", "resp_e1", "target-model")
    assert got[1:-2] == [
        ("start", 0, ir.THINKING, None, None), ("delta", 0, ir.DELTA_THINKING, "Let me think."),
        ("delta", 0, ir.DELTA_SIGNATURE, "sig=="), ("stop", 0),
        ("start", 1, ir.TEXT, None, None), ("delta", 1, ir.DELTA_TEXT, "Checking weather."), ("stop", 1),
        ("start", 2, ir.TOOL_USE, "toolu_1", "weather"),
        ("delta", 2, ir.DELTA_INPUT_JSON, "{\"city\":\"Paris\"}"), ("stop", 2)]
    assert got[-2] == ("message_delta", ir.TOOL_USE_STOP, {
        "input_tokens": 30, "output_tokens": 12, "cache_read_tokens": 5, "cache_write_tokens": 0,
        "reasoning_tokens": 4})


def test_buffered_round_trip():
    resp = R.read_response(R.write_response(_response(
        [ir.Block(ir.THINKING, "t", signature="s"), ir.text_block("a"),
         ir.Block(ir.TOOL_USE, id="c", name="f", input={"x": [1]})], ir.TOOL_USE_STOP)))
    assert [(b.kind, b.text, b.id, b.input) for b in resp.content] == [
        (ir.THINKING, "t", "rs_x1_0", None), (ir.TEXT, "a", None, None), (ir.TOOL_USE, None, "c", {"x": [1]})]
    assert resp.content[0].signature == "s" and resp.stop_reason == ir.TOOL_USE_STOP
    assert resp.usage.cache_write_tokens == 6


# The conversation field given as a string, a number, an object or null: a wrong type is reported
# as a wrong type (never as missing), in responses's own words (jsonget's getters, OpenAIShape).
@pytest.mark.parametrize("value, message", [
    ('hi', None),
    (3, "Invalid type for 'input': expected one of a string or array of objects, but got an integer instead."),
    ({'role': 'user'},
     "Invalid type for 'input': expected one of a string or array of objects, but got an object instead."),
    (None, None),
])
def test_read_request_conversation_field_type(value, message):
    import orjson as _orjson
    from cbusbar import ir as _ir
    from cbusbar.proto import responses as _codec
    body = {'model': 'x'}
    body['input'] = value
    if message is None:
        _codec.read_request(_orjson.dumps(body))
        return
    with pytest.raises(_ir.CodecError) as e:
        _codec.read_request(_orjson.dumps(body))
    assert str(e.value) == message


# ---------------------------------------------------------------------------------------------
# Refusals and arguments that are not JSON (issue #34 (7))


def test_refusal_read_and_written_as_a_refusal_part():
    doc = dict(UPSTREAM, output=[{"id": "m", "type": "message", "role": "assistant", "status": "completed",
                                  "content": [{"type": "output_text", "text": "Context. ", "annotations": []},
                                              {"type": "refusal", "refusal": "I can't."}]}])
    resp = R.read_response(orjson.dumps(doc))
    assert [(b.text, b.refusal) for b in resp.content] == [("Context. ", False), ("I can't.", True)]
    resp.id = "resp_x1"
    sdk = SDKResponse.model_validate_json(R.write_response(resp))
    assert [[(c.type, getattr(c, "refusal", None)) for c in o.content] for o in sdk.output] == [
        [("output_text", None)], [("refusal", "I can't.")]]


def test_decode_refusal_stream_and_encode_it_for_the_sdk():
    stream = sse(
        ("response.created", {"response": RESP_OBJ}),
        ("response.output_item.added", {"output_index": 0, "item": {
            "id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
        ("response.content_part.added", {"item_id": "msg_1", "output_index": 0, "content_index": 0,
                                         "part": {"type": "output_text", "text": "", "annotations": []}}),
        ("response.output_text.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 0,
                                        "delta": "Context. "}),
        ("response.content_part.added", {"item_id": "msg_1", "output_index": 0, "content_index": 1,
                                         "part": {"type": "refusal", "refusal": ""}}),
        ("response.refusal.delta", {"item_id": "msg_1", "output_index": 0, "content_index": 1,
                                    "delta": "I can't."}),
        ("response.output_item.done", {"output_index": 0, "item": {
            "id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": "Context. ", "annotations": []},
                        {"type": "refusal", "refusal": "I can't."}]}}),
        ("response.completed", {"response": dict(RESP_OBJ, status="completed", usage=USAGE)}),
    )
    events = decode(stream, 11)
    starts = [(e.index, e.block.refusal) for e in events if e.kind == ir.BLOCK_START]
    assert starts == [(0, False), (1, True)]     # one message, two parts: a block each
    assert [(e.index, e.text) for e in events if e.kind == ir.BLOCK_DELTA] == [(0, "Context. "), (1, "I can't.")]
    assert events[-2].stop_reason == ir.REFUSAL
    raw = encode(events)
    for _, d in frames(raw):
        EVENT.validate_python(d)
    seen, final = sdk_stream(raw)
    assert "response.refusal.delta" in seen and "response.refusal.done" in seen
    assert [[(c.type, getattr(c, "refusal", None) or getattr(c, "text", None)) for c in o.content]
            for o in final.output] == [[("output_text", "Context. ")], [("refusal", "I can't.")]]


def test_decode_whole_message_item_with_a_refusal_part():
    stream = sse(
        ("response.created", {"response": RESP_OBJ}),
        ("response.output_item.done", {"output_index": 0, "item": {
            "id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "refusal", "refusal": "No."}]}}),
        ("response.completed", {"response": dict(RESP_OBJ, status="completed", usage=USAGE)}),
    )
    events = decode(stream, 64)
    assert [(e.kind, e.block.refusal if e.block else None, e.text) for e in events[1:-2]] == [
        (ir.BLOCK_START, True, None), (ir.BLOCK_DELTA, None, "No."), (ir.BLOCK_STOP, None, None)]


def test_function_call_arguments_that_are_not_json_keep_their_text():
    req = R.read_request(body(input=[
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "not json"},
        {"type": "function_call_output", "call_id": "c1", "output": "x"}]))
    assert req.messages[0].content[0].input == "not json"     # was {}: the text was lost
    items = orjson.loads(R.write_request(req))["input"]
    assert items[0]["arguments"] == "not json"
    doc = dict(UPSTREAM, output=[{"id": "fc", "type": "function_call", "status": "completed",
                                  "call_id": "c1", "name": "f", "arguments": "{\"a\": 1"}])
    assert R.read_response(orjson.dumps(doc)).content[0].input == "{\"a\": 1"
