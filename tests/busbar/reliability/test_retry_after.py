"""A provider's Retry-After through the real server over real HTTP (issue 34, point 1), against a
hostile upstream written here (tests/hostile.py): a lane whose provider answers 429 (or 503) with
`Retry-After` is held for that long (at least 1 s, at most limits.max_honored_retry_after_secs)
whether or not another lane exists, in every pool, direct route and worker; calls within the hold
are answered by busbar in the caller's own shape with the time left, without a call to the
provider; the provider's own error keeps its Retry-After; after the hold the provider is called
again. Each test fails on 1cbd392, where the header was dropped and every call went upstream."""
from __future__ import annotations

import http.client
import json
import math
import threading
import time

import pytest

from tests.conftest import start_gateway, stop
from tests.hostile import HostileUpstream, http_response, openai_body

KEY = "sk-hostile-0123456789abcdef0123"
# Every hold here is short (the cap), so each test waits for one to end in bounded time.
CAP = 3

CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  h:    {protocol: openai, base_url: "http://127.0.0.1:%(h)d", api_key: {env: HOSTILE_KEY}}
  good: {protocol: openai, base_url: "http://127.0.0.1:%(m)d", api_key: {env: MOCK_KEY}}
  byok: {protocol: openai, base_url: "http://127.0.0.1:%(h)d", upstream_credentials: passthrough}
models:
  ok:       {provider: good, upstream_model: gpt-4o-mini}
  rl2:      {provider: h, upstream_model: rl2}
  rl60:     {provider: h, upstream_model: rl60}
  shared:   {provider: h, upstream_model: shared}
  busy:     {provider: h, upstream_model: busy}
  mine:     {provider: byok, upstream_model: mine}
pools:
  solo:
    members:
      - {model: rl60}
  pp:
    members:
      - {model: shared, weight: 100}
      - {model: ok, weight: 1}
limits:
  max_honored_retry_after_secs: %(cap)d
"""

# upstream model -> what its provider says while it limits: (status, Retry-After value, error body)
LIMITED = {
    "rl2": (429, "2", {"error": {"message": "Rate limit reached for requests", "type": "requests",
                                 "code": "rate_limit_exceeded"}}),
    "rl60": (429, "60", {"error": {"message": "Rate limit reached for tokens", "type": "tokens",
                                   "code": "rate_limit_exceeded"}}),
    "shared": (429, "2", {"error": {"message": "Rate limit reached", "type": "requests",
                                    "code": "rate_limit_exceeded"}}),
    "busy": (503, "2", {"error": {"message": "The engine is currently overloaded",
                                  "type": "server_error"}}),
    "mine": (429, "2", {"error": {"message": "Rate limit reached for requests", "type": "requests",
                                  "code": "rate_limit_exceeded"}}),
}


class Provider:
    """The first call of each upstream model is refused with its LIMITED answer, every later one
    is answered: a provider that said "wait" and means it once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seen = {}

    def __call__(self, c, req):
        with self.lock:
            n = self.seen[req.model] = self.seen.get(req.model, 0) + 1
        if n == 1:
            status, ra, body = LIMITED[req.model]
            c.sendall(http_response(status, json.dumps(body).encode(),
                                    extra="Retry-After: %s\r\n" % ra))
        else:
            c.sendall(http_response(200, openai_body("fine", model=req.model)))


@pytest.fixture
def hostile():
    h = HostileUpstream({}, default=Provider())
    yield h
    h.close()


def _gateway(tmp_path, hostile, mock_port, workers=1):
    return start_gateway(tmp_path, CONFIG % {"h": hostile.port, "m": mock_port, "cap": CAP},
                         workers=workers, extra_env={"HOSTILE_KEY": KEY})


@pytest.fixture
def gw(tmp_path, hostile, mock_port):
    g = _gateway(tmp_path, hostile, mock_port)
    yield g
    stop(g.proc)


def call(gw, model, anthropic=False, key=None):
    """One call on a fresh connection: (status, headers (lower-case names), parsed body)."""
    c = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=10)
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
    h = {"content-type": "application/json"}
    if key is not None:
        h["authorization"] = "Bearer " + key
    path = "/v1/chat/completions"
    if anthropic:
        path = "/v1/messages"
        body["max_tokens"] = 16
        h["anthropic-version"] = "2023-06-01"
    try:
        c.request("POST", path, json.dumps(body), h)
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, json.loads(data)
    finally:
        c.close()


def _local_retry_after(headers, hold, since):
    """The Retry-After of an answer given locally: the hold's time left, rounded up, >= 1."""
    ra = int(headers["retry-after"])
    left = hold - (time.monotonic() - since)
    assert 1 <= ra <= max(1, math.ceil(left) + 1), (ra, left)
    return ra


def _wait_out(since, hold):
    time.sleep(max(0.0, hold + 0.3 - (time.monotonic() - since)))


