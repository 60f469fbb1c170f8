"""SSE reader/writer and the top-level JSON field scanner used by the model splice."""
import json
import random

import pytest

from cbusbar import framing as F


def feed_all(parser, data, step):
    out = []
    for i in range(0, len(data), step):
        out += parser.feed(data[i:i + step])
    return out + parser.close()


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_sse_split_anywhere_and_line_endings(step):
    data = (b"event: a\r\ndata: {\"x\":1}\r\n\r\n: comment\n\ndata: l1\ndata: l2\n\n"
            b"id: 5\nretry: 10\nevent: b\ndata:nospace\r\r")
    got = feed_all(F.SSEParser(), data, step)
    assert got == [(b"a", b'{"x":1}'), (None, b"l1\nl2"), (b"b", b"nospace")]


def test_sse_event_without_final_blank_line_counts_on_close():
    p = F.SSEParser()
    assert p.feed(b"data: tail") == []
    assert p.close() == [(None, b"tail")]


def test_sse_bounded():
    assert F.SSEParser().max_event == 32 * 1024 * 1024   # framing.pxd DEFAULT_MAX_FRAME
    p = F.SSEParser(1024)
    assert p.max_event == 1024
    p.feed(b"data: " + b"x" * 1000 + b"\n")
    with pytest.raises(F.FramingError):
        p.feed(b"data: " + b"x" * 100 + b"\n")          # one event's data over the cap
    with pytest.raises(F.FramingError):
        F.SSEParser(1024).feed(b"x" * 1025)              # one unterminated line over the cap


class ReferenceSSE:
    """The SSE reader as first written (line by line, bytes slices): the rewrite in framing.pyx
    must give the same events and the same errors for any bytes split anywhere."""

    def __init__(self, max_event):
        self.buf, self.event, self.data, self.pending, self.max_event = bytearray(), None, [], 0, max_event

    def feed(self, chunk):
        out, start, i = [], 0, 0
        self.buf += chunk
        n = len(self.buf)
        while i < n:
            c = self.buf[i]
            if c != 10 and c != 13:
                i += 1
                continue
            end = i
            if c == 13:
                if i + 1 >= n:
                    break
                if self.buf[i + 1] == 10:
                    i += 1
            i += 1
            line = bytes(self.buf[start:end])
            start = i
            if not line:
                if self.data or self.event is not None:
                    out.append((self.event, b"\n".join(self.data)))
                self.event, self.data, self.pending = None, [], 0
                continue
            if line[0] == 58:
                continue
            colon = line.find(b":")
            field, value = (line, b"") if colon < 0 else (line[:colon], line[colon + 1:])
            if value[:1] == b" ":
                value = value[1:]
            if field == b"data":
                self.data.append(value)
                self.pending += len(value)
                if self.pending > self.max_event:
                    raise F.FramingError("event")
            elif field == b"event":
                self.event = value
        if start:
            del self.buf[:start]
        if len(self.buf) > self.max_event:
            raise F.FramingError("line")
        return out

    def close(self):
        out = self.feed(b"\n") if self.buf else []
        if self.data or self.event is not None:
            out.append((self.event, b"\n".join(self.data)))
            self.event, self.data = None, []
        return out


def _run(parser, chunks):
    out = []
    try:
        for c in chunks:
            out += parser.feed(c)
        out += parser.close()
    except F.FramingError:
        out.append("FramingError")
    return out


def test_sse_same_as_reference_for_any_bytes_and_splits():
    rng = random.Random(7)
    pieces = [b"data", b"event", b"id", b":", b": ", b" ", b"x", b"{\"a\":1}", b"\n", b"\r", b"\r\n",
              b"\n\n", b"data: ", b"event: ", b"[DONE]", b"\xe2\x82\xac", b"\x00", b"data:"]
    for _ in range(3000):
        data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 40)))
        cuts = sorted(rng.randint(0, len(data)) for _ in range(rng.randint(0, 6)))
        chunks = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
        cap = rng.choice([4, 16, 1 << 20])
        assert _run(F.SSEParser(cap), chunks) == _run(ReferenceSSE(cap), chunks), (data, chunks, cap)


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_json_array_parser_splits_elements_anywhere(step):
    data = b'\xef\xbb\xbf[{"a": "}]\\"{"},\r\n{"b": [1, {"c": 2}]}\n]'
    p = F.JsonArrayParser()
    got = []
    for i in range(0, len(data), step):
        got += p.feed(data[i:i + step])
    assert got == [b'{"a": "}]\\"{"}', b'{"b": [1, {"c": 2}]}'] and p.buffered() == 0


