"""The Anthropic Messages codec, fed bytes (docs/codecs.md). The anthropic SDK is the judge of what
busbar writes for Anthropic clients: buffered bodies and every stream event are validated against its
pydantic types, and a real `anthropic.Anthropic` client reads them through a mock transport."""
import random

import anthropic
import httpx2
import orjson
import pydantic
import pytest
from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cbusbar import ir
from cbusbar.proto import anthropic as codec

STREAM_EVENT = pydantic.TypeAdapter(RawMessageStreamEvent)


def body(**fields):
    fields.setdefault("model", "claude-sonnet-4-5")
    fields.setdefault("max_tokens", 1024)
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return orjson.dumps(fields)


def sse(*frames):
    """Anthropic SSE: each frame is a dict (event name = its type) or raw bytes."""
    out = b""
    for f in frames:
        if isinstance(f, bytes):
            out += f
        else:
            out += b"event: " + f["type"].encode() + b"\ndata: " + orjson.dumps(f) + b"\n\n"
    return out


def parse_sse(data):
    """(event, payload) pairs of an SSE byte string written by busbar."""
    out = []
    for frame in data.decode().split("\n\n"):
        if not frame:
            continue
        lines = frame.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ") and len(lines) == 2
        payload = orjson.loads(lines[1][6:])
        assert payload["type"] == lines[0][7:]
        out.append((lines[0][7:], payload))
    return out


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


def msg_start(input_tokens=25, cache_write=0, cache_read=0, id="msg_up", **usage):
    u = {"input_tokens": input_tokens, "cache_creation_input_tokens": cache_write,
         "cache_read_input_tokens": cache_read, "output_tokens": 1}
    u.update(usage)
    return {"type": "message_start", "message": {
        "id": id, "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": u}}


def block_start(index, **block):
    return {"type": "content_block_start", "index": index, "content_block": block}


def block_delta(index, **delta):
    return {"type": "content_block_delta", "index": index, "delta": delta}


def block_stop(index):
    return {"type": "content_block_stop", "index": index}


def msg_delta(stop_reason="end_turn", stop_sequence=None, **usage):
    return {"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": usage or {"output_tokens": 15}}


MSG_STOP = {"type": "message_stop"}
PING = {"type": "ping"}

TEXT_STREAM = sse(
    msg_start(), block_start(0, type="text", text=""), PING,
    block_delta(0, type="text_delta", text="Hello"), block_delta(0, type="text_delta", text=", wörld 👋"),
    block_stop(0), msg_delta(output_tokens=15), MSG_STOP)

TOOL_STREAM = sse(
    msg_start(input_tokens=472),
    block_start(0, type="text", text=""), block_delta(0, type="text_delta", text="Checking."), block_stop(0),
    block_start(1, type="tool_use", id="toolu_01", name="get_weather", input={}),
    block_delta(1, type="input_json_delta", partial_json=""),
    block_delta(1, type="input_json_delta", partial_json='{"city": "Pa'),
    block_delta(1, type="input_json_delta", partial_json='ris"}'),
    block_stop(1), msg_delta("tool_use", output_tokens=89), MSG_STOP)

THINKING_STREAM = sse(
    msg_start(input_tokens=40),
    block_start(0, type="thinking", thinking="", signature=""),
    block_delta(0, type="thinking_delta", thinking="Let me think. "),
    block_delta(0, type="thinking_delta", thinking="27 * 453 = 12231."),
    block_delta(0, type="signature_delta", signature="EqQBsig"),
    block_stop(0),
    block_start(1, type="redacted_thinking", data="EmwKopaque"), block_stop(1),
    block_start(2, type="text", text=""), block_delta(2, type="text_delta", text="12,231."), block_stop(2),
    msg_delta(output_tokens=180), MSG_STOP)


# ---------------------------------------------------------------------------------------------
# module surface


def test_module_names():
    assert codec.NAME == "anthropic"
    assert codec.CONTENT_TYPE == b"application/json"
    assert codec.STREAM_CONTENT_TYPE == b"text/event-stream"
    assert codec.upstream_path("claude-sonnet-4-5", False) == "/v1/messages"
    assert codec.upstream_path("claude-sonnet-4-5", True) == "/v1/messages"


def test_mint_id_shape_and_uniqueness():
    ids = {codec.mint_id() for _ in range(2000)}
    assert len(ids) == 2000
    for i in ids:
        assert i.startswith("msg_01") and len(i) == 28
        assert i[6:].isalnum() and i[6:].isascii()


# ---------------------------------------------------------------------------------------------
# read_request


def test_read_request_malformed_json():
    for raw in (b"{", b"", b"nope", b'{"model": "x",}', b"\xff\xfe"):
        with pytest.raises(ir.CodecError) as e:
            codec.read_request(raw)
        assert str(e.value) == "We could not parse the JSON body of your request."


def test_read_request_full_shape():
    req = codec.read_request(body(
        model="claude-opus-4-1",
        max_tokens=2048,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Use metric units."}],
        messages=[
            {"role": "user", "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"},
                 "cache_control": {"type": "ephemeral", "ttl": "1h"}},
                {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}},
                {"type": "image", "source": {"type": "file", "file_id": "file_011abc"}},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
                 "title": "Report", "citations": {"enabled": True}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain words"}},
                {"type": "document", "source": {"type": "url", "url": "https://x.test/r.pdf"}},
                {"type": "document", "source": {"type": "content", "content": [
                    {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}},
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "sig1"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Calling.", "citations": [
                    {"type": "char_location", "cited_text": "x", "document_index": 0, "document_title": None,
                     "start_char_index": 0, "end_char_index": 1}]},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"q": 1},
                 "cache_control": {"type": "ephemeral"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "found", "is_error": False},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True, "content": [
                    {"type": "text", "text": "boom"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}}]},
            ]},
        ],
        tools=[{"name": "lookup", "description": "Find things.", "input_schema": {"type": "object"},
                "cache_control": {"type": "ephemeral"}},
               {"type": "custom", "name": "other", "input_schema": {"type": "object", "properties": {}}},
               {"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        temperature=0.7, top_p=0.9, top_k=40, stop_sequences=["END", "STOP"], stream=True,
        metadata={"user_id": "user-9", "trace": "t1"},
        thinking={"type": "enabled", "budget_tokens": 1500},
        service_tier="auto", container="cntr_1", mcp_servers=[{"type": "url", "url": "https://m.test"}],
    ))
    assert req.model == "claude-opus-4-1"
    assert req.max_tokens == 2048 and req.stream is True
    assert [b.text for b in req.system] == ["Be brief.", "Use metric units."]
    assert req.system[0].cache_control == {"type": "ephemeral"} and req.system[1].cache_control is None

    user, assistant, results = req.messages
    assert user.role == ir.USER and assistant.role == ir.ASSISTANT and results.role == ir.USER
    text, b64, url, vendor, pdf, plain, pdf_url, doc_content = user.content
    assert text.kind == ir.TEXT and text.text == "Look:"
    assert (b64.kind, b64.src_kind, b64.media_type, b64.data) == (ir.IMAGE, ir.SOURCE_BASE64, "image/png", "iVBO")
    assert b64.cache_control == {"type": "ephemeral", "ttl": "1h"}
    assert (url.src_kind, url.data) == (ir.SOURCE_URL, "https://x.test/a.jpg")
    assert (vendor.src_kind, vendor.data) == (ir.SOURCE_VENDOR, "file_011abc")
    assert (pdf.kind, pdf.src_kind, pdf.media_type, pdf.data, pdf.name) == (
        ir.DOCUMENT, ir.SOURCE_BASE64, "application/pdf", "JVBE", "Report")
    assert pdf.citations == {"enabled": True}
    assert (plain.kind, plain.src_kind, plain.text) == (ir.DOCUMENT, ir.SRC_NONE_, "plain words")
    assert (pdf_url.src_kind, pdf_url.data) == (ir.SOURCE_URL, "https://x.test/r.pdf")
    assert doc_content.text == "one\ntwo"

    thinking, redacted, said, call = assistant.content
    assert (thinking.kind, thinking.text, thinking.signature, thinking.redacted) == (ir.THINKING, "hmm", "sig1", False)
    assert (redacted.kind, redacted.redacted, redacted.data) == (ir.THINKING, True, "opaque")
    assert said.citations[0]["type"] == "char_location"
    assert (call.kind, call.id, call.name, call.input) == (ir.TOOL_USE, "toolu_1", "lookup", {"q": 1})
    assert call.cache_control == {"type": "ephemeral"}

    ok, failed = results.content
    assert (ok.kind, ok.id, ok.is_error) == (ir.TOOL_RESULT, "toolu_1", False)
    assert [b.text for b in ok.content] == ["found"]
    assert failed.is_error is True
    assert [b.kind for b in failed.content] == [ir.TEXT, ir.IMAGE]

    assert [t.name for t in req.tools] == ["lookup", "other"]
    assert req.tools[0].description == "Find things." and req.tools[0].cache_control == {"type": "ephemeral"}
    assert req.tool_choice == ir.TOOL_CHOICE_REQUIRED and req.parallel_tool_calls is False
    assert (req.temperature, req.top_p, req.top_k) == (0.7, 0.9, 40)
    assert req.stop == ["END", "STOP"]
    assert req.user == "user-9"
    assert req.reasoning_budget == 1500
    assert req.extra == {
        "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}],
        "metadata": {"trace": "t1"}, "service_tier": "auto", "container": "cntr_1",
        "mcp_servers": [{"type": "url", "url": "https://m.test"}]}


def test_read_request_integral_floats_are_integers():
    req = codec.read_request(body(max_tokens=1024.0, top_k=40.0))
    assert (req.max_tokens, req.top_k) == (1024, 40) and type(req.max_tokens) is int


