"""The Bedrock Converse codec, fed bytes. The wire authority is botocore: its service model
validates what busbar writes, and a boto3 client (HTTP layer stubbed in-process through botocore's
`before-send` hook, so nothing leaves the process) sends the requests busbar reads and parses the
responses and streams busbar writes."""
import base64
import random
import uuid

import boto3
import botocore.session
import orjson
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import EventStreamError as BotoEventStreamError
from botocore.validate import validate_parameters

from cbusbar import ir
from cbusbar.eventstream import EventStreamParser, encode_frame, encode_headers
from cbusbar.proto import bedrock

MODEL = botocore.session.get_session().get_service_model("bedrock-runtime")
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
PDF = base64.b64encode(b"%PDF-1.4 fake").decode()


# ---------------------------------------------------------------------------------------------
# botocore plumbing


class _Raw:
    """The raw HTTP body botocore reads: `stream()` yields it in small chunks."""

    def __init__(self, data, chunk=7):
        self.data, self.chunk = data, chunk

    def stream(self, **_):
        for i in range(0, len(self.data), self.chunk):
            yield self.data[i:i + self.chunk]

    def close(self):
        pass


def stub_client(status=200, headers=None, body=b"{}"):
    """A boto3 bedrock-runtime client whose HTTP layer answers (status, headers, body) in-process;
    the request it would have sent is kept in `sent`."""
    client = boto3.client("bedrock-runtime", region_name="us-east-1",
                          aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="secret",
                          config=Config(retries={"max_attempts": 0}))
    sent = []

    def send(request, **_):
        sent.append(request)
        return AWSResponse(request.url, status, headers or {}, _Raw(body))

    client.meta.events.register("before-send.bedrock-runtime.*", send)
    return client, sent


def boto3_body(**params):
    """The exact body boto3 sends for client.converse(**params)."""
    client, sent = stub_client(body=orjson.dumps({
        "output": {"message": {"role": "assistant", "content": []}}, "stopReason": "end_turn",
        "usage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0},
        "metrics": {"latencyMs": 0}}))
    client.converse(modelId="anthropic.claude-3-5-sonnet-20240620-v1:0", **params)
    return sent[0].body


def _as_params(value, shape):
    """A JSON wire value as the Python params botocore validates: blobs decoded from base64,
    unknown keys kept so that the validator reports them."""
    if shape.type_name == "structure" and not shape.is_document_type:
        if not isinstance(value, dict):
            return value
        return {k: _as_params(v, shape.members[k]) if k in shape.members else v
                for k, v in value.items()}
    if shape.type_name == "list" and isinstance(value, list):
        return [_as_params(v, shape.member) for v in value]
    if shape.type_name == "map" and isinstance(value, dict):
        return {k: _as_params(v, shape.value) for k, v in value.items()}
    if shape.type_name == "blob" and isinstance(value, str):
        return base64.b64decode(value)
    return value


def assert_valid_request(body):
    shape = MODEL.operation_model("Converse").input_shape
    params = _as_params(orjson.loads(body), shape)
    params["modelId"] = "m"
    validate_parameters(params, shape)


def assert_valid_response(body):
    validate_parameters(_as_params(orjson.loads(body), MODEL.operation_model("Converse").output_shape),
                        MODEL.operation_model("Converse").output_shape)


def frame(event_type, payload):
    """A ConverseStream event frame as AWS sends it (padding field included)."""
    payload = dict(payload, p="abcdefghijklmnop")
    return encode_frame(encode_headers({":event-type": event_type, ":content-type": "application/json",
                                        ":message-type": "event"}), orjson.dumps(payload))


def exception_frame(exception_type, message):
    return encode_frame(encode_headers({":exception-type": exception_type,
                                        ":content-type": "application/json",
                                        ":message-type": "exception"}), orjson.dumps({"message": message}))


def decode_all(data, step=7):
    dec = bedrock.StreamDecoder()
    out = []
    for i in range(0, len(data), step):
        out += dec.feed(data[i:i + step])
    out += dec.close()
    return [e.to_dict() for e in out]


def blk(kind, **fields):
    return ir.Block(kind, **fields)


def request(**fields):
    req = ir.Request()
    for k, v in fields.items():
        setattr(req, k, v)
    return req


# ---------------------------------------------------------------------------------------------
# Module names


def test_module_names():
    assert bedrock.NAME == "bedrock"
    assert bedrock.CONTENT_TYPE == b"application/json"
    assert bedrock.STREAM_CONTENT_TYPE == b"application/vnd.amazon.eventstream"


@pytest.mark.parametrize("model", [
    "anthropic.claude-3-5-sonnet-20241022-v2:0",
    "us.anthropic.claude-3-7-sonnet-20250219-v1:0",
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.meta.llama3-2-90b-instruct-v1:0",
    "amazon.nova-pro-v1:0",
])
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_path_is_what_boto3_sends(model, stream):
    client, sent = stub_client(body=b"")
    call = client.converse_stream if stream else client.converse
    try:
        call(modelId=model, messages=[{"role": "user", "content": [{"text": "hi"}]}])
    except Exception:
        pass  # the stubbed answer is empty; only the request matters here
    path = sent[0].url.split("amazonaws.com", 1)[1]
    assert bedrock.upstream_path(model, stream) == path
    assert "%3A" in path and ":" not in path


def test_upstream_path_cache_keeps_answering_past_its_bound():
    from urllib.parse import quote
    for _ in range(2):
        for i in range(600):
            m = "vendor.model-%d:0/x" % i
            assert bedrock.upstream_path(m, i % 2 == 0) == "/model/" + quote(m, safe="") + (
                "/converse-stream" if i % 2 == 0 else "/converse")


# ---------------------------------------------------------------------------------------------
# read_request


def test_reads_what_boto3_sends():
    body = boto3_body(
        messages=[
            {"role": "user", "content": [
                {"text": "What is in this picture?"},
                {"image": {"format": "png", "source": {"bytes": b"\x89PNG\r\n\x1a\nfake"}}},
                {"document": {"format": "pdf", "name": "Q3 report", "source": {"bytes": b"%PDF-1.4 fake"}}},
                {"cachePoint": {"type": "default"}},
            ]},
            {"role": "assistant", "content": [
                {"reasoningContent": {"reasoningText": {"text": "Look closer.", "signature": "c2ln"}}},
                {"reasoningContent": {"redactedContent": b"opaque"}},
                {"text": "Let me check."},
                {"toolUse": {"toolUseId": "tooluse_1", "name": "lookup", "input": {"q": "cat"}}},
            ]},
            {"role": "user", "content": [
                {"toolResult": {"toolUseId": "tooluse_1", "status": "error",
                                "content": [{"json": {"found": False}}, {"text": "not found"}]}},
            ]},
        ],
        system=[{"text": "You are terse."}, {"cachePoint": {"type": "default", "ttl": "1h"}}],
        inferenceConfig={"maxTokens": 512, "temperature": 0.7, "topP": 0.9, "stopSequences": ["END"]},
        toolConfig={"tools": [{"toolSpec": {"name": "lookup", "description": "Find things.",
                                            "inputSchema": {"json": {"type": "object"}}}},
                              {"cachePoint": {"type": "default"}}],
                    "toolChoice": {"tool": {"name": "lookup"}}},
        additionalModelRequestFields={"thinking": {"type": "enabled", "budget_tokens": 2048},
                                      "top_k": 40},
        guardrailConfig={"guardrailIdentifier": "gr1", "guardrailVersion": "1"},
        performanceConfig={"latency": "optimized"},
        requestMetadata={"team": "search"},
        promptVariables={"topic": {"text": "cats"}},
    )
    req = bedrock.read_request(body)
    assert req.model is None and req.stream is False  # path-model: the engine sets both
    assert [(b.text, b.cache_control) for b in req.system] == [
        ("You are terse.", {"type": "ephemeral", "ttl": "1h"})]
    user, assistant, result = req.messages
    assert user.role == ir.USER and assistant.role == ir.ASSISTANT and result.role == ir.USER
    text, image, doc = user.content
    assert text.text == "What is in this picture?"
    assert (image.kind, image.src_kind, image.media_type, image.data) == (
        ir.IMAGE, ir.SOURCE_BASE64, "image/png", PNG)
    assert (doc.kind, doc.name, doc.media_type, doc.data) == (ir.DOCUMENT, "Q3 report", "application/pdf", PDF)
    assert doc.cache_control == {"type": "ephemeral"}
    thinking, redacted, said, call = assistant.content
    assert (thinking.kind, thinking.text, thinking.signature) == (ir.THINKING, "Look closer.", "c2ln")
    assert redacted.redacted and redacted.data == base64.b64encode(b"opaque").decode()
    assert said.text == "Let me check."
    assert (call.kind, call.id, call.name, call.input) == (ir.TOOL_USE, "tooluse_1", "lookup", {"q": "cat"})
    (res,) = result.content
    assert res.kind == ir.TOOL_RESULT and res.id == "tooluse_1" and res.is_error
    assert [c.text for c in res.content] == ['{"found":false}', "not found"]
    assert (req.max_tokens, req.temperature, req.top_p, req.stop) == (512, 0.7, 0.9, ["END"])
    assert [(t.name, t.description, t.schema) for t in req.tools] == [
        ("lookup", "Find things.", {"type": "object"})]
    assert req.tools[0].cache_control == {"type": "ephemeral"}
    assert (req.tool_choice, req.tool_choice_name) == (ir.TOOL_CHOICE_TOOL, "lookup")
    assert req.reasoning_budget == 2048 and req.top_k == 40
    assert set(req.extra) == {"additionalModelRequestFields", "guardrailConfig",
                              "performanceConfig", "requestMetadata", "promptVariables"}


