"""The `health:` and `on_exhausted: {queue}` keys (busbar/reliability/config.py): defaults, floors,
`path: message` errors, the catalog and top-level defaults; and the probe request of every
protocol, written through the IR (busbar/reliability/health.py)."""
from __future__ import annotations

import json

import pytest

from busbar.config.loader import build
from busbar.reliability.health import probe_request
from busbar.reliability.policy import DEFAULT_HEALTH, DEFAULT_QUEUE_MAX_MS
from cbusbar.proto import codec

ENV = {"K": "sk-xxxxxxxxxxxxxxxx"}


def load(text):
    config, out = build(text=text, env=ENV)
    return config, out.errors, out.warnings


def one(provider_extra="", pool_extra="", top=""):
    return top + """
providers:
  p: {protocol: openai, base_url: "http://127.0.0.1:1", api_key: {env: K}%s}
models:
  a: {provider: p, upstream_model: ua, max_concurrent: 2}
pools:
  one: {members: [{model: a}]%s}
""" % (provider_extra, pool_extra)


def test_health_defaults_and_modes():
    config, errs, _ = load(one())
    assert not errs and config.providers["p"].health == DEFAULT_HEALTH
    assert (DEFAULT_HEALTH.mode, DEFAULT_HEALTH.interval_secs, DEFAULT_HEALTH.timeout_secs) == ("none", 10.0, 5.0)
    config, errs, _ = load(one(", health: {mode: dead}"))
    h = config.providers["p"].health
    assert (h.mode, h.interval_secs, h.timeout_secs) == ("dead", 10.0, 5.0)
    config, errs, _ = load(one(", health: {mode: active, interval_secs: 3}"))
    h = config.providers["p"].health
    assert (h.mode, h.interval_secs, h.timeout_secs) == ("active", 3.0, 3.0)   # timeout <= interval


def test_health_errors_and_floors_are_said_with_their_path():
    _, errs, warns = load(one(", health: {mode: sometimes, interval_secs: 0.2, timeout_secs: 9, x: 1}"))
    assert errs == ["providers.p.health.x: unknown key",
                    "providers.p.health.mode: expected none, dead or active",
                    "providers.p.health.timeout_secs: must be <= interval_secs (1)"]
    assert warns == ["providers.p.health.interval_secs: raised to the 1 s floor (got 0.2)"]
    _, errs, _ = load(one(", health: dead"))
    assert errs == ["providers.p.health: expected a mapping {mode, interval_secs, timeout_secs}, got a string"]
    _, errs, _ = load(one(", upstream_credentials: passthrough, health: {mode: active}"))
    assert errs == ["providers.p.health.mode: a probe needs busbar's own key, and a provider with "
                    "upstream_credentials: passthrough holds none; use mode: none"]


def test_top_level_defaults_and_the_catalog():
    config, errs, _ = load(one(", health: {mode: dead}",
                               top="health: {default_probe_interval_secs: 20, default_probe_timeout_secs: 2}\n"))
    h = config.providers["p"].health
    assert not errs and (h.mode, h.interval_secs, h.timeout_secs) == ("dead", 20.0, 2.0)
    _, errs, _ = load(one(top="health: {default_probe_interval_secs: 2, default_probe_timeout_secs: 3, "
                              "interval_secs: 1}\n"))
    assert errs == ["health.interval_secs: unknown key (did you mean 'default_probe_interval_secs'?)",
                    "health.default_probe_timeout_secs: must be <= default_probe_interval_secs (2)"]


def test_catalog_health_is_the_providers_default(tmp_path):
    cat = tmp_path / "providers.yaml"
    cat.write_text('acme: {protocol: openai, base_url: "http://127.0.0.1:1", '
                   'health: {mode: dead, interval_secs: 7}}\n')
    text = """
providers_file: %s
providers:
  acme: {api_key: {env: K}}
  acme2: {catalog: acme, api_key: {env: K}, health: {interval_secs: 4}}
models:
  a: {provider: acme, upstream_model: ua}
  b: {provider: acme2, upstream_model: ub}
""" % cat
    config, out = build(text=text, env=ENV, base_dir=str(tmp_path))
    assert config is not None, out.errors
    assert (config.providers["acme"].health.mode, config.providers["acme"].health.interval_secs) == ("dead", 7.0)
    assert (config.providers["acme2"].health.mode, config.providers["acme2"].health.interval_secs) == ("dead", 4.0)


def test_health_is_not_part_of_provider_equality():
    a, _, _ = load(one(", health: {mode: dead}"))
    b, _, _ = load(one(", health: {mode: active, interval_secs: 2}"))
    # A reload that changes only probing keeps the lanes (permits, breaker cells).
    assert a.models["a"] == b.models["a"]


def test_queue_defaults_bounds_and_errors():
    config, errs, _ = load(one(pool_extra=", on_exhausted: {queue: {max_ms: 2500}}"))
    oe = config.pools["one"].on_exhausted
    assert not errs and (oe.kind, oe.queue_max_ms) == ("queue", 2500)
    config, errs, _ = load(one(pool_extra=", on_exhausted: {queue: {}}"))
    assert config.pools["one"].on_exhausted.queue_max_ms == DEFAULT_QUEUE_MAX_MS == 10_000
    # Without max_ms, a short failover budget bounds the default.
    config, errs, _ = load(one(pool_extra=", on_exhausted: {queue: {}}, failover: {timeout_secs: 3}"))
    assert config.pools["one"].on_exhausted.queue_max_ms == 3000
    _, errs, _ = load(one(pool_extra=", on_exhausted: {queue: {max_ms: 5000}}, failover: {timeout_secs: 3}"))
    assert errs == ["pools.one.on_exhausted.queue.max_ms: must be <= failover.timeout_secs x 1000 (3000), got 5000"]
    _, errs, _ = load(one(pool_extra=", on_exhausted: {queue: {max_ms: 0, wait: 1}}"))
    assert errs == ["pools.one.on_exhausted.queue.wait: unknown key",
                    "pools.one.on_exhausted.queue.max_ms: must be >= 1, got 0"]
    _, errs, _ = load(one(pool_extra=", on_exhausted: {queue: 5}"))
    assert errs == ["pools.one.on_exhausted.queue: expected a mapping {max_ms: N}, got an integer"]


@pytest.mark.parametrize("proto", ["openai", "responses", "anthropic", "gemini", "cohere", "bedrock",
                                   "bedrock-invoke"])
def test_probe_request_is_one_token_in_the_lanes_protocol(proto):
    c = codec(proto)
    body, path = probe_request(c, "m-1")
    doc = json.loads(body)
    text = json.dumps(doc)
    assert "ping" in text
    limit = {"openai": ("max_tokens", 1), "responses": ("max_output_tokens", 16),
             "anthropic": ("max_tokens", 1), "cohere": ("max_tokens", 1),
             "bedrock-invoke": ("max_tokens", 1)}
    if proto == "gemini":
        assert doc["generationConfig"]["maxOutputTokens"] == 1
    elif proto == "bedrock":
        assert doc["inferenceConfig"]["maxTokens"] == 1
    else:
        k, v = limit[proto]
        assert doc[k] == v
    assert "stream" not in doc or doc["stream"] is False
    assert path == c.upstream_path("m-1", False)
