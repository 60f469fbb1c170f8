"""The `export:` config section (the Rust gateway's 1.5.3 grammar, issue #36): what busbar records
and where it goes, as named instances of a module each.

```yaml
export:
  metrics: {module: prometheus, settings: {buffer_seconds: 60, key_gauge_limit: 2000}}
  traces:  {module: otlp, settings: {url: https://collector:4318/v1/traces}}
  hook:    {module: request-log-webhook, settings: {url: https://..., auth_header: {name: authorization,
            value: "Bearer ${TOKEN}"}, max_inflight_deliveries: 64, delivery_timeout_secs: 2}}
  file:    {module: request-log-file, settings: {path: /var/log/busbar/requests.jsonl, rotate_mb: 100}}
  access:  {module: access-log, settings: {path: stderr}}       # busbar's: stderr | <path> | off
```
`prometheus` serves /metrics (on the data listener behind the data plane's key chain, as the Rust
gateway does, and on the admin listener), its `buffer_seconds` the window of the latency
quantiles; `otlp` exports a span per request and attempt; the two request-log modules send the
Rust gateway's request record (LOG_FIELDS) to a file or a webhook, a `fields:` list choosing
among those and busbar's own (RECORD_FIELDS) instead;
`access-log` is busbar's own line per request (to stderr when no instance names it). busbar reads
two settings of its own on `otlp`: `sample_ratio` (0-1) and `headers` ({name: secret reference}).
Parsed with the loader's own checks (every problem with its key path); frozen like the rest of
the config. The log level is the environment's (`RUST_LOG`, `BUSBAR_LOG`), not the config's.
"""
from __future__ import annotations

from dataclasses import dataclass

from busbar.config.checks import (Problems, check_keys, describe, get_int, get_mapping, get_str,
                                  join)
from busbar.config.modules import require
from busbar.config.secrets import resolve_secret
from busbar.config.urls import parse_sink_url