@pytest.mark.parametrize("choice,want", [
    ({"auto": {}}, ir.TOOL_CHOICE_AUTO),
    ({"any": {}}, ir.TOOL_CHOICE_REQUIRED),
    (None, ir.TOOL_CHOICE_UNSET),
])
def test_reads_tool_choice(choice, want):
    cfg = {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {}}}}]}
    if choice is not None:
        cfg["toolChoice"] = choice
    req = bedrock.read_request(orjson.dumps({"messages": [], "toolConfig": cfg}))
    assert req.tool_choice == want


def test_reads_native_structured_output():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    req = bedrock.read_request(orjson.dumps({"messages": [], "outputConfig": {"textFormat": {
        "type": "json_schema",
        "structure": {"jsonSchema": {"schema": orjson.dumps(schema).decode(), "name": "count"}}}}}))
    assert (req.response_format, req.rf_schema, req.rf_name) == (ir.FORMAT_JSON_SCHEMA, schema, "count")
    # Same protocol: written back natively, not as a forced tool.
    assert bedrock.forced_tool_name(req) is None
    assert "toolConfig" not in orjson.loads(bedrock.write_request(req))


def test_reads_documents_of_every_source_and_drops_members_without_an_ir_home():
    req = bedrock.read_request(orjson.dumps({"messages": [{"role": "user", "content": [
        {"document": {"format": "txt", "name": "a", "source": {"text": "plain"}}},
        {"document": {"format": "md", "name": "b", "source": {"content": [{"text": "x"}, {"text": "y"}]}}},
        {"document": {"format": "pdf", "name": "c", "source": {"s3Location": {"uri": "s3://b/k.pdf"}}}},
        {"video": {"format": "mp4", "source": {"bytes": "AAAA"}}},
        {"audio": {"format": "mp3", "source": {"bytes": "AAAA"}}},
        {"guardContent": {"text": {"text": "guarded"}}},
        {"citationsContent": {"content": [{"text": "cited"}], "citations": [{"title": "t"}]}},
    ]}, {"role": "system", "content": [{"text": "from a system turn"}]}]}))
    a, b, c, guarded, cited = req.messages[0].content
    assert (a.text, a.media_type) == ("plain", "text/plain")
    assert b.text == "xy"
    assert (c.src_kind, c.data) == (ir.SOURCE_VENDOR, "s3://b/k.pdf")
    assert guarded.text == "guarded"
    assert cited.text == "cited" and cited.citations == [{"title": "t"}]
    assert [s.text for s in req.system] == ["from a system turn"]


@pytest.mark.parametrize("body,message", [
    (b"{not json", "We could not parse the JSON body of your request."),
    (b"", "We could not parse the JSON body of your request."),
    (b"[]", "The request body must be a JSON object."),
    (b'{"messages": {}}', "messages must be a list."),
    (b'{"messages": [1]}', "Each message must be an object with a role and content."),
    (b'{"messages": [{"role": "user"}]}', "Each message needs a content list."),
    (b'{"messages": [{"role": "tool", "content": []}]}', "Each message needs a role of user or assistant."),
    (b'{"messages": [{"role": "user", "content": [{"text": 5}]}]}', "A text content block must hold a string."),
    (b'{"messages": [{"role": "user", "content": ["hi"]}]}', "Each content block must be an object."),
    (b'{"messages": [{"role": "user", "content": [{"image": {"source": {"bytes": "AA"}}}]}]}',
     "An image content block needs a format (png, jpeg, gif or webp)."),
    (b'{"messages": [{"role": "user", "content": [{"image": {"format": "png", "source": {}}}]}]}',
     "An image source needs bytes or an s3Location."),
    (b'{"messages": [{"role": "assistant", "content": [{"toolUse": {"name": "f"}}]}]}',
     "A toolUse content block needs a toolUseId and a name."),
    (b'{"messages": [{"role": "user", "content": [{"toolResult": {"content": []}}]}]}',
     "A toolResult content block needs a toolUseId."),
    (b'{"system": "be nice"}', "system must be a list."),
    (b'{"inferenceConfig": {"maxTokens": "10"}}', "inferenceConfig.maxTokens must be an integer."),
    (b'{"inferenceConfig": {"maxTokens": true}}', "inferenceConfig.maxTokens must be an integer."),
    (b'{"inferenceConfig": {"temperature": "hot"}}', "inferenceConfig.temperature must be a number."),
    (b'{"inferenceConfig": {"stopSequences": [1]}}', "inferenceConfig.stopSequences must be a list of strings."),
    (b'{"toolConfig": {"tools": [{"toolSpec": {}}]}}', "Each toolSpec needs a name."),
    (b'{"toolConfig": {"tools": [], "toolChoice": {"tool": {}}}}', "toolConfig.toolChoice.tool needs a name."),
])
def test_bad_requests_raise_codec_error(body, message):
    with pytest.raises(ir.CodecError) as exc:
        bedrock.read_request(body)
    assert str(exc.value) == message


def _scramble(rng, value, depth=0):
    """Replaces random nodes of a JSON value with values of other types."""
    junk = [None, 0, -1, 1.5, True, "", "x", [], {}, [1, "a"], {"text": 1}, 2 ** 64 - 1, -(2 ** 63)]
    if rng.random() < 0.15:
        return rng.choice(junk)
    if isinstance(value, dict):
        return {k: _scramble(rng, v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_scramble(rng, v, depth + 1) for v in value]
    return value


def test_fuzzed_requests_raise_only_codec_error():
    rng = random.Random(7)
    seed = orjson.loads(boto3_body(
        messages=[{"role": "user", "content": [
            {"text": "hi"}, {"cachePoint": {"type": "default"}},
            {"image": {"format": "png", "source": {"bytes": b"img"}}},
            {"document": {"format": "pdf", "name": "d", "source": {"bytes": b"doc"}}}]},
            {"role": "assistant", "content": [
                {"reasoningContent": {"reasoningText": {"text": "t", "signature": "s"}}},
                {"toolUse": {"toolUseId": "t1", "name": "f", "input": {"a": [1, 2]}}}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [
                {"json": {"a": 1}}, {"text": "ok"}, {"image": {"format": "gif", "source": {"bytes": b"g"}}}]}}]}],
        system=[{"text": "s"}, {"cachePoint": {"type": "default"}}],
        inferenceConfig={"maxTokens": 5, "temperature": 0.5, "topP": 0.5, "stopSequences": ["x"]},
        toolConfig={"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {}}}}],
                    "toolChoice": {"tool": {"name": "f"}}},
        additionalModelRequestFields={"thinking": {"type": "enabled", "budget_tokens": 1024}}))
    for _ in range(3000):
        body = orjson.dumps(_scramble(rng, seed))
        try:
            req = bedrock.read_request(body)
        except ir.CodecError:
            continue
        bedrock.write_request(req)  # whatever was read can be written


