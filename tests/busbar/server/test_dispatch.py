"""Ingress dispatch: headers first, then the path (SPEC §1.1)."""
import pytest

from busbar.server import dispatch as D


def _data_listener():
    """A Dispatcher over the data listener's own table, as the Gateway makes it."""
    from types import SimpleNamespace

    from busbar.server import local
    from busbar.server.routes import Routes
    gw = SimpleNamespace(routes=Routes())
    local.mount(gw)
    return D.Dispatcher(gw.routes), local


DISPATCHER, LOCAL = _data_listener()


def route(method, path, headers=None, query=""):
    return DISPATCHER.dispatch(method, path, query, headers or {})


@pytest.mark.parametrize("path,headers,proto,name,stream", [
    ("/v1/chat/completions", {}, "openai", None, False),
    ("/v1/responses", {}, "responses", None, False),
    ("/v2/chat", {}, "cohere", None, False),
    ("/v1/messages", {b"anthropic-version": b"2023-06-01"}, "anthropic", None, False),
    ("/my-pool/v1/messages", {}, "anthropic", "my-pool", False),
    ("/v1beta/models/gemini-2.5-flash:generateContent", {}, "gemini", "gemini-2.5-flash", False),
    ("/v1/models/gemini-2.5-flash:streamGenerateContent", {}, "gemini", "gemini-2.5-flash", True),
    ("/model/amazon.nova-lite-v1%3A0/converse", {}, "bedrock", "amazon.nova-lite-v1:0", False),
    ("/model/us.anthropic.claude%2Fx/converse-stream", {}, "bedrock", "us.anthropic.claude/x", True),
])
def test_protocol_routes(path, headers, proto, name, stream):
    r = route(b"POST", path, headers)
    assert (r.kind, r.protocol, r.name, r.stream) == (D.CHAT, proto, name, stream)


def test_gemini_stream_framing_follows_alt_sse():
    assert route(b"POST", "/v1beta/models/m:streamGenerateContent", query="alt=sse").json_array is False
    assert route(b"POST", "/v1beta/models/m:streamGenerateContent").json_array is True


def test_header_beats_path():
    # An Anthropic header on the OpenAI path routes to Anthropic, which has no such path: 404.
    r = route(b"POST", "/v1/chat/completions", {b"anthropic-version": b"2023-06-01"})
    assert (r.kind, r.protocol) == (D.NOT_FOUND, "anthropic")
    r = route(b"POST", "/v1/chat/completions", {b"authorization": b"AWS4-HMAC-SHA256 Credential=x"})
    assert (r.kind, r.protocol) == (D.NOT_FOUND, "bedrock")


def test_local_answers_come_from_the_route_table():
    local = LOCAL
    at = route
    for method in (b"GET", b"POST", b"HEAD"):
        r = at(method, "/healthz", {b"x-goog-api-key": b"k"})
        assert (r.kind, r.handler) == (D.LOCAL, local.health)
    assert at(b"GET", "/stats").kind == D.LOCAL
    assert at(b"POST", "/stats").kind == D.NOT_FOUND             # /stats answers GET only
    for path in ("/v1/models", "/v1beta/models"):
        assert (at(b"GET", path).kind, at(b"GET", path).handler) == (D.LOCAL, local.models)
        r = at(b"POST", path)
        assert (r.kind, r.protocol, r.handler) == (D.METHOD, "openai", local.method_not_allowed)
    for path in ("/v1/models/gpt-4o", "/v1beta/models/models/gemini-x", "/v1/models/",
                 "/v1/models/a/b%2Fc"):
        assert (at(b"GET", path).kind, at(b"GET", path).handler) == (D.LOCAL, local.model)
    # a Gemini action is a call (or its refusal), never a model's entry
    r = at(b"GET", "/v1beta/models/gemini-x:generateContent")
    assert (r.kind, r.protocol, r.handler) == (D.METHOD, "gemini", local.method_not_allowed)
    assert at(b"POST", "/v1/chat/completions").kind == D.CHAT
    assert at(b"POST", "/v1/moderations").handler == local.unsupported
    assert at(b"POST", "/nowhere").handler == local.not_found


def test_misc_routes():
    assert route(b"GET", "/v1/chat/completions").kind == D.METHOD
    assert route(b"POST", "/v1/moderations").kind == D.UNSUPPORTED
    assert route(b"POST", "/v1beta/models/m:predict").kind == D.UNSUPPORTED
    assert route(b"POST", "/nowhere").kind == D.NOT_FOUND
    assert route(b"POST", "/prefix/v1/chat/completions").kind == D.NOT_FOUND


@pytest.mark.parametrize("enc", [
    "amazon.nova-lite-v1%3A0", "plain-name", "bad%zzescape", "trailing%", "%E2%82%AC-eur",
    "caf\u00e9%20x", "%ff%fe", "a" * 201 + "%3A0", "a" * 199 + "%3A",
])
def test_model_names_decode_as_urllib_does(enc):
    # _decoded caches urllib's unquote for short names; long ones and repeats decode the same.
    from urllib.parse import unquote
    for _ in range(2):
        assert route(b"POST", "/model/%s/converse" % enc).name == unquote(enc)
        assert route(b"POST", "/v1beta/models/%s:generateContent" % enc).name == unquote(enc)
        assert route(b"POST", "/%s/v1/messages" % enc).name == unquote(enc)


def test_the_model_name_cache_stays_bounded():
    from urllib.parse import unquote
    for i in range(600):
        enc = "m%%3A%d" % i
        assert route(b"POST", "/model/%s/converse" % enc).name == unquote(enc)
    assert D._unquote_cached.cache_info().currsize <= 256
