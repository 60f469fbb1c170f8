"""The Gemini codec, fed bytes. Request bodies below are what google-genai actually sends (captured
from the SDK), responses and streams are checked against the SDK's own pydantic models."""
import http.server
import json
import threading

import orjson
import pytest
from google import genai
from google.genai import errors as genai_errors
from google.genai import types

from cbusbar import ir
from cbusbar.proto import gemini as g

# What google-genai sends for generate_content(..., config=GenerateContentConfig(...)): camelCase,
# except the pieces it passes through as pydantic dumps (inlineData.mime_type, thinkingConfig's
# keys, parameters_json_schema, snake_case keys inside a `parameters` Schema).
SDK_BODY = {
    "contents": [
        {"parts": [{"text": "hello"},
                   {"inlineData": {"data": "iVBORw==", "mime_type": "image/png"}},
                   {"fileData": {"file_uri": "gs://b/x.pdf", "mime_type": "application/pdf"}}],
         "role": "user"},
        {"parts": [{"text": "thinking...", "thought": True, "thoughtSignature": "c2ln"},
                   {"functionCall": {"args": {"city": "Paris"}, "name": "weather"}}],
         "role": "model"},
        {"parts": [{"functionResponse": {"name": "weather", "response": {"result": "sunny"}}}],
         "role": "user"},
    ],
    "systemInstruction": {"parts": [{"text": "be nice"}], "role": "user"},
    "safetySettings": [{"category": "HARM_CATEGORY_HATE_SPEECH", "threshold": "BLOCK_NONE"}],
    "tools": [{"functionDeclarations": [
        {"description": "Get weather.", "name": "weather",
         "parameters_json_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
        {"name": "lookup", "parameters": {
            "properties": {"my_ids": {"items": {"type": "INTEGER"}, "min_items": 1,
                                      "type": "ARRAY"},
                           "note": {"type": "STRING", "nullable": True}},
            "required": ["my_ids"], "type": "OBJECT"}}]}],
    "toolConfig": {"functionCallingConfig": {"allowedFunctionNames": ["weather"], "mode": "ANY"}},
    "generationConfig": {
        "temperature": 0.7, "maxOutputTokens": 100, "stopSequences": ["x"], "topK": 3.0,
        "topP": 0.5, "candidateCount": 1, "seed": 3, "presencePenalty": 0.1,
        "frequencyPenalty": 0.2, "responseLogprobs": True, "logprobs": 2,
        "responseMimeType": "application/json", "responseJsonSchema": {"type": "object"},
        "thinkingConfig": {"include_thoughts": True, "thinking_budget": -1},
        "mediaResolution": "MEDIA_RESOLUTION_LOW"},
}


def _snake(obj):
    """The same body with every camelCase key spelled snake_case (proto JSON accepts both)."""
    keep = {"properties"}  # property names are the caller's, not field names

    def conv(k):
        return "".join("_" + c.lower() if c.isupper() else c for c in k)

    def walk(o, raw_keys=False):
        if isinstance(o, dict):
            return {(k if raw_keys else conv(k)): walk(v, k in keep and not raw_keys)
                    for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        return o
    return walk(obj)


def _body(**kw):
    return orjson.dumps(kw)


# ---------------------------------------------------------------------------------------------
# read_request


def test_read_request_sdk_body():
    req = g.read_request(orjson.dumps(SDK_BODY))
    assert req.model is None and req.stream is False  # path-model: the engine sets both
    assert [b.text for b in req.system] == ["be nice"]
    user, model, result = req.messages
    assert user.role == ir.USER and model.role == ir.ASSISTANT and result.role == ir.USER
    text, image, doc = user.content
    assert text.kind == ir.TEXT and text.text == "hello"
    assert (image.kind, image.src_kind, image.media_type, image.data) == (
        ir.IMAGE, ir.SOURCE_BASE64, "image/png", "iVBORw==")
    assert (doc.kind, doc.src_kind, doc.media_type, doc.data) == (
        ir.DOCUMENT, ir.SOURCE_VENDOR, "application/pdf", "gs://b/x.pdf")
    thinking, call = model.content
    assert (thinking.kind, thinking.text, thinking.signature) == (
        ir.THINKING, "thinking...", "c2ln")
    assert call.kind == ir.TOOL_USE and call.name == "weather" and call.input == {"city": "Paris"}
    assert call.id.startswith("call_") and len(call.id) > 10
    (res,) = result.content
    assert res.kind == ir.TOOL_RESULT and res.id == call.id and not res.is_error
    assert [orjson.loads(c.text) for c in res.content] == [{"result": "sunny"}]

    weather, lookup = req.tools
    assert weather.schema == {"type": "object", "properties": {"city": {"type": "string"}}}
    assert weather.description == "Get weather."
    assert lookup.schema == {
        "properties": {"my_ids": {"items": {"type": "integer"}, "minItems": 1, "type": "array"},
                       "note": {"type": ["string", "null"]}},
        "required": ["my_ids"], "type": "object"}
    assert req.tool_choice == ir.TOOL_CHOICE_TOOL and req.tool_choice_name == "weather"

    assert req.temperature == 0.7 and req.max_tokens == 100 and req.stop == ["x"]
    assert req.top_k == 3 and isinstance(req.top_k, int) and req.top_p == 0.5
    assert (req.n, req.seed, req.presence_penalty, req.frequency_penalty) == (1, 3, 0.1, 0.2)
    assert req.logprobs is True and req.top_logprobs == 2
    assert req.response_format == ir.FORMAT_JSON_SCHEMA and req.rf_schema == {"type": "object"}
    assert req.reasoning_effort == "medium" and req.reasoning_budget is None  # -1 is dynamic
    assert req.extra["safetySettings"] == SDK_BODY["safetySettings"]
    assert req.extra["generationConfig"] == {
        "mediaResolution": "MEDIA_RESOLUTION_LOW",
        "thinkingConfig": {"includeThoughts": True, "thinkingBudget": -1}}


def test_read_request_snake_case_spelling_reads_the_same():
    camel = g.read_request(orjson.dumps(SDK_BODY))
    snake = g.read_request(orjson.dumps(_snake(SDK_BODY)))
    assert "system_instruction" in _snake(SDK_BODY)
    assert snake.to_dict() == camel.to_dict()


def test_minted_ids_are_stable_across_turns_and_unique():
    body = {"contents": [
        {"role": "user", "parts": [{"text": "go"}]},
        {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}},
                                    {"functionCall": {"name": "f", "args": {"x": 1}}},
                                    {"functionCall": {"name": "g", "args": {}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "g", "response": {"a": 1}}},
                                   {"functionResponse": {"name": "f", "response": {"b": 2}}},
                                   {"functionResponse": {"name": "f", "response": {"c": 3}}}]},
    ]}
    req = g.read_request(orjson.dumps(body))
    calls = [b.id for b in req.messages[1].content]
    assert len(set(calls)) == 3
    answered = [(b.id, b.content[0].text) for b in req.messages[2].content]
    # same-name responses answer the calls in order
    assert answered == [(calls[2], '{"a":1}'), (calls[0], '{"b":2}'), (calls[1], '{"c":3}')]
    # the next turn re-reads the same history: same ids (other vendors' prompt caches stay warm)
    body["contents"].append({"role": "model", "parts": [{"text": "done"}]})
    again = g.read_request(orjson.dumps(body))
    assert [b.id for b in again.messages[1].content] == calls


