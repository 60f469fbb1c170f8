"""openai.StreamDecoder reads the common text chunk in place (no dicts) and every other frame with
orjson: both must emit the same events. The reference run adds a member with an escaped name
(`"\\u0078":0`, i.e. "x"), which the in-place reader never takes and the dict reader ignores, so
every frame of the reference goes the dict way."""
import random

import orjson
import pytest

from cbusbar import ir
from cbusbar.proto import openai


def run(frames, escape):
    dec = openai.StreamDecoder()
    out = []
    try:
        for f in frames:
            if escape and f.startswith(b"{"):
                f = b'{"\\u0078":0,' + f[1:] if f[1:2] != b"}" else b'{"\\u0078":0}'
            out += [e.to_dict() for e in dec.feed(b"data: " + f + b"\n\n")]
        out += [e.to_dict() for e in dec.close()]
    except ir.CodecError as e:
        out.append(("CodecError", str(e)))
    return out, dec.finished, dec.usage.to_dict() if dec.usage is not None else None


def chunk(rng):
    """One chunk frame, mostly the common shape, often not."""
    texts = ["", "hi", " w1", "é—“q”", "a\"b\\c\n\t", "😀", "\u0000", "x" * 300]
    delta = {}
    if rng.random() < 0.3:
        delta["role"] = "assistant"
    r = rng.random()
    if r < 0.7:
        delta["content"] = rng.choice(texts)
    elif r < 0.75:
        delta["content"] = None
    elif r < 0.78:
        delta["content"] = 5
    for k in ("refusal", "reasoning_content", "reasoning"):
        if rng.random() < 0.1:
            delta[k] = rng.choice([None, "", "why"])
    if rng.random() < 0.08:
        delta["tool_calls"] = rng.choice(
            [None, [{"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{"}}]])
    choice = {}
    r = rng.random()
    if r < 0.8:
        choice["index"] = 0
    elif r < 0.85:
        choice["index"] = None
    elif r < 0.9:
        choice["index"] = 1
    if rng.random() < 0.9:
        choice["delta"] = delta if rng.random() < 0.95 else rng.choice([None, 3, []])
    if rng.random() < 0.7:
        choice["logprobs"] = None if rng.random() < 0.9 else {"content": [{"token": "a", "logprob": -1.0}]}
    r = rng.random()
    if r < 0.6:
        choice["finish_reason"] = None
    elif r < 0.8:
        choice["finish_reason"] = rng.choice(["stop", "length", "tool_calls", "content_filter", "weird"])
    elif r < 0.82:
        choice["finish_reason"] = 7
    frame = {}
    if rng.random() < 0.9:
        frame["id"] = rng.choice(["chatcmpl-1", "chatcmpl-\u00e9", 12, None])
    frame["object"] = "chat.completion.chunk"
    frame["created"] = rng.choice([1700000000, 1.5, -3])
    if rng.random() < 0.9:
        frame["model"] = rng.choice(["gpt-4o-mini", None, "m\\odel"])
    r = rng.random()
    if r < 0.85:
        frame["choices"] = [choice]
    elif r < 0.9:
        frame["choices"] = [choice, {"index": 1, "delta": {"content": "other"}}]
    elif r < 0.93:
        frame["choices"] = []
    elif r < 0.95:
        frame["choices"] = None
    else:
        frame["choices"] = [1, choice]
    r = rng.random()
    if r < 0.3:
        frame["usage"] = None
    elif r < 0.35:
        frame["usage"] = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    if rng.random() < 0.03:
        frame["error"] = rng.choice([None, {"message": "boom", "type": "server_error"}])
    if rng.random() < 0.1:
        frame["obfuscation"] = "abc"
    items = list(frame.items())
    rng.shuffle(items)
    body = orjson.dumps(dict(items))
    r = rng.random()
    if r < 0.05:
        body = body.replace(b",", b" ,\n ").replace(b":", b" : ")
    elif r < 0.08:     # a repeated member (orjson keeps the last)
        body = body[:-1] + b',"choices":[{"index":0,"delta":{"content":"dup"}}]}'
    elif r < 0.10:
        body = body[:-1] + b',"id":"second"}'
    elif r < 0.12:     # not JSON orjson accepts
        body = body[:rng.randrange(1, len(body))]
    elif r < 0.13:
        body = body.replace(b'"created":', b'"created":1e400,"c2":', 1)
    elif r < 0.14:
        body = body.replace(b'"object":', b'"object":"\\ud800","o2":', 1)
    return body


@pytest.mark.parametrize("seed", range(150))
def test_in_place_reader_matches_dict_reader(seed):
    rng = random.Random(seed)
    frames = [chunk(rng) for _ in range(rng.randint(1, 12))]
    if rng.random() < 0.7:
        frames.append(b"[DONE]")
    assert run(frames, False) == run(frames, True)


def test_common_chunks_are_read_in_place():
    """The bench's shape: the result equals the dict path's (checked above); here, that a text
    chunk with escapes and unicode comes out as the text."""
    frames = [orjson.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                            "choices": [{"index": 0, "delta": {"content": t}, "logprobs": None,
                                         "finish_reason": None}], "usage": None})
              for t in ("a\"\n", "é😀")] + [b"[DONE]"]
    events, finished, _ = run(frames, False)
    assert [e.get("text") for e in events if e["kind"] == ir.BLOCK_DELTA] == ["a\"\n", "é😀"]
    assert finished