def test_read_request_minimal_and_string_content():
    req = codec.read_request(orjson.dumps({"messages": [{"role": "user", "content": "hello"}]}))
    assert req.model is None and req.max_tokens is None and req.stream is False
    assert req.tool_choice == ir.TOOL_CHOICE_UNSET and req.parallel_tool_calls is None
    assert req.system == [] and req.extra == {}
    assert req.messages[0].content[0].text == "hello"
    req = codec.read_request(body(system="Be kind."))
    assert [b.text for b in req.system] == ["Be kind."]


@pytest.mark.parametrize("tc,choice,name,parallel", [
    ({"type": "auto"}, ir.TOOL_CHOICE_AUTO, None, None),
    ({"type": "any"}, ir.TOOL_CHOICE_REQUIRED, None, None),
    ({"type": "none"}, ir.TOOL_CHOICE_NONE, None, None),
    ({"type": "tool", "name": "f"}, ir.TOOL_CHOICE_TOOL, "f", None),
    ({"type": "auto", "disable_parallel_tool_use": False}, ir.TOOL_CHOICE_AUTO, None, True),
    ({"type": "tool", "name": "f", "disable_parallel_tool_use": True}, ir.TOOL_CHOICE_TOOL, "f", False),
])
def test_read_request_tool_choice(tc, choice, name, parallel):
    req = codec.read_request(body(tools=[{"name": "f", "input_schema": {"type": "object"}}], tool_choice=tc))
    assert (req.tool_choice, req.tool_choice_name, req.parallel_tool_calls) == (choice, name, parallel)


def test_read_request_other_thinking_modes_stay_same_protocol():
    for mode in ({"type": "adaptive"}, {"type": "disabled"}):
        req = codec.read_request(body(thinking=mode))
        assert req.reasoning_budget is None and req.extra == {"thinking": mode}


def test_read_request_system_role_messages_join_the_system_prompt():
    req = codec.read_request(body(system="first", messages=[
        {"role": "user", "content": "hi"}, {"role": "system", "content": [{"type": "text", "text": "second"}]},
        {"role": "assistant", "content": "hello"}]))
    assert [b.text for b in req.system] == ["first", "second"]
    assert [m.role for m in req.messages] == [ir.USER, ir.ASSISTANT]


def test_read_request_drops_block_types_without_ir_home():
    req = codec.read_request(body(messages=[
        {"role": "user", "content": [{"type": "search_result", "source": "s", "title": "t", "content": []},
                                     {"type": "text", "text": "q"}]},
        {"role": "assistant", "content": [
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
            {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
            {"type": "text", "text": "a"}]}]))
    assert [[b.text for b in m.content] for m in req.messages] == [["q"], ["a"]]


def test_read_request_native_structured_output():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    req = codec.read_request(body(output_config={"format": {"type": "json_schema", "schema": schema}}))
    assert req.response_format == ir.FORMAT_JSON_SCHEMA and req.rf_schema == schema
    assert req.extra == {"output_config": {"format": {"type": "json_schema", "schema": schema}}}
    # Same protocol: the native field is relayed, nothing is forced.
    assert codec.forced_tool_name(req) is None
    out = orjson.loads(codec.write_request(req))
    assert out["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    assert "tools" not in out and "tool_choice" not in out


@pytest.mark.parametrize("fields,message", [
    ({"messages": None}, "messages: Field required"),
    ({"messages": {"role": "user"}}, "messages: Input should be a valid list"),
    ({"messages": ["hi"]}, "messages.0: Input should be a valid dictionary"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role: Input should be 'user' or 'assistant'"),
    ({"messages": [{"role": "user"}]}, "messages.0.content: Field required"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content: Input should be a valid string or list"),
    ({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, "messages.0.content.0.type: Field required"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
     "messages.0.content.0.text: Input should be a valid string"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "ftp"}}]}]},
     "messages.0.content.0.source.type: Input should be 'base64', 'url' or 'file'"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}]},
     "messages.0.content.0.source: Field required"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]},
     "messages.0.content.0.is_error: Input should be a valid boolean"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 7}]}]},
     "messages.0.content.0.content: Input should be a valid string or list"),
    ({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": {}}]}]},
     "messages.0.content.0.id: Field required"),
    ({"model": 7}, "model: Input should be a valid string"),
    ({"max_tokens": "100"}, "max_tokens: Input should be a valid integer"),
    ({"max_tokens": True}, "max_tokens: Input should be a valid integer"),
    ({"temperature": "hot"}, "temperature: Input should be a valid number"),
    ({"top_k": 1.5}, "top_k: Input should be a valid integer"),
    ({"stream": "yes"}, "stream: Input should be a valid boolean"),
    ({"stop_sequences": "END"}, "stop_sequences: Input should be a valid list"),
    ({"stop_sequences": ["a", 1]}, "stop_sequences.1: Input should be a valid string"),
    ({"system": 5}, "system: Input should be a valid string or list"),
    ({"system": [{"type": "image"}]}, "system.0.type: Input should be 'text'"),
    ({"tools": {}}, "tools: Input should be a valid list"),
    ({"tools": [{"name": "f"}]}, "tools.0.input_schema: Field required"),
    ({"tools": [{"input_schema": {}}]}, "tools.0.name: Field required"),
    ({"tool_choice": "auto"}, "tool_choice: Input should be a valid dictionary"),
    ({"tool_choice": {"type": "required"}}, "tool_choice.type: Input should be 'auto', 'any', 'tool' or 'none'"),
    ({"tool_choice": {"type": "tool"}}, "tool_choice.name: Field required"),
    ({"metadata": {"user_id": 5}}, "metadata.user_id: Input should be a valid string"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens: Field required"),
    ({"thinking": "on"}, "thinking: Input should be a valid dictionary"),
])
def test_read_request_bad_shapes(fields, message):
    d = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
    d.update(fields)
    if d["messages"] is None:
        del d["messages"]
    with pytest.raises(ir.CodecError) as e:
        codec.read_request(orjson.dumps(d))
    assert str(e.value) == message


def test_read_request_not_an_object():
    for raw in (b"[]", b'"text"', b"null", b"3"):
        with pytest.raises(ir.CodecError):
            codec.read_request(raw)


def _mutations(value, rng):
    """Yields copies of a JSON value with one node replaced by a value of another type."""
    junk = [None, 0, -1, 1.5, "", "x", [], {}, [None], {"type": None}, True]
    paths = []

    def walk(v, path):
        paths.append(path)
        if isinstance(v, dict):
            for k in v:
                walk(v[k], path + (k,))
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(x, path + (i,))
    walk(value, ())
    for path in paths[1:]:
        for j in rng.sample(junk, 4):
            copy = orjson.loads(orjson.dumps(value))
            node = copy
            for p in path[:-1]:
                node = node[p]
            node[path[-1]] = j
            yield copy


def test_read_request_never_raises_anything_but_codec_error():
    seed = orjson.loads(body(
        system=[{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}},
                {"type": "document", "source": {"type": "content", "content": [{"type": "text", "text": "d"}]}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                                              {"type": "tool_use", "id": "a", "name": "f", "input": {"k": 1}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": [{"type": "text", "text": "r"}]}]}],
        tools=[{"name": "f", "input_schema": {"type": "object"}}],
        tool_choice={"type": "tool", "name": "f", "disable_parallel_tool_use": True},
        metadata={"user_id": "u"}, thinking={"type": "enabled", "budget_tokens": 2000},
        stop_sequences=["x"], output_config={"format": {"type": "json_schema", "schema": {}}}))
    rng = random.Random(7)
    n = 0
    for mutated in _mutations(seed, rng):
        n += 1
        try:
            req = codec.read_request(orjson.dumps(mutated))
        except ir.CodecError:
            continue
        codec.write_request(req)  # whatever was accepted can be written back
    assert n > 200


# ---------------------------------------------------------------------------------------------
# write_request


def make_request(messages=(), **fields):
    req = ir.Request()
    req.model = "claude-target"
    req.max_tokens = 1024
    req.messages = list(messages)
    for k, v in fields.items():
        setattr(req, k, v)
    return req


def user(*blocks):
    return ir.Message(ir.USER, [ir.text_block(b) if isinstance(b, str) else b for b in blocks])


def assistant(*blocks):
    return ir.Message(ir.ASSISTANT, [ir.text_block(b) if isinstance(b, str) else b for b in blocks])


def written(req):
    return orjson.loads(codec.write_request(req))


def test_write_request_basics():
    req = make_request([user("hi")], max_tokens=None, temperature=0.7, top_p=0.8, top_k=5,
                       stop=["a", "b", "c", "d", "e", "f"], stream=True, user="u1", seed=3, n=2,
                       frequency_penalty=0.1, presence_penalty=0.2, logprobs=True, top_logprobs=3)
    req.system = [ir.text_block("sys"), ir.text_block("")]
    out = written(req)
    assert out == {
        "model": "claude-target", "max_tokens": 4096,
        "system": [{"type": "text", "text": "sys"}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "temperature": 0.7, "top_p": 0.8, "top_k": 5, "stop_sequences": ["a", "b", "c", "d", "e", "f"],
        "stream": True, "metadata": {"user_id": "u1"}}


def test_write_request_clamps_temperature_to_anthropic_range():
    assert written(make_request([user("hi")], temperature=1.6))["temperature"] == 1.0
    assert written(make_request([user("hi")], temperature=0))["temperature"] == 0


def test_write_request_merges_roles_and_drops_what_anthropic_rejects():
    unsigned = ir.Block(ir.THINKING, "musing")
    signed = ir.Block(ir.THINKING, "reason", signature="sig")
    redacted = ir.Block(ir.THINKING, redacted=True, data="opaque")
    call = ir.Block(ir.TOOL_USE, id="call.1:x", name="f", input={"a": 1})
    result = ir.Block(ir.TOOL_RESULT, id="call.1:x", content=[ir.text_block("42")], is_error=True)
    out = written(make_request([
        user("a"), user(""), user("b"),
        assistant(unsigned), assistant(signed, redacted, "", call),
        user("after", result),
    ]))
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "reason", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "tool_use", "id": "call_1_x", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "call_1_x", "content": [{"type": "text", "text": "42"}],
             "is_error": True},
            {"type": "text", "text": "after"}]},
    ]


