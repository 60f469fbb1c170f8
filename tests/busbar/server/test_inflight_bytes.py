"""`limits.inflight_body_bytes` (busbar/server/http.py BodyBudget): the request-body bytes a worker
holds are bounded by back-pressure, not errors. Through the real server over real sockets, in
process so that the worker's own count (`gw.bodies`) can be read: many concurrent large bodies all
get their own answers and the count never passes the budget plus one read plus one body; bodies
larger than the budget are served, alone or several at once (the progress rule); a connection the
budget paused is not closed by the idle or header-read timeout; bad values are refused by name."""
import http.client
import json
import socket
import threading
import time

import pytest

from busbar import config as cfgmod
from busbar.config import ConfigError

KB = 1000
READ = 256000           # uvloop's socket read size: the most one read adds past the budget


@pytest.fixture
def gateway(mock_port, inproc_gateway):
    """make(**limits) -> (port, Gateway): an in-process gateway with those limits, drained after."""
    def make(**limits):
        g = inproc_gateway((
            'listen: "127.0.0.1:{port}"\n'
            'providers: {m: {protocol: openai, base_url: "http://127.0.0.1:%d", api_key: {env: K}}}\n'
            'models: {oai-model: {provider: m}}\n'
            'limits: %s\n') % (mock_port, json.dumps(limits)), env={"K": "sk-test"}, drain=True)
        return g.port, g.gw
    return make


def _body(tag, size, extra=""):
    """An OpenAI Chat body of about `size` bytes whose answer starts with `tag` (the mock echoes the
    start of the user message)."""
    pad = "x" * max(0, size - 200)
    return json.dumps({"model": "oai-model", "messages": [
        {"role": "user", "content": "%s %s %s" % (tag, extra, pad)}]}).encode()


def _ask(port, bodies, timeout=20, ready=None):
    """Sends `bodies` one after the other on one keep-alive connection: the answers' (status, text).
    `ready`: a barrier passed once connected."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    if ready is not None:
        c.connect()
        ready.wait(10)
    out = []
    for b in bodies:
        c.request("POST", "/v1/chat/completions", b, {"content-type": "application/json"})
        r = c.getresponse()
        data = r.read()
        text = json.loads(data)["choices"][0]["message"]["content"] if r.status == 200 else data
        out.append((r.status, text))
    c.close()
    return out


def _watch(gw, stop, seen):
    """The highest count seen from outside (the worker keeps its own high-water mark too)."""
    while not stop.is_set():
        seen.append(gw.bodies.held)
        time.sleep(0.001)


def test_many_concurrent_large_bodies_all_answered_within_budget(gateway):
    budget, size, clients, each = 1 << 20, 300 * KB, 40, 3
    port, gw = gateway(inflight_body_bytes=budget)
    results = {}
    # Every connection is open before any body is sent: one accepted while the budget is closed
    # may read once before it is paused (see BodyBudget), which this bound does not count.
    ready = threading.Barrier(clients + 1)

    def client(i):
        tags = ["c%dr%d" % (i, j) for j in range(each)]
        try:
            results[i] = (tags, _ask(port, [_body(t, size) for t in tags], ready=ready))
        except Exception as e:          # noqa: BLE001 (reported by the assertion below)
            results[i] = (tags, e)

    stop, seen = threading.Event(), []
    w = threading.Thread(target=_watch, args=(gw, stop, seen))
    w.start()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while len(gw.connections) < clients and time.monotonic() < deadline:
        time.sleep(0.005)
    ready.wait(10)
    for t in threads:
        t.join(60)
    stop.set()
    w.join()
    assert len(results) == clients
    for tags, got in results.values():
        assert not isinstance(got, Exception), got
        assert [s for s, _ in got] == [200] * each
        # Each answer is its own request's: nothing lost, nothing crossed.
        assert [text.split()[1] for _, text in got] == tags, got
    b = gw.bodies
    assert b.peak > budget                          # the budget was reached: it did pause
    assert b.peak <= budget + READ + size, b.peak   # and bounded what was held
    assert max(seen) <= b.peak
    assert b.held == 0 and b.partial == 0 and not b.closed and not b.waiting


def _send_slowly(port, body, results, key, pieces=20, gap=0.01):
    """One request whose body is sent in pieces (so several bodies are partial at once)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    try:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: %d\r\n\r\n" % len(body))
        step = len(body) // pieces + 1
        for i in range(0, len(body), step):
            s.sendall(body[i:i + step])
            time.sleep(gap)
        r = http.client.HTTPResponse(s)
        r.begin()
        results[key] = (r.status, r.read())
    finally:
        s.close()


