"""Active health probing (busbar/reliability/health.py) through the real server against a hostile
upstream written here: a tripped lane recovers through a probe with no live request sent to it, a
failing probe keeps the lane out, `active` finds a lane that died without traffic, one worker of two
probes a lane per interval, probes are never counted as client requests, and every protocol's probe
is a request its API (the built-in mock) answers."""
from __future__ import annotations

import http.client
import json
import signal
import time

import pytest

from tests.conftest import LANES, start_gateway, stop
from tests.hostile import HostileUpstream, http_response, openai_body

STATE = {"flaky": "fail", "quiet": "ok"}


def _is_probe(req):
    try:
        body = req.json()
    except ValueError:
        return False
    return body.get("max_tokens") == 1 and body["messages"][0]["content"] == "ping"


def _flaky(c, req):
    if STATE["flaky"] == "fail":
        c.sendall(http_response(503, b'{"error":{"message":"down","type":"server_error"}}'))
    else:
        c.sendall(http_response(200, openai_body("flaky is back")))


def _quiet(c, req):
    if STATE["quiet"] == "fail":
        c.sendall(http_response(500, b'{"error":{"message":"down","type":"server_error"}}'))
    else:
        c.sendall(http_response(200, openai_body("quiet")))


def _fine(c, req):
    c.sendall(http_response(200, openai_body("fine")))


CONFIG = """\
listen: "127.0.0.1:{port}"
export:
  metrics: {module: prometheus, settings: {buffer_seconds: 60}}
  access: {module: access-log, settings: {path: "%(log)s"}}
providers:
  h:    {protocol: openai, base_url: "http://127.0.0.1:%(h)d", api_key: {env: MOCK_KEY},
         health: {mode: dead, interval_secs: 1, timeout_secs: 1}}
  act:  {protocol: openai, base_url: "http://127.0.0.1:%(h)d", api_key: {env: MOCK_KEY},
         health: {mode: active, interval_secs: 1, timeout_secs: 1}}
  good: {protocol: openai, base_url: "http://127.0.0.1:%(h)d", api_key: {env: MOCK_KEY}}
models:
  flaky: {provider: h, upstream_model: flaky}
  quiet: {provider: act, upstream_model: quiet, attempt_timeout_ms: 3000}
  fine:  {provider: good, upstream_model: fine}
pools:
  p:
    members: [{model: flaky, weight: 100}, {model: fine}]
    breaker: {trip: {mode: consecutive, consecutive_n: 1}, base_cooldown_secs: 60, max_cooldown_secs: 120}
  a:
    members: [{model: quiet, weight: 100}, {model: fine}]
    breaker: {trip: {mode: consecutive, consecutive_n: 1}, base_cooldown_secs: 60, max_cooldown_secs: 120}
"""


def ask(port, model):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("POST", "/v1/chat/completions",
              json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
              {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", path)
    r = c.getresponse()
    data = r.read()
    c.close()
    return data


def lane(port, pool, model):
    for x in json.loads(get(port, "/stats"))["lanes"]:
        if x["pool"] == pool and x["model"] == model:
            return x
    raise KeyError((pool, model))


def probes(up, model):
    with up.lock:
        return sum(1 for r in up.requests if r.model == model and _is_probe(r))


def live(up, model):
    with up.lock:
        return sum(1 for r in up.requests if r.model == model and not _is_probe(r))


def wait_for(cond, secs):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


@pytest.fixture(scope="module")
def hostile():
    h = HostileUpstream({"flaky": _flaky, "quiet": _quiet, "fine": _fine})
    yield h
    h.close()


@pytest.fixture(scope="module")
def gw(hostile, tmp_path_factory):
    d = tmp_path_factory.mktemp("health")
    g = start_gateway(d, CONFIG % {"h": hostile.port, "log": d / "access.jsonl"})
    g.log = d / "access.jsonl"
    yield g
    stop(g.proc)


def test_dead_mode_recovers_a_tripped_lane_through_probes_alone(gw, hostile):
    STATE["flaky"] = "fail"
    assert ask(gw.port, "p")[0] == 200             # flaky fails once, fine answers, p/flaky trips
    assert lane(gw.port, "p", "flaky")["breaker_state"] == "open"
    assert live(hostile, "flaky") == 1
    # While it stays down, probes fail and re-arm the cooldown; live traffic never goes there.
    assert wait_for(lambda: probes(hostile, "flaky") >= 2, 5)
    x = lane(gw.port, "p", "flaky")
    assert x["breaker_state"] == "open" and x["probes_failed"] >= 2 and x["cooldown_remaining_s"] > 50
    for _ in range(10):
        assert ask(gw.port, "p")[0] == 200
    assert live(hostile, "flaky") == 1
    # The fault clears: the next probe closes the cell; still no live request was the probe.
    STATE["flaky"] = "ok"
    assert wait_for(lambda: lane(gw.port, "p", "flaky")["breaker_state"] == "closed", 4)
    x = lane(gw.port, "p", "flaky")
    assert x["probes_ok"] >= 1 and x["cooldown_remaining_s"] == 0 and x["streak"] == 0
    assert (x["ok"], x["err"]) == (0, 1)           # probes are not attempts
    assert live(hostile, "flaky") == 1
    status, data = ask(gw.port, "p")
    assert status == 200 and b"flaky is back" in data
    # A healthy lane in dead mode is not probed.
    n = probes(hostile, "flaky")
    time.sleep(2.2)
    assert probes(hostile, "flaky") == n


def test_active_mode_finds_a_lane_that_died_without_traffic(gw, hostile):
    assert wait_for(lambda: probes(hostile, "quiet") >= 1, 4)     # probed while healthy
    assert lane(gw.port, "a", "quiet")["breaker_state"] == "closed"
    STATE["quiet"] = "fail"
    assert wait_for(lambda: lane(gw.port, "a", "quiet")["breaker_state"] == "open", 4)
    n = live(hostile, "quiet")
    t0 = time.monotonic()
    for _ in range(5):
        assert ask(gw.port, "a")[0] == 200
    assert live(hostile, "quiet") == n              # found dead before any request was sent
    assert time.monotonic() - t0 < 2
    STATE["quiet"] = "ok"
    assert wait_for(lambda: lane(gw.port, "a", "quiet")["breaker_state"] == "closed", 4)
    # Every cell of the lane follows its probes: the direct route's too.
    assert lane(gw.port, "", "quiet")["breaker_state"] == "closed"


def test_probes_are_never_counted_as_client_requests(gw, hostile):
    before = probes(hostile, "quiet")
    assert wait_for(lambda: probes(hostile, "quiet") >= before + 2, 5)
    metrics = get(gw.port, "/metrics").decode()
    total = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                if line.startswith("busbar_requests_total{")
                and ('pool="p"' in line or 'pool="a"' in line))
    attempts = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("busbar_upstream_attempts_total{"))
    with hostile.lock:
        client_upstream = sum(1 for r in hostile.requests if not _is_probe(r))
    # Every chat request of this module is in the access log and in the metrics; no probe is.
    logged = [json.loads(line) for line in gw.log.read_text().splitlines() if line.strip()]
    chats = [r for r in logged if r.get("pool") in ("p", "a")]
    assert total == len(chats) > 0
    assert attempts == client_upstream


