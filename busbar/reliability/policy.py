"""The reliability settings as validated values (SPEC §4): breaker, failover, on_exhausted, health.

Plain frozen dataclasses with no imports from the rest of busbar, so `busbar/config/schema.py` can
hold them; `busbar/reliability/config.py` reads them from YAML.
"""
from __future__ import annotations

from dataclasses import dataclass

# Error classes of stage 1b (SPEC §4.1) and the `error_map:` values a provider may name.
ERROR_CLASSES: tuple[str, ...] = ("rate_limit", "overloaded", "server_error", "timeout", "network",
                                  "auth", "billing", "client_error", "context_length")


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """`breaker:` of a pool. Defaults are the reference's (SPEC §4.2)."""

    # error_rate: trip when errors/total >= threshold over window_secs with >= min_requests
    # outcomes; consecutive: trip at consecutive_n failures in a row.
    mode: str = "error_rate"
    threshold: float = 0.5
    window_secs: float = 30.0
    min_requests: int = 5
    consecutive_n: int = 3
    # Cooldown = min(base * 2^streak, max), +-10 % jitter, so lanes tripped together do not all
    # come back in the same instant (the thundering herd a fixed cooldown would cause).
    base_cooldown_secs: float = 15.0
    max_cooldown_secs: float = 120.0


@dataclass(frozen=True, slots=True)
class FailoverPolicy:
    """`failover:` of a pool (SPEC §4.3)."""

    # The whole request's time budget across every hop: the reference's 120 s covers a long
    # non-streaming generation plus a couple of failed hops.
    timeout_secs: float = 120.0
    # Hops after the first attempt: 3 → at most 4 attempts (the reference's default).
    max_hops: int = 3
    # Members never selected through this pool (still reachable directly by model name).
    exclusions: tuple[str, ...] = ()


# `on_exhausted: {queue: {}}` without max_ms: a burst shorter than a few typical chat completions
# (2-30 s each) is absorbed, and a wait stays far inside the failover budget (120 s) and the SDKs'
# own timeouts (60-600 s); a longer wait is overload, which reject's Retry-After says better.
DEFAULT_QUEUE_MAX_MS = 10_000


@dataclass(frozen=True, slots=True)
class OnExhausted:
    """`on_exhausted:` of a pool: reject | least_bad | {fallback_pool: X} | {queue: {max_ms}}."""

    kind: str = "reject"
    fallback_pool: str | None = None
    queue_max_ms: int | None = None


@dataclass(frozen=True, slots=True)
class HealthPolicy:
    """`health:` of a provider: none | dead (probe only tripped lanes) | active (probe every lane;
    billable). Probes are one-token requests (busbar/reliability/health.py)."""

    # Off unless asked for: `active` sends billable requests, and `dead` is only useful where a
    # breaker trips, which a gateway with one lane per model rarely has a second lane for.
    mode: str = "none"
    # 10 s, not the reference's 30 s: shorter than the shortest cooldown a default breaker trip
    # sets (15 s * 2^1 = 30 s), so a recovered lane is found by a probe, not by a live request sent
    # as the half-open probe, and each failed probe re-arms the cooldown before it runs out. A
    # probe costs one token; `active` at 10 s is 8640 of them a day per lane.
    interval_secs: float = 10.0
    # A healthy API answers a one-token request in < 2 s (time to first token plus a cold TLS
    # connection); 5 s tolerates a slow edge without holding a probe past half its interval, so a
    # probe always ends before the next one is due. Never more than interval_secs.
    timeout_secs: float = 5.0


DEFAULT_BREAKER = BreakerPolicy()
DEFAULT_FAILOVER = FailoverPolicy()
DEFAULT_ON_EXHAUSTED = OnExhausted()
DEFAULT_HEALTH = HealthPolicy()
