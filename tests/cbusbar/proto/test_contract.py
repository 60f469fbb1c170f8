"""The codec contract the engine calls instead of branching on protocol names (docs/codecs.md,
issue 7): the same names in all six codecs, each answering for its own protocol."""
import re

import orjson
import pytest

from cbusbar import ir
from cbusbar.proto import PROTOCOLS, codec

UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")


@pytest.mark.parametrize("name,body_model,needs_max_tokens", [
    ("openai", True, False), ("responses", True, False), ("anthropic", True, True),
    ("gemini", False, False), ("cohere", True, False), ("bedrock", False, False)])
def test_module_constants(name, body_model, needs_max_tokens):
    c = codec(name)
    assert (c.BODY_MODEL, c.NEEDS_MAX_TOKENS) == (body_model, needs_max_tokens)


@pytest.mark.parametrize("name,azure,vertex", [
    ("openai", ("deployments", "v1"), None), ("responses", ("v1",), None),
    ("anthropic", (), "anthropic"), ("gemini", (), "google"), ("cohere", (), None),
    ("bedrock", (), None), ("bedrock-invoke", (), None)])
def test_egress_names(name, azure, vertex):
    c = codec(name)
    assert c.USER_AGENT and all(b": " in h for h in c.API_HEADERS)
    assert all(h.islower() and h.endswith(b"-beta") for h in c.BETA_HEADERS)
    assert (c.AZURE_FORMS, c.VERTEX_PUBLISHER) == (azure, vertex)
    assert (c.vertex_body is not None) == (name == "anthropic")


def test_anthropic_vertex_body():
    model, body = codec("anthropic").vertex_body(b'{"model":"claude-x@1","max_tokens":5}')
    assert (model, orjson.loads(body)) == ("claude-x@1", {"max_tokens": 5,
                                                          "anthropic_version": "vertex-2023-10-16"})
    assert codec("anthropic").vertex_body(b"[1]") is None


@pytest.mark.parametrize("name", PROTOCOLS)
def test_scan_keys_name_the_output_cap(name):
    """Every MAX_TOKENS_PATH starts at a scanned member, and the cap a caller sets in the
    protocol's own request is found there (what governance reserves a budget for)."""
    from busbar.governance.gate import requested_max_tokens
    from cbusbar.framing import scan_top
    c = codec(name)
    assert b"model" in c.SCAN_KEYS and b"stream" in c.SCAN_KEYS
    assert c.MAX_TOKENS_PATH and all(p[0] in c.SCAN_KEYS and len(p) <= 2 for p in c.MAX_TOKENS_PATH)
    req = ir.Request()
    req.model = "m"
    req.messages = [ir.Message(ir.USER, [ir.text_block("hi")])]
    req.max_tokens = 321
    body = c.write_request(req)
    assert requested_max_tokens(c, body, scan_top(body, c.SCAN_KEYS)) == 321


@pytest.mark.parametrize("name,auth,quota", [
    ("openai", (401, "Incorrect API key provided."), 429),
    ("responses", (401, "Incorrect API key provided."), 429),
    ("anthropic", (401, "invalid x-api-key"), 429),
    ("gemini", (400, "API key not valid. Please pass a valid API key."), 429),
    ("cohere", (401, "invalid api token"), 429),
    ("bedrock", (403, "The security token included in the request is invalid."), 400)])
def test_own_error(name, auth, quota):
    c = codec(name)
    assert c.own_error("authentication") == auth
    assert c.own_error("quota") == (quota, None)
    assert c.own_error("permission") == (403, None)


def _structured():
    req = ir.Request()
    req.messages = [ir.Message(ir.USER, [ir.text_block("hi")])]
    req.response_format = ir.FORMAT_JSON_SCHEMA
    req.rf_name = "answer"
    req.rf_schema = {"type": "object"}
    return req


@pytest.mark.parametrize("name,want", [("openai", None), ("responses", None), ("gemini", None),
                                       ("cohere", None), ("anthropic", "answer"), ("bedrock", "answer")])
def test_forced_tool_name(name, want):
    assert codec(name).forced_tool_name(_structured()) == want
    assert codec(name).forced_tool_name(ir.Request()) is None


@pytest.mark.parametrize("name", PROTOCOLS)
def test_wants_stream_usage(name):
    req = ir.Request()
    req.extra = {"stream_options": {"include_usage": True}}
    assert codec(name).wants_stream_usage(req) is (name == "openai")
    req.extra = {"stream_options": {"include_usage": False}}
    assert codec(name).wants_stream_usage(req) is False
    assert codec(name).wants_stream_usage(ir.Request()) is False


def test_openai_reads_include_usage_where_read_request_keeps_it():
    c = codec("openai")
    req = c.read_request(b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
                         b'"stream":true,"stream_options":{"include_usage":true}}')
    assert c.wants_stream_usage(req) is True


