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

The same settings in the Rust gateway's 1.5.3 grammar, `export:` (issue #36): named instances of
four modules, plus busbar's own `access-log`; `parse_export` reads them into the same object.

```yaml
export:
  metrics: {module: prometheus, settings: {buffer_seconds: 60, key_gauge_limit: 2000}}
  traces:  {module: otlp, settings: {url: https://collector:4318/v1/traces}}
  hook:    {module: request-log-webhook, settings: {url: https://..., auth_header: {name: authorization,
            value: "Bearer ${TOKEN}"}, max_inflight_deliveries: 64, delivery_timeout_secs: 2}}
  file:    {module: request-log-file, settings: {path: /var/log/busbar/requests.jsonl, rotate_mb: 100}}
  access:  {module: access-log, settings: {path: stderr}}       # busbar's: stderr | <path> | off
```
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


# `export.<name>`: the keys every instance may have, and the modules busbar has built in (the Rust
# gateway's four, and busbar's access log).
EXPORT_KEYS = ("module", "settings", "streams", "fields", "durable")
EXPORT_MODULES = ("prometheus", "otlp", "request-log-webhook", "request-log-file", "access-log")
EXPORT_SETTINGS = {
    "prometheus": ("buffer_seconds", "key_gauge_limit"),
    "otlp": ("url",),
    "request-log-webhook": ("url", "auth_header", "max_inflight_deliveries", "delivery_timeout_secs"),
    "request-log-file": ("path", "rotate_mb"),
    "access-log": ("path",),
}
# The streams an instance may name (the Rust vocabulary); `audit` is refused there too.
STREAMS = ("metrics", "logs", "traces", "costs", "decisions", "events", "identity", "prompts",
           "completions")


def parse_export(section: dict | None, env, base_dir: str, out: Problems) -> Observability:
    """`export:` -> the same Observability `observability:` gives. Nothing exported when absent,
    except busbar's access log to stderr (an `access-log` instance with path: off turns it off)."""
    if section is None:
        return Observability()
    access = "stderr"
    metrics = False
    sinks = []
    otlp = None
    seen = {}
    for name, inst in section.items():
        where = join("export", name)
        if not isinstance(inst, dict):
            out.error(where, f"expected {{module, settings}}, got {describe(inst)}")
            continue
        check_keys(inst, where, EXPORT_KEYS, out)
        module = inst.get("module")
        if module not in EXPORT_MODULES:
            if "module" not in inst:
                out.error(where, "missing required key 'module'")
            else:
                out.error(join(where, "module"), "expected one of %s" % ", ".join(EXPORT_MODULES))
            continue
        if module in ("prometheus", "otlp", "access-log") and module in seen:
            out.error(where, f"at most one {module} instance ({seen[module]} is one)")
            continue
        seen[module] = where
        if inst.get("durable"):
            out.error(join(where, "durable"), "durable delivery is not implemented")
        for key in ("streams", "fields"):
            raw = inst.get(key)
            if raw is not None and (not isinstance(raw, list) or not raw):
                out.error(join(where, key), f"expected a non-empty list, got {describe(raw)}")
        for i, s in enumerate(inst.get("streams") or []):
            if s not in STREAMS:
                out.error(f"{where}.streams[{i}]", "expected one of %s" % ", ".join(STREAMS))
        settings = inst.get("settings") or {}
        if not isinstance(settings, dict):
            out.error(join(where, "settings"), f"expected a mapping, got {describe(settings)}")
            continue
        sw = join(where, "settings")
        check_keys(settings, sw, EXPORT_SETTINGS[module], out)
        if module == "prometheus":
            buf = get_int(settings, "buffer_seconds", sw, out, 1)
            if buf is None:
                out.error(sw, "missing required key 'buffer_seconds'")
            get_int(settings, "key_gauge_limit", sw, out, 0)
            metrics = True
        elif module == "otlp":
            otlp = _otlp({"url": settings.get("url")}, sw, env, base_dir, out)
        elif module == "request-log-file":
            sink = _sink({"kind": "file", **settings, **({"fields": inst["fields"]} if "fields" in inst
                                                           else {})}, sw, env, base_dir, out)
            if sink is not None:
                sinks.append(sink)
        elif module == "request-log-webhook":
            auth = None
            header = settings.get("auth_header")
            if header is not None:
                if not isinstance(header, dict) or set(header) != {"name", "value"} or not all(
                        isinstance(v, str) and v for v in header.values()):
                    out.error(join(sw, "auth_header"), "expected {name, value}: the header to send "
                              "(the value may use ${VAR})")
                elif header["name"].lower() != "authorization":
                    out.error(join(sw, "auth_header.name"), "busbar sends the webhook's credential "
                              "as Authorization")
                else:
                    auth = header["value"]
            body = {"kind": "webhook", "url": settings.get("url")}
            for src, dst in (("max_inflight_deliveries", "max_inflight"),):
                if src in settings:
                    body[dst] = settings[src]
            secs = settings.get("delivery_timeout_secs")
            if secs is not None:
                if isinstance(secs, bool) or not isinstance(secs, int) or secs < 1:
                    out.error(join(sw, "delivery_timeout_secs"), "expected an integer >= 1")
                else:
                    body["timeout_ms"] = secs * 1000
            if "fields" in inst:
                body["fields"] = inst["fields"]
            sink = _sink(body, sw, env, base_dir, out)
            if sink is not None:
                sinks.append(WebhookSink(sink.url, auth, sink.max_inflight, sink.timeout_ms,
                                         sink.fields))
        else:   # access-log
            where_to = settings.get("path", "stderr")
            if where_to is False or where_to is None:
                where_to = "off"
            if not isinstance(where_to, str) or not where_to:
                out.error(join(sw, "path"), f"expected stderr, off or a file path, got {describe(where_to)}")
            else:
                access = where_to
    return Observability("info", access, metrics, False, tuple(sinks), otlp)
