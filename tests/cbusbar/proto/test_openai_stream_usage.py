"""openai.stream_usage_request and UsageHider: a same-protocol stream always asks the upstream for
usage, and a client that did not ask gets the stream as it would have without include_usage."""
import json

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from cbusbar.proto import openai as O


def _sse(objs, nl=b"\n"):
    return b"".join(b"data: " + orjson.dumps(o) + nl + nl for o in objs) + b"data: [DONE]" + nl + nl


def _chunk(content=None, finish=None, usage_member=True, **extra):
    d = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {} if content is None else {"content": content},
                      "finish_reason": finish}]}
    if usage_member:
        d["usage"] = None
    d.update(extra)
    return d


USAGE_CHUNK = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                        "total_tokens": 5}}
ASKED = [_chunk(""), _chunk("Hel"), _chunk("lo"), _chunk(finish="stop"), USAGE_CHUNK]
PLAIN = [_chunk("", usage_member=False), _chunk("Hel", usage_member=False),
         _chunk("lo", usage_member=False), _chunk(finish="stop", usage_member=False)]


def _run(data, sizes):
    h = O.UsageHider()
    out = []
    i = k = 0
    while i < len(data):
        n = sizes[k % len(sizes)]
        out.append(h.feed(data[i:i + n]))
        i += n
        k += 1
    out.append(h.close())
    return b"".join(out)


# ------------------------------------------------------------------ the request


@pytest.mark.parametrize("body,want", [
    (b'{"model":"m","stream":true,"messages":[]}',
     b'{"stream_options":{"include_usage":true},"model":"m","stream":true,"messages":[]}'),
    (b'  {\n "model":"m", "stream": true}',
     b'  {"stream_options":{"include_usage":true},\n "model":"m", "stream": true}'),
    (b'{"model":"m","stream":true,"stream_options":null}',
     b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'),
    (b'{"model":"m","stream":true,"stream_options":{}}',
     b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'),
    (b'{"model":"m","stream":true,"stream_options":{"include_usage":false}}',
     b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}'),
    (b'{"stream_options": {"include_obfuscation": false}, "model":"m","stream":true}',
     b'{"stream_options": {"include_obfuscation":false,"include_usage":true}, "model":"m","stream":true}'),
    (b'{ }', b'{"stream_options":{"include_usage":true} }'),
])
def test_request_asks_for_usage_and_hides_it(body, want):
    out, relay = O.stream_usage_request(body)
    assert out == want and isinstance(relay, O.UsageHider)
    assert json.loads(out)["stream_options"]["include_usage"] is True


@pytest.mark.parametrize("body", [
    b'{"model":"m","stream":true,"stream_options":{"include_usage":true}}',
    b'{"model":"m","stream":true,"stream_options":{"include_usage":true,"include_obfuscation":true}}',
])
def test_client_that_asked_is_left_alone(body):
    out, relay = O.stream_usage_request(body)
    assert out is body and relay is None


@pytest.mark.parametrize("body", [b'{"model":"m","stream_options":"yes"}',
                                  b'{"model":"m","stream_options":[1]}', b'{"model":"m",}',
                                  b"not json", b"", b"[]"])
def test_a_body_it_cannot_read_goes_as_it_is(body):
    assert O.stream_usage_request(body) == (body, None)


# ------------------------------------------------------------------ the relay


def test_hider_output_is_what_the_client_would_have_got():
    assert _run(_sse(ASKED), [1 << 20]) == _sse(PLAIN)


@pytest.mark.parametrize("nl", [b"\n", b"\r\n", b"\r"])
@pytest.mark.parametrize("sizes", [[1], [2], [3, 5, 7], [11, 13, 1], [64]])
def test_any_split_any_line_end(nl, sizes):
    assert _run(_sse(ASKED, nl), sizes) == _sse(PLAIN, nl)


def test_every_single_split_point():
    data = _sse(ASKED, b"\r\n")
    want = _sse(PLAIN, b"\r\n")
    for cut in range(len(data) + 1):
        h = O.UsageHider()
        assert h.feed(data[:cut]) + h.feed(data[cut:]) + h.close() == want


def test_usage_first_with_spaces():
    data = (b'data: {"usage" : null , "id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
            b'data: {"usage": {"prompt_tokens": 1}, "choices": [ ]}\n\n'
            b"data: [DONE]\n\n")
    assert _run(data, [4]) == (b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
                               b"data: [DONE]\n\n")


def test_only_the_top_level_usage_goes():
    chunk = {"id": "x", "choices": [{"index": 0, "delta": {"content": '"usage": null'},
                                     "usage": None}], "usage": None}
    out = _run(_sse([chunk]), [5])
    assert json.loads(out.split(b"\n")[0][6:]) == {
        "id": "x", "choices": [{"index": 0, "delta": {"content": '"usage": null'}, "usage": None}]}


def test_chunks_that_are_not_the_usage_chunk_stay():
    # Azure's first chunk: empty choices, no usage (prompt filter results) — kept whole.
    azure = {"id": "", "choices": [], "prompt_filter_results": [{"prompt_index": 0}]}
    # A compatible server that puts usage on the finish chunk: the chunk stays, its usage goes.
    finish = {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
              "usage": {"prompt_tokens": 1}}
    error = {"error": {"message": "boom", "type": "server_error"}}
    out = _run(_sse([azure, finish, error]), [3])
    events = [json.loads(l[6:]) for l in out.split(b"\n") if l.startswith(b"data: {")]
    assert events == [azure, {"id": "x", "choices": [{"index": 0, "delta": {},
                                                      "finish_reason": "stop"}]}, error]


def test_what_it_cannot_read_passes_unchanged():
    data = (b': comment with "usage"\n\n'
            b'event: x\ndata: {"usage": null, broken\n\n'
            b'data: "usage"\n\n'
            b'data: {"a":1,"usage":null}trailing\n\n'
            b"data: [DONE]\n\n")
    assert _run(data, [2]) == data


def test_multi_line_data_and_other_fields():
    data = b'id: 7\ndata: {"id":"x",\ndata: "choices":[{"index":0}],\ndata: "usage":null}\n\n'
    out = _run(data, [3])
    assert out == b'id: 7\ndata: {"id":"x",\ndata: "choices":[{"index":0}]}\n\n'


def test_an_unended_last_event_is_flushed_at_close():
    data = b'data: {"id":"x","choices":[{"index":0}],"usage":null}'
    h = O.UsageHider()
    assert h.feed(data) == b""
    # As the upstream left it (unended), without its usage member.
    assert h.close() == b'data: {"id":"x","choices":[{"index":0}]}'
    h = O.UsageHider()
    assert h.feed(b'id: 1\ndata: {"id":"x","choices":[{"index":0}],"usage":null}') == b""
    assert h.close() == b'id: 1\ndata: {"id":"x","choices":[{"index":0}]}\n\n'
    h = O.UsageHider()
    assert h.feed(b'data: {"choices":[],"usage":{"prompt_tokens":1}}\n') == b""
    assert h.close() == b""


def test_an_event_over_max_frame_passes_through():
    h = O.UsageHider(64)
    big = b'data: {"pad":"' + b"x" * 100
    assert h.feed(big) == big
    rest = b'","usage":null}\n\ndata: {"choices":[],"usage":{}}\n\n'
    assert h.feed(rest) == rest
    assert h.close() == b""


def test_tap_still_reads_the_usage():
    # The engine feeds the tap the upstream's bytes, the hider only what the client gets.
    data = _sse(ASKED)
    tap = O.StreamDecoder()
    tap.feed(data)
    tap.close()
    assert (tap.usage.input_tokens, tap.usage.output_tokens) == (3, 2)
    assert _run(data, [9]).find(b"usage") < 0


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=30),
       nl=st.sampled_from([b"\n", b"\r\n", b"\r"]))
