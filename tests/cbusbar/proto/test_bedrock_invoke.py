"""The bedrock-invoke codec by feeding bytes: the InvokeModel body envelope, chunk frames both
ways (checked against botocore's own eventstream reader), exception frames."""
import base64
import json

import orjson
from botocore.eventstream import EventStreamBuffer

from cbusbar import ir
from cbusbar.eventstream import encode_frame, encode_headers
from cbusbar.proto import bedrock_invoke as bi, codec
from tests.integration.fakes import ANTHROPIC_STREAM


def test_lookup_by_protocol_name():
    assert codec("bedrock-invoke") is bi and bi.NAME == "bedrock-invoke"


def test_request_envelope():
    req = bi.read_request(b'{"anthropic_version":"bedrock-2023-05-31","max_tokens":9,'
                          b'"messages":[{"role":"user","content":"hi"}]}')
    req.extra = {}
    req.model = "anthropic.claude-x"
    req.stream = True
    out = orjson.loads(bi.write_request(req))
    assert "model" not in out and "stream" not in out
    assert out["anthropic_version"] == "bedrock-2023-05-31" and out["max_tokens"] == 9
    assert bi.upstream_path("us.anthropic.claude-x-v1:0", True) == \
        "/model/us.anthropic.claude-x-v1%3A0/invoke-with-response-stream"
    assert bi.upstream_path("m", False) == "/model/m/invoke"


def _chunks(sse):
    frames = []
    for block in sse.split(b"\n\n"):
        if block:
            data = block.split(b"data: ", 1)[1]
            frames.append(encode_frame(encode_headers({":event-type": "chunk",
                                                       ":content-type": "application/json",
                                                       ":message-type": "event"}),
                                       orjson.dumps({"bytes": base64.b64encode(data).decode()})))
    return b"".join(frames)


def test_decoder_reassembles_split_frames():
    wire = _chunks(ANTHROPIC_STREAM)
    dec = bi.StreamDecoder()
    events = []
    for i in range(0, len(wire), 7):
        events += dec.feed(wire[i:i + 7])
    events += dec.close()
    kinds = [e.kind for e in events]
    assert kinds[0] == ir.MESSAGE_START and kinds[-1] == ir.MESSAGE_STOP
    assert "".join(e.text for e in events if e.kind == ir.BLOCK_DELTA) == "hello stream"


def test_exception_frame_is_an_error_event():
    frame = encode_frame(encode_headers({":exception-type": "throttlingException",
                                         ":content-type": "application/json",
                                         ":message-type": "exception"}), b'{"message":"Too many requests"}')
    events = bi.StreamDecoder().feed(frame)
    assert len(events) == 1 and events[0].kind == ir.EVENT_ERROR
    assert events[0].error_kind == "overloaded" and events[0].message == "Too many requests"


def test_encoder_frames_read_by_botocore():
    dec = bi.StreamDecoder()
    events = dec.feed(_chunks(ANTHROPIC_STREAM))
    enc = bi.StreamEncoder("msg_golden", "target-model")
    wire = enc.encode(events) + enc.error("api_error", "boom")
    buf = EventStreamBuffer()
    buf.add_data(wire)
    msgs = list(buf)
    types = [json.loads(base64.b64decode(json.loads(m.payload)["bytes"]))["type"] for m in msgs[:-1]]
    assert types[0] == "message_start" and types[-1] == "message_stop"
    assert all(m.headers[":event-type"] == "chunk" for m in msgs[:-1])
    assert msgs[-1].headers[":message-type"] == "exception"
    assert json.loads(base64.b64decode(json.loads(msgs[1].payload)["bytes"]))["type"] in (
        "content_block_start", "ping")
