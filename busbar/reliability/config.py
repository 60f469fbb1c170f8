"""Reading the reliability keys of a config (SPEC §4): pool `breaker`, `failover`, `on_exhausted`;
provider `error_map`, `upstream_credentials`, `health`. Called from busbar/config/loader.py; every
problem is recorded with its key path, as the rest of the loader does."""
from __future__ import annotations

import math

from busbar.config.checks import (Problems, check_keys, describe, get_int, get_mapping,
                                  get_seconds, get_str, join)
from busbar.reliability.policy import (
    DEFAULT_BREAKER, DEFAULT_FAILOVER, DEFAULT_HEALTH, DEFAULT_ON_EXHAUSTED, DEFAULT_QUEUE_MAX_MS,
    ERROR_CLASSES,
    BreakerPolicy, FailoverPolicy, HealthPolicy, OnExhausted)

BREAKER_KEYS = ("trip", "base_cooldown_secs", "max_cooldown_secs")
TRIP_KEYS = ("mode", "threshold", "window_secs", "min_requests", "consecutive_n")
FAILOVER_KEYS = ("timeout_secs", "max_hops", "exclusions")
HEALTH_KEYS = ("mode", "interval_secs", "timeout_secs")
HEALTH_DEFAULT_KEYS = ("default_probe_interval_secs", "default_probe_timeout_secs")
QUEUE_KEYS = ("max_ms",)
HEALTH_MODES = ("none", "dead", "active")
CREDENTIAL_MODES = ("own", "passthrough")
# failover.timeout_secs is capped at a day, as the reference caps it.
MAX_TIMEOUT_SECS = 86400.0


def breaker(section: dict | None, path: str, out: Problems) -> BreakerPolicy:
    if section is None:
        return DEFAULT_BREAKER
    path = join(path, "breaker")
    check_keys(section, path, BREAKER_KEYS, out)
    d = DEFAULT_BREAKER
    trip = get_mapping(section, "trip", path, out) or {}
    tpath = join(path, "trip")
    check_keys(trip, tpath, TRIP_KEYS, out)
    mode = get_str(trip, "mode", tpath, out, d.mode)
    if mode not in ("error_rate", "consecutive"):
        out.error(join(tpath, "mode"), "expected error_rate or consecutive")
        mode = d.mode
    threshold = trip.get("threshold", d.threshold)
    if (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
            or not math.isfinite(threshold) or not 0 < threshold <= 1):
        out.error(join(tpath, "threshold"), "expected a number in (0, 1]")
        threshold = d.threshold
    window = get_seconds(trip, "window_secs", tpath, out, d.window_secs)
    min_requests = get_int(trip, "min_requests", tpath, out, 1, d.min_requests)
    consecutive_n = get_int(trip, "consecutive_n", tpath, out, 1, d.consecutive_n)
    base = get_seconds(section, "base_cooldown_secs", path, out, d.base_cooldown_secs)
    top = get_seconds(section, "max_cooldown_secs", path, out, max(d.max_cooldown_secs, base))
    if top < base:
        out.error(join(path, "max_cooldown_secs"), "must be >= base_cooldown_secs")
    return BreakerPolicy(mode, float(threshold), window, min_requests, consecutive_n, base, top)


def failover(section: dict | None, path: str, members: list[str], out: Problems) -> FailoverPolicy:
    if section is None:
        return DEFAULT_FAILOVER
    path = join(path, "failover")
    check_keys(section, path, FAILOVER_KEYS, out)
    timeout = get_seconds(section, "timeout_secs", path, out, DEFAULT_FAILOVER.timeout_secs)
    if timeout > MAX_TIMEOUT_SECS:
        out.error(join(path, "timeout_secs"), "must be <= 86400")
    hops = get_int(section, "max_hops", path, out, 0, DEFAULT_FAILOVER.max_hops)
    raw = section.get("exclusions") or []
    excl = []
    if not isinstance(raw, list):
        out.error(join(path, "exclusions"), f"expected a list of member models, got {describe(raw)}")
        raw = []
    for i, m in enumerate(raw):
        if m not in members:
            out.error(f"{join(path, 'exclusions')}[{i}]", "not a member of this pool")
        else:
            excl.append(m)
    return FailoverPolicy(timeout, hops, tuple(excl))


def on_exhausted(value: object, path: str, timeout_secs: float, out: Problems) -> OnExhausted:
    path = join(path, "on_exhausted")
    if value is None:
        return DEFAULT_ON_EXHAUSTED
    if value in ("reject", "least_bad"):
        return OnExhausted(value)
    if isinstance(value, dict) and len(value) == 1:
        if "fallback_pool" in value:
            name = get_str(value, "fallback_pool", path, out)
            return OnExhausted("fallback_pool", fallback_pool=name) if name else DEFAULT_ON_EXHAUSTED
        if "queue" in value:
            return queue(value["queue"], join(path, "queue"), timeout_secs, out)
    out.error(path, "expected reject, least_bad, {fallback_pool: <pool>} or {queue: {max_ms: N}}")
    return DEFAULT_ON_EXHAUSTED


