"""`on_exhausted: {queue: {max_ms}}` (busbar/reliability/queue.py) through the real server against a
hostile upstream written here that holds each answer a while and records the order and the
concurrency it saw: waiters are served first come first served, one per released permit, never
above max_concurrent; a wait past max_ms is answered as reject (503 in the caller's shape with
Retry-After); a client that leaves is removed at once; a pool whose lanes are cooling down, not
saturated, sheds at once; and with two workers a permit released in one reaches a waiter in the
other."""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time

import pytest

from tests.conftest import start_gateway, stop
from tests.hostile import HostileUpstream, http_response, openai_body


class Holder:
    """An upstream behaviour that answers after `secs`, counting what is in flight."""

    def __init__(self, secs):
        self.secs = secs
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.order = []

    def __call__(self, c, req):
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
            self.order.append(req.json()["messages"][0]["content"])
        time.sleep(self.secs)
        with self.lock:
            self.now -= 1
        c.sendall(http_response(200, openai_body("held")))


def _down(c, req):
    c.sendall(http_response(500, b'{"error":{"message":"down","type":"server_error"}}'))


HOLD = Holder(0.3)
LONG = Holder(1.0)
SHORT = Holder(0.15)

CONFIG = """\
listen: "127.0.0.1:{port}"
export:
  metrics: {module: prometheus, settings: {buffer_seconds: 60}}
  access: {module: access-log, settings: {path: "off"}}
providers:
  h: {protocol: openai, base_url: "http://127.0.0.1:%(h)d", api_key: {env: MOCK_KEY}}
models:
  hold:  {provider: h, upstream_model: hold, max_concurrent: 1}
  long:  {provider: h, upstream_model: long, max_concurrent: 1}
  down:  {provider: h, upstream_model: down, max_concurrent: 1}
pools:
  q:
    members: [{model: hold}]
    on_exhausted: {queue: {max_ms: 3000}}
  brief:
    members: [{model: long}]
    on_exhausted: {queue: {max_ms: 300}}
  cooling:
    members: [{model: down}]
    breaker: {trip: {mode: consecutive, consecutive_n: 1}, base_cooldown_secs: 60, max_cooldown_secs: 120}
    on_exhausted: {queue: {max_ms: 3000}}
"""


@pytest.fixture(scope="module")
def hostile():
    h = HostileUpstream({"hold": HOLD, "long": LONG, "down": _down, "short": SHORT})
    yield h
    h.close()


@pytest.fixture(scope="module")
def gw(hostile, tmp_path_factory):
    g = start_gateway(tmp_path_factory.mktemp("queue"), CONFIG % {"h": hostile.port})
    yield g
    stop(g.proc)