def _events():
    return [ir.ev_message_start("up", "m", ir.Usage(input_tokens=3)),
            ir.ev_block_start(0, ir.text_block("")), ir.ev_block_delta(0, ir.DELTA_TEXT, "hi"),
            ir.ev_block_stop(0), ir.ev_message_delta(ir.END_TURN, None, ir.Usage(3, 1)),
            ir.ev_message_stop()]


@pytest.mark.parametrize("name", PROTOCOLS)
def test_stream_encoder_applies_only_its_own_options(name):
    c = codec(name)
    plain = c.stream_encoder("id", "m", False, False)
    assert isinstance(plain, c.StreamEncoder) and (plain.id, plain.model) == ("id", "m")
    both = c.stream_encoder("id", "m", True, True)
    for enc in (plain, both):
        if hasattr(enc, "created"):
            enc.created = 1
    a, b = plain.encode(_events()), both.encode(_events())
    if name == "openai":
        assert b'"usage":{"prompt_tokens":3' in b and b'"usage"' not in a
    elif name == "gemini":
        assert a.startswith(b"data: ") and b.startswith(b"[{") and b.endswith(b"]")
    elif name not in ("bedrock",):
        assert a == b


@pytest.mark.parametrize("name", ["openai", "responses", "gemini", "cohere"])
def test_headers_of_protocols_without_any(name):
    c = codec(name)
    assert c.response_headers([(b"request-id", b"x")], "req_1") == b""
    assert c.response_headers(None, "req_1") == b""
    assert c.error_headers("rate_limit", "req_1") == b""


def test_anthropic_headers():
    c = codec("anthropic")
    assert c.response_headers([(b"x", b"y"), (b"request-id", b"req_up")], "req_1") == b"request-id: req_up\r\n"
    assert c.response_headers([(b"x", b"y")], "req_1") == b"request-id: req_1\r\n"
    assert c.response_headers(None, "req_1") == b"request-id: req_1\r\n"
    assert c.error_headers("rate_limit", "req_2") == b"request-id: req_2\r\n"


def test_bedrock_headers():
    c = codec("bedrock")
    assert c.response_headers([(b"x-amzn-requestid", b"abc")], "req_1") == b"x-amzn-RequestId: abc\r\n"
    for got in (c.response_headers(None, "req_1"), c.response_headers([(b"x", b"y")], "req_1")):
        assert got.startswith(b"x-amzn-RequestId: ") and got.endswith(b"\r\n")
        assert UUID.fullmatch(got[18:-2])
    got = c.error_headers("rate_limit", "req_1")
    rid, etype, end = got.split(b"\r\n")
    assert rid.startswith(b"x-amzn-RequestId: ") and UUID.fullmatch(rid[18:]) and end == b""
    assert etype == b"x-amzn-ErrorType: ThrottlingException"
    assert c.error_headers("rate_limit", None) != got  # a fresh UUID each time


@pytest.mark.parametrize("name", PROTOCOLS)
def test_not_found_message(name):
    got = codec(name).not_found_message("gpt-x", None)
    if name == "gemini":
        assert got == ("models/gpt-x is not found for API version v1beta, or is not supported for "
                       "the task you are trying to perform.")
        assert "API version v1," in codec(name).not_found_message("gpt-x", "v1")
    else:
        assert got == "The model 'gpt-x' does not exist or you do not have access to it."


@pytest.mark.parametrize("name,body,want", [
    ("openai", {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}},
     ("slow down", "rate_limit_exceeded")),
    ("openai", {"error": {"message": "bad", "type": "invalid_request_error", "code": None}},
     ("bad", "invalid_request_error")),
    ("openai", [{"error": {"message": "wrapped", "code": 429}}], ("wrapped", None)),
    ("responses", {"error": {"message": "m", "type": "server_error", "code": "server_error"}},
     ("m", "server_error")),
    ("anthropic", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
     ("Overloaded", "overloaded_error")),
    ("gemini", {"error": {"code": 429, "message": "Quota", "status": "RESOURCE_EXHAUSTED"}},
     ("Quota", "RESOURCE_EXHAUSTED")),
    ("gemini", [{"error": {"code": 400, "message": "in array", "status": "INVALID_ARGUMENT"}}],
     ("in array", "INVALID_ARGUMENT")),
    ("cohere", {"message": "invalid request"}, ("invalid request", None)),
    ("bedrock", {"__type": "com.amazon.coral.validate#ValidationException", "message": "bad"},
     ("bad", "ValidationException")),
    ("bedrock", {"Message": "slow", "__type": "ThrottlingException"}, ("slow", "ThrottlingException")),
])
def test_read_error_detail(name, body, want):
    raw = orjson.dumps(body)
    assert codec(name).read_error_detail(raw) == want