def test_write_request_tool_input_always_an_object():
    calls = [ir.Block(ir.TOOL_USE, id="a", name="f", input='{"x": 1}'),
             ir.Block(ir.TOOL_USE, id="b", name="f", input="not json"),
             ir.Block(ir.TOOL_USE, id="c", name="f", input=None),
             ir.Block(ir.TOOL_USE, id="d", name="f", input=[1, 2])]
    out = written(make_request([user("q"), assistant(*calls)]))
    # text that is not one object arrives whole under _raw_arguments (arguments.object_of)
    assert [b["input"] for b in out["messages"][1]["content"]] == [
        {"x": 1}, {"_raw_arguments": "not json"}, {}, {"_raw_arguments": "[1,2]"}]


def test_write_request_sources():
    blocks = [
        ir.Block(ir.IMAGE, src_kind=ir.SOURCE_BASE64, media_type="image/jpeg", data="/9j/"),
        ir.Block(ir.IMAGE, src_kind=ir.SOURCE_URL, data="https://x.test/a.png"),
        ir.Block(ir.IMAGE, src_kind=ir.SOURCE_URL, data="data:image/gif;base64,R0lG"),
        ir.Block(ir.IMAGE, src_kind=ir.SOURCE_VENDOR, data="file-openai123"),
        ir.Block(ir.IMAGE, src_kind=ir.SOURCE_VENDOR, data="gs://bucket/a.png"),
        ir.Block(ir.IMAGE, src_kind=ir.SOURCE_VENDOR, data="file_011anthropic"),
        ir.Block(ir.DOCUMENT, src_kind=ir.SOURCE_BASE64, media_type="application/pdf", data="JVBE", name="Doc",
                 citations={"enabled": True}),
        ir.Block(ir.DOCUMENT, src_kind=ir.SOURCE_BASE64, media_type="text/csv", data="YSxiCjEsMg=="),
        ir.Block(ir.DOCUMENT, src_kind=ir.SOURCE_BASE64, media_type="application/msword", data="0M8R"),
        ir.Block(ir.DOCUMENT, "inline text"),
        ir.Block(ir.DOCUMENT, src_kind=ir.SOURCE_URL, data="https://x.test/r.pdf"),
    ]
    out = written(make_request([user(*blocks)]))
    assert out["messages"][0]["content"] == [
        {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/"}},
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0lG"}},
        {"type": "image", "source": {"type": "file", "file_id": "file_011anthropic"}},
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBE"},
         "title": "Doc", "citations": {"enabled": True}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "a,b\n1,2"}},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "inline text"}},
        {"type": "document", "source": {"type": "url", "url": "https://x.test/r.pdf"}},
    ]


def test_write_request_tool_result_content_blocks():
    result = ir.Block(ir.TOOL_RESULT, id="t1", content=[
        ir.text_block(""), ir.text_block("see image"),
        ir.Block(ir.IMAGE, src_kind=ir.SOURCE_BASE64, media_type="image/png", data="iVBO"),
        ir.Block(ir.THINKING, "not allowed here", signature="s")])
    empty = ir.Block(ir.TOOL_RESULT, id="t2", content=[])
    out = written(make_request([user(result, empty)]))
    assert out["messages"][0]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "see image"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]},
        {"type": "tool_result", "tool_use_id": "t2"}]


def tool(name="f", schema=None):
    return ir.Tool(name, "does f", schema if schema is not None else {"type": "object", "properties": {}})


@pytest.mark.parametrize("choice,name,parallel,expected", [
    (ir.TOOL_CHOICE_UNSET, None, None, None),
    (ir.TOOL_CHOICE_AUTO, None, None, {"type": "auto"}),
    (ir.TOOL_CHOICE_NONE, None, None, {"type": "none"}),
    (ir.TOOL_CHOICE_REQUIRED, None, None, {"type": "any"}),
    (ir.TOOL_CHOICE_TOOL, "f", None, {"type": "tool", "name": "f"}),
    (ir.TOOL_CHOICE_UNSET, None, False, {"type": "auto", "disable_parallel_tool_use": True}),
    (ir.TOOL_CHOICE_REQUIRED, None, False, {"type": "any", "disable_parallel_tool_use": True}),
    (ir.TOOL_CHOICE_NONE, None, False, {"type": "none"}),
    (ir.TOOL_CHOICE_AUTO, None, True, {"type": "auto"}),
])
def test_write_request_tool_choice(choice, name, parallel, expected):
    out = written(make_request([user("q")], tools=[tool()], tool_choice=choice, tool_choice_name=name,
                               parallel_tool_calls=parallel))
    assert out["tools"] == [
        {"name": "f", "description": "does f", "input_schema": {"type": "object", "properties": {}}}]
    assert out.get("tool_choice") == expected


def test_write_request_no_tools_no_tool_choice():
    out = written(make_request([user("q")], tool_choice=ir.TOOL_CHOICE_REQUIRED, parallel_tool_calls=False))
    assert "tools" not in out and "tool_choice" not in out


def test_write_request_tool_schema_gets_object_type():
    out = written(make_request([user("q")], tools=[tool("a", {}), tool("b", {"properties": {"x": {}}})]))
    assert [t["input_schema"] for t in out["tools"]] == [
        {"type": "object", "properties": {}}, {"properties": {"x": {}}, "type": "object"}]


def test_write_request_cache_breakpoints_clamped_to_four():
    eph = {"type": "ephemeral"}
    tools = [ir.Tool("a", None, {"type": "object"}, eph), ir.Tool("b", None, {"type": "object"}, eph)]
    sys_block = ir.text_block("sys")
    sys_block.cache_control = eph
    blocks = []
    for t in ("one", "two", "three"):
        b = ir.text_block(t)
        b.cache_control = eph
        blocks.append(b)
    req = make_request([user(*blocks)], tools=tools)
    req.system = [sys_block]
    out = written(req)
    marked = [t.get("cache_control") for t in out["tools"]] + [s.get("cache_control") for s in out["system"]] + [
        b.get("cache_control") for b in out["messages"][0]["content"]]
    assert marked == [eph, eph, eph, eph, None, None]


def test_write_request_reasoning():
    # effort words -> budgets
    for effort, budget in (("minimal", 1024), ("low", 4096), ("medium", 8192), ("high", 16384)):
        out = written(make_request([user("q")], max_tokens=32000, reasoning_effort=effort, temperature=0.3,
                                   top_k=10, top_p=0.99))
        assert out["thinking"] == {"type": "enabled", "budget_tokens": budget}
        assert "temperature" not in out and "top_k" not in out and out["top_p"] == 0.99
    # clamped to leave 1024 answer tokens
    out = written(make_request([user("q")], max_tokens=5000, reasoning_budget=10000))
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 3976}
    # raised to Anthropic's minimum
    out = written(make_request([user("q")], max_tokens=5000, reasoning_budget=100))
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    # max_tokens too small: thinking dropped, sampling kept
    out = written(make_request([user("q")], max_tokens=2047, reasoning_effort="low", temperature=0.3))
    assert "thinking" not in out and out["temperature"] == 0.3
    out = written(make_request([user("q")], max_tokens=2048, reasoning_effort="low", top_p=0.5))
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 1024} and "top_p" not in out
    # zero budget means off; an unknown effort word is ignored
    assert "thinking" not in written(make_request([user("q")], reasoning_budget=0))
    assert "thinking" not in written(make_request([user("q")], reasoning_effort="none"))
    # Gemini's dynamic budget (-1) becomes medium
    out = written(make_request([user("q")], max_tokens=20000, reasoning_budget=-1))
    assert out["thinking"]["budget_tokens"] == 8192


def test_write_request_thinking_dropped_where_anthropic_rejects_it():
    # a forced tool choice
    out = written(make_request([user("q")], max_tokens=20000, reasoning_effort="low", tools=[tool()],
                               tool_choice=ir.TOOL_CHOICE_REQUIRED))
    assert "thinking" not in out and out["tool_choice"] == {"type": "any"}
    # mid tool loop whose calling turn carries no thinking block (history from a non-thinking vendor)
    call = ir.Block(ir.TOOL_USE, id="t1", name="f", input={})
    result = ir.Block(ir.TOOL_RESULT, id="t1", content=[ir.text_block("r")])
    out = written(make_request([user("q"), assistant(call), user(result)], max_tokens=20000,
                               reasoning_effort="low", tools=[tool()]))
    assert "thinking" not in out
    # the same loop with a signed thinking block first is fine
    signed = ir.Block(ir.THINKING, "t", signature="s")
    out = written(make_request([user("q"), assistant(signed, call), user(result)], max_tokens=20000,
                               reasoning_effort="low", tools=[tool()]))
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    # a finished tool loop followed by a new question is fine
    out = written(make_request([user("q"), assistant(call), user(result), assistant("done"), user("next")],
                               max_tokens=20000, reasoning_effort="low", tools=[tool()]))
    assert "thinking" in out


def test_write_request_structured_output_forces_a_tool():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    req = make_request([user("q")], response_format=ir.FORMAT_JSON_SCHEMA, rf_name="answer", rf_schema=schema)
    out = written(req)
    assert codec.forced_tool_name(req) == "answer"
    assert out["tools"] == [{"name": "answer", "description": "Respond with JSON that matches this schema.",
                             "input_schema": schema}]
    assert out["tool_choice"] == {"type": "tool", "name": "answer"}

    req = make_request([user("q")], response_format=ir.FORMAT_JSON_OBJECT)
    out = written(req)
    assert codec.forced_tool_name(req) == "structured_output"
    assert out["tools"][0]["input_schema"] == {"type": "object"}
    assert out["tool_choice"] == {"type": "tool", "name": "structured_output"}

    for rf in (ir.FORMAT_UNSET, ir.FORMAT_TEXT):
        req = make_request([user("q")], response_format=rf)
        assert codec.forced_tool_name(req) is None and "tools" not in written(req)


