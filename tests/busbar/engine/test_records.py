"""The lifecycle's two exits, observed through their hooks on a real server over real HTTP (an
in-process gateway on its own loop thread, the mock as upstream): every request ends in exactly one
RequestRecord with its usage read on every path (same-protocol buffered and streamed, translated
buffered and streamed), and every attempt in exactly one Attempt."""
import http.client
import json
import time

import pytest

from busbar.engine.records import F_CONNECT, O_CLIENT_ERROR, O_OK
from tests.conftest import CONFIG, free_port
from tests.inproc import InprocGateway


@pytest.fixture(scope="module")
def site(mock_port):
    box = {"records": [], "attempts": []}

    def hooks(gw):
        gw.finish_hooks.append(box["records"].append)
        gw.attempt_hooks.append(lambda ex, a: box["attempts"].append(a))
    with InprocGateway(CONFIG.format(port="{port}", mock=mock_port, dead=free_port()),
                       setup=hooks) as g:
        box["gw"], box["port"] = g.gw, g.port
        yield box


def _post(site, path, body, headers=None):
    site["records"].clear()
    site["attempts"].clear()
    c = http.client.HTTPConnection("127.0.0.1", site["port"], timeout=10)
    h = {"content-type": "application/json"}
    h.update(headers or {})
    c.request("POST", path, json.dumps(body), h)
    r = c.getresponse()
    data = r.read()
    c.close()
    # The answer is written before the hooks run (they never delay it): wait for the record.
    deadline = time.monotonic() + 2
    while not site["records"] and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.02)
    (rec,) = site["records"]       # exactly one record per request
    return r.status, data, rec


ANT = {"anthropic-version": "2023-06-01"}


def _events(data):
    return [json.loads(line[6:]) for line in data.split(b"\n")
            if line.startswith(b"data: ") and line != b"data: [DONE]"]


def test_same_protocol_buffered_usage(site):
    status, data, rec = _post(site, "/v1/chat/completions", {
        "model": "oai-model", "messages": [{"role": "user", "content": "count these words"}]})
    u = json.loads(data)["usage"]
    assert status == 200 and rec.outcome == O_OK and rec.status == 200
    assert (rec.usage.input_tokens, rec.usage.output_tokens) == (u["prompt_tokens"],
                                                                 u["completion_tokens"])
    assert (rec.ingress, rec.egress, rec.target, rec.lane) == ("openai", "openai", "oai-model",
                                                               "oai-model")
    assert len(rec.attempts) == 1 and rec.attempts[0].fault is None
    assert site["attempts"] == list(rec.attempts)


def test_same_protocol_stream_usage_from_the_tap(site):
    status, data, rec = _post(site, "/v1/chat/completions", {
        "model": "oai-model", "stream": True, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": "count these words"}]})
    u = [e for e in _events(data) if e.get("usage")][-1]["usage"]
    assert status == 200 and rec.outcome == O_OK and rec.stream
    assert (rec.usage.input_tokens, rec.usage.output_tokens) == (u["prompt_tokens"],
                                                                 u["completion_tokens"])


def test_translated_buffered_usage(site):
    status, data, rec = _post(site, "/v1/messages", {
        "model": "oai-model", "max_tokens": 64,
        "messages": [{"role": "user", "content": "count these words"}]}, ANT)
    u = json.loads(data)["usage"]
    assert status == 200 and rec.egress == "openai" and rec.ingress == "anthropic"
    assert rec.usage.output_tokens == u["output_tokens"] > 0
    assert rec.usage.input_tokens == u["input_tokens"] > 0


def test_translated_stream_usage(site):
    status, data, rec = _post(site, "/v1/messages", {
        "model": "oai-model", "max_tokens": 64, "stream": True,
        "messages": [{"role": "user", "content": "count these words"}]}, ANT)
    delta = [e for e in _events(data) if e.get("type") == "message_delta"][-1]
    assert status == 200 and rec.outcome == O_OK
    assert rec.usage.output_tokens == delta["usage"]["output_tokens"] > 0


def test_failover_shows_each_attempt_once(site):
    status, data, rec = _post(site, "/v1/chat/completions", {
        "model": "failover", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and rec.outcome == O_OK and rec.target == "failover"
    assert [(a.lane.name, a.fault) for a in rec.attempts] == [("dead-model", F_CONNECT),
                                                               ("ant-model", None)]
    assert rec.lane == "ant-model" and rec.egress == "anthropic"
    assert site["attempts"] == list(rec.attempts)


def test_a_refused_request_is_one_record_without_attempts(site):
    status, data, rec = _post(site, "/v1/chat/completions", {
        "model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 404 and rec.outcome == O_CLIENT_ERROR and rec.status == 404
    assert rec.attempts == () and rec.usage is None and rec.target is None


def test_a_failing_hook_costs_nothing_but_its_own_work(site):
    gw = site["gw"]

    def broken(*_):
        raise RuntimeError("observer bug")

    gw.finish_hooks.insert(0, broken)
    gw.attempt_hooks.insert(0, broken)
    try:
        status, data, rec = _post(site, "/v1/chat/completions", {
            "model": "oai-model", "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200 and rec.outcome == O_OK and len(site["attempts"]) == 1
    finally:
        gw.finish_hooks.remove(broken)
        gw.attempt_hooks.remove(broken)