def test_a_models_429_with_retry_after_holds_the_lane_and_is_answered_locally(gw, hostile):
    t0 = time.monotonic()
    status, h, body = call(gw, "rl2")
    # The provider's own error, relayed (same protocol), keeps its Retry-After.
    assert status == 429 and h["retry-after"] == "2"
    assert body["error"]["code"] == "rate_limit_exceeded"
    for _ in range(3):
        status, h, body = call(gw, "rl2")
        assert status == 429, body
        _local_retry_after(h, 2, t0)
        # busbar's own rate-limit error in the caller's (OpenAI's) shape.
        assert body["error"]["type"] == "rate_limit_error"
        assert "rl2" in body["error"]["message"]
    assert hostile.count("rl2") == 1      # 4 calls, 1 upstream hit
    _wait_out(t0, 2)
    status, _, body = call(gw, "rl2")
    assert status == 200 and body["choices"][0]["message"]["content"] == "fine"
    assert hostile.count("rl2") == 2


def test_a_one_member_pool_honours_retry_after_capped_in_the_callers_shape(gw, hostile):
    t0 = time.monotonic()
    status, h, body = call(gw, "solo", anthropic=True)
    # Re-enveloped for an Anthropic caller, with the provider's Retry-After as it sent it.
    assert status == 429 and h["retry-after"] == "60"
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    for _ in range(3):
        status, h, body = call(gw, "solo", anthropic=True)
        assert status == 429, body
        # 60 s asked, held for limits.max_honored_retry_after_secs.
        _local_retry_after(h, CAP, t0)
        assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    assert hostile.count("rl60") == 1
    _wait_out(t0, CAP)
    status, _, body = call(gw, "solo", anthropic=True)
    assert status == 200 and body["type"] == "message"
    assert hostile.count("rl60") == 2


def test_the_hold_is_the_lanes_in_every_pool_and_direct_route(gw, hostile):
    t0 = time.monotonic()
    # Through the pool: the lane's 429 fails over to the other member.
    status, _, body = call(gw, "pp")
    assert status == 200 and body["model"] == "gpt-4o-mini"
    assert hostile.count("shared") == 1
    # The same lane by its model name is held too: the provider limits the lane, not the pool.
    status, h, body = call(gw, "shared")
    assert status == 429 and body["error"]["type"] == "rate_limit_error"
    _local_retry_after(h, 2, t0)
    assert hostile.count("shared") == 1


def test_a_503_with_retry_after_is_answered_locally_as_503(gw, hostile):
    t0 = time.monotonic()
    status, h, body = call(gw, "busy")
    assert status == 503 and h["retry-after"] == "2"
    status, h, body = call(gw, "busy")
    assert status == 503 and body["error"]["type"] == "server_error"
    _local_retry_after(h, 2, t0)
    assert hostile.count("busy") == 1


def test_a_callers_own_key_limited_does_not_hold_the_lane_for_others(gw, hostile):
    # upstream_credentials: passthrough: the 429 is the caller's key's limit (relayed, with its
    # Retry-After); another caller's key is still sent to the provider.
    status, h, _ = call(gw, "mine", key="sk-caller-one-0123456789")
    assert status == 429 and h["retry-after"] == "2"
    status, _, body = call(gw, "mine", key="sk-caller-two-0123456789")
    assert status == 200 and body["choices"][0]["message"]["content"] == "fine"
    assert hostile.count("mine") == 2


def test_the_hold_is_every_workers(tmp_path, hostile, mock_port):
    g = _gateway(tmp_path, hostile, mock_port, workers=2)
    try:
        t0 = time.monotonic()
        status, h, _ = call(g, "rl2", anthropic=True)
        assert status == 429
        # Each worker's request ids have their own prefix (cbusbar/ids.pyx): go on until both
        # workers have answered, all within the hold.
        workers = {h["request-id"][:20]}
        n = 0
        while len(workers) < 2 and n < 30:
            status, h, body = call(g, "rl2", anthropic=True)
            assert status == 429 and body["error"]["type"] == "rate_limit_error"
            workers.add(h["request-id"][:20])
            n += 1
        assert len(workers) == 2 and time.monotonic() - t0 < 2
        assert hostile.count("rl2") == 1
    finally:
        stop(g.proc)


def test_no_health_probe_goes_to_a_held_lane(tmp_path, hostile, mock_port):
    # Active probing every second: a probe is a call too, and the provider asked for none.
    text = (CONFIG % {"h": hostile.port, "m": mock_port, "cap": CAP}).replace(
        "api_key: {env: HOSTILE_KEY}}",
        "api_key: {env: HOSTILE_KEY}, health: {mode: active, interval_secs: 1}}", 1)
    g = start_gateway(tmp_path, text, extra_env={"HOSTILE_KEY": KEY})
    try:
        t0 = time.monotonic()
        status, _, _ = call(g, "solo")      # 429, Retry-After: 60 -> held for CAP (3 s)
        assert status == 429
        # The prober's first tick only starts its clock (0.5 s after the start); lanes are due
        # one interval later, again and again, all within the hold.
        time.sleep(max(0.0, CAP - 0.4 - (time.monotonic() - t0)))
        assert hostile.count("rl60") == 1
    finally:
        stop(g.proc)
