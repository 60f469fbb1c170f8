"""What busbar answers about itself is not an LLM request (issue 34, point 4), through the real
server over real HTTP: /healthz, /stats, the model list and one model, /metrics and the admin
routes add nothing to busbar_requests_total, the access log or the request-log sinks (file and
webhook), while the LLM calls around them are all counted and logged. On 1cbd392 every /healthz
was a request record (pool "unresolved"), so Kubernetes probes drowned the real traffic."""
from __future__ import annotations

import json

from tests.busbar.observability.test_metrics import _get, _post, _samples, _sum
from tests.busbar.observability.test_sinks_traces import Receiver, _wait
from tests.conftest import free_port, start_gateway, stop

CONFIG = """\
listen: "127.0.0.1:{port}"
admin_listen: "127.0.0.1:%(admin)d"
providers:
  m: {protocol: openai, base_url: "http://127.0.0.1:%(mock)d", api_key: {env: MOCK_KEY}}
models:
  oai: {provider: m, upstream_model: gpt-4o-mini}
auth:
  admin_auth: []
export:
  access: {module: access-log, settings: {path: "%(log)s"}}
  metrics: {module: prometheus, settings: {buffer_seconds: 60}}
  file: {module: request-log-file, settings: {path: "%(file)s"}}
  hook: {module: request-log-webhook, settings: {url: "http://127.0.0.1:%(hook)d/hook"}}
"""


def test_local_answers_are_not_request_records(mock_port, tmp_path):
    hook = Receiver()
    admin = free_port()
    log, f = tmp_path / "access.jsonl", tmp_path / "requests.jsonl"
    gw = start_gateway(tmp_path, CONFIG % {"admin": admin, "mock": mock_port, "log": log,
                                           "file": f, "hook": hook.port})
    try:
        # What a probe, a dashboard or an SDK's model discovery asks, several times.
        for _ in range(3):
            for path in ("/healthz", "/stats", "/v1/models", "/v1/models/oai", "/v1beta/models",
                         "/metrics"):
                assert _get(gw.port, path)[0] == 200, path
            for path in ("/healthz", "/api/v1/admin/info", "/metrics"):
                assert _get(admin, path)[0] == 200, path
        # Then the LLM calls: one answered, one refused (an unknown model is still a call).
        assert _post(gw.port, "oai")[0] == 200
        assert _post(gw.port, "no-such-model")[0] == 404
        s = _samples(_get(gw.port, "/metrics")[2].decode())
        assert _sum(s, "busbar_requests_total") == 2
        assert _sum(s, "busbar_requests_total", pool="oai", outcome="ok") == 1
        assert _sum(s, "busbar_requests_total", pool="unresolved", outcome="client_error") == 1
        # Written in the order the requests ended (the webhook's in any order): once the calls'
        # records are there, any record of the local answers before them would be too.
        assert _wait(lambda: f.exists() and len(f.read_text().splitlines()) >= 2)
        assert _wait(lambda: len(hook.got) >= 2)
        assert _wait(lambda: log.exists() and len(log.read_text().splitlines()) >= 2)
        recs = [json.loads(x) for x in log.read_text().splitlines()]
        assert sorted((r["pool"], r["status"]) for r in recs) == [("oai", 200), ("unresolved", 404)]
        for lines in (f.read_text().splitlines(), [b.decode() for _, _, b in hook.got]):
            recs = [json.loads(x) for x in lines]
            assert sorted((r["pool"], r["outcome"]) for r in recs) == [("oai", "ok"),
                                                                        ("unresolved", "client_error")]
    finally:
        stop(gw.proc)
        hook.close()
