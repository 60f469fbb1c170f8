"""Metrics and the access log through the real server: N requests over `--workers 2` → the series
the Rust gateway documents (docs/observability.md), read with prometheus_client's own text parser,
with its names, types, labels and meanings: busbar_requests_total by the status answered,
busbar_request_duration_seconds an end-to-end summary, failures and failovers in its
vocabulary; one JSON access-log line per request, with the fields the issue names and no secret;
/metrics where the Rust gateway serves it (the data listener) and nowhere without a prometheus
export instance."""
from __future__ import annotations

import http.client
import json
import time

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import CONFIG, free_port, start_gateway, stop

OBSERVE = """
export:
  access: {{module: access-log, settings: {{path: "{log}"}}}}
  prom: {{module: prometheus, settings: {{buffer_seconds: {buffer}}}}}
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


def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}


def _samples(text):
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _sum(samples, name, **labels):
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == x for k, x in labels.items()))


def settle(port, name, want, secs=5, **labels):
    """Scrapes until the series' sum is `want` (a worker counts a request just after it answers
    it, so another worker's scrape may come first); returns the samples."""
    deadline = time.monotonic() + secs
    while True:
        s = _samples(_get(port, "/metrics")[2].decode())
        if _sum(s, name, **labels) == want or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def test_counters_sum_over_two_workers_and_access_log(mock_port, tmp_path):
    log = tmp_path / "access.jsonl"
    text = CONFIG.format(port="{port}", mock=mock_port, dead=free_port()) + \
        OBSERVE.format(log=log, buffer=60)
    gw = start_gateway(tmp_path, text, workers=2)
    try:
        n_ok, n_fail, n_unknown = 30, 6, 4
        t0 = time.monotonic()
        for i in range(n_ok):
            assert _post(gw.port, "mixed", "m%d" % i)[0] == 200
        for i in range(n_fail):
            # failover: the dead lane (weight 100) is tried first, then ant-model answers.
            assert _post(gw.port, "failover", "f%d" % i)[0] == 200
        for _ in range(n_unknown):
            assert _post(gw.port, "no-such-pool")[0] == 404
        wall = time.monotonic() - t0
        # A request is counted just after its answer is written: wait for the last one's worker.
        settle(gw.port, "busbar_requests_total", n_ok + n_fail + n_unknown)
        # Several scrapes: whichever worker answers, the totals are the same.
        seen = set()
        for _ in range(6):
            status, ctype, body = _get(gw.port, "/metrics")
            assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
            s = _samples(body.decode())
            seen.add(_sum(s, "busbar_requests_total", ingress_protocol="openai"))
        assert seen == {n_ok + n_fail + n_unknown}, seen
        fams = families(body.decode())
        assert fams["busbar_requests"].type == "counter"
        assert _sum(s, "busbar_requests_total", pool="mixed", outcome="ok") == n_ok
        assert _sum(s, "busbar_requests_total", pool="failover", outcome="ok") == n_fail
        # The pool label is never raw client input; a 404 is a client_error (by its status).
        assert _sum(s, "busbar_requests_total", pool="unresolved", outcome="client_error") == n_unknown
        assert not any("no-such-pool" in str(k) for k in s)
        assert {dict(ls)["outcome"] for (n, ls) in s if n == "busbar_requests_total"} <= {
            "ok", "exhausted", "client_error", "error"}
        # busbar's own outcome words are their own series.
        assert _sum(s, "busbar_request_outcomes_total", pool="unresolved",
                    outcome="client_error") == n_unknown
        assert _sum(s, "busbar_request_outcomes_total", outcome="ok") == n_ok + n_fail
        # Neither the start-up probe (GET /healthz) nor the scrapes themselves are requests.
        assert _sum(s, "busbar_requests_total", ingress_protocol="none") == 0

        # End to end: a summary, its count every answered request, its sum the time they took
        # (at most the wall time of the calls), its quantiles ordered within min and max.
        dur = fams["busbar_request_duration_seconds"]
        assert dur.type == "summary"
        assert _sum(s, "busbar_request_duration_seconds_count", ingress_protocol="openai") == \
            n_ok + n_fail + n_unknown
        total = _sum(s, "busbar_request_duration_seconds_sum", ingress_protocol="openai")
        assert 0 < total <= wall
        q = {dict(ls)["quantile"]: v for (n, ls), v in s.items()
             if n == "busbar_request_duration_seconds" and dict(ls)["pool"] == "mixed"}
        assert set(q) == {"0", "0.5", "0.9", "0.95", "0.99", "0.999", "1"}
        order = [q[k] for k in ("0", "0.5", "0.9", "0.95", "0.99", "0.999", "1")]
        assert order == sorted(order) and order[0] > 0
        assert q["0"] <= total / (n_ok + n_fail + n_unknown) * 5
        # The failover pool's requests took a failed attempt more: its median is not below the
        # direct pool's minimum.
        fq = {dict(ls)["quantile"]: v for (n, ls), v in s.items()
              if n == "busbar_request_duration_seconds" and dict(ls)["pool"] == "failover"}
        assert fq["0.5"] >= q["0"]
        # busbar's own time is its own histogram.
        assert fams["busbar_own_duration_seconds"].type == "histogram"
        assert _sum(s, "busbar_own_duration_seconds_count", ingress_protocol="openai") == \
            n_ok + n_fail + n_unknown

        assert _sum(s, "busbar_upstream_attempts_total", pool="mixed") == n_ok
        # The dead lane fails until its breaker cell opens (every worker sees it open), then is
        # skipped: each failure is one extra attempt and one failover, for lack of a connection.
        dead = _sum(s, "busbar_upstream_failures_total", lane="dead-model",
                    disposition="transient_upstream")
        assert 1 <= dead <= n_fail
        assert {dict(ls)["disposition"] for (n, ls) in s if n == "busbar_upstream_failures_total"} \
            == {"transient_upstream"}
        assert _sum(s, "busbar_upstream_attempts_total", pool="failover") == n_fail + dead
        assert _sum(s, "busbar_failovers_total", pool="failover", reason="connect") == dead
        assert _sum(s, "busbar_failovers_total") == dead
        # openai ingress → anthropic lanes are translations.
        tr = _sum(s, "busbar_translations_total", **{"from": "openai", "to": "anthropic"})
        assert 0 < tr <= n_ok // 2 + 1 + n_fail
        assert _sum(s, "busbar_tokens_total", kind="input") > 0
        assert _sum(s, "busbar_tokens_total", kind="output") > 0
        # The unlabelled counters are there from the start, at 0 here.
        for name in ("busbar_billing_truncated_total", "busbar_webhook_logs_dropped_total",
                     "busbar_file_logs_dropped_total"):
            assert fams[name.removesuffix("_total")].type == "counter"
            assert (name, ()) in s and s[(name, ())] == 0
        assert _sum(s, "busbar_admission_denied_total", gate="inbound") == 0
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


