"""The embeddings codecs (cbusbar/embed.pyx) by feeding bytes, and the translation goldens under
tests/golden/embed_<ingress>_to_<egress>/:
- request_<case>.in.json → ingress reader → model "target-model" ("cohere.target-model" for
  cases named *cohere*) → egress writer, compared with .out.json as parsed JSON;
- response_<case>.in.json (the upstream body) → egress reader → ingress writer for the ingress
  request in response_<case>.req.json, compared with .out.json (ids replaced by "golden-id")."""
import base64
import json
import pathlib
import struct

import pytest

from cbusbar import embed
from cbusbar.ir import CodecError

GOLDEN = pathlib.Path(__file__).resolve().parent.parent / "golden"
CASES = sorted(p for d in GOLDEN.glob("embed_*_to_*") for p in d.glob("*.in.json"))


def _ids(obj):
    if isinstance(obj, dict) and "id" in obj:
        obj["id"] = "golden-id"
    return obj


@pytest.mark.parametrize("case", CASES, ids=lambda p: "%s/%s" % (p.parent.name, p.name[:-8]))
def test_golden(case):
    ingress, egress = case.parent.name[len("embed_"):].split("_to_")
    name = case.name[:-len(".in.json")]
    expected = json.loads(case.with_name(name + ".out.json").read_text())
    if name.startswith("request_"):
        req = embed.READ_REQUEST[ingress](case.read_bytes())
        req.model = "cohere.target-model" if "cohere" in name else "target-model"
        out = embed.WRITE_REQUEST[egress](req)
    else:
        req = embed.READ_REQUEST[ingress](case.with_name(name + ".req.json").read_bytes())
        req.model = "client-model"
        resp = embed.READ_RESPONSE[egress](case.read_bytes())
        out = embed.WRITE_RESPONSE[ingress](resp, req)
    assert _ids(json.loads(out)) == expected


def test_base64_is_little_endian_float32():
    s = embed.b64_of([1.0, -0.5])
    assert base64.b64decode(s) == struct.pack("<ff", 1.0, -0.5)
    assert embed.floats_of_b64(s) == [1.0, -0.5]


def test_openai_reads_base64_vectors_in_index_order():
    body = json.dumps({"object": "list", "model": "m", "usage": {"prompt_tokens": 4, "total_tokens": 4},
                       "data": [{"index": 1, "embedding": embed.b64_of([2.0])},
                                {"index": 0, "embedding": [1.0]}]}).encode()
    resp = embed.openai_read_response(body)
    assert resp.vectors == [[1.0], [2.0]] and resp.input_tokens == 4


@pytest.mark.parametrize("proto,body,message", [
    ("openai", b"{", "We could not parse the JSON body of your request."),
    ("openai", b'{"model":"m"}', "Missing required parameter: 'input'."),
    ("openai", b'{"model":"m","input":[[1,2]]}', "input: only text inputs are supported (not token ids or images)"),
    ("openai", b'{"model":"m","input":"x","dimensions":0}', "dimensions: must be a positive integer"),
    ("cohere", b'{"model":"m","texts":["a"],"input_type":"search"}', "invalid input_type: search"),
    ("cohere", b'{"model":"m","texts":["a"],"embedding_types":["int8"]}',
     "embedding_types: busbar serves float and base64 embeddings only"),
    ("gemini", b'{"content":{"parts":[{"inlineData":{}}]}}', "content: only text parts are supported"),
    ("bedrock", b'{"prompt":"x"}', "Malformed input request: expected inputText or texts."),
])
def test_request_errors_are_caller_safe(proto, body, message):
    with pytest.raises(CodecError) as e:
        embed.READ_REQUEST[proto](body)
    assert str(e.value) == message


def test_titan_takes_one_text():
    req = embed.openai_read_request(b'{"model":"m","input":["a","b"]}')
    req.model = "amazon.titan-embed-text-v2:0"
    with pytest.raises(CodecError, match="one text per request"):
        embed.bedrock_write_request(req)


def test_passthrough_and_body_sniffing():
    titan = embed.bedrock_read_request(b'{"inputText":"x"}')
    assert embed.passthrough("bedrock", titan, "bedrock", "amazon.titan-embed-text-v2:0")
    assert not embed.passthrough("bedrock", titan, "bedrock", "cohere.embed-english-v3")
    assert not embed.passthrough("gemini", titan, "gemini", "m")
    assert embed.is_embed_body(b'{"inputText":"x","dimensions":256}')
    assert embed.is_embed_body(b'{"texts":["a"],"input_type":"search_query"}')
    assert not embed.is_embed_body(b'{"anthropic_version":"v","messages":[],"max_tokens":1}')
    assert embed.upstream_path("bedrock", "cohere.embed-english-v3:0") == "/model/cohere.embed-english-v3%3A0/invoke"
    assert (embed.upstream_path("gemini", "gemini-embedding-001")
            == "/v1beta/models/gemini-embedding-001:batchEmbedContents")