def queue(section: object, path: str, timeout_secs: float, out: Problems) -> OnExhausted:
    """`{queue: {max_ms}}`: wait for a lane permit up to max_ms (busbar/reliability/queue.py).
    max_ms is > 0 and at most the pool's failover budget (SPEC §4.3)."""
    if section is None:
        section = {}
    if not isinstance(section, dict):
        out.error(path, f"expected a mapping {{max_ms: N}}, got {describe(section)}")
        return DEFAULT_ON_EXHAUSTED
    check_keys(section, path, QUEUE_KEYS, out)
    budget_ms = int(timeout_secs * 1000)
    if section.get("max_ms") is None:
        return OnExhausted("queue", queue_max_ms=max(1, min(DEFAULT_QUEUE_MAX_MS, budget_ms)))
    max_ms = get_int(section, "max_ms", path, out, 1, None)
    if max_ms is None:
        return DEFAULT_ON_EXHAUSTED
    if max_ms > budget_ms:
        out.error(join(path, "max_ms"), f"must be <= failover.timeout_secs x 1000 ({budget_ms}), "
                  f"got {max_ms}")
        return DEFAULT_ON_EXHAUSTED
    return OnExhausted("queue", queue_max_ms=max_ms)


def check_fallbacks(pools: dict, out: Problems) -> None:
    """Every fallback_pool names a pool, and following them never comes back (SPEC §4.3)."""
    for name, pool in pools.items():
        seen = [name]
        cur = pool
        while cur.on_exhausted.kind == "fallback_pool":
            nxt = cur.on_exhausted.fallback_pool
            if nxt not in pools:
                out.error(join(join("pools", cur.name), "on_exhausted.fallback_pool"),
                          f"unknown pool '{nxt}'")
                break
            if nxt in seen:
                if cur.name == name or nxt == name:
                    out.error(join(join("pools", name), "on_exhausted.fallback_pool"),
                              "fallback cycle: " + " -> ".join(seen + [nxt]))
                break
            seen.append(nxt)
            cur = pools[nxt]


def error_map(value: object, path: str, out: Problems) -> tuple[tuple[str, str], ...]:
    """`error_map: {<provider error code>: <class>}`: stage 1b's first rule (SPEC §4.1)."""
    if value is None:
        return ()
    path = join(path, "error_map")
    if not isinstance(value, dict):
        out.error(path, f"expected a mapping of provider error code to class, got {describe(value)}")
        return ()
    pairs = []
    for code, cls in value.items():
        if not isinstance(code, (str, int)) or isinstance(code, bool):
            out.error(path, f"codes are strings, got {describe(code)}")
        elif cls not in ERROR_CLASSES:
            out.error(join(path, code), "expected one of " + ", ".join(ERROR_CLASSES))
        else:
            pairs.append((str(code), cls))
    return tuple(pairs)


def credentials(entry: dict, path: str, out: Problems) -> str:
    mode = get_str(entry, "upstream_credentials", path, out, "own")
    if mode not in CREDENTIAL_MODES:
        out.error(join(path, "upstream_credentials"), "expected own or passthrough")
        return "own"
    return mode


def health_defaults(section: dict | None, out: Problems) -> HealthPolicy:
    """Top-level `health: {default_probe_interval_secs, default_probe_timeout_secs}`: what a
    provider's `health:` falls back to (SPEC §4.2)."""
    if section is None:
        return DEFAULT_HEALTH
    check_keys(section, "health", HEALTH_DEFAULT_KEYS, out)
    d = DEFAULT_HEALTH
    interval = _floored(section, "default_probe_interval_secs", "health", out, d.interval_secs)
    given = section.get("default_probe_timeout_secs") is not None
    timeout = _floored(section, "default_probe_timeout_secs", "health", out, d.timeout_secs)
    if timeout > interval:
        if given:
            out.error(join("health", "default_probe_timeout_secs"),
                      f"must be <= default_probe_interval_secs ({interval:g})")
        timeout = interval
    return HealthPolicy("none", interval, timeout)


def health(section: object, path: str, out: Problems, defaults: HealthPolicy = DEFAULT_HEALTH,
           passthrough: bool = False) -> HealthPolicy:
    """A provider's (or catalog entry's) `health: {mode, interval_secs, timeout_secs}`."""
    if section is None:
        return defaults
    path = join(path, "health")
    if not isinstance(section, dict):
        out.error(path, f"expected a mapping {{mode, interval_secs, timeout_secs}}, got {describe(section)}")
        return defaults
    check_keys(section, path, HEALTH_KEYS, out)
    mode = get_str(section, "mode", path, out, "none")
    if mode not in HEALTH_MODES:
        out.error(join(path, "mode"), "expected none, dead or active")
        mode = "none"
    if mode != "none" and passthrough:
        out.error(join(path, "mode"), "a probe needs busbar's own key, and a provider with "
                  "upstream_credentials: passthrough holds none; use mode: none")
        mode = "none"
    interval = _floored(section, "interval_secs", path, out, defaults.interval_secs)
    timeout = _floored(section, "timeout_secs", path, out, defaults.timeout_secs)
    if timeout > interval:
        if section.get("timeout_secs") is not None:
            # Two probes of one lane in flight at once would both be one interval's probe.
            out.error(join(path, "timeout_secs"), f"must be <= interval_secs ({interval:g})")
        timeout = interval
    return HealthPolicy(mode, interval, timeout)


def _floored(section, key, path, out, default) -> float:
    # Floored at 1 s (SPEC §4.2): a probe storm is worse than a slow recovery. Said, not silent.
    v = get_seconds(section, key, path, out, default)
    if v < 1.0:
        out.warn(join(path, key), f"raised to the 1 s floor (got {v:g})")
        v = 1.0
    return v