def test_explicit_ids_and_error_results():
    body = {"contents": [
        {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}, "id": "a1"}},
                                    {"functionCall": {"name": "f", "args": {}, "id": "a2"}}]},
        {"role": "user", "parts": [
            {"functionResponse": {"name": "f", "id": "a2", "response": {"error": "boom"}}},
            {"functionResponse": {"name": "f", "response": {"output": 1}}}]},
    ]}
    req = g.read_request(orjson.dumps(body))
    r2, r1 = req.messages[1].content
    assert (r2.id, r2.is_error) == ("a2", True)
    assert (r1.id, r1.is_error) == ("a1", False)


def test_function_response_parts_carry_images():
    body = {"contents": [{"role": "user", "parts": [{"functionResponse": {
        "name": "shot", "response": {"ok": True},
        "parts": [{"inlineData": {"mimeType": "image/jpeg", "data": "AAAA"}}]}}]}]}
    (res,) = g.read_request(orjson.dumps(body)).messages[0].content
    assert [c.kind for c in res.content] == [ir.TEXT, ir.IMAGE]
    assert res.content[1].media_type == "image/jpeg"


@pytest.mark.parametrize("cfg,effort,budget", [
    ({"thinkingBudget": 2048}, None, 2048),
    ({"thinking_budget": 0}, None, 0),
    ({"thinkingBudget": -1}, "medium", None),
    ({"thinkingLevel": "LOW"}, "low", None),
    ({"thinking_level": "HIGH", "include_thoughts": True}, "high", None),
])
def test_thinking_config(cfg, effort, budget):
    req = g.read_request(_body(contents=[], generationConfig={"thinkingConfig": cfg}))
    assert (req.reasoning_effort, req.reasoning_budget) == (effort, budget)


@pytest.mark.parametrize("fcc,choice,name,kept", [
    ({"mode": "AUTO"}, ir.TOOL_CHOICE_AUTO, None, False),
    ({"mode": "NONE"}, ir.TOOL_CHOICE_NONE, None, False),
    ({"mode": "ANY"}, ir.TOOL_CHOICE_REQUIRED, None, False),
    ({"mode": "ANY", "allowed_function_names": ["f"]}, ir.TOOL_CHOICE_TOOL, "f", False),
    ({"mode": "ANY", "allowedFunctionNames": ["f", "g"]}, ir.TOOL_CHOICE_REQUIRED, None, True),
    ({"mode": "VALIDATED"}, ir.TOOL_CHOICE_AUTO, None, True),
])
def test_tool_config(fcc, choice, name, kept):
    req = g.read_request(_body(contents=[], toolConfig={"functionCallingConfig": fcc}))
    assert (req.tool_choice, req.tool_choice_name) == (choice, name)
    assert ("toolConfig" in req.extra) == kept


def test_response_formats_and_other_tools():
    req = g.read_request(_body(contents=[], generationConfig={
        "response_mime_type": "application/json",
        "response_schema": {"type": "OBJECT", "properties": {"a": {"type": "STRING"}},
                            "property_ordering": ["a"]}}))
    assert req.response_format == ir.FORMAT_JSON_SCHEMA
    assert req.rf_schema == {"type": "object", "properties": {"a": {"type": "string"}}}
    req = g.read_request(_body(contents=[],
                               generationConfig={"responseMimeType": "application/json"}))
    assert req.response_format == ir.FORMAT_JSON_OBJECT
    req = g.read_request(_body(contents=[], generationConfig={
        "responseMimeType": "text/x.enum", "responseSchema": {"type": "STRING"}}))
    assert req.response_format == ir.FORMAT_UNSET
    assert req.extra["generationConfig"]["responseMimeType"] == "text/x.enum"
    req = g.read_request(_body(contents=[], tools=[{"googleSearch": {}}, {"codeExecution": {}}],
                               cachedContent="cachedContents/x", labels={"a": "b"}))
    assert req.tools == [] and req.extra["tools"] == [{"googleSearch": {}}, {"codeExecution": {}}]
    assert req.extra["cachedContent"] == "cachedContents/x" and req.extra["labels"] == {"a": "b"}


def test_malformed_json_is_a_codec_error():
    with pytest.raises(ir.CodecError) as e:
        g.read_request(b'{"contents": [')
    assert str(e.value) == "We could not parse the JSON body of your request."


@pytest.mark.parametrize("body", [
    b"[]", b"42", b'"x"', b"null",
    b'{"contents": {"role": "user"}}',
    b'{"contents": [1]}',
    b'{"contents": [{"role": "system", "parts": [{"text": "x"}]}]}',
    b'{"contents": [{"parts": "text"}]}',
    b'{"contents": [{"parts": [{"text": 5}]}]}',
    b'{"contents": [{"parts": [{"functionCall": "f"}]}]}',
    b'{"contents": [{"parts": [{"functionCall": {"name": 3}}]}]}',
    b'{"contents": [{"parts": [{"inlineData": {"data": 1}}]}]}',
    b'{"contents": [], "generationConfig": []}',
    b'{"contents": [], "generationConfig": {"temperature": "hot"}}',
    b'{"contents": [], "generationConfig": {"maxOutputTokens": 1.5}}',
    b'{"contents": [], "generationConfig": {"maxOutputTokens": true}}',
    b'{"contents": [], "generationConfig": {"stopSequences": [1]}}',
    b'{"contents": [], "generationConfig": {"thinkingConfig": {"thinkingBudget": "x"}}}',
    b'{"contents": [], "tools": {"functionDeclarations": []}}',
    b'{"contents": [], "tools": [{"functionDeclarations": [{"name": []}]}]}',
    b'{"contents": [], "toolConfig": {"functionCallingConfig": {"mode": 1}}}',
    b'{"systemInstruction": {"parts": [{"text": {}}]}}',
    b'{"systemInstruction": 7}',
])
def test_bad_shapes_raise_only_codec_errors(body):
    with pytest.raises(ir.CodecError):
        g.read_request(body)