# ---------------------------------------------------------------------------------------------
# write_request


def test_same_protocol_round_trip_is_lossless():
    original = {
        "messages": [
            {"role": "user", "content": [{"text": "hi"}, {"cachePoint": {"type": "default"}},
                                         {"image": {"format": "jpeg", "source": {"bytes": PNG}}}]},
            {"role": "assistant", "content": [
                {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig"}}},
                {"toolUse": {"toolUseId": "t1", "name": "f", "input": {"a": 1}}}]},
            {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "42"}],
                                                         "status": "error"}}]},
        ],
        "system": [{"text": "sys"}, {"cachePoint": {"type": "default"}}],
        "inferenceConfig": {"maxTokens": 100, "temperature": 0.7, "topP": 0.9, "stopSequences": ["a", "b"]},
        "toolConfig": {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {"type": "object"}},
                                               "description": "d"}}],
                       "toolChoice": {"auto": {}}},
        "additionalModelRequestFields": {"thinking": {"type": "enabled", "budget_tokens": 1024},
                                         "anthropic_beta": ["x"]},
        "guardrailConfig": {"guardrailIdentifier": "g", "guardrailVersion": "DRAFT"},
        "performanceConfig": {"latency": "optimized"},
        "promptVariables": {"v": {"text": "t"}},
        "requestMetadata": {"k": "v"},
        "additionalModelResponseFieldPaths": ["/stop_sequence"],
    }
    body = bedrock.write_request(bedrock.read_request(orjson.dumps(original)))
    assert orjson.loads(body) == original
    assert_valid_request(body)


def test_cross_protocol_write_drops_bedrock_only_fields():
    req = bedrock.read_request(orjson.dumps({
        "messages": [{"role": "user", "content": [{"text": "hi"}]}],
        "guardrailConfig": {"guardrailIdentifier": "g", "guardrailVersion": "1"},
        "additionalModelRequestFields": {"top_k": 5}}))
    req.extra = {}
    assert orjson.loads(bedrock.write_request(req)) == {
        "messages": [{"role": "user", "content": [{"text": "hi"}]}]}


def _rich_request():
    req = request(
        system=[ir.text_block("sys"), blk(ir.TEXT, text="cached sys", cache_control={"type": "ephemeral"})],
        messages=[
            ir.Message(ir.USER, [
                ir.text_block("look"),
                blk(ir.IMAGE, src_kind=ir.SOURCE_BASE64, media_type="image/webp", data=PNG,
                    cache_control={"type": "ephemeral", "ttl": "5m"}),
                blk(ir.IMAGE, src_kind=ir.SOURCE_URL, media_type="image/png", data="https://x/y.png"),
                blk(ir.IMAGE, src_kind=ir.SOURCE_VENDOR, media_type="image/png", data="file-abc"),
                blk(ir.IMAGE, src_kind=ir.SOURCE_VENDOR, media_type="image/png", data="s3://bucket/cat.png"),
                blk(ir.IMAGE, src_kind=ir.SOURCE_BASE64, media_type="image/tiff", data=PNG),
                blk(ir.DOCUMENT, src_kind=ir.SOURCE_BASE64, media_type="application/pdf", data=PDF,
                    name="report: Q3/2024  final.pdf"),
                blk(ir.DOCUMENT, text="plain words"),
                blk(ir.TEXT, text=""),
            ]),
            ir.Message(ir.ASSISTANT, [
                blk(ir.THINKING, text="think", signature="sig"),
                blk(ir.THINKING, redacted=True, data="b3BhcXVl"),
                ir.text_block("calling"),
                blk(ir.TOOL_USE, id="call_1", name="f", input={"a": 1}),
                blk(ir.TOOL_USE, id="call_2", name="g", input=None),
            ]),
            ir.Message(ir.USER, [blk(ir.TOOL_RESULT, id="call_1", content=[ir.text_block("1")])]),
            ir.Message(ir.USER, [blk(ir.TOOL_RESULT, id="call_2", is_error=True, content=[
                ir.text_block("boom"),
                blk(ir.IMAGE, src_kind=ir.SOURCE_BASE64, media_type="image/gif", data=PNG)])]),
            ir.Message(ir.USER, [ir.text_block("go on")]),
        ],
        tools=[ir.Tool("f", "does f", {"type": "object", "properties": {"a": {"type": "integer"}}}),
               ir.Tool("g", None, None, {"type": "ephemeral"})],
        tool_choice=ir.TOOL_CHOICE_AUTO, max_tokens=300, temperature=0.2, top_p=1, top_k=3,
        stop=["x", "y", "z", "w", "v", "u"], seed=5, frequency_penalty=0.1, user="u1",
        parallel_tool_calls=False,
    )
    return req


def _bedrock_cache_points(req):
    """The rich request's cache_control as the bedrock reader makes it (a Bedrock client's own
    cachePoints), which write_request writes back."""
    cp = bedrock.CachePoint
    req.system[1].cache_control = cp(type="ephemeral")
    req.messages[0].content[1].cache_control = cp(type="ephemeral", ttl="5m")
    req.tools[1].cache_control = cp(type="ephemeral")
    return req


def test_translated_cache_control_is_not_written_and_the_request_is_untouched():
    # Issue 7: the engine used to clear cache control (a transform step, since removed) before
    # writing for a Bedrock lane (busbar has no lane flag saying the model takes cachePoints; Nova
    # rejects them). The codec now leaves out cache control from another protocol itself, without
    # mutating the IR.
    req = _rich_request()
    got = orjson.loads(bedrock.write_request(req))
    assert "cachePoint" not in orjson.dumps(got).decode()
    assert req.system[1].cache_control == {"type": "ephemeral"}
    assert req.tools[1].cache_control == {"type": "ephemeral"}
    assert got == orjson.loads(bedrock.write_request(_bedrock_cache_points(_rich_request()))) | {
        "system": [{"text": "sys"}, {"text": "cached sys"}],
        "messages": got["messages"], "toolConfig": got["toolConfig"]}


def test_writes_every_block_kind_as_botocore_accepts_it():
    body = bedrock.write_request(_bedrock_cache_points(_rich_request()))
    assert_valid_request(body)
    got = orjson.loads(body)
    assert got["system"] == [{"text": "sys"}, {"text": "cached sys"}, {"cachePoint": {"type": "default"}}]
    user, assistant, results = got["messages"]
    assert user == {"role": "user", "content": [
        {"text": "look"},
        {"image": {"format": "webp", "source": {"bytes": PNG}}},
        {"cachePoint": {"type": "default", "ttl": "5m"}},
        # the URL, the foreign file id and the tiff are dropped; s3 is Bedrock's own reference
        {"image": {"format": "png", "source": {"s3Location": {"uri": "s3://bucket/cat.png"}}}},
        {"document": {"format": "pdf", "name": "report- Q3-2024 final-pdf", "source": {"bytes": PDF}}},
        {"document": {"format": "txt", "name": "document-2", "source": {"text": "plain words"}}},
    ]}
    assert assistant == {"role": "assistant", "content": [
        {"reasoningContent": {"reasoningText": {"text": "think", "signature": "sig"}}},
        {"reasoningContent": {"redactedContent": "b3BhcXVl"}},
        {"text": "calling"},
        {"toolUse": {"toolUseId": "call_1", "name": "f", "input": {"a": 1}}},
        {"toolUse": {"toolUseId": "call_2", "name": "g", "input": {}}},
    ]}
    # Consecutive user turns are merged: Converse requires alternating roles.
    assert results == {"role": "user", "content": [
        {"toolResult": {"toolUseId": "call_1", "content": [{"text": "1"}]}},
        {"toolResult": {"toolUseId": "call_2", "status": "error", "content": [
            {"text": "boom"}, {"image": {"format": "gif", "source": {"bytes": PNG}}}]}},
        {"text": "go on"},
    ]}
    # Bedrock does not clamp stop sequences; it has no seed, penalties, user or top_k knob.
    assert got["inferenceConfig"] == {"maxTokens": 300, "temperature": 0.2, "topP": 1,
                                      "stopSequences": ["x", "y", "z", "w", "v", "u"]}
    assert got["toolConfig"] == {"tools": [
        {"toolSpec": {"name": "f", "description": "does f", "inputSchema": {"json": {
            "type": "object", "properties": {"a": {"type": "integer"}}}}}},
        {"toolSpec": {"name": "g", "inputSchema": {"json": {"type": "object", "properties": {}}}}},
        {"cachePoint": {"type": "default"}},
    ], "toolChoice": {"auto": {}}}
    assert set(got) == {"messages", "system", "inferenceConfig", "toolConfig"}