def test_one_worker_of_two_probes_a_lane_per_interval(tmp_path):
    seen = []

    def _down(c, req):
        seen.append(time.monotonic())
        c.sendall(http_response(503, b'{"error":{"message":"down","type":"server_error"}}'))

    up = HostileUpstream({"x": _down, "fine": _fine})
    text = """\
listen: "127.0.0.1:{port}"
providers:
  x:    {protocol: openai, base_url: "%(u)s", api_key: {env: MOCK_KEY}, health: {mode: active, interval_secs: 1}}
  good: {protocol: openai, base_url: "%(u)s", api_key: {env: MOCK_KEY}}
models:
  x: {provider: x, upstream_model: x}
  fine: {provider: good, upstream_model: fine}
""" % {"u": up.url}
    g = start_gateway(tmp_path, text, workers=2)
    try:
        assert wait_for(lambda: len(seen) >= 1, 4)
        t0 = time.monotonic()
        n0 = len(seen)
        time.sleep(4.0)
        n = len(seen) - n0
        # One probe per 1 s interval for the gateway (two workers would make ~8).
        assert 3 <= n <= 5, (n, [round(t - t0, 2) for t in seen])
    finally:
        stop(g.proc)
        up.close()


def test_probing_turned_on_and_off_by_a_reload(tmp_path):
    """A worker whose config probes nothing does not tick; a reload that turns `health:` on
    starts the probes, one that turns it off again stops them."""
    seen = []

    def _down(c, req):
        seen.append(time.monotonic())
        c.sendall(http_response(503, b'{"error":{"message":"down","type":"server_error"}}'))

    up = HostileUpstream({"x": _down})
    text = """\
listen: "127.0.0.1:{port}"
providers:
  x: {protocol: openai, base_url: "%(u)s", api_key: {env: MOCK_KEY}%(health)s}
models:
  x: {provider: x, upstream_model: x}
"""
    g = start_gateway(tmp_path, text % {"u": up.url, "health": ""})
    try:
        time.sleep(1.5)
        assert seen == []
        g.config_path.write_text(text.replace("{port}", str(g.port)) % {
            "u": up.url, "health": ", health: {mode: active, interval_secs: 1}"})
        g.proc.send_signal(signal.SIGHUP)
        assert wait_for(lambda: len(seen) >= 2, 6), seen
        g.config_path.write_text(text.replace("{port}", str(g.port)) % {"u": up.url, "health": ""})
        g.proc.send_signal(signal.SIGHUP)
        time.sleep(1.5)         # a probe already in flight may still land
        n = len(seen)
        time.sleep(2.5)
        assert len(seen) == n
    finally:
        stop(g.proc)
        up.close()


def test_every_protocols_probe_is_answered_by_its_api(tmp_path, mock_port):
    providers = []
    models = []
    protos = {"openai": "gpt-4o-mini", "responses": "gpt-4.1-mini", "anthropic": "claude-haiku-4-5",
              "gemini": "gemini-2.5-flash", "cohere": "command-r", "bedrock": "amazon.nova-lite-v1:0"}
    for proto, wire in protos.items():
        key = "MOCK_AWS" if proto == "bedrock" else "MOCK_KEY"
        region = ", region: us-east-1" if proto == "bedrock" else ""
        providers.append('  m-%s: {protocol: %s, base_url: "http://127.0.0.1:%d", api_key: {env: %s}%s, '
                         'health: {mode: active, interval_secs: 1}}' % (proto, proto, mock_port, key, region))
        models.append('  %s: {provider: m-%s, upstream_model: "%s"}' % (LANES[proto], proto, wire))
    text = 'listen: "127.0.0.1:{port}"\nproviders:\n%s\nmodels:\n%s\n' % ("\n".join(providers),
                                                                            "\n".join(models))
    g = start_gateway(tmp_path, text)
    try:
        def all_probed():
            st = json.loads(get(g.port, "/stats"))["lanes"]
            return all(x["probes_ok"] >= 1 for x in st) and len(st) == 6
        assert wait_for(all_probed, 6)
        st = json.loads(get(g.port, "/stats"))["lanes"]
        assert all(x["probes_failed"] == 0 and x["ok"] == 0 for x in st), st
    finally:
        stop(g.proc)