def test_write_request_structured_output_with_caller_tools():
    schema = {"type": "object"}
    base = dict(tools=[tool()], response_format=ir.FORMAT_JSON_SCHEMA, rf_schema=schema)
    out = written(make_request([user("q")], **base))
    assert [t["name"] for t in out["tools"]] == ["f", "structured_output"]
    assert out["tool_choice"] == {"type": "any"}
    out = written(make_request([user("q")], tool_choice=ir.TOOL_CHOICE_NONE, **base))
    assert out["tool_choice"] == {"type": "tool", "name": "structured_output"}
    out = written(make_request([user("q")], tool_choice=ir.TOOL_CHOICE_TOOL, tool_choice_name="f",
                               parallel_tool_calls=False, **base))
    assert out["tool_choice"] == {"type": "tool", "name": "f", "disable_parallel_tool_use": True}


def test_same_protocol_round_trip_keeps_extras():
    original = {
        "model": "claude-sonnet-4-5", "max_tokens": 100,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "metadata": {"user_id": "u", "trace": "t"}, "thinking": {"type": "adaptive"},
        "temperature": 0.5, "service_tier": "auto", "container": "c1",
    }
    out = written(codec.read_request(orjson.dumps(original)))
    assert out == original


# ---------------------------------------------------------------------------------------------
# read_response / write_response / read_usage


RESPONSE = {
    "id": "msg_01up", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
    "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "sig"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Answer.", "citations": [
            {"type": "page_location", "cited_text": "x", "document_index": 0, "document_title": "D",
             "start_page_number": 1, "end_page_number": 2}]},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
        {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": [1, 2]}},
    ],
    "stop_reason": "tool_use", "stop_sequence": None,
    "usage": {"input_tokens": 25, "cache_creation_input_tokens": 1200, "cache_read_input_tokens": 3000,
              "output_tokens": 15, "output_tokens_details": {"thinking_tokens": 9}},
}


def test_read_response():
    resp = codec.read_response(orjson.dumps(RESPONSE))
    assert resp.id == "msg_01up" and resp.model == "claude-sonnet-4-5"
    assert [b.kind for b in resp.content] == [ir.THINKING, ir.THINKING, ir.TEXT, ir.TOOL_USE]
    assert (resp.content[0].text, resp.content[0].signature) == ("hmm", "sig")
    assert (resp.content[1].redacted, resp.content[1].data) == (True, "opaque")
    assert resp.content[2].citations[0]["type"] == "page_location"
    assert (resp.content[3].id, resp.content[3].name, resp.content[3].input) == ("toolu_1", "f", {"a": [1, 2]})
    assert resp.stop_reason == ir.TOOL_USE_STOP and resp.stop_sequence is None
    u = resp.usage
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens, u.reasoning_tokens) == (
        4225, 15, 3000, 1200, 9)


@pytest.mark.parametrize("wire,stop", [
    ("end_turn", ir.END_TURN), ("max_tokens", ir.MAX_TOKENS), ("stop_sequence", ir.STOP_SEQUENCE),
    ("tool_use", ir.TOOL_USE_STOP), ("pause_turn", ir.PAUSE_TURN), ("refusal", ir.REFUSAL),
    ("model_context_window_exceeded", ir.MAX_TOKENS), ("something_new", ir.OTHER), (None, ir.STOP_UNSET),
])
def test_read_response_stop_reasons(wire, stop):
    assert codec.read_response(orjson.dumps(dict(RESPONSE, stop_reason=wire))).stop_reason == stop


@pytest.mark.parametrize("stop,wire", [
    (ir.END_TURN, "end_turn"), (ir.MAX_TOKENS, "max_tokens"), (ir.STOP_SEQUENCE, "stop_sequence"),
    (ir.TOOL_USE_STOP, "tool_use"), (ir.PAUSE_TURN, "pause_turn"), (ir.REFUSAL, "refusal"),
    (ir.SAFETY, "end_turn"), (ir.ERROR, "end_turn"), (ir.OTHER, "end_turn"), (ir.STOP_UNSET, "end_turn"),
])
def test_write_response_stop_reasons(stop, wire):
    resp = ir.Response()
    resp.id, resp.model, resp.stop_reason = "msg_x", "m", stop
    out = codec.write_response(resp)
    assert Message.model_validate_json(out).stop_reason == wire


def test_write_response_round_trip_and_sdk():
    resp = codec.read_response(orjson.dumps(RESPONSE))
    resp.id = "msg_01minted"
    out = codec.write_response(resp)
    msg = Message.model_validate_json(out)
    assert msg.id == "msg_01minted" and msg.model == "claude-sonnet-4-5" and msg.stop_reason == "tool_use"
    assert [b.type for b in msg.content] == ["thinking", "redacted_thinking", "text", "tool_use"]
    assert msg.content[2].citations[0].type == "page_location"
    # the cache buckets come back out of input_tokens
    assert msg.usage.input_tokens == 25 and msg.usage.cache_creation_input_tokens == 1200
    assert msg.usage.cache_read_input_tokens == 3000 and msg.usage.output_tokens == 15
    assert msg.usage.output_tokens_details.thinking_tokens == 9
    d = orjson.loads(out)
    assert set(d) == {"id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}


def test_write_response_foreign_blocks():
    resp = ir.Response()
    resp.id, resp.model, resp.stop_reason, resp.stop_sequence = "msg_x", "gpt-4o", ir.STOP_SEQUENCE, "END"
    resp.usage = ir.Usage(100, 7, cache_read_tokens=60)
    resp.content = [
        ir.Block(ir.THINKING, "reasoning without signature"),
        ir.text_block(""),
        ir.Block(ir.TEXT, "cited", citations=[
            {"type": "url_citation",
             "url_citation": {"url": "https://x.test", "title": "X", "start_index": 0, "end_index": 5}},
            {"type": "unknown_thing"}]),
        ir.Block(ir.TOOL_USE, id="call_1", name="f", input='{"a":1}'),
        ir.Block(ir.IMAGE, src_kind=ir.SOURCE_URL, data="https://x.test/i.png"),
    ]
    msg = Message.model_validate_json(codec.write_response(resp))
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    assert msg.content[0].signature == ""
    assert msg.content[1].citations[0].type == "web_search_result_location"
    assert msg.content[1].citations[0].url == "https://x.test" and len(msg.content[1].citations) == 1
    assert msg.content[2].input == {"a": 1}
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", "END")
    assert (msg.usage.input_tokens, msg.usage.cache_read_input_tokens,
            msg.usage.cache_creation_input_tokens) == (40, 60, 0)


def test_read_response_bad_bodies():
    for raw in (b"", b"{", b"[]"):
        with pytest.raises(ir.CodecError):
            codec.read_response(raw)
    resp = codec.read_response(b'{"content": "nope", "usage": 5, "stop_reason": 3}')
    assert resp.content == [] and resp.usage.input_tokens == 0 and resp.stop_reason == ir.OTHER


def test_read_usage():
    u = codec.read_usage(orjson.dumps(RESPONSE))
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens) == (4225, 15, 3000, 1200)
    # only the top-level usage counts, not a lookalike nested in content
    nested = {"content": [{"type": "text", "text": "x", "usage": {"input_tokens": 999}}],
              "usage": {"input_tokens": 3, "output_tokens": 4}}
    u = codec.read_usage(orjson.dumps(nested))
    assert (u.input_tokens, u.output_tokens) == (3, 4)
    u = codec.read_usage(b'{"id": "x"}')
    assert (u.input_tokens, u.output_tokens, u.input_known) == (0, 0, False)
    with pytest.raises(ir.CodecError):
        codec.read_usage(b"not json")


# ---------------------------------------------------------------------------------------------
# StreamDecoder


def kinds(events):
    return [e.kind for e in events]


@pytest.mark.parametrize("step", [None, 1, 2, 3, 7, 64])
def test_decoder_text_stream_split_anywhere(step):
    events = decode(TEXT_STREAM, step)
    assert kinds(events) == [ir.MESSAGE_START, ir.BLOCK_START, ir.BLOCK_DELTA, ir.BLOCK_DELTA, ir.BLOCK_STOP,
                             ir.MESSAGE_DELTA, ir.MESSAGE_STOP]
    start = events[0]
    assert (start.id, start.model, start.usage.input_tokens, start.usage.input_known) == (
        "msg_up", "claude-sonnet-4-5", 25, True)
    assert events[1].block.kind == ir.TEXT and events[1].index == 0
    assert "".join(e.text for e in events if e.kind == ir.BLOCK_DELTA) == "Hello, wörld 👋"
    delta = events[5]
    assert delta.stop_reason == ir.END_TURN and delta.usage.output_tokens == 15
    assert delta.usage.input_tokens == 25 and delta.usage.input_known


def test_decoder_crlf_and_final_frame_without_blank_line():
    data = TEXT_STREAM.replace(b"\n", b"\r\n").rstrip(b"\r\n")
    assert kinds(decode(data, 5))[-1] == ir.MESSAGE_STOP


def test_decoder_tool_use_stream():
    events = decode(TOOL_STREAM, 5)
    starts = [e for e in events if e.kind == ir.BLOCK_START]
    assert [(e.index, e.block.kind) for e in starts] == [(0, ir.TEXT), (1, ir.TOOL_USE)]
    assert (starts[1].block.id, starts[1].block.name) == ("toolu_01", "get_weather")
    args = "".join(e.text for e in events if e.kind == ir.BLOCK_DELTA and e.delta_kind == ir.DELTA_INPUT_JSON)
    assert orjson.loads(args) == {"city": "Paris"}
    md = [e for e in events if e.kind == ir.MESSAGE_DELTA][0]
    assert md.stop_reason == ir.TOOL_USE_STOP and md.usage.input_tokens == 472 and md.usage.output_tokens == 89