def test_quantiles_cover_the_last_buffer_seconds_and_totals_stay(mock_port, tmp_path):
    text = CONFIG.format(port="{port}", mock=mock_port, dead=free_port()) + \
        OBSERVE.format(log="off", buffer=3)
    gw = start_gateway(tmp_path, text)
    try:
        for i in range(5):
            assert _post(gw.port, "oai-model", "q%d" % i)[0] == 200
        s = _samples(_get(gw.port, "/metrics")[2].decode())
        lab = dict(ingress_protocol="openai", pool="oai-model")
        assert _sum(s, "busbar_request_duration_seconds", quantile="1", **lab) > 0
        total = _sum(s, "busbar_request_duration_seconds_sum", **lab)
        # Past the window with nothing new: the quantiles are empty (0, as the Rust gateway's
        # exporter renders an empty window), _sum and _count are cumulative and stay.
        time.sleep(4.2)
        s = _samples(_get(gw.port, "/metrics")[2].decode())
        for qv in ("0", "0.5", "0.99", "1"):
            assert _sum(s, "busbar_request_duration_seconds", quantile=qv, **lab) == 0
        assert _sum(s, "busbar_request_duration_seconds_count", **lab) == 5
        assert _sum(s, "busbar_request_duration_seconds_sum", **lab) == total
        # A new request fills the window again: one observation, every quantile is its time.
        assert _post(gw.port, "oai-model", "again")[0] == 200
        s = _samples(_get(gw.port, "/metrics")[2].decode())
        qs = {_sum(s, "busbar_request_duration_seconds", quantile=qv, **lab)
              for qv in ("0", "0.5", "0.9", "0.95", "0.99", "0.999", "1")}
        one = _sum(s, "busbar_request_duration_seconds_sum", **lab) - total
        assert len(qs) == 1 and abs(qs.pop() - one) < 1e-6
    finally:
        stop(gw.proc)


def test_metrics_off_is_not_mounted(mock_port, tmp_path):
    text = CONFIG.format(port="{port}", mock=mock_port, dead=free_port()) + \
        "export: {access: {module: access-log, settings: {path: \"off\"}}}\n"
    gw = start_gateway(tmp_path, text)
    try:
        # As any unknown path: the data listener's 404 in the caller's protocol.
        st, _, body = _get(gw.port, "/metrics")
        assert st == 404 and b"Unknown request URL" in body
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
