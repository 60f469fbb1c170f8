"""Breaker series and reloaded pools through the real server with `--workers 2`, read with
prometheus_client's own parser, with the Rust gateway's meanings: a lane that trips in one pool
while its direct route still admits shows busbar_lane_state 1 (half-open), a lane refusing
busbar's key is benched: 2 (open), a probe that succeeds closes it again (0), each with one trip
and one operational line; busbar_lane_available and busbar_lane_recovery_hint_ms read the same
verdict routing does; a pool added by POST config/apply is counted by both workers into the same
slots (exactly N requests), and its breaker works there too."""
from __future__ import annotations

import http.client
import json
import re
import time

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, free_port, start_gateway, stop, wait_http
from tests.hostile import HostileUpstream, http_response, openai_body

STATE = {"flaky": "fail"}


def _flaky(c, req):
    if STATE["flaky"] == "fail":
        c.sendall(http_response(503, b'{"error":{"message":"down","type":"server_error"}}'))
    else:
        c.sendall(http_response(200, openai_body("back")))


def _refused(c, req):
    c.sendall(http_response(401, b'{"error":{"message":"Incorrect API key provided.",'
                                 b'"type":"invalid_request_error","code":"invalid_api_key"}}'))


def _fine(c, req):
    c.sendall(http_response(200, openai_body("fine")))


def _down(c, req):
    c.sendall(http_response(500, b'{"error":{"message":"down","type":"server_error"}}'))


CONFIG = """\
listen: "127.0.0.1:{port}"
admin_listen: "127.0.0.1:{admin}"
auth: {{admin_auth: []}}
providers:
  h: {{protocol: openai, base_url: "http://127.0.0.1:{h}", api_key: {{env: MOCK_KEY}}}}
models:
  flaky:   {{provider: h, upstream_model: flaky}}
  refused: {{provider: h, upstream_model: refused}}
  fine:    {{provider: h, upstream_model: fine}}
pools:
  trippy:
    members: [{{model: flaky, weight: 100}}, {{model: fine}}]
    breaker: {{trip: {{mode: consecutive, consecutive_n: 1}}, base_cooldown_secs: 0.5, max_cooldown_secs: 0.5}}
  benchy:
    members: [{{model: refused, weight: 100}}, {{model: fine}}]
export:
  access: {{module: access-log, settings: {{path: "off"}}}}
  metrics: {{module: prometheus, settings: {{buffer_seconds: 60}}}}
"""


@pytest.fixture(scope="module")
def hostile():
    h = HostileUpstream({"flaky": _flaky, "refused": _refused, "fine": _fine, "down": _down,
                         "fine2": _fine})
    yield h
    h.close()


class Gw:
    def __init__(self, proc, port, admin, err, path=None):
        self.proc, self.port, self.admin, self.err, self.path = proc, port, admin, err, path

    def events(self, prefix):
        """The stderr lines (the operational events) that contain `prefix`."""
        return [x for x in self.err.read_text().splitlines() if prefix in x]


def launch(tmp_path, text, workers=2):
    port, admin = free_port(), free_port()
    err = tmp_path / "stderr.log"

    def ready(port, proc):
        wait_http(port, proc)
        wait_http(admin, proc)

    with open(err, "wb") as f:
        gw = start_gateway(tmp_path, text.format(port=port, admin=admin), workers, port=port,
                           stderr=f, ready=ready)
    return Gw(gw.proc, port, admin, err, gw.config_path)


def call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request(method, path, None if body is None else json.dumps(body),
                  {"content-type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def chat(port, model):
    return call(port, "POST", "/v1/chat/completions",
                {"model": model, "messages": [{"role": "user", "content": "hi"}]})[0]


def scrape(gw):
    st, body = call(gw.admin, "GET", "/metrics")
    assert st == 200
    fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
    out = {}
    for f in fams.values():
        for s in f.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return fams, out


def value(samples, name, **labels):
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == x for k, x in labels.items()))


