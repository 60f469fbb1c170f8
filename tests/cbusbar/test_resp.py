"""cbusbar/resp.pyx: the RESP2 command encoder and incremental reply parser of busbar's own Redis
client. Commands encode as redis-py encodes them; replies parse whole however they are cut into
feeds (every byte boundary); hostile or malformed frames raise RespProtocolError, never crash,
and the limits hold."""
from __future__ import annotations

import random

import pytest

from cbusbar.resp import (
    DEFAULT_MAX_BULK, RespError, RespParser, RespProtocolError, encode_command, encode_script)


def resp(v) -> bytes:
    """The RESP2 wire form of a reply value (the test's own, independent encoder)."""
    if v is None:
        return b"$-1\r\n"
    if isinstance(v, RespError):
        return b"-" + v.message.encode() + b"\r\n"
    if isinstance(v, int):
        return b":%d\r\n" % v
    if isinstance(v, bytes):
        return b"$%d\r\n%s\r\n" % (len(v), v)
    if isinstance(v, list):
        return b"*%d\r\n" % len(v) + b"".join(resp(x) for x in v)
    raise TypeError(v)


def same(a, b):
    if isinstance(a, RespError):
        return isinstance(b, RespError) and a.message == b.message
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


REPLIES = [
    0, 1, -1, 2**63 - 1, -2**63, b"", b"OK", b"a\r\nb\x00\xff", None, [], [None],
    [0, [1, [b"x", []]], None, RespError("ERR inner")],
    RespError("NOSCRIPT No matching script. Please use EVAL."),
    [i for i in range(50)], b"x" * 5000,
]


# ---------------------------------------------------------------------------- encoding
def test_commands_encode_as_redis_py_packs_them():
    from redis.asyncio.connection import Connection
    pack = Connection().pack_command
    for args in ([b"PING"], [b"SET", "k\u00e9y", b"v\r\n"], [b"INCRBY", "k", -12],
                 [b"X", 0, 2**63 - 1, -2**63, 2**70, -2**70, "", b""],
                 [b"EVALSHA", b"abc", 2, "busbar:usage:group:g@minute:1700000000", "k2", 1, 0, "r"]):
        assert encode_command(args) == b"".join(pack(*args)), args


def test_script_frame_is_the_evalsha_command():
    keys, args = ["k1", b"k2"], [2, 0, 60, -5, "r", b"b"]
    assert encode_script(b"f" * 40, keys, args) == encode_command(
        [b"EVALSHA", b"f" * 40, 2] + keys + args)
    assert encode_script(b"s", [], []) == b"*3\r\n$7\r\nEVALSHA\r\n$1\r\ns\r\n$1\r\n0\r\n"


def test_bad_arguments_are_refused():
    for bad in (1.5, None, True, object(), [b"x"]):
        with pytest.raises(TypeError):
            encode_command([b"SET", bad])
    with pytest.raises(ValueError):
        encode_command([])


# ---------------------------------------------------------------------------- parsing
def test_every_reply_type_round_trips():
    wire = b"".join(resp(v) for v in REPLIES) + b"+PONG\r\n"
    got = RespParser().feed(wire)
    assert len(got) == len(REPLIES) + 1
    for want, have in zip(REPLIES, got):
        assert same(want, have), (want, have)
    assert got[-1] == b"PONG"
    err = got[REPLIES.index(REPLIES[12])]
    assert isinstance(err, RespError) and err.code == "NOSCRIPT"
    assert RespParser().feed(b"*-1\r\n") == [None]


def test_fragmented_at_every_byte_boundary():
    wire = b"".join(resp(v) for v in REPLIES[:12])
    for cut in range(1, len(wire)):
        p = RespParser()
        got = p.feed(wire[:cut]) + p.feed(wire[cut:])
        assert len(got) == 12 and all(same(a, b) for a, b in zip(REPLIES, got)), cut
        assert p.pending == 0
    p = RespParser()                            # one byte a feed
    got = []
    for i in range(len(wire)):
        got += p.feed(wire[i:i + 1])
    assert len(got) == 12 and all(same(a, b) for a, b in zip(REPLIES, got))


def test_random_cuts_of_nested_replies():
    rng = random.Random(41)

    def value(depth):
        r = rng.random()
        if depth < 4 and r < 0.3:
            return [value(depth + 1) for _ in range(rng.randrange(0, 5))]
        if r < 0.5:
            return rng.randrange(-2**63, 2**63)
        if r < 0.8:
            return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        if r < 0.9:
            return None
        return RespError("ERR %d" % rng.randrange(1000))

    for _ in range(200):
        vals = [value(0) for _ in range(rng.randrange(1, 6))]
        wire = b"".join(resp(v) for v in vals)
        p = RespParser()
        got, i = [], 0
        while i < len(wire):
            j = i + rng.randrange(1, 12)
            got += p.feed(wire[i:j])
            i = j
        assert len(got) == len(vals) and all(same(a, b) for a, b in zip(vals, got))


HOSTILE = [
    b"?\r\n",                               # not a RESP2 type byte
    b"%1\r\n+a\r\n+b\r\n",                  # RESP3 map: not spoken here
    b":12a\r\n", b":\r\n", b":-\r\n", b":99999999999999999999\r\n", b":9223372036854775808\r\n",
    b"$-2\r\n", b"$abc\r\n", b"$3\r\nabcXY", b"$3\r\nabc\rX",
    b"*-5\r\n", b"*x\r\n", b"+OK\rX\r\n",
    b"*1\r\n*1\r\n$2\r\nab\r\n!\r\n" + b"",  # a bad byte where a second reply starts
]


@pytest.mark.parametrize("frame", HOSTILE)
def test_hostile_frames_raise_cleanly(frame):
    p = RespParser()
    with pytest.raises(RespProtocolError):
        p.feed(frame)
    with pytest.raises(RespProtocolError):      # broken for good: the connection is dropped
        p.feed(b"+OK\r\n")


def test_limits():
    with pytest.raises(RespProtocolError, match="limit"):
        RespParser().feed(b"$%d\r\n" % (DEFAULT_MAX_BULK + 1))
    with pytest.raises(RespProtocolError, match="limit"):
        RespParser(max_array=3).feed(b"*4\r\n")
    assert RespParser(max_array=3).feed(b"*3\r\n:1\r\n:2\r\n:3\r\n") == [[1, 2, 3]]
    with pytest.raises(RespProtocolError, match="deeper"):
        RespParser(max_depth=3).feed(b"*1\r\n" * 4)
    assert RespParser(max_depth=3).feed(b"*1\r\n" * 3 + b":7\r\n") == [[[[7]]]]
    with pytest.raises(RespProtocolError, match="longer"):   # a line that never ends
        p = RespParser(max_line=64)
        for _ in range(10):
            p.feed(b"+" + b"a" * 20)
    with pytest.raises(ValueError):
        RespParser(max_depth=0)
    # a huge array header allocates nothing ahead of its elements
    p = RespParser()
    assert p.feed(b"*1000000\r\n") == [] and p.pending == 0


def test_garbage_never_crashes():
    rng = random.Random(7)
    alphabet = b"+-:$*\r\n0123456789-abc"
    for _ in range(3000):
        junk = bytes(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
        p = RespParser(max_bulk=64, max_array=8, max_depth=4, max_line=32)
        try:
            for i in range(0, len(junk), 3):
                p.feed(junk[i:i + 3])
        except RespProtocolError:
            pass
