"""Metrics and the access log through the real server: N requests over `--workers 2` → the
counters, read with prometheus_client's own text parser, sum to N; one JSON access-log line per
request, with the fields the issue names and no secret."""
from __future__ import annotations

import http.client
import json
import time

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import CONFIG, free_port, start_gateway, stop

OBSERVE = """
export:
  access: {{module: access-log, settings: {{path: "{log}"}}}}
  metrics: {{module: prometheus, settings: {{buffer_seconds: 60}}}}
"""


def _post(port, model, text="hi", path="/v1/chat/completions"):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request("POST", path, json.dumps({"model": model, "messages": [{"role": "user", "content": text}]}),
                  {"content-type": "application/json"})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _get(port, path):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.getheader("content-type"), r.read()
    finally:
        c.close()


def _samples(text):
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sum(samples, name, **labels):
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == x for k, x in labels.items()))


def test_counters_sum_over_two_workers_and_access_log(mock_port, tmp_path):
    log = tmp_path / "access.jsonl"
    text = CONFIG.format(port="{port}", mock=mock_port, dead=free_port()) + OBSERVE.format(log=log)
    gw = start_gateway(tmp_path, text, workers=2)
    try:
        n_ok, n_fail, n_unknown = 30, 6, 4
        for i in range(n_ok):
            assert _post(gw.port, "mixed", "m%d" % i)[0] == 200
        for i in range(n_fail):
            # failover: the dead lane (weight 100) is tried first, then ant-model answers.
            assert _post(gw.port, "failover", "f%d" % i)[0] == 200
        for _ in range(n_unknown):
            assert _post(gw.port, "no-such-pool")[0] == 404
        # Several scrapes: whichever worker answers, the totals are the same.
        seen = set()
        for _ in range(6):
            status, ctype, body = _get(gw.port, "/metrics")
            assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
            s = _samples(body.decode())
            seen.add(_sum(s, "busbar_requests_total", ingress_protocol="openai"))
        assert seen == {n_ok + n_fail + n_unknown}, seen
        assert _sum(s, "busbar_requests_total", pool="mixed", outcome="ok") == n_ok
        assert _sum(s, "busbar_requests_total", pool="failover", outcome="ok") == n_fail
        # The pool label is never raw client input.
        assert _sum(s, "busbar_requests_total", pool="unresolved", outcome="client_error") == n_unknown
        assert not any("no-such-pool" in str(k) for k in s)
        # Neither the start-up probe (GET /healthz) nor the scrapes themselves are requests.
        assert _sum(s, "busbar_requests_total", ingress_protocol="none") == 0
        assert _sum(s, "busbar_request_duration_seconds_count", ingress_protocol="openai") == \
            n_ok + n_fail + n_unknown
        assert _sum(s, "busbar_upstream_attempts_total", pool="mixed") == n_ok
        # The dead lane fails until its breaker cell opens (every worker sees it open), then is
        # skipped: each failure is one extra attempt and one failover.
        dead = _sum(s, "busbar_upstream_failures_total", lane="dead-model", disposition="connect")
        assert 1 <= dead <= n_fail
        assert _sum(s, "busbar_upstream_attempts_total", pool="failover") == n_fail + dead
        assert _sum(s, "busbar_failovers_total", pool="failover", reason="connect") == dead
        # openai ingress → anthropic lanes are translations.
        tr = _sum(s, "busbar_translations_total", **{"from": "openai", "to": "anthropic"})
        assert 0 < tr <= n_ok // 2 + 1 + n_fail
        assert _sum(s, "busbar_tokens_total", kind="input") > 0
        assert _sum(s, "busbar_tokens_total", kind="output") > 0
        assert _sum(s, "busbar_workers") == 2
        assert _sum(s, "busbar_process_resident_memory_bytes") > 10_000_000
        assert _sum(s, "busbar_process_open_fds") > 0
        # The access log: one line per request, across both workers, flushed within ~0.1 s.
        deadline = time.monotonic() + 5
        lines = []
        while time.monotonic() < deadline:
            lines = log.read_text().splitlines() if log.exists() else []
            if len(lines) >= n_ok + n_fail + n_unknown:
                break
            time.sleep(0.1)
        recs = [json.loads(x) for x in lines]
        chat = [r for r in recs if r["ingress_protocol"] == "openai"]
        assert len(chat) == n_ok + n_fail + n_unknown
        fo = [r for r in chat if r["pool"] == "failover"]
        assert sum(r["attempts"] for r in fo) == n_fail + dead
        r = next(r for r in fo if r["attempts"] == 2)
        assert r["lane"] == "ant-model" and r["status"] == 200
        assert r["outcome"] == "ok" and r["input_tokens"] > 0 and r["output_tokens"] > 0
        assert r["upstream_model"] == "claude-haiku-4-5" and r["client"] == "127.0.0.1"
        assert r["request_id"].startswith("req_") and r["busbar_us"] >= 0 and r["upstream_ms"] > 0
        assert set(r) >= {"time", "key_id", "group", "cached_tokens"}
        assert {r["pool"] for r in chat} == {"mixed", "failover", "unresolved"}
        assert "sk-test-key" not in log.read_text()
    finally:
        stop(gw.proc)


def test_metrics_off_is_404(mock_port, tmp_path):
    text = CONFIG.format(port="{port}", mock=mock_port, dead=free_port()) + \
        "export: {access: {module: access-log, settings: {path: \"off\"}}}\n"
    gw = start_gateway(tmp_path, text)
    try:
        assert _get(gw.port, "/metrics")[0] == 404
    finally:
        stop(gw.proc)


def test_metrics_on_the_data_listener_need_a_key_when_the_chain_asks_for_one(mock_port, tmp_path):
    """A prometheus export serves /metrics on the data listener as the Rust gateway does: behind
    the data plane's key chain (open under `chain: []`, as the other tests here read it), and
    on the admin listener behind its token."""
    from tests.integration.gov_helpers import ADMIN, start
    gw = start(tmp_path, mock_port, "export: {metrics: {module: prometheus, settings: "
                                    "{buffer_seconds: 60}}}\n")
    try:
        status, ctype, body = _get(gw.port, "/metrics")
        assert status == 401 and ctype.startswith("application/json"), body
        assert json.loads(body)["error"]["code"] == "invalid_api_key"      # in OpenAI's shape
        key = gw.admin.mint(name="scraper")["token"]
        c = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=20)
        try:
            c.request("GET", "/metrics", headers={"authorization": "Bearer " + key})
            r = c.getresponse()
            text = r.read().decode()
            assert r.status == 200 and r.getheader("cache-control") == "no-store"
            assert r.getheader("content-type").startswith("text/plain; version=0.0.4")
        finally:
            c.close()
        assert any(f.name == "busbar_requests" for f in text_string_to_metric_families(text))
        c = http.client.HTTPConnection("127.0.0.1", gw.admin.port, timeout=20)
        try:
            c.request("GET", "/metrics")
            assert c.getresponse().status == 401
            c.close()
            c = http.client.HTTPConnection("127.0.0.1", gw.admin.port, timeout=20)
            c.request("GET", "/metrics", headers={"authorization": "Bearer " + ADMIN})
            r = c.getresponse()
            assert r.status == 200 and "busbar_requests" in r.read().decode()
        finally:
            c.close()
    finally:
        stop(gw.proc)
