"""cbusbar.eventstream against botocore's own reader (botocore.eventstream.EventStreamBuffer), the
reference every AWS SDK client of busbar's Bedrock ingress uses."""
import random
import struct
import zlib

import pytest
from botocore.eventstream import EventStreamBuffer

from cbusbar.eventstream import (EventStreamError, EventStreamParser, crc32, encode_frame,
                                 encode_headers)

MAX_FRAME = 16 * 1024 * 1024


def botocore_decode(data):
    buf = EventStreamBuffer()
    buf.add_data(data)
    return [(m.headers, m.payload) for m in buf]


def raw_header(name, kind, value=b""):
    """One header encoded by hand (independent of the module under test)."""
    n = name.encode()
    return bytes([len(n)]) + n + bytes([kind]) + value


def raw_frame(header_block, payload):
    """A frame assembled with struct + zlib, independently of encode_frame."""
    total = 16 + len(header_block) + len(payload)
    prelude = struct.pack("!II", total, len(header_block))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    body = prelude + header_block + payload
    return body + struct.pack("!I", zlib.crc32(body))


# Every header type botocore decodes (types 0-9), in one frame.
ALL_TYPES = b"".join([
    raw_header("t", 0),
    raw_header("f", 1),
    raw_header("byte", 2, struct.pack("!b", -1)),
    raw_header("short", 3, struct.pack("!h", -300)),
    raw_header("int", 4, struct.pack("!i", 70000)),
    raw_header("long", 5, struct.pack("!q", -(2 ** 40))),
    raw_header("bytes", 6, struct.pack("!H", 3) + b"\x00\xff\x10"),
    raw_header("str", 7, struct.pack("!H", 6) + "héllo".encode()),
    raw_header("ts", 8, struct.pack("!q", 1700000000123)),
    raw_header("uuid", 9, bytes(range(16))),
])

KNOWN_FRAMES = [
    # botocore's own test vectors: the empty frame, and one JSON payload with a string header.
    b"\x00\x00\x00\x10\x00\x00\x00\x00\x05\xc2H\xeb}\x98\xc8\xff",
    b"\x00\x00\x00=\x00\x00\x00 \x07\xfd\x83\x96\x0ccontent-type\x07\x00\x10application/json"
    b"{'foo':'bar'}\x8d\x9c\x08\xb1",
    raw_frame(ALL_TYPES, b"payload"),
    raw_frame(raw_header(":event-type", 7, struct.pack("!H", 12) + b"messageStart"),
              b'{"role":"assistant"}'),
    raw_frame(b"", b"x" * 5000),  # past the table-CRC threshold: the zlib path
]


def bedrock_frames():
    out = []
    for i in range(5):
        out.append(encode_frame(encode_headers(
            {":event-type": "contentBlockDelta", ":content-type": "application/json",
             ":message-type": "event"}),
            b'{"contentBlockIndex":0,"delta":{"text":"tok%d"},"p":"abc"}' % i))
    return out


@pytest.mark.parametrize("frame", KNOWN_FRAMES)
def test_decodes_known_frames_like_botocore(frame):
    assert EventStreamParser().feed(frame) == botocore_decode(frame)


def test_all_header_types_decode_like_botocore():
    headers, payload = EventStreamParser().feed(raw_frame(ALL_TYPES, b"p"))[0]
    assert headers == {"t": True, "f": False, "byte": -1, "short": -300, "int": 70000,
                       "long": -(2 ** 40), "bytes": b"\x00\xff\x10", "str": "héllo",
                       "ts": 1700000000123, "uuid": bytes(range(16))}
    assert payload == b"p"


@pytest.mark.parametrize("headers,payload", [
    ({}, b""),
    ({":event-type": "messageStart", ":content-type": "application/json",
      ":message-type": "event"}, b'{"role":"assistant"}'),
    ({"s": "ünïcode ✓", "b": b"\x00\x01", "yes": True, "no": False, "small": -7,
      "big": 2 ** 40, "neg": -(2 ** 63)}, b"\x00" * 3),
    ({"x" * 255: "y" * 65535}, b"z" * 70000),
])
def test_encodings_decode_with_botocore(headers, payload):
    frame = encode_frame(encode_headers(headers), payload)
    assert botocore_decode(frame) == [(headers, payload)]
    assert EventStreamParser().feed(frame) == [(headers, payload)]


@pytest.mark.parametrize("headers", [
    {"": "empty name"},
    {"x" * 256: "name too long"},
    {"v": "y" * 65536},
    {"v": 2 ** 63},
    {"v": 1.5},
    {"v": None},
    {1: "non-string name"},
])
def test_encode_rejects_what_the_format_cannot_carry(headers):
    with pytest.raises(EventStreamError):
        encode_frame(encode_headers(headers), b"")


def test_encode_rejects_oversized_frames():
    with pytest.raises(EventStreamError):
        encode_frame(encode_headers({}), b"x" * (MAX_FRAME - 15))
    assert len(encode_frame(encode_headers({}), b"x" * (MAX_FRAME - 16))) == MAX_FRAME


