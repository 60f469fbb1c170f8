"""cbusbar.h1.parse_request, the ingress fast path, against httptools (llhttp) as the oracle:
whenever the fast path answers, httptools must parse exactly those bytes to exactly that request;
whatever it is unsure of it must leave to httptools (None)."""
import random

import httptools
import pytest

from cbusbar.h1 import parse_request

BIG = 1 << 30


def oracle(data):
    """Every complete message httptools parses from data, or 'error'."""
    msgs = []

    class Rec:
        def on_message_begin(self):
            self.url, self.h, self.body = b"", {}, b""

        def on_url(self, u):
            self.url += u

        def on_header(self, n, v):
            self.h[n.lower()] = v

        def on_body(self, b):
            self.body += b

        def on_message_complete(self):
            msgs.append((p.get_method(), self.url, self.h, self.body, p.should_keep_alive()))

    p = httptools.HttpRequestParser(Rec())
    try:
        p.feed_data(data)
    except httptools.HttpParserUpgrade:
        return "error"
    except httptools.HttpParserError:
        return "error"
    return msgs


def check(data, start=0, limits=(BIG, BIG, BIG)):
    """Asserts the fast path agrees with httptools on data[start:]; returns its answer."""
    r = parse_request(data, start, *limits)
    if r is None:
        return None
    method, path, query, headers, body, keep_alive, end = r
    msgs = oracle(data[start:end])
    assert msgs != "error", (data[start:end], r)
    assert len(msgs) == 1, (data[start:end], r, msgs)
    m_method, url, h, m_body, m_ka = msgs[0]
    raw, sep, q = url.partition(b"?")
    assert (method, path, query, headers, body, keep_alive) == (
        m_method, raw.decode("ascii"), q.decode("ascii"), h, m_body, m_ka), (data, r, msgs)
    # What httptools sees past `end` is the next message, never more of this one.
    assert end <= len(data)
    return r


SDK_REQUEST = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: api.example\r\nAccept-Encoding: gzip, deflate\r\n"
               b"Connection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\n"
               b"User-Agent: OpenAI/Python 1.54.0\r\nX-Stainless-Lang: python\r\nAuthorization: Bearer sk-x\r\n"
               b"Content-Length: 27\r\n\r\n{\"model\":\"m\",\"messages\":[]}")


def test_an_sdk_request_takes_the_fast_path():
    r = check(SDK_REQUEST)
    assert r is not None
    assert r[:3] == (b"POST", "/v1/chat/completions", "")
    assert r[3][b"authorization"] == b"Bearer sk-x" and r[4] == b'{"model":"m","messages":[]}'
    assert r[5] is True and r[6] == len(SDK_REQUEST)


def test_pipelined_requests_parse_one_after_another():
    data = SDK_REQUEST + b"GET /healthz?x=1&y HTTP/1.1\r\nHost: a\r\n\r\n" + SDK_REQUEST
    r1 = check(data)
    r2 = check(data, r1[6])
    assert r2[:3] == (b"GET", "/healthz", "x=1&y") and r2[4] == b""
    r3 = check(data, r2[6])
    assert r3[6] == len(data)


@pytest.mark.parametrize("data", [
    SDK_REQUEST[:-1],                                              # body not all here yet
    SDK_REQUEST[:40],                                              # head not all here yet
    b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n",
    b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
    b"GET / HTTP/1.0\r\n\r\n",
    b"PUT / HTTP/1.1\r\n\r\n",
    b"GET /a#frag HTTP/1.1\r\n\r\n",
    b"GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n",                      # obs-fold
    b"GET / HTTP/1.1\nA: b\n\n",                                   # bare LF
    b"GET / HTTP/1.1\r\nA : b\r\n\r\n",                            # space before the colon
    b"GET / HTTP/1.1\r\nA: b \r\n\r\n",                            # trailing whitespace
    b"GET / HTTP/1.1\r\nA: caf\xc3\xa9\r\n\r\n",                   # obs-text
    b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
    b"POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\nx",
    b"POST / HTTP/1.1\r\nContent-Length: 1234567890123456\r\n\r\n",
    b"GET / HTTP/1.1\r\nConnection: close\r\n\r\nGET / HTTP/1.1\r\n\r\n",   # bytes after close
    b"GET / HTTP/1.1\r\nConnection: keep-alive, te\r\n\r\n",
    b"\r\nGET / HTTP/1.1\r\n\r\n",
    b"",
])
def test_anything_unusual_is_left_to_httptools(data):
    assert parse_request(data, 0, BIG, BIG, BIG) is None


