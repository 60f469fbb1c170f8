"""`export:`'s prometheus and request-log settings as the loader reads them: buffer_seconds
(required, 0 refused with the reason) and key_gauge_limit (default 2000) reach the metrics;
`fields:` has no meaning on the metrics or traces streams; a module carries only its own stream;
a request-log `fields:` names the Rust gateway's five fields or busbar's own, nothing else."""
from __future__ import annotations

import textwrap

import pytest

from busbar.config import ConfigError, load

BASE = """
providers:
  anthropic: {api_key: {env: ANTHROPIC_KEY}}
models:
  claude: {provider: anthropic}
"""
ENV = {"ANTHROPIC_KEY": "sk-ant-SECRET"}


def cfg(text):
    return load(text=BASE + textwrap.dedent(text), env=ENV)


def problems(text):
    with pytest.raises(ConfigError) as info:
        cfg(text)
    return info.value.problems


def test_prometheus_settings_reach_the_metrics():
    o = cfg("export: {m: {module: prometheus, settings: {buffer_seconds: 9, key_gauge_limit: 5}}}\n")
    assert (o.observability.metrics, o.observability.buffer_seconds,
            o.observability.key_gauge_limit) == (True, 9, 5)
    o = cfg("export: {m: {module: prometheus, settings: {buffer_seconds: 30}}}\n")
    assert o.observability.key_gauge_limit == 2000
    assert not cfg("export: {a: {module: access-log}}\n").observability.metrics


def test_what_an_instance_cannot_have():
    assert problems("""
        export:
          m: {module: prometheus, settings: {buffer_seconds: 0}, fields: [ts]}
          t: {module: otlp, settings: {url: "https://c.example.org/v1/traces"}, fields: [pool]}
          f: {module: request-log-file, settings: {path: /tmp/x}, streams: [metrics],
              fields: [ts, pool, prompt]}
          g: {module: prometheus, settings: {buffer_seconds: 1.5}}
    """) == [
        "export.m.fields: the metrics stream has no record fields to choose",
        "export.m.settings.buffer_seconds: 0 would keep nothing while still counting; omit the "
        "prometheus instance to turn metrics off",
        "export.t.fields: the traces stream has no record fields to choose",
        "export.f.streams[0]: module request-log-file carries logs, not metrics",
        "export.f.fields: unknown field 'prompt'; fields are: ts, ingress_protocol, pool, "
        "outcome, latency_ms, time, request_id, egress_protocol, lane, upstream_model, stream, "
        "status, busbar_outcome, attempts, busbar_us, upstream_ms, input_tokens, output_tokens, "
        "cached_tokens, reasoning_tokens, key_id, group, client, bytes_out, failures, hooks, "
        "hook_ms",
        "export.g: at most one prometheus instance (export.m is one)",
    ]


def test_a_request_log_projection_keeps_its_order():
    o = cfg("""
        export:
          f: {module: request-log-file, settings: {path: /tmp/x},
              fields: [latency_ms, busbar_outcome, ts]}
    """)
    assert o.observability.request_logs[0].fields == ("latency_ms", "busbar_outcome", "ts")
    assert cfg("""
        export:
          f: {module: request-log-file, settings: {path: /tmp/x}}
    """).observability.request_logs[0].fields is None