def test_decoder_thinking_stream_with_signature():
    events = decode(THINKING_STREAM, 3)
    starts = [e for e in events if e.kind == ir.BLOCK_START]
    assert [(e.index, e.block.kind, e.block.redacted) for e in starts] == [
        (0, ir.THINKING, False), (1, ir.THINKING, True), (2, ir.TEXT, False)]
    assert starts[1].block.data == "EmwKopaque"
    deltas = [(e.index, e.delta_kind, e.text) for e in events if e.kind == ir.BLOCK_DELTA]
    assert deltas == [(0, ir.DELTA_THINKING, "Let me think. "), (0, ir.DELTA_THINKING, "27 * 453 = 12231."),
                      (0, ir.DELTA_SIGNATURE, "EqQBsig"), (2, ir.DELTA_TEXT, "12,231.")]


def test_decoder_citations_delta():
    cite = {"type": "char_location", "cited_text": "grass is green", "document_index": 0,
            "document_title": "Facts", "start_char_index": 0, "end_char_index": 14}
    events = decode(sse(msg_start(), block_start(0, type="text", text="", citations=[]),
                        block_delta(0, type="citations_delta", citation=cite),
                        block_delta(0, type="text_delta", text="Grass is green."), block_stop(0),
                        msg_delta(), MSG_STOP))
    cites = [e for e in events if e.kind == ir.BLOCK_DELTA and e.delta_kind == ir.DELTA_CITATION]
    assert len(cites) == 1 and cites[0].data == cite and cites[0].text is None


def test_decoder_skips_server_tool_blocks_and_renumbers():
    events = decode(sse(
        msg_start(),
        block_start(0, type="server_tool_use", id="srvtoolu_1", name="web_search", input={}),
        block_delta(0, type="input_json_delta", partial_json='{"query": "x"}'), block_stop(0),
        block_start(1, type="web_search_tool_result", tool_use_id="srvtoolu_1", content=[]), block_stop(1),
        block_start(2, type="text", text=""), block_delta(2, type="text_delta", text="found"), block_stop(2),
        msg_delta(), MSG_STOP))
    assert kinds(events) == [ir.MESSAGE_START, ir.BLOCK_START, ir.BLOCK_DELTA, ir.BLOCK_STOP,
                             ir.MESSAGE_DELTA, ir.MESSAGE_STOP]
    assert events[1].index == 0 and events[2].index == 0 and events[3].index == 0


def test_decoder_usage_with_cache_buckets_and_backfill():
    # input (with cache buckets) only at the start: every MESSAGE_DELTA carries it as the total
    events = decode(sse(msg_start(input_tokens=10, cache_write=500, cache_read=2000), msg_delta(output_tokens=4),
                        msg_delta(output_tokens=9), MSG_STOP))
    start, d1, d2 = events[0], events[1], events[2]
    assert (start.usage.input_tokens, start.usage.cache_write_tokens,
            start.usage.cache_read_tokens) == (2510, 500, 2000)
    assert (d1.usage.input_tokens, d1.usage.output_tokens) == (2510, 4)
    assert (d2.usage.input_tokens, d2.usage.output_tokens) == (2510, 9)  # running total, not 13
    # newer APIs: input reported (again, cumulatively) on message_delta
    events = decode(sse(msg_start(input_tokens=0, cache_read=0),
                        msg_delta(input_tokens=12, cache_read_input_tokens=100, cache_creation_input_tokens=0,
                                  output_tokens=3), MSG_STOP))
    d = events[1].usage
    assert (d.input_tokens, d.cache_read_tokens, d.output_tokens, d.input_known) == (112, 100, 3, True)
    # no input anywhere at the start: unknown until message_delta says it
    start_no_input = {"type": "message_start", "message": {"id": "m", "model": "x", "usage": {"output_tokens": 1}}}
    events = decode(sse(start_no_input, msg_delta(output_tokens=2), msg_delta(input_tokens=7, output_tokens=3)))
    assert events[0].usage.input_known is False and events[1].usage.input_known is False
    assert (events[2].usage.input_tokens, events[2].usage.input_known) == (7, True)


@pytest.mark.parametrize("frame", [b"event: content_block_delta\ndata: {not json\n\n",
                                   b"data: [1, 2]\n\n", b"event: ping\ndata: \"ping\"\n\n"])
def test_decoder_malformed_frame_is_a_codec_error(frame):
    # Issue 7: one policy in every codec. A frame that is not a JSON object used to be skipped
    # silently here; it now fails the stream like in the openai, cohere and bedrock decoders.
    dec = codec.StreamDecoder()
    assert [e.kind for e in dec.feed(sse(msg_start()))] == [ir.MESSAGE_START]
    with pytest.raises(ir.CodecError) as e:
        dec.feed(frame)
    assert str(e.value) == "The upstream sent a stream frame busbar could not read."


def test_decoder_oversized_frame_is_a_codec_error():
    dec = codec.StreamDecoder(max_frame=64)
    dec.feed(b"event: content_block_delta\ndata: " + b"x" * 40)
    with pytest.raises(ir.CodecError) as e:
        dec.feed(b"y" * 30)
    assert str(e.value) == "The upstream sent a stream frame larger than busbar accepts."
    assert codec.StreamDecoder().feed(b"data: " + b"x" * (1 << 20)) == []  # 32 MiB by default


def test_decoder_error_event_and_garbage():
    garbage = (b": a comment\n\n"
               b"event: ping\n\n"
               b"event: mystery\ndata: {\"type\": \"mystery\"}\n\n")
    events = decode(sse(msg_start(), PING, garbage, block_delta(5, type="text_delta", text="orphan"),
                        block_start(0, type="text", text=""),
                        block_delta(0, type="text_delta", text=7), block_delta(0, type="weird_delta"),
                        block_delta(0, type="text_delta", text="ok"),
                        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
                        block_delta(0, type="text_delta", text="after the error")))
    assert kinds(events) == [ir.MESSAGE_START, ir.BLOCK_START, ir.BLOCK_DELTA, ir.EVENT_ERROR]
    assert events[2].text == "ok"
    assert (events[3].error_kind, events[3].message) == ("overloaded", "Overloaded")
    events = decode(sse({"type": "error", "error": "bad"}))
    assert (events[0].error_kind, events[0].message) == ("api_error", "The upstream stream failed.")


def test_decoder_ignores_frames_after_message_stop():
    events = decode(TEXT_STREAM + sse(block_start(1, type="text", text=""), msg_delta()))
    assert kinds(events)[-1] == ir.MESSAGE_STOP


def test_decoder_start_block_payload_becomes_deltas():
    events = decode(sse(msg_start(), block_start(0, type="text", text="pre"),
                        block_start(1, type="tool_use", id="t", name="f", input={"a": 1}),
                        block_start(2, type="thinking", thinking="th", signature="sg")))
    deltas = [(e.index, e.delta_kind, e.text) for e in events if e.kind == ir.BLOCK_DELTA]
    assert deltas == [(0, ir.DELTA_TEXT, "pre"), (1, ir.DELTA_INPUT_JSON, '{"a":1}'),
                      (2, ir.DELTA_THINKING, "th"), (2, ir.DELTA_SIGNATURE, "sg")]


# The decoder fuzzed with hypothesis: SSE frames of Anthropic's real event types, well-formed or
# not (wrong-typed fields, unknown types, truncated JSON, JSON that is not an object, bytes that
# are not UTF-8, blank keep-alives, comments, event lines without data), written with LF, CRLF or
# CR and fed in pieces cut anywhere. A model of the decoder's contract (docs/codecs.md) says what
# must come out, event by event, so the test fails if the decoder stops seeing frames.

STR = st.text(st.characters(exclude_categories=("Cs",)), max_size=10)
ODD = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.floats(-1, 1), STR,
                st.lists(st.integers(0, 2), max_size=2), st.dictionaries(STR, st.integers(0, 9), max_size=2))
INDEX = st.integers(0, 3) | ODD
BLOCK_TYPES = ["text", "tool_use", "thinking", "redacted_thinking", "server_tool_use", "mystery"]
DELTAS = {"text_delta": "text", "input_json_delta": "partial_json", "thinking_delta": "thinking",
          "signature_delta": "signature", "citations_delta": "citation"}
STOPS = ["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal",
         "model_context_window_exceeded", "later_reason"]
ERRORS = ["overloaded_error", "rate_limit_error", "api_error", "billing_error", "teapot_error"]
CITATION = st.fixed_dictionaries({"type": st.just("char_location"), "cited_text": STR})


def _maybe(value, odd=ODD):
    """The field as Anthropic sends it, or (sometimes) something else in its place."""
    return st.one_of(value, value, value, odd)


@st.composite
def _payload(draw):
    kind = draw(st.sampled_from(["message_start", "content_block_start", "content_block_delta",
                                 "content_block_delta", "content_block_delta", "content_block_stop",
                                 "message_delta", "message_stop", "ping", "error", "mystery"]))
    if kind == "message_start":
        usage = draw(_maybe(st.fixed_dictionaries({"input_tokens": _maybe(st.integers(0, 99)),
                                                   "output_tokens": _maybe(st.integers(0, 9))})))
        obj = {"message": draw(_maybe(st.fixed_dictionaries({
            "id": _maybe(STR), "model": _maybe(STR), "usage": st.just(usage)})))}
    elif kind == "content_block_start":
        t = draw(st.sampled_from(BLOCK_TYPES))
        block = {"type": t}
        if t == "text":
            block["text"] = draw(_maybe(STR))
            if draw(st.booleans()):
                block["citations"] = draw(_maybe(st.lists(CITATION | ODD, max_size=2)))
        elif t == "tool_use":
            block.update(id=draw(_maybe(STR)), name=draw(_maybe(STR)),
                         input=draw(_maybe(st.dictionaries(STR, st.integers(0, 9), max_size=2))))
        elif t == "thinking":
            block.update(thinking=draw(_maybe(STR)), signature=draw(_maybe(STR)))
        elif t == "redacted_thinking":
            block["data"] = draw(_maybe(STR))
        obj = {"index": draw(INDEX), "content_block": draw(_maybe(st.just(block)))}
    elif kind == "content_block_delta":
        t = draw(st.sampled_from(list(DELTAS) + ["weird_delta"]))
        delta = {"type": t}
        if t in DELTAS:
            delta[DELTAS[t]] = draw(_maybe(CITATION if t == "citations_delta" else STR))
        obj = {"index": draw(INDEX), "delta": draw(_maybe(st.just(delta)))}
    elif kind == "content_block_stop":
        obj = {"index": draw(INDEX)}
    elif kind == "message_delta":
        obj = {"delta": draw(_maybe(st.fixed_dictionaries({"stop_reason": _maybe(st.sampled_from(STOPS)),
                                                           "stop_sequence": _maybe(STR)}))),
               "usage": draw(_maybe(st.fixed_dictionaries({"output_tokens": _maybe(st.integers(0, 99))})))}
    elif kind == "error":
        obj = {"error": draw(_maybe(st.fixed_dictionaries({"type": _maybe(st.sampled_from(ERRORS)),
                                                           "message": _maybe(STR)})))}
    else:
        obj = {}
    if draw(st.integers(0, 9)):          # mostly typed in the body; else only by the event line
        obj = dict({"type": kind}, **obj)
    return kind, obj