# The request-log record (busbar/observability/sinks.py): the Rust gateway's `logs` fields, what
# a sink gets when its instance names no `fields:` ...
LOG_FIELDS = ("ts", "ingress_protocol", "pool", "outcome", "latency_ms")
# ... and busbar's own fields a `fields:` list may name besides them (a Rust config never does:
# the Rust gateway refuses `fields:` on the logs stream).
RECORD_FIELDS = LOG_FIELDS + (
    "time", "request_id", "egress_protocol", "lane", "upstream_model", "stream", "status",
    "busbar_outcome", "attempts", "busbar_us", "upstream_ms", "input_tokens", "output_tokens",
    "cached_tokens", "reasoning_tokens", "key_id", "group", "client", "bytes_out", "failures",
    "hooks", "hook_ms",
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
    # On by default: the first thing an operator reaches for is a line per request. Its cost is a
    # bench row (bench/README.md); `off` removes the hook entirely.
    access_log: str = "stderr"
    # Off by default, as in the reference (SPEC §7: opt-in): off, nothing is counted at all.
    metrics: bool = False
    request_logs: tuple = ()
    otlp: Otlp | None = None
    # prometheus: the seconds of requests the end-to-end latency quantiles cover (its required
    # `buffer_seconds`), and the most per-key governance series one scrape shows (the Rust
    # gateway's default, 2000).
    buffer_seconds: int = 60
    key_gauge_limit: int = 2000


def _fields(raw, where, out):
    """An instance's `fields:` projection of the request record, or None (the whole record)."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not raw:
        out.error(where, f"expected a non-empty list of field names, got {describe(raw)}")
        return None
    for f in raw:
        if f not in RECORD_FIELDS:
            # A field nobody produces is a boot error (SPEC §7), not a silently empty column.
            out.error(where, "unknown field %r; fields are: %s" % (
                f if isinstance(f, str) else describe(f), ", ".join(RECORD_FIELDS)))
            return None
    return tuple(raw)


def _file_sink(settings, fields, where, out):
    """A `request-log-file` instance's settings -> FileSink, or None (reported)."""
    path = get_str(settings, "path", where, out)
    if path is None:
        if "path" not in settings:
            out.error(where, "missing required key 'path'")
        return None
    return FileSink(path, get_int(settings, "rotate_mb", where, out, 0, DEFAULT_ROTATE_MB), fields)


def _webhook_sink(settings, fields, where, env, out):
    """A `request-log-webhook` instance's settings -> WebhookSink, or None (reported). The
    credential is `auth_header: {name, value}` as written (the value may use ${VAR}); busbar sends
    it as Authorization."""
    url = parse_sink_url(settings.get("url"))
    if isinstance(url, str):
        out.error(join(where, "url"), url)
        return None
    require(out, where, "a webhook request log", "aiohttp", getattr(env, "offline", False))
    auth = None
    header = settings.get("auth_header")
    if header is not None:
        if not isinstance(header, dict) or set(header) != {"name", "value"} or not all(
                isinstance(v, str) and v for v in header.values()):
            out.error(join(where, "auth_header"), "expected {name, value}: the header to send "
                      "(the value may use ${VAR})")
        elif header["name"].lower() != "authorization":
            out.error(join(where, "auth_header.name"), "busbar sends the webhook's credential "
                      "as Authorization")
        else:
            auth = header["value"]
    timeout_ms = DEFAULT_TIMEOUT_MS
    secs = get_int(settings, "delivery_timeout_secs", where, out, 1)
    if secs is not None:
        timeout_ms = secs * 1000
    return WebhookSink(settings["url"], auth,
                       get_int(settings, "max_inflight_deliveries", where, out, 1,
                               DEFAULT_MAX_INFLIGHT), timeout_ms, fields)


def _otlp(settings, where, env, base_dir, out):
    """An `otlp` instance's settings -> Otlp, or None (reported). `sample_ratio` and `headers`
    (each a secret reference) are busbar's own settings beside the Rust gateway's `url`."""
    require(out, where, "otlp (trace export)", "aiohttp", getattr(env, "offline", False))
    url = parse_sink_url(settings.get("url"))
    if isinstance(url, str):
        out.error(join(where, "url"), url)
        return None
    ratio = settings.get("sample_ratio", 1.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        out.error(join(where, "sample_ratio"), "expected a number from 0 to 1")
        ratio = 1.0
    headers = []
    raw = get_mapping(settings, "headers", where, out) or {}
    for name, ref in raw.items():
        value = resolve_secret(ref, join(join(where, "headers"), name), env, base_dir, out)
        if value is not None:
            headers.append((str(name), value))
    return Otlp(settings["url"], float(ratio), tuple(headers))


# `export.<name>`: the keys every instance may have, and the modules busbar has built in (the Rust
# gateway's four, and busbar's access log).
EXPORT_KEYS = ("module", "settings", "streams", "fields", "durable")
EXPORT_MODULES = ("prometheus", "otlp", "request-log-webhook", "request-log-file", "access-log")
EXPORT_SETTINGS = {
    "prometheus": ("buffer_seconds", "key_gauge_limit"),
    "otlp": ("url", "sample_ratio", "headers"),       # the last two are busbar's own
    "request-log-webhook": ("url", "auth_header", "max_inflight_deliveries", "delivery_timeout_secs"),
    "request-log-file": ("path", "rotate_mb"),
    "access-log": ("path",),
}
# The streams an instance may name (the Rust vocabulary); `audit` is refused there too.
STREAMS = ("metrics", "logs", "traces", "costs", "decisions", "events", "identity", "prompts",
           "completions")
# What each module carries (a stream it cannot is refused rather than delivering nothing).
MODULE_STREAMS = {"prometheus": ("metrics",), "otlp": ("traces",), "request-log-webhook": ("logs",),
                  "request-log-file": ("logs",), "access-log": ("logs",)}


def parse_export(section: dict | None, env, base_dir: str, out: Problems) -> Observability:
    """`export:` -> Observability. Nothing exported when absent, except busbar's access log to
    stderr (an `access-log` instance with path: off turns it off)."""
    if section is None:
        return Observability()
    access = "stderr"
    metrics = False
    buffer_seconds, key_gauge_limit = 60, 2000
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
        if not isinstance(module, str) or module not in EXPORT_MODULES:
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
        streams = inst.get("streams")
        if streams is not None and (not isinstance(streams, list) or not streams):
            out.error(join(where, "streams"), f"expected a non-empty list, got {describe(streams)}")
        elif streams is not None:
            for i, s in enumerate(streams):
                if s not in STREAMS:
                    out.error(f"{where}.streams[{i}]", "expected one of %s" % ", ".join(STREAMS))
                elif s not in MODULE_STREAMS[module]:
                    out.error(f"{where}.streams[{i}]", "module %s carries %s, not %s" % (
                        module, " and ".join(MODULE_STREAMS[module]), s))
        if "fields" in inst and module in ("prometheus", "otlp"):
            out.error(join(where, "fields"), "the %s stream has no record fields to choose" % (
                MODULE_STREAMS[module][0]))
            fields = None
        else:
            fields = _fields(inst.get("fields"), join(where, "fields"), out)
        settings = inst.get("settings") or {}
        if not isinstance(settings, dict):
            out.error(join(where, "settings"), f"expected a mapping, got {describe(settings)}")
            continue
        sw = join(where, "settings")
        check_keys(settings, sw, EXPORT_SETTINGS[module], out)
        if module == "prometheus":
            buf = settings.get("buffer_seconds")
            if buf is None:
                out.error(sw, "missing required key 'buffer_seconds'")
            elif buf == 0 and not isinstance(buf, bool):
                out.error(join(sw, "buffer_seconds"), "0 would keep nothing while still counting; "
                          "omit the prometheus instance to turn metrics off")
            else:
                buffer_seconds = get_int(settings, "buffer_seconds", sw, out, 1, buffer_seconds)
            key_gauge_limit = get_int(settings, "key_gauge_limit", sw, out, 0, key_gauge_limit)
            metrics = True
        elif module == "otlp":
            otlp = _otlp(settings, sw, env, base_dir, out)
        elif module == "request-log-file":
            sinks.append(_file_sink(settings, fields, sw, out))
        elif module == "request-log-webhook":
            sinks.append(_webhook_sink(settings, fields, sw, env, out))
        else:   # access-log
            where_to = settings.get("path", "stderr")
            if where_to is False or where_to is None:
                where_to = "off"
            if not isinstance(where_to, str) or not where_to:
                out.error(join(sw, "path"), f"expected stderr, off or a file path, got {describe(where_to)}")
            else:
                access = where_to
    return Observability(access, metrics, tuple(s for s in sinks if s is not None), otlp,
                         buffer_seconds, key_gauge_limit)