def test_garbage_never_escapes_as_another_exception():
    import random
    rng = random.Random(7)
    base = orjson.dumps(SDK_BODY)
    for _ in range(3000):
        b = bytearray(base)
        for _ in range(rng.randint(1, 6)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        try:
            g.read_request(bytes(b))
        except ir.CodecError:
            pass


# ---------------------------------------------------------------------------------------------
# write_request


def _req(messages, **kw):
    req = ir.Request()
    req.messages = messages
    for k, v in kw.items():
        setattr(req, k, v)
    return req


def test_write_request_tool_round_and_images():
    use = ir.Block(ir.TOOL_USE, id="toolu_1", name="weather", input={"city": "Paris"})
    res_text = ir.Block(ir.TOOL_RESULT, id="toolu_1", content=[ir.text_block("sunny")])
    res_json = ir.Block(ir.TOOL_RESULT, id="toolu_2", content=[ir.text_block('{"t": 21}')])
    res_err = ir.Block(ir.TOOL_RESULT, id="toolu_3", is_error=True,
                       content=[ir.text_block("no such city"),
                                ir.Block(ir.IMAGE, src_kind=ir.SOURCE_BASE64,
                                         media_type="image/png", data="AAAA")])
    req = _req([
        ir.Message(ir.USER, [ir.text_block("hi"),
                             ir.Block(ir.IMAGE, src_kind=ir.SOURCE_BASE64, media_type="image/jpeg",
                                      data="/9j/"),
                             ir.Block(ir.IMAGE, src_kind=ir.SOURCE_URL,
                                      data="https://x.test/cat.png?s=1"),
                             ir.Block(ir.IMAGE, src_kind=ir.SOURCE_VENDOR, data="file-abc"),
                             ir.Block(ir.DOCUMENT, text="plain doc", name="title")]),
        ir.Message(ir.ASSISTANT, [
            ir.Block(ir.THINKING, text="unsigned thoughts"),
            ir.Block(ir.THINKING, text="", redacted=True, data="opaque"),
            ir.Block(ir.THINKING, text="signed", signature="c2lnbmF0dXJl"),
            use,
            ir.Block(ir.TOOL_USE, id="toolu_2", name="temp", input={}),
            ir.Block(ir.TOOL_USE, id="toolu_3", name="weather", input={"city": "X"})]),
        ir.Message(ir.USER, [res_text, res_json, res_err]),
        ir.Message(ir.ASSISTANT, [ir.Block(ir.THINKING, text="dropped")]),  # no parts left
    ], system=[ir.text_block("sys")], stop=["a", "b", "c", "d", "e", "f"])
    body = orjson.loads(g.write_request(req))
    assert body["systemInstruction"] == {"parts": [{"text": "sys"}]}
    user, model, results = body["contents"]
    assert user == {"role": "user", "parts": [
        {"text": "hi"},
        {"inlineData": {"mimeType": "image/jpeg", "data": "/9j/"}},
        {"fileData": {"fileUri": "https://x.test/cat.png?s=1", "mimeType": "image/png"}},
        {"text": "plain doc"}]}
    assert model == {"role": "model", "parts": [
        {"text": "signed", "thought": True, "thoughtSignature": "c2lnbmF0dXJl"},
        {"functionCall": {"name": "weather", "args": {"city": "Paris"}, "id": "toolu_1"},
         "thoughtSignature": "skip_thought_signature_validator"},
        {"functionCall": {"name": "temp", "args": {}, "id": "toolu_2"}},
        {"functionCall": {"name": "weather", "args": {"city": "X"}, "id": "toolu_3"}}]}
    assert results == {"role": "user", "parts": [
        {"functionResponse": {"name": "weather", "response": {"result": "sunny"}, "id": "toolu_1"}},
        {"functionResponse": {"name": "temp", "response": {"t": 21}, "id": "toolu_2"}},
        {"functionResponse": {"name": "weather", "response": {"error": "no such city"},
                              "id": "toolu_3"}},
        {"inlineData": {"mimeType": "image/png", "data": "AAAA"}}]}
    assert body["generationConfig"] == {"stopSequences": ["a", "b", "c", "d", "e"]}
    assert "tools" not in body and "toolConfig" not in body
    for content in body["contents"]:
        types.Content.model_validate(content)


@pytest.mark.parametrize("effort,budget,expected", [
    ("minimal", None, {"thinkingBudget": 1024, "includeThoughts": True}),
    ("low", None, {"thinkingBudget": 4096, "includeThoughts": True}),
    ("medium", None, {"thinkingBudget": 8192, "includeThoughts": True}),
    ("high", None, {"thinkingBudget": 16384, "includeThoughts": True}),
    ("high", 3000, {"thinkingBudget": 3000, "includeThoughts": True}),
    (None, 0, {"thinkingBudget": 0}),
    (None, None, None),
])
def test_write_request_thinking(effort, budget, expected):
    req = _req([ir.Message(ir.USER, [ir.text_block("x")])], reasoning_effort=effort,
               reasoning_budget=budget)
    gen = orjson.loads(g.write_request(req)).get("generationConfig", {})
    assert gen.get("thinkingConfig") == expected


@pytest.mark.parametrize("choice,name,expected", [
    (ir.TOOL_CHOICE_UNSET, None, None),
    (ir.TOOL_CHOICE_AUTO, None, {"functionCallingConfig": {"mode": "AUTO"}}),
    (ir.TOOL_CHOICE_NONE, None, {"functionCallingConfig": {"mode": "NONE"}}),
    (ir.TOOL_CHOICE_REQUIRED, None, {"functionCallingConfig": {"mode": "ANY"}}),
    (ir.TOOL_CHOICE_TOOL, "f", {"functionCallingConfig": {"mode": "ANY",
                                                          "allowedFunctionNames": ["f"]}}),
])
def test_write_request_tool_choice(choice, name, expected):
    tool = ir.Tool("f", "does f", {"type": "object", "additionalProperties": False})
    req = _req([ir.Message(ir.USER, [ir.text_block("x")])], tools=[tool], tool_choice=choice,
               tool_choice_name=name)
    body = orjson.loads(g.write_request(req))
    assert body["tools"] == [{"functionDeclarations": [{
        "name": "f", "description": "does f",
        "parametersJsonSchema": {"type": "object", "additionalProperties": False}}]}]
    assert body.get("toolConfig") == expected
    # without tools there is never a tool config
    req.tools = []
    assert "toolConfig" not in orjson.loads(g.write_request(req))


def test_write_request_generation_fields():
    req = _req([ir.Message(ir.USER, [ir.text_block("x")])], max_tokens=10, temperature=0.7,
               top_p=0.9, top_k=5, n=2, seed=1, presence_penalty=0.5, frequency_penalty=-0.5,
               logprobs=True, top_logprobs=3, response_format=ir.FORMAT_JSON_SCHEMA,
               rf_name="x", rf_schema={"type": "object"}, parallel_tool_calls=False, user="u")
    gen = orjson.loads(g.write_request(req))["generationConfig"]
    assert gen == {"maxOutputTokens": 10, "temperature": 0.7, "topP": 0.9, "topK": 5,
                   "candidateCount": 2, "seed": 1, "presencePenalty": 0.5,
                   "frequencyPenalty": -0.5, "responseLogprobs": True, "logprobs": 3,
                   "responseMimeType": "application/json",
                   "responseJsonSchema": {"type": "object"}}
    types.GenerationConfig.model_validate(gen)


def test_same_protocol_round_trip_keeps_extra():
    once = orjson.loads(g.write_request(g.read_request(orjson.dumps(SDK_BODY))))
    assert once["safetySettings"] == SDK_BODY["safetySettings"]
    assert once["generationConfig"]["thinkingConfig"] == {"includeThoughts": True,
                                                          "thinkingBudget": -1}
    assert once["generationConfig"]["mediaResolution"] == "MEDIA_RESOLUTION_LOW"
    twice = orjson.loads(g.write_request(g.read_request(orjson.dumps(once))))
    assert twice == once


def test_upstream_path():
    assert g.upstream_path("gemini-2.5-flash", False) == (
        "/v1beta/models/gemini-2.5-flash:generateContent")
    assert g.upstream_path("gemini-2.5-flash", True) == (
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse")
    assert g.upstream_path("tunedModels/mine", False) == "/v1beta/tunedModels/mine:generateContent"


# ---------------------------------------------------------------------------------------------
# buffered responses

RESPONSE = {
    "candidates": [{
        "content": {"role": "model", "parts": [
            {"text": "Let me think", "thought": True},
            {"text": " about it.", "thought": True, "thoughtSignature": "c2ln"},
            {"text": "It is "}, {"text": "sunny."},
            {"functionCall": {"name": "weather", "args": {"city": "Paris"}},
             "thoughtSignature": "Zm9v"},
            {"functionCall": {"name": "time", "args": {}}}]},
        "finishReason": "STOP", "index": 0,
        "logprobsResult": {
            "topCandidates": [{"candidates": [{"token": "It", "logProbability": -0.1},
                                              {"token": "Its", "logProbability": -2.5}]}],
            "chosenCandidates": [{"token": "It", "logProbability": -0.1}]}}],
    "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 20,
                      "thoughtsTokenCount": 30, "cachedContentTokenCount": 60,
                      "totalTokenCount": 150},
    "modelVersion": "gemini-2.5-flash", "responseId": "resp-1",
}


def test_read_response():
    resp = g.read_response(orjson.dumps(RESPONSE))
    assert (resp.id, resp.model, resp.stop_reason) == ("resp-1", "gemini-2.5-flash",
                                                       ir.TOOL_USE_STOP)
    thinking, text, call1, call2 = resp.content
    assert (thinking.kind, thinking.text, thinking.signature) == (
        ir.THINKING, "Let me think about it.", "c2ln")
    assert (text.kind, text.text) == (ir.TEXT, "It is sunny.")
    assert (call1.name, call1.input, call1.signature) == ("weather", {"city": "Paris"}, "Zm9v")
    assert call1.id.startswith("call_") and call2.id.startswith("call_") and call1.id != call2.id
    # derived from the responseId: the same response always gets the same ids
    again = g.read_response(orjson.dumps(RESPONSE))
    assert [b.id for b in again.content[2:]] == [call1.id, call2.id]
    u = resp.usage
    assert (u.input_tokens, u.output_tokens, u.reasoning_tokens, u.cache_read_tokens) == (
        100, 50, 30, 60)
    assert resp.logprobs == [{"token": "It", "logprob": -0.1, "top_logprobs": [
        {"token": "It", "logprob": -0.1}, {"token": "Its", "logprob": -2.5}]}]


@pytest.mark.parametrize("finish,parts,stop", [
    ("STOP", [{"text": "a"}], ir.END_TURN),
    ("MAX_TOKENS", [{"text": "a"}], ir.MAX_TOKENS),
    ("MAX_TOKENS", [{"functionCall": {"name": "f", "args": {}}}], ir.MAX_TOKENS),
    ("SAFETY", [], ir.SAFETY),
    ("RECITATION", [], ir.SAFETY),
    ("PROHIBITED_CONTENT", [], ir.SAFETY),
    ("SPII", [], ir.SAFETY),
    ("MALFORMED_FUNCTION_CALL", [], ir.ERROR),
    ("LANGUAGE", [], ir.OTHER),
    ("SOMETHING_NEW", [], ir.OTHER),
])
def test_read_response_finish_reasons(finish, parts, stop):
    body = {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish}]}
    assert g.read_response(orjson.dumps(body)).stop_reason == stop


