"""The series the happy path never moves, through the real server against a hostile upstream, read
with prometheus_client's parser: a relayed stream whose usage cannot be read is billed zero and
counted (busbar_billing_truncated_total); every answer's status decides its
busbar_requests_total outcome (ok, exhausted, client_error, error) while busbar's own word goes to
busbar_request_outcomes_total; a bounded lane's busbar_lane_inflight and
busbar_lane_available_permits follow a call in flight, and while it is full busbar_lane_available
reads 0 and busbar_lane_recovery_hint_ms the at-capacity floor; the inbound cap's refusal is
busbar_admission_denied_total{gate="inbound"}."""
from __future__ import annotations

import http.client
import json
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import start_gateway, stop
from tests.hostile import (HostileUpstream, chunk, chunked_head, http_response, openai_body,
                           openai_sse)

CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  h: {protocol: openai, base_url: "http://127.0.0.1:%(h)d", api_key: {env: MOCK_KEY}}
models:
  garbled: {provider: h, upstream_model: garbled}
  clean:   {provider: h, upstream_model: clean}
  down:    {provider: h, upstream_model: down}
  teapot:  {provider: h, upstream_model: teapot}
  slow:    {provider: h, upstream_model: slow, max_concurrent: 1}
  slow2:   {provider: h, upstream_model: slow}
pools:
  gone:
    members: [{model: down}]
    breaker: {trip: {mode: consecutive, consecutive_n: 1}, base_cooldown_secs: 60, max_cooldown_secs: 60}
limits:
  max_inbound_concurrent: %(inbound)d
export:
  access: {module: access-log, settings: {path: "off"}}
  prom: {module: prometheus, settings: {buffer_seconds: 10}}
