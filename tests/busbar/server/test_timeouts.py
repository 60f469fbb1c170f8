"""Timeouts run on the gateway's Deadlines wheel (one sweep per process, no timer per request):
the wheel itself, then each timeout it drives, end to end against the mock."""
import asyncio
import http.client
import json
import socket
import time

import pytest
import uvloop

from busbar.engine.deadlines import Deadlines


class Owner:
    def __init__(self, log, name):
        self._slot = None
        self.log = log
        self.name = name

    def on_deadline(self):
        self.log.append((self.name, time.monotonic()))


def _run(loop, secs):
    loop.run_until_complete(asyncio.sleep(secs))


def test_deadline_fires_once_between_its_time_and_one_resolution_later():
    loop = uvloop.new_event_loop()
    try:
        d = Deadlines(loop, 0.01)
        log = []
        a = Owner(log, "a")
        t0 = time.monotonic()
        d.arm(a, 0.05)
        _run(loop, 0.2)
        assert [n for n, _ in log] == ["a"]
        assert 0.045 <= log[0][1] - t0 <= 0.1
        assert a._slot is None and not d.slots and d.handle is None  # the sweep stops when empty
    finally:
        loop.close()


def test_disarm_and_rearm_move_the_owner_and_leave_nothing_behind():
    loop = uvloop.new_event_loop()
    try:
        d = Deadlines(loop, 0.01)
        log = []
        a, b, c = Owner(log, "a"), Owner(log, "b"), Owner(log, "c")
        d.arm(a, 0.03)
        d.arm(b, 0.03)
        d.arm(c, 0.03)
        d.disarm(b)
        assert b._slot is None
        d.disarm(b)                 # disarming twice is harmless
        d.arm(c, 0.12)              # re-arming moves c to a later slot
        assert sum(len(s) for s in d.slots.values()) == 2
        _run(loop, 0.08)
        assert [n for n, _ in log] == ["a"]
        _run(loop, 0.12)
        assert [n for n, _ in log] == ["a", "c"]
        assert not d.slots
    finally:
        loop.close()


def test_a_failing_owner_does_not_stop_the_others():
    loop = uvloop.new_event_loop()
    try:
        d = Deadlines(loop, 0.01)
        log = []

        class Bad(Owner):
            def on_deadline(self):
                raise RuntimeError("bug")

        d.arm(Bad(log, "bad"), 0.02)
        d.arm(Owner(log, "good"), 0.02)
        _run(loop, 0.1)
        assert [n for n, _ in log] == ["good"]
    finally:
        loop.close()


def test_the_wheel_restarts_cleanly_after_idling():
    loop = uvloop.new_event_loop()
    try:
        d = Deadlines(loop, 0.01)
        log = []
        d.arm(Owner(log, "a"), 0.01)
        _run(loop, 0.1)
        _run(loop, 0.2)             # idle: no sweep pending
        t0 = time.monotonic()
        d.arm(Owner(log, "b"), 0.03)
        _run(loop, 0.15)
        assert [n for n, _ in log] == ["a", "b"] and 0.025 <= log[1][1] - t0 <= 0.08
    finally:
        loop.close()


CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  m: {protocol: openai, base_url: "http://127.0.0.1:%(mock)d", api_key: {env: K}}
models:
  quick-a: {provider: m, upstream_model: gpt-a, attempt_timeout_ms: 200}
  quick-b: {provider: m, upstream_model: gpt-b, attempt_timeout_ms: 300}
  plain:   {provider: m, upstream_model: gpt-c}
pools:
  both:
    members:
      - {model: quick-a, weight: 1}
      - {model: quick-b, weight: 1}
limits:
  idle_timeout_secs: 0.4
  upstream_request_timeout_secs: 0.6
"""


@pytest.fixture
def gw_port(mock_port, inproc_gateway):
    return inproc_gateway(CONFIG % {"mock": mock_port}, env={"K": "sk-test"}).port


def _post(port, model, text):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    t0 = time.monotonic()
    c.request("POST", "/v1/chat/completions", json.dumps(
        {"model": model, "messages": [{"role": "user", "content": text}]}),
        {"content-type": "application/json"})
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, body, time.monotonic() - t0


TIMED_OUT = "The upstream provider did not answer in time."


def test_attempt_timeouts_fail_over_then_answer_504_long_before_the_upstream(gw_port):
    status, body, took = _post(gw_port, "both", "slow #mock:delay_ms=3000")
    # 200 ms on one lane, 300 ms on the other: both tried, well before the 3 s upstream. A timeout
    # is said as one (504), never as "overloaded".
    err = json.loads(body)["error"]
    assert status == 504 and err["message"] == TIMED_OUT and err["type"] == "server_error"
    assert 0.45 <= took < 1.5


def test_upstream_request_timeout_bounds_a_slow_lane(gw_port):
    status, body, took = _post(gw_port, "plain", "slow #mock:delay_ms=3000")
    assert status == 504 and json.loads(body)["error"]["message"] == TIMED_OUT
    assert 0.55 <= took < 1.5


def test_a_fast_answer_is_not_disturbed_by_its_timeout(gw_port):
    status, body, _ = _post(gw_port, "quick-a", "quick #mock:delay_ms=50")
    assert status == 200 and b"quick" in body


def test_idle_keep_alive_connection_is_closed_after_idle_timeout(gw_port):
    s = socket.create_connection(("127.0.0.1", gw_port), timeout=5)
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    t0 = time.monotonic()
    assert s.recv(4096) == b""      # the gateway closed the idle connection
    assert 0.35 <= time.monotonic() - t0 < 2.0
    s.close()