@pytest.mark.parametrize("choice,name,want", [
    (ir.TOOL_CHOICE_AUTO, None, {"auto": {}}),
    (ir.TOOL_CHOICE_REQUIRED, None, {"any": {}}),
    (ir.TOOL_CHOICE_TOOL, "f", {"tool": {"name": "f"}}),
    (ir.TOOL_CHOICE_NONE, None, None),   # no Converse form: dropped, tools kept
    (ir.TOOL_CHOICE_UNSET, None, None),
])
def test_writes_tool_choice(choice, name, want):
    req = request(messages=[ir.Message(ir.USER, [ir.text_block("hi")])], tools=[ir.Tool("f")],
                  tool_choice=choice, tool_choice_name=name)
    cfg = orjson.loads(bedrock.write_request(req))["toolConfig"]
    assert cfg.get("toolChoice") == want
    assert [t["toolSpec"]["name"] for t in cfg["tools"]] == ["f"]


@pytest.mark.parametrize("choice", [ir.TOOL_CHOICE_AUTO, ir.TOOL_CHOICE_REQUIRED, ir.TOOL_CHOICE_TOOL])
def test_no_tool_choice_without_tools(choice):
    req = request(messages=[ir.Message(ir.USER, [ir.text_block("hi")])], tool_choice=choice,
                  tool_choice_name="f")
    assert "toolConfig" not in orjson.loads(bedrock.write_request(req))


@pytest.mark.parametrize("fmt,schema,name,want_schema,want_name", [
    (ir.FORMAT_JSON_SCHEMA, {"type": "object", "properties": {"a": {"type": "string"}}}, "answer",
     {"type": "object", "properties": {"a": {"type": "string"}}}, "answer"),
    (ir.FORMAT_JSON_SCHEMA, {"type": "object"}, None, {"type": "object"}, "structured_output"),
    (ir.FORMAT_JSON_OBJECT, None, None, {"type": "object"}, "structured_output"),
])
def test_structured_output_is_a_forced_tool(fmt, schema, name, want_schema, want_name):
    req = request(messages=[ir.Message(ir.USER, [ir.text_block("hi")])], response_format=fmt,
                  rf_schema=schema, rf_name=name, reasoning_budget=2048, max_tokens=8000)
    assert bedrock.forced_tool_name(req) == want_name
    body = bedrock.write_request(req)
    assert_valid_request(body)
    got = orjson.loads(body)
    assert got["toolConfig"] == {"tools": [{"toolSpec": {
        "name": want_name, "description": "Respond with a JSON object that matches this schema.",
        "inputSchema": {"json": want_schema}}}], "toolChoice": {"tool": {"name": want_name}}}
    # Claude rejects thinking together with a forced tool: the structured output wins.
    assert "additionalModelRequestFields" not in got


@pytest.mark.parametrize("choice,name,want", [
    (ir.TOOL_CHOICE_AUTO, None, {"any": {}}),
    (ir.TOOL_CHOICE_UNSET, None, {"any": {}}),
    (ir.TOOL_CHOICE_REQUIRED, None, {"any": {}}),
    (ir.TOOL_CHOICE_TOOL, "f", {"tool": {"name": "f"}}),
    (ir.TOOL_CHOICE_NONE, None, {"tool": {"name": "structured_output"}}),
])
def test_structured_output_beside_the_callers_tools(choice, name, want):
    # The caller's tools stay callable; the model answers through one of them or the schema tool.
    req = request(messages=[ir.Message(ir.USER, [ir.text_block("hi")])], tools=[ir.Tool("f")],
                  tool_choice=choice, tool_choice_name=name, response_format=ir.FORMAT_JSON_OBJECT)
    cfg = orjson.loads(bedrock.write_request(req))["toolConfig"]
    assert [t["toolSpec"]["name"] for t in cfg["tools"]] == ["f", "structured_output"]
    assert cfg["toolChoice"] == want


def test_no_forced_tool_for_text_formats():
    for fmt in (ir.FORMAT_UNSET, ir.FORMAT_TEXT):
        req = request(messages=[ir.Message(ir.USER, [ir.text_block("hi")])], response_format=fmt)
        assert bedrock.forced_tool_name(req) is None
        assert "toolConfig" not in orjson.loads(bedrock.write_request(req))


def test_thinking_goes_in_additional_model_request_fields():
    req = request(messages=[ir.Message(ir.USER, [ir.text_block("hi")])], reasoning_budget=4096,
                  max_tokens=8192, temperature=0.3, top_p=0.5)
    got = orjson.loads(bedrock.write_request(req))
    assert got["additionalModelRequestFields"] == {"thinking": {"type": "enabled", "budget_tokens": 4096}}
    # Claude takes no temperature change and no top_p below 0.95 with thinking on.
    assert got["inferenceConfig"] == {"maxTokens": 8192}
    # Same protocol: merged into the caller's own additional fields, which stay untouched.
    req.extra = {"additionalModelRequestFields": {"anthropic_beta": ["b"]}}
    got = orjson.loads(bedrock.write_request(req))
    assert got["additionalModelRequestFields"] == {
        "anthropic_beta": ["b"], "thinking": {"type": "enabled", "budget_tokens": 4096}}
    assert req.extra == {"additionalModelRequestFields": {"anthropic_beta": ["b"]}}


@pytest.mark.parametrize("budget,effort,max_tokens,want", [
    (None, "low", None, 4096),
    (None, "high", 20000, 16384),
    (-1, None, None, 8192),          # Gemini's "dynamic"
    (500, None, None, 1024),         # Claude's floor
    (10000, None, 6000, 4976),       # leaves 1024 answer tokens under maxTokens
    (10000, None, 1500, None),       # no room for thinking: dropped
    (None, None, 5000, None),
    (0, None, None, None),
])
def test_thinking_budget(budget, effort, max_tokens, want):
    req = request(messages=[ir.Message(ir.USER, [ir.text_block("hi")])], reasoning_budget=budget,
                  reasoning_effort=effort, max_tokens=max_tokens)
    got = orjson.loads(bedrock.write_request(req)).get("additionalModelRequestFields")
    assert got == ({"thinking": {"type": "enabled", "budget_tokens": want}} if want else None)