def test_bodies_larger_than_the_budget_are_served(gateway):
    budget = 256 * 1024
    port, gw = gateway(inflight_body_bytes=budget)
    # Alone: one body four times the budget.
    got = _ask(port, [_body("alone", 4 * budget)])
    assert got[0][0] == 200 and got[0][1].split()[1] == "alone"
    # Several at once, each sent in pieces: all are partial when the budget is passed, nothing is
    # complete, so only the progress rule (one body reads on) gets any of them answered.
    results = {}
    threads = [threading.Thread(target=_send_slowly, args=(
        port, _body("big%d" % i, 3 * budget), results, i)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for i in range(4):
        status, data = results[i]
        assert status == 200, data[:200]
        assert json.loads(data)["choices"][0]["message"]["content"].split()[1] == "big%d" % i
    b = gw.bodies
    assert b.peak <= budget + READ + 3 * budget + 200, b.peak
    assert b.held == 0 and b.partial == 0 and not b.closed and b.runner is None


def test_a_connection_the_budget_paused_is_not_timed_out(gateway):
    """While a slow request holds the budget (the mock waits 1.5 s), an idle keep-alive connection
    and a fresh one are paused; their idle and header-read timeouts (0.3 s) must not close them:
    busbar stopped reading, not the client. Each then sends a request and is answered."""
    budget = 200 * 1024
    port, gw = gateway(inflight_body_bytes=budget, idle_timeout_secs=0.3,
                       header_read_timeout_secs=0.3)
    idle = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    idle.request("POST", "/v1/chat/completions", _body("warm", 1000), {"content-type": "application/json"})
    assert idle.getresponse().read()
    results = {}
    slow = threading.Thread(target=lambda: results.setdefault("slow", _ask(port, [
        _body("slow", 2 * budget, "#mock:delay_ms=1500")])))
    slow.start()
    deadline = time.monotonic() + 5
    while not gw.bodies.closed and time.monotonic() < deadline:
        time.sleep(0.005)
    assert gw.bodies.closed
    fresh = socket.create_connection(("127.0.0.1", port), timeout=10)
    time.sleep(0.8)     # beyond both timeouts, the budget still closed
    assert gw.bodies.closed
    body = _body("fresh", 1000)
    fresh.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%b"
                  % (len(body), body))
    idle.request("POST", "/v1/chat/completions", _body("idle", 1000), {"content-type": "application/json"})
    r = idle.getresponse()
    assert r.status == 200 and json.loads(r.read())["choices"][0]["message"]["content"].split()[1] == "idle"
    got = fresh.recv(65536)
    assert got.startswith(b"HTTP/1.1 200") and b"fresh" in got
    slow.join(10)
    assert results["slow"][0][0] == 200
    idle.close()
    fresh.close()


@pytest.mark.parametrize("value,message", [
    (-1, "limits.inflight_body_bytes: must be >= 0, got -1"),
    ("32MiB", "limits.inflight_body_bytes: expected an integer, got a string"),
    (1.5, "limits.inflight_body_bytes: expected an integer, got a number"),
    (True, "limits.inflight_body_bytes: expected an integer, got a boolean"),
])
def test_bad_values_are_refused_by_name(value, message):
    text = ('providers: {m: {protocol: openai, base_url: "http://127.0.0.1:1", api_key: {env: K}}}\n'
            'models: {oai-model: {provider: m}}\n'
            'limits: {inflight_body_bytes: %s}\n') % json.dumps(value)
    with pytest.raises(ConfigError) as info:
        cfgmod.load(text=text, env={"K": "k"})
    assert info.value.problems == [message]


def test_default_and_off():
    text = ('providers: {m: {protocol: openai, base_url: "http://127.0.0.1:1", api_key: {env: K}}}\n'
            'models: {oai-model: {provider: m}}\n')
    assert cfgmod.load(text=text, env={"K": "k"}).limits.inflight_body_bytes == 32 << 20
    off = cfgmod.load(text=text + "limits: {inflight_body_bytes: 0}\n", env={"K": "k"})
    assert off.limits.inflight_body_bytes == 0