def test_read_response_prompt_blocked():
    body = {"promptFeedback": {"blockReason": "SAFETY"},
            "usageMetadata": {"promptTokenCount": 5, "totalTokenCount": 5}}
    resp = g.read_response(orjson.dumps(body))
    assert resp.stop_reason == ir.SAFETY and resp.content == [] and resp.usage.input_tokens == 5


def test_read_response_bad_bodies():
    for body in (b"not json", b"[1]", b'"x"'):
        with pytest.raises(ir.CodecError):
            g.read_response(body)
    # odd but valid shapes degrade instead of failing
    odd = b'{"candidates": [{"content": {"parts": [7, {"text": 1}]}}]}'
    assert g.read_response(odd).content == []


def test_write_response_validates_with_the_sdk():
    resp = ir.Response()
    resp.id = "golden-id"
    resp.model = "claude-x"
    resp.stop_reason = ir.TOOL_USE_STOP
    resp.content = [
        ir.Block(ir.THINKING, text="hmm", signature="EqQBCkgIARABGAIiQA=="),
        ir.Block(ir.THINKING, text="", redacted=True, data="opaque"),
        ir.Block(ir.THINKING, text="odd", signature="not base64!"),
        ir.text_block("Calling."),
        ir.Block(ir.TOOL_USE, id="toolu_9", name="f", input={"a": [1]}),
    ]
    resp.usage = ir.Usage(input_tokens=120, output_tokens=40, cache_read_tokens=100,
                          cache_write_tokens=10, reasoning_tokens=15)
    resp.logprobs = [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                      "top_logprobs": [{"token": "Hi", "logprob": -0.5}]}]
    body = orjson.loads(g.write_response(resp))
    sdk = types.GenerateContentResponse.model_validate(body)
    assert sdk.response_id == "golden-id" and sdk.model_version == "claude-x"
    assert sdk.text == "Calling."
    assert sdk.function_calls[0].name == "f" and sdk.function_calls[0].id == "toolu_9"
    cand = body["candidates"][0]
    assert cand["finishReason"] == "STOP"
    assert cand["content"]["parts"][:2] == [
        {"text": "hmm", "thought": True, "thoughtSignature": "EqQBCkgIARABGAIiQA=="},
        {"text": "odd", "thought": True}]
    assert body["usageMetadata"] == {"promptTokenCount": 120, "candidatesTokenCount": 25,
                                     "thoughtsTokenCount": 15, "cachedContentTokenCount": 100,
                                     "totalTokenCount": 160}
    assert cand["logprobsResult"] == {
        "topCandidates": [{"candidates": [{"token": "Hi", "logProbability": -0.5}]}],
        "chosenCandidates": [{"token": "Hi", "logProbability": -0.5}]}


