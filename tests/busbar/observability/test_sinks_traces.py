"""OTLP traces, request-log sinks (file and webhook) and the sink SSRF rules, through the real
server: a small OTLP/HTTP receiver, a webhook receiver and a recording OpenAI upstream, all written
here on 127.0.0.1. A request-log record is the Rust gateway's ({ts, ingress_protocol, pool,
outcome, latency_ms}) unless the instance's `fields:` chooses busbar's own; a sink that is full
drops and counts (busbar_webhook_logs_dropped_total, busbar_file_logs_dropped_total and
busbar_admission_denied_total{gate}), a delivery that fails is counted as a dropped record."""
from __future__ import annotations

import http.client
import http.server
import json
import threading
import time

import pytest

from busbar.config.urls import parse_sink_url
from tests.conftest import start_gateway, stop

CHAT = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}


class Receiver:
    """Records (path, headers, body) of every POST; answers `answer` (status, body)."""

    def __init__(self, answer=(200, b"{}")):
        got = self.got = []
        status, body = answer

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                n = int(self.headers.get("content-length") or 0)
                got.append((self.path, {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(n)))
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _post(port, model, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request("POST", "/v1/chat/completions", json.dumps(
            {"model": model, "messages": [{"role": "user", "content": "secret prompt text"}]}),
            {"content-type": "application/json", **(headers or {})})
        r = c.getresponse()
        return r.status, r.read()
    finally:
        c.close()


def _wait(pred, secs=8):
    deadline = time.monotonic() + secs
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


CONFIG = """\
listen: "127.0.0.1:{port}"
providers:
  up:   {protocol: openai, base_url: "http://127.0.0.1:%(up)d", api_key: {env: MOCK_KEY}}
  dead: {protocol: openai, base_url: "http://127.0.0.1:%(dead)d", api_key: {env: MOCK_KEY}}
models:
  good: {provider: up, upstream_model: gpt-x}
  gone: {provider: dead, upstream_model: gpt-gone}
pools:
  p:
    members:
      - {model: gone, weight: 100}
      - {model: good, weight: 1}
export:
  access: {module: access-log, settings: {path: "off"}}
  prom:   {module: prometheus, settings: {buffer_seconds: 10}}
  traces: {module: otlp, settings: {url: "http://127.0.0.1:%(otlp)d/v1/traces",
           headers: {x-otlp-token: {env: MOCK_KEY}}}}
  file:   {module: request-log-file, settings: {path: "%(file)s", rotate_mb: 1}}
  hook:   {module: request-log-webhook, settings: {url: "http://127.0.0.1:%(hook)d/hook",
           auth_header: {name: authorization, value: "${MOCK_KEY}"}%(hook_more)s}}
  proj:   {module: request-log-file, settings: {path: "%(proj)s"},
           fields: [request_id, pool, outcome, busbar_outcome, attempts, failures, input_tokens]}
"""


def test_traces_sinks_and_traceparent(tmp_path):
    from tests.conftest import free_port
    up = Receiver((200, json.dumps(CHAT).encode()))
    otlp = Receiver()
    hook = Receiver()
    f, proj = tmp_path / "req.jsonl", tmp_path / "proj.jsonl"
    text = CONFIG % {"up": up.port, "dead": free_port(), "otlp": otlp.port, "hook": hook.port,
                     "file": f, "proj": proj, "hook_more": ""}
    t0 = time.time()
    gw = start_gateway(tmp_path, text)
    try:
        trace = "4bf92f3577b34da6a3ce929d0e0e4736"
        parent = "00f067aa0ba902b7"
        assert _post(gw.port, "p", {"traceparent": "00-%s-%s-01" % (trace, parent)})[0] == 200
        assert _post(gw.port, "good")[0] == 200
        # Upstream saw the client's trace id, with an attempt span as its parent.
        tps = [h.get("traceparent") for _, h, _ in up.got]
        assert tps[0].startswith("00-%s-" % trace) and tps[0].endswith("-01")
        assert tps[0].split("-")[2] != parent
        assert tps[1] and trace not in tps[1]
        # Spans: flushed within ~1 s.
        assert _wait(lambda: sum(len(_spans(b)) for _, _, b in otlp.got) >= 5)
        assert otlp.got[0][0] == "/v1/traces" and otlp.got[0][1]["x-otlp-token"] == "sk-test-key"
        spans = [s for _, _, b in otlp.got for s in _spans(b)]
        mine = [s for s in spans if s["traceId"] == trace]
        root = next(s for s in mine if s.get("parentSpanId") == parent)
        kids = [s for s in mine if s.get("parentSpanId") == root["spanId"]]
        assert len(kids) == 2     # the dead lane, then the good one
        a = {x["key"]: list(x["value"].values())[0] for x in root["attributes"]}
        assert a["gen_ai.request.model"] == "p" and a["gen_ai.response.model"] == "gpt-x"
        assert a["gen_ai.system"] == "openai" and a["gen_ai.usage.input_tokens"] == "11"
        assert a["gen_ai.usage.output_tokens"] == "7" and a["busbar.outcome"] == "ok"
        failed = next(k for k in kids if k["status"]["code"] == 2)
        fa = {x["key"]: list(x["value"].values())[0] for x in failed["attributes"]}
        assert fa["busbar.failover_reason"] == "connect" and fa["busbar.lane"] == "gone"
        # The upstream's traceparent names the good attempt's span.
        ok_kid = next(k for k in kids if k["status"]["code"] == 1)
        assert tps[0].split("-")[2] == ok_kid["spanId"]
        # Sinks: file and webhook (with its auth header) the Rust gateway's record, the
        # projected file the fields it names.
        assert _wait(lambda: f.exists() and len(f.read_text().splitlines()) >= 2)
        recs = [json.loads(x) for x in f.read_text().splitlines()]
        for r in recs:
            assert list(r) == ["ts", "ingress_protocol", "pool", "outcome", "latency_ms"], r
            assert isinstance(r["ts"], int) and int(t0) <= r["ts"] <= time.time()
            assert isinstance(r["latency_ms"], int) and 0 <= r["latency_ms"] < 20_000
        r = next(r for r in recs if r["pool"] == "p")
        assert r["ingress_protocol"] == "openai" and r["outcome"] == "ok"
        assert _wait(lambda: len(hook.got) >= 2)
        assert hook.got[0][1]["authorization"] == "sk-test-key"
        hooked = [json.loads(b) for _, _, b in hook.got]
        assert {h["pool"] for h in hooked} >= {"p", "good"}
        assert all(set(h) == set(recs[0]) for h in hooked)
        assert _wait(lambda: proj.exists() and len(proj.read_text().splitlines()) >= 2)
        pr = [json.loads(x) for x in proj.read_text().splitlines()]
        assert [list(x) for x in pr] == [["request_id", "pool", "outcome", "busbar_outcome",
                                         "attempts", "failures", "input_tokens"]] * len(pr)
        x = next(x for x in pr if x["pool"] == "p")
        assert x["failures"][0]["lane"] == "gone" and x["attempts"] == 2 and x["input_tokens"] == 11
        assert x["outcome"] == x["busbar_outcome"] == "ok" and x["request_id"].startswith("req_")
        for text_ in (f.read_text(), proj.read_text()) + tuple(b.decode() for _, _, b in hook.got + otlp.got):
            assert "secret prompt text" not in text_ and "hello" not in text_
    finally:
        stop(gw.proc)
        for r in (up, otlp, hook):
            r.close()


def _spans(body):
    d = json.loads(body)
    return [s for rs in d["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]


def test_webhook_drops_are_counted(tmp_path):
    from tests.conftest import free_port
    up = Receiver((200, json.dumps(CHAT).encode()))
    text = CONFIG % {"up": up.port, "dead": free_port(), "otlp": free_port(), "hook": free_port(),
                     "file": tmp_path / "a", "proj": tmp_path / "b", "hook_more": ""}
    gw = start_gateway(tmp_path, text)
    try:
        for _ in range(3):
            assert _post(gw.port, "good")[0] == 200
        # Nothing listens on the webhook's port: each delivery fails and is counted as a dropped
        # record; none was shed for a full sink.
        assert _wait(lambda: _metric(gw.port, 'busbar_records_dropped_total{sink="request_log_1_webhook"}') >= 3)
        assert _metric(gw.port, "busbar_webhook_logs_dropped_total") == 0
        assert _metric(gw.port, 'busbar_admission_denied_total{gate="webhook"}') == 0
    finally:
        stop(gw.proc)
        up.close()


def _metric(port, head):
    """The value of the series whose line starts with `head` in the data listener's /metrics."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    c.close()
    for line in body.splitlines():
        if line.startswith(head + " "):
            return int(float(line.split()[-1]))
    return None


def test_a_full_webhook_sink_sheds_and_counts(tmp_path):
    import socket

    from tests.conftest import free_port
    up = Receiver((200, json.dumps(CHAT).encode()))
    # A receiver that takes the connection and never answers: the one delivery allowed in flight
    # stays there, and every record after it finds the sink full.
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    text = CONFIG % {"up": up.port, "dead": free_port(), "otlp": free_port(),
                     "hook": silent.getsockname()[1], "file": tmp_path / "a", "proj": tmp_path / "b",
                     "hook_more": ", max_inflight_deliveries: 1, delivery_timeout_secs: 5"}
    gw = start_gateway(tmp_path, text)
    try:
        for _ in range(5):
            assert _post(gw.port, "good")[0] == 200
        assert _wait(lambda: _metric(gw.port, "busbar_webhook_logs_dropped_total") == 4)
        assert _metric(gw.port, 'busbar_admission_denied_total{gate="webhook"}') == 4
        assert _metric(gw.port, 'busbar_records_dropped_total{sink="request_log_1_webhook"}') == 4
        assert _metric(gw.port, "busbar_file_logs_dropped_total") == 0
    finally:
        stop(gw.proc)
        up.close()
        silent.close()


def test_a_full_file_sink_sheds_and_counts(inproc_gateway, monkeypatch, tmp_path):
    from busbar import observability
    from busbar.observability import lines
    from tests.conftest import free_port
    # A writer that holds no more than what is pending: while its thread waits out a flush
    # period, every line after the first finds it full.
    monkeypatch.setattr(lines, "MAX_BUFFERED", 0)
    up = Receiver((200, json.dumps(CHAT).encode()))
    f = tmp_path / "a"
    text = CONFIG % {"up": up.port, "dead": free_port(), "otlp": free_port(), "hook": free_port(),
                     "file": f, "proj": tmp_path / "b", "hook_more": ""}
    g = inproc_gateway(text, setup=observability.install)
    try:
        n = 6
        for _ in range(n):
            assert _post(g.port, "good")[0] == 200
        # Two file sinks (this one and the projected one): the counter is theirs together.
        shed = _metric(g.port, "busbar_file_logs_dropped_total")
        assert _metric(g.port, 'busbar_admission_denied_total{gate="request-log-file"}') == shed
        mine = _metric(g.port, 'busbar_records_dropped_total{sink="request_log_0_file"}')
        other = _metric(g.port, 'busbar_records_dropped_total{sink="request_log_2_file"}')
        assert mine >= 1 and other >= 1 and mine + other == shed
        assert _wait(lambda: f.exists() and len(f.read_text().splitlines()) == n - mine)
    finally:
        up.close()


@pytest.mark.parametrize("url,ok", [
    ("https://logs.example.com/hook", True),
    ("http://127.0.0.1:9/hook", True),
    ("http://localhost:4318/v1/traces", True),
    ("http://logs.example.com/hook", False),
    ("https://10.1.2.3/hook", False),
    ("https://192.168.0.5/hook", False),
    ("https://172.20.0.1/hook", False),
    ("https://100.64.1.1/hook", False),
    ("https://169.254.169.254/latest", False),
    ("https://[fe80::1]/x", False),
    ("https://metadata.google.internal/x", False),
    ("https://0xa9fea9fe/x", False),
])
def test_sink_ssrf_rules(url, ok):
    assert isinstance(parse_sink_url(url), str) != ok