def test_split_invariance(cuts, nl):
    data = _sse(ASKED + [_chunk("more")], nl)
    want = _sse(PLAIN + [_chunk("more", usage_member=False)], nl)
    assert _run(data, cuts) == want


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), cuts=st.lists(st.integers(1, 17), min_size=1, max_size=5))
def test_garbage_never_raises(data, cuts):
    _run(data, cuts)
    _run(b'data: {"usage":null,' + data + b"\n\n", cuts)


# ------------------------------------------------------------------ the tap (StreamTap)


def _tap(cls, data, sizes):
    t = cls()
    events = []
    i = k = 0
    while i < len(data):
        n = sizes[k % len(sizes)]
        events += t.feed(data[i:i + n])
        i += n
        k += 1
    events += t.close()
    return t, [e.kind for e in events]


def _seen(t):
    u = t.usage
    return (None if u is None else (u.input_tokens, u.output_tokens)), t.finished


@pytest.mark.parametrize("objs,done", [
    (ASKED, True),                                  # OpenAI's layout: deltas are skipped
    (ASKED, False),                                 # no [DONE]: the finish_reason still counts
    (PLAIN + [USAGE_CHUNK], True),                  # no usage members
    ([_chunk(""), dict({"usage": {"prompt_tokens": 7, "completion_tokens": 1}},
                       **_chunk("x", usage_member=False))], False),   # usage first: decoded
    ([_chunk(""), _chunk("a"), dict(_chunk("b"), usage={"prompt_tokens": 4,
                                                        "completion_tokens": 4})], True),
])
@pytest.mark.parametrize("sizes", [[1 << 20], [7], [1, 50, 3]])
def test_the_tap_reads_what_the_decoder_reads(objs, done, sizes):
    data = _sse(objs)
    if not done:
        data = data[:data.rindex(b"data: [DONE]")]
    tap, _ = _tap(O.StreamTap, data, sizes)
    dec, _ = _tap(O.StreamDecoder, data, sizes)
    assert _seen(tap) == _seen(dec)
    assert _seen(dec)[0] is not None