@pytest.mark.parametrize("stop,finish", [
    (ir.END_TURN, "STOP"), (ir.STOP_SEQUENCE, "STOP"), (ir.TOOL_USE_STOP, "STOP"),
    (ir.MAX_TOKENS, "MAX_TOKENS"), (ir.SAFETY, "SAFETY"), (ir.REFUSAL, "OTHER"),
    (ir.PAUSE_TURN, "OTHER"), (ir.ERROR, "OTHER"), (ir.OTHER, "OTHER"),
])
def test_write_response_finish_reasons(stop, finish):
    resp = ir.Response()
    resp.stop_reason = stop
    assert orjson.loads(g.write_response(resp))["candidates"][0]["finishReason"] == finish


def test_response_round_trip():
    resp = g.read_response(orjson.dumps(RESPONSE))
    back = orjson.loads(g.write_response(resp))
    types.GenerateContentResponse.model_validate(back)
    assert g.read_response(orjson.dumps(back)).to_dict() == resp.to_dict()


def test_read_usage():
    u = g.read_usage(orjson.dumps(RESPONSE))
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.reasoning_tokens) == (
        100, 50, 60, 30)
    assert g.read_usage(b'{"candidates": []}').input_tokens == 0
    with pytest.raises(ir.CodecError):
        g.read_usage(b"{nope")


# ---------------------------------------------------------------------------------------------
# stream decoder


def _sse(*chunks, eol=b"\r\n"):
    return b"".join(b"data: " + orjson.dumps(c) + eol + eol for c in chunks)


def _decode(data, step=None, close=True):
    dec = g.StreamDecoder()
    events = []
    step = step or len(data) or 1
    for i in range(0, len(data), step):
        events += dec.feed(data[i:i + step])
    if close:
        events += dec.close()
    return events


def _shape(events):
    out = []
    for e in events:
        if e.kind == ir.BLOCK_START:
            out.append(("start", e.index, e.block.kind))
        elif e.kind == ir.BLOCK_DELTA:
            out.append(("delta", e.index, e.delta_kind, e.text))
        elif e.kind == ir.BLOCK_STOP:
            out.append(("stop", e.index))
        elif e.kind == ir.MESSAGE_START:
            out.append(("message_start", e.id, e.model))
        elif e.kind == ir.MESSAGE_DELTA:
            out.append(("message_delta", e.stop_reason))
        elif e.kind == ir.MESSAGE_STOP:
            out.append(("message_stop",))
        elif e.kind == ir.EVENT_ERROR:
            out.append(("error", e.error_kind, e.message))
    return out


def _chunk(parts, finish=None, usage=None, **kw):
    cand = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        cand["finishReason"] = finish
    c = {"candidates": [cand], "modelVersion": "gemini-2.5-flash", "responseId": "r1"}
    if usage:
        c["usageMetadata"] = usage
    c.update(kw)
    return c


TEXT_STREAM = [
    _chunk([{"text": "Hel"}], usage={"promptTokenCount": 7, "totalTokenCount": 7}),
    _chunk([{"text": "lo"}]),
    _chunk([{"text": "!"}], "STOP", {"promptTokenCount": 7, "candidatesTokenCount": 3,
                                     "totalTokenCount": 10}),
]


@pytest.mark.parametrize("step", [1, 3, 7, None])
@pytest.mark.parametrize("eol", [b"\r\n", b"\n"])
def test_decode_text_stream(step, eol):
    events = _decode(_sse(*TEXT_STREAM, eol=eol), step)
    assert _shape(events) == [
        ("message_start", "r1", "gemini-2.5-flash"), ("start", 0, ir.TEXT),
        ("delta", 0, ir.DELTA_TEXT, "Hel"), ("delta", 0, ir.DELTA_TEXT, "lo"),
        ("delta", 0, ir.DELTA_TEXT, "!"), ("stop", 0), ("message_delta", ir.END_TURN),
        ("message_stop",)]
    assert events[0].usage.input_tokens == 7 and events[0].usage.input_known
    u = events[-2].usage
    assert (u.input_tokens, u.output_tokens) == (7, 3)


@pytest.mark.parametrize("step", [1, 5, None])
def test_decode_json_array_framing(step):
    data = b"[" + b",\r\n".join(
        orjson.dumps(c, option=orjson.OPT_INDENT_2) for c in TEXT_STREAM) + b"]"
    assert _shape(_decode(data, step)) == _shape(_decode(_sse(*TEXT_STREAM)))
    # strings containing brackets and escaped quotes do not confuse the splitter
    tricky = [_chunk([{"text": 'a "}] [{" \\'}], "STOP")]
    events = _decode(b"\n[" + orjson.dumps(tricky[0]) + b"]\n", 2)
    assert _shape(events)[2] == ("delta", 0, ir.DELTA_TEXT, 'a "}] [{" \\')