def test_split_at_every_byte():
    stream = b"".join(bedrock_frames()) + KNOWN_FRAMES[2]
    expected = botocore_decode(stream)
    for cut in range(len(stream) + 1):
        p = EventStreamParser()
        got = p.feed(stream[:cut]) + p.feed(stream[cut:])
        assert got == expected, cut
        assert p.buffered() == 0


def test_one_byte_at_a_time():
    stream = b"".join(bedrock_frames())
    p = EventStreamParser()
    got = []
    for i in range(len(stream)):
        got += p.feed(stream[i:i + 1])
        if i + 1 < len(stream):
            assert p.buffered() > 0 or got
    assert got == botocore_decode(stream)


def test_buffered_reports_a_truncated_frame():
    frame = bedrock_frames()[0]
    p = EventStreamParser()
    assert p.feed(frame[:-3]) == []
    assert p.buffered() == len(frame) - 3
    assert len(p.feed(frame[-3:])) == 1
    assert p.buffered() == 0


def _with_prelude(total, hlen):
    prelude = struct.pack("!II", total, hlen)
    return prelude + struct.pack("!I", zlib.crc32(prelude))


def _corrupt(frame, at):
    b = bytearray(frame)
    b[at] ^= 0x01
    return bytes(b)


@pytest.mark.parametrize("data", [
    _corrupt(KNOWN_FRAMES[1], 9),                      # prelude CRC
    _corrupt(KNOWN_FRAMES[1], 30),                     # header byte: message CRC
    _corrupt(KNOWN_FRAMES[1], len(KNOWN_FRAMES[1]) - 1),  # the message CRC itself
    _corrupt(KNOWN_FRAMES[1], 1),                      # length byte: prelude CRC
    _with_prelude(15, 0) + b"\x00" * 8,                # shorter than the smallest frame
    _with_prelude(MAX_FRAME + 1, 0),                   # longer than the cap (rejected at once)
    _with_prelude(32, 17) + b"\x00" * 20,              # headers longer than the frame allows
    raw_frame(raw_header("x", 10), b""),               # unknown header type
    raw_frame(raw_header("x", 7, b"\x00\x09abc"), b""),  # string value overruns the block
    raw_frame(raw_header("x", 4, b"\x00\x00"), b""),   # int32 overruns the block
    raw_frame(b"\x05ab", b""),                         # name overruns the block
    raw_frame(raw_header("x", 0) + raw_header("x", 1), b""),  # duplicate header
    raw_frame(b"\x02\xff\xfe\x00", b""),               # name is not UTF-8
    raw_frame(raw_header("x", 7, b"\x00\x02\xc3\x28"), b""),  # value is not UTF-8
])
def test_bad_frames_raise_event_stream_error(data):
    p = EventStreamParser()
    with pytest.raises(EventStreamError):
        p.feed(data)
    # The stream cannot be resynchronised after a bad frame.
    with pytest.raises(EventStreamError):
        p.feed(KNOWN_FRAMES[0])


def test_event_stream_error_is_a_value_error():
    assert issubclass(EventStreamError, ValueError)


def test_frame_at_the_cap_is_accepted():
    frame = encode_frame(encode_headers({}), b"y" * (MAX_FRAME - 16))
    p = EventStreamParser()
    assert p.feed(frame[:100]) == []
    (headers, payload), = p.feed(frame[100:])
    assert headers == {} and len(payload) == MAX_FRAME - 16


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 511, 512, 513, 4096, 100000])
def test_crc32_matches_zlib(n):
    data = bytes((i * 31 + 7) & 0xFF for i in range(n))
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data[n // 2:], crc32(data[:n // 2])) == zlib.crc32(data)


def _mutate(rng, frame):
    b = bytearray(frame)
    op = rng.randrange(5)
    if op == 0 and b:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif op == 1:
        del b[rng.randrange(len(b) + 1):]
    elif op == 2:
        at = rng.randrange(len(b) + 1)
        b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    elif op == 3:
        b = bytearray(rng.randbytes(rng.randint(0, 64)))
    else:
        # A valid CRC over garbage headers: exercises the header reader, not just the CRCs.
        b = bytearray(raw_frame(rng.randbytes(rng.randint(0, 40)), rng.randbytes(rng.randint(0, 8))))
    return bytes(b)


def test_fuzz_only_event_stream_error_and_agrees_with_botocore():
    rng = random.Random(20240501)
    seeds = KNOWN_FRAMES[:4] + bedrock_frames()
    for _ in range(4000):
        data = _mutate(rng, rng.choice(seeds))
        p = EventStreamParser()
        got = []
        try:
            at = 0
            while at < len(data):
                step = rng.randint(1, 9)
                got += p.feed(data[at:at + step])
                at += step
        except EventStreamError:
            continue
        # Whatever busbar accepts, botocore reads the same way.
        assert got == botocore_decode(data)[:len(got)]
