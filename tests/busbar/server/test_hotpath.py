"""The per-request shortcuts give exactly what the general code gives."""
import itertools

from busbar.engine.route import FIELDS
from busbar.server import dispatch as D
from tests.busbar.server.test_dispatch import DISPATCHER


def _slow(method, path, query, headers):
    saved = D._FIXED_CHAT
    D._FIXED_CHAT = {}
    try:
        return DISPATCHER.dispatch(method, path, query, headers)
    finally:
        D._FIXED_CHAT = saved


HEADER_SETS = [{}, {b"anthropic-version": b"2023-06-01"}, {b"anthropic-beta": b"x"},
               {b"x-goog-api-key": b"k"}, {b"x-api-key": b"k"},
               {b"authorization": b"AWS4-HMAC-SHA256 Credential=x"}, {b"authorization": b"Bearer sk"}]


def test_fixed_path_routes_equal_the_general_dispatch():
    for method, path, headers in itertools.product(
            [b"POST", b"GET", b"PUT"],
            ["/v1/chat/completions", "/v1/responses", "/v2/chat", "/v1/messages", "/x/v1/messages",
             "/v1/models", "/healthz"], HEADER_SETS):
        fast = DISPATCHER.dispatch(method, path, "", headers)
        slow = _slow(method, path, "", headers)
        assert [getattr(fast, a) for a in FIELDS] == [
            getattr(slow, a) for a in FIELDS], (method, path, headers)


def test_egress_head_cache_gives_the_same_bytes():
    from busbar import config as cfgmod
    from busbar.engine.egress import Egress
    cfg = cfgmod.load(text='providers: {p: {protocol: anthropic, base_url: "http://127.0.0.1:1/pre", '
                           'api_key: {env: K}}}\nmodels: {m: {provider: p}}\n', env={"K": "sk-a"})
    eg = Egress(cfg.providers["p"])
    # The whole request, spelled out: a cache that returned another path's or mode's head, or
    # dropped a header, differs here.
    head = (b"POST /pre/v1/messages HTTP/1.1\r\nHost: 127.0.0.1:1\r\nUser-Agent: Anthropic/Python "
            b"0.39.0\r\nContent-Type: application/json\r\nanthropic-version: 2023-06-01\r\n"
            b"x-api-key: sk-a\r\n")
    for _ in range(2):    # first build, then from the cache
        for stream, accept in ((False, b"application/json"), (True, b"text/event-stream")):
            data = eg.request("/v1/messages", b"{}", stream, b"anthropic-beta: b\r\n")
            assert data == (head + b"Accept: " + accept + b"\r\nanthropic-beta: b\r\n"
                            b"Content-Length: 2\r\n\r\n{}")
        assert eg.request("/v1/messages/x", b"{}", False) == (
            head.replace(b"/v1/messages ", b"/v1/messages/x ") +
            b"Accept: application/json\r\nContent-Length: 2\r\n\r\n{}")