def test_decode_function_call_and_thoughts():
    stream = _sse(
        _chunk([{"text": "Planning", "thought": True}]),
        _chunk([{"text": " more", "thought": True}, {"text": "", "thought": True,
                                                     "thoughtSignature": "c2ln"}]),
        _chunk([{"text": "again", "thought": True}]),
        _chunk([{"text": "Checking."}]),
        _chunk([{"functionCall": {"name": "weather", "args": {"city": "Paris"}},
                 "thoughtSignature": "Zm9v"},
                {"functionCall": {"name": "time", "args": {}}}],
               "STOP", {"promptTokenCount": 10, "candidatesTokenCount": 5,
                        "thoughtsTokenCount": 8, "totalTokenCount": 23}),
    )
    events = _decode(stream, 4)
    shape = _shape(events)
    assert shape == [
        ("message_start", "r1", "gemini-2.5-flash"),
        ("start", 0, ir.THINKING), ("delta", 0, ir.DELTA_THINKING, "Planning"),
        ("delta", 0, ir.DELTA_THINKING, " more"), ("delta", 0, ir.DELTA_SIGNATURE, "c2ln"),
        ("stop", 0),
        ("start", 1, ir.THINKING), ("delta", 1, ir.DELTA_THINKING, "again"), ("stop", 1),
        ("start", 2, ir.TEXT), ("delta", 2, ir.DELTA_TEXT, "Checking."), ("stop", 2),
        ("start", 3, ir.TOOL_USE), ("delta", 3, ir.DELTA_INPUT_JSON, '{"city":"Paris"}'),
        ("stop", 3),
        ("start", 4, ir.TOOL_USE), ("delta", 4, ir.DELTA_INPUT_JSON, "{}"), ("stop", 4),
        ("message_delta", ir.TOOL_USE_STOP), ("message_stop",)]
    call1, call2 = events[12].block, events[15].block
    assert call1.name == "weather" and call2.name == "time"
    assert call1.id.startswith("call_") and call1.id != call2.id
    u = events[-2].usage
    assert (u.input_tokens, u.output_tokens, u.reasoning_tokens) == (10, 13, 8)


def test_decode_logprobs_ride_on_text_deltas():
    lr = {"topCandidates": [{"candidates": [{"token": "A", "logProbability": -0.2}]}],
          "chosenCandidates": [{"token": "A", "logProbability": -0.2}]}
    events = _decode(_sse(dict(_chunk([{"text": "A"}], "STOP"),
                               candidates=[{"content": {"parts": [{"text": "A"}]},
                                            "finishReason": "STOP", "logprobsResult": lr}])))
    (delta,) = [e for e in events if e.kind == ir.BLOCK_DELTA]
    assert delta.data == [{"token": "A", "logprob": -0.2,
                           "top_logprobs": [{"token": "A", "logprob": -0.2}]}]


def test_decode_unfinished_stream_emits_nothing_more_on_close():
    dec = g.StreamDecoder()
    events = dec.feed(_sse(TEXT_STREAM[0]))
    assert _shape(events)[-1] == ("delta", 0, ir.DELTA_TEXT, "Hel")
    assert dec.close() == []
    # a truncated last frame without its blank line still counts at close
    dec = g.StreamDecoder()
    dec.feed(_sse(TEXT_STREAM[0]))
    tail = b"data: " + orjson.dumps(TEXT_STREAM[2])
    assert dec.feed(tail) == []
    assert _shape(dec.close())[-1] == ("message_stop",)


def test_decode_upstream_error_frame():
    events = _decode(_sse(TEXT_STREAM[0], {"error": {"code": 429, "message": "slow down",
                                                     "status": "RESOURCE_EXHAUSTED"}},
                          TEXT_STREAM[1]))
    assert _shape(events)[-1] == ("error", "rate_limit", "slow down")
    assert _shape(_decode(_sse({"error": {"status": "UNAVAILABLE"}})))[-1][:2] == (
        "error", "overloaded")


@pytest.mark.parametrize("data", [
    b"data: {not json}\r\n\r\n",
    b"data: [1, 2]\r\n\r\n",
    b"[1, 2]",
    b"[{\"a\": 1} garbage",
])
def test_decode_garbage_is_a_codec_error(data):
    # Issue 7: one policy in every codec. A malformed frame used to become a synthesised
    # EV_ERROR here; it now raises, as in the openai, cohere and bedrock decoders.
    with pytest.raises(ir.CodecError) as e:
        _decode(data, 3)
    assert str(e.value) == "The upstream sent a stream frame busbar could not read."


def test_decode_binary_noise_without_frames_is_nothing():
    assert _decode(b"\x00\x01\x02\xff\r\n\r\n", 3) == []


@pytest.mark.parametrize("sse_mode", [True, False])
def test_decode_oversized_frame_is_a_codec_error(sse_mode):
    dec = g.StreamDecoder(max_frame=64)
    head = b"data: {\"x\": \"" if sse_mode else b'[{"x": "'
    dec.feed(head + b"a" * 50)
    with pytest.raises(ir.CodecError) as e:
        dec.feed(b"a" * 50)
    assert str(e.value) == "The upstream sent a stream frame larger than busbar accepts."


