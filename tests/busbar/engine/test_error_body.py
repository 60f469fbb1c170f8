"""An upstream error body that stalls, through the real server over real HTTP (issue 34, point 2),
against a hostile upstream written here (tests/hostile.py): its status already says "fail over",
so the body is read only within what is left of the attempt and at most
limits.upstream_error_body_timeout_secs (250 ms by default), then the next lane is tried at once;
with no lane left the caller gets busbar's own error for that status, in its shape. On 1cbd392
the gateway waited 5 s for the body, and then relayed the half of it that had come."""
from __future__ import annotations

import http.client
import json
import threading
import time

import pytest

from tests.conftest import start_gateway, stop
from tests.hostile import HostileUpstream

KEY = "sk-hostile-0123456789abcdef0123"

CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  h:    {protocol: openai, base_url: "http://127.0.0.1:%(h)d", api_key: {env: HOSTILE_KEY}}
  good: {protocol: openai, base_url: "http://127.0.0.1:%(m)d", api_key: {env: MOCK_KEY}}
models:
  ok:    {provider: good, upstream_model: gpt-4o-mini}
  stall: {provider: h, upstream_model: stall}
  late:  {provider: h, upstream_model: late, attempt_timeout_ms: 800}
pools:
  p-stall:
    members:
      - {model: stall, weight: 100}
      - {model: ok, weight: 1}
  p-late:
    members:
      - {model: late, weight: 100}
      - {model: ok, weight: 1}
%(limits)s
"""


def _stall(c, req, after=0.0):
    """500 headers (after `after` seconds), a piece of the body, then nothing until the gateway
    gives up on the connection (or 6 s)."""
    time.sleep(after)
    c.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n{\"error\":")
    c.settimeout(6)
    try:
        while c.recv(4096):
            pass
    except OSError:
        pass
    return False


@pytest.fixture(scope="module")
def hostile():
    h = HostileUpstream({"stall": _stall, "late": lambda c, req: _stall(c, req, after=0.3)})
    yield h
    h.close()


@pytest.fixture(scope="module")
def gw(hostile, mock_port, tmp_path_factory):
    # The default limits: the error body's bound is the default's.
    g = start_gateway(tmp_path_factory.mktemp("errbody"),
                      CONFIG % {"h": hostile.port, "m": mock_port, "limits": ""},
                      extra_env={"HOSTILE_KEY": KEY})
    yield g
    stop(g.proc)


def chat(gw, model, timeout=5.0, anthropic=False):
    c = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=timeout)
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
    h = {"content-type": "application/json"}
    path = "/v1/chat/completions"
    if anthropic:
        path, body["max_tokens"], h["anthropic-version"] = "/v1/messages", 16, "2023-06-01"
    t0 = time.monotonic()
    try:
        c.request("POST", path, json.dumps(body), h)
        r = c.getresponse()
        return r.status, r.read(), time.monotonic() - t0
    finally:
        c.close()


def test_a_stalled_500_body_does_not_hold_the_failover(gw, hostile):
    # 16 callers at once with a 5 s client timeout: every one reaches the stalled lane (weight 100,
    # before its first failure cools it) and must be answered by the other lane in time.
    results = [None] * 16

    def one(i):
        try:
            results[i] = chat(gw, "p-stall", timeout=5.0)
        except OSError as e:
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    failed = [r for r in results if not isinstance(r, tuple) or r[0] != 200]
    assert not failed, failed
    assert hostile.count("stall") >= 1
    assert max(r[2] for r in results) < 2.0


@pytest.mark.parametrize("anthropic", [False, True])
def test_a_stalled_500_body_with_no_lane_left_is_busbars_own_error(gw, anthropic):
    status, data, took = chat(gw, "stall", anthropic=anthropic)
    assert status == 500 and took < 1.5
    body = json.loads(data)       # not the half body the upstream sent
    if anthropic:
        assert body["type"] == "error" and body["error"]["type"] == "api_error"
    else:
        assert body["error"]["type"] == "server_error"
    assert "500" in (body["error"]["message"])


def test_the_error_body_is_read_within_what_is_left_of_the_attempt(hostile, mock_port, tmp_path):
    # A long error-body bound, and a lane whose 500 comes 300 ms into its 800 ms attempt: the body
    # may be waited for only the 500 ms left, not 5 s.
    g = start_gateway(tmp_path, CONFIG % {"h": hostile.port, "m": mock_port,
                                          "limits": "limits:\n  upstream_error_body_timeout_secs: 5"},
                      extra_env={"HOSTILE_KEY": KEY})
    try:
        status, data, took = chat(g, "p-late", timeout=10)
        assert status == 200 and json.loads(data)["model"] == "gpt-4o-mini"
        assert took < 1.6, took
    finally:
        stop(g.proc)