@st.composite
def _frame(draw):
    """(SSE lines, the (event, data) pair the SSE reader hands the decoder, or None)."""
    choice = draw(st.integers(0, 19))
    if choice < 13:         # a JSON object
        kind, obj = draw(_payload())
        event = draw(st.sampled_from([kind, kind, kind, "ping", None]))
        text = orjson.dumps(obj, option=orjson.OPT_INDENT_2 if draw(st.booleans()) else 0)
        data_lines = text.split(b"\n")      # indented JSON: many data lines, joined with \n again
    elif choice < 17:       # data that is not one JSON object
        kind, obj = draw(_payload())
        event = draw(st.sampled_from([kind, None]))
        whole = orjson.dumps(dict({"type": kind}, **obj))
        data_lines = [draw(st.sampled_from([
            whole[:draw(st.integers(1, len(whole) - 1))], b"[1]", b'"x"', b"3", b"null",
            b"{not json", b"\xff\xfe{}", b"<html>"]))]
    elif choice == 17:      # blank keep-alive data
        event, data_lines = draw(st.sampled_from([None, "ping"])), [draw(st.sampled_from([b"", b" ", b"  \t"]))]
    elif choice == 18:      # an event line alone
        event, data_lines = draw(st.sampled_from(["ping", "message_stop"])), []
    else:                   # a comment
        return [b": keep-alive"], None
    lines = ([b"event: " + event.encode()] if event is not None else [])
    lines += [b"data: " + d for d in data_lines]
    return lines, (event.encode() if event is not None else None, b"\n".join(data_lines))


def _expected(pairs):
    """The decoder's contract, event by event: (summary of IR events, CodecError expected)."""
    out, blocks, done, next_index = [], {}, False, 0
    for event, data in pairs:
        if done or not data.strip(b" \t"):
            continue
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return out, True
        if not isinstance(obj, dict):
            return out, True
        t = obj.get("type")
        if not isinstance(t, str) and event is not None:
            t = event.decode()
        up = obj.get("index")
        if t == "message_start":
            msg = obj.get("message") if isinstance(obj.get("message"), dict) else {}
            out.append(("message_start", msg.get("id") if isinstance(msg.get("id"), str) else None,
                        msg.get("model") if isinstance(msg.get("model"), str) else None))
        elif t == "content_block_start":
            cb = obj.get("content_block")
            if type(up) is not int or not isinstance(cb, dict) or cb.get("type") not in BLOCK_TYPES[:4]:
                continue
            i = blocks[up] = next_index         # dense, in arrival order
            next_index += 1
            ct = cb["type"]
            out.append(("start", i, {"text": ir.TEXT, "tool_use": ir.TOOL_USE}.get(ct, ir.THINKING)))
            if ct == "text":
                if isinstance(cb.get("text"), str) and cb["text"]:
                    out.append(("delta", i, ir.DELTA_TEXT, cb["text"]))
                if isinstance(cb.get("citations"), list):
                    out += [("delta", i, ir.DELTA_CITATION, None) for c in cb["citations"] if isinstance(c, dict)]
            elif ct == "tool_use" and isinstance(cb.get("input"), dict) and cb["input"]:
                out.append(("delta", i, ir.DELTA_INPUT_JSON, orjson.dumps(cb["input"]).decode()))
            elif ct == "thinking":
                for k, dk in (("thinking", ir.DELTA_THINKING), ("signature", ir.DELTA_SIGNATURE)):
                    if isinstance(cb.get(k), str) and cb[k]:
                        out.append(("delta", i, dk, cb[k]))
        elif t == "content_block_delta":
            d = obj.get("delta")
            if type(up) is not int or up not in blocks or not isinstance(d, dict):
                continue
            field = DELTAS.get(d.get("type")) if isinstance(d.get("type"), str) else None
            if field == "citation":
                if isinstance(d.get("citation"), dict):
                    out.append(("delta", blocks[up], ir.DELTA_CITATION, None))
            elif field is not None and isinstance(d.get(field), str):
                dk = {"text": ir.DELTA_TEXT, "partial_json": ir.DELTA_INPUT_JSON,
                      "thinking": ir.DELTA_THINKING, "signature": ir.DELTA_SIGNATURE}[field]
                out.append(("delta", blocks[up], dk, d[field]))
        elif t == "content_block_stop":
            if type(up) is int and up in blocks:
                out.append(("stop", blocks[up]))
        elif t == "message_delta":
            d = obj.get("delta") if isinstance(obj.get("delta"), dict) else {}
            sr = d.get("stop_reason")
            out.append(("message_delta", ir.STOP_UNSET if sr is None else _STOP.get(sr, ir.OTHER)
                        if isinstance(sr, str) else ir.OTHER))
        elif t == "message_stop":
            out.append(("message_stop",))
            done = True
        elif t == "error":
            err = obj.get("error") if isinstance(obj.get("error"), dict) else {}
            et = err.get("type")
            out.append(("error", _ERROR.get(et, "api_error") if isinstance(et, str) else "api_error",
                        err.get("message") if isinstance(err.get("message"), str)
                        else "The upstream stream failed."))
            done = True
    return out, False


_STOP = {"end_turn": ir.END_TURN, "max_tokens": ir.MAX_TOKENS, "stop_sequence": ir.STOP_SEQUENCE,
         "tool_use": ir.TOOL_USE_STOP, "pause_turn": ir.PAUSE_TURN, "refusal": ir.REFUSAL,
         "model_context_window_exceeded": ir.MAX_TOKENS}
_ERROR = {"overloaded_error": "overloaded", "rate_limit_error": "rate_limit", "api_error": "api_error",
          "billing_error": "quota"}


def _summary(events):
    out = []
    for e in events:
        assert isinstance(e, ir.Event)
        if e.kind == ir.MESSAGE_START:
            out.append(("message_start", e.id, e.model))
        elif e.kind == ir.BLOCK_START:
            out.append(("start", e.index, e.block.kind))
        elif e.kind == ir.BLOCK_DELTA:
            out.append(("delta", e.index, e.delta_kind, None if e.delta_kind == ir.DELTA_CITATION else e.text))
        elif e.kind == ir.BLOCK_STOP:
            out.append(("stop", e.index))
        elif e.kind == ir.MESSAGE_DELTA:
            out.append(("message_delta", e.stop_reason))
        elif e.kind == ir.MESSAGE_STOP:
            out.append(("message_stop",))
        elif e.kind == ir.EVENT_ERROR:
            out.append(("error", e.error_kind, e.message))
        else:
            pytest.fail(f"unexpected event kind {e.kind}")
    return out


def _wire(frames, eol, cuts):
    data = b"".join(eol.join(lines) + eol + eol for lines in frames)
    bounds = sorted({min(c, len(data)) for c in cuts}) + [len(data)]
    pieces, last = [], 0
    for b in bounds:
        pieces.append(data[last:b])
        last = b
    return pieces


def _run(pieces):
    dec = codec.StreamDecoder()
    events = []
    try:
        for p in pieces:
            events += dec.feed(p)
        events += dec.close()
    except ir.CodecError as e:
        assert str(e) == "The upstream sent a stream frame busbar could not read."
        return events, True, dec
    return events, False, dec


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_frame(), max_size=14), st.sampled_from([b"\n", b"\r\n", b"\r"]),
       st.lists(st.integers(0, 4000), max_size=8))
def test_decoder_fuzzed_frames_give_the_contracts_events_or_its_codec_error(frames, eol, cuts):
    pairs = [pair for _, pair in frames if pair is not None]
    want, want_error = _expected(pairs)
    events, raised, dec = _run(_wire([lines for lines, _ in frames], eol, cuts))
    assert raised == want_error
    # Before the bad frame (if any) every frame was read: the events are the contract's, one by one.
    got = _summary(events)
    if raised:
        assert got == want[:len(got)]  # a piece may end before the last good frames were read
    else:
        assert got == want
        assert dec.finished == (("message_stop",) in want)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["text", "thinking", "tool_use"]), st.lists(STR, max_size=5)),
                max_size=4),
       st.sampled_from(STOPS[:6]), st.integers(0, 10**6),
       st.lists(st.tuples(st.integers(0, 4), st.integers(1, 40)), max_size=8),
       st.sampled_from([b"\n", b"\r\n"]), st.lists(st.integers(0, 4000), max_size=8))