def test_no_thinking_when_claude_would_reject_it():
    call = blk(ir.TOOL_USE, id="c1", name="f", input={})
    result = blk(ir.TOOL_RESULT, id="c1", content=[ir.text_block("ok")])
    # Mid tool loop, the calling turn has no reasoning (history from a non-thinking vendor).
    req = request(messages=[ir.Message(ir.USER, [ir.text_block("hi")]), ir.Message(ir.ASSISTANT, [call]),
                            ir.Message(ir.USER, [result])], tools=[ir.Tool("f")], reasoning_budget=2048)
    assert "additionalModelRequestFields" not in orjson.loads(bedrock.write_request(req))
    # The calling turn started with signed reasoning: thinking stays on.
    req.messages[1].content = [blk(ir.THINKING, text="t", signature="s"), call]
    assert "additionalModelRequestFields" in orjson.loads(bedrock.write_request(req))
    # A forcing tool choice.
    for choice in (ir.TOOL_CHOICE_REQUIRED, ir.TOOL_CHOICE_TOOL):
        req.tool_choice, req.tool_choice_name = choice, "f"
        assert "additionalModelRequestFields" not in orjson.loads(bedrock.write_request(req))


def test_unsigned_reasoning_is_not_replayed_upstream_but_reaches_clients():
    thought = blk(ir.THINKING, text="from another vendor")
    req = request(messages=[ir.Message(ir.USER, [ir.text_block("hi")]),
                            ir.Message(ir.ASSISTANT, [thought, ir.text_block("answer")])])
    assert orjson.loads(bedrock.write_request(req))["messages"][1]["content"] == [{"text": "answer"}]
    resp = ir.Response()
    resp.content = [thought, ir.text_block("answer")]
    assert orjson.loads(bedrock.write_response(resp))["output"]["message"]["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "from another vendor"}}}, {"text": "answer"}]


@pytest.mark.parametrize("temperature,want", [(1.5, 1.0), (2, 1.0), (-0.5, 0.0), (0.7, 0.7), (0, 0)])
def test_temperature_is_clamped_to_converse_range(temperature, want):
    req = request(messages=[ir.Message(ir.USER, [ir.text_block("hi")])], temperature=temperature)
    assert orjson.loads(bedrock.write_request(req))["inferenceConfig"] == {"temperature": want}


def test_empty_turns_are_dropped():
    req = request(messages=[ir.Message(ir.USER, [ir.text_block("hi")]),
                            ir.Message(ir.ASSISTANT, [ir.text_block("")]),
                            ir.Message(ir.USER, [ir.text_block("again")])])
    assert orjson.loads(bedrock.write_request(req))["messages"] == [
        {"role": "user", "content": [{"text": "hi"}, {"text": "again"}]}]


# ---------------------------------------------------------------------------------------------
# Buffered responses


def converse_response(content, stop="end_turn", usage=None, **more):
    body = {"output": {"message": {"role": "assistant", "content": content}}, "stopReason": stop,
            "usage": usage or {"inputTokens": 10, "outputTokens": 5, "totalTokens": 15},
            "metrics": {"latencyMs": 321}}
    body.update(more)
    return orjson.dumps(body)


def test_reads_a_response():
    resp = bedrock.read_response(converse_response(
        [{"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "s"}}},
         {"text": "Calling."},
         {"toolUse": {"toolUseId": "tooluse_9", "name": "f", "input": {"x": [1]}}}],
        stop="tool_use",
        usage={"inputTokens": 3, "outputTokens": 7, "totalTokens": 1510,
               "cacheReadInputTokens": 1000, "cacheWriteInputTokens": 500}))
    assert [b.kind for b in resp.content] == [ir.THINKING, ir.TEXT, ir.TOOL_USE]
    assert resp.content[2].input == {"x": [1]}
    assert resp.stop_reason == ir.TOOL_USE_STOP
    u = resp.usage
    # The IR's input is the whole prompt: Bedrock's inputTokens plus both cache buckets.
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.cache_write_tokens) == (1503, 7, 1000, 500)
    assert resp.id is None and resp.model is None


@pytest.mark.parametrize("wire,stop", [
    ("end_turn", ir.END_TURN), ("tool_use", ir.TOOL_USE_STOP), ("max_tokens", ir.MAX_TOKENS),
    ("stop_sequence", ir.STOP_SEQUENCE), ("guardrail_intervened", ir.SAFETY),
    ("content_filtered", ir.SAFETY), ("malformed_tool_use", ir.ERROR),
    ("malformed_model_output", ir.ERROR), ("model_context_window_exceeded", ir.MAX_TOKENS),
    ("something_new", ir.OTHER),
])
def test_reads_stop_reasons(wire, stop):
    assert bedrock.read_response(converse_response([{"text": "x"}], stop=wire)).stop_reason == stop


def test_reads_the_matched_stop_sequence():
    resp = bedrock.read_response(converse_response(
        [{"text": "x"}], stop="stop_sequence", additionalModelResponseFields={"stop_sequence": "END"}))
    assert (resp.stop_reason, resp.stop_sequence) == (ir.STOP_SEQUENCE, "END")


@pytest.mark.parametrize("body", [b"nope", b"[]", b'{"output": {}}', b'{"output": {"message": 3}}',
                                  b'{"output": {"message": {"content": [5]}}}'])
def test_bad_responses_raise_codec_error(body):
    with pytest.raises(ir.CodecError):
        bedrock.read_response(body)


@pytest.mark.parametrize("stop,wire", [
    (ir.END_TURN, "end_turn"), (ir.TOOL_USE_STOP, "tool_use"), (ir.MAX_TOKENS, "max_tokens"),
    (ir.STOP_SEQUENCE, "stop_sequence"), (ir.SAFETY, "content_filtered"), (ir.REFUSAL, "end_turn"),
    (ir.PAUSE_TURN, "end_turn"), (ir.ERROR, "end_turn"), (ir.OTHER, "end_turn"),
    (ir.STOP_UNSET, "end_turn"),
])
def test_writes_stop_reasons(stop, wire):
    resp = ir.Response()
    resp.stop_reason = stop
    assert orjson.loads(bedrock.write_response(resp))["stopReason"] == wire


def test_written_response_parses_with_boto3():
    resp = ir.Response()
    resp.id = "golden-id"
    resp.content = [blk(ir.THINKING, text="hmm", signature="sig"), ir.text_block("Hello"),
                    blk(ir.TOOL_USE, id="call_1", name="f", input={"a": 1})]
    resp.stop_reason = ir.STOP_SEQUENCE
    resp.stop_sequence = "END"
    resp.usage = ir.Usage(input_tokens=1510, output_tokens=7, cache_read_tokens=1000,
                          cache_write_tokens=500)
    body = bedrock.write_response(resp)
    assert_valid_response(body)
    client, _ = stub_client(body=body)
    out = client.converse(modelId="m", messages=[{"role": "user", "content": [{"text": "hi"}]}])
    assert out["output"]["message"] == {"role": "assistant", "content": [
        {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "sig"}}},
        {"text": "Hello"},
        {"toolUse": {"toolUseId": "call_1", "name": "f", "input": {"a": 1}}}]}
    assert out["stopReason"] == "stop_sequence"
    assert out["additionalModelResponseFields"] == {"stop_sequence": "END"}
    # The writer takes the cache buckets out of inputTokens again.
    assert out["usage"] == {"inputTokens": 10, "outputTokens": 7, "totalTokens": 1517,
                            "cacheReadInputTokens": 1000, "cacheWriteInputTokens": 500}
    assert bedrock.read_response(body).usage.input_tokens == 1510


def test_read_usage():
    u = bedrock.read_usage(converse_response([{"text": "x"}], usage={
        "inputTokens": 4, "outputTokens": 6, "totalTokens": 30, "cacheReadInputTokens": 20}))
    assert (u.input_tokens, u.output_tokens, u.cache_read_tokens, u.input_known) == (24, 6, 20, True)
    assert bedrock.read_usage(b'{"output": {}}').input_known is False
    with pytest.raises(ir.CodecError):
        bedrock.read_usage(b"not json")


