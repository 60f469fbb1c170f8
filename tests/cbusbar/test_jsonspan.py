"""cbusbar/jsonspan: a body read with its text left as the client's JSON literals must be the body
orjson reads (same objects once the literals are decoded), accept exactly what orjson accepts, and
the writers' literal copies must decode to the text the str path would have written."""
import random

import orjson
import pytest

from cbusbar import ir, jsonspan
from cbusbar.proto import anthropic, bedrock, cohere, gemini, openai, responses

# The Anthropic request marks (anthropic.pyx REQUEST_MARKS), restated: system, message contents,
# block texts and tool_result contents are literals.
MARKS = jsonspan.Marks([
    None,
    (False, 0, {"system": 2, "messages": 3}),
    (True, 4, {}),
    (False, 5, {}),
    (False, 0, {"type": 0, "text": 6, "content": 2}),
    (False, 0, {"role": 0, "content": 2}),
    (True, 0, {}),
])


def decoded(x):
    if isinstance(x, bytes):
        return orjson.loads(x)
    if isinstance(x, dict):
        return {k: decoded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [decoded(v) for v in x]
    return x


def same_as_orjson(body):
    """parse() gives orjson's objects (literals decoded) or None; never accepts what orjson refuses."""
    try:
        want = orjson.loads(body)
    except orjson.JSONDecodeError:
        want = ValueError
    got = jsonspan.parse(body, MARKS)
    if got is None:
        return
    assert want is not ValueError, body
    assert decoded(got) == want
    assert list(got) == list(want)      # member order too (req.extra keeps it)


TEXTS = ["plain", "", "tab\there \"quoted\" back\\slash / slash", "résumé — “curly” 😀 漢字",
         "\x00\x01\x1f\x7f", "\u2028\u2029", "a" * 5000, "line\nbreak\r\n"]

BODIES = [
    {"model": "m", "max_tokens": 256, "system": "sys " + t, "messages": [{"role": "user", "content": t}]}
    for t in TEXTS
] + [
    {"model": "m", "system": [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                              {"type": "text", "text": "b\n"}],
     "messages": [
         {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image", "source": {
             "type": "base64", "media_type": "image/png", "data": "iVBOR"}}]},
         {"role": "assistant", "content": [
             {"type": "text", "text": "y"},
             {"type": "tool_use", "id": "t1", "name": "f", "input": {"q": "é", "n": [1, 2.5, -3e2, True, None]}}]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "res"},
                                      {"type": "tool_result", "tool_use_id": "t2",
                                       "content": [{"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]}]},
     ],
     "temperature": 0.7, "top_k": 5, "stop_sequences": ["\n\n", "END"], "metadata": {"user_id": "u"},
     "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}],
     "unknown": {"deep": [[[{"x": 1234567890123456789}]]]}, "big": -999999999999999999,
     "neg": -0, "f": 1e-7, "e": "\u00e9"},
]


@pytest.mark.parametrize("doc", BODIES)
def test_parse_is_orjson(doc):
    body = orjson.dumps(doc)
    got = jsonspan.parse(body, MARKS)
    assert got is not None
    assert decoded(got) == orjson.loads(body)
    msgs = got["messages"]
    if isinstance(msgs[0]["content"], (bytes, str)):
        assert isinstance(msgs[0]["content"], bytes)


@pytest.mark.parametrize("raw", [
    # escapes written other ways than orjson writes them
    rb'{"messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00 \/ \b\f\n\r\t \u0041"}]}',
    rb'{"messages":[{"role":"user","content":"x"}],"k":"\u00e9","n":1.0,"m":1E2}',
    b' \r\n\t{"messages" : [ { "role" : "user" , "content" : "x" } ] } \n',
    rb'{"messages":[],"messages":[{"role":"user","content":"dup"}]}',
    rb'{"m\u0065ssages":[{"role":"user","content":"escaped key"}]}',
    rb'{"messages":[{"role":"user","content":"a","content":"b"}]}',
    rb'{}',
    rb'{"messages":{}}',
    rb'{"system":123,"messages":[1,"two",null,{"content":false}]}',
    rb'{"a":12345678901234567890,"b":123456789012345678901234567890,"c":-9223372036854775809,'
    rb'"d":999999999999999999,"e":-0,"f":0,"g":1e5,"h":-1.5E-3,"i":[true,false,null]}',
])
def test_parse_odd_but_valid(raw):
    same_as_orjson(raw)
    assert jsonspan.parse(raw, MARKS) is not None


@pytest.mark.parametrize("raw", [
    rb'{"messages":[{"role":"user","content":"\ud800"}]}',           # lone high surrogate
    rb'{"messages":[{"role":"user","content":"\udc00"}]}',           # lone low surrogate
    rb'{"messages":[{"role":"user","content":"\ud800\u0041"}]}',     # high + not low
    rb'{"messages":[{"role":"user","content":"\x"}]}',               # bad escape
    rb'{"messages":[{"role":"user","content":"\u12G4"}]}',           # bad hex
    b'{"messages":[{"role":"user","content":"\x01"}]}',              # raw control character
    b'{"messages":[{"role":"user","content":"\xff"}]}',              # invalid UTF-8
    b'{"messages":[{"role":"user","content":"\xc0\x80"}]}',          # overlong
    b'{"messages":[{"role":"user","content":"\xed\xa0\x80"}]}',      # UTF-8 surrogate
    b'{"messages":[{"role":"user","content":"\xf4\x90\x80\x80"}]}',  # past U+10FFFF
    b'{"messages":[{"role":"user","content":"\xe2\x82"}]}',          # truncated sequence
    b'{"messages":[{"role":"user","content":"open}]}',               # unterminated
    b'{"messages":[{"role":"user","content":"x"}],}',                # trailing comma
    b'{"messages":[{"role":"user","content":"x"},]}',
    b'{"messages":[{"role":"user" "content":"x"}]}',                 # missing comma
    b'{"messages":[{"role":"user","content":"x"}]} x',               # trailing garbage
    b'{"a":01}', b'{"a":-}', b'{"a":1.}', b'{"a":tru}', b'{"a":nul}', b'{"a":NaN}', b'{"a":1e400}',
    b'{"a":[1,2}', b'{"a":{"b":1]}', b"{'a':1}", b'[1]', b'"s"', b'', b'   ',
    b'\xef\xbb\xbf{"a":1}',
    b'{"a":' * 1100 + b'1' + b'}' * 1100,
    b'{"system":' + b'[' * 1030 + b']' * 1030 + b'}',
])
def test_parse_refuses_what_orjson_refuses(raw):
    same_as_orjson(raw)


def test_parse_fuzz():
    rng = random.Random(13)
    base = [orjson.dumps(d) for d in BODIES]
    specials = [b'"', b'\\', b'\\u', b'\\ud83d', b'\\ude00', b'\x00', b'\x1f', b'\x80', b'\xc3',
                b'\xe2\x80', b'\xf0\x9f\x98', b'{', b'}', b'[', b']', b',', b':', b' ', b'0', b'-',
                b'e', b'.', b'null', b'true']
    for _ in range(4000):
        b = bytearray(rng.choice(base))
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(b))
            op = rng.random()
            if op < 0.4:
                b[i:i] = rng.choice(specials)
            elif op < 0.7:
                del b[i:i + rng.randint(1, 3)]
            else:
                b[i] = rng.randrange(256)
        same_as_orjson(bytes(b))