def test_limits_are_left_to_httptools_to_reject():
    # URL + names + values: 1 + (4 + 1) + (1 + 1) = 8 bytes, 2 headers, 1 body byte.
    data = b"POST / HTTP/1.1\r\nHost: x\r\nB: 1\r\n\r\n"
    assert check(data, 0, (8, 2, 0)) is not None
    assert parse_request(data, 0, 7, 2, 0) is None
    assert parse_request(data, 0, 8, 1, 0) is None
    data = b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc"
    assert check(data, 0, (BIG, BIG, 3)) is not None
    assert parse_request(data, 0, BIG, BIG, 2) is None


def test_connection_close_and_case_insensitive_names():
    r = check(b"POST /x HTTP/1.1\r\nCONTENT-length: 2\r\nConnection: Close\r\n\r\nhi")
    assert r[5] is False and r[3] == {b"content-length": b"2", b"connection": b"Close"} and r[4] == b"hi"
    r = check(b"GET / HTTP/1.1\r\nX-A: 1\r\nx-a: 2\r\nEmpty:\r\nTab:\t v\tw\r\n\r\n")
    assert r[3] == {b"x-a": b"2", b"empty": b"", b"tab": b"v\tw"}


# ---------------------------------------------------------------------------------------- fuzz
TCHARS = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
ODD = bytes(range(0, 33)) + b"\x7f\x80\xff\xc3\xa9():;<=>?@[\\]{}\"/,"


def _pick(rnd, common, odd, p_odd):
    return rnd.choice(odd if rnd.random() < p_odd else common)


def _token(rnd, n, p_odd):
    return bytes(_pick(rnd, TCHARS, ODD, p_odd) for _ in range(n))


def _request(rnd):
    # Half the requests are clean (what clients send), half carry odd bytes and shapes.
    clean = rnd.random() < 0.5
    odd = 0.0 if clean else 0.03
    method = rnd.choice([b"POST", b"GET"] if clean else [b"POST", b"GET", b"PUT", b"HEAD", b"post", b"DELETE"])
    target = b"/" + bytes(_pick(rnd, b"abcxyz019/-_.~%?=&:@!$'()*+,;", ODD + b"#", odd)
                          for _ in range(rnd.randrange(0, 30)))
    if not clean and rnd.random() < 0.05:
        target = rnd.choice([b"*", b"http://h/x", b"", b"x"])
    version = b"HTTP/1.1" if clean else rnd.choice(
        [b"HTTP/1.1"] * 4 + [b"HTTP/1.0", b"HTTP/2.0", b"http/1.1", b"HTTP/1.1 "])
    eol = b"\r\n" if clean or rnd.random() < 0.9 else rnd.choice([b"\n", b"\r", b"\r\r\n"])
    body = bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 0, 1, 5, 40])))
    lines = []
    for _ in range(rnd.randrange(0, 8)):
        name = _token(rnd, rnd.randrange(1 if clean else 0, 12), odd)
        value = bytes(_pick(rnd, b"abc xyz/=;,-09\t\"", ODD, odd) for _ in range(rnd.randrange(0, 20)))
        if clean:
            value = value.strip(b" \t")
        sep = rnd.choice([b": ", b":", b":  ", b":\t"] if clean else [b": ", b":", b" : ", b":\t"])
        lines.append(name + sep + value)
    specials = [
        b"Content-Length: %d" % len(body), b"content-length: %d" % len(body),
        b"Content-Length: %d" % (len(body) + rnd.choice([-1, 1, 100])), b"Content-Length: 0%d" % len(body),
        b"Content-Length: %d " % len(body), b"Content-Length:  %d" % len(body), b"Content-Length: x",
        b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip", b"Connection: close",
        b"Connection: keep-alive", b"connection: KEEP-ALIVE", b"Connection: upgrade", b"Connection: te, close",
        b"Upgrade: h2c", b"Expect: 100-continue", b"Host: example", b"Content-Type: application/json",
        b"Content-Length: -1", b"Content-Length: 99999999999999999999",
    ]
    for _ in range(rnd.randrange(0, 1 if clean else 3)):
        lines.insert(rnd.randrange(len(lines) + 1), rnd.choice(specials))
    if rnd.random() < 0.7 and body:
        lines.append(b"Content-Length: %d" % len(body))
    if not clean and rnd.random() < 0.05:
        lines.append(b" folded")
    data = method + b" " + target + b" " + version + eol + b"".join(x + eol for x in lines) + eol + body
    return data


