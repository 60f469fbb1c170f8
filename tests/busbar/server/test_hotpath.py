"""The per-request shortcuts give exactly what the general code gives."""
import itertools

from busbar.server import dispatch as D


def _slow(method, path, query, headers):
    saved = D._FIXED_CHAT
    D._FIXED_CHAT = {}
    try:
        return D.dispatch(method, path, query, headers)
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
        fast = D.dispatch(method, path, "", headers)
        slow = _slow(method, path, "", headers)
        assert [getattr(fast, a) for a in D.Route.__slots__] == [
            getattr(slow, a) for a in D.Route.__slots__], (method, path, headers)


def test_egress_head_cache_gives_the_same_bytes():
    from busbar import config as cfgmod
    from busbar.engine.egress import Egress
    cfg = cfgmod.load(text='providers: {p: {protocol: anthropic, base_url: "http://127.0.0.1:1/pre", '
                           'api_key: {env: K}}}\nmodels: {m: {provider: p}}\n', env={"K": "sk-a"})
    eg = Egress(cfg.providers["p"])
    for _ in range(2):    # first build, then from the cache
        for stream in (False, True):
            data = eg.request("/v1/messages", b"{}", stream, b"anthropic-beta: b\r\n")
            head = eg.head_stream if stream else eg.head_json
            assert data == (b"POST /pre/v1/messages HTTP/1.1\r\n" + head +
                            b"anthropic-beta: b\r\nContent-Length: 2\r\n\r\n{}")