def _nested_results(levels):
    content = "x"
    for _ in range(levels):
        content = [{"type": "tool_result", "tool_use_id": "t", "content": content}]
    return orjson.dumps({"messages": [{"role": "user", "content": content}]})


def test_deep_documents():
    same_as_orjson(b'{"messages":[{"role":"user","content":' + b'[' * 70 + b']' * 70 + b'}]}')
    assert jsonspan.parse(_nested_results(20), MARKS) is not None
    # deeper than parse() recurses: orjson reads it (and its own depth limit decides)
    assert jsonspan.parse(_nested_results(40), MARKS) is None
    assert anthropic.read_request(_nested_results(40)).messages[0].content[0].kind == ir.TOOL_RESULT
    same_as_orjson(b'{"unknown":' + b'[' * 1023 + b']' * 1023 + b'}')
    same_as_orjson(b'{"unknown":' + b'[' * 1024 + b']' * 1024 + b'}')


def test_block_text_literal():
    b = ir.json_text_block(b'"caf\\u00e9\\n"')
    assert b.text_json == b'"caf\\u00e9\\n"'
    assert b.text == "café\n"                  # decoded once, on demand
    assert b.text_json == b'"caf\\u00e9\\n"'   # reading keeps the literal
    b.text = "other"                            # setting the text drops it
    assert b.text_json is None and b.text == "other"
    assert ir.json_text_block(b'""').text == ""
    assert ir.Block(ir.TEXT, text="t").text_json is None
    assert ir.json_text_block(b'"x"').to_dict() == {"kind": ir.TEXT, "text": "x"}