def test_decoder_well_formed_streams_give_their_text(blocks, stop, input_tokens, noise, eol, cuts):
    """A stream as Anthropic sends it, with pings, comments and keep-alives between its frames:
    every block comes out with exactly the text (thinking, argument bytes) its deltas carried."""
    field = {"text": ("text_delta", "text"), "thinking": ("thinking_delta", "thinking"),
             "tool_use": ("input_json_delta", "partial_json")}
    frames = [msg_start(input_tokens=input_tokens)]
    for i, (kind, pieces) in enumerate(blocks):
        frames.append(block_start(i, type=kind, **({"id": "t%d" % i, "name": "f", "input": {}}
                                                   if kind == "tool_use" else {})))
        dtype, key = field[kind]
        frames += [block_delta(i, **{"type": dtype, key: p}) for p in pieces]
        frames.append(block_stop(i))
    frames += [msg_delta(stop, output_tokens=9), MSG_STOP]
    extras = [PING, b": keep-alive\n\n", b"event: ping\n\n", b"data: \n\n", b"data:   \n\n"]
    for which, at in noise:         # anywhere after message_start
        frames.insert(min(at, len(frames)), extras[which])
    data = sse(*frames).replace(b"\n", eol)
    bounds = sorted({min(c, len(data)) for c in cuts}) + [len(data)]
    dec, events, last = codec.StreamDecoder(), [], 0
    for b in bounds:
        events += dec.feed(data[last:b])
        last = b
    events += dec.close()
    assert dec.finished
    assert [e.kind for e in events] == ([ir.MESSAGE_START]
                                        + sum(([ir.BLOCK_START] + [ir.BLOCK_DELTA] * len(p) + [ir.BLOCK_STOP]
                                               for _, p in blocks), [])
                                        + [ir.MESSAGE_DELTA, ir.MESSAGE_STOP])
    kinds = {"text": (ir.TEXT, ir.DELTA_TEXT), "thinking": (ir.THINKING, ir.DELTA_THINKING),
             "tool_use": (ir.TOOL_USE, ir.DELTA_INPUT_JSON)}
    for i, (kind, pieces) in enumerate(blocks):
        assert [e.block.kind for e in events if e.kind == ir.BLOCK_START and e.index == i] == [kinds[kind][0]]
        deltas = [e for e in events if e.kind == ir.BLOCK_DELTA and e.index == i]
        assert {e.delta_kind for e in deltas} <= {kinds[kind][1]}
        assert "".join(e.text for e in deltas) == "".join(pieces)
    assert events[0].usage.input_tokens == input_tokens
    assert (events[-2].stop_reason, events[-2].usage.output_tokens) == (_STOP[stop], 9)


# ---------------------------------------------------------------------------------------------
# StreamEncoder


def encode(events, id="msg_01client", model="claude-client"):
    enc = codec.StreamEncoder(id, model)
    out = b""
    for e in events:
        out += enc.encode([e])
    return out


def sdk_validate(frames):
    """Every frame except ping/error must be a RawMessageStreamEvent."""
    for name, payload in frames:
        if name in ("ping", "error"):
            continue
        STREAM_EVENT.validate_python(payload)


def sdk_accumulate(data):
    """Runs the SDK's own stream accumulator over busbar's bytes and returns the final Message."""
    from anthropic.lib.streaming._messages import accumulate_event
    snapshot = None
    bufs = {}
    for name, payload in parse_sse(data):
        if name in ("ping", "error"):
            continue
        snapshot = accumulate_event(event=STREAM_EVENT.validate_python(payload), current_snapshot=snapshot,
                                    json_bufs=bufs)
    return snapshot


def test_encoder_round_trip_of_anthropic_streams():
    for stream in (TEXT_STREAM, TOOL_STREAM, THINKING_STREAM):
        out = encode(decode(stream, 9))
        frames = parse_sse(out)
        sdk_validate(frames)
        assert [f[0] for f in frames[:2]] == ["message_start", "ping"]
        assert frames[-1][0] == "message_stop" and frames[-2][0] == "message_delta"
        # same events as the upstream, less its pings and empty argument fragments
        upstream = [p for n, p in parse_sse(stream)
                    if n != "ping" and p.get("delta") != {"type": "input_json_delta", "partial_json": ""}]
        ours = [p for n, p in frames if n != "ping"]
        assert len(upstream) == len(ours)
        for up, mine in zip(upstream[1:], ours[1:]):
            if mine["type"] == "message_delta":
                assert mine["delta"] == up["delta"]
                assert mine["usage"]["output_tokens"] == up["usage"]["output_tokens"]
            else:
                assert mine == up


def test_encoder_message_start_shape_and_usage():
    usage = ir.Usage(2510, 0, cache_read_tokens=2000, cache_write_tokens=500)
    out = encode([ir.ev_message_start("upstream-id", "upstream-model", usage),
                  ir.ev_message_delta(ir.MAX_TOKENS, None, ir.Usage(0, 4, input_known=False)),
                  ir.ev_message_stop()])
    frames = parse_sse(out)
    sdk_validate(frames)
    assert frames[0][1] == {"type": "message_start", "message": {
        "id": "msg_01client", "type": "message", "role": "assistant", "model": "claude-client", "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 0, "cache_creation_input_tokens": 500,
                  "cache_read_input_tokens": 2000}}}
    assert frames[1] == ("ping", {"type": "ping"})
    # message_delta: the running totals, input backfilled from the start
    assert frames[2][1] == {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                            "usage": {"input_tokens": 10, "output_tokens": 4, "cache_creation_input_tokens": 500,
                                      "cache_read_input_tokens": 2000}}
    assert frames[3][1] == {"type": "message_stop"}


def test_encoder_input_reported_only_at_the_end():
    out = encode([ir.ev_message_start("x", "m", ir.Usage(input_known=False)),
                  ir.ev_message_delta(ir.END_TURN, None, ir.Usage(130, 9, cache_read_tokens=100)),
                  ir.ev_message_stop()])
    frames = parse_sse(out)
    assert frames[0][1]["message"]["usage"]["input_tokens"] == 0
    assert frames[2][1]["usage"] == {"input_tokens": 30, "output_tokens": 9, "cache_creation_input_tokens": 0,
                                     "cache_read_input_tokens": 100}


@pytest.mark.parametrize("stop,wire", [
    (ir.END_TURN, "end_turn"), (ir.TOOL_USE_STOP, "tool_use"), (ir.PAUSE_TURN, "pause_turn"),
    (ir.REFUSAL, "refusal"), (ir.SAFETY, "end_turn"), (ir.ERROR, "end_turn"), (ir.OTHER, "end_turn"),
])
def test_encoder_stop_reasons(stop, wire):
    frames = parse_sse(encode([ir.ev_message_start("x", "m", ir.Usage()), ir.ev_message_delta(stop, None, ir.Usage()),
                               ir.ev_message_stop()]))
    assert frames[2][1]["delta"]["stop_reason"] == wire