"""

SLOW_SECS = 1.5


def _garbled(c, req):
    """A stream whose first frame is sound (so it is relayed) and whose next is not JSON; the
    rest, usage included, follows as usual."""
    whole = openai_sse("all of it", usage=(7, 4))
    first, _, rest = whole.partition(b"\n\n")
    c.sendall(chunked_head() + chunk(first + b"\n\n"))
    time.sleep(0.05)
    c.sendall(chunk(b"data: {this is not json\n\n"))
    c.sendall(chunk(rest) + b"0\r\n\r\n")


def _clean(c, req):
    c.sendall(chunked_head() + chunk(openai_sse("fine", usage=(7, 4))) + b"0\r\n\r\n")


def _down(c, req):
    c.sendall(http_response(500, b'{"error":{"message":"down","type":"server_error"}}'))


def _teapot(c, req):
    c.sendall(http_response(400, b'{"error":{"message":"bad request","type":"invalid_request_error"}}'))


def _slow(c, req):
    time.sleep(SLOW_SECS)
    c.sendall(http_response(200, openai_body("slow")))


@pytest.fixture(scope="module")
def hostile():
    h = HostileUpstream({"garbled": _garbled, "clean": _clean, "down": _down, "teapot": _teapot,
                         "slow": _slow})
    yield h
    h.close()


def post(port, model, stream=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        c.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def scrape(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    c.close()
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(body) for s in f.samples]


def value(samples, name, **labels):
    return sum(v for n, ls, v in samples if n == name and all(ls.get(k) == x for k, x in labels.items()))


def test_billing_lost_and_outcomes_by_status(hostile, tmp_path):
    gw = start_gateway(tmp_path, CONFIG % {"h": hostile.port, "inbound": 0})
    try:
        st, body = post(gw.port, "garbled", stream=True)
        # The client got the upstream's bytes as sent, its usage frame included ...
        assert st == 200 and b"all of it" in body and b'"completion_tokens": 4' in body
        assert body.rstrip().endswith(b"data: [DONE]")
        st, body = post(gw.port, "clean", stream=True)
        assert st == 200
        s = scrape(gw.port)
        # ... but busbar could not read it: billed zero, counted; the clean stream's tokens are.
        assert value(s, "busbar_billing_truncated_total") == 1
        assert value(s, "busbar_tokens_total", model="garbled") == 0
        assert value(s, "busbar_tokens_total", model="clean", kind="output") == 4
        assert value(s, "busbar_requests_total", pool="garbled", outcome="ok") == 1

        seen = {}
        for model in ("gone", "gone", "teapot", "no-such-model"):
            st, _ = post(gw.port, model)
            seen.setdefault(model, []).append(st)
        s = scrape(gw.port)
        klass = {503: "exhausted"}
        for model, statuses in seen.items():
            pool = model if model != "no-such-model" else "unresolved"
            for st in set(statuses):
                want = klass.get(st) or ("client_error" if 400 <= st < 500 else
                                         "ok" if st < 300 else "error")
                assert value(s, "busbar_requests_total", pool=pool, outcome=want) == \
                    statuses.count(st), (model, st, want)
        # The lane's 500 trips the pool's only cell at once: the first call's answer is the
        # upstream's error, the second finds no lane (503, exhausted) — busbar's own words differ.
        assert seen["gone"][1] == 503
        assert value(s, "busbar_request_outcomes_total", pool="gone", outcome="exhausted") >= 1
        assert value(s, "busbar_upstream_failures_total", pool="gone", lane="down",
                     disposition="transient_upstream") == 1
        assert value(s, "busbar_failovers_total", pool="gone", reason="transient_upstream") == 1
        assert value(s, "busbar_lane_state", pool="gone", lane="down") == 1   # its direct cell admits
        assert value(s, "busbar_requests_total", pool="teapot", outcome="client_error") == 1
        assert value(s, "busbar_upstream_failures_total", lane="teapot") == 0   # the caller's fault
    finally:
        stop(gw.proc)


def test_a_bounded_lane_in_flight_and_the_inbound_cap(hostile, tmp_path):
    gw = start_gateway(tmp_path, CONFIG % {"h": hostile.port, "inbound": 2})
    try:
        s = scrape(gw.port)
        lab = dict(pool="slow", lane="slow")
        assert value(s, "busbar_lane_available_permits", **lab) == 1
        assert value(s, "busbar_lane_inflight", **lab) == 0
        assert value(s, "busbar_lane_available", **lab) == 1
        # Unbounded lanes have no permit series.
        assert not [x for x in s if x[0] == "busbar_lane_available_permits" and x[1]["lane"] == "clean"]
        results = []
        calls = [threading.Thread(target=lambda m=m: results.append(post(gw.port, m)[0]))
                 for m in ("slow", "slow2")]
        for t in calls:
            t.start()
            time.sleep(SLOW_SECS / 4)
        s = scrape(gw.port)
        assert value(s, "busbar_lane_inflight", **lab) == 1
        assert value(s, "busbar_lane_available_permits", **lab) == 0
        assert value(s, "busbar_lane_available", **lab) == 0
        assert value(s, "busbar_lane_recovery_hint_ms", **lab) == 2000
        # Another lane to the same upstream model is another lane: free.
        assert value(s, "busbar_lane_available", pool="slow2", lane="slow2") == 1
        # The inbound cap is 2 and the slow calls hold it: another call is shed (503).
        st, _ = post(gw.port, "clean")
        assert st == 503
        for t in calls:
            t.join()
        assert results == [200, 200]
        s = scrape(gw.port)
        assert value(s, "busbar_admission_denied_total", gate="inbound") == 1
        assert value(s, "busbar_request_outcomes_total", outcome="shed") == 1
        assert value(s, "busbar_requests_total", outcome="exhausted") == 1
        assert value(s, "busbar_lane_inflight", **lab) == 0
        assert value(s, "busbar_lane_available_permits", **lab) == 1
        assert value(s, "busbar_lane_recovery_hint_ms", **lab) == 0
    finally:
        stop(gw.proc)
