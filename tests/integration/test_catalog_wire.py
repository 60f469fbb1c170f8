"""What a catalog entry's `path` and `error_map` do on the wire, through the real server: the shipped
catalog's `zai-api` entry (Z.ai's pay-as-you-go API: `path: /chat/completions`, error codes 1113 =
billing and 1302 = rate_limit, the Rust busbar's values) pointed at a hostile upstream on loopback.

- `path`: the upstream sees `<base_url path>/chat/completions`, not `/v1/chat/completions`, for a
  plain and a streamed request alike; a provider without the entry keeps the protocol's path.
- `error_map`: a 400 whose body carries code 1113 is a billing failure on `zai-api`: the lane is
  benched and the pool fails over (the caller gets the other member's 200), and the lane is not
  tried again. The same answer from a provider without the map is the caller's mistake, relayed
  as the 400 it is, with no failover.
"""
from __future__ import annotations

import http.client
import json

import pytest

from tests.conftest import start_gateway, stop
from tests.hostile import HostileUpstream, http_response, openai_body, openai_sse

BILLING_400 = json.dumps({"error": {"code": "1113", "message": "Insufficient balance or no "
                                    "resource package. Please recharge."}}).encode()


def _ok(c, req):
    if req.json().get("stream"):
        body = openai_sse("streamed", model=req.model)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
    else:
        c.sendall(http_response(200, openai_body("from " + req.model, model=req.model)))


def _broke(c, req):
    c.sendall(http_response(400, BILLING_400))


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    up = HostileUpstream({"glm-ok": _ok, "glm-broke": _broke, "spare-ok": _ok})
    g = start_gateway(tmp_path_factory.mktemp("catalog-wire"), f"""
listen: "127.0.0.1:{{port}}"
providers:
  # the shipped catalog's entry; only the host is moved to the test's upstream
  zai-api: {{base_url: "{up.url}/api/paas/v4", api_key: {{env: MOCK_KEY}}}}
  # the same upstream without the catalog entry: no path, no error_map
  plain: {{protocol: openai, base_url: "{up.url}/api/paas/v4", api_key: {{env: MOCK_KEY}}}}
  spare: {{protocol: openai, base_url: "{up.url}", api_key: {{env: MOCK_KEY}}}}
models:
  glm: {{provider: zai-api, upstream_model: glm-ok}}
  glm-plain: {{provider: plain, upstream_model: glm-ok}}
  glm-broke: {{provider: zai-api}}
  glm-broke-plain: {{provider: plain, upstream_model: glm-broke}}
  spare-ok: {{provider: spare}}
pools:
  mapped:
    members: [{{model: glm-broke, weight: 100}}, {{model: spare-ok, weight: 1}}]
  unmapped:
    members: [{{model: glm-broke-plain, weight: 100}}, {{model: spare-ok, weight: 1}}]
""")
    try:
        yield g, up
    finally:
        stop(g.proc)
        up.close()


def ask(port, model, stream=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=15)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    if stream:
        body["stream"] = True
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def paths(up, model):
    return [r.path for r in up.requests if r.model == model]


def test_the_catalogs_path_is_the_upstream_request_path(gw):
    g, up = gw
    before = len(paths(up, "glm-ok"))
    status, body = ask(g.port, "glm")
    assert status == 200 and json.loads(body)["choices"][0]["message"]["content"] == "from glm-ok"
    status, body = ask(g.port, "glm", stream=True)
    assert status == 200 and b"streamed" in body
    assert paths(up, "glm-ok")[before:] == ["/api/paas/v4/chat/completions"] * 2
    # without the entry, the protocol's own path after the same base_url
    status, _ = ask(g.port, "glm-plain")
    assert status == 200 and paths(up, "glm-ok")[-1] == "/api/paas/v4/v1/chat/completions"


def test_the_catalogs_error_map_makes_a_400_a_billing_failure(gw):
    g, up = gw
    status, body = ask(g.port, "mapped")
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"] == "from spare-ok"
    assert paths(up, "glm-broke") == ["/api/paas/v4/chat/completions"]
    # benched like a refused key: the next requests go straight to the other member
    for _ in range(3):
        assert ask(g.port, "mapped")[0] == 200
    assert len(paths(up, "glm-broke")) == 1


def test_without_the_map_the_same_answer_is_the_callers_400(gw):
    g, up = gw
    spare_before = len(paths(up, "spare-ok"))
    status, body = ask(g.port, "unmapped")
    assert status == 400
    assert json.loads(body)["error"]["message"].startswith("Insufficient balance")
    assert paths(up, "glm-broke")[-1] == "/api/paas/v4/v1/chat/completions"
    assert len(paths(up, "spare-ok")) == spare_before        # no failover for a client fault