def test_lane_state_and_trips_over_two_workers(hostile, tmp_path):
    STATE["flaky"] = "fail"
    gw = launch(tmp_path, CONFIG.replace("{h}", str(hostile.port)))
    try:
        fams, s = scrape(gw)
        for name in ("busbar_lane_state", "busbar_lane_available", "busbar_lane_recovery_hint_ms",
                     "busbar_lane_inflight"):
            assert fams[name].type == "gauge"
        assert fams["busbar_breaker_trips"].type == "counter"
        # Every cell of the config, closed, no trip: pools' members and each model's direct route.
        cells = {dict(ls)["pool"] + "/" + dict(ls)["lane"] for (n, ls) in s if n == "busbar_lane_state"}
        assert cells == {"trippy/flaky", "trippy/fine", "benchy/refused", "benchy/fine",
                         "flaky/flaky", "refused/refused", "fine/fine"}
        assert value(s, "busbar_lane_state") == 0 and value(s, "busbar_breaker_trips_total") == 0
        assert value(s, "busbar_lane_available") == len(cells)
        assert value(s, "busbar_lane_recovery_hint_ms") == 0
        # No lane is bounded here: no permit series at all; every pool's queue reads 0.
        assert not any(n == "busbar_lane_available_permits" for (n, _) in s)
        assert {dict(ls)["pool"] for (n, ls) in s if n == "busbar_pool_queued"} == {"trippy", "benchy"}

        # The flaky lane fails once: consecutive_n 1 trips it; the request fails over to fine.
        assert chat(gw.port, "trippy") == 200
        # A lane refusing busbar's key is benched at once (hard_down).
        assert chat(gw.port, "benchy") == 200
        # A request is counted just after its answer is written: wait for its worker.
        deadline = time.monotonic() + 5
        while value(scrape(gw)[1], "busbar_requests_total") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for _ in range(6):      # fresh connections: whichever worker answers, the same figures
            _, s = scrape(gw)
            # Cooling in trippy, while its direct route's cell still admits: half-open (1).
            assert value(s, "busbar_lane_state", pool="trippy", lane="flaky") == 1
            assert value(s, "busbar_lane_available", pool="trippy", lane="flaky") == 0
            assert 0 < value(s, "busbar_lane_recovery_hint_ms", pool="trippy", lane="flaky") <= 550
            assert value(s, "busbar_breaker_trips_total", pool="trippy", lane="flaky") == 1
            # Benched: open (2), whatever the other cells say, its hint the sticky cooldown.
            assert value(s, "busbar_lane_state", pool="benchy", lane="refused") == 2
            assert value(s, "busbar_lane_available", pool="benchy", lane="refused") == 0
            assert value(s, "busbar_lane_recovery_hint_ms", pool="benchy", lane="refused") > 60_000
            assert value(s, "busbar_breaker_trips_total", pool="benchy", lane="refused") == 1
            assert value(s, "busbar_lane_state", pool="flaky", lane="flaky") == 0
            assert value(s, "busbar_lane_available", pool="flaky", lane="flaky") == 1
            assert value(s, "busbar_breaker_trips_total") == 2
            assert value(s, "busbar_upstream_failures_total", pool="benchy", lane="refused",
                         disposition="hard_down") == 1
            assert value(s, "busbar_failovers_total", pool="benchy", reason="hard_down") == 1
            assert value(s, "busbar_failovers_total", pool="trippy",
                         reason="transient_upstream") == 1
        # While open, both workers skip it: more requests, no more failures or trips.
        for _ in range(10):
            assert chat(gw.port, "trippy") == 200
        _, s = scrape(gw)
        assert value(s, "busbar_upstream_failures_total", pool="trippy", lane="flaky") == 1

        # After the cooldown, one probe reaches the lane, which answers: closed again.
        STATE["flaky"] = "ok"
        time.sleep(0.7)
        deadline = time.monotonic() + 5
        while True:
            assert chat(gw.port, "trippy") == 200
            _, s = scrape(gw)
            if value(s, "busbar_lane_state", pool="trippy", lane="flaky") == 0:
                break
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert value(s, "busbar_breaker_trips_total", pool="trippy", lane="flaky") == 1

        # One operational line per event, with stable fields; never the key.
        time.sleep(0.2)
        tripped = gw.events("lane_tripped ")
        assert len(tripped) == 1 and " WARNING " in tripped[0], tripped
        assert "lane_tripped pool=trippy lane=flaky disposition=transient_upstream cooldown_s=0.5" \
            in tripped[0]
        benched = gw.events("lane_benched ")
        assert len(benched) == 1 and "pool=benchy lane=refused disposition=hard_down" in benched[0]
        recovered = gw.events("lane_recovered ")
        assert len(recovered) == 1 and " INFO " in recovered[0]
        assert "lane_recovered pool=trippy lane=flaky" in recovered[0]
        assert "sk-test-key" not in gw.err.read_text()
    finally:
        stop(gw.proc)