def test_json_array_parser_hands_back_non_array_bytes_and_is_bounded():
    assert F.JsonArrayParser().feed(b"oops") == [b"oops"]
    p = F.JsonArrayParser(16)
    assert p.feed(b'[{"a": "0123') == [] and p.buffered() == 11
    with pytest.raises(F.FramingError):
        p.feed(b"456789")


def test_gemini_frame_writers():
    assert F.sse_data_crlf(b"{}") == b"data: {}\r\n\r\n"
    assert F.json_array_item(b"{}", True) + F.json_array_item(b"[]", False) == b"[{},\r\n[]"


def test_sse_event_writer():
    assert F.sse_event(b"ping", b"{}") == b"event: ping\ndata: {}\n\n"
    assert F.sse_event(None, b"[DONE]") == b"data: [DONE]\n\n"


def test_scan_top_finds_top_level_only_and_splices():
    body = b'{"a": {"model": "inner"}, "model" : "gpt-4o", "stream":true, "x":[1,"model"]}'
    spans = F.scan_top(body, (b"model", b"stream"))
    s, e = spans[b"model"]
    assert body[s:e] == b'"gpt-4o"'
    assert body[slice(*spans[b"stream"])] == b"true"
    out = F.splice(body, s, e, b'"claude"')
    assert json.loads(out)["model"] == "claude" and json.loads(out)["a"]["model"] == "inner"


@pytest.mark.parametrize("bad", [b"", b"[]", b"{", b'{"a"}', b'{"a":}', b'{"a":1,}', b'{"a":1} x',
                                 b'{"a":"\x01"}', b'{"a":tru}', b"{'a':1}", b'{"a":[1,2}'])
def test_scan_top_rejects_non_objects(bad):
    with pytest.raises(F.FramingError):
        F.scan_top(bad, ())


def test_scan_top_depth_guard():
    deep = b'{"a":' + b"[" * 200 + b"]" * 200 + b"}"
    with pytest.raises(F.FramingError):
        F.scan_top(deep, ())
    ok = b'{"a":' + b"[" * 100 + b"]" * 100 + b"}"
    assert F.scan_top(ok, ()) == {}


def test_scan_top_agrees_with_json_on_random_mutations():
    rnd = random.Random(7)
    base = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi \"there\" \\ ok"}],
                       "n": -1.5e3, "t": True, "f": False, "z": None}).encode()
    for _ in range(3000):
        b = bytearray(base)
        for _ in range(rnd.randint(1, 3)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        b = bytes(b)
        try:
            json_ok = isinstance(json.loads(b), dict)
        except (ValueError, UnicodeDecodeError):
            json_ok = False
        try:
            F.scan_top(b, (b"model",))
            scan_ok = True
        except F.FramingError:
            scan_ok = False
        if json_ok:
            assert scan_ok, b  # never rejects valid JSON


def test_top_field_parses_one_top_level_value():
    body = b'{"choices": [{"usage": 1}], "usage": {"prompt_tokens": 3}, "z": "x"}'
    assert F.top_field(body, b"usage") == {"prompt_tokens": 3}
    assert F.top_field(body, b"missing") is None
    with pytest.raises(F.FramingError):
        F.top_field(b"[1]", b"usage")


def test_scan_top_matches_whole_keys_only():
    from cbusbar.framing import scan_top
    body = b'{"model":"x","usage":{"model":1},"m":2,"mo\\u0064el":3,"models":[4]}'
    got = scan_top(body, (b"usage", "model", b"m", b"mo", b"model"))
    # a str key never matches; a prefix or a longer key is another key; an escaped spelling is
    # not matched; a nested member of the same name is not a top-level one
    assert got == {b"usage": (21, 32), b"m": (37, 38), b"model": (9, 12)}
    assert body[9:12] == b'"x"' and body[21:32] == b'{"model":1}'