@pytest.mark.parametrize("name", PROTOCOLS)
@pytest.mark.parametrize("body", [b"", b"not json", b"[]", b"null", b"{}", b'{"error": 5}', b"\xff"])
def test_read_error_detail_never_raises(name, body):
    assert codec(name).read_error_detail(body) == (None, None)


# ---------------------------------------------------------------------------------------------
# The decoder as a tap: finished and usage


def _stream(name):
    """One complete upstream stream per protocol, as each provider sends it."""
    from busbar.mock import answer, dialects
    ask = answer.Ask()
    ask.model = "m"
    ask.stream = True
    ask.include_usage = True
    plan = answer.Plan()
    plan.words = ["a", "b", "c"]
    plan.output_tokens = 3
    plan.input_tokens = 7
    d = {"openai": dialects.OpenAIChat, "responses": dialects.OpenAIResponses,
         "anthropic": dialects.Anthropic, "gemini": dialects.Gemini, "cohere": dialects.Cohere,
         "bedrock": dialects.Bedrock}[name]()
    return list(d.frames(ask, plan, "0123456789abcdef0123456789abcdef"))


@pytest.mark.parametrize("name", PROTOCOLS)
def test_decoder_tap_finished_and_usage(name):
    frames = _stream(name)
    dec = codec(name).StreamDecoder()
    assert dec.finished is False and dec.usage is None
    for f in frames[:-2]:
        dec.feed(f)
    assert dec.finished is False
    for f in frames[-2:]:
        dec.feed(f)
    dec.close()
    assert dec.finished is True
    assert (dec.usage.input_tokens, dec.usage.output_tokens) == (7, 3)


@pytest.mark.parametrize("name", PROTOCOLS)
def test_decoder_truncated_stream_is_not_finished(name):
    frames = _stream(name)
    dec = codec(name).StreamDecoder()
    for f in frames[:1]:
        dec.feed(f)
    dec.close()
    assert dec.finished is False


@pytest.mark.parametrize("name", [p for p in PROTOCOLS if p != "bedrock"])
def test_decoder_frame_limit(name):
    dec = codec(name).StreamDecoder(max_frame=32)
    with pytest.raises(ir.CodecError) as e:
        dec.feed(b"data: " + b"x" * 64)
    assert str(e.value) == "The upstream sent a stream frame larger than busbar accepts."
    codec(name).StreamDecoder(max_frame=0).feed(b"data: " + b"x" * 64)  # 0: the 32 MiB default


@pytest.mark.parametrize("name", [p for p in PROTOCOLS if p != "bedrock"])
def test_decoder_reads_nothing_after_the_end(name):
    # _common.SSEDecoder: once the end was read, later bytes are not read, not even for a frame
    # over max_frame (openai, anthropic and cohere raised for one before the shared loop).
    dec = codec(name).StreamDecoder(max_frame=4096)
    for f in _stream(name):
        dec.feed(f)
    assert dec.feed(b"data: " + b"x" * 8192 + b"\n\n") == [] and dec.close() == []


def test_bedrock_decoder_frame_limit():
    from cbusbar.eventstream import encode_frame, encode_headers
    frame = encode_frame(encode_headers({":message-type": "event", ":event-type": "messageStart",
                                         ":content-type": "application/json"}), b'{"role":"assistant"}')
    assert codec("bedrock").StreamDecoder().feed(frame)
    with pytest.raises(ir.CodecError):
        codec("bedrock").StreamDecoder(max_frame=len(frame) - 1).feed(frame)


@pytest.mark.parametrize("name", PROTOCOLS)
@pytest.mark.parametrize("body", [b"not json", b"[1]", b'"s"'])
def test_read_response_rejects_non_objects(name, body):
    if name == "gemini" and body == b"[1]":
        body = b"[1, 2]"  # gemini folds a JSON array of chunks; non-object chunks still fail
    with pytest.raises(ir.CodecError):
        codec(name).read_response(body)


@pytest.mark.parametrize("name", PROTOCOLS)
def test_read_usage_without_usage_is_unknown(name):
    u = codec(name).read_usage(b'{"id": "x"}')
    assert (u.input_tokens, u.output_tokens, u.input_known) == (0, 0, False)


@pytest.mark.parametrize("name", PROTOCOLS + ("bedrock-invoke",))
def test_stream_usage_request(name):
    body = b'{"model":"m","stream":true,"messages":[]}'
    out, relay = codec(name).stream_usage_request(body)
    if name == "openai":
        assert orjson.loads(out)["stream_options"] == {"include_usage": True}
        assert relay is not None and hasattr(relay, "feed") and hasattr(relay, "close")
    else:
        # Every other protocol's stream carries usage unasked: the body goes as it is.
        assert out is body and relay is None