def test_decode_garbage_fuzz_raises_only_codec_error():
    import random
    rng = random.Random(11)
    base = _sse(*TEXT_STREAM)
    for _ in range(2000):
        b = bytearray(base)
        for _ in range(rng.randint(1, 5)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        try:
            _decode(bytes(b), rng.randint(1, 9))
        except ir.CodecError:
            pass


def test_decode_prompt_blocked_stream():
    events = _decode(_sse({"promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
                           "usageMetadata": {"promptTokenCount": 4}}))
    assert _shape(events)[-2:] == [("message_delta", ir.SAFETY), ("message_stop",)]


# ---------------------------------------------------------------------------------------------
# stream encoder


def _events_for_tool_turn():
    u0 = ir.Usage(input_tokens=12, input_known=True)
    use = ir.Block(ir.TOOL_USE, id="toolu_1", name="weather")
    return [
        ir.ev_message_start("up-1", "claude-x", u0),
        ir.ev_block_start(0, ir.Block(ir.THINKING, text="")),
        ir.ev_block_delta(0, ir.DELTA_THINKING, "hmm"),
        ir.ev_block_delta(0, ir.DELTA_SIGNATURE, "c2lnbmF0dXJl"),
        ir.ev_block_stop(0),
        ir.ev_block_start(1, ir.text_block("")),
        ir.ev_block_delta(1, ir.DELTA_TEXT, "Let me check."),
        ir.ev_block_stop(1),
        ir.ev_block_start(2, use),
        ir.ev_block_delta(2, ir.DELTA_INPUT_JSON, '{"ci'),
        ir.ev_block_delta(2, ir.DELTA_INPUT_JSON, 'ty": "Paris"}'),
        ir.ev_block_stop(2),
        ir.ev_message_delta(ir.TOOL_USE_STOP, None, ir.Usage(input_tokens=12, output_tokens=30,
                                                             reasoning_tokens=10)),
        ir.ev_message_stop(),
    ]


def _sse_chunks(data):
    assert data.endswith(b"\r\n\r\n")
    frames = data.split(b"\r\n\r\n")[:-1]
    assert all(f.startswith(b"data: ") for f in frames)
    return [orjson.loads(f[6:]) for f in frames]


def test_encode_sse():
    enc = g.StreamEncoder("golden-id", "target-model")
    data = b"".join(enc.encode([e]) for e in _events_for_tool_turn())
    chunks = _sse_chunks(data)
    for c in chunks:
        sdk = types.GenerateContentResponse.model_validate(c)
        assert sdk.response_id == "golden-id" and sdk.model_version == "target-model"
    parts = [c["candidates"][0]["content"]["parts"] for c in chunks]
    assert parts == [
        [{"text": "hmm", "thought": True}],
        [{"text": "", "thought": True, "thoughtSignature": "c2lnbmF0dXJl"}],
        [{"text": "Let me check."}],
        [{"functionCall": {"name": "weather", "args": {"city": "Paris"}, "id": "toolu_1"}}],
        [{"text": ""}]]
    last = chunks[-1]
    assert last["candidates"][0]["finishReason"] == "STOP"
    assert last["usageMetadata"] == {"promptTokenCount": 12, "candidatesTokenCount": 20,
                                     "thoughtsTokenCount": 10, "totalTokenCount": 42}
    assert all("usageMetadata" not in c for c in chunks[:-1])
    assert enc.encode([ir.ev_message_stop()]) == b""  # the stream is over
    assert enc.error("api_error", "late") == b""


def test_encode_json_array():
    enc = g.StreamEncoder("golden-id", "target-model")
    enc.json_array = True
    data = enc.encode(_events_for_tool_turn())
    assert data.startswith(b"[{") and data.endswith(b"}]") and b",\r\n{" in data
    chunks = json.loads(data)
    assert len(chunks) == 5
    for c in chunks:
        types.GenerateContentResponse.model_validate(c)


def test_encode_input_backfill_and_logprobs():
    enc = g.StreamEncoder("i", "m")
    delta = ir.ev_block_delta(0, ir.DELTA_TEXT, "A")
    delta.data = [{"token": "A", "logprob": -0.1, "top_logprobs": []}]
    data = enc.encode([
        ir.ev_message_start("x", "m", ir.Usage(input_tokens=9, cache_read_tokens=4)),
        ir.ev_block_start(0, ir.text_block("")), delta, ir.ev_block_stop(0),
        ir.ev_message_delta(ir.MAX_TOKENS, None, ir.Usage(output_tokens=1, input_known=False)),
        ir.ev_message_stop()])
    first, last = _sse_chunks(data)
    assert first["candidates"][0]["logprobsResult"]["chosenCandidates"] == [
        {"token": "A", "logProbability": -0.1}]
    assert last["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert last["usageMetadata"] == {"promptTokenCount": 9, "candidatesTokenCount": 1,
                                     "cachedContentTokenCount": 4, "totalTokenCount": 10}


def test_encode_errors():
    enc = g.StreamEncoder("i", "m")
    data = enc.encode([ir.ev_message_start("x", "m", ir.Usage()),
                       ir.ev_block_start(0, ir.text_block("")),
                       ir.ev_block_delta(0, ir.DELTA_TEXT, "partial"),
                       ir.ev_error("overloaded", "The upstream is overloaded.")])
    chunks = _sse_chunks(data)
    assert chunks[-1] == {"error": {"code": 503, "message": "The upstream is overloaded.",
                                    "status": "UNAVAILABLE"}}
    assert enc.encode([ir.ev_block_delta(0, ir.DELTA_TEXT, "more")]) == b""

    enc = g.StreamEncoder("i", "m")
    enc.json_array = True
    data = enc.encode([ir.ev_block_delta(0, ir.DELTA_TEXT, "partial")]) + enc.error(
        "timeout", "Timed out.")
    assert json.loads(data)[-1] == {"error": {"code": 504, "message": "Timed out.",
                                              "status": "DEADLINE_EXCEEDED"}}
    enc = g.StreamEncoder("i", "m")
    enc.json_array = True
    assert json.loads(enc.error("api_error", "x")) == [
        {"error": {"code": 500, "message": "x", "status": "INTERNAL"}}]


def test_decoder_encoder_round_trip():
    data = _sse(*TEXT_STREAM)
    enc = g.StreamEncoder("r1", "gemini-2.5-flash")
    out = enc.encode(_decode(data, 5))
    assert _shape(_decode(out)) == _shape(_decode(data))


class _Upstream(http.server.BaseHTTPRequestHandler):
    """Serves the encoder's bytes to the real google-genai client over a socket."""
    payload = b""
    content_type = "text/event-stream"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.do_GET()

    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", self.content_type)
        self.send_header("content-length", str(len(self.payload)))
        self.end_headers()
        self.wfile.write(self.payload)

    def log_message(self, *args):
        pass


@pytest.fixture
def upstream():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Upstream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _client(server):
    # the caller keeps the client alive: a collected Client closes its HTTP session
    return genai.Client(api_key="k", http_options=types.HttpOptions(
        base_url="http://127.0.0.1:%d" % server.server_port))


def test_sdk_reads_the_encoded_stream(upstream):
    enc = g.StreamEncoder("golden-id", "target-model")
    _Upstream.payload = enc.encode(_events_for_tool_turn())
    client = _client(upstream)
    chunks = list(client.models.generate_content_stream(model="m", contents="hi"))
    assert [c.response_id for c in chunks] == ["golden-id"] * 5
    assert chunks[2].text == "Let me check."
    assert chunks[3].function_calls[0].args == {"city": "Paris"}
    assert chunks[-1].usage_metadata.total_token_count == 42


def test_sdk_raises_on_the_encoded_error_frame(upstream):
    enc = g.StreamEncoder("golden-id", "target-model")
    _Upstream.payload = enc.encode([ir.ev_block_delta(0, ir.DELTA_TEXT, "x"),
                                    ir.ev_error("rate_limit", "Slow down.")])
    client = _client(upstream)
    with pytest.raises(genai_errors.ClientError) as e:
        list(client.models.generate_content_stream(model="m", contents="hi"))
    assert e.value.code == 429 and "Slow down." in str(e.value)


def test_sdk_reads_the_buffered_response(upstream):
    _Upstream.content_type = "application/json"
    _Upstream.payload = g.write_response(g.read_response(orjson.dumps(RESPONSE)))
    client = _client(upstream)
    try:
        resp = client.models.generate_content(model="m", contents="hi")
    finally:
        _Upstream.content_type = "text/event-stream"
    assert resp.text == "It is sunny." and len(resp.function_calls) == 2


# ---------------------------------------------------------------------------------------------
# errors, discovery, ids


@pytest.mark.parametrize("status,name", [
    (400, "INVALID_ARGUMENT"), (403, "PERMISSION_DENIED"),
    (404, "NOT_FOUND"), (413, "INVALID_ARGUMENT"), (429, "RESOURCE_EXHAUSTED"),
    (500, "INTERNAL"), (501, "UNIMPLEMENTED"), (502, "INTERNAL"), (503, "UNAVAILABLE"),
    (504, "DEADLINE_EXCEEDED"),
])
def test_write_error(status, name):
    body = orjson.loads(g.write_error(status, ir.kind_of_status(status), "msg", "req_1"))
    assert body == {"error": {"code": status, "message": "msg", "status": name}}


def test_write_error_authentication_status_is_the_callers():
    body = orjson.loads(g.write_error(401, "authentication", "msg"))
    assert (body["error"]["code"], body["error"]["status"]) == (401, "UNAUTHENTICATED")
    assert body["error"]["details"][0]["reason"] == "API_KEY_INVALID"


def test_write_error_bad_key():
    body = orjson.loads(g.write_error(400, "authentication",
                                      "API key not valid. Please pass a valid API key."))
    assert body == {"error": {
        "code": 400, "message": "API key not valid. Please pass a valid API key.",
        "status": "INVALID_ARGUMENT",
        "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                     "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]}}