# ---------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize("status,kind,name", [
    (400, "invalid_request", "ValidationException"),
    (401, "authentication", "AccessDeniedException"),
    (403, "permission", "AccessDeniedException"),
    (404, "not_found", "ResourceNotFoundException"),
    (413, "request_too_large", "ValidationException"),
    (429, "rate_limit", "ThrottlingException"),
    (400, "quota", "ServiceQuotaExceededException"),
    (500, "api_error", "InternalServerException"),
    (503, "overloaded", "ServiceUnavailableException"),
    (408, "timeout", "ModelTimeoutException"),
])
def test_errors_raise_the_named_exception_in_boto3(status, kind, name):
    body = bedrock.write_error(status, kind, "it went wrong", "req-1")
    assert orjson.loads(body) == {"__type": name, "message": "it went wrong"}
    assert bedrock.error_type(kind) == name
    client, _ = stub_client(status, {"x-amzn-errortype": bedrock.error_type(kind),
                                     "x-amzn-RequestId": bedrock.mint_id()}, body)
    with pytest.raises(getattr(client.exceptions, name)) as exc:
        client.converse(modelId="m", messages=[{"role": "user", "content": [{"text": "hi"}]}])
    assert exc.value.response["Error"]["Message"] == "it went wrong"


@pytest.mark.parametrize("status,name", [
    (400, "ValidationException"), (401, "AccessDeniedException"), (404, "ResourceNotFoundException"),
    (429, "ThrottlingException"), (503, "ServiceUnavailableException"), (504, "ModelTimeoutException"),
    (502, "InternalServerException"),
])
def test_error_name_falls_back_to_the_status(status, name):
    assert orjson.loads(bedrock.write_error(status, "not-a-kind", "m"))["__type"] == name


def test_read_error_detail_message():
    assert bedrock.read_error_detail(b'{"message": "Too many tokens"}')[0] == "Too many tokens"
    assert bedrock.read_error_detail(b'{"Message": "Access denied"}')[0] == "Access denied"
    for body in (b"", b"<html>", b"[]", b'{"message": 5}', b'{"message": ""}'):
        assert bedrock.read_error_detail(body)[0] is None


def test_mint_id_is_a_uuid4():
    a, b = bedrock.mint_id(), bedrock.mint_id()
    assert a != b and uuid.UUID(a).version == 4


# ---------------------------------------------------------------------------------------------
# StreamDecoder


def text_stream():
    return b"".join([
        frame("messageStart", {"role": "assistant"}),
        frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hello"}}),
        frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": " world"}}),
        frame("contentBlockStop", {"contentBlockIndex": 0}),
        frame("messageStop", {"stopReason": "end_turn"}),
        frame("metadata", {"usage": {"inputTokens": 5, "outputTokens": 2, "totalTokens": 27,
                                     "cacheReadInputTokens": 20},
                           "metrics": {"latencyMs": 100}}),
    ])


TEXT_EVENTS = [
    {"kind": ir.MESSAGE_START, "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                                         "cache_write_tokens": 0, "reasoning_tokens": 0}},
    {"kind": ir.BLOCK_START, "index": 0, "block": {"kind": ir.TEXT, "text": ""}},
    {"kind": ir.BLOCK_DELTA, "index": 0, "delta_kind": ir.DELTA_TEXT, "text": "Hello"},
    {"kind": ir.BLOCK_DELTA, "index": 0, "delta_kind": ir.DELTA_TEXT, "text": " world"},
    {"kind": ir.BLOCK_STOP, "index": 0},
    {"kind": ir.MESSAGE_DELTA, "stop_reason": ir.END_TURN,
     "usage": {"input_tokens": 25, "output_tokens": 2, "cache_read_tokens": 20,
               "cache_write_tokens": 0, "reasoning_tokens": 0}},
    {"kind": ir.MESSAGE_STOP},
]


def test_decodes_a_text_stream_split_anywhere():
    data = text_stream()
    for step in (1, 2, 3, 7, 64, len(data)):
        assert decode_all(data, step) == TEXT_EVENTS


def test_decoder_start_usage_is_unknown():
    dec = bedrock.StreamDecoder()
    (start,) = dec.feed(frame("messageStart", {"role": "assistant"}))
    assert start.kind == ir.MESSAGE_START and start.usage.input_known is False


def test_decodes_tool_use_and_reasoning():
    data = b"".join([
        frame("messageStart", {"role": "assistant"}),
        frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"text": "Think"}}}),
        frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"reasoningContent": {"signature": "SIG"}}}),
        frame("contentBlockStop", {"contentBlockIndex": 0}),
        frame("contentBlockDelta",
              {"contentBlockIndex": 1, "delta": {"reasoningContent": {"redactedContent": "b3BhcXVl"}}}),
        frame("contentBlockStop", {"contentBlockIndex": 1}),
        frame("contentBlockDelta", {"contentBlockIndex": 2, "delta": {"text": "Let me look."}}),
        frame("contentBlockStop", {"contentBlockIndex": 2}),
        frame("contentBlockStart",
              {"contentBlockIndex": 3, "start": {"toolUse": {"toolUseId": "tooluse_A", "name": "get_weather"}}}),
        frame("contentBlockDelta", {"contentBlockIndex": 3, "delta": {"toolUse": {"input": '{"city":'}}}),
        frame("contentBlockDelta", {"contentBlockIndex": 3, "delta": {"toolUse": {"input": '"Paris"}'}}}),
        frame("contentBlockStop", {"contentBlockIndex": 3}),
        frame("messageStop", {"stopReason": "tool_use"}),
        frame("metadata", {"usage": {"inputTokens": 50, "outputTokens": 30, "totalTokens": 80},
                           "metrics": {"latencyMs": 9}}),
    ])
    events = decode_all(data)
    assert [(e["kind"], e.get("index"), e.get("delta_kind"), e.get("text")) for e in events] == [
        (ir.MESSAGE_START, None, None, None),
        (ir.BLOCK_START, 0, None, None),
        (ir.BLOCK_DELTA, 0, ir.DELTA_THINKING, "Think"),
        (ir.BLOCK_DELTA, 0, ir.DELTA_SIGNATURE, "SIG"),
        (ir.BLOCK_STOP, 0, None, None),
        (ir.BLOCK_START, 1, None, None),
        (ir.BLOCK_STOP, 1, None, None),
        (ir.BLOCK_START, 2, None, None),
        (ir.BLOCK_DELTA, 2, ir.DELTA_TEXT, "Let me look."),
        (ir.BLOCK_STOP, 2, None, None),
        (ir.BLOCK_START, 3, None, None),
        (ir.BLOCK_DELTA, 3, ir.DELTA_INPUT_JSON, '{"city":'),
        (ir.BLOCK_DELTA, 3, ir.DELTA_INPUT_JSON, '"Paris"}'),
        (ir.BLOCK_STOP, 3, None, None),
        (ir.MESSAGE_DELTA, None, None, None),
        (ir.MESSAGE_STOP, None, None, None),
    ]
    assert events[1]["block"] == {"kind": ir.THINKING, "text": ""}
    assert events[5]["block"] == {"kind": ir.THINKING, "data": "b3BhcXVl", "redacted": True}
    assert events[10]["block"] == {"kind": ir.TOOL_USE, "id": "tooluse_A", "name": "get_weather"}
    assert events[14]["stop_reason"] == ir.TOOL_USE_STOP
    assert events[14]["usage"]["input_tokens"] == 50


def test_decoder_keeps_one_block_open_when_bedrock_interleaves_indexes():
    # Bedrock never interleaves blocks, but the IR promises one open block at a time: a delta for
    # another contentBlockIndex closes the open block, and the late stop of the old one is ignored.
    data = b"".join([
        frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "a"}}),
        frame("contentBlockDelta", {"contentBlockIndex": 1, "delta": {"text": "b"}}),
        frame("contentBlockStop", {"contentBlockIndex": 0}),
        frame("contentBlockStop", {"contentBlockIndex": 1}),
        frame("messageStop", {"stopReason": "end_turn"}),
        frame("metadata", {"usage": {"inputTokens": 1, "outputTokens": 2}}),
    ])
    assert [(e["kind"], e.get("index")) for e in decode_all(data)] == [
        (ir.MESSAGE_START, None),
        (ir.BLOCK_START, 0), (ir.BLOCK_DELTA, 0), (ir.BLOCK_STOP, 0),
        (ir.BLOCK_START, 1), (ir.BLOCK_DELTA, 1), (ir.BLOCK_STOP, 1),
        (ir.MESSAGE_DELTA, None), (ir.MESSAGE_STOP, None),
    ]