def _request(literals: bool):
    """The same IR request, its text as literals or as strs."""
    texts = ["a \"q\"", "", "é\n", "😀"]

    def tb(t):
        return ir.json_text_block(orjson.dumps(t)) if literals else ir.Block(ir.TEXT, text=t)

    req = ir.Request()
    req.model = "gpt"
    req.system = [tb(t) for t in texts]
    req.messages = [
        ir.Message(ir.USER, [tb("one")]),
        ir.Message(ir.USER, [tb(t) for t in texts]),
        ir.Message(ir.ASSISTANT, [tb(t) for t in texts]),
        ir.Message(ir.ASSISTANT, [tb("")]),
        ir.Message(ir.USER, [ir.Block(ir.TOOL_RESULT, id="c1", content=[tb(t) for t in texts]),
                             ir.Block(ir.TOOL_RESULT, id="c2", content=[tb("x")]),
                             tb("after")]),
    ]
    return req


@pytest.mark.parametrize("codec", [openai, anthropic, gemini, bedrock, cohere, responses])
def test_writers_copy_literals_faithfully(codec):
    """Every JSON writer writes the same document from literals as from strs."""
    a = codec.write_request(_request(True))
    b = codec.write_request(_request(False))
    assert orjson.loads(a) == orjson.loads(b)


@pytest.mark.parametrize("codec", [openai, anthropic, gemini, bedrock, cohere, responses])
def test_writers_from_the_anthropic_reader(codec):
    """The anthropic reader's literals (escapes as a client may write them) through every writer:
    the same document as from the orjson-read request."""
    raw = (rb'{"model":"m","max_tokens":9,"system":[{"type":"text","text":"s\u00e9 \/ \"q\""}],'
           rb'"messages":[{"role":"user","content":"caf\u00e9 \ud83d\ude00\n"},'
           rb'{"role":"assistant","content":[{"type":"text","text":"a"},{"type":"text","text":"b\t"},'
           rb'{"type":"tool_use","id":"t1","name":"f","input":{"x":1}}]},'
           rb'{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"r\u0000"},'
           rb'{"type":"text","text":""},{"type":"text","text":"after"}]}],'
           rb'"tools":[{"name":"f","description":"d","input_schema":{"type":"object"}}]}')
    fast = anthropic.read_request(raw)
    assert fast.messages[0].content[0].text_json is not None
    slow = anthropic.read_request(raw)
    blocks = slow.system + [blk for m in slow.messages for blk in m.content]
    blocks += [c for blk in blocks for c in (blk.content or ())]
    assert sum(b.text_json is not None for b in blocks) == 7
    for b in blocks:
        b.text = b.text             # the same IR, its text as strs
    assert all(b.text_json is None for b in blocks)
    for r in (fast, slow):
        r.model = "target"
        r.extra = {}
    assert orjson.loads(codec.write_request(fast)) == orjson.loads(codec.write_request(slow))


def test_anthropic_reader_keeps_literals():
    body = orjson.dumps({"model": "m", "max_tokens": 5, "system": "s\n",
                         "messages": [{"role": "user", "content": "hé"},
                                      {"role": "assistant", "content": [{"type": "text", "text": "x"}]},
                                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                                    "content": "r"}]}]})
    req = anthropic.read_request(body)
    assert req.system[0].text_json == b'"s\\n"'
    assert req.messages[0].content[0].text_json == '"hé"'.encode()
    assert req.messages[1].content[0].text_json == b'"x"'
    assert req.messages[2].content[0].content[0].text_json == b'"r"'
    # the IR reads the same as from strs
    assert [m.to_dict() for m in req.messages][0]["content"][0]["text"] == "hé"
    assert orjson.loads(openai.write_request(req))["messages"] == [
        {"role": "system", "content": "s\n"}, {"role": "user", "content": "hé"},
        {"role": "assistant", "content": "x"}, {"role": "tool", "tool_call_id": "t", "content": "r"}]


