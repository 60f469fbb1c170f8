"""A live config change (the admin API's apply, two workers) that adds hooks, a strategy and
session affinity to a pool: every worker routes and hooks by the new config at once, and the
latency signal the new strategy reads starts being recorded."""
from __future__ import annotations

import http.client
import json

import yaml

from tests.conftest import stop
from tests.integration.test_admin import A, call, start
from tests.sidecar import Sidecar


def _ask(port, model, session=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)     # fresh: either worker
    h = {"content-type": "application/json"}
    if session:
        h["x-session-id"] = session
    c.request("POST", "/v1/chat/completions",
              json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}]}), h)
    r = c.getresponse()
    body = r.read()
    c.close()
    return r.status, json.loads(body)


def test_a_reload_brings_hooks_and_strategies_to_every_worker(tmp_path, mock_port):
    sc = Sidecar({"/g": lambda m: {"reject": {"status": 451, "message": "closed"}}
                  if "nope" in json.dumps(m["request"].get("messages")) else {}})
    g = start(tmp_path, mock_port, workers=2)
    try:
        doc = yaml.safe_load(g.path.read_text())
        doc["pools"]["q"] = {"members": [{"model": "b"}, {"model": "a"}]}
        assert call(g.admin, "POST", A("config/apply"), {"config": doc})[0] == 200
        assert {_ask(g.port, "q")[1]["model"] for _ in range(8)} == {"model-a", "model-b"}
        doc["hooks"] = {"g": {"module": "busbar-webrequest-hook", "settings": {"url": sc.url + "/g"},
                              "prompt": "ro", "timeout_ms": 2000, "on_error": "reject"}}
        doc["pools"]["q"]["hooks"] = ["least_busy", "g"]
        doc["pools"]["q"]["affinity"] = {"mode": "session"}
        st, body = call(g.admin, "POST", A("config/apply"), {"config": doc})
        assert st == 200 and body["workers"] == 2, body
        # least_busy: b's four permits against a lane without max_concurrent (2^61 - 1 free), so
        # a, from either worker, every time.
        assert [_ask(g.port, "q")[1]["model"] for _ in range(8)] == ["model-a"] * 8
        assert len(sc.messages("/g", op="decide")) == 8
        # The gate, from either worker.
        c = http.client.HTTPConnection("127.0.0.1", g.port, timeout=10)
        c.request("POST", "/v1/chat/completions", json.dumps(
            {"model": "q", "messages": [{"role": "user", "content": "nope"}]}),
            {"content-type": "application/json"})
        r = c.getresponse()
        assert r.status == 451 and json.loads(r.read())["error"]["message"] == "closed"
        c.close()
    finally:
        stop(g.proc)
        sc.close()