def test_the_tap_sees_an_error_after_deltas():
    data = _sse([_chunk(""), _chunk("a"), _chunk("b")])
    data = data[:data.rindex(b"data: [DONE]")] + b'data: {"error":{"message":"overloaded"}}\n\n'
    tap, kinds = _tap(O.StreamTap, data, [1 << 20])
    from cbusbar import ir
    assert ir.EVENT_ERROR in kinds


def test_the_tap_reads_the_first_frame_whole():
    # A malformed start fails before the first byte reaches the client (the engine fails over).
    with pytest.raises(Exception):
        O.StreamTap().feed(b'data: {"choices":[{"finish_reason":null}],"usage":null\n\n')


@pytest.mark.parametrize("frame", [
    b'{"id":"x",,"choices":[{"index":0,"delta":{},"finish_reason":null}]}',
    b'{"id":"x" "choices":[{"index":0,"delta":{},"finish_reason":null}]}',
    b'["x",{"choices":[{"index":0,"delta":{},"finish_reason":null}]}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"a\x01"},"finish_reason":null}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":null}],"usage":null}x',
])
def test_a_first_frame_in_the_plain_layout_is_still_read_whole(frame):
    # The first frame's plain-delta layout is read by the framing scanner instead of orjson: what
    # it refuses goes to orjson, and a malformed start still fails before the first byte.
    from cbusbar import ir
    with pytest.raises(ir.CodecError):
        O.StreamTap().feed(b"data: " + frame + b"\n\n")


@pytest.mark.parametrize("frame", [
    b'{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
    b'{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":null}],"usage":null}',
    b'{"id":"x","choices":[{"index":0,"delta":{"content":"\\u00e9\\"error\\""},"finish_reason":null}]}',
])
def test_a_valid_plain_first_frame_starts_the_stream(frame):
    t = O.StreamTap()
    assert t.feed(b"data: " + frame + b"\n\n") == [] and t.usage is None and not t.finished
    # started: a later frame in the plain layout is not parsed at all (even when not JSON)
    assert t.feed(b'data: not json "finish_reason":null}]}\n\n') == []
    assert t.feed(b"data: [DONE]\n\n") == [] and t.finished


def test_a_first_frame_in_the_plain_layout_with_an_error_member_is_an_error():
    from cbusbar import ir
    t = O.StreamTap()
    kinds = [e.kind for e in t.feed(
        b'data: {"error":{"message":"no"},"choices":[{"index":0,"delta":{},"finish_reason":null}]}\n\n')]
    assert kinds == [ir.EVENT_ERROR] and not t.finished


def test_the_tap_ignores_what_follows_an_error_and_a_done():
    from cbusbar import ir
    err = b'data: {"error":{"message":"overloaded","type":"server_error"}}\n\n'
    after = _sse([dict(_chunk("x"), usage={"prompt_tokens": 3, "completion_tokens": 2})])
    tap, kinds = _tap(O.StreamTap, _sse([_chunk("")])[:-len(b"data: [DONE]\n\n")] + err + after, [9])
    assert kinds.count(ir.EVENT_ERROR) == 1 and tap.usage is None and not tap.finished
    tap, kinds = _tap(O.StreamTap, b"data: [DONE]\n\n" + after, [1 << 20])
    assert kinds == [] and tap.usage is None and tap.finished


@pytest.mark.parametrize("body", [
    b'{"model":"m","stream":true,"messages":[]}',
    b'{"model":"m","stream":true,"stream_options":null,"messages":[]}',
    b'{"model":"m","stream":true,"stream_options":{"include_obfuscation":false},"messages":[]}',
    b'{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}',
    b'{ }',
])
def test_the_engine_scan_gives_the_same_request(body):
    # With the engine's own scan of the client's body (which names stream_options) the body
    # comes out byte for byte as with the codec's own scan, with a filter exactly when it would.
    from cbusbar.framing import scan_top
    spans = scan_top(body, O.SCAN_KEYS)
    out, relay = O.stream_usage_request(body, spans)
    out2, relay2 = O.stream_usage_request(body)
    assert out == out2 and (relay is None) == (relay2 is None)
    # Offsets that predate a model splice are not trusted: a stale span still gives the same.
    spliced = body.replace(b'"m"', b'"a-much-longer-model-name"')
    a, ra = O.stream_usage_request(spliced, spans)
    b, rb = O.stream_usage_request(spliced)
    assert a == b and (ra is None) == (rb is None)