def test_decoder_closes_blocks_bedrock_left_open_and_waits_for_usage():
    dec = bedrock.StreamDecoder()
    events = dec.feed(frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "x"}})
                      + frame("messageStop", {"stopReason": "max_tokens"}))
    assert [e.kind for e in events] == [ir.MESSAGE_START, ir.BLOCK_START, ir.BLOCK_DELTA, ir.BLOCK_STOP]
    # No metadata: close() still finishes, with the usage unknown.
    events = dec.close()
    assert [e.kind for e in events] == [ir.MESSAGE_DELTA, ir.MESSAGE_STOP]
    assert events[0].stop_reason == ir.MAX_TOKENS and events[0].usage.input_known is False
    assert dec.close() == []


def test_decoder_takes_metadata_before_message_stop():
    events = decode_all(frame("messageStart", {"role": "assistant"})
                        + frame("metadata", {"usage": {"inputTokens": 1, "outputTokens": 2, "totalTokens": 3},
                                             "metrics": {"latencyMs": 1}})
                        + frame("messageStop", {"stopReason": "end_turn"}))
    assert [e["kind"] for e in events] == [ir.MESSAGE_START, ir.MESSAGE_DELTA, ir.MESSAGE_STOP]
    assert events[1]["usage"]["output_tokens"] == 2


def test_a_cut_stream_ends_without_message_stop():
    dec = bedrock.StreamDecoder()
    data = text_stream()
    dec.feed(data[:200])
    assert all(e.kind != ir.MESSAGE_STOP for e in dec.close())


@pytest.mark.parametrize("exception,kind", [
    ("throttlingException", "rate_limit"),
    ("validationException", "invalid_request"),
    ("serviceUnavailableException", "overloaded"),
    ("internalServerException", "api_error"),
    ("modelStreamErrorException", "api_error"),
    ("ModelTimeoutException", "timeout"),
    ("somethingElse", "api_error"),
])
def test_decodes_exception_frames(exception, kind):
    data = (frame("messageStart", {"role": "assistant"})
            + frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "par"}})
            + exception_frame(exception, "Too many requests, please wait.")
            + frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "ignored"}}))
    events = decode_all(data)
    assert events[-1] == {"kind": ir.EVENT_ERROR, "error_kind": kind,
                          "message": "Too many requests, please wait."}
    assert sum(e["kind"] == ir.BLOCK_DELTA for e in events) == 1


def test_decodes_error_message_frames():
    data = encode_frame(encode_headers({":message-type": "error", ":error-code": "InternalFailure",
                                        ":error-message": "boom"}), b"")
    assert decode_all(data) == [{"kind": ir.EVENT_ERROR, "error_kind": "api_error", "message": "boom"}]


@pytest.mark.parametrize("data", [
    b"\x00\x00\x00\x10garbage garbage",
    text_stream()[:40] + b"\xff" + text_stream()[41:],
    encode_frame(encode_headers({":message-type": "event", ":event-type": "contentBlockDelta"}),
                 b"{not json"),
    encode_frame(encode_headers({":message-type": "event", ":event-type": "contentBlockDelta"}), b"[1, 2]"),
])
def test_garbage_raises_codec_error(data):
    dec = bedrock.StreamDecoder()
    with pytest.raises(ir.CodecError):
        dec.feed(data)


def test_odd_but_valid_frames_do_not_crash():
    data = b"".join([
        frame("messageStart", {"role": "assistant"}),
        frame("contentBlockDelta", {"contentBlockIndex": [1], "delta": {"text": "a"}}),
        frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": 5}),
        frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"toolUse": "x"}}),
        frame("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"image": {}}}),
        frame("contentBlockStart", {"contentBlockIndex": 0, "start": {"image": {"format": "png"}}}),
        frame("contentBlockStop", {"contentBlockIndex": 99}),
        frame("someFutureEvent", {"x": 1}),
        encode_frame(encode_headers({":message-type": "event"}), b"{}"),
        frame("messageStop", {"stopReason": 7}),
        frame("metadata", {"usage": {"inputTokens": -5, "outputTokens": "many"}}),
    ])
    events = decode_all(data)
    assert events[-1]["kind"] == ir.MESSAGE_STOP
    assert events[-2]["stop_reason"] == ir.OTHER


def test_fuzzed_streams_raise_only_codec_error():
    rng = random.Random(11)
    good = text_stream()
    for _ in range(1500):
        data = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        dec = bedrock.StreamDecoder()
        try:
            for i in range(0, len(data), 13):
                dec.feed(bytes(data[i:i + 13]))
            dec.close()
        except ir.CodecError:
            pass


# ---------------------------------------------------------------------------------------------
# StreamEncoder


def _events():
    U = ir.Usage
    return [
        ir.ev_message_start("x", "m", U(input_known=False)),
        ir.ev_block_start(0, blk(ir.THINKING)),
        ir.ev_block_delta(0, ir.DELTA_THINKING, "think"),
        ir.ev_block_delta(0, ir.DELTA_SIGNATURE, "SIG"),
        ir.ev_block_stop(0),
        ir.ev_block_start(1, ir.text_block("")),
        ir.ev_block_delta(1, ir.DELTA_TEXT, "Hello"),
        ir.ev_block_delta(1, ir.DELTA_TEXT, ""),
        ir.ev_block_delta(1, ir.DELTA_TEXT, " world"),
        ir.ev_block_stop(1),
        ir.ev_block_start(2, blk(ir.TOOL_USE, id="call_1", name="get", input={})),
        ir.ev_block_delta(2, ir.DELTA_INPUT_JSON, '{"a":'),
        ir.ev_block_delta(2, ir.DELTA_INPUT_JSON, "1}"),
        ir.ev_block_stop(2),
        ir.ev_message_delta(ir.TOOL_USE_STOP, None, U(30, 5, 10, 2)),
        ir.ev_message_stop(),
    ]


def boto3_stream(data):
    client, _ = stub_client(200, {"content-type": "application/vnd.amazon.eventstream"}, data)
    out = client.converse_stream(modelId="m", messages=[{"role": "user", "content": [{"text": "hi"}]}])
    return list(out["stream"])


def test_encoded_stream_parses_with_boto3():
    assert boto3_stream(bedrock.StreamEncoder("id", "m").encode(_events())) == [
        {"messageStart": {"role": "assistant"}},
        {"contentBlockDelta": {"delta": {"reasoningContent": {"text": "think"}}, "contentBlockIndex": 0}},
        {"contentBlockDelta": {"delta": {"reasoningContent": {"signature": "SIG"}}, "contentBlockIndex": 0}},
        {"contentBlockStop": {"contentBlockIndex": 0}},
        {"contentBlockDelta": {"delta": {"text": "Hello"}, "contentBlockIndex": 1}},
        {"contentBlockDelta": {"delta": {"text": " world"}, "contentBlockIndex": 1}},
        {"contentBlockStop": {"contentBlockIndex": 1}},
        {"contentBlockStart": {"start": {"toolUse": {"toolUseId": "call_1", "name": "get"}},
                               "contentBlockIndex": 2}},
        {"contentBlockDelta": {"delta": {"toolUse": {"input": '{"a":'}}, "contentBlockIndex": 2}},
        {"contentBlockDelta": {"delta": {"toolUse": {"input": "1}"}}, "contentBlockIndex": 2}},
        {"contentBlockStop": {"contentBlockIndex": 2}},
        {"messageStop": {"stopReason": "tool_use"}},
        {"metadata": {"usage": {"inputTokens": 18, "outputTokens": 5, "totalTokens": 35,
                                "cacheReadInputTokens": 10, "cacheWriteInputTokens": 2},
                      "metrics": {"latencyMs": 0}}},
    ]


