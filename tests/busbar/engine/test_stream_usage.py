"""Same-protocol OpenAI streams are billed exactly (issue 10): busbar asks the upstream for the usage
chunk (`stream_options.include_usage`) even when the client did not, reads it with the stream tap
into the RequestRecord, and hides it again from that client. Through the real server over real
HTTP (an in-process gateway, as in test_records.py), with the openai SDK, against the built-in mock
and a hostile upstream that splits its stream at odd byte boundaries."""
import http.client
import json
import time

import openai
import pytest

from busbar.engine.records import O_OK
from tests.hostile import HostileUpstream, chunk, chunked_head
from tests.inproc import InprocGateway

CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  m-openai: {{protocol: openai, base_url: "http://127.0.0.1:{mock}", api_key: {{env: MOCK_KEY}}}}
  hostile:  {{protocol: openai, base_url: "http://127.0.0.1:{hostile}", api_key: {{env: MOCK_KEY}}}}
models:
  oai-model: {{provider: m-openai, upstream_model: gpt-4o-mini}}
  odd-lf:    {{provider: hostile, upstream_model: odd-lf}}
  odd-crlf:  {{provider: hostile, upstream_model: odd-crlf}}
"""

TEXT = "The quick brown fox jumps over the lazy dog, twice."
USAGE = (11, 7)


def usage_sse(model, crlf=False, usage_first=False):
    """An OpenAI stream as sent once include_usage is on: `"usage": null` on every chunk, then the
    usage chunk (`"choices": []`), then [DONE]. Variants: CRLF line ends, `usage` as the first
    member, spaces after the separators (json.dumps' default)."""
    nl = b"\r\n" if crlf else b"\n"

    def ev(obj):
        return b"data: " + json.dumps(obj).encode() + nl + nl

    def base(**kw):
        d = {"usage": None} if usage_first else {}
        d.update({"id": "chatcmpl-odd", "object": "chat.completion.chunk",
                  "created": 1700000000, "model": model})
        d.update(kw)
        if not usage_first:
            d.setdefault("usage", None)
        return d

    out = ev(base(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                            "finish_reason": None}]))
    for word in TEXT.split(" "):
        out += ev(base(choices=[{"index": 0, "delta": {"content": word + " "},
                                 "finish_reason": None}]))
    out += ev(base(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
    out += b": keep-alive" + nl + nl
    out += ev(base(choices=[], usage={"prompt_tokens": USAGE[0], "completion_tokens": USAGE[1],
                                      "total_tokens": sum(USAGE)}))
    out += b"data: [DONE]" + nl + nl
    return out


def odd_split(crlf, usage_first):
    def fn(c, req):
        body = usage_sse(req.model, crlf, usage_first)
        c.sendall(chunked_head())
        sizes = (1, 2, 3, 5, 7, 11, 13, 17)
        i = k = 0
        while i < len(body):
            n = sizes[k % len(sizes)]
            c.sendall(chunk(body[i:i + n]))
            i += n
            k += 1
            if k % 4 == 0:
                time.sleep(0.001)   # separate reads on the gateway's side
        c.sendall(b"0\r\n\r\n")
    return fn


def plain_sse(c, req):
    """An OpenAI stream as sent without include_usage, in OpenAI's compact layout."""
    base = {"id": "chatcmpl-plain", "object": "chat.completion.chunk", "created": 1700000000,
            "model": req.model}

    def ev(choice):
        return b"data: " + json.dumps(dict(base, choices=[choice]), separators=(",", ":")).encode() + b"\n\n"

    body = ev({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
    for word in TEXT.split(" "):
        body += ev({"index": 0, "delta": {"content": word + " "}, "finish_reason": None})
    body += ev({"index": 0, "delta": {}, "finish_reason": "stop"}) + b"data: [DONE]\n\n"
    c.sendall(chunked_head() + chunk(body[:200]) + chunk(body[200:]) + b"0\r\n\r\n")


@pytest.fixture(scope="module")
def hostile():
    h = HostileUpstream({"odd-lf": odd_split(False, False), "odd-crlf": odd_split(True, True),
                         "plain": plain_sse})
    yield h
    h.close()


def _serve(text, hook=None):
    """An in-process gateway on `text`, with `hook` as its one finish hook; yields {"port", "gw"}
    and stops it after."""
    setup = (lambda gw: gw.finish_hooks.append(hook)) if hook is not None else None
    with InprocGateway(text, setup=setup) as g:
        yield {"port": g.port, "gw": g.gw}


@pytest.fixture(scope="module")
def site(mock_port, hostile):
    records = []
    for box in _serve(CONFIG.format(port="{port}", mock=mock_port, hostile=hostile.port),
                      records.append):
        box["records"] = records
        yield box


@pytest.fixture(scope="module")
def bare(mock_port, hostile):
    """A gateway where nothing reads usage: no finish hook (access log, metrics, request logs,
    traces) and no keys."""
    text = CONFIG.format(port="{port}", mock=mock_port, hostile=hostile.port).replace(
        "models:\n", "models:\n  plain: {provider: hostile, upstream_model: plain}\n")
    for box in _serve(text + "export: {access: {module: access-log, settings: {path: \"off\"}}}\n"):
        assert box["gw"].finish_hooks == []
        yield box


def test_no_usage_reader_relays_the_stream_untouched(bare, hostile):
    """Usage is asked for only where something reads it: with no finish hook and no key, the
    upstream gets the client's body as it came (no stream_options added) and the client the
    upstream's stream byte for byte (no filter)."""
    n0 = len(hostile.requests)
    body = json.dumps({"model": "plain", "stream": True, "messages": MESSAGES},
                      separators=(",", ":")).encode()
    c = http.client.HTTPConnection("127.0.0.1", bare["port"], timeout=10)
    c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    assert r.status == 200, data
    (req,) = hostile.requests[n0:]
    assert req.body == body
    sent = []
    plain_sse(type("C", (), {"sendall": lambda self, b: sent.append(b)})(), req)
    wire = sent[0]
    want = wire[wire.index(b"\r\n\r\n") + 4:]
    # the two chunks' payloads, de-chunked
    out, rest = b"", want
    while True:
        size, _, rest = rest.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, rest = out + rest[:n], rest[n + 2:]
    assert data == out
    # the SDK reads it as the stream it is
    sdk = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % bare["port"], api_key="sk-unused",
                        max_retries=0, timeout=10)
    chunks = list(sdk.chat.completions.create(model="plain", messages=MESSAGES, stream=True))
    assert "".join(x.choices[0].delta.content or "" for x in chunks) == TEXT + " "
    assert "stream_options" not in hostile.requests[-1].json()


def _record(site):
    deadline = time.monotonic() + 2
    while not site["records"] and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.02)
    (rec,) = site["records"]       # exactly one record per request
    site["records"].clear()
    return rec


def _raw(site, body):
    """POST /v1/chat/completions; (status, raw body bytes, record)."""
    site["records"].clear()
    c = http.client.HTTPConnection("127.0.0.1", site["port"], timeout=10)
    c.request("POST", "/v1/chat/completions", json.dumps(body, separators=(",", ":")),
              {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, _record(site)


def _sdk(site):
    return openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % site["port"], api_key="sk-unused",
                         max_retries=0, timeout=10)


def _events(data):
    """A text/event-stream body as a list of data payloads; asserts the framing is valid SSE:
    every event is `data: <one JSON object>` or `data: [DONE]` (or a comment), ended by a blank
    line, and [DONE] comes last."""
    text = data.decode("utf-8").replace("\r\n", "\n")
    assert text.endswith("\n\n")
    out = []
    for ev in text[:-2].split("\n\n"):
        lines = [l for l in ev.split("\n") if not l.startswith(":")]
        if not lines:
            continue
        assert len(lines) == 1 and lines[0].startswith("data: "), ev
        payload = lines[0][6:]
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    assert out and out[-1] == "[DONE]" and "[DONE]" not in out[:-1]
    return out[:-1]


MESSAGES = [{"role": "user", "content": "count these words for the usage test"}]


def _mock_usage(site):
    """The mock's usage for MESSAGES, as a client that asks for it sees it. The mock counts input
    tokens from the size of the body it receives: this client body (compact JSON) is exactly as
    long as the upstream body of the same request without stream_options, once busbar has added
    `"stream_options":{"include_usage":true},` to it."""
    status, data, rec = _raw(site, {"model": "oai-model", "stream": True, "messages": MESSAGES,
                                    "stream_options": {"include_usage": True}})
    u = _events(data)[-1]["usage"]
    return u["prompt_tokens"], u["completion_tokens"]


def test_stream_without_include_usage_is_billed_and_hidden(site):
    want = _mock_usage(site)
    assert want[0] > 0 and want[1] > 0
    status, data, rec = _raw(site, {"model": "oai-model", "stream": True, "messages": MESSAGES})
    assert status == 200 and rec.outcome == O_OK and rec.stream
    assert (rec.ingress, rec.egress) == ("openai", "openai")
    assert (rec.usage.input_tokens, rec.usage.output_tokens) == want
    # No usage chunk and no `usage` member anywhere in what the client got.
    assert b'"usage"' not in data
    events = _events(data)
    assert events and all(e["choices"] for e in events)


def test_sdk_stream_without_include_usage(site):
    want = _mock_usage(site)
    chunks = list(_sdk(site).chat.completions.create(model="oai-model", messages=MESSAGES,
                                                     stream=True))
    rec = _record(site)
    assert rec.outcome == O_OK and rec.stream
    # The SDK's body is spelled differently (so its input count may differ by a token or two from
    # the compact body's), the answer is the same.
    assert rec.usage.output_tokens == want[1] and rec.usage.input_tokens > 0
    # The SDK sees no usage chunk and no `usage` member on any chunk.
    assert chunks and all(c.choices for c in chunks)
    assert all(c.usage is None and "usage" not in c.model_fields_set for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("opts", [{"include_usage": False}, {}, None])
def test_stream_options_without_include_usage_is_hidden_too(site, opts):
    want = _mock_usage(site)
    status, data, rec = _raw(site, {"model": "oai-model", "stream": True, "messages": MESSAGES,
                                    "stream_options": opts})
    assert status == 200 and b'"usage"' not in data and _events(data)
    assert (rec.usage.input_tokens, rec.usage.output_tokens) == want


def test_stream_with_include_usage_is_unchanged(site):
    chunks = list(_sdk(site).chat.completions.create(
        model="oai-model", messages=MESSAGES, stream=True, stream_options={"include_usage": True}))
    rec = _record(site)
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (rec.usage.input_tokens, rec.usage.output_tokens) == (last.usage.prompt_tokens,
                                                                 last.usage.completion_tokens)
    # Every other chunk carries "usage": null, as OpenAI sends it.
    assert all(c.choices and "usage" in c.model_fields_set and c.usage is None
               for c in chunks[:-1])


@pytest.mark.parametrize("model", ["odd-lf", "odd-crlf"])
def test_hostile_odd_splits_still_valid_sse(site, hostile, model):
    n0 = len(hostile.requests)
    status, data, rec = _raw(site, {"model": model, "stream": True, "messages": MESSAGES,
                                    "stream_options": {"include_obfuscation": False}})
    assert status == 200, data
    # The upstream was asked for usage, the client's own stream_options kept.
    (req,) = hostile.requests[n0:]
    assert req.json()["stream_options"] == {"include_obfuscation": False, "include_usage": True}
    assert b'"usage"' not in data
    events = _events(data)
    assert all(e["choices"] for e in events)
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == TEXT + " "
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    # Everything else of each chunk is relayed as the upstream sent it.
    assert all(e["id"] == "chatcmpl-odd" and e["object"] == "chat.completion.chunk"
               for e in events)
    assert rec.outcome == O_OK and (rec.usage.input_tokens, rec.usage.output_tokens) == USAGE


@pytest.mark.parametrize("model", ["odd-lf", "odd-crlf"])
def test_hostile_odd_splits_with_include_usage_pass_through(site, hostile, model):
    status, data, rec = _raw(site, {"model": model, "stream": True, "messages": MESSAGES,
                                    "stream_options": {"include_usage": True}})
    assert status == 200
    want = usage_sse(model, model == "odd-crlf", model == "odd-crlf")
    assert data == want       # byte for byte: no filter when the client asked
    assert (rec.usage.input_tokens, rec.usage.output_tokens) == USAGE


def test_sdk_through_hostile_split(site):
    chunks = list(_sdk(site).chat.completions.create(model="odd-crlf", messages=MESSAGES,
                                                     stream=True))
    rec = _record(site)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == TEXT + " "
    assert all(c.choices and "usage" not in c.model_fields_set for c in chunks)
    assert (rec.usage.input_tokens, rec.usage.output_tokens) == USAGE