def test_encoder_stop_sequence():
    frames = parse_sse(encode([ir.ev_message_start("x", "m", ir.Usage()),
                               ir.ev_message_delta(ir.STOP_SEQUENCE, "END", ir.Usage()), ir.ev_message_stop()]))
    assert frames[2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def foreign_stream():
    """IR events as a flat-protocol decoder (OpenAI, Gemini) might produce them: sparse indices,
    tool input on the start block, a thinking block without signature, no MESSAGE_DELTA."""
    text = ir.Block(ir.TEXT)
    call = ir.Block(ir.TOOL_USE, id="call_9", name="lookup", input={"q": "x"})
    think = ir.Block(ir.THINKING)
    image = ir.Block(ir.IMAGE, src_kind=ir.SOURCE_URL, data="https://x.test/i.png")
    return [
        ir.ev_message_start("chatcmpl-1", "gpt-4o", ir.Usage(50, 0)),
        ir.ev_block_start(3, think), ir.ev_block_delta(3, ir.DELTA_THINKING, "pondering"), ir.ev_block_stop(3),
        ir.ev_block_start(5, image), ir.ev_block_delta(5, ir.DELTA_TEXT, ""), ir.ev_block_stop(5),
        ir.ev_block_start(7, text), ir.ev_block_delta(7, ir.DELTA_TEXT, "Hi "),
        ir.ev_block_delta(7, ir.DELTA_INPUT_JSON, "{wrong block}"), ir.ev_block_delta(7, ir.DELTA_TEXT, ""),
        ir.ev_block_delta(7, ir.DELTA_TEXT, "there"), ir.ev_block_stop(7),
        ir.ev_block_start(8, call), ir.ev_block_delta(8, ir.DELTA_INPUT_JSON, '{"q": "dup"}'),
        ir.ev_block_stop(8),
        ir.ev_message_stop(),
    ]


def test_encoder_foreign_stream_is_sdk_clean():
    out = encode(foreign_stream())
    frames = parse_sse(out)
    sdk_validate(frames)
    indices = [p["index"] for n, p in frames if n == "content_block_start"]
    assert indices == [0, 1, 2]
    msg = sdk_accumulate(out)
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    assert msg.content[0].thinking == "pondering" and msg.content[0].signature == ""
    assert msg.content[1].text == "Hi there"
    assert msg.content[2].input == {"q": "x"} and msg.content[2].id == "call_9"
    assert msg.stop_reason == "end_turn"  # synthesised message_delta before message_stop
    assert msg.usage.input_tokens == 50


def test_encoder_closes_open_blocks_and_starts_lazily():
    # a text delta with no message_start and no block start
    out = encode([ir.ev_block_delta(0, ir.DELTA_TEXT, "hello"),
                  ir.ev_message_delta(ir.END_TURN, None, ir.Usage(5, 1)), ir.ev_message_stop()])
    frames = parse_sse(out)
    sdk_validate(frames)
    assert [n for n, _ in frames] == ["message_start", "ping", "content_block_start", "content_block_delta",
                                      "content_block_stop", "message_delta", "message_stop"]
    assert sdk_accumulate(out).content[0].text == "hello"


def test_encoder_signature_and_citation_deltas():
    cite = {"type": "char_location", "cited_text": "c", "document_index": 0, "document_title": None,
            "start_char_index": 0, "end_char_index": 1}
    enc_events = [ir.ev_block_delta(2, ir.DELTA_CITATION, None)]
    enc_events[0].data = cite
    enc = codec.StreamEncoder("x", "m")
    out = enc.encode([ir.ev_message_start("x", "m", ir.Usage(1, 0)),
                      ir.ev_block_start(0, ir.Block(ir.THINKING, signature="held-signature")),
                      ir.ev_block_delta(0, ir.DELTA_THINKING, "t"), ir.ev_block_stop(0),
                      ir.ev_block_start(1, ir.Block(ir.THINKING, redacted=True, data="opaque")), ir.ev_block_stop(1),
                      ir.ev_block_start(2, ir.Block(ir.TEXT)), ir.ev_block_delta(2, ir.DELTA_TEXT, "c")])
    out += enc.encode(enc_events + [ir.ev_block_stop(2), ir.ev_message_delta(ir.END_TURN, None, ir.Usage(1, 3)),
                                    ir.ev_message_stop()])
    frames = parse_sse(out)
    sdk_validate(frames)
    msg = sdk_accumulate(out)
    assert (msg.content[0].thinking, msg.content[0].signature) == ("t", "held-signature")
    assert msg.content[1].type == "redacted_thinking" and msg.content[1].data == "opaque"
    assert msg.content[2].text == "c" and msg.content[2].citations[0].cited_text == "c"


def test_encoder_error_and_done():
    enc = codec.StreamEncoder("msg_01x", "m")
    out = enc.encode([ir.ev_message_start("x", "m", ir.Usage(1, 0)), ir.ev_block_start(0, ir.Block(ir.TEXT)),
                      ir.ev_error("overloaded", "Overloaded"), ir.ev_block_delta(0, ir.DELTA_TEXT, "late")])
    frames = parse_sse(out)
    assert frames[-1] == ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    assert enc.encode([ir.ev_message_stop()]) == b""
    assert codec.StreamEncoder("a", "b").error("quota", "Budget exhausted.") == (
        b'event: error\ndata: {"type":"error","error":{"type":"rate_limit_error","message":"Budget exhausted."}}\n\n')


def test_encoder_extra_pings():
    enc = codec.StreamEncoder("x", "m")
    ping = ir.Event()
    ping.kind = ir.PING
    out = enc.encode([ping, ir.ev_message_start("x", "m", ir.Usage(1, 0)), ping, ir.Event()])
    # a ping before message_start is not sent (the SDK wants message_start first); kind 0 is ignored
    assert [n for n, _ in parse_sse(out)] == ["message_start", "ping", "ping"]


# ---------------------------------------------------------------------------------------------
# errors and model list


@pytest.mark.parametrize("kind,status,wire", [
    ("invalid_request", 400, "invalid_request_error"), ("authentication", 401, "authentication_error"),
    ("permission", 403, "permission_error"), ("not_found", 404, "not_found_error"),
    ("request_too_large", 413, "request_too_large"), ("rate_limit", 429, "rate_limit_error"),
    ("quota", 429, "rate_limit_error"), ("api_error", 500, "api_error"), ("overloaded", 503, "overloaded_error"),
    ("overloaded", 529, "overloaded_error"), ("timeout", 504, "timeout_error"),
    ("made_up", 529, "overloaded_error"), ("made_up", 418, "invalid_request_error"), ("made_up", 502, "api_error"),
])
def test_write_error(kind, status, wire):
    out = orjson.loads(codec.write_error(status, kind, "Something happened.", "req_123"))
    assert out == {"type": "error", "error": {"type": wire, "message": "Something happened."}, "request_id": "req_123"}
    assert codec.read_error_detail(codec.write_error(status, kind, "Something happened.")) == (
        "Something happened.", wire)
    assert "request_id" not in orjson.loads(codec.write_error(status, kind, "m"))


def test_read_error_detail_message():
    raw = b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
    assert codec.read_error_detail(raw)[0] == "Overloaded"
    assert codec.read_error_detail(b'{"message": "flat"}')[0] == "flat"
    for raw in (b"", b"<html>", b"[]", b'{"error": "x"}', b'{"error": {"message": 5}}'):
        assert codec.read_error_detail(raw)[0] is None


def test_write_model_list():
    out = orjson.loads(codec.write_model_list(["claude-pool", "claude-sonnet"]))
    assert out == {"data": [
        {"type": "model", "id": "claude-pool", "display_name": "claude-pool", "created_at": "1970-01-01T00:00:00Z",
         "lifecycle": "active"},
        {"type": "model", "id": "claude-sonnet", "display_name": "claude-sonnet", "created_at": "1970-01-01T00:00:00Z",
         "lifecycle": "active"}],
        "has_more": False, "first_id": "claude-pool", "last_id": "claude-sonnet"}
    assert orjson.loads(codec.write_model_list([])) == {
        "data": [], "has_more": False, "first_id": None, "last_id": None}


# ---------------------------------------------------------------------------------------------
# the real SDK client reading busbar's bytes


def sdk_client(handler):
    return anthropic.Anthropic(api_key="sk-ant-test", base_url="http://busbar.test", max_retries=0,
                               http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def responder(status, content, content_type="application/json"):
    def handler(request):
        return httpx2.Response(status, content=content, headers={"content-type": content_type})
    return handler


def test_sdk_reads_buffered_message():
    resp = codec.read_response(orjson.dumps(RESPONSE))
    resp.id = codec.mint_id()
    client = sdk_client(responder(200, codec.write_response(resp)))
    msg = client.messages.create(model="claude-sonnet-4-5", max_tokens=10, messages=[{"role": "user", "content": "q"}])
    assert msg.id == resp.id and msg.content[3].input == {"a": [1, 2]}
    assert msg.usage.input_tokens == 25 and msg.usage.cache_read_input_tokens == 3000


def test_sdk_reads_translated_stream():
    out = encode(foreign_stream() [:-1] + [ir.ev_message_delta(ir.TOOL_USE_STOP, None, ir.Usage(50, 12)),
                                           ir.ev_message_stop()])
    client = sdk_client(responder(200, out, "text/event-stream"))
    with client.messages.stream(model="m", max_tokens=10, messages=[{"role": "user", "content": "q"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hi there"
    assert final.stop_reason == "tool_use" and final.usage.output_tokens == 12 and final.usage.input_tokens == 50
    assert final.content[2].input == {"q": "x"}


def test_sdk_raises_on_stream_error_event():
    enc = codec.StreamEncoder("msg_01x", "m")
    out = enc.encode([ir.ev_message_start("x", "m", ir.Usage(1, 0))]) + enc.error("overloaded", "Overloaded")
    client = sdk_client(responder(200, out, "text/event-stream"))
    with pytest.raises(anthropic.APIStatusError) as e:
        with client.messages.stream(model="m", max_tokens=10, messages=[{"role": "user", "content": "q"}]) as s:
            s.get_final_message()
    assert "Overloaded" in str(e.value)


@pytest.mark.parametrize("kind,exc", [
    ("authentication", anthropic.AuthenticationError), ("not_found", anthropic.NotFoundError),
    ("rate_limit", anthropic.RateLimitError), ("quota", anthropic.RateLimitError),
    ("invalid_request", anthropic.BadRequestError), ("overloaded", anthropic.InternalServerError),
])
def test_sdk_reads_error_envelope(kind, exc):
    status = ir.STATUS_OF_KIND[kind]
    client = sdk_client(responder(status, codec.write_error(status, kind, "Nope.", "req_9")))
    with pytest.raises(exc) as e:
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "q"}])
    assert e.value.body["error"]["message"] == "Nope." and e.value.body["request_id"] == "req_9"


def test_sdk_reads_model_list():
    client = sdk_client(responder(200, codec.write_model_list(["a", "b"])))
    assert [m.id for m in client.models.list()] == ["a", "b"]


# The conversation field given as a string, a number, an object or null: a wrong type is reported
# as a wrong type (never as missing), in anthropic's own words (jsonget's getters, AnthropicShape).
@pytest.mark.parametrize("value, message", [
    ('hi', 'messages: Input should be a valid list'),
    (3, 'messages: Input should be a valid list'),
    ({'role': 'user'}, 'messages: Input should be a valid list'),
    (None, 'messages: Field required'),
])
def test_read_request_conversation_field_type(value, message):
    import orjson as _orjson
    from cbusbar import ir as _ir
    from cbusbar.proto import anthropic as _codec
    body = {'model': 'x', 'max_tokens': 10}
    body['messages'] = value
    if message is None:
        _codec.read_request(_orjson.dumps(body))
        return
    with pytest.raises(_ir.CodecError) as e:
        _codec.read_request(_orjson.dumps(body))
    assert str(e.value) == message


# ---------------------------------------------------------------------------------------------
# Arguments that are not one JSON object (issue #34 (7)): the SDK's accumulator still gets an
# object, and the model's text is in it


def _tool_events(*fragments):
    out = [ir.ev_message_start("u", "m", ir.Usage(input_tokens=1)),
           ir.ev_block_start(0, ir.Block(ir.TOOL_USE, id="call_1", name="f"))]
    out += [ir.ev_block_delta(0, ir.DELTA_INPUT_JSON, f) for f in fragments]
    return out + [ir.ev_block_stop(0), ir.ev_message_delta(ir.TOOL_USE_STOP, None, ir.Usage(1, 2)),
                  ir.ev_message_stop()]


@pytest.mark.parametrize("fragments,want", [
    (['{"city":', ' "Paris"}'], {"city": "Paris"}),
    (["not ", "json"], {"_raw_arguments": "not json"}),
    (['{"city": "Paris", ', "'tz': True}"], {"city": "Paris", "_raw_arguments": "{\"city\": \"Paris\", 'tz': True}"}),
    (['{"port": "Brest"}', '{"port": "Nantes"}'],
     {"port": "Brest", "_raw_arguments": '{"port": "Brest"}{"port": "Nantes"}'}),
    (['{"city": "Par'], {"city": "Par", "_raw_arguments": '{"city": "Par'}),   # cut off
])
def test_encoder_arguments_accumulate_to_an_object_in_the_sdk(fragments, want):
    out = encode(_tool_events(*fragments))
    sdk_validate(parse_sse(out))
    message = sdk_accumulate(out)
    assert message.content[0].input == want