def test_frames_look_like_aws_frames():
    data = bedrock.StreamEncoder("id", "m").encode(_events())
    for headers, payload in EventStreamParser().feed(data):
        assert list(headers) == [":event-type", ":content-type", ":message-type"]
        assert headers[":content-type"] == "application/json" and headers[":message-type"] == "event"
        obj = orjson.loads(payload)
        assert list(obj)[-1] == "p" and obj["p"].isalnum()
        assert len(payload) % 32 == 0


def test_encoder_round_trips_through_the_decoder():
    data = bedrock.StreamEncoder("id", "m").encode(_events())
    events = decode_all(data, 5)
    assert [e["kind"] for e in events] == [
        ir.MESSAGE_START, ir.BLOCK_START, ir.BLOCK_DELTA, ir.BLOCK_DELTA, ir.BLOCK_STOP,
        ir.BLOCK_START, ir.BLOCK_DELTA, ir.BLOCK_DELTA, ir.BLOCK_STOP,
        ir.BLOCK_START, ir.BLOCK_DELTA, ir.BLOCK_DELTA, ir.BLOCK_STOP,
        ir.MESSAGE_DELTA, ir.MESSAGE_STOP]
    assert events[-2]["usage"] == {"input_tokens": 30, "output_tokens": 5, "cache_read_tokens": 10,
                                   "cache_write_tokens": 2, "reasoning_tokens": 0}


def test_encoder_is_deterministic_and_incremental():
    whole = bedrock.StreamEncoder("id", "m").encode(_events())
    enc = bedrock.StreamEncoder("id", "m")
    assert b"".join(enc.encode([e]) for e in _events()) == whole


def test_whole_tool_input_and_argumentless_calls():
    enc = bedrock.StreamEncoder("id", "m")
    data = enc.encode([
        ir.ev_block_start(0, blk(ir.TOOL_USE, id="c1", name="f", input={"city": "Paris"})),
        ir.ev_block_stop(0),
        ir.ev_block_start(1, blk(ir.TOOL_USE, id="c2", name="g")),
        ir.ev_block_stop(1),
        ir.ev_block_start(2, blk(ir.THINKING, redacted=True, data="b3BhcXVl")),
        ir.ev_block_stop(2),
        ir.ev_message_delta(ir.TOOL_USE_STOP, None, ir.Usage(1, 1)),
        ir.ev_message_stop(),
    ])
    events = boto3_stream(data)
    inputs = [e["contentBlockDelta"]["delta"] for e in events if "contentBlockDelta" in e]
    assert inputs == [{"toolUse": {"input": '{"city":"Paris"}'}}, {"toolUse": {"input": "{}"}},
                      {"reasoningContent": {"redactedContent": b"opaque"}}]


def test_message_stop_without_start_or_delta():
    events = boto3_stream(bedrock.StreamEncoder("id", "m").encode([ir.ev_message_stop()]))
    assert [list(e)[0] for e in events] == ["messageStart", "messageStop", "metadata"]
    assert events[1] == {"messageStop": {"stopReason": "end_turn"}}


@pytest.mark.parametrize("kind,exception", [
    ("rate_limit", "throttlingException"), ("quota", "throttlingException"),
    ("overloaded", "serviceUnavailableException"), ("api_error", "internalServerException"),
    ("timeout", "modelStreamErrorException"), ("invalid_request", "validationException"),
    ("weird", "internalServerException"),
])
def test_error_frame_raises_in_boto3(kind, exception):
    enc = bedrock.StreamEncoder("id", "m")
    data = enc.encode(_events()[:7]) + enc.error(kind, "Upstream failed.")
    assert enc.error(kind, "again") == b"" and enc.encode(_events()) == b""
    client, _ = stub_client(200, {"content-type": "application/vnd.amazon.eventstream"}, data)
    out = client.converse_stream(modelId="m", messages=[{"role": "user", "content": [{"text": "hi"}]}])
    seen = []
    with pytest.raises(BotoEventStreamError) as exc:
        for event in out["stream"]:
            seen.append(event)
    assert exc.value.response["Error"] == {"Code": exception, "Message": "Upstream failed."}
    assert seen[-1] == {"contentBlockDelta": {"delta": {"text": "Hello"}, "contentBlockIndex": 1}}
    # Issue 7: this used to end with isinstance(exc.value, ClientError), always true after
    # pytest.raises(EventStreamError). What boto3 raised on is the frame itself: check its bytes.
    frames = EventStreamParser().feed(data)
    headers, payload = frames[-1]
    assert headers == {":message-type": "exception", ":exception-type": exception,
                       ":content-type": "application/json"}
    assert orjson.loads(payload) == {"message": "Upstream failed."}
    assert str(exc.value) == (
        "An error occurred (%s) when calling the ConverseStream operation: Upstream failed." % exception)


def test_ev_error_in_the_event_list_becomes_an_exception_frame():
    enc = bedrock.StreamEncoder("id", "m")
    data = enc.encode([ir.ev_message_start(None, None, ir.Usage()), ir.ev_error("overloaded", "busy"),
                       ir.ev_message_stop()])
    frames = EventStreamParser().feed(data)
    assert [h.get(":exception-type") for h, _ in frames] == [None, "serviceUnavailableException"]
    assert orjson.loads(frames[1][1]) == {"message": "busy"}


# The conversation field given as a string, a number, an object or null: a wrong type is reported
# as a wrong type (never as missing), in bedrock's own words (jsonget's getters, BedrockShape).
@pytest.mark.parametrize("value, message", [
    ('hi', 'messages must be a list.'),
    (3, 'messages must be a list.'),
    ({'role': 'user'}, 'messages must be a list.'),
    (None, None),
])
def test_read_request_conversation_field_type(value, message):
    import orjson as _orjson
    from cbusbar import ir as _ir
    from cbusbar.proto import bedrock as _codec
    body = {}
    body['messages'] = value
    if message is None:
        _codec.read_request(_orjson.dumps(body))
        return
    with pytest.raises(_ir.CodecError) as e:
        _codec.read_request(_orjson.dumps(body))
    assert str(e.value) == message


def test_arguments_that_are_not_one_object_reach_boto3_as_one():
    """Issue #34 (7): the client joins the toolUse input deltas and parses them; the model's own
    text is under _raw_arguments (arguments.pxd)."""
    events = [ir.ev_message_start("u", "m", ir.Usage(input_tokens=1))]
    for i, frags in enumerate([['{"a": 1, ', "'b': 2}"], ["not json"], ['{"a":', "1}"]]):
        events.append(ir.ev_block_start(i, blk(ir.TOOL_USE, id="c%d" % i, name="f")))
        events += [ir.ev_block_delta(i, ir.DELTA_INPUT_JSON, f) for f in frags]
        events.append(ir.ev_block_stop(i))
    events += [ir.ev_message_delta(ir.TOOL_USE_STOP, None, ir.Usage(1, 1)), ir.ev_message_stop()]
    inputs = {}
    for e in boto3_stream(bedrock.StreamEncoder("id", "m").encode(events)):
        d = e.get("contentBlockDelta")
        if d:
            inputs[d["contentBlockIndex"]] = inputs.get(d["contentBlockIndex"], "") + d["delta"]["toolUse"]["input"]
    assert [orjson.loads(inputs[i]) for i in range(3)] == [
        {"a": 1, "_raw_arguments": "{\"a\": 1, 'b': 2}"}, {"_raw_arguments": "not json"}, {"a": 1}]
    # buffered, and back in a request
    resp = ir.Response()
    resp.content = [blk(ir.TOOL_USE, id="c", name="f", input="not json")]
    resp.stop_reason, resp.usage = ir.TOOL_USE_STOP, ir.Usage(1, 1)
    body = bedrock.write_response(resp)
    assert_valid_response(body)
    assert orjson.loads(body)["output"]["message"]["content"][0]["toolUse"]["input"] == {
        "_raw_arguments": "not json"}