def _mutate(rnd, data):
    b = bytearray(data)
    for _ in range(rnd.choice([1, 1, 2, 4])):
        if not b:
            break
        i = rnd.randrange(len(b))
        op = rnd.randrange(4)
        if op == 0:
            b[i] = rnd.randrange(256)
        elif op == 1:
            b.insert(i, rnd.choice(b"\r\n :\t\x00\x7f\x80/?#"))
        elif op == 2:
            del b[i]
        else:
            b[i] = rnd.choice(b"\r\n :\t")
    return bytes(b)


def test_fuzz_against_httptools():
    rnd = random.Random(20260101)
    accepted = 0
    for _ in range(40000):
        data = _request(rnd)
        if rnd.random() < 0.4:
            data = _mutate(rnd, data)
        if rnd.random() < 0.2:
            data += _request(rnd)
        if rnd.random() < 0.1:
            data = data[:rnd.randrange(len(data) + 1)]
        limits = (BIG, BIG, BIG)
        if rnd.random() < 0.1:
            limits = (rnd.randrange(1, 80), rnd.randrange(0, 6), rnd.randrange(0, 50))
        r = check(data, 0, limits)
        if r is not None:
            accepted += 1
            if r[6] < len(data):
                check(data, r[6], limits)
    # The generator makes plenty of ordinary requests; a fast path that bails on everything would
    # pass the checks above without being one.
    assert accepted > 5000


def test_fuzz_every_truncation_and_single_byte_change_of_an_sdk_request():
    for cut in range(len(SDK_REQUEST) + 1):
        r = check(SDK_REQUEST[:cut])
        assert (r is not None) == (cut == len(SDK_REQUEST))
    rnd = random.Random(7)
    for i in range(len(SDK_REQUEST)):
        for c in rnd.sample(range(256), 24):
            check(SDK_REQUEST[:i] + bytes([c]) + SDK_REQUEST[i + 1:])


# ------------------------------------------------------------------------------ responses
from cbusbar.h1 import parse_response  # noqa: E402


def response_oracle(data):
    msgs = []

    class Rec:
        def on_message_begin(self):
            self.h, self.body = [], b""

        def on_header(self, n, v):
            self.h.append((n.lower(), v))

        def on_headers_complete(self):
            self.status = p.get_status_code()

        def on_body(self, b):
            self.body += b

        def on_message_complete(self):
            msgs.append((self.status, self.h, self.body, p.should_keep_alive()))

    p = httptools.HttpResponseParser(Rec())
    try:
        p.feed_data(data)
    except (httptools.HttpParserUpgrade, httptools.HttpParserError):
        return "error"
    return msgs


def check_response(data):
    r = parse_response(data)
    if r is not None:
        msgs = response_oracle(data)
        assert msgs != "error" and len(msgs) == 1, (data, r, msgs)
        assert r == msgs[0], (data, r, msgs)
    return r


MOCK_RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n"
                 b"Date: Mon, 01 Jan 2024 00:00:00 GMT\r\nX-Request-Id: a\r\n\r\n{}")


def test_a_plain_response_takes_the_fast_path():
    r = check_response(MOCK_RESPONSE)
    assert r == (200, [(b"content-type", b"application/json"), (b"content-length", b"2"),
                       (b"date", b"Mon, 01 Jan 2024 00:00:00 GMT"), (b"x-request-id", b"a")], b"{}", True)
    assert check_response(b"HTTP/1.1 429 \r\nConnection: close\r\nContent-Length: 0\r\n\r\n") == (
        429, [(b"connection", b"close"), (b"content-length", b"0")], b"", False)


@pytest.mark.parametrize("data", [
    MOCK_RESPONSE[:-1], MOCK_RESPONSE + b"x", MOCK_RESPONSE[:30],
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n\r\n",                                  # close-delimited body
    b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx",
])
def test_unusual_responses_are_left_to_httptools(data):
    assert parse_response(data) is None