@pytest.mark.parametrize("raw,message", [
    (b'{"messages":[{"role":"user","content":"\\ud800"}]}', "We could not parse the JSON body of your request."),
    (b'[1]', "The request body must be a JSON object."),
    (b'{"max_tokens":1,"messages":[{"role":"user","content":5}]}', None),
])
def test_anthropic_reader_errors_unchanged(raw, message):
    with pytest.raises(ir.CodecError) as e:
        anthropic.read_request(raw)
    if message:
        assert str(e.value) == message


@pytest.mark.parametrize("model", ["gpt-4o-mini", None, 'we"ird\\model\n', "mödel"])
@pytest.mark.parametrize("extra", [False, True])
def test_openai_body_is_orjsons_compact_form(model, extra):
    """write_request joins pre-written messages into orjson's output for the rest: the bytes are
    what orjson.dumps writes for the same document (member order included)."""
    req = _request(False)
    req.model = model
    if extra:
        req.max_tokens = 5
        req.temperature = 0.5
        req.stream = True
        req.tools = [ir.Tool("f", "d", {"type": "object"})]
        req.tool_choice = ir.TOOL_CHOICE_AUTO
    out = openai.write_request(req)
    doc = orjson.loads(out)
    assert out == orjson.dumps(doc)
    assert list(doc)[:2] == ["model", "messages"] and doc["model"] == model
    assert [m["role"] for m in doc["messages"]] == ["system", "user", "user", "assistant", "assistant",
                                                    "tool", "tool", "user"]
    assert doc["messages"][1] == {"role": "user", "content": "one"}
    assert doc["messages"][4] == {"role": "assistant", "content": ""}


def _py_valid(b):
    try:
        b.decode("utf-8")       # CPython's decoder is strict: no overlongs, surrogates, > U+10FFFF
        return True
    except UnicodeDecodeError:
        return False


def test_utf8_check_matches_python_decoder():
    rng = random.Random(8)
    pieces = [b"a", b"\x7f", b"\xc3\xa9", b"\xe2\x80\x94", b"\xf0\x9f\x98\x80", b"\xf4\x8f\xbf\xbf",
              b"\xc3", b"\xe2\x80", b"\xf0\x9f\x98", b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf",
              b"\xe0\x80\x80", b"\xe0\x9f\xbf", b"\xed\xa0\x80", b"\xed\x9f\xbf", b"\xf0\x80\x80\x80",
              b"\xf0\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80", b"\xff", b"\xfe", b"\x00"]
    cases = [b"", b"x" * 15, b"x" * 16, b"x" * 17]
    for k in range(15, 20):     # a sequence across a 16-byte block boundary, and cut at the end
        for seq in (b"\xe2\x80\x94", b"\xf0\x9f\x98\x80", b"\xc3\xa9"):
            cases.append(b"x" * k + seq)
            cases.append(b"x" * k + seq[:-1])
            cases.append(b"x" * k + seq + b"y" * 20)
    for _ in range(20000):
        cases.append(b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))))
    for b in cases:
        want = _py_valid(b)
        assert jsonspan._utf8_valid(b) == want, b
        assert jsonspan._utf8_valid(b, True) == want, b
        # and through a marked literal, as parse reads it
        doc = b'{"system":"' + b.replace(b"\\", b"").replace(b'"', b"").replace(b"\x00", b"") + b'"}'
        same_as_orjson(doc)


def test_marks_values_are_the_same_objects():
    """Marks(values=...): a plain string value equal to one of them comes back as that object (no
    new str per role or block type); any other string, or one spelled with escapes, as before."""
    user, assistant = "".join(["us", "er"]), "".join(["assis", "tant"])
    m = jsonspan.Marks([None, (False, 0, {"a": 0})], (user, assistant))
    got = jsonspan.parse(b'{"a":"user","b":["assistant","us\\u0065r","users",1]}', m)
    assert got == orjson.loads(b'{"a":"user","b":["assistant","us\\u0065r","users",1]}')
    assert got["a"] is user and got["b"][0] is not assistant    # "b" is read by orjson whole
    got = jsonspan.parse(b'{"c":"assistant","d":"us\\u0065r"}', m)
    assert got["c"] is assistant and got["d"] == "user" and got["d"] is not user