def test_the_grafana_dashboard_reads_only_series_busbar_serves(hostile, tmp_path):
    gw = launch(tmp_path, CONFIG.replace("{h}", str(hostile.port)), workers=1)
    try:
        text = call(gw.admin, "GET", "/metrics")[1].decode()
    finally:
        stop(gw.proc)
    served = set(re.findall(r"^# HELP (busbar_\w+)", text, re.M))
    board = json.loads((ROOT / "packaging" / "grafana" / "busbar.json").read_text())
    used = {re.sub(r"_(bucket|sum|count)$", "", n) for p in board["panels"] for t in p["targets"]
            for n in re.findall(r"busbar_\w+", t["expr"])}
    assert {"busbar_lane_state", "busbar_breaker_trips_total"} <= used
    assert used <= served, used - served


def test_a_pool_added_by_apply_is_counted_by_both_workers(hostile, tmp_path):
    gw = launch(tmp_path, CONFIG.replace("{h}", str(hostile.port)))
    try:
        doc = yaml.safe_load(gw.path.read_text())
        doc["models"]["down"] = {"provider": "h", "upstream_model": "down"}
        doc["models"]["fine2"] = {"provider": "h", "upstream_model": "fine2"}
        doc["pools"]["added"] = {
            "members": [{"model": "down", "weight": 100}, {"model": "fine2"}],
            "breaker": {"trip": {"mode": "consecutive", "consecutive_n": 1},
                        "base_cooldown_secs": 60, "max_cooldown_secs": 60}}
        st, body = call(gw.admin, "POST", "/api/v1/admin/config/apply", {"config": doc})
        assert st == 200 and json.loads(body)["workers"] == 2, body
        n = 40
        for _ in range(n):      # fresh connections: the kernel spreads them over both workers
            assert chat(gw.port, "added") == 200
        deadline = time.monotonic() + 5
        while value(scrape(gw)[1], "busbar_requests_total", pool="added") < n:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        seen = set()
        for _ in range(6):
            _, s = scrape(gw)
            seen.add((value(s, "busbar_requests_total", pool="added"),
                      value(s, "busbar_requests_total", pool="added", outcome="ok"),
                      value(s, "busbar_upstream_attempts_total", pool="added", lane="fine2"),
                      value(s, "busbar_request_duration_seconds_count", pool="added")))
        assert seen == {(n, n, n, n)}, seen
        assert value(s, "busbar_requests_total", ingress_protocol="openai", pool="unresolved") == 0
        # The new pool's breaker is live in both workers, in the same slots: the down lane failed
        # once, tripped once, and neither worker tried it again.
        assert value(s, "busbar_upstream_failures_total", pool="added", lane="down") == 1
        assert value(s, "busbar_breaker_trips_total", pool="added", lane="down") == 1
        # Cooling for a minute, its direct route's cell untouched: half-open (1).
        assert value(s, "busbar_lane_state", pool="added", lane="down") == 1
        assert value(s, "busbar_lane_state", pool="added", lane="fine2") == 0
        assert ("busbar_lane_inflight", (("lane", "fine2"), ("pool", "added"))) in s
        # The direct route of a model added by the reload is a pool label of its own.
        assert chat(gw.port, "fine2") == 200
        _, s = scrape(gw)
        assert value(s, "busbar_requests_total", pool="fine2") == 1
        time.sleep(0.2)
        lines = gw.events(" reload ")
        assert len(lines) == 1, lines
        assert "reload version=1 kind=apply workers=2 workers_failed=0 swap_ms=" in lines[0]
        assert lines[0].endswith("restart_required=none")
    finally:
        stop(gw.proc)