def ask(port, model, text="hi", path="/v1/chat/completions", timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if path == "/v1/messages":
        body = {"model": model, "max_tokens": 5, "messages": [{"role": "user", "content": text}]}
    else:
        body = {"model": model, "messages": [{"role": "user", "content": text}]}
    t0 = time.monotonic()
    c.request("POST", path, json.dumps(body), {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data, r, time.monotonic() - t0


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    data = c.getresponse().read()
    c.close()
    return data


def queued(port, model):
    # Lane-global: every cell of the lane (the pool's, the direct route's) shows the same count.
    return max(x["queued"] for x in json.loads(get(port, "/stats"))["lanes"] if x["model"] == model)


def wait_for(cond, secs):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_waiters_are_served_in_arrival_order_one_per_permit(gw):
    results = {}

    def client(i):
        results[i] = ask(gw.port, "q", "hi-%d" % i)

    threads = []
    for i in range(5):
        t = threading.Thread(target=client, args=(i,))
        t.start()
        threads.append(t)
        if i == 0:
            assert wait_for(lambda: HOLD.now == 1, 2)
        else:
            assert wait_for(lambda: queued(gw.port, "hold") == i, 2)
    # While they wait: the pool's gauge, and the lane refuses a fresh caller on its direct route
    # (it counts as at capacity: the queue is first).
    assert 'busbar_pool_queued{pool="q"} 4' in get(gw.port, "/metrics").decode()
    st, data, r, _ = ask(gw.port, "hold")
    assert st == 503 and b"at capacity" in data
    for t in threads:
        t.join(10)
    assert [results[i][0] for i in range(5)] == [200] * 5
    assert HOLD.order[-5:] == ["hi-%d" % i for i in range(5)]      # first come, first served
    assert HOLD.peak == 1                                           # never above max_concurrent
    assert queued(gw.port, "hold") == 0
    assert 'busbar_pool_queued{pool="q"} 0' in get(gw.port, "/metrics").decode()


def test_a_wait_past_max_ms_is_answered_as_reject_in_the_callers_shape(gw):
    t = threading.Thread(target=ask, args=(gw.port, "brief", "first"))
    t.start()
    assert wait_for(lambda: LONG.now == 1, 2)
    st, data, r, took = ask(gw.port, "brief", "second", path="/v1/messages")
    assert st == 503
    body = json.loads(data)
    assert body["type"] == "error" and body["error"]["type"] == "overloaded_error"
    assert "at capacity" in body["error"]["message"]
    assert int(r.getheader("retry-after")) >= 2
    assert 0.25 <= took < 0.9           # it waited its 300 ms (the wheel's resolution on top)
    t.join(5)
    assert LONG.order[-1] == "first"    # the one that gave up never reached the upstream


def test_a_client_that_leaves_while_queued_is_removed(gw):
    first = threading.Thread(target=ask, args=(gw.port, "q", "occupy"))
    HOLD.secs = 1.0
    try:
        first.start()
        assert wait_for(lambda: HOLD.now == 1, 2)
        s = socket.create_connection(("127.0.0.1", gw.port), timeout=5)
        body = json.dumps({"model": "q", "messages": [{"role": "user", "content": "leaver"}]}).encode()
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        assert wait_for(lambda: queued(gw.port, "hold") == 1, 2)
        s.close()
        assert wait_for(lambda: queued(gw.port, "hold") == 0, 2)
        res = {}
        stayer = threading.Thread(target=lambda: res.update(r=ask(gw.port, "q", "stayer")))
        stayer.start()
        first.join(5)
        stayer.join(5)
        assert res["r"][0] == 200
        assert HOLD.order[-2:] == ["occupy", "stayer"]      # the leaver was never sent
    finally:
        HOLD.secs = 0.3


def test_lanes_cooling_down_are_not_saturation_so_the_request_is_shed_at_once(gw):
    assert ask(gw.port, "cooling")[0] == 500     # the only lane fails once and trips
    st, data, r, took = ask(gw.port, "cooling")
    assert st == 503 and b"cooling down" in data and took < 0.25
    assert int(r.getheader("retry-after")) > 2


def test_with_two_workers_a_permit_released_in_one_reaches_a_waiter_in_the_other(tmp_path, hostile):
    text = """\
listen: "127.0.0.1:{port}"
providers:
  h: {protocol: openai, base_url: "http://127.0.0.1:%d", api_key: {env: MOCK_KEY}}
models:
  short: {provider: h, upstream_model: short, max_concurrent: 2}
pools:
  q: {members: [{model: short}], on_exhausted: {queue: {max_ms: 8000}}}
""" % hostile.port
    g = start_gateway(tmp_path, text, workers=2)
    try:
        statuses = []
        waits = []
        lock = threading.Lock()

        def client(i):
            for k in range(3):
                # A fresh connection each time: both workers get waiters.
                st, _, _, took = ask(g.port, "q", "c%d-%d" % (i, k))
                with lock:
                    statuses.append(st)
                    waits.append(took)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        elapsed = time.monotonic() - t0
        assert statuses == [200] * 24
        assert SHORT.peak <= 2
        # 24 answers of 0.15 s through 2 permits: ~1.8 s if no permit sat idle long.
        assert elapsed < 1.8 * 1.6, elapsed
        assert queued(g.port, "short") == 0
    finally:
        stop(g.proc)