def _response(rnd):
    clean = rnd.random() < 0.5
    odd = 0.0 if clean else 0.03
    status = rnd.choice([200, 200, 201, 400, 429, 500, 529] if clean else [100, 101, 199, 204, 304, 600, 999, 200, 42])
    reason = rnd.choice([b"OK", b"", b"Too Many Requests", b"x\ty"] if clean
                        else [b"OK", b"\x01", b"caf\xc3\xa9", b"\r"])
    body = bytes(rnd.randrange(256) for _ in range(rnd.choice([0, 2, 30])))
    lines = []
    for _ in range(rnd.randrange(0, 8)):
        name = _token(rnd, rnd.randrange(1 if clean else 0, 12), odd)
        value = bytes(_pick(rnd, b"abc xyz/=;,-09\t\"", ODD, odd) for _ in range(rnd.randrange(0, 20)))
        if clean:
            value = value.strip(b" \t")
        lines.append(name + rnd.choice([b": ", b":"] if clean else [b": ", b" : ", b":\t"]) + value)
    if clean or rnd.random() < 0.7:
        lines.insert(rnd.randrange(len(lines) + 1), b"Content-Length: %d" % len(body))
    for _ in range(rnd.randrange(0, 1 if clean else 3)):
        lines.insert(rnd.randrange(len(lines) + 1), rnd.choice([
            b"Connection: close", b"Connection: keep-alive", b"Transfer-Encoding: chunked",
            b"Content-Length: 5", b"Upgrade: h2c", b"connection: Keep-Alive, x", b"Content-Length: 0%d" % len(body)]))
    version = b"HTTP/1.1" if clean else rnd.choice([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/1.1 "])
    return (version + b" %d " % status + reason + b"\r\n" + b"".join(x + b"\r\n" for x in lines)
            + b"\r\n" + body)


def test_fuzz_responses_against_httptools():
    rnd = random.Random(99)
    accepted = 0
    for _ in range(30000):
        data = _response(rnd)
        if rnd.random() < 0.4:
            data = _mutate(rnd, data)
        if rnd.random() < 0.1:
            data = data[:rnd.randrange(len(data) + 1)]
        if check_response(data) is not None:
            accepted += 1
    assert accepted > 5000


# ------------------------------------------------------------------------------- response heads

def test_server_timing_is_the_python_formatting_to_the_microsecond():
    import random
    from cbusbar.h1 import server_timing
    rng = random.Random(7)
    values = [0, -1, -10**9, 1, 499, 1000, 999_999, 10**6, 10**12 + 123_456_789]
    values += [rng.randrange(0, 10**10) for _ in range(5000)]
    for ns in values:
        if ns % 1000 == 500:
            continue                # a tie: the float formatting rounds the binary value
        want = b"Server-Timing: busbar;dur=%.3f\r\n" % (max(ns, 0) / 1e6)
        assert server_timing(ns) == want, ns
    assert server_timing(2500) == b"Server-Timing: busbar;dur=0.003\r\n"    # ties round up


def test_response_head_is_the_old_formatting():
    import random
    from cbusbar.h1 import response_head
    rng = random.Random(11)
    for _ in range(2000):
        status = b"HTTP/1.1 %d X\r\n" % rng.choice((200, 400, 404, 502, 529))
        ctype = rng.choice((b"application/json", b"text/event-stream", b""))
        extra = b"".join(b"x-h%d: %d\r\n" % (i, rng.randrange(10**6)) for i in range(rng.randrange(4)))
        timing = rng.choice((b"", b"Server-Timing: busbar;dur=0.012\r\n"))
        close = rng.random() < 0.5
        ka = b"Connection: close\r\n" if close else b""
        length = rng.choice((0, 9, 10, 99, 100, rng.randrange(10**9)))
        assert response_head(status, ctype, length, extra, timing, close) == (
            b"%bContent-Type: %b\r\nContent-Length: %d\r\n%b%b%b\r\n" % (
                status, ctype, length, extra, timing, ka))
        assert response_head(status, ctype, -1, extra, timing, close) == (
            b"%bContent-Type: %b\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\n"
            b"%b%b%b\r\n" % (status, ctype, extra, timing, ka))
    with pytest.raises(TypeError):
        response_head(b"HTTP/1.1 200 OK\r\n", b"a", 0, None, b"", False)