def test_read_error_detail_message():
    assert g.read_error_detail(g.write_error(404, "not_found", "models/x is not found"))[0] == (
        "models/x is not found")
    assert g.read_error_detail(b'[{"error": {"code": 500, "message": "boom"}}]')[0] == "boom"
    for body in (b"", b"<html>", b"{}", b'{"error": "x"}', b"[]", b'{"error": {"message": 1}}'):
        assert g.read_error_detail(body)[0] is None


def test_write_model_list(upstream):
    assert orjson.loads(g.write_model_list(["fast", "gemini-2.5-flash"])) == {"models": [
        {"name": "models/fast", "displayName": "fast",
         "supportedGenerationMethods": ["generateContent", "streamGenerateContent"]},
        {"name": "models/gemini-2.5-flash", "displayName": "gemini-2.5-flash",
         "supportedGenerationMethods": ["generateContent", "streamGenerateContent"]}]}
    _Upstream.content_type = "application/json"
    _Upstream.payload = g.write_model_list(["fast", "gemini-2.5-flash"])
    client = _client(upstream)
    try:
        models = list(client.models.list())
    finally:
        _Upstream.content_type = "text/event-stream"
    assert [(m.name, m.display_name) for m in models] == [
        ("models/fast", "fast"), ("models/gemini-2.5-flash", "gemini-2.5-flash")]
    assert models[0].supported_actions == ["generateContent", "streamGenerateContent"]


def test_module_names():
    assert g.NAME == "gemini"
    assert g.CONTENT_TYPE == b"application/json"
    assert g.STREAM_CONTENT_TYPE == b"text/event-stream"
    ids = {g.mint_id() for _ in range(100)}
    assert len(ids) == 100 and all(len(i) >= 20 and i.isascii() for i in ids)


def test_signature_check_matches_the_sdk_decoder():
    """A thoughtSignature goes to a Gemini client only when the SDK can decode it."""
    import random
    rng = random.Random(3)
    alphabet = "AQgwBb+/-_=Zz09 .!"
    for _ in range(3000):
        sig = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
        resp = ir.Response()
        resp.content = [ir.Block(ir.THINKING, text="t", signature=sig)]
        body = orjson.loads(g.write_response(resp))
        types.GenerateContentResponse.model_validate(body)  # never fails
        try:
            types.Part.model_validate({"thoughtSignature": sig})
            sdk_ok = True
        except Exception:
            sdk_ok = False
        assert ("thoughtSignature" in body["candidates"][0]["content"]["parts"][0]) == sdk_ok, sig


# The conversation field given as a string, a number, an object or null: a wrong type is reported
# as a wrong type (never as missing), in gemini's own words (jsonget's getters, GeminiShape).
@pytest.mark.parametrize("value, message", [
    ('hi', "Invalid value at 'contents': expected a list."),
    (3, "Invalid value at 'contents': expected a list."),
    ({'role': 'user'}, "Invalid value at 'contents': expected a list."),
    (None, '* GenerateContentRequest.contents: contents is not specified'),
])
def test_read_request_conversation_field_type(value, message):
    import orjson as _orjson
    from cbusbar import ir as _ir
    from cbusbar.proto import gemini as _codec
    body = {}
    body['contents'] = value
    if message is None:
        _codec.read_request(_orjson.dumps(body))
        return
    with pytest.raises(_ir.CodecError) as e:
        _codec.read_request(_orjson.dumps(body))
    assert str(e.value) == message


def test_arguments_that_are_not_one_object_keep_their_text():
    """Issue #34 (7): args is an object on Gemini's wire; the model's text goes under
    _raw_arguments (arguments.pxd), in the stream as in a buffered answer."""
    events = [ir.ev_message_start("u", "m", ir.Usage(input_tokens=1)),
              ir.ev_block_start(0, ir.Block(ir.TOOL_USE, id="c1", name="f")),
              ir.ev_block_delta(0, ir.DELTA_INPUT_JSON, "not "), ir.ev_block_delta(0, ir.DELTA_INPUT_JSON, "json"),
              ir.ev_block_stop(0),
              ir.ev_message_delta(ir.TOOL_USE_STOP, None, ir.Usage(1, 1)), ir.ev_message_stop()]
    chunks = _sse_chunks(g.StreamEncoder("golden-id", "target-model").encode(events))
    for c in chunks:
        types.GenerateContentResponse.model_validate(c)
    assert chunks[0]["candidates"][0]["content"]["parts"] == [
        {"functionCall": {"name": "f", "args": {"_raw_arguments": "not json"}, "id": "c1"}}]
    resp = ir.Response()
    resp.content = [ir.Block(ir.TOOL_USE, id="c1", name="f", input="[1, 2]")]
    resp.stop_reason, resp.usage = ir.TOOL_USE_STOP, ir.Usage(1, 1)
    got = types.GenerateContentResponse.model_validate_json(g.write_response(resp))
    assert got.candidates[0].content.parts[0].function_call.args == {"_raw_arguments": "[1, 2]"}
