"""The `observability:` config section: what busbar records and where it goes.

```yaml
observability:
  log_level: info              # operational events (BUSBAR_LOG overrides); debug shows every attempt
  access_log: stderr           # stderr | <path> | off: one JSON line per request
  metrics: false               # /metrics (Prometheus text 0.0.4) on the admin listener
  metrics_public: false        # also serve /metrics on the data listener, without auth
  request_logs:                # the request record as JSON, to any number of sinks
    - {kind: file, path: /var/log/busbar/requests.jsonl, rotate_mb: 100, fields: [...]}
    - {kind: webhook, url: https://..., auth_header: {env: NAME}, max_inflight: 64, timeout_ms: 2000}
  otlp: {url: https://collector:4318/v1/traces, sample_ratio: 1.0, headers: {name: {env: NAME}}}
```
Parsed with the loader's own checks (every problem with its key path); frozen like the rest of
the config.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from busbar.config.checks import (Problems, check_keys, describe, get_bool, get_int, get_mapping,
                                  get_str, join)
from busbar.config.modules import require
from busbar.config.secrets import resolve_secret
from busbar.config.urls import parse_sink_url

KEYS = ("log_level", "access_log", "metrics", "metrics_public", "request_logs", "otlp")
# Where the retired 1.4 key went (it lived under this section).
RENAMED = {"emit_server_timing": "retired key; use advanced.response_headers.server_timing"}
LOG_LEVELS = ("debug", "info", "warning", "error")
FILE_SINK_KEYS = ("kind", "path", "rotate_mb", "fields")
WEBHOOK_SINK_KEYS = ("kind", "url", "auth_header", "max_inflight", "timeout_ms", "fields")
OTLP_KEYS = ("url", "sample_ratio", "headers")

# What a request-log record holds (busbar/observability/records.py), for `fields:` projections.
RECORD_FIELDS = (
    "time", "request_id", "ingress_protocol", "egress_protocol", "pool", "lane", "upstream_model",
    "stream", "status", "outcome", "attempts", "busbar_us", "upstream_ms", "input_tokens",
    "output_tokens", "cached_tokens", "reasoning_tokens", "key_id", "group", "client", "bytes_out",
    "failures",
)

# A rotated request-log file: 100 MiB, logrotate's common `size 100M`; 0 turns rotation off.
DEFAULT_ROTATE_MB = 100
# Webhook deliveries in flight at once before new records are dropped (SPEC §7: 64).
DEFAULT_MAX_INFLIGHT = 64
# A webhook delivery's whole bound (SPEC §7: delivery_timeout_secs 2): a slow receiver must not
# pile up connections; its records are dropped and counted instead.
DEFAULT_TIMEOUT_MS = 2000


@dataclass(frozen=True, slots=True)
class FileSink:
    path: str
    rotate_mb: int = DEFAULT_ROTATE_MB
    fields: tuple[str, ...] | None = None
    kind: str = "file"


@dataclass(frozen=True, slots=True)
class WebhookSink:
    url: str
    auth_header: str | None = None
    max_inflight: int = DEFAULT_MAX_INFLIGHT
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    fields: tuple[str, ...] | None = None
    kind: str = "webhook"

    def __repr__(self) -> str:  # never the auth header's value
        return f"WebhookSink(url={self.url!r}, max_inflight={self.max_inflight})"


@dataclass(frozen=True, slots=True)
class Otlp:
    url: str
    sample_ratio: float = 1.0
    headers: tuple[tuple[str, str], ...] = ()

    def __repr__(self) -> str:
        return f"Otlp(url={self.url!r}, sample_ratio={self.sample_ratio})"


@dataclass(frozen=True, slots=True)
class Observability:
    # info: boot, reload and degraded states show; every attempt's failure shows at debug only
    # (SPEC §7: the hot path logs at DEBUG), except a lane refusing busbar's credentials.
    log_level: str = "info"
    # On by default: the first thing an operator reaches for is a line per request. Its cost is a
    # bench row (bench/README.md); `off` removes the hook entirely.
    access_log: str = "stderr"
    # Off by default, as in the reference (SPEC §7: opt-in): off, nothing is counted at all.
    metrics: bool = False
    metrics_public: bool = False
    request_logs: tuple = ()
    otlp: Otlp | None = None

    @property
    def level(self) -> int:
        return getattr(logging, self.log_level.upper())


def parse(section: dict | None, env, base_dir: str, out: Problems) -> Observability:
    if section is None:
        return Observability()
    path = "observability"
    check_keys(section, path, KEYS, out, renamed=RENAMED)
    level = get_str(section, "log_level", path, out, "info")
    if level.lower() not in LOG_LEVELS:
        out.error(join(path, "log_level"), "expected one of " + ", ".join(LOG_LEVELS))
        level = "info"
    access = section.get("access_log", "stderr")
    if access is False or access is None:
        access = "off"
    if not isinstance(access, str) or not access:
        out.error(join(path, "access_log"), f"expected stderr, off or a file path, got {describe(access)}")
        access = "stderr"
    metrics = bool(get_bool(section, "metrics", path, out, False))
    public = bool(get_bool(section, "metrics_public", path, out, False))
    if public and not metrics:
        out.error(join(path, "metrics_public"), "needs metrics: true")
    sinks = []
    raw = section.get("request_logs")
    if raw is not None:
        if not isinstance(raw, list):
            out.error(join(path, "request_logs"), f"expected a list, got {describe(raw)}")
        else:
            for i, entry in enumerate(raw):
                sink = _sink(entry, "%s.request_logs[%d]" % (path, i), env, base_dir, out)
                if sink is not None:
                    sinks.append(sink)
    otlp = _otlp(get_mapping(section, "otlp", path, out), join(path, "otlp"), env, base_dir, out)
    return Observability(level.lower(), access, metrics, public, tuple(sinks), otlp)


def _fields(entry, where, out):
    raw = entry.get("fields")
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        out.error(join(where, "fields"), f"expected a non-empty list of field names, got {describe(raw)}")
        return None
    for f in raw:
        if f not in RECORD_FIELDS:
            # A field nobody produces is a boot error (SPEC §7), not a silently empty column.
            out.error(join(where, "fields"), "unknown field %r; fields are: %s" % (
                f if isinstance(f, str) else describe(f), ", ".join(RECORD_FIELDS)))
            return None
    return tuple(raw)


def _sink(entry, where, env, base_dir, out):
    if not isinstance(entry, dict):
        out.error(where, f"expected a mapping, got {describe(entry)}")
        return None
    kind = entry.get("kind")
    if kind == "file":
        check_keys(entry, where, FILE_SINK_KEYS, out)
        p = get_str(entry, "path", where, out)
        if p is None:
            out.error(join(where, "path"), "required")
            return None
        return FileSink(p, get_int(entry, "rotate_mb", where, out, 0, DEFAULT_ROTATE_MB),
                        _fields(entry, where, out))
    if kind == "webhook":
        check_keys(entry, where, WEBHOOK_SINK_KEYS, out)
        url = parse_sink_url(entry.get("url"))
        if isinstance(url, str):
            out.error(join(where, "url"), url)
            return None
        require(out, join(where, "kind"), "a webhook request log", "aiohttp",
                getattr(env, "offline", False))
        auth = None
        if entry.get("auth_header") is not None:
            auth = resolve_secret(entry["auth_header"], join(where, "auth_header"), env, base_dir, out)
        return WebhookSink(entry["url"], auth,
                           get_int(entry, "max_inflight", where, out, 1, DEFAULT_MAX_INFLIGHT),
                           get_int(entry, "timeout_ms", where, out, 1, DEFAULT_TIMEOUT_MS),
                           _fields(entry, where, out))
    out.error(join(where, "kind"), "expected file or webhook")
    return None


def _otlp(section, where, env, base_dir, out):
    if section is None:
        return None
    check_keys(section, where, OTLP_KEYS, out)
    require(out, where, "otlp (trace export)", "aiohttp", getattr(env, "offline", False))
    url = parse_sink_url(section.get("url"))
    if isinstance(url, str):
        out.error(join(where, "url"), url)
        return None
    ratio = section.get("sample_ratio", 1.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        out.error(join(where, "sample_ratio"), "expected a number from 0 to 1")
        ratio = 1.0
    headers = []
    raw = get_mapping(section, "headers", where, out) or {}
    for name, ref in raw.items():
        value = resolve_secret(ref, join(join(where, "headers"), name), env, base_dir, out)
        if value is not None:
            headers.append((str(name), value))
    return Otlp(section["url"], float(ratio), tuple(headers))
